// The voxfarm page: speak text through the stream endpoint, follow jobs, upload books.
// Plain browser JavaScript; everything it calls is this server's own API.
//
// With API keys on, the page asks for a key and keeps it for the tab (sessionStorage: gone
// when the tab closes, never shared with other tabs), and sends it as a header with every
// call: never in a URL, where the farm would not read it anyway. Audio then cannot be an
// `<audio src>` (the element sends no header): the page fetches the stream with the header
// and feeds it to a MediaSource as it arrives, and fetches downloads the same way.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const FINAL = new Set(["done", "failed", "canceled"]);
  const jobs = new Map(); // id -> {job, text, li}
  const books = new Map(); // id -> {book, li, url}

  class ApiError extends Error {
    constructor(status, err) {
      super(err.message || `HTTP ${status}`);
      this.status = status;
      this.code = err.code || `http_${status}`;
      this.field = err.field;
    }
  }

  // -- the API key --------------------------------------------------------------------------

  const KEY_ITEM = "voxfarm.apiKey";
  let memoryKey = ""; // where the key lives if the browser keeps no sessionStorage

  function apiKey() {
    try {
      return sessionStorage.getItem(KEY_ITEM) || "";
    } catch (e) { // storage disabled: the key lives as long as the page
      return memoryKey;
    }
  }

  function setKey(key) {
    memoryKey = key;
    try {
      if (key) sessionStorage.setItem(KEY_ITEM, key);
      else sessionStorage.removeItem(KEY_ITEM);
    } catch (e) { /* kept in memory only */ }
    showKey();
  }

  function withKey(headers) {
    const key = apiKey();
    return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
  }

  function keysOn() {
    return document.querySelector("main").dataset.keys === "1";
  }

  function showKey(why) {
    const key = apiKey();
    const section = $("key-section");
    section.hidden = !key && !keysOn() && !why;
    $("key-form").hidden = Boolean(key);
    $("key-set").hidden = !key;
    if (why) $("key-why").textContent = why;
  }

  function askForKey(message) {
    // A key the farm refused is no use any more; a missing one is asked for.
    const why = apiKey() ? `The key was refused: ${message}` : message;
    setKey("");
    showKey(why || "This farm needs an API key.");
    $("api-key").focus();
  }

  async function useKey(event) {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) return;
    setKey(key);
    $("api-key").value = "";
    clearError();
    await loadVoices();
  }

  async function api(method, url, body, isForm) {
    const opts = { method, headers: withKey({ Accept: "application/json" }) };
    if (body !== undefined) {
      if (isForm) {
        opts.body = body;
      } else {
        opts.headers["Content-Type"] = "application/json";
        opts.body = JSON.stringify(body);
      }
    }
    let resp;
    try {
      resp = await fetch(url, opts);
    } catch (e) {
      throw new ApiError(0, { code: "network", message: "The server could not be reached." });
    }
    const type = resp.headers.get("Content-Type") || "";
    const data = type.startsWith("application/json") ? await resp.json() : null;
    if (!resp.ok) {
      const err = new ApiError(resp.status, (data && data.error) || {});
      if (resp.status === 401) askForKey(err.message);
      throw err;
    }
    return { data, resp };
  }

  async function fetchWithKey(url, signal) {
    // A non-JSON resource (audio) fetched with the key; errors as the API's.
    let resp;
    try {
      resp = await fetch(url, { headers: withKey({}), signal });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(0, { code: "network", message: "The server could not be reached." });
    }
    if (!resp.ok) {
      const data = await resp.json().catch(() => null);
      const err = new ApiError(resp.status, (data && data.error) || {});
      if (resp.status === 401) askForKey(err.message);
      throw err;
    }
    return resp;
  }

  function showError(err) {
    const box = $("error");
    const where = err.field ? ` (${err.field})` : "";
    box.textContent = `Error${where}: ${err.message}`;
    box.dataset.code = err.code || "";
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  // -- voices and speed ----------------------------------------------------------------------

  async function loadVoices() {
    const select = $("voice");
    const preferred = document.querySelector("main").dataset.defaultVoice;
    if (keysOn() && !apiKey()) return; // asked for first; loaded once a key is given
    try {
      const { data } = await api("GET", "/v1/voices");
      select.textContent = "";
      // One group a language, in the server's order (language, then quality): custom
      // voices sit in their language's group, marked as such.
      const groups = new Map();
      const names = new Intl.DisplayNames([navigator.language || "en"], { type: "language" });
      for (const v of data.voices) {
        if (!groups.has(v.language)) {
          const group = document.createElement("optgroup");
          group.label = `${names.of(v.language) || v.language} (${v.language})`;
          groups.set(v.language, group);
          select.append(group);
        }
        const opt = document.createElement("option");
        opt.value = v.name;
        const detail = v.custom ? `custom: ${v.spec}` : v.display_name;
        opt.textContent = detail && detail !== v.name ? `${v.name} — ${detail}` : v.name;
        if (v.name === preferred) opt.selected = true;
        groups.get(v.language).append(opt);
      }
    } catch (err) {
      showError(err);
    }
  }

  function showSpeed() {
    $("speed-value").textContent = `${Number($("speed").value).toFixed(2)}×`;
  }

  // -- speaking ------------------------------------------------------------------------------

  async function speak(event) {
    event.preventDefault();
    clearError();
    const text = $("text").value;
    const button = $("play");
    button.disabled = true;
    try {
      const { data: job } = await api("POST", "/v1/jobs", {
        text, voice: $("voice").value, speed: Number($("speed").value),
      });
      addJob(job, text);
      play(job);
      readAlong(job);
    } catch (err) {
      showError(err);
    } finally {
      button.disabled = false;
    }
  }

  // The stream being fetched with a key, if any: its abort handle and its object URL.
  let keyed = null;

  function play(job) {
    const player = $("player");
    const stream = `/v1/jobs/${encodeURIComponent(job.id)}/stream`;
    if (keyed) {
      keyed.abort.abort();
      URL.revokeObjectURL(keyed.url);
      keyed = null;
    }
    player.dataset.jobId = job.id;
    $("now").textContent = `Playing job ${job.id.slice(0, 8)}…`;
    // The stream starts with the first segment while later ones still render.
    if (!apiKey()) {
      player.src = `${stream}?format=wav`;
      start(player);
    } else if (window.MediaSource && MediaSource.isTypeSupported("audio/mpeg")) {
      player.src = streamWithKey(`${stream}?format=mp3`);
      start(player);
    } else { // no MediaSource for MP3: the whole file, then play
      const abort = new AbortController();
      keyed = { abort, url: "" };
      fetchWithKey(`${stream}?format=wav`, abort.signal)
        .then((resp) => resp.blob())
        .then((blob) => {
          keyed.url = URL.createObjectURL(blob);
          player.src = keyed.url;
          start(player);
        })
        .catch((err) => { if (err.name !== "AbortError") showError(err); });
    }
  }

  function start(player) {
    player.play().catch((err) => {
      if (err.name === "NotAllowedError") {
        $("now").textContent = "Press play on the player to listen.";
      } else if (err.name !== "AbortError") {
        showError({ message: `The audio could not be played: ${err.message}` });
      }
    });
  }

  // Seconds of audio already played that a keyed stream keeps buffered (for a seek back);
  // older audio is let go, so a long job fits the browser's buffer.
  const KEEP_PLAYED_S = 60;

  function streamWithKey(url) {
    // The job's MP3 stream, fetched with the key and appended to a MediaSource chunk by
    // chunk: playback starts with the first segment, as with a plain `<audio src>`.
    const source = new MediaSource();
    const abort = new AbortController();
    keyed = { abort, url: URL.createObjectURL(source) };
    source.addEventListener("sourceopen", async () => {
      const buffer = source.addSourceBuffer("audio/mpeg");
      buffer.mode = "sequence";
      try {
        const resp = await fetchWithKey(url, abort.signal);
        const reader = resp.body.getReader();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          await append(buffer, value);
        }
        if (source.readyState === "open") source.endOfStream(); // the duration is known
      } catch (err) {
        if (err.name === "AbortError") return;
        if (source.readyState === "open") source.endOfStream("network");
        showError(err);
      }
    }, { once: true });
    return keyed.url;
  }

  function settled(buffer) {
    return new Promise((resolve, reject) => {
      const done = () => { buffer.removeEventListener("error", failed); resolve(); };
      const failed = () => {
        buffer.removeEventListener("updateend", done);
        reject(new Error("the audio could not be decoded"));
      };
      buffer.addEventListener("updateend", done, { once: true });
      buffer.addEventListener("error", failed, { once: true });
    });
  }

  async function append(buffer, bytes) {
    const player = $("player");
    for (;;) {
      const played = player.currentTime - KEEP_PLAYED_S;
      if (buffer.buffered.length && buffer.buffered.start(0) < played) {
        const removed = settled(buffer);
        buffer.remove(0, played);
        await removed;
      }
      try {
        const appended = settled(buffer);
        buffer.appendBuffer(bytes);
        return await appended;
      } catch (err) {
        if (err.name !== "QuotaExceededError") throw err;
        // The buffer is full of audio not played yet: wait for the player to use some.
        await new Promise((resolve) => { setTimeout(resolve, 1000); });
      }
    }
  }

  // -- read-along: the word being spoken is highlighted as the audio plays ----------------------

  // The job's words with their times come from its captions, which grow while it renders
  // (`complete: false`); each word is a span, and the one whose time holds the player's
  // clock is marked `current` (those before it `spoken`).
  const reading = { jobId: null, words: [], spans: [], timer: null, index: -1 };

  function readAlong(job) {
    clearTimeout(reading.timer);
    Object.assign(reading, { jobId: job.id, words: [], spans: [], index: -1 });
    const box = $("readalong");
    box.textContent = "";
    box.hidden = false;
    box.dataset.jobId = job.id;
    box.dataset.current = "-1"; // no word yet: the first may start after a breath of silence
    followWords(job.id);
  }

  async function followWords(jobId) {
    if (reading.jobId !== jobId) return;
    let complete = false;
    try {
      const { data } = await api("GET", `/v1/jobs/${encodeURIComponent(jobId)}/captions`);
      if (reading.jobId !== jobId) return;
      for (const word of data.words.slice(reading.words.length)) {
        const span = document.createElement("span");
        span.textContent = word.word;
        span.dataset.start = word.start;
        span.dataset.end = word.end;
        const box = $("readalong");
        if (box.childNodes.length) box.append(" ");
        box.append(span);
        reading.words.push(word);
        reading.spans.push(span);
      }
      complete = data.complete;
      $("readalong").dataset.complete = complete ? "1" : "0";
    } catch (err) {
      complete = err.status === 409 || err.status === 404 || err.status === 410;
    }
    if (!complete) reading.timer = setTimeout(() => followWords(jobId), 400);
    highlight();
  }

  function wordAt(t) {
    // The last word that has started by `t` (binary search: words are in time order).
    let lo = 0;
    let hi = reading.words.length - 1;
    let found = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (reading.words[mid].start <= t) {
        found = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    return found;
  }

  function highlight() {
    const player = $("player");
    if (player.dataset.jobId !== reading.jobId) return;
    const index = wordAt(player.currentTime);
    if (index === reading.index) return;
    const from = Math.min(index, reading.index);
    const to = Math.max(index, reading.index);
    for (let i = Math.max(from, 0); i <= to && i < reading.spans.length; i += 1) {
      reading.spans[i].classList.toggle("spoken", i < index);
      reading.spans[i].classList.toggle("current", i === index);
    }
    reading.index = index;
    $("readalong").dataset.current = String(index);
  }

  function highlightWhilePlaying() {
    highlight();
    if (!$("player").paused) requestAnimationFrame(highlightWhilePlaying);
  }

  // -- the job list --------------------------------------------------------------------------

  function download(a) {
    // A download link: followed by the browser while the farm is open; with a key, fetched
    // with it and saved from memory (a link cannot send a header).
    a.addEventListener("click", async (event) => {
      if (!apiKey()) return;
      event.preventDefault();
      try {
        const resp = await fetchWithKey(a.href);
        const named = /filename="?([^";]+)"?/.exec(resp.headers.get("Content-Disposition") || "");
        const url = URL.createObjectURL(await resp.blob());
        const save = document.createElement("a");
        save.href = url;
        save.download = a.getAttribute("download") || (named ? named[1] : "");
        document.body.append(save);
        save.click();
        save.remove();
        setTimeout(() => URL.revokeObjectURL(url), 60_000);
      } catch (err) {
        showError(err);
      }
    });
    return a;
  }

  function addJob(job, text) {
    const li = document.createElement("li");
    li.dataset.jobId = job.id;
    li.innerHTML = `<span class="job-text"></span><progress max="1" value="0"></progress>
      <span class="job-actions"><span class="job-state"></span> </span>`;
    li.querySelector(".job-text").textContent = text;
    li.querySelector(".job-text").title = text;
    $("jobs").prepend(li);
    $("no-jobs").hidden = true;
    jobs.set(job.id, { job, text, li });
    renderJob(job);
  }

  function renderJob(job) {
    const entry = jobs.get(job.id);
    entry.job = job;
    const { li } = entry;
    const { done, total } = job.segments;
    const bar = li.querySelector("progress");
    bar.max = Math.max(total, 1);
    bar.value = done;
    li.dataset.state = job.state;
    li.querySelector(".job-state").textContent = `${job.state} ${done}/${total}`;
    const actions = li.querySelector(".job-actions");
    actions.querySelectorAll("a, button").forEach((el) => el.remove());
    if (job.state === "done") {
      const a = document.createElement("a");
      a.href = `${job.links.audio}?format=mp3`;
      a.textContent = "download";
      a.setAttribute("download", `${job.id}.mp3`);
      actions.append(download(a));
    } else if (!FINAL.has(job.state)) {
      const cancel = document.createElement("button");
      cancel.className = "secondary";
      cancel.textContent = "cancel";
      cancel.addEventListener("click", async () => {
        try {
          const { data } = await api("DELETE", job.links.self);
          renderJob(data);
        } catch (err) {
          showError(err);
        }
      });
      actions.append(cancel);
    }
  }

  async function pollJobs() {
    for (const { job } of jobs.values()) {
      if (FINAL.has(job.state)) continue;
      try {
        const { data } = await api("GET", job.links.self);
        renderJob(data);
      } catch (err) {
        if (err.status === 404) { // expired
          renderJob({ ...job, state: "expired" });
          jobs.get(job.id).job.state = "done";
        }
      }
    }
    setTimeout(pollJobs, 500);
  }

  // -- books ---------------------------------------------------------------------------------

  function initBooks() {
    const available = document.querySelector("main").dataset.books === "1";
    if (!available) {
      $("books-status").textContent =
        "Books are not available on this server yet: it does not serve the books API.";
      return;
    }
    $("books-status").textContent = "Upload a book to render it chapter by chapter.";
    $("book-form").hidden = false;
    $("book-form").addEventListener("submit", uploadBook);
  }

  async function uploadBook(event) {
    event.preventDefault();
    clearError();
    const file = $("book-file").files[0];
    if (!file) {
      showError({ message: "Choose a book file first.", field: "file" });
      return;
    }
    const form = new FormData();
    form.append("file", file);
    form.append("voice", $("voice").value);
    form.append("speed", $("speed").value);
    try {
      const { data, resp } = await api("POST", "/v1/books", form, true);
      const url = resp.headers.get("Location") || (data.links && data.links.self)
        || `/v1/books/${data.id}`;
      const li = document.createElement("li");
      $("books").prepend(li);
      books.set(data.id, { book: data, li, url });
      renderBook(data);
    } catch (err) {
      showError(err);
    }
  }

  function counts(x) {
    if (!x) return [0, 0];
    if (x.segments) return [x.segments.done || 0, x.segments.total || 0];
    return [x.done || 0, x.total || 0];
  }

  function renderBook(book) {
    const entry = books.get(book.id);
    entry.book = book;
    const li = entry.li;
    li.textContent = "";
    const title = document.createElement("span");
    title.className = "job-text";
    title.textContent = book.title || book.id;
    const [done, total] = counts(book);
    const bar = document.createElement("progress");
    bar.max = Math.max(total, 1);
    bar.value = done;
    const state = document.createElement("span");
    state.textContent = `${book.state} ${done}/${total}`;
    li.append(title, bar, state);
    if (book.state === "done") {
      for (const fmt of ["m4b", "mp3"]) {
        if (!book.links || !book.links[fmt]) continue;
        const a = document.createElement("a");
        a.href = book.links[fmt];
        a.textContent = `download ${fmt}`;
        li.append(document.createElement("span"), document.createElement("span"), download(a));
      }
    }
    for (const ch of book.chapters || []) {
      const [cd, ct] = counts(ch);
      const row = document.createElement("span");
      row.className = "muted";
      row.textContent = `  ${ch.title || `chapter ${ch.index}`}: ${cd}/${ct}`;
      const link = ch.audio;
      li.append(row, document.createElement("span"));
      if (link && book.state === "done") {
        const a = document.createElement("a");
        a.href = link;
        a.textContent = "download";
        li.append(download(a));
      } else {
        li.append(document.createElement("span"));
      }
    }
  }

  async function pollBooks() {
    for (const entry of books.values()) {
      if (FINAL.has(entry.book.state)) continue;
      try {
        const { data } = await api("GET", entry.url);
        renderBook(data);
      } catch (err) {
        /* the next round tries again */
      }
    }
    setTimeout(pollBooks, 1000);
  }

  // -- start ---------------------------------------------------------------------------------

  $("key-form").addEventListener("submit", useKey);
  $("key-forget").addEventListener("click", () => {
    setKey("");
    showKey();
  });
  $("speak-form").addEventListener("submit", speak);
  $("speed").addEventListener("input", showSpeed);
  $("player").addEventListener("play", () => requestAnimationFrame(highlightWhilePlaying));
  $("player").addEventListener("seeked", highlight);
  $("player").addEventListener("timeupdate", highlight);
  $("player").addEventListener("error", () => {
    const err = $("player").error;
    if ($("player").getAttribute("src")) {
      showError({ message: `The audio stream failed (${err ? err.message || err.code : "?"}).` });
    }
  });
  showKey();
  showSpeed();
  loadVoices();
  initBooks();
  pollJobs();
  pollBooks();
})();

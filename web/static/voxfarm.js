// The voxfarm page: speak text through the stream endpoint, follow jobs, upload books.
// Plain browser JavaScript; everything it calls is this server's own API.
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

  async function api(method, url, body, isForm) {
    const opts = { method, headers: { Accept: "application/json" } };
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
    if (!resp.ok) throw new ApiError(resp.status, (data && data.error) || {});
    return { data, resp };
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
    try {
      const { data } = await api("GET", "/v1/voices");
      select.textContent = "";
      for (const v of data.voices) {
        const opt = document.createElement("option");
        opt.value = v.name;
        opt.textContent = v.display_name && v.display_name !== v.name
          ? `${v.name} — ${v.display_name}` : v.name;
        if (v.name === preferred) opt.selected = true;
        select.append(opt);
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

  function play(job) {
    const player = $("player");
    // The stream starts with the first segment while later ones still render.
    player.src = `/v1/jobs/${encodeURIComponent(job.id)}/stream?format=wav`;
    player.dataset.jobId = job.id;
    $("now").textContent = `Playing job ${job.id.slice(0, 8)}…`;
    player.play().catch((err) => {
      if (err.name === "NotAllowedError") {
        $("now").textContent = "Press play on the player to listen.";
      } else if (err.name !== "AbortError") {
        showError({ message: `The audio could not be played: ${err.message}` });
      }
    });
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
      actions.append(a);
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
        li.append(document.createElement("span"), document.createElement("span"), a);
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
        li.append(a);
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
  showSpeed();
  loadVoices();
  initBooks();
  pollJobs();
  pollBooks();
})();

"""Read-along on the page, in headless chromium: while the audio plays, the word
being spoken is highlighted, following the job's word timestamps."""

from __future__ import annotations

import random

import requests

from tests.browser import wait_js
from tests.browser.test_page import CHROMIUM, browser, open_page, page, pytestmark  # noqa: F401

SAMPLE_JS = """
async () => {
  const player = document.getElementById('player');
  const box = document.getElementById('readalong');
  const samples = [];
  const until = performance.now() + 2500;
  await new Promise((done) => {
    const look = () => {
      const current = box.querySelector('span.current');
      samples.push([player.currentTime, Number(box.dataset.current),
                    current ? current.textContent : null]);
      if (performance.now() < until && !player.ended) requestAnimationFrame(look);
      else done();
    };
    requestAnimationFrame(look);
  });
  return samples;
}
"""


def test_the_word_being_spoken_is_highlighted(page, server):  # noqa: F811
    open_page(page)
    n = random.randint(100, 999_999)
    text = (f"Read along with me, reader number {n}. Each word lights up as it is spoken, "
            "and the next one follows.")
    page.fill("#text", text)
    page.click("#play")
    wait_js(page, "document.getElementById('readalong').dataset.complete === '1'")
    wait_js(page, "document.getElementById('player').currentTime > 0.2")
    job_id = page.locator("#readalong").get_attribute("data-job-id")
    words = requests.get(f"{server}/v1/jobs/{job_id}/captions", timeout=10).json()["words"]
    assert page.locator("#readalong span").all_inner_texts() == [w["word"] for w in words]
    samples = page.evaluate(SAMPLE_JS)
    seen = set()
    for t, index, shown in samples:
        if index < 0:
            continue
        # The highlighted word has started by the clock, and the next one has not (one
        # animation frame of slack between the clock and the highlight).
        assert words[index]["start"] <= t + 0.05, (t, words[index])
        if index + 1 < len(words):
            assert t < words[index + 1]["start"] + 0.05, (t, words[index + 1])
        assert shown == words[index]["word"]
        seen.add(index)
    assert len(seen) >= 4  # it moved along with the audio
    assert page.locator("#readalong span.spoken").count() >= min(seen)
    assert page.problems == []

"""The page at `/` in a real headless browser (Debian's chromium, driven by Playwright):
it loads cleanly, a synthesis started from it plays, and an API error reaches the user.

Skipped (loudly, by `make test`) where /usr/bin/chromium is missing. Playwright's own browser
download is never used: the system chromium is launched by path.
"""

from __future__ import annotations

import os
import random

import pytest
import requests

from tests.browser import wait_js
from tests.helpers import scaled

CHROMIUM = os.environ.get("VOXFARM_CHROMIUM", "/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no browser at {CHROMIUM}"),
]

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--autoplay-policy=no-user-gesture-required"]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(base_url=server)
    page = context.new_page()
    page.set_default_timeout(scaled(60) * 1000)  # Playwright's own waits stretch too
    page.problems = []
    page.on("console", lambda m: m.type == "error" and page.problems.append(m.text))
    page.on("pageerror", lambda e: page.problems.append(f"uncaught: {e}"))
    yield page
    context.close()


def open_page(page) -> None:
    page.goto("/")
    wait_js(page, "document.querySelectorAll('#voice option').length > 10")


def test_page_loads_without_console_errors(page, server):
    open_page(page)
    assert page.title() == "voxfarm"
    assert page.locator("#voice option[value='en-us+f3']").count() == 1
    assert page.locator("#voice").input_value() == "en_us-hibari-heart"  # the neural default
    # One group a language, named for people, the neural voices first within it.
    labels = page.locator("#voice optgroup").evaluate_all("gs => gs.map(g => g.label)")
    assert "English (en)" in labels and len(labels) == len(set(labels)) >= 2, labels
    english = page.locator("#voice optgroup[label='English (en)'] option").evaluate_all(
        "os => os.map(o => o.value)")
    assert english[0] == "en_us-hibari-heart" and english.index("en_us-joe-medium") < \
        english.index("en-us+f3"), english[:5]
    # The book section says what this server offers.
    books_served = requests.post(f"{server}/v1/books", timeout=10).status_code != 404
    status = page.locator("#books-status").inner_text()
    assert ("not available" in status) != books_served
    assert page.locator("#book-form").is_visible() == books_served
    # Any late script error: the page's own pollers' first rounds (set at its start, every
    # 500 ms and 1 s) run before a timer the page is given after them with a longer delay,
    # however slow the box, where a fixed wait outside could end before they did.
    page.evaluate("new Promise((done) => setTimeout(done, 1100))")
    assert page.problems == []


def test_synthesis_started_from_the_page_plays(page, server):
    open_page(page)
    n = random.randint(100, 999_999)
    text = f"Playback test {n} starts here. The audio plays while the farm still renders."
    page.fill("#text", text)
    page.select_option("#voice", "en-us+f3")
    page.click("#play")
    job_li = page.locator("#jobs li").first
    job_id = job_li.get_attribute("data-job-id")
    assert page.locator("#player").get_attribute("src") == \
        f"/v1/jobs/{job_id}/stream?format=wav"
    # Playing: the clock advances.
    wait_js(page, "document.getElementById('player').currentTime > 0.3")
    # Let it run to the end faster; the stream is whole once the job is done.
    page.evaluate("document.getElementById('player').playbackRate = 4")
    wait_js(page, "document.getElementById('player').ended")
    duration = page.evaluate("document.getElementById('player').duration")
    job = requests.get(f"{server}/v1/jobs/{job_id}", timeout=10).json()
    assert job["state"] == "done" and job["voice"] == "en-us+f3"
    assert duration == pytest.approx(job["audio_seconds"], abs=0.3)
    # The job list shows it finished, with a download link.
    wait_js(page,
        f"document.querySelector('#jobs li[data-job-id=\"{job_id}\"]').dataset.state"
        " === 'done'")
    assert job_li.locator("a").get_attribute("href") == f"/v1/jobs/{job_id}/audio?format=mp3"
    assert page.locator("#error").is_hidden()
    assert page.problems == []


def test_api_error_is_shown_to_the_user(page):
    open_page(page)
    # Punctuation only passes the form's own checks; the API refuses it (no speakable text).
    page.fill("#text", "!!! ... ???")
    page.click("#play")
    error = page.locator("#error")
    error.wait_for(state="visible")
    assert "nothing that can be spoken" in error.inner_text()
    assert error.get_attribute("data-code") == "no_speakable_text"
    assert page.locator("#jobs li").count() == 0
    assert page.locator("#player").get_attribute("src") is None

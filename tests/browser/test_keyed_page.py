"""The page once API keys are on, in headless chromium: its files still load, it asks for a
key, keeps it for the tab, and plays and downloads with it (an `<audio src>` sends no
header, so the page fetches the stream itself). Its own farm (database 4): keys on the
shared farm would lock every other test out."""

from __future__ import annotations

import random

import pytest
import requests

from tests.browser import wait_js
from tests.browser.test_page import ARGS, CHROMIUM, pytestmark  # noqa: F401
from tests.helpers import gunicorn_server, running_farm, scaled, wait_until


@pytest.fixture(scope="module")
def keyed_server(redis_url, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("keyed-page")
    with running_farm(redis_url, 4, log_dir) as tf, \
            gunicorn_server(tf.env, log_dir / "web.log") as base:
        _, token = tf.farm.apikeys.create("page")
        wait_until(lambda: requests.get(f"{base}/v1/voices", timeout=10).status_code == 401,
                   10, "the web has not noticed the key")
        yield base, token


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def context(browser, keyed_server):
    base, _ = keyed_server
    context = browser.new_context(base_url=base, accept_downloads=True)
    context.urls = []
    context.problems = []
    context.on("request", lambda r: context.urls.append(r.url))
    context.on("console", lambda m: m.type == "error" and context.problems.append(m.text))
    context.on("weberror", lambda e: context.problems.append(f"uncaught: {e.error}"))
    yield context
    context.close()


def new_page(context):
    page = context.new_page()
    page.set_default_timeout(scaled(60) * 1000)  # Playwright's own waits stretch too
    page.goto("/")
    return page


def voices_loaded(page) -> None:
    wait_js(page, "document.querySelectorAll('#voice option').length > 10")


def test_the_page_asks_for_a_key_then_plays_and_downloads_with_it(context, keyed_server):
    base, token = keyed_server
    page = new_page(context)
    # Its script ran (the key section is its doing) and it asks before calling the API.
    page.locator("#api-key").wait_for(state="visible")
    assert page.locator("#voice option").count() == 1
    page.fill("#api-key", token)
    page.click("#key-use")
    voices_loaded(page)
    assert page.locator("#key-set").is_visible() and page.locator("#key-form").is_hidden()
    assert page.evaluate("sessionStorage.getItem('voxfarm.apiKey')") == token
    assert page.evaluate("localStorage.length") == 0

    n = random.randint(100, 999_999)
    text = f"Keyed playback {n} starts here. The audio plays while the farm still renders."
    page.fill("#text", text)
    page.select_option("#voice", "en-us+f3")
    page.click("#play")
    job_li = page.locator("#jobs li").first
    job_li.wait_for()
    job_id = job_li.get_attribute("data-job-id")
    assert page.locator("#player").get_attribute("src").startswith("blob:")
    wait_js(page, "document.getElementById('player').currentTime > 0.3")
    page.evaluate("document.getElementById('player').playbackRate = 4")
    wait_js(page, "document.getElementById('player').ended")
    duration = page.evaluate("document.getElementById('player').duration")
    job = requests.get(f"{base}/v1/jobs/{job_id}", headers={"X-API-Key": token},
                       timeout=10).json()
    assert job["state"] == "done" and job["voice"] == "en-us+f3"
    assert duration == pytest.approx(job["audio_seconds"], abs=0.3)

    wait_js(page,
        f"document.querySelector('#jobs li[data-job-id=\"{job_id}\"]').dataset.state"
        " === 'done'")
    with page.expect_download() as fetched:
        job_li.locator("a").click()
    data = open(fetched.value.path(), "rb").read()
    assert fetched.value.suggested_filename == f"{job_id}.mp3"
    assert data[:3] == b"ID3" or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xe3")
    assert len(data) > 8_000

    # A reload keeps the key for the tab; it never went into a URL.
    page.reload()
    voices_loaded(page)
    assert not [u for u in context.urls if token in u]
    assert page.locator("#error").is_hidden()
    assert context.problems == []


def test_a_new_tab_asks_again_and_a_refused_key_is_dropped(context, keyed_server):
    base, token = keyed_server
    page = new_page(context)
    page.locator("#api-key").wait_for(state="visible")
    page.fill("#api-key", token[:-3] + "xyz")
    page.click("#key-use")
    error = page.locator("#error")
    error.wait_for(state="visible")
    assert "not valid" in error.inner_text()
    assert page.locator("#api-key").is_visible()
    assert "refused" in page.locator("#key-why").inner_text()
    assert page.evaluate("sessionStorage.getItem('voxfarm.apiKey')") is None
    # The files the page is made of answer without a key; the API does not.
    for path in ("/static/voxfarm.js", "/static/voxfarm.css"):
        assert requests.get(f"{base}{path}", timeout=10).status_code == 200

"""A newcomer's first steps against the shared farm, as gunicorn serves it: the README's first
request run as printed, `voxfarm say` through the real command (which farm it talks to, its
progress off a terminal, its refusals in its own terms), OpenAI's voice names on every route,
a body over the limit, and the page offering only what the upload takes."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import av
import pytest
import requests

from models.books.parse import EXTENSIONS
from tests.helpers import ROOT, wav_to_pcm

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
CLIENT_ENV = ("VOXFARM_SERVER", "VOXFARM_VAR", "VOXFARM_REDIS_URL", "REDIS_URL")


# -- the README's first request ----------------------------------------------------------------


def readme_block(heading: str) -> str:
    """The first shell block under `heading` in the README, as printed."""
    section = README.read_text(encoding="utf-8").split(f"\n{heading}\n", 1)[1]
    return re.search(r"^```sh\n(.*?)^```", section, re.S | re.M)[1]


def test_the_readme_first_request_runs_as_printed(server, tmp_path):
    block = readme_block("## A first request")
    assert block.count("localhost:8000") >= 5
    # The one change: the test server's port for make run's.
    script = block.replace("localhost:8000", f"localhost:{urlsplit(server).port}")
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    # The status of the submit, then the id the shell captured from it.
    assert lines[0] == "202", proc.stdout[:500]
    job_id = json.loads((tmp_path / "job.json").read_text())["id"]
    assert re.fullmatch(r"[0-9a-f]{8,}", job_id) and lines[1] == f"job {job_id}"
    # The first chunks, their audio cut short: a screenful, not 158 KB of base64.
    page = json.loads(lines[2])
    assert page["job_id"] == job_id and page["chunks"]
    assert {c["audio"] for c in page["chunks"]} == {"..."} and len(lines[2]) < 20_000
    # The whole file once done (200), and the captions.
    assert lines[3] == "200", proc.stdout[:2000]
    with av.open(io.BytesIO((tmp_path / "hello.mp3").read_bytes())) as mp3:
        assert mp3.format.name == "mp3"
        assert 1.5 < mp3.duration / 1e6 < 8.0
    srt = "\n".join(lines[4:])
    assert srt.startswith("1\n00:00:00,") and "Hello" in srt and "sentence" in srt


# -- voxfarm say through the real command ------------------------------------------------------


def voxfarm(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The real command, its output a pipe (not a terminal), as a script would run it."""
    clean = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=180,
                          env={**clean, "PYTHONPATH": str(ROOT), **env})


def test_say_names_the_farm_from_the_environment_and_shows_progress_off_a_terminal(
        server, tmp_path):
    text = ("The first sentence is short. The second one says a little more. "
            "And a third sentence ends it.")
    proc = voxfarm("say", text, "-o", "out.wav", cwd=tmp_path, VOXFARM_SERVER=server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The farm it talks to was not given on its command line: it says which, first.
    assert proc.stderr.splitlines()[0] == f"using {server} (from VOXFARM_SERVER)"
    out = proc.stdout.splitlines()
    assert out[-1] == "wrote out.wav"
    # Off a terminal: plain lines, the first at once, the last with every segment done;
    # segments counted once each (chunks are windows of them), never past the total.
    progress = [re.fullmatch(r"segments (\d+)/(\d+)", line) for line in out[:-1]]
    assert progress and all(progress), out
    counts = [(int(m[1]), int(m[2])) for m in progress]
    total = counts[0][1]
    assert total == 3 and counts[-1] == (3, 3)
    assert all(done <= total for done, _ in counts)
    assert [d for d, _ in counts] == sorted(d for d, _ in counts)
    pcm, rate = wav_to_pcm((tmp_path / "out.wav").read_bytes())
    assert rate == 24000 and len(pcm) / rate > 3.0  # the default voice, hibari


def test_openai_voice_names_are_voices_on_every_route(server, tmp_path):
    # /v1/audio/voices lists them first; a job takes them as the speech endpoint does.
    listed = requests.get(f"{server}/v1/audio/voices", timeout=10).json()["voices"]
    assert listed[0] == "alloy"
    default = requests.get(f"{server}/v1/voices", timeout=10).json()["default"]
    resp = requests.post(f"{server}/v1/jobs", json={"text": "Alloy, as a job.",
                                                    "voice": "alloy"}, timeout=30)
    assert resp.status_code == 202, resp.text
    assert resp.json()["voice"] == default  # the farm voice the name stands for
    proc = voxfarm("say", "Nova, from the command line.", "-o", "nova.wav", "--voice", "nova",
                   "--server", server, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""  # --server: nothing to say about which farm


def test_say_refusals_speak_of_its_command_line(server, tmp_path):
    # An unknown voice: the names the farm takes, not only the code.
    proc = voxfarm("say", "Hi.", "-o", "x.wav", "--voice", "klingon", "--server", server,
                   cwd=tmp_path)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "Error: 422 unknown_voice: unknown voice 'klingon'"
    valid = lines[1].removeprefix("valid: ").split(", ")
    assert valid[:2] == ["alloy", "ash"] and "en_us-joe-medium" in valid and "cmn" in valid
    # A file extension the farm does not write: said as the extension, with those it does.
    proc = voxfarm("say", "Hi.", "-o", "a.wma", "--server", server, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("Error: cannot write 'a.wma': the extension of -o picks the "
                                   "format, and the farm writes .wav, .flac, .mp3, .ogg, .opus, "
                                   ".aac, .m4a, .pcm")
    assert "'format'" not in proc.stderr
    # Too long for one job: the limit, and the way a long text goes in. (40,000 accented
    # letters are a body of 240 KB, each one escaped in the JSON: over the body's limit.)
    for text, code in (("word " * 5_000, "text_too_long"), ("é" * 40_000,
                                                              "request_too_large")):
        proc = voxfarm("say", text, "-o", "long.wav", "--server", server, cwd=tmp_path)
        assert proc.returncode == 1
        assert f"Error: 413 {code}: " in proc.stderr and "limit" in proc.stderr
        assert "`voxfarm book render FILE.txt -o DIR`" in proc.stderr
    assert not list(tmp_path.glob("*.wav")) and not (tmp_path / "a.wma").exists()


def test_a_body_over_the_limit_is_a_413_that_names_it(server):
    resp = requests.post(f"{server}/v1/jobs", data=b'{"text": "' + b"x" * 1_000_000 + b'"}',
                         headers={"Content-Type": "application/json"}, timeout=30)
    assert resp.status_code == 413, resp.text[:300]
    err = resp.json()["error"]
    assert err["code"] == "request_too_large" and err["limit_bytes"] > 0
    assert f"the limit here is {err['limit_bytes']:,} bytes" in err["message"]
    assert "1,000,012 bytes" in err["message"] and "POST /v1/books" in err["message"]


# -- the page offers what the upload takes ------------------------------------------------------


class _BookPicker(HTMLParser):
    accept = label = None
    _in_label = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input" and attrs.get("id") == "book-file":
            self.accept = attrs.get("accept")
        self._in_label = tag == "label" and attrs.get("for") == "book-file"

    def handle_data(self, data):
        if self._in_label:
            self.label = data


def test_the_page_offers_exactly_the_book_files_the_upload_takes(server):
    picker = _BookPicker()
    picker.feed(requests.get(f"{server}/", timeout=10).text)
    offered = picker.accept.split(",")
    assert offered == list(EXTENSIONS) and ".json" not in offered
    assert "JSON" not in picker.label
    # Every offered extension is read as a book (an empty one is refused for its content,
    # not its name); anything else is a 415 naming every extension.
    for ext in offered:
        resp = requests.post(f"{server}/v1/books", files={"file": (f"b{ext}", b"")},
                             timeout=30)
        assert resp.json()["error"]["code"] != "unsupported_format", (ext, resp.text)
    resp = requests.post(f"{server}/v1/books", files={"file": ("x.json", b"{}")}, timeout=30)
    assert resp.status_code == 415
    err = resp.json()["error"]
    assert err["code"] == "unsupported_format" and err["valid"] == offered
    assert err["message"] == ("'x.json' is not a book file; send .epub, .txt, .text, .md, "
                              ".markdown, .html, .htm or .xhtml")

"""The web-only install: `pip install voxfarm` without the `worker` extra, into a
fresh venv from a copy of this checkout, has no torch, serves the web app, and stays small.

About 40 s with the wheels in pip's cache (it downloads them the first time): it runs in
`make test`; `-m "not install"` leaves it out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What the worker extra brings and the web must not: torch and everything that comes for it.
# onnxruntime is not among them: the hibari voice's G2P, which runs in the web, reads words
# outside its lexicons with a small onnxruntime net (hibari-tts depends on it).
WORKER_ONLY = {"torch", "onnx", "sympy", "networkx", "triton"}
# The web-only site-packages measured 0.42 GB (README, "Size"); well past it means a heavy
# dependency crept into the core set.
MAX_WEB_ONLY_BYTES = 600 * 1024 * 1024
NETWORK_ERRORS = ("Could not find a version", "No matching distribution",
                  "Failed to establish a new connection", "Temporary failure in name")


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.mark.slow
@pytest.mark.install
@pytest.mark.timeout(600)
def test_web_only_install_has_no_torch_and_serves_the_web(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "var", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        ".ruff_cache", "bench-results"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    pip = subprocess.run([py, "-m", "pip", "install", "--quiet", str(src)],
                         capture_output=True, text=True, timeout=540)
    if pip.returncode != 0 and any(e in pip.stderr for e in NETWORK_ERRORS):
        pytest.skip(f"pip could not reach the package index: {pip.stderr[-300:]}")
    assert pip.returncode == 0, pip.stderr[-3000:]

    listed = subprocess.run([py, "-m", "pip", "list", "--format=json"], capture_output=True,
                            text=True, check=True).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "voxfarm" in names and "flask" in names
    assert not names & WORKER_ONLY, names & WORKER_ONLY
    assert not any(n.startswith("nvidia-") for n in names)

    # The web app builds from the install (not this checkout) and never reaches for torch.
    out = subprocess.run(
        [py, "-c", "import sys, web.wsgi, web; "
                   "print(web.__file__); print('torch' in sys.modules)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ.get("PATH", "/usr/bin"),
             "VOXFARM_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 0, out.stderr[-3000:]
    where, torch = out.stdout.split()
    assert where.startswith(str(venv)) and torch == "False"

    site = next((venv / "lib").glob("python3*/site-packages"))
    size = tree_bytes(site)
    biggest = sorted(((tree_bytes(p), p.name) for p in site.iterdir() if p.is_dir()),
                     reverse=True)[:8]
    print(f"\nweb-only site-packages: {size / 2**20:.0f} MiB; biggest: "
          + ", ".join(f"{name} {b / 2**20:.0f}" for b, name in biggest))
    assert size < MAX_WEB_ONLY_BYTES

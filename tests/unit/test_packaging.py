"""What the install promises: the web process runs without torch, the CLI and entry points
import, and the Procfile names every pool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(code: str) -> set[str]:
    script = f"{code}\nimport sys\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", script],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"VOXFARM_REDIS_URL": "redis://127.0.0.1:1/0", "PATH": "/usr/bin"})
    return set(out.stdout.split())


def test_web_process_never_imports_torch():
    mods = imported_modules("import web.wsgi")
    assert "flask" in mods and "models.text.frontend" in mods
    assert "torch" not in mods


def test_cli_imports_without_torch_or_workers():
    mods = imported_modules("import app.cli")
    assert "click" in mods
    assert "torch" not in mods and "workers.main" not in mods


def test_procfile_names_every_pool():
    lines = dict(line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines()
                 if line and not line.startswith("#"))
    assert set(lines) >= {"web", "acoustic", "vocoder", "flower"}
    assert "gunicorn" in lines["web"] and "worker acoustic" in lines["acoustic"]

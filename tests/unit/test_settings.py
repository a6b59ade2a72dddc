"""Settings: every knob read from the environment in one place, `app/settings.py`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("app", "tasks", "workers", "models", "web", "ops")

# A read of a VOXFARM_* variable: os.environ.get("VOXFARM_X"), os.environ["VOXFARM_X"] (not
# followed by "=", an assignment for a child process), os.getenv, environ.get on any mapping
# holding the environment, "VOXFARM_X" in os.environ, and click's envvar="VOXFARM_X".
_READS = re.compile(
    r"""(?:environ\.get|getenv|\benv\.get)\(\s*f?["']VOXFARM_"""
    r"""|environ\[\s*f?["']VOXFARM_\w*["']\s*\](?!\s*=[^=])"""
    r"""|["']VOXFARM_\w*["']\s+(?:not\s+)?in\s+(?:os\.)?environ"""
    r"""|envvar\s*=\s*["']VOXFARM_""")


def env_reads() -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "app/settings.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _READS.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_nothing_but_settings_reads_voxfarm_variables():
    reads = env_reads()
    assert not reads, ("VOXFARM_* read outside app/settings.py (add a Settings field and "
                       "read it there):\n" + "\n".join(reads))


def test_the_pattern_sees_reads_and_not_writes():
    reads = ['os.environ.get("VOXFARM_A")', "os.getenv('VOXFARM_A', '1')",
             'os.environ["VOXFARM_A"]', 'x = os.environ["VOXFARM_A"] or 1',
             'env.get("VOXFARM_A")', 'if "VOXFARM_A" in os.environ:',
             '@click.option("--a", envvar="VOXFARM_A")']
    writes = ['os.environ["VOXFARM_A"] = "1"', 'env["VOXFARM_A"] = url',
              'os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", "x")',
              '"""Set VOXFARM_A to ..."""']
    assert all(_READS.search(line) for line in reads), [r for r in reads if not _READS.search(r)]
    assert not any(_READS.search(line) for line in writes)


def test_every_field_has_its_variable(monkeypatch):
    names = Settings.env_names()
    assert names["mel_cache_ttl"] == ("VOXFARM_MEL_CACHE_TTL",)
    assert names["store_dir"] == ("VOXFARM_STORE",)
    assert names["var_dir"] == ("VOXFARM_VAR",)
    assert names["server_url"] == ("VOXFARM_SERVER",)
    assert names["redis_url"] == ("VOXFARM_REDIS_URL", "REDIS_URL")
    for variables in names.values():
        for variable in variables:
            monkeypatch.delenv(variable, raising=False)
    assert Settings.from_env() == Settings()


def test_from_env_converts_by_type(monkeypatch):
    monkeypatch.setenv("VOXFARM_JOB_TTL", "7")
    monkeypatch.setenv("VOXFARM_MAX_QUEUE_WAIT_S", "2.5")
    monkeypatch.setenv("VOXFARM_LOG_SAMPLE_RATE", "0.25")
    monkeypatch.setenv("VOXFARM_DEVICE", "cuda:1")
    monkeypatch.setenv("VOXFARM_STORE", "/srv/store")
    monkeypatch.setenv("VOXFARM_KEY_PREFIX", "")  # set to empty means empty
    s = Settings.from_env()
    assert (s.job_ttl, s.max_queue_wait_s, s.log_sample_rate) == (7, 2.5, 0.25)
    assert (s.device, s.store_dir, s.key_prefix) == ("cuda:1", "/srv/store", "")
    assert s.bind == "127.0.0.1:8000" and s.web_workers == 2


def test_a_bad_number_names_its_variable(monkeypatch):
    monkeypatch.setenv("VOXFARM_JOB_TTL", "soon")
    with pytest.raises(ValueError, match="VOXFARM_JOB_TTL='soon'"):
        Settings.from_env()


def test_redis_url_falls_back_to_redis_url(monkeypatch):
    monkeypatch.delenv("VOXFARM_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/1")
    assert Settings.from_env().redis_url == "redis://elsewhere:6379/1"
    monkeypatch.setenv("VOXFARM_REDIS_URL", "")  # empty counts as unset, as before
    assert Settings.from_env().redis_url == "redis://elsewhere:6379/1"
    monkeypatch.setenv("VOXFARM_REDIS_URL", "redis://mine:6379/0")
    assert Settings.from_env().redis_url == "redis://mine:6379/0"


def test_settings_are_immutable_and_with_makes_a_copy():
    s = Settings()
    with pytest.raises(ValidationError, match="frozen"):
        s.job_ttl = 1  # type: ignore[misc]
    t = s.with_(job_ttl=1)
    assert (s.job_ttl, t.job_ttl) == (Settings().job_ttl, 1)


def test_a_switch_is_read_by_its_word(monkeypatch):
    for raw, expected in (("false", False), ("0", False), ("no", False), ("true", True),
                          ("1", True), ("On", True)):
        monkeypatch.setenv("VOXFARM_AUTH_OPS", raw)
        assert Settings.from_env().auth_ops is expected, raw
    monkeypatch.setenv("VOXFARM_AUTH_OPS", "maybe")
    with pytest.raises(ValueError, match="VOXFARM_AUTH_OPS"):
        Settings.from_env()


def test_every_setting_is_in_the_operations_table():
    """docs/operations.md lists every variable the settings read, so none is undocumented."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    missing = [names[0] for names in Settings.env_names().values() if names[0] not in doc]
    assert not missing, f"not in docs/operations.md: {missing}"


def test_a_value_out_of_range_names_its_variable_in_one_line(monkeypatch):
    monkeypatch.setenv("VOXFARM_CANARY_SHARE", "1.5")
    with pytest.raises(ValueError) as raised:
        Settings.from_env()
    message = str(raised.value)
    assert message.startswith("VOXFARM_CANARY_SHARE='1.5' ") and "\n" not in message
    assert "less than or equal to 1" in message
    monkeypatch.setenv("VOXFARM_CANARY_SHARE", "0.5")
    monkeypatch.setenv("VOXFARM_GPU_MIN_FREE", "-0.1")
    with pytest.raises(ValueError, match="VOXFARM_GPU_MIN_FREE='-0.1' "):
        Settings.from_env()
    with pytest.raises(ValueError, match="VOXFARM_MAX_QUEUE_DEPTH=-1 "):
        Settings().with_(max_queue_depth=-1)


def test_secrets_never_print(monkeypatch):
    monkeypatch.setenv("VOXFARM_FLOWER_PASSWORD", "hunter2-flower")
    monkeypatch.setenv("VOXFARM_API_KEY", "vf_live_secret")
    s = Settings.from_env()
    assert "hunter2" not in repr(s) and "vf_live_secret" not in str(s)
    assert s.flower_password.get_secret_value() == "hunter2-flower"
    assert s.api_key.get_secret_value() == "vf_live_secret"
    monkeypatch.setenv("VOXFARM_AT_REST_KEYS", "k1:not*base64")
    with pytest.raises(ValueError) as raised:
        Settings.from_env()
    assert "not*base64" not in str(raised.value) and "VOXFARM_AT_REST_KEYS" in str(raised.value)


# The modules that read the environment into Settings: the web's entry points (gunicorn's
# config and the wsgi module the factory is served from) and the command line (which starts
# the workers and Flower). Everything else is handed its settings.
ENTRY_POINTS = {"web/wsgi.py", "ops/gunicorn.conf.py", "app/cli/common.py"}
_BUILDS = re.compile(r"\bSettings(?:\.from_env)?\(")


def settings_builds() -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ENTRY_POINTS or rel == "app/settings.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                if _BUILDS.search(code) and not code.lstrip().startswith(("class ", "def ")):
                    found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_settings_are_read_at_the_entry_points_only():
    builds = settings_builds()
    assert not builds, ("Settings built outside the entry points (take them as an argument "
                        "from the caller instead):\n" + "\n".join(builds))


def test_the_entry_point_pattern_sees_a_build():
    assert _BUILDS.search("settings = Settings.from_env()")
    assert _BUILDS.search("return Settings()")
    assert not _BUILDS.search("def f(settings: Settings) -> Settings:")

"""JSON log lines for the web and the workers, with the trace fields of the current work.

Every record becomes one JSON object on one line:

    {"ts": "2025-01-01T12:00:00.123Z", "level": "INFO", "logger": "voxfarm.tasks",
     "msg": "...", "request_id": "...", "job_id": "...", "segment": 3, "task_id": "...",
     "pid": 1234, ...}

The trace fields come from `app.obs.tracing` (bound per request and per task), so a log line
written anywhere below a task (a model, a store, Celery itself) carries the job's ids without
the caller passing them. Fields given with `extra={...}` are added as they are.

Per-segment debug lines (those logged with `extra={"sampled": True}`) pass a sampling
filter: a job is in or out as a whole (a hash of its id against `VOXFARM_LOG_SAMPLE_RATE`),
so the lines of a sampled job tell its whole story.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from typing import Any

from app.obs import tracing

TRACE_FIELDS = ("request_id", "job_id", "segment", "task_id")

# LogRecord attributes that are not user extras.
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName", "sampled"}


def job_sampled(job_id: str | None, rate: float) -> bool:
    """Deterministic per job: every process takes the same decision for the same job."""
    if rate >= 1.0:
        return True
    if rate <= 0.0 or not job_id:
        return False
    bucket = int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=4).digest(), "big")
    return bucket < rate * 2**32


class SegmentSampler(logging.Filter):
    """Drops the per-segment lines of the jobs outside the sample; passes everything else."""

    def __init__(self, rate: float = 1.0) -> None:
        """`rate`: the settings' `log_sample_rate` (VOXFARM_LOG_SAMPLE_RATE), held to 0..1."""
        super().__init__()
        self.rate = min(1.0, max(0.0, rate))

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "sampled", False):
            return True
        job_id = getattr(record, "job_id", None) or tracing.current().get("job_id")
        return job_sampled(job_id, self.rate)


def _gunicorn_access_fields(record: logging.LogRecord) -> dict:
    """gunicorn's access logger passes its atoms as the record's args: keep the useful ones."""
    atoms = record.args
    if not isinstance(atoms, dict):
        return {}
    out = {"method": atoms.get("m"), "path": atoms.get("U"), "query": atoms.get("q") or None,
           "status": int(atoms["s"]) if str(atoms.get("s", "")).isdigit() else atoms.get("s"),
           "duration_ms": round(int(atoms.get("D", 0)) / 1000, 3),
           "remote": atoms.get("h")}
    request_id = atoms.get("{x-request-id}o")
    if request_id and request_id != "-":
        out["request_id"] = request_id
    return {k: v for k, v in out.items() if v is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the trace fields, extras."""

    def __init__(self, *args, static: dict | None = None, **kwargs) -> None:
        # dictConfig passes format/datefmt/style: accepted and ignored, the shape is fixed.
        super().__init__()
        self.static = static or {}

    @staticmethod
    def _ts(created: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + \
            f".{int(created % 1 * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": self._ts(record.created), "level": record.levelname,
               "logger": record.name}
        if record.name == "gunicorn.access":
            out["msg"] = record.getMessage()
            out.update(_gunicorn_access_fields(record))
        else:
            out["msg"] = record.getMessage()
        for key, value in tracing.current().items():
            out.setdefault(key, value)
        for key, value in vars(record).items():
            if key not in _RESERVED and key not in out:
                out[key] = value
        out["pid"] = record.process
        out.update({k: v for k, v in self.static.items() if k not in out})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def json_handler(stream=None, role: str | None = None,
                 sample_rate: float = 1.0) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(static={"role": role} if role else None))
    handler.addFilter(SegmentSampler(sample_rate))
    return handler


def configure_logging(level: str | int = "INFO", role: str | None = None, stream=None,
                      sample_rate: float = 1.0) -> None:
    """Send every logger of this process to one JSON-lines handler on stderr, keeping the
    per-segment lines of `sample_rate` of the jobs."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(json_handler(stream, role, sample_rate))
    root.setLevel(level if isinstance(level, int) else level.upper())
    # Celery configures these with their own handlers when it sets up logging itself; here
    # they propagate to the root's JSON handler instead.
    for name in ("celery", "celery.task", "celery.redirected"):
        lg = logging.getLogger(name)
        lg.handlers = []
        lg.propagate = True


def gunicorn_logconfig(level: str = "info", sample_rate: float = 1.0) -> dict:
    """`logconfig_dict` for gunicorn: its error and access logs and the app's, as JSON."""
    handler = {"class": "logging.StreamHandler", "formatter": "json",
               "filters": ["sampler"], "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "app.obs.logging_setup.JsonFormatter",
                                "static": {"role": "web"}}},
        "filters": {"sampler": {"()": "app.obs.logging_setup.SegmentSampler",
                                "rate": sample_rate}},
        "handlers": {"json": handler,
                     "json_access": {**handler, "stream": "ext://sys.stdout"}},
        "root": {"level": level.upper(), "handlers": ["json"]},
        "loggers": {
            "gunicorn.error": {"level": level.upper(), "handlers": ["json"],
                               "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": ["json_access"],
                                "propagate": False},
        },
    }

"""The canary's rule, pure: what an operator may ask for (a voice whose engine has versions,
a readable version file that fits it, overrides its engine takes, within range), which jobs
a candidate renders, and the decision to promote, roll back or wait, from the two versions'
figures. No Redis: the store (app/canary/store.py) keeps the versions, the figures and the
decisions."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.broker.stages import PIPELINE
from app.errors import FarmError
from app.settings import Settings
from models.neural.voice_file import INFERENCE_RANGES, Inference

LIVE, CANDIDATE, RETIRED = "live", "candidate", "retired"
PROMOTE, ROLLBACK, WAIT, START = "promote", "rollback", "wait", "start"
STAGES = PIPELINE  # the stages whose run times a version is judged on


class CanaryError(FarmError, ValueError):
    """An operator's request that cannot be done (no such voice or version, a candidate is
    already running, a file that is not a voice); the message says why."""

    status, code, retry = 422, "invalid_candidate", False


class CanaryRunning(CanaryError):
    """The voice has a candidate already: promote or roll it back first."""

    status, code = 409, "canary_running"


@dataclass(frozen=True)
class Version:
    """One version of a voice: `file` its engine's version file (a Piper `.onnx`, a Kokoro
    style pack; "" for the voice's own), `inference` its overrides, `state` live, candidate
    or retired."""

    id: str
    voice: str
    file: str = ""
    inference: Inference = Inference()
    state: str = LIVE
    created_at: float = 0.0
    note: str = ""

    def to_json(self) -> str:
        # allow_nan=False: Redis's cjson cannot read Infinity or NaN (check_candidate keeps
        # them out; this is the last guard before a store script).
        return json.dumps({**asdict(self), "inference": self.inference.as_dict()},
                          allow_nan=False)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Version:
        data = json.loads(raw)
        return cls(id=data["id"], voice=data["voice"], file=data.get("file", ""),
                   inference=Inference(**data.get("inference", {})),
                   state=data.get("state", LIVE), created_at=float(data.get("created_at", 0)),
                   note=data.get("note", ""))

    def describe(self) -> str:
        parts = [f"file={self.file}" if self.file else "the voice's own file"]
        parts += [f"{k}={v:g}" for k, v in self.inference.as_dict().items()]
        return ", ".join(parts)


def voice_key(voice: str) -> str:
    """The name versions are kept under: the voice without `:SPEAKER`, lower-cased (every
    speaker of a voice renders from the same file)."""
    return voice.strip().lower().partition(":")[0]


def share_point(job_id: str) -> float:
    """Where a job falls in [0, 1): a stable hash of its id, the same in every process."""
    return int(hashlib.sha256(job_id.encode()).hexdigest()[:13], 16) / float(1 << 52)


def _range_error(name: str, value: float, lo: float, hi: float) -> str | None:
    """The admin API's words for a value out of [lo, hi] (web/schemas/fields.py `Range`), so the
    CLI says what the API says; NaN and the infinities fail every bound."""
    return None if lo <= value <= hi else f"'{name}' must be between {lo} and {hi}"


def inference_error(name: str, value: float) -> str | None:
    """Why override `name` cannot be `value` (outside INFERENCE_RANGES), or None."""
    return _range_error(name, value, *INFERENCE_RANGES[name])


def share_error(share: float) -> str | None:
    """Why `share` cannot be a candidate's share of jobs, or None."""
    return _range_error("share", share, 0.0, 1.0)


# The admin API's one answer for a file it will not read: missing, outside the voices
# directory, or not a file any voice's version may be, alike, so the answer tells nothing of
# the rest of the disk (a path's existence, a file's kind).
NO_VOICE_FILE = "no such voice file in the voices directory"


def version_suffixes() -> frozenset[str]:
    """What a file that may be some voice's version ends in: every engine's
    `version_suffixes` (a Piper `.onnx`, a Kokoro style pack)."""
    # the voice engines are read only to check an operator's request
    from models.voices import backends

    return frozenset(s for backend in backends() for s in backend.version_suffixes)


def voice_file_in(voices_dir: str, file: str) -> str:
    """`file` (a name, or a path) as the path of a file directly in `voices_dir`, where the
    farm's voices are (`VOXFARM_VOICES_DIR`), that may be a voice's version (its suffix one of
    `version_suffixes`); else CanaryError(NO_VOICE_FILE), the same for every reason. Lexical:
    `..` cannot leave the directory, and a link in it is the operator's own, as the voice list
    takes it. Whether it fits the voice is `check_candidate`'s."""
    if not (voices_dir and file):
        raise CanaryError(NO_VOICE_FILE)
    root = Path(os.path.abspath(voices_dir))
    path = Path(os.path.normpath(root / file))  # an absolute `file` stands for itself
    try:
        inside = (path.parent == root and path.suffix in version_suffixes()
                  and path.is_file())
    except (OSError, ValueError):  # a NUL in the name, a name too long
        inside = False
    if not inside:
        raise CanaryError(NO_VOICE_FILE)
    return str(path)


def check_candidate(voice: str, file: str = "", inference: Inference | None = None) -> str:
    """What an operator asks for, checked before it takes traffic: `voice` is a voice whose
    engine has versions (a `:SPEAKER` it has is allowed: versions belong to the voice), the
    overrides are ones its engine takes and within INFERENCE_RANGES, and `file` (if any) is
    readable, ends as the engine's version files do, and fits the voice (the engine's
    `check_version_file`: a Piper voice's config parses and speaks at the voice's sample rate,
    a Kokoro pack holds a style pack). Returns the voice's name (without a speaker). Raises
    CanaryError, UnknownVoice, UnknownSpeaker."""
    # the voice engines are read only to check an operator's request
    from models.voices import backend_for, backends, get_voice

    offered = get_voice(get_voice(voice).voice_name)
    if offered.kind != "model":  # a spec: its base's versions render it
        raise CanaryError(f"voice {offered.name} is {offered.kind}, not a voice as offered: "
                          "versions belong to the voice it is made from")
    backend = backend_for(offered)
    if not backend.has_versions:
        versioned = " and ".join(b.name.capitalize() for b in backends() if b.has_versions)
        raise CanaryError(f"voice {offered.name} has no versions (its engine: "
                          f"{offered.engine}): only {versioned} voices have versions")
    overrides = (inference or Inference()).as_dict()
    if backend.no_overrides and overrides:
        raise CanaryError(f"voice {offered.name} takes no inference overrides "
                          f"({', '.join(overrides)}): {backend.no_overrides}")
    for name, value in overrides.items():
        if (error := inference_error(name, value)) is not None:
            raise CanaryError(error)
    if file:
        if not Path(file).is_file():
            raise CanaryError(f"{file}: no such voice file")
        if Path(file).suffix not in backend.version_suffixes:
            raise CanaryError(f"{file}: a version of voice {offered.name} is a "
                              f"{' or '.join(backend.version_suffixes)} file")
        try:
            backend.check_version_file(offered, file)
        except ValueError as exc:  # VoiceFileError too: each names the file and the problem
            raise CanaryError(str(exc)) from None
    return offered.name


# -- the rule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """When a candidate is promoted or rolled back (the settings' `canary_*`)."""

    min_scored: int = 20
    max_wer_increase: float = 0.02
    max_clipping_increase: float = 0.01
    max_silence_increase: float = 0.15
    max_latency_ratio: float = 1.2
    latency_slack_s: float = 0.05
    max_failure_ratio: float = 0.01

    @classmethod
    def from_settings(cls, settings: Settings) -> Rule:
        return cls(min_scored=settings.canary_min_scored,
                   max_wer_increase=settings.canary_max_wer_increase,
                   max_clipping_increase=settings.canary_max_clipping_increase,
                   max_silence_increase=settings.canary_max_silence_increase,
                   max_latency_ratio=settings.canary_max_latency_ratio,
                   latency_slack_s=settings.canary_latency_slack_s,
                   max_failure_ratio=settings.canary_max_failure_ratio)


@dataclass(frozen=True)
class Figures:
    """A version's figures so far: scored segments and their sums, segments rendered and
    failed, and each stage's p99 run time (None without samples)."""

    scored: int = 0
    wer_errors: int = 0
    wer_words: int = 0
    clipping_sum: float = 0.0
    silence_sum: float = 0.0
    loudness_sum: float = 0.0
    segments: int = 0
    failed: int = 0
    p99_s: dict = field(default_factory=dict)

    @property
    def wer(self) -> float | None:
        """Word error rate over every scored word (not a mean of segments' rates: a long
        segment weighs its words)."""
        return self.wer_errors / self.wer_words if self.wer_words else None

    def mean(self, total: float) -> float | None:
        return total / self.scored if self.scored else None

    @property
    def failure_ratio(self) -> float:
        finished = self.segments + self.failed
        return self.failed / finished if finished else 0.0

    def summary(self) -> dict:
        """The figures as the decision log and the CLI show them (rounded)."""
        def r(x, n=4):
            return None if x is None or (isinstance(x, float) and math.isinf(x)) \
                else round(x, n)
        return {"scored": self.scored, "wer": r(self.wer),
                "words": self.wer_words, "clipping": r(self.mean(self.clipping_sum), 5),
                "silence": r(self.mean(self.silence_sum)),
                "loudness_dbfs": r(self.mean(self.loudness_sum), 2),
                "segments": self.segments, "failed": self.failed,
                "failure_ratio": r(self.failure_ratio),
                **{f"p99_s_{stage}": r(v) for stage, v in sorted(self.p99_s.items())}}


@dataclass(frozen=True)
class Decision:
    action: str  # promote, rollback or wait
    reasons: tuple[str, ...]


# A figure exactly on a margin is within it: 0.07 - 0.05 is 0.020000000000000004 in floats.
_EPS = 1e-9


def worth_scoring(rule: Rule, version: str, live_id: str, candidate_id: str, live: Figures,
                  candidate: Figures) -> str | None:
    """Why a queued score of `version` is not worth the quality pool's time now, or None.

    The pool transcribes more slowly than the farm renders, so its queue lags: a score of a
    version that is neither live nor the candidate any more (one decided meanwhile) is
    dropped, and live is scored only while it has fewer scores than the rule needs or than
    the candidate has, so a new candidate is never stuck behind the backlog of live's (the
    rule waits for both to have `min_scored`).
    """
    if not candidate_id or version not in (live_id, candidate_id):
        return f"version {version} is no longer live or a candidate"
    if version == live_id and live.scored >= max(rule.min_scored, candidate.scored):
        return f"live has {live.scored} scores; the candidate {candidate.scored}"
    return None


def decide(rule: Rule, live: Figures, candidate: Figures) -> Decision:
    """The canary's rule: roll back at once when the candidate's failure ratio passes the
    bound; otherwise wait until both versions have `min_scored` scored segments, then
    promote if the candidate is within every margin of live, else roll back, saying why."""
    if candidate.failure_ratio > rule.max_failure_ratio:
        return Decision(ROLLBACK, (
            f"failure ratio {candidate.failure_ratio:.3f} ({candidate.failed} of "
            f"{candidate.segments + candidate.failed} segments) > {rule.max_failure_ratio}",))
    if candidate.scored < rule.min_scored or live.scored < rule.min_scored:
        return Decision(WAIT, (f"scored {candidate.scored} candidate and {live.scored} live "
                               f"segments of {rule.min_scored}",))
    bad: list[str] = []
    good: list[str] = []
    if candidate.wer is not None and live.wer is not None:
        line = (f"WER {candidate.wer:.3f} vs live {live.wer:.3f} "
                f"(+{candidate.wer - live.wer:.3f}, margin {rule.max_wer_increase})")
        (bad if candidate.wer - live.wer > rule.max_wer_increase + _EPS else good).append(line)
    for name, margin in (("clipping", rule.max_clipping_increase),
                         ("silence", rule.max_silence_increase)):
        c = candidate.mean(getattr(candidate, f"{name}_sum"))
        v = live.mean(getattr(live, f"{name}_sum"))
        if c is None or v is None:
            continue
        line = f"{name} {c:.4f} vs live {v:.4f} (margin {margin})"
        (bad if c - v > margin + _EPS else good).append(line)
    for stage in STAGES:
        c, v = candidate.p99_s.get(stage), live.p99_s.get(stage)
        if c is None or v is None:
            continue
        line = (f"{stage} p99 {c:.3f} s vs live {v:.3f} s (at most {rule.max_latency_ratio}x, "
                f"slack {rule.latency_slack_s} s)")
        slower = c > rule.max_latency_ratio * v and c - v > rule.latency_slack_s
        (bad if slower else good).append(line)
    if bad:
        return Decision(ROLLBACK, tuple(bad))
    return Decision(PROMOTE, tuple(good))


def p99(samples: list[float]) -> float | None:
    """The 99th percentile (nearest rank) of `samples`, None for none."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]

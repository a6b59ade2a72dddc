"""Voice versions and the quality canary: a candidate voice takes a share of the traffic and
is promoted or rolled back by measured quality and errors (docs/models.md, "Voice versions
and the canary").

A Piper voice may have versions: another voice file, or the same file with other inference
settings (noise_scale, length_scale, noise_w). One version is live; one may be a candidate.

* The split (`Canary.version_for`): a share of interactive jobs (`canary_share`, 5%) goes to
  the candidate, by a stable hash of the job id, and the job's every segment carries the
  version it was given (app/queueing.py memoizes it per job), so one job never mixes voices.
  Books take the live version (tasks/books.py), whatever the split.
* What a version renders: the segment tasks resolve a spec's version to a `Voice` with the
  version's file and inference overrides (`voice_for`); the acoustic model id names the file's
  hash and the overrides, so the mel cache key (and the noise seed drawn from it) differ
  whenever the features would: a version change never serves another version's features.
* The judging (tasks/quality.py): the segment workers count each version's segments and
  failures and keep its recent run times; the quality pool scores a sample of finished
  segments of both versions (word error rate against the segment's text, clipping, silence,
  loudness: models/quality.py). `decide` is the rule, a pure function of the two versions'
  figures and the settings; `Canary.judge` reads the figures, decides, and applies a promote
  or a rollback in one Lua script that also appends it to the decision log (a Redis stream),
  so two judges racing apply it once. Each decision is also a log line and a metric.

Who runs what: the web calls `version_for` (on the gevent hub, one HMGET per job and voice);
the segment and quality workers call the rest from their forked processes. They share
nothing but Redis; the per-process version cache holds immutable records only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import redis

from app.errors import FarmError
from app.keys import Keys
from app.settings import Settings
from models.piper_voice import INFERENCE_RANGES, Inference

log = logging.getLogger("voxfarm.canary")

LIVE, CANDIDATE, RETIRED = "live", "candidate", "retired"
PROMOTE, ROLLBACK, WAIT, START = "promote", "rollback", "wait", "start"
STAGES = ("acoustic", "vocoder")
# Run times kept per version and stage: enough for a p99 that is not just the maximum.
LATENCY_SAMPLES = 1000
# The decision log keeps this many entries per voice.
DECISIONS_KEPT = 1000
# A scored segment is remembered this long (a redelivered score counts once meanwhile).
SCORED_TTL_S = 7 * 24 * 3600


class CanaryError(FarmError, ValueError):
    """An operator's request that cannot be done (no such voice or version, a candidate is
    already running, a file that is not a voice); the message says why."""

    status, code, retry = 422, "invalid_candidate", False


class CanaryRunning(CanaryError):
    """The voice has a candidate already: promote or roll it back first."""

    status, code = 409, "canary_running"


@dataclass(frozen=True)
class Version:
    """One version of a voice: `file` a Piper `.onnx` ("" for the voice's own), `inference`
    its overrides, `state` live, candidate or retired."""

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
    """The admin API's words for a value out of [lo, hi] (web/schemas.py `Range`), so the
    CLI says what the API says; NaN and the infinities fail every bound."""
    return None if lo <= value <= hi else f"'{name}' must be between {lo} and {hi}"


def inference_error(name: str, value: float) -> str | None:
    """Why override `name` cannot be `value` (outside INFERENCE_RANGES), or None."""
    return _range_error(name, value, *INFERENCE_RANGES[name])


def share_error(share: float) -> str | None:
    """Why `share` cannot be a candidate's share of jobs, or None."""
    return _range_error("share", share, 0.0, 1.0)


def check_candidate(voice: str, file: str = "", inference: Inference | None = None) -> str:
    """What an operator asks for, checked before it takes traffic: `voice` is a Piper voice
    (a `:SPEAKER` it has is allowed: versions belong to the voice), `file` (if any) a
    readable Piper voice whose config parses and speaks at the voice's sample rate (a job
    carries its voice's rate), and the overrides are within INFERENCE_RANGES. Returns the
    voice's name (without a speaker). Raises CanaryError, UnknownVoice, UnknownSpeaker."""
    # voice files are read only to check an operator.s request
    from models.piper_voice import PiperConfig, VoiceFileError, config_path_for
    from models.voices import PIPER, get_voice

    offered = get_voice(get_voice(voice).voice_name)
    if offered.engine != PIPER:
        raise CanaryError(f"voice {offered.name} is an eSpeak voice: only Piper voices have "
                          "versions")
    for name, value in (inference or Inference()).as_dict().items():
        if (error := inference_error(name, value)) is not None:
            raise CanaryError(error)
    if file:
        path = Path(file)
        if not path.is_file():
            raise CanaryError(f"{file}: no such voice file")
        try:
            config = PiperConfig.from_json(config_path_for(path))
        except VoiceFileError as exc:
            raise CanaryError(str(exc)) from None
        if config.sample_rate != offered.sample_rate:
            raise CanaryError(f"{file} speaks at {config.sample_rate} Hz, voice "
                              f"{offered.name} at {offered.sample_rate} Hz")
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


# -- the store -----------------------------------------------------------------------------

# Start a candidate. KEYS: the voice hash, its versions, the versioned-voices set, the
# decision log. ARGV: voice, base version JSON (v1, live) used only when the voice has no
# versions yet, candidate JSON without its id, share, now, note. Returns the candidate's id,
# or "!" + the running candidate's id when there is one already.
# Both records are read and written out (cjson refuses what it cannot serialise, such as an
# infinity) before the first write: Redis keeps what a failing script wrote, and a failed
# start must leave no version and use no id.
_START = """
local voice = ARGV[1]
local base_json_in = ARGV[2]
local candidate_json_in = ARGV[3]
local share = ARGV[4]
local now = ARGV[5]
local reasons = ARGV[6]
local decisions_kept = ARGV[7]
local current = redis.call('HGET', KEYS[1], 'candidate')
if current and current ~= '' then return '!' .. current end
local fresh = redis.call('HLEN', KEYS[2]) == 0
local seq = fresh and 1 or tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local id = 'v' .. (seq + 1)
local base = cjson.decode(base_json_in)
base['id'] = 'v1'
local rec = cjson.decode(candidate_json_in)
rec['id'] = id
local base_json, rec_json = cjson.encode(base), cjson.encode(rec)
if fresh then
  redis.call('HSET', KEYS[2], 'v1', base_json)
  redis.call('HSET', KEYS[1], 'live', 'v1')
end
redis.call('HSET', KEYS[1], 'seq', seq + 1)
redis.call('HSET', KEYS[2], id, rec_json)
redis.call('HSET', KEYS[1], 'candidate', id, 'share', share)
redis.call('SADD', KEYS[3], voice)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', decisions_kept, '*', 'ts', now, 'action', 'start',
           'by', 'operator', 'candidate', id, 'live', redis.call('HGET', KEYS[1], 'live'),
           'reasons', reasons, 'figures', '{}')
return id
"""

# Promote or roll back the candidate, once. KEYS: the voice hash, its versions, the decision
# log. ARGV: action, the candidate id it was decided for, by, reasons JSON, figures JSON,
# now, log length. Returns 0 (and changes nothing) unless that candidate is still running.
_DECIDE = """
local action = ARGV[1]
local expected = ARGV[2]
local by = ARGV[3]
local reasons = ARGV[4]
local figures = ARGV[5]
local now = ARGV[6]
local decisions_kept = ARGV[7]
local candidate = redis.call('HGET', KEYS[1], 'candidate')
if not candidate or candidate == '' or candidate ~= expected then return 0 end
local live = redis.call('HGET', KEYS[1], 'live')
local function set_state(id, state)
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    local rec = cjson.decode(raw)
    rec['state'] = state
    redis.call('HSET', KEYS[2], id, cjson.encode(rec))
  end
end
if action == 'promote' then
  set_state(candidate, 'live')
  if live then set_state(live, 'retired') end
  redis.call('HSET', KEYS[1], 'live', candidate, 'candidate', '')
else
  set_state(candidate, 'retired')
  redis.call('HSET', KEYS[1], 'candidate', '')
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', decisions_kept, '*', 'ts', now, 'action', action,
           'by', by, 'candidate', candidate, 'live', live or '', 'reasons', reasons,
           'figures', figures)
return 1
"""

# Count a scored segment once. KEYS: the version's scored set, its stats. ARGV: member,
# errors, words, clipping, silence, loudness, ttl. Returns 1 when counted, 0 when it was.
_SCORE = """
local member = ARGV[1]
local errors = ARGV[2]
local words = ARGV[3]
local clipping = ARGV[4]
local silence = ARGV[5]
local loudness = ARGV[6]
local ttl = ARGV[7]
if redis.call('SADD', KEYS[1], member) == 0 then return 0 end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('HINCRBY', KEYS[2], 'scored', 1)
redis.call('HINCRBY', KEYS[2], 'wer_errors', errors)
redis.call('HINCRBY', KEYS[2], 'wer_words', words)
redis.call('HINCRBYFLOAT', KEYS[2], 'clipping_sum', clipping)
redis.call('HINCRBYFLOAT', KEYS[2], 'silence_sum', silence)
redis.call('HINCRBYFLOAT', KEYS[2], 'loudness_sum', loudness)
return 1
"""


class Canary:
    """A farm's voice versions, its split and its judge, on the farm's Redis."""

    def __init__(self, r: redis.Redis, keys: Keys, settings: Settings) -> None:
        self.r, self.keys, self.settings = r, keys, settings
        self.rule = Rule.from_settings(settings)
        self._start = r.register_script(_START)
        self._decide = r.register_script(_DECIDE)
        self._score = r.register_script(_SCORE)
        self._records: dict[tuple[str, str], Version] = {}  # file and inference never change

    # -- reading -------------------------------------------------------------------------

    def state(self, voice: str) -> tuple[str, str, float]:
        """(live version id, candidate id, candidate share); ("", "", 0) without versions."""
        live, candidate, share = self.r.hmget(self.keys.voice(voice_key(voice)), "live",
                                              "candidate", "share")
        return ((live or b"").decode(), (candidate or b"").decode(),
                float(share) if share else 0.0)

    def versions(self, voice: str) -> list[Version]:
        raw = self.r.hvals(self.keys.voice_versions(voice_key(voice)))
        return sorted((Version.from_json(v) for v in raw), key=lambda v: int(v.id[1:]))

    def voices(self) -> list[str]:
        return sorted(v.decode() for v in self.r.smembers(self.keys.versioned_voices))

    def version(self, voice: str, version_id: str) -> Version | None:
        """A version's record (its file and overrides are cached: they never change; its
        state as of the first read)."""
        name = voice_key(voice)
        cached = self._records.get((name, version_id))
        if cached is None:
            raw = self.r.hget(self.keys.voice_versions(name), version_id)
            if raw is None:
                return None
            cached = self._records[(name, version_id)] = Version.from_json(raw)
        return cached

    def unjudged_warnings(self, quality_workers: int) -> list[str]:
        """/readyz's warning for each voice whose candidate no quality worker judges."""
        if quality_workers:
            return []
        return [f"voice {name} has a candidate version but no quality worker is live: it "
                "is neither promoted nor rolled back until one starts"
                for name in self.voices() if self.state(name)[1]]

    def decisions(self, voice: str, count: int = 100) -> list[dict]:
        """The decision log, oldest first (at most the last `count` entries)."""
        entries = self.r.xrevrange(self.keys.voice_decisions(voice_key(voice)), count=count)
        out = []
        for entry_id, fields in reversed(entries):
            rec = {k.decode(): v.decode() for k, v in fields.items()}
            rec["id"] = entry_id.decode()
            rec["reasons"] = json.loads(rec.get("reasons") or "[]")
            rec["figures"] = json.loads(rec.get("figures") or "{}")
            rec["ts"] = float(rec.get("ts", 0))
            out.append(rec)
        return out

    # -- the split -----------------------------------------------------------------------

    def version_for(self, voice: str, job_id: str) -> str:
        """The version that renders job `job_id`'s segments of `voice`: the candidate for a
        `share` of jobs (a stable hash of the id: the same answer every time), else live; ""
        for a voice without versions."""
        live, candidate, share = self.state(voice)
        if candidate and share_point(job_id) < share:
            return candidate
        return live

    def live_version(self, voice: str) -> str:
        return self.state(voice)[0]

    # -- operators -----------------------------------------------------------------------

    def start(self, voice: str, file: str = "", inference: Inference | None = None,
              share: float | None = None, note: str = "") -> Version:
        """Make a new candidate version of `voice` (registering its current file as v1, live,
        the first time). Raises CanaryError when a candidate is running already."""
        name = voice_key(voice)
        # + 0.0: a share of -0.0 is kept (and shown) as 0.0.
        share = (self.settings.canary_share if share is None else share) + 0.0
        if (error := share_error(share)) is not None:
            raise CanaryError(error)
        now = time.time()
        base = Version("v1", name, state=LIVE, created_at=now, note="the voice as offered")
        cand = Version("", name, file=file, inference=inference or Inference(),
                       state=CANDIDATE, created_at=now, note=note)
        result = self._start(
            keys=[self.keys.voice(name), self.keys.voice_versions(name),
                  self.keys.versioned_voices, self.keys.voice_decisions(name)],
            args=[name, base.to_json(), cand.to_json(), repr(share), repr(now),
                  json.dumps([f"candidate {cand.describe()} at {share:.0%} of jobs"]),
                  DECISIONS_KEPT]).decode()
        if result.startswith("!"):
            raise CanaryRunning(f"voice {name} has a candidate already ({result[1:]}): promote "
                              "or roll it back first")
        # after multiproc.prepare(): prometheus_client picks its mode when first imported
        from app import metrics

        metrics.CANARY_DECISIONS.labels(name, START, "operator").inc()
        log.warning("canary %s: start %s (%s) at %.0f%% of jobs", name, result,
                    cand.describe(), share * 100)
        return cast(Version, self.version(name, result))  # just added

    def promote(self, voice: str, by: str = "operator", reasons: tuple[str, ...] = (),
                candidate: str | None = None) -> str | None:
        """Make the candidate live (the old live is retired). Returns its id, None when there
        is no candidate (or it is not `candidate` any more)."""
        return self._apply(PROMOTE, voice, by, reasons, candidate)

    def rollback(self, voice: str, by: str = "operator", reasons: tuple[str, ...] = (),
                 candidate: str | None = None) -> str | None:
        """Retire the candidate; live stays. Returns its id, None when there is none."""
        return self._apply(ROLLBACK, voice, by, reasons, candidate)

    def _apply(self, action: str, voice: str, by: str, reasons: tuple[str, ...],
               candidate: str | None) -> str | None:
        name = voice_key(voice)
        live, running, _ = self.state(name)
        candidate = candidate or running
        if not candidate or candidate != running:
            return None
        figures = {"live": self.figures(name, live).summary(),
                   "candidate": self.figures(name, candidate).summary()}
        applied = self._decide(
            keys=[self.keys.voice(name), self.keys.voice_versions(name),
                  self.keys.voice_decisions(name)],
            args=[action, candidate, by, json.dumps(list(reasons)), json.dumps(figures),
                  repr(time.time()), DECISIONS_KEPT])
        if not applied:
            return None
        # after multiproc.prepare(): prometheus_client picks its mode when first imported
        from app import metrics

        metrics.CANARY_DECISIONS.labels(name, action, by).inc()
        log.warning("canary %s: %s %s (live was %s) by %s: %s; figures %s", name, action,
                    candidate, live, by, "; ".join(reasons) or "-", json.dumps(figures),
                    extra={"canary": {"voice": name, "action": action,
                                      "candidate": candidate, "live": live, "by": by,
                                      "reasons": list(reasons), "figures": figures}})
        return candidate

    # -- the judging ---------------------------------------------------------------------

    def record_segment(self, voice: str, version: str, stage: str, ok: bool,
                       run_s: float | None = None) -> None:
        """A segment stage of `version` finished: a vocoder success counts a segment, a
        failure (after its retries) at either stage a failed one; a success's run time joins
        the stage's recent ones."""
        name = voice_key(voice)
        stats = self.keys.version_stats(name, version)
        with self.r.pipeline(transaction=False) as p:
            if not ok:
                p.hincrby(stats, "failed", 1)
            elif stage == "vocoder":
                p.hincrby(stats, "segments", 1)
            if ok and run_s is not None:
                latency = self.keys.version_latency(name, version, stage)
                p.lpush(latency, repr(run_s))
                p.ltrim(latency, 0, LATENCY_SAMPLES - 1)
            p.execute()

    def record_score(self, voice: str, version: str, member: str, errors: int, words: int,
                     clipping: float, silence: float, loudness_dbfs: float) -> bool:
        """A scored segment (`member`: "job:segment"); False when it was counted already."""
        name = voice_key(voice)
        loudness = loudness_dbfs if math.isfinite(loudness_dbfs) else -120.0
        return bool(self._score(
            keys=[self.keys.version_scored(name, version), self.keys.version_stats(name, version)],
            args=[member, errors, words, repr(clipping), repr(silence), repr(loudness),
                  SCORED_TTL_S]))

    def figures(self, voice: str, version: str) -> Figures:
        name = voice_key(voice)
        if not version:
            return Figures()
        with self.r.pipeline(transaction=False) as p:
            p.hgetall(self.keys.version_stats(name, version))
            for stage in STAGES:
                p.lrange(self.keys.version_latency(name, version, stage), 0, -1)
            stats, *latencies = p.execute()
        s = {k.decode(): v.decode() for k, v in stats.items()}
        return Figures(
            scored=int(s.get("scored", 0)), wer_errors=int(s.get("wer_errors", 0)),
            wer_words=int(s.get("wer_words", 0)),
            clipping_sum=float(s.get("clipping_sum", 0)),
            silence_sum=float(s.get("silence_sum", 0)),
            loudness_sum=float(s.get("loudness_sum", 0)),
            segments=int(s.get("segments", 0)), failed=int(s.get("failed", 0)),
            p99_s={stage: p99([float(x) for x in samples])
                   for stage, samples in zip(STAGES, latencies, strict=True) if samples})

    def judge(self, voice: str) -> tuple[Decision, Figures, Figures] | None:
        """Run the rule on `voice`'s candidate and apply a promote or a rollback (once, if
        two judges race). None when the voice has no candidate."""
        name = voice_key(voice)
        live_id, candidate_id, _ = self.state(name)
        if not candidate_id:
            return None
        live, candidate = self.figures(name, live_id), self.figures(name, candidate_id)
        decision = decide(self.rule, live, candidate)
        self.export(name, live_id, live)
        self.export(name, candidate_id, candidate)
        if decision.action in (PROMOTE, ROLLBACK):
            self._apply(decision.action, name, "rule", decision.reasons, candidate_id)
        return decision, live, candidate

    @staticmethod
    def export(voice: str, version: str, figures: Figures) -> None:
        """A version's figures as `voxfarm_canary_score` gauges."""
        # after multiproc.prepare(): prometheus_client picks its mode when first imported
        from app import metrics

        for figure, value in figures.summary().items():
            if isinstance(value, int | float) and figure not in ("words", "segments",
                                                                 "failed"):
                metrics.CANARY_SCORE.labels(voice, version, figure).set(value)

"""Voice versions and the quality canary: a candidate voice takes a share of the traffic and
is promoted or rolled back by measured quality and errors (docs/models.md, "Voice versions
and the canary").

A Piper voice may have versions: another voice file, or the same file with other inference
settings (noise_scale, length_scale, noise_w); a Kokoro voice too, another style pack (its
engine checks the file: `VoiceBackend.check_version_file`). One version is live; one may be
a candidate.

* The split (`Canary.version_for`): a share of interactive jobs (`canary_share`, 5%) goes to
  the candidate, by a stable hash of the job id, and the job's every segment carries the
  version it was given (app/submission.py memoizes it per job), so one job never mixes voices.
  Books take the live version (tasks/books.py), whatever the split.
* What a version renders: the segment tasks resolve a spec's version to a `Voice` with the
  version's file and inference overrides (`voice_for`); the acoustic model id names the file's
  hash and the overrides (Kokoro's key names the version's styles: `features_id`), so the mel
  cache key (and the noise seed drawn from it) differ whenever the features would: a version
  change never serves another version's features.
* The judging (tasks/quality.py): the segment workers count each version's segments and
  failures and keep its recent run times; the quality pool scores a sample of finished
  segments of both versions (word error rate against the segment's text, clipping, silence,
  loudness: models/audio/quality.py). `decide` is the rule, a pure function of the two versions'
  figures and the settings; `Canary.judge` reads the figures, decides, and applies a promote
  or a rollback in one Lua script that also appends it to the decision log (a Redis stream),
  so two judges racing apply it once. Each decision is also a log line and a metric.

Who runs what: the web calls `version_for` (on the gevent hub, one HMGET per job and voice);
the segment and quality workers call the rest from their forked processes. They share
nothing but Redis; the per-process version cache holds immutable records only."""

from __future__ import annotations

import json
import logging
import math
import time
from typing import cast

import redis

from app.broker.stages import Stage
from app.canary.rule import (
    CANDIDATE,
    LIVE,
    PROMOTE,
    ROLLBACK,
    STAGES,
    START,
    CanaryError,
    CanaryRunning,
    Decision,
    Figures,
    Rule,
    Version,
    decide,
    p99,
    share_error,
    share_point,
    voice_key,
)
from app.settings import Settings
from app.stores.keys import Keys
from models.neural.voice_file import Inference

log = logging.getLogger("voxfarm.canary")
# Run times kept per version and stage: enough for a p99 that is not just the maximum.
LATENCY_SAMPLES = 1000
# The decision log keeps this many entries per voice.
DECISIONS_KEPT = 1000
# A scored segment is remembered this long (a redelivered score counts once meanwhile).
SCORED_TTL_S = 7 * 24 * 3600


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
        from app.obs import metrics

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
        from app.obs import metrics

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
            elif stage == Stage.VOCODER:
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
        from app.obs import metrics

        for figure, value in figures.summary().items():
            if isinstance(value, int | float) and figure not in ("words", "segments",
                                                                 "failed"):
                metrics.CANARY_SCORE.labels(voice, version, figure).set(value)

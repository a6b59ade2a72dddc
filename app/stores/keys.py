"""Every Redis key the farm writes, in one place.

Layout (prefix `vf` by default):

    {p}:job:{id}          hash   the job record (state, progress, timestamps, error)
    {p}:job:{id}:chunks   hash   "segment:window" -> 16-bit PCM of that window of audio
    {p}:job:{id}:done     set    "segment:window" of every stored window (each counted once)
    {p}:job:{id}:events   stream wake-ups for long-polls and streams (chunk, state)
    {p}:job:{id}:windows  hash   segment -> its window count (set once, by its first writer)
    {p}:job:{id}:wdone    hash   segment -> windows stored so far
    {p}:job:{id}:words    hash   "segment:window" -> JSON {"start": sample in its segment,
                                 "words": [{"word", "start", "end", ...}]}, segment seconds
    {p}:job:{id}:specs    hash   segment -> JSON of its published spec (what a resume
                                 publishes again when a broker restart lost its message)
    {p}:job:{id}:queued   hash   the job's share of the admission ledger: "STAGE:segment" ->
                                 "p" (a message of it waits on STAGE's queues) or "t" (taken
                                 by a worker), and "n:STAGE" -> how many wait (app/stores/ledger.py)
    {p}:mel:{hash}        string a cached mel spectrogram (TTL)
    {p}:mel:{hash}:refs   string segments between their two stages that need that mel
    {p}:mel:{hash}:durations string what word times come from (uint16s): a neural voice's
                                 frames per phoneme id; eSpeak's (phoneme index, ms) per word
    {p}:stats             hash   farm-wide counters (mel cache hits and misses, ...)
    {p}:stats:owner:{key} hash   cache_hits, cache_misses of one API key's jobs (/v1/stats)
    {p}:workers:{queue}   zset   worker name -> last heartbeat (live workers per pool)
    {p}:jobs:unpublished  zset   job id -> creation time, until all its segments are queued
    {p}:jobs:progress     zset   job id -> its last progress (created, a window stored),
                                 until the stall sweeper finds it finished or stuck
    {p}:jobs:resuming     string an acoustic pool's claim on the lost-segment sweep (TTL)
    {p}:jobs:admitting    zset   admission ticket ("id:segments") -> when it stops counting:
                                 jobs admitted whose segments are not all on the queue yet
    {p}:jobs:admitted     zset   admission ticket -> when its job's last segment was published
                                 (counted by admissions that read the queues before that)
    {p}:admission         hash   dead:acoustic, dead:vocoder (messages waiting on a stage's
                                 queues whose job was canceled or failed: they neither render
                                 nor count)
    {p}:jobs:listened     zset   stream job id -> when its listener lease lapses (renewed by
                                 the web process that streams it; app/stores/listeners.py)
    {p}:waits:{holder}    zset   place token -> when it lapses: the long-polls and streams an
                                 API key ("key:ID") or, with keys off, a client address
                                 ("addr:IP") has open (app/stores/waits.py)
    {p}:broker            hash   run (the broker server's run id when last seen), restarted_at
                                 (when that run began; 0 for the first run the farm saw)
    {p}:book:{id}         hash   the book record (state, per-chapter progress, feed cursor)
    {p}:book:{id}:done    bitmap bit n set once segment n (book-wide ordinal) is stored
    {p}:book:{id}:sweep   string a book worker's claim on resuming the stalled book (TTL)
    {p}:books:progress    zset   book id -> its last progress (created, planned, a segment
                                 stored), until the stall sweeper finds it finished or stuck
    {p}:idem:{digest}     string an Idempotency-Key's record: JSON, pending while its first
                                 request submits, then the job or book it made (TTL;
                                 app/stores/idempotency.py)
    {p}:voices            set    voices that have versions (app/canary/)
    {p}:voice:{name}      hash   live, candidate (version ids), share, seq
    {p}:voice:{name}:versions  hash  version id -> JSON record (file, inference, state)
    {p}:voice:{name}:decisions stream the canary's decision log (figures and reasons)
    {p}:voice:{name}:{v}:stats   hash  a version's segments, failures and score sums
    {p}:voice:{name}:{v}:scored  set   "job:segment" scored (a redelivered score counts once)
    {p}:voice:{name}:{v}:latency:{stage} list  recent run seconds of the stage, newest first
    {p}:cvoices:{scope}   hash   custom voice name -> JSON record (its versions' specs) of one
                                 namespace: "key:ID" (an API key's own), "public" (an admin
                                 key's for all), "open" (with keys off: everyone's)
    {p}:cvoices:{scope}:gen string a token changed by every write of the namespace (what
                                 the per-process caches compare: app/stores/voice_records.py)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "vf"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def chunks(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:chunks"

    def done(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:done"

    def events(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:events"

    def windows(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:windows"

    def windows_done(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:wdone"

    def words(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:words"

    def specs(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:specs"

    def queued(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}:queued"

    def job_keys(self, job_id: str) -> list[str]:
        """The keys of a job, in the order the Lua scripts take them."""
        return [self.job(job_id), self.chunks(job_id), self.done(job_id), self.events(job_id),
                self.windows(job_id), self.windows_done(job_id), self.words(job_id),
                self.specs(job_id)]

    def book(self, book_id: str) -> str:
        return f"{self.prefix}:book:{book_id}"

    def book_done(self, book_id: str) -> str:
        return f"{self.prefix}:book:{book_id}:done"

    def book_sweep(self, book_id: str) -> str:
        return f"{self.prefix}:book:{book_id}:sweep"

    def idempotency(self, digest: str) -> str:
        """One Idempotency-Key's record (`digest`: of its scope and the client's key)."""
        return f"{self.prefix}:idem:{digest}"

    def mel(self, digest: str) -> str:
        return f"{self.prefix}:mel:{digest}"

    @property
    def unpublished(self) -> str:
        return f"{self.prefix}:jobs:unpublished"

    @property
    def progress(self) -> str:
        return f"{self.prefix}:jobs:progress"

    @property
    def admitting(self) -> str:
        return f"{self.prefix}:jobs:admitting"

    @property
    def admitted(self) -> str:
        return f"{self.prefix}:jobs:admitted"

    @property
    def admission(self) -> str:
        return f"{self.prefix}:admission"

    @property
    def listened(self) -> str:
        return f"{self.prefix}:jobs:listened"

    def waits(self, holder: str) -> str:
        return f"{self.prefix}:waits:{holder}"

    @property
    def resuming(self) -> str:
        return f"{self.prefix}:jobs:resuming"

    @property
    def broker(self) -> str:
        return f"{self.prefix}:broker"

    @property
    def books_progress(self) -> str:
        return f"{self.prefix}:books:progress"

    def mel_refs(self, digest: str) -> str:
        return f"{self.prefix}:mel:{digest}:refs"

    def mel_durations(self, digest: str) -> str:
        return f"{self.prefix}:mel:{digest}:durations"

    def workers(self, queue: str) -> str:
        return f"{self.prefix}:workers:{queue}"

    def worker_slots(self, queue: str) -> str:
        """worker -> how many segments it runs at once (its pool's processes)."""
        return f"{self.prefix}:workers:{queue}:slots"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

    def owner_stats(self, key_id: str) -> str:
        """One API key's own figures (its jobs' feature-cache hits and misses)."""
        return f"{self.prefix}:stats:owner:{key_id}"

    @property
    def versioned_voices(self) -> str:
        return f"{self.prefix}:voices"

    def custom_voices(self, scope: str) -> str:
        return f"{self.prefix}:cvoices:{scope}"

    def custom_voices_gen(self, scope: str) -> str:
        return f"{self.prefix}:cvoices:{scope}:gen"

    def voice(self, name: str) -> str:
        return f"{self.prefix}:voice:{name}"

    def voice_versions(self, name: str) -> str:
        return f"{self.prefix}:voice:{name}:versions"

    def voice_decisions(self, name: str) -> str:
        return f"{self.prefix}:voice:{name}:decisions"

    def version_stats(self, name: str, version: str) -> str:
        return f"{self.prefix}:voice:{name}:{version}:stats"

    def version_scored(self, name: str, version: str) -> str:
        return f"{self.prefix}:voice:{name}:{version}:scored"

    def version_latency(self, name: str, version: str, stage: str) -> str:
        return f"{self.prefix}:voice:{name}:{version}:latency:{stage}"

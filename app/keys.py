"""Every Redis key the farm writes, in one place.

Layout (prefix `vf` by default):

    {p}:job:{id}          hash   the job record (state, progress, timestamps, error)
    {p}:job:{id}:chunks   hash   segment index -> 16-bit PCM of that segment
    {p}:job:{id}:done     set    indices whose chunk is stored (counts each segment once)
    {p}:job:{id}:events   stream wake-ups for long-polls and streams (chunk, state)
    {p}:mel:{hash}        string a cached mel spectrogram (TTL)
    {p}:mel:{hash}:refs   string segments between their two stages that need that mel
    {p}:stats             hash   farm-wide counters (mel cache hits and misses, ...)
    {p}:workers:{queue}   zset   worker name -> last heartbeat (live workers per pool)
    {p}:jobs:unpublished  zset   job id -> creation time, until all its segments are queued
    {p}:book:{id}         hash   the book record (state, per-chapter progress, feed cursor)
    {p}:book:{id}:done    bitmap bit n set once segment n (book-wide ordinal) is stored
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

    def job_keys(self, job_id: str) -> list[str]:
        """The four keys of a job, in the order the Lua scripts take them."""
        return [self.job(job_id), self.chunks(job_id), self.done(job_id), self.events(job_id)]

    def book(self, book_id: str) -> str:
        return f"{self.prefix}:book:{book_id}"

    def book_done(self, book_id: str) -> str:
        return f"{self.prefix}:book:{book_id}:done"

    def mel(self, digest: str) -> str:
        return f"{self.prefix}:mel:{digest}"

    @property
    def unpublished(self) -> str:
        return f"{self.prefix}:jobs:unpublished"

    def mel_refs(self, digest: str) -> str:
        return f"{self.prefix}:mel:{digest}:refs"

    def workers(self, queue: str) -> str:
        return f"{self.prefix}:workers:{queue}"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

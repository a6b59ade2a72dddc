"""Listener leases: how the farm knows that a stream's job still has someone to hear it.

A job made for a stream (the OpenAI speech API, captioned speech, the WebSocket) exists for
that stream alone. While the stream runs, the web process that serves it holds the job here,
and one renewer per process extends the leases of everything it holds every third of
`stream_lease_s` (`JobStore.renew_leases`: one ZADD for all of them). The lease's life says
nothing about the client's pace: a listener that reads slowly, or waits long for its first
audio behind a busy queue, keeps its lease as long as its web process lives. A stream that
ends hands its job back (`release`); the web cancels it if the client left, and a job that
is over lets go of its lease.

When the web process dies (killed, or stopped with its streams open), nobody renews its
leases: they lapse, and the sweep (`Sweeps.sweep_unlistened`: the acoustic pool's heartbeat,
and admission whenever a lease has lapsed) cancels those jobs, so their queued segments
neither render nor count against new work. A REST job (`POST /v1/jobs`) is polled, not
listened to: it has no lease, and nobody polling it is no reason to cancel it.

A lease also lapses while the store is away (restarted, or out of reach), though the web
that holds it is alive: it cannot renew what it cannot reach. So a lapsed lease proves a
dead listener only once the store has been up, and the sweeper in touch with it, for a whole
lease period (`Sweeps.leases_tell`): by then every live web process has renewed its leases at
least twice. `StoreContact` is a process's own record of that touch. A farm that `voxfarm up`
starts on its own embedded Redis has no live web yet, so it cancels every stream job at
start (`Sweeps.cancel_every_stream`) and takes new work at once.

Concurrency: one `ListenerLeases` per Farm per process. Under gunicorn's gevent workers the
stream handlers are greenlets and the renewer a greenlet too (threading is monkey-patched
there); under the Flask development server or a test client they are native threads. Both
share `_held` under one `threading.Lock`, the primitive made for either, held only to copy
or change the dict. The renewer starts with the first stream a process holds; a worker
process never holds one, so it never starts. Every Redis call has the client's timeout.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import redis

from app.stores.jobs import JobStore

log = logging.getLogger("voxfarm.listeners")


class StoreContact:
    """How long this process has been in touch with the store without a break: forever for
    one that never failed to reach it (it knows of no outage), else since its first success
    after its last failure. The renewer and admission report what they see; plain
    assignments, so greenlets and native threads may report at once."""

    def __init__(self) -> None:
        self._since: float | None = -math.inf  # monotonic; None while out of touch

    def lost(self) -> None:
        self._since = None

    def reached(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def in_touch_s(self) -> float:
        since = self._since
        return 0.0 if since is None else time.monotonic() - since


class ListenerLeases:
    """The stream jobs this process listens for, and the renewer of their leases."""

    def __init__(self, jobs: JobStore, lease_s: float,
                 contact: StoreContact | None = None) -> None:
        self.jobs = jobs
        self.lease_s = lease_s
        self.contact = contact or StoreContact()
        self._held: dict[str, int] = {}  # job id -> streams of this process holding it
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None

    @property
    def renew_every_s(self) -> float:
        # A third: two renewals may go missing (a Redis blip, a busy hub) before it lapses.
        return self.lease_s / 3

    def hold(self, job_id: str) -> None:
        """A stream of this process listens for the job's audio from now until `release`."""
        with self._lock:
            self._held[job_id] = self._held.get(job_id, 0) + 1
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew, daemon=True,
                                                 name="voxfarm-listener-leases")
                self._renewer.start()
        # Renewed at once too: the lease the job was created with may be old by now.
        self._renew_now([job_id])

    def release(self, job_id: str) -> None:
        """The stream ended (done, its job stopped, or its client left). The caller cancels
        the job if nobody will hear the rest; a job that is over loses its lease here."""
        with self._lock:
            count = self._held.get(job_id, 0) - 1
            if count > 0:
                self._held[job_id] = count
                return
            self._held.pop(job_id, None)
        try:
            self.jobs.end_lease(job_id)
        except redis.RedisError:  # it lapses; the sweep forgets it (or cancels a live job)
            self.contact.lost()
            log.warning("could not end the lease of job %s", job_id, exc_info=True)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def _renew_now(self, job_ids: list[str]) -> None:
        try:
            self.jobs.renew_leases(job_ids, self.lease_s)
        except redis.RedisError:  # the next round tries again, well inside the lease
            self.contact.lost()
            log.warning("could not renew %d listener lease(s)", len(job_ids), exc_info=True)
        else:
            self.contact.reached()

    def _renew(self) -> None:
        while True:
            time.sleep(self.renew_every_s)
            held = self.held()
            if held:
                self._renew_now(held)

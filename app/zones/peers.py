"""The peer farms of a set and their readiness: `PeerSet`, one per web process.

Each peer's `GET {url}/readyz` is probed every `peer_check_s` by one daemon thread per process
(`start()`). A peer is *ready* when it answers 200 and its body says it serves locally
(`local_ready`, or `ready` from a farm that does not report it): a peer that only serves
through another farm is no place to send work. It is *not_ready* on any other answer and
*unreachable* when no answer came within `peer_timeout_s`. The states are a circuit breaker:
work and reads go only to ready peers, a forward that fails (`note_failure`) opens the
breaker at once, and only a probe that finds the peer ready closes it again.

Concurrency: in gunicorn's gevent worker `threading` is patched, so the probing "thread" is a
greenlet on the worker's hub, like the requests that read the states; in a plain process
(tests, the development server) it is a native thread. Either way the states are shared
through one `threading.Lock` (a gevent lock once patched), held only to copy or replace a
state, never across I/O; every probe is bounded by `peer_timeout_s`. A forked child (a
gunicorn worker forked after the set was built) starts its own thread: `start()` notices the
new pid.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import requests

from app.zones.ids import PeerConfig

if TYPE_CHECKING:
    from app.settings import Settings

__all__ = ["HOP_HEADER", "IDEMPOTENCY_HEADER", "PEER_HEADER", "PEER_KEY_HEADER",
           "TENANT_HEADER", "PeerConfig", "PeerSet", "PeerState", "PeerStatus", "Serving",
           "zone_view"]

log = logging.getLogger("voxfarm.zones")

# Set on every forwarded request (the forwarding farm's name): a request that carries it is
# never forwarded again, so two farms that both cannot take a job do not bounce it between
# them.
HOP_HEADER = "X-Voxfarm-Hop"
# The calling farm's name, and the secret of the set that proves it is one.
PEER_HEADER = "X-Voxfarm-Peer"
PEER_KEY_HEADER = "X-Voxfarm-Peer-Key"
# The API key id the calling farm verified ("" when that farm is open): the peer owns what
# it makes for the request under it, and applies no key, rate or quota again.
TENANT_HEADER = "X-Voxfarm-Tenant"
IDEMPOTENCY_HEADER = "Idempotency-Key"

# After the local store failed, the web sends work to a peer at once for this long instead
# of paying the store's timeout again on each request.
LOCAL_DOWN_S = 1.0


class PeerStatus(StrEnum):
    """A peer's state as the last probe (or forward) found it."""

    UNKNOWN = "unknown"  # not probed yet: treated as not ready
    READY = "ready"
    NOT_READY = "not_ready"
    UNREACHABLE = "unreachable"


class Serving(StrEnum):
    """Who serves this farm's clients now: /readyz's `zone.serving`."""

    LOCAL = "local"  # this farm itself
    PEER = "peer"  # a ready peer, this farm's own store or pools being down
    NONE = "none"  # nobody: /readyz answers 503


@dataclass(frozen=True)
class PeerState:
    """One peer's state: since when it holds, when it was last checked, the failures in a
    row, whether its last /readyz said it has room for interactive work, and why."""

    name: str
    url: str
    state: PeerStatus = PeerStatus.UNKNOWN
    since: float = 0.0
    checked_at: float = 0.0
    failures: int = 0
    room: bool = False
    # Its last /readyz said its store answers ("redis": "ok"): it can serve reads of what it
    # owns (a job's chunks need its web and store, not its pools).
    store: bool = False
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = str(self.state)
        return out


# Connections to one peer a process keeps open for reuse. A web worker serves up to 1,000
# requests at once (gunicorn's worker_connections), and each relayed long-poll or stream holds
# its connection for its whole wait: requests' default of 10 would close and reopen the rest
# (one TCP handshake, and a warning, per relayed request past ten). It is a bound on idle
# connections kept, not a number opened ahead.
PEER_CONNECTIONS = 1000


def _session(settings: Settings) -> requests.Session:
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=PEER_CONNECTIONS)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    # verify: the set's own CA where it has one, else the system's.
    session.verify = settings.peer_ca or True
    if settings.peer_cert:
        session.cert = ((settings.peer_cert, settings.peer_cert_key) if settings.peer_cert_key
                        else settings.peer_cert)
    # The environment's proxies are for the internet, not for the farms of a set.
    session.trust_env = False
    return session


class PeerSet:
    """The peers of `settings.peers`, their states, and the HTTP session that reaches them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.farm_name = settings.farm_name
        self._peers = {p.name: p for p in settings.peer_list}
        # The peers' names, for the door's look at every request (no parse per request).
        self.names: frozenset[str] = frozenset(self._peers)
        now = time.time()
        self._states = {p.name: PeerState(p.name, p.url, since=now)
                        for p in self._peers.values()}
        self._lock = threading.Lock()
        self._local_failed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        # One session for forwards (its connection pool shared by the process's requests),
        # one for the probes, so a probe never waits for a forward's connection.
        self.session = _session(settings)
        self._probe_session = _session(settings)

    # -- the probing thread ---------------------------------------------------------------

    def start(self) -> PeerSet:
        """Start probing (idempotent; once per process, a forked child starting its own)."""
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return self
            self._pid = os.getpid()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="voxfarm-peers",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop probing (tests; the thread is a daemon and ends with the process anyway)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.settings.peer_timeout_s * len(self._peers) + 1.0)
        self._thread = None

    def _run(self) -> None:
        stop = self._stop
        while not stop.is_set():
            for name in list(self._peers):
                if stop.is_set():
                    return
                try:
                    self.probe(name)
                except Exception:  # never let one odd answer end the probing
                    log.exception("probing peer %s failed", name)
            stop.wait(self.settings.peer_check_s)

    def probe(self, name: str) -> PeerState:
        """Probe `name`'s /readyz once and record what it said."""
        peer = self._peers[name]
        timeout = self.settings.peer_timeout_s
        try:
            resp = self._probe_session.get(f"{peer.url}/readyz", timeout=(timeout, timeout),
                                           headers=self.headers(""))
        except requests.RequestException as exc:
            return self._record(name, PeerStatus.UNREACHABLE, False,
                                f"{exc.__class__.__name__}: {exc}"[:200])
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return self._record(name, PeerStatus.NOT_READY, False,
                                f"HTTP {resp.status_code}, no JSON body")
        serving = bool(body.get("local_ready", body.get("ready", False)))
        store = body.get("redis") == "ok"
        if resp.status_code == 200 and serving:
            return self._record(name, PeerStatus.READY, bool(body.get("room", False)), "",
                                store=True)
        missing = body.get("missing") or []
        detail = f"HTTP {resp.status_code}" + (f": {'; '.join(map(str, missing))}"
                                                if missing else "")
        return self._record(name, PeerStatus.NOT_READY, False, detail[:200], store=store)

    def _record(self, name: str, state: PeerStatus, room: bool, detail: str,
                store: bool = False) -> PeerState:
        now = time.time()
        with self._lock:
            old = self._states[name]
            changed = old.state != state
            new = replace(old, state=state, room=room, store=store, detail=detail,
                          checked_at=now,
                          since=now if changed else old.since,
                          failures=0 if state == PeerStatus.READY else old.failures + 1)
            self._states[name] = new
        if changed:
            log.log(logging.INFO if state == PeerStatus.READY else logging.WARNING,
                    "peer %s is %s%s", name, state, f" ({detail})" if detail else "")
        return new

    # -- what the web asks ----------------------------------------------------------------

    def states(self) -> list[PeerState]:
        with self._lock:
            return [self._states[name] for name in self._peers]

    def ready(self, need_room: bool = False) -> list[PeerConfig]:
        """The ready peers, those with room first (in the settings' order otherwise); with
        `need_room`, only those whose last /readyz said they have room."""
        states = [s for s in self.states() if s.state == PeerStatus.READY
                  and (s.room or not need_room)]
        states.sort(key=lambda s: not s.room)  # stable: the settings' order within each
        return [self._peers[s.name] for s in states]

    def get(self, name: str) -> PeerConfig | None:
        return self._peers.get(name)

    def is_ready(self, name: str) -> bool:
        with self._lock:
            state = self._states.get(name)
        return state is not None and state.state == PeerStatus.READY

    def answers(self, name: str) -> bool:
        """Whether `name` answered its last probe with its store reachable, ready or not:
        enough to read what it owns (its web and store serve a job's chunks while its pools
        are down), where new work needs `is_ready`. A forward that got no answer makes it
        false at once."""
        with self._lock:
            state = self._states.get(name)
        return state is not None and state.store and state.state in (PeerStatus.READY,
                                                                      PeerStatus.NOT_READY)

    def note_failure(self, name: str, detail: str) -> None:
        """A forward to `name` got no answer: open its breaker now, not at the next probe."""
        if name in self._peers:
            self._record(name, PeerStatus.UNREACHABLE, False, detail[:200])

    def note_local_failure(self) -> None:
        """The local store just failed a request: for LOCAL_DOWN_S, `local_down()` says so."""
        self._local_failed_at = time.monotonic()

    def local_down(self) -> bool:
        return time.monotonic() - self._local_failed_at < LOCAL_DOWN_S

    def headers(self, tenant_id: str) -> dict[str, str]:
        """The headers a request to a peer carries: who calls, the set's secret, the hop
        mark, and the tenant this farm verified."""
        out = {PEER_HEADER: self.farm_name, HOP_HEADER: self.farm_name,
               TENANT_HEADER: tenant_id}
        key = self.settings.peer_key.get_secret_value()
        if key:
            out[PEER_KEY_HEADER] = key
        return out

    def key_matches(self, presented: str) -> bool:
        """Whether `presented` is the set's secret (compared in constant time); False when
        the set has no key (mutual TLS alone)."""
        key = self.settings.peer_key.get_secret_value()
        return bool(key) and hmac.compare_digest(presented.encode(), key.encode())


def zone_view(farm_name: str, peers: PeerSet | None, local_ready: bool) -> dict[str, Any]:
    """/readyz's `zone`: this farm's name, who serves its clients now (itself while it is
    ready, else the first ready peer, the one with room first), and every peer's state."""
    through = None
    if not local_ready and peers is not None:
        ready = peers.ready()
        through = ready[0].name if ready else None
    serving = (Serving.LOCAL if local_ready else Serving.PEER if through else Serving.NONE)
    return {"farm": farm_name, "serving": str(serving), "through": through,
            "peers": [s.as_dict() for s in peers.states()] if peers is not None else []}

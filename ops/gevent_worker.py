"""The web's gunicorn worker: gunicorn's gevent worker with a bound on each client's places.

`worker_class = "ops.gevent_worker.GuardedGeventWorker"` (ops/gunicorn.conf.py). A gevent
worker holds `worker_connections` connections at once (a pool of greenlets, one each); once
they are all taken it stops accepting, and every new client waits in the kernel's backlog
behind them, the load balancer's health check included. One client that opens that many
(idle keep-alives, idle WebSockets, request heads that never end) locked everyone out.

So each worker counts the connections it holds per client address, and one over the
address's share is refused at accept time, before a greenlet is spent on it: a tiny
`429 too_many_connections` with `Retry-After` (plain HTTP; on a TLS listener it is only
closed, as an answer would need a handshake first), then closed, and counted in
`voxfarm_connections_refused_total`. An IPv6 client counts as its /64. The count is each worker's
own, not shared: the kernel hands a new connection to whichever worker accepts first, and a
worker allows one address at most its share of the cap (`web_max_conns_per_address` over
the number of workers, rounded up), so the farm as a whole holds at most about the cap per
address, with no shared memory or lock between processes. The default cap leaves the share
well above a benchmark's 128 clients from one address while one address fills at most a
quarter of a worker's places.

Behind a reverse proxy every client arrives from the proxy's address. A peer listed in
`web_trusted_proxies` is not counted at accept time; instead its requests are counted per
the client address its `X-Forwarded-For` names (the last entry that is not itself a trusted
proxy), while each is served (a WebSocket for its whole life), against the same share, and
that address becomes the request's `REMOTE_ADDR`. Anyone else's `X-Forwarded-For` is
ignored: a client cannot pick its own address.

Idle keep-alive connections are reaped by gunicorn's own `keepalive` (`web_keepalive_s`):
the gevent worker bounds each wait for a request's head by it, the first request's
included, so a slowloris socket that has not finished its head in that time is dropped too.

`/healthz` and `/readyz` may have a listener of their own (`web_health_port`): it has its
own pool of places, which no connection to the main port takes, and it serves the probes
alone (404 for anything else).

Concurrency: everything here runs on one worker process's gevent hub: the accept callback
(`do_handle`), each connection's greenlet and its close. The counts are plain dicts touched
only from the hub, between switches, so they need no lock. Nothing is shared between workers.
"""

from __future__ import annotations

import ipaddress
import json
import math
import resource
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gevent.server import StreamServer
from gunicorn.workers import ggevent

from app.security.addresses import counted_as

# The paths a probe listener serves (web/auth.py leaves them open too).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
TOO_MANY = "too_many_connections"

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(spec: str) -> tuple[IpNetwork, ...]:
    """`10.0.0.0/8, 192.168.1.7` -> networks; ValueError names the entry that is not one."""
    networks = []
    for part in (p.strip() for p in spec.split(",")):
        if part:
            try:
                networks.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise ValueError(f"{part!r} is not an IP address or network") from None
    return tuple(networks)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one worker allows (module docstring). `per_address`: this worker's share."""

    per_address: int = 0  # 0: no bound
    retry_after_s: int = 1
    trusted_proxies: tuple[IpNetwork, ...] = ()
    health_port: int = 0

    @classmethod
    def share(cls, cap: int, workers: int, **kwargs: Any) -> ConnectionLimits:
        """One worker's limits for a cap across `workers` workers."""
        return cls(per_address=math.ceil(cap / max(workers, 1)) if cap > 0 else 0, **kwargs)

    def trusted(self, address: str) -> bool:
        if not self.trusted_proxies or not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted_proxies)

    def forwarded_client(self, peer: str, forwarded_for: str) -> str:
        """The client behind `peer`: the last X-Forwarded-For entry that is not a trusted
        proxy (each proxy appends the address it saw), or `peer` when it is not trusted."""
        if not self.trusted(peer):
            return peer
        for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
            if not self.trusted(hop):
                return hop
        return peer


@dataclass
class PeerCounts:
    """Connections held per address in one worker, up to `limit` each (0: no bound)."""

    limit: int
    held: dict[str, int] = field(default_factory=dict)

    def take(self, address: str) -> bool:
        held = self.held.get(address, 0)
        if self.limit and held >= self.limit:
            return False
        self.held[address] = held + 1
        return True

    def give(self, address: str) -> None:
        held = self.held.get(address, 0) - 1
        if held > 0:
            self.held[address] = held
        else:
            self.held.pop(address, None)


def refusal(limits: ConnectionLimits) -> bytes:
    """The whole 429 answer: the API's one error shape, and the connection closed."""
    body = json.dumps({"error": {
        "code": TOO_MANY,
        "message": f"this address holds the most connections one address may "
                   f"({limits.per_address} per web worker); close some, or try again in "
                   f"{limits.retry_after_s} s"}}).encode()
    head = (f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            f"Retry-After: {limits.retry_after_s}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin1") + body


def _peer(address: Any) -> str:
    return address[0] if isinstance(address, tuple) and address else ""


def _peer_port(address: Any) -> int:
    return address[1] if isinstance(address, tuple) and len(address) > 1 else 0


class GuardedStreamServer(StreamServer):
    """gevent's server, counting each peer's connections at accept time."""

    def __init__(self, *args: Any, limits: ConnectionLimits, counts: PeerCounts,
                 on_refused: Callable[[], Any] = lambda: None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits, self.counts, self.on_refused = limits, counts, on_refused
        self.counted: dict[int, str] = {}  # id of an open socket -> the address it counts for
        self.answer = b"" if getattr(self, "ssl_args", None) else refusal(limits)

    def do_handle(self, *args: Any) -> None:
        # On the hub, in the accept callback: refusing here spends no greenlet.
        client, address = args
        peer = _peer(address)
        if not self.limits.trusted(peer):  # a trusted proxy's requests count one by one
            counted = counted_as(peer)
            if not self.counts.take(counted):
                self._refuse(client)
                self.on_refused()
                return
            self.counted[id(client)] = counted
        super().do_handle(*args)

    def do_close(self, sock: Any, *args: Any) -> None:
        # Called once per handed-on connection when its greenlet ends (or failed to start).
        try:
            super().do_close(sock, *args)
        finally:
            peer = self.counted.pop(id(sock), None)
            if peer is not None:
                self.counts.give(peer)

    def _refuse(self, client: Any) -> None:
        try:
            if self.answer:
                # A fresh socket's send buffer is empty: this never blocks.
                client.send(self.answer)
                client.shutdown(socket.SHUT_WR)
                # Take the request already sent, so closing sends FIN, not a reset that
                # could beat the answer to the client.
                client.setblocking(False)
                client.recv(65536)
        except OSError:
            pass
        finally:
            client.close()


class ForwardedCap:
    """WSGI middleware for trusted proxies' requests: count them per forwarded client (the
    same share as direct connections), refuse past it, and set REMOTE_ADDR to the client."""

    def __init__(self, app: Callable, limits: ConnectionLimits, counts: PeerCounts,
                 on_refused: Callable[[], Any]) -> None:
        self.app, self.limits, self.counts, self.on_refused = app, limits, counts, on_refused
        self.answer = refusal(limits)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        peer = environ.get("REMOTE_ADDR", "")
        if not self.limits.trusted(peer):
            return self.app(environ, start_response)
        client = self.limits.forwarded_client(peer, environ.get("HTTP_X_FORWARDED_FOR", ""))
        counted = counted_as(client)
        if not self.counts.take(counted):
            self.on_refused()
            head, _, body = self.answer.partition(b"\r\n\r\n")
            start_response("429 Too Many Requests", [
                ("Content-Type", "application/json"),
                ("Retry-After", str(self.limits.retry_after_s)),
                ("Content-Length", str(len(body)))])
            return [body]
        environ["REMOTE_ADDR"] = client
        try:
            result = self.app(environ, start_response)
        except BaseException:
            self.counts.give(counted)
            raise
        return _GiveBackWhenClosed(result, lambda: self.counts.give(counted))


class _GiveBackWhenClosed:
    """A response iterable that gives its place back once the server closes it."""

    def __init__(self, result: Iterable[bytes], give: Callable[[], None]) -> None:
        # A file response is then iterated, not sent by sendfile: only a trusted proxy's
        # requests are wrapped, and the API's files are small beside the audio it streams.
        self.result, self.give = result, give

    def __iter__(self):
        return iter(self.result)

    def close(self) -> None:
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        finally:
            give, self.give = self.give, lambda: None
            give()


class ProbesOnly:
    """WSGI middleware: on the probe listener's port, the probes alone."""

    def __init__(self, app: Callable, health_port: int) -> None:
        self.app, self.port = app, str(health_port)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("SERVER_PORT") == self.port and environ.get("PATH_INFO") not in \
                PROBE_PATHS:
            body = json.dumps({"error": {"code": "not_found", "message": "this port serves "
                                         "/healthz and /readyz only"}}).encode()
            start_response("404 Not Found", [("Content-Type", "application/json"),
                                              ("Content-Length", str(len(body)))])
            return [body]
        return self.app(environ, start_response)


def raise_fd_limit() -> int:
    """Let this process hold as many sockets as the hard limit allows; the new soft limit.
    Two workers of 1,000 places each, plus the refused connections in flight, need more than
    the common 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


class GuardedGeventWorker(ggevent.GeventWorker):
    """gunicorn's gevent worker, each listener served by a `GuardedStreamServer`.
    `limits` is set by the config's `post_fork` hook (ops/gunicorn.conf.py), from the
    settings; without it nothing is bounded beyond gunicorn's own."""

    limits = ConnectionLimits()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # After the app: it set up prometheus_client's multiprocess mode (app/obs/multiproc.py).
        from app.obs.metrics import CONNECTIONS_REFUSED

        self.refused = CONNECTIONS_REFUSED
        self.counts = PeerCounts(self.limits.per_address)
        app: Callable = self.wsgi  # type: ignore[has-type]  # set by gunicorn's load_wsgi
        if self.limits.trusted_proxies:
            app = ForwardedCap(app, self.limits, self.counts, self.refused.inc)
        if self.limits.health_port:
            app = ProbesOnly(app, self.limits.health_port)
        self.wsgi = app

    def run(self) -> None:
        limits, counts, refused = self.limits, self.counts, self.refused

        def server(listener: Any, *args: Any, **kwargs: Any) -> GuardedStreamServer:
            # The probe listener counts apart: a client that used up its share on the main
            # port still reaches the probes.
            port = _peer_port(listener.getsockname())
            own = counts if port != limits.health_port else PeerCounts(limits.per_address)
            return GuardedStreamServer(listener, *args, limits=limits, counts=own,
                                       on_refused=refused.inc, **kwargs)

        # gunicorn's run() builds each listener's server by this module name; this process
        # is the worker alone (forked), so the name is changed for it and nobody else.
        ggevent.StreamServer = server
        super().run()

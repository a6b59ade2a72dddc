"""A hostile client for the connection-flood tests and bench: one process that holds COUNT
sockets from one loopback address against the web, bounded in time.

    python -m tests.floods KIND HOST:PORT COUNT SECONDS [--source 127.0.0.1] [--key KEY]

KIND is what each socket does:
- `keepalive`: `GET /healthz` on a keep-alive connection, again every REFRESH_S (so the
  server's idle reaping alone never frees its place);
- `websocket`: a WebSocket handshake on `/v1/ws`, then nothing (an idle socket);
- `slowloris`: a request head that never ends, one more header line every REFRESH_S.

A socket the server closes (or refuses) is opened again after RECONNECT_S, as a client that
wants its places back would. Once a second it prints one JSON line: `open` (connected and not
closed by the server), `attempts` (connects started), `refused` (answers that began with a
429) and `closed` (sockets the server closed). It stops by itself after SECONDS, or on SIGTERM.

One thread, one epoll loop, non-blocking sockets: it runs in a process of its own so the
probe it is set against (the test's) never waits on its interpreter.
"""

from __future__ import annotations

import argparse
import base64
import errno
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time

REFRESH_S = 2.0
RECONNECT_S = 2.0
KINDS = ("keepalive", "websocket", "slowloris")


def raise_fd_limit(needed: int) -> None:
    """Let this process hold `needed` descriptors (the soft limit up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Flood:
    def __init__(self, kind: str, host: str, port: int, count: int, source: str,
                 key: str = "") -> None:
        self.kind, self.addr, self.count, self.source = kind, (host, port), count, source
        self.auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self.sel = selectors.DefaultSelector()
        self.socks: dict[int, dict] = {}  # fd -> {"sock", "connected", "due", "got"}
        self.waiting: list[float] = [0.0] * count  # reconnect times of the sockets not open
        self.attempts = self.refused = self.closed = 0

    def request_head(self) -> bytes:
        host = f"{self.addr[0]}:{self.addr[1]}"
        if self.kind == "websocket":
            nonce = base64.b64encode(os.urandom(16)).decode()
            return (f"GET /v1/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                    f"Connection: Upgrade\r\nSec-WebSocket-Key: {nonce}\r\n"
                    f"Sec-WebSocket-Version: 13\r\n{self.auth}\r\n").encode()
        if self.kind == "slowloris":
            return f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n".encode()
        return f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n{self.auth}\r\n".encode()

    def open_one(self, now: float) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind((self.source, 0))
            err = sock.connect_ex(self.addr)
        except OSError as exc:
            sock.close()
            self.waiting.append(now + RECONNECT_S)
            print(json.dumps({"error": str(exc)}), flush=True)
            return
        self.attempts += 1
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            self.waiting.append(now + RECONNECT_S)
            return
        self.socks[sock.fileno()] = {"sock": sock, "connected": False, "due": now, "got": b""}
        self.sel.register(sock, selectors.EVENT_WRITE)

    def drop(self, state: dict, now: float) -> None:
        sock = state["sock"]
        self.sel.unregister(sock)
        del self.socks[sock.fileno()]
        sock.close()
        self.closed += 1
        self.waiting.append(now + RECONNECT_S)

    def send(self, state: dict, data: bytes, now: float) -> None:
        try:
            state["sock"].send(data)
        except BlockingIOError:
            pass  # the server does not read: that is the point
        except OSError:
            self.drop(state, now)

    def on_event(self, state: dict, mask: int, now: float) -> None:
        sock = state["sock"]
        if not state["connected"]:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.drop(state, now)
                return
            state["connected"] = True
            self.sel.modify(sock, selectors.EVENT_READ)
            state["due"] = now + REFRESH_S
            self.send(state, self.request_head(), now)
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self.drop(state, now)
            return
        if not data:
            self.drop(state, now)
            return
        if len(state["got"]) < 12:
            state["got"] += data[:12]
            if state["got"].startswith(b"HTTP/1.1 429") or state["got"].startswith(
                    b"HTTP/1.0 429"):
                self.refused += 1

    def refresh(self, now: float) -> None:
        for state in list(self.socks.values()):
            if state["connected"] and now >= state["due"]:
                state["due"] = now + REFRESH_S
                if self.kind == "keepalive":
                    state["got"] = b""
                    self.send(state, self.request_head(), now)
                elif self.kind == "slowloris":
                    self.send(state, b"X-Slow: 1\r\n", now)

    def status(self) -> dict:
        return {"open": sum(s["connected"] for s in self.socks.values()),
                "attempts": self.attempts, "refused": self.refused, "closed": self.closed}

    def run(self, seconds: float) -> None:
        stop = time.monotonic() + seconds
        said = 0.0
        while (now := time.monotonic()) < stop:
            due = [t for t in self.waiting if t <= now]
            if due:
                self.waiting = [t for t in self.waiting if t > now]
                for _ in due:
                    self.open_one(now)
            for key, mask in self.sel.select(timeout=0.05):
                state = self.socks.get(key.fd)
                if state is not None:
                    self.on_event(state, mask, now)
            self.refresh(now)
            if now - said >= 1.0:
                said = now
                print(json.dumps(self.status()), flush=True)
        for state in list(self.socks.values()):
            state["sock"].close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("target", help="HOST:PORT of the web")
    parser.add_argument("count", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--source", default="127.0.0.1")
    parser.add_argument("--key", default="")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    for ip in (host, args.source):
        if not ip.startswith("127."):
            sys.exit("floods go to loopback addresses only")
    raise_fd_limit(args.count + 64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Flood(args.kind, host, int(port), args.count, args.source, args.key).run(args.seconds)


if __name__ == "__main__":
    main()

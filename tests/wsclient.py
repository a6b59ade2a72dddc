"""The WebSocket client the tests and benches use: simple-websocket's, handshake read fixed.

simple-websocket 1.1's client reads the server's `101 Switching Protocols` with one recv()
and takes only the first protocol event from it. Frames that came in the same read (the
farm sends its `ready` event right after the handshake) then sit in the protocol buffer
until more bytes arrive, so a client that waits for `ready` before sending can wait forever.
Browsers and other clients read them at once; this one now does too.
"""

from __future__ import annotations

import simple_websocket

ConnectionClosed = simple_websocket.ConnectionClosed


class Client(simple_websocket.Client):
    def handshake(self) -> None:
        super().handshake()
        self._handle_events()  # frames that arrived with the handshake answer


def connect(url: str) -> Client:
    return Client.connect(url)

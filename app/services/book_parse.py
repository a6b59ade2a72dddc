"""Book uploads parsed in a child process of their own, never in the web's.

Why a process, not a thread of the web: a book is seconds of pure-Python CPU (html.parser
over every chapter). On the web's "encode" threads it held them while a listener's MP3 waited
35 s for its first byte; on a thread of its own it still holds the GIL against the gevent hub
and the encode threads (a listener's first byte went from 0.22 s to 0.41 s, 2.1 s at worst,
while four uploads parsed), and what it allocated stayed in the web's malloc arenas after
(the web kept 811-1,488 MB). A child runs at a lower CPU priority (`CHILD_NICE`) beside the
web, gives all its memory back when it exits, and is killed at its time bound (a thread
cannot be stopped: it would run on after its caller gave up).

Concurrency (STYLE.md 18): the parent is a request greenlet; `subprocess` is gevent's under
the gevent workers, so the greenlet parks while the child runs and the hub serves the rest.
Without gevent (tests, the dev server) the call simply blocks its thread.

It lives in app/, not web/, so the child starts without Flask: `python -m` of this module
imports the book parser and little else (the child starts in about 0.1 s).

The protocol: the upload's bytes on the child's stdin, the file name and the caps as
arguments; one pickle back on stdout, ("book", Book) or ("error", BookError). Pickle crosses
only between this process and the child it started from the same code.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import asdict

from app.errors import FarmError
from models.books.parse import Book, BookError, BookLimits, parse_book

# Below the web and the voice pools: an upload's parse takes the CPU they leave, as the
# book pools' workers do (`voxfarm worker ... --nice 10`).
CHILD_NICE = 10


class ParseTimeout(FarmError):
    """The book's parse outlasted its bound (the child was stopped): busy, try later."""

    code, retry_in_body = "busy", False
    public = "the server is busy reading other books; try again shortly"


def parse_upload(data: bytes, filename: str, limits: BookLimits, timeout_s: float) -> Book:
    """`parse_book(data, filename, limits)` run in a child process, stopped after
    `timeout_s` (ParseTimeout). Raises what parse_book raises."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app.services.book_parse", filename,
             json.dumps(asdict(limits))],
            input=data, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ParseTimeout(f"parsing '{filename}' took over {timeout_s} s") from None
    if done.returncode != 0 or not done.stdout:
        # The child died (out of memory, a crash in a C parser): the book cannot be read
        # here, whatever it is.
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise BookError("unreadable_book",
                        f"the book could not be read (its reader stopped: {tail[0]})")
    kind, value = pickle.loads(done.stdout)
    if kind == "error":
        raise value
    return value


def main() -> None:
    """The child: the bytes on stdin, one pickle on stdout."""
    os.nice(CHILD_NICE)
    filename, limits = sys.argv[1], BookLimits(**json.loads(sys.argv[2]))
    data = sys.stdin.buffer.read()
    try:
        result: tuple[str, object] = ("book", parse_book(data, filename, limits))
    except BookError as exc:
        result = ("error", exc)
    sys.stdout.buffer.write(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    main()

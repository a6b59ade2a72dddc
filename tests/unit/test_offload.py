"""app.offload under gevent, as the web and the book pool run it: what the offloaded call
raises reaches the caller, whatever its traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A child process: gevent's monkey-patching cannot be undone inside the test process.
_CHILD = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import sys, time
    from app.offload import offload

    def deep(n):
        if n == 0:
            raise ValueError("from the bottom")
        return deep(n - 1)

    def unbounded(n):
        return unbounded(n + 1)

    for fn, arg, expected in ((deep, 985, ValueError), (unbounded, 0, RecursionError),
                              (deep, 3, ValueError)):
        started = time.monotonic()
        try:
            offload("frontend", fn, arg, timeout_s=20)
        except expected as exc:
            print(type(exc).__name__, round(time.monotonic() - started, 1))
        except BaseException as exc:
            print("other", type(exc).__name__)
    print(offload("frontend", sum, [1, 2, 3]))
""")


def test_an_exception_from_deep_recursion_reaches_the_caller_at_once() -> None:
    # Before: gevent serialised the traceback recursively, which raised RecursionError inside
    # its own error path; the result was never set and the caller got OffloadTimeout after
    # its whole bound (a 503 "busy" after 60 s; a book's prepare waited for good).
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=120)
    lines = proc.stdout.split()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert lines[0::2][:3] == ["ValueError", "RecursionError", "ValueError"], proc.stdout
    assert all(float(seconds) < 5 for seconds in lines[1:6:2]), proc.stdout
    assert lines[-1] == "6"

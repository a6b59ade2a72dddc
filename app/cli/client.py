"""What the HTTP client commands (`say`, `book render`, `voices`) share: the farm they talk
to, one session with the farm's API key (--api-key, VOXFARM_API_KEY), its errors as one line
that says what to do, a progress line."""

from __future__ import annotations

import functools
import sys
import time
from contextlib import contextmanager
from typing import Any, cast

import click

from app.cli.common import default_of, read_settings

# Where the --api-key option leaves its value for `http()` (the command's root context).
_API_KEY_META = "voxfarm.api_key"


def _remember_api_key(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.find_root().meta[_API_KEY_META] = value


# On every command that calls the farm's API; the value reaches `http()`, not the command.
# Its variable, VOXFARM_API_KEY, is the settings' `api_key` (read there, as every VOXFARM_*
# is), which `http()` falls back to.
api_key_option = click.option(
    "--api-key", metavar="KEY", expose_value=False, callback=_remember_api_key,
    help="The API key to call the farm with, once it has keys on (`voxfarm keys create "
         "NAME` prints one).  [env var: VOXFARM_API_KEY]")


def http():
    """One requests session (kept-alive connections) per API key, with the key the command
    was given (--api-key, else VOXFARM_API_KEY) when there is one."""
    ctx = click.get_current_context(silent=True)
    given = ctx.find_root().meta.get(_API_KEY_META) if ctx is not None else None
    return _session(given or read_settings().api_key.get_secret_value())


@functools.cache
def _session(api_key: str):
    # loaded by the command that uses it: the CLI starts without it
    import requests

    session = requests.Session()
    if api_key:
        session.headers["Authorization"] = f"Bearer {api_key}"
    return session


NEEDS_KEY = "the farm asks for an API key: pass --api-key or set VOXFARM_API_KEY"
KEY_REFUSED = ("the farm refuses the API key given (--api-key or VOXFARM_API_KEY): it is "
               "not one of its live keys (`voxfarm keys list` on the farm)")


def api_error(resp) -> str:
    """The API's error as one line, and the names the server says it would take (`valid`:
    the voices, the formats) on a second; a 401 says how to pass a key, or that the one
    passed is refused."""
    if resp.status_code == 401:
        sent = "Authorization" in getattr(resp.request, "headers", {})
        return KEY_REFUSED if sent else NEEDS_KEY
    try:
        err = resp.json()["error"]
        line = f"{resp.status_code} {err['code']}: {err['message']}"
    except Exception:
        return f"{resp.status_code} {resp.text[:200]}"
    if err.get("valid"):
        line += f"\nvalid: {', '.join(map(str, err['valid']))}"
    return line


DEFAULT_SERVER = "http://127.0.0.1:8000"

SERVER_HELP = ("The farm's URL [env VOXFARM_SERVER; default: the farm in --var's farm.json, "
                f"else {DEFAULT_SERVER}].")
VAR_HELP = ("Where `voxfarm up` wrote farm.json [env VOXFARM_VAR; default: var]. Given, its "
             "farm must be running.")


def var_given(ctx: click.Context) -> bool:
    """Whether the user named the var dir (--var, or VOXFARM_VAR): its farm is the one meant."""
    return (ctx.get_parameter_source("var_dir") != click.core.ParameterSource.DEFAULT
            or read_settings().var_dir != default_of("var_dir"))


def find_server(flag: str | None, var_dir: str, var_given: bool = False) -> tuple[str, str]:
    """The farm to talk to, and how it was found: the flag, VOXFARM_SERVER, the state file
    of a running `voxfarm up`, or the default.

    A farm found by any way but the flag or the state file is named on stderr, before
    anything is sent: a default that reaches another farm on this host must not pass
    unnoticed. A var dir the user named (`var_given`), or whose farm.json a farm that
    stopped left, means that farm: if it is not running, that is an error, never the
    default."""
    # loaded by the command that uses it: the CLI starts without it
    from app.local import farmstate

    if flag:
        return flag.rstrip("/"), "--server"
    if read_settings().server_url:
        server = read_settings().server_url.rstrip("/")
        click.echo(f"using {server} (from VOXFARM_SERVER)", err=True)
        return server, "VOXFARM_SERVER"
    running = farmstate.live_state(var_dir)
    if running is not None:
        return running.web_url, str(farmstate.state_path(var_dir))
    path = farmstate.state_path(var_dir)
    stale = farmstate.read_state(var_dir)
    if var_given or stale is not None:
        why = (stopped_line(stale, path) if stale is not None
               else f"there is no {path} (no farm was started there yet)")
        raise click.ClickException(
            f"no farm runs from {var_dir}: {why}. Start it with `voxfarm up --var {var_dir}` "
            "(or `make run`), or name a running farm with --server / VOXFARM_SERVER")
    click.echo(f"using {DEFAULT_SERVER} (the default: no {path} here, no --server, no "
               "VOXFARM_SERVER)", err=True)
    return DEFAULT_SERVER, "the default"


@contextmanager
def reaching(server: str, found_by: str, var_dir: str):
    """One line, not a traceback, when nothing answers at `server`."""
    # loaded by the command that uses it: the CLI starts without it
    import requests

    from app.local import farmstate

    try:
        yield
    except (requests.ConnectionError, requests.Timeout) as exc:
        if found_by == str(farmstate.state_path(var_dir)):
            raise click.ClickException(_state_file_farm_gone(server, var_dir)) from None
        kind = "timed out" if isinstance(exc, requests.Timeout) else "nothing answers"
        raise click.ClickException(
            f"no farm is running: {kind} at {server} (from {found_by}). Start one with "
            "`make run` (or `voxfarm up`), or point --server / VOXFARM_SERVER at a running "
            "farm") from None


def _ago(ts: float) -> str:
    """`ts` as the clock read then, and how long ago: "07:41:05 UTC, 3 min ago"."""
    seconds = max(0, round(time.time() - ts))
    ago = f"{seconds} s" if seconds < 120 else (f"{seconds // 60} min" if seconds < 7200
                                                else f"{seconds // 3600} h")
    return f"{time.strftime('%H:%M:%S', time.gmtime(ts))} UTC, {ago} ago"


def stopped_line(state, path) -> str:
    """How the farm of a state file whose `voxfarm up` no longer runs ended: stopped (the file
    marked so, with the time), or gone without a word (killed: the pid is dead)."""
    if state.stopped_at:
        return f"the farm of {path} (pid {state.pid}) stopped at {_ago(state.stopped_at)}"
    return (f"{path} is left from a farm that stopped (pid {state.pid}, gone without "
            "marking it: killed?)")


# A farm whose web does not answer this long after its start is not "still starting".
_STARTING_S = 300.0


def _state_file_farm_gone(server: str, var_dir: str) -> str:
    """What to say when the farm found through its state file stops answering: it stopped
    (since when), or it runs but its web does not answer (starting, or down)."""
    # loaded by the command that uses it: the CLI starts without it
    from app.local import farmstate

    path = farmstate.state_path(var_dir)
    state = farmstate.read_state(var_dir)
    up_again = ("`voxfarm up`" if var_dir == default_of("var_dir")
                else f"`voxfarm up --var {var_dir}`")
    if state is None or not state.alive:
        how = stopped_line(state, path) if state is not None else f"{path} is gone"
        return (f"the farm stopped: {how}. Start it again with {up_again} (or `make run`) "
                "and run this command again (a book resumes where it was)")
    log = f"{var_dir}/log/web.log"
    if time.time() - state.started_at < _STARTING_S:
        return (f"the farm of {path} (pid {state.pid}, started at {_ago(state.started_at)}) "
                f"does not answer at {server}: still starting? Try again in a moment, or "
                f"see {log}")
    return (f"the farm of {path} (pid {state.pid}, started at {_ago(state.started_at)}) runs "
            f"but its web does not answer at {server}: see {log}; its supervisor restarts it")


def format_eta(seconds: float | None) -> str:
    if not seconds:
        return ""
    seconds = round(seconds)
    return f"ETA {seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"ETA {seconds} s"


class Progress:
    """What `say` and `book render` show while the farm works: on a terminal a bar (position,
    percent and the caller's note, whose one estimate is the farm's: click's own ETA is off);
    elsewhere (a log, a pipe) a plain line at the start, every `EVERY_S` seconds and at the
    end, so a script's output is never silent for minutes."""

    EVERY_S = 5.0

    def __init__(self, total: int, label: str = "segments") -> None:
        # total 0: not known yet (a book before its chapters are split)
        self.label, self.total, self.done, self.note = label, total, 0, ""
        self.terminal = sys.stdout.isatty()
        self._bar: Any = None
        self._printed, self._printed_at = "", cast(float | None, None)
        if self.terminal:
            self._bar = click.progressbar(length=max(1, total), label=label, show_eta=False,
                                          show_pos=bool(total),
                                          item_show_func=lambda _: self.note)
            self._bar.__enter__()

    def update(self, done: int, total: int | None = None, note: str = "") -> None:
        if total:
            self.total = total
        self.note = note
        if self._bar is not None:
            self._bar.length, self._bar.show_pos = max(1, self.total), bool(self.total)
            self._bar.update(done - self.done, note)
        elif self._printed_at is None or time.monotonic() - self._printed_at >= self.EVERY_S:
            self._line(done)
        self.done = done

    def _text(self, done: int) -> str:
        return (f"{self.label} {done}/{self.total or '?'}"
                + (f", {self.note}" if self.note else ""))

    def _line(self, done: int) -> None:
        self._printed = self._text(done)
        click.echo(self._printed)
        self._printed_at = time.monotonic()

    def close(self) -> None:
        """End the display; off a terminal, with the last figures unless just printed."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self._printed != self._text(self.done):
            self._line(self.done)

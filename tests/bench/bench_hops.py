"""The farm's fixed cost per segment outside the model: Redis round trips, CPU and wall time.

    .venv/bin/python tests/bench/bench_hops.py [--runs 5] [--redis-url URL]

A farm (1 acoustic + 1 vocoder worker, gunicorn gevent, Redis on loopback, the default voice)
renders a fresh one-sentence job and a fresh ten-sentence paragraph, each through the HTTP
stream (`POST /v1/jobs`, then `GET /v1/jobs/{id}/stream`), as a listener would.

Two passes, so the counting does not slow the timing:

* Counting: Redis `MONITOR` records every command of one job of each kind, each attributed to
  the process that sent it (web, the acoustic pool, the vocoder pool) by its connection's
  port. The table gives the commands per segment and per window by process and by command,
  with the broker's messages' sizes. Background traffic (heartbeats, sweepers) over the same
  span of an idle farm is measured too and shown beside them.
* Timing: `--runs` jobs of each kind, the job record's stamps (POST -> created -> acoustic
  started -> first window stored -> client's first byte) and each process's CPU time (user +
  system, from /proc), per segment, each pool's parent (the prefork consumer) apart. The
  model's own CPU for the same sentences, in this process (tests/bench/bench_farm.py's
  `Direct`), whole and cut in the farm's windows, is shown beside the pools' CPU: what is left
  is the stages' cost outside the model.
* The features' size and the cost of their codec (app/stores/features.py).

A busy box moves wall times by tens of percent; round-trip counts do not move, and CPU time
moves much less than wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_farm import Direct  # noqa: E402
from tests.bench.bench_stream import hops, via_stream  # noqa: E402
from tests.bench.common import redis_url_or_embedded  # noqa: E402
from tests.helpers import gunicorn_server, running_farm  # noqa: E402

TOPICS = ["harbour", "library", "mountain", "garden", "market", "river", "station",
          "orchard", "workshop", "lighthouse"]


def sentences(tag: str, n: int) -> list[str]:
    return [f"The {t} in tale {tag} opens its doors a little after sunrise, number {i + 1}."
            for i, t in enumerate(TOPICS[:n])]


class Roles:
    """Which process (web, acoustic, vocoder, redis) a pid or a client port belongs to."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots

    def processes(self) -> dict[str, list[psutil.Process]]:
        out: dict[str, list[psutil.Process]] = {}
        for role, pid in self.roots.items():
            root = psutil.Process(pid)
            out[role] = [root, *root.children(recursive=True)]
        return out

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of each role's processes, and of each pool's parent alone
        (`ROLE parent`: the prefork pool's consumer, which receives, hands over, acks and
        sends the task events; its child runs the task), and of the threads of its children
        beside their main one (`ROLE other threads`: a wide vocoder pass's inference
        threads, tasks/cores.py, which the model's figure here, on one thread, leaves out)."""
        total: dict[str, float] = {}
        for role, procs in self.processes().items():
            seconds, beside = [], 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    seconds.append(t.user + t.system)
                    if p is not procs[0]:
                        beside += sum(th.user_time + th.system_time for th in p.threads()
                                      if th.id != p.pid)
                except psutil.NoSuchProcess:
                    seconds.append(0.0)
            total[role] = sum(seconds)
            total[f"{role} parent"] = seconds[0]
            total[f"{role} other threads"] = beside
        return total

    def ports(self) -> dict[int, str]:
        out = {}
        for role, procs in self.processes().items():
            for p in procs:
                try:
                    for c in p.net_connections(kind="tcp"):
                        if c.laddr:
                            out[c.laddr.port] = role
                except psutil.NoSuchProcess:
                    pass
        return out


class Monitor:
    """Every command Redis executes while `on`, with its client's port."""

    def __init__(self, url: str) -> None:
        self.conn = redis.Redis.from_url(url)
        self.seen: list[tuple[int, float, str]] = []
        self.on = False
        self._mon = self.conn.monitor()
        self._mon.__enter__()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self._listen()
        except (redis.ConnectionError, ValueError):  # closed by `close`
            pass

    def _listen(self) -> None:
        for item in self._mon.listen():
            if self.on:
                port = int(item.get("client_port") or 0)
                self.seen.append((port, float(item["time"]), item["command"]))

    def take(self) -> list[tuple[int, float, str]]:
        out, self.seen = self.seen, []
        return out

    def close(self) -> None:
        """Stop monitoring: Redis copies every command to a monitor, which costs it CPU."""
        self._mon.connection.disconnect()


def command_name(command: str) -> str:
    """The command and, for a script, which one (its first line's comment is not sent: the
    SHA's first 8 characters)."""
    parts = command.split(" ")
    name = parts[0].strip('"').upper()
    if name in ("EVALSHA", "EVAL") and len(parts) > 1:
        return f"{name} {parts[1].strip(chr(34))[:8]}"
    return name


# A pipeline's commands reach Redis in one write and run back to back: commands of one
# client with no other client's between and less than this apart are one round trip.
PIPELINE_GAP_S = 0.0002


def background(role: str, command: str) -> bool:
    """A worker's own periodic traffic, not the job's: its liveness and Celery heartbeats,
    and the blocking fetch it repeats while idle (one BRPOP a task is the job's, left out
    with the rest)."""
    return role in ("acoustic", "vocoder") and (
        "worker.heartbeat" in command or " vf:workers:" in command
        or command.upper().startswith("BRPOP"))


def counted(seen, ports: dict[int, str]) -> tuple[Counter, Counter]:
    """Commands by (process, command), and round trips by process. A command a script runs
    is MONITOR's client "lua": counted as `lua` and never as a round trip. The workers'
    background traffic (`background`) is left out."""
    commands: Counter = Counter()
    trips: Counter = Counter()
    last_port, last_time = -1, 0.0
    for port, at, cmd in seen:
        role = ports.get(port, "other") if port else "lua"
        if background(role, cmd):
            continue
        commands[(role, command_name(cmd))] += 1
        if port and (port != last_port or at - last_time > PIPELINE_GAP_S):
            trips[role] += 1
        if port:
            last_port, last_time = port, at
    return commands, trips


def windows_of(farm, job_id: str) -> int:
    plans = farm.redis.hgetall(farm.keys.windows(job_id))
    return sum(int(v.decode().split(":")[0]) for v in plans.values()) or 1


def count_pass(base: str, tf, monitor: Monitor, roles: Roles, n: int, tag: str,
               dump: Path | None = None):
    """One job of `n` sentences under MONITOR; the commands by role, its windows, its span."""
    marks: list = []
    monitor.take()
    monitor.on = True
    t0 = time.perf_counter()
    via_stream(base, " ".join(sentences(tag, n)), marks)
    span = time.perf_counter() - t0
    # the last commands (the vocoder's release, the acknowledgement) follow the last chunk
    time.sleep(0.5)
    monitor.on = False
    seen = monitor.take()
    if dump is not None:
        dump.write_text("\n".join(f"{port} {cmd[:160]}" for port, _, cmd in seen))
    return counted(seen, roles.ports()), windows_of(tf.farm, marks[0][0]), span + 0.5


def idle_pass(monitor: Monitor, roles: Roles, span: float) -> tuple[Counter, Counter]:
    monitor.take()
    monitor.on = True
    time.sleep(span)
    monitor.on = False
    return counted(monitor.take(), roles.ports())


def timing_pass(base: str, tf, roles: Roles, n: int, runs: int, tag: str):
    """`runs` jobs of `n` sentences: the hops (medians) and CPU seconds per role per segment
    (summed over the runs: /proc counts CPU in 10 ms ticks)."""
    hop_rows = []
    spent: Counter = Counter()
    for r in range(runs):
        marks: list = []
        before = roles.cpu_s()
        via_stream(base, " ".join(sentences(f"{tag}-{r}", n)), marks)
        time.sleep(0.3)  # the release and acknowledgement after the last chunk
        after = roles.cpu_s()
        hop_rows.append(hops(tf.farm, marks[0]))
        spent.update({k: after[k] - before[k] for k in after})
    return ([statistics.median(v) for v in zip(*hop_rows, strict=True)],
            {k: v / (runs * n) for k, v in spent.items()})


def model_cpu(direct: Direct, n: int, runs: int) -> tuple[float, float, float]:
    """CPU seconds of the model alone for `n` sentences: the features, then the decode whole,
    window by window as the farm's vocoder cut every segment (its
    `VOXFARM_VOCODER_WINDOW_FRAMES`, each window with its context frames), and as the farm
    of this checkout cuts them (a short segment after the first whole, where it does)."""
    # the frontend as the web runs it, to cut the same segments; the farm's window setting
    from app.settings import Settings
    from models.text.frontend import iter_segments

    try:  # the rule of this checkout (a checkout from before it windows every segment)
        from tasks.segments import WHOLE_UP_TO_WINDOWS as whole_up_to
    except ImportError:
        whole_up_to = 0
    window = Settings.from_env().vocoder_window_frames
    rows = []
    for r in range(runs):
        segs = list(iter_segments(" ".join(sentences(f"direct-{r}", n)), direct.voice.name))
        spent = [0.0, 0.0, 0.0]
        for i, seg in enumerate(segs):
            t0 = time.process_time()
            features = direct.features(seg)
            t1 = time.process_time()
            direct.vocode(features)
            t2 = time.process_time()
            cut = direct.vocoder.windows(int(features.shape[-1]), window)
            for piece in cut:
                direct.vocode(features, piece)
            t3 = time.process_time()
            whole_s, windowed_s = t2 - t0, (t1 - t0) + (t3 - t2)
            spent[0] += whole_s
            spent[1] += windowed_s
            spent[2] += whole_s if i > 0 and len(cut) <= whole_up_to else windowed_s
        rows.append(spent)
    return tuple(statistics.median(col) for col in zip(*rows, strict=True))


def feature_codec_cost(direct: Direct) -> tuple[int, float, float]:
    """Bytes, and ms to encode and decode, one sentence's features (app/stores/features.py)."""
    # the workers' codec, timed here on the features the acoustic stage makes
    from app.stores.features import mel_from_bytes, mel_to_bytes
    from models.text.frontend import iter_segments

    seg = next(iter_segments(sentences("codec", 1)[0], direct.voice.name))
    features = direct.features(seg)
    t0 = time.perf_counter()
    for _ in range(200):
        blob = mel_to_bytes(features)
    t1 = time.perf_counter()
    for _ in range(200):
        mel_from_bytes(blob)
    t2 = time.perf_counter()
    return len(blob), (t1 - t0) / 200 * 1e3, (t2 - t1) / 200 * 1e3


def print_counts(name: str, counted_job, idle, segments: int, windows: int, span: float,
                 idle_span: float, top: int = 12) -> None:
    (commands, trips), (_, idle_trips) = counted_job, idle
    print(f"\n{name}: {segments} segment(s), {windows} window(s), {span:.2f} s under MONITOR "
          f"(an idle farm: {sum(idle_trips.values()) / idle_span:.1f} round trips a second "
          f"besides the workers' heartbeats and fetches, which are left out)\n")
    print(f"| {'process':<8} | {'round trips / segment':>21} | {'commands / segment':>18} |")
    print(f"|{'-' * 10}|{'-' * 23}|{'-' * 20}|")
    for role in ("web", "acoustic", "vocoder", "lua"):
        n_cmd = sum(v for k, v in commands.items() if k[0] == role)
        trip = "-" if role == "lua" else f"{trips.get(role, 0) / segments:.1f}"
        print(f"| {role:<8} | {trip:>21} | {n_cmd / segments:>18.1f} |")
    workers = trips.get("acoustic", 0) + trips.get("vocoder", 0)
    print(f"workers' round trips per window: {workers / windows:.1f}\n")
    print(f"the {top} commands sent most (per segment):")
    rows = sorted((v / segments, k) for k, v in commands.items() if k[0] != "lua")
    print("  " + ", ".join(f"{role} {cmd} {n:.1f}" for n, (role, cmd) in rows[::-1][:top]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--dump", type=Path, default=None,
                    help="write the one-sentence job's commands here (port, command)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="voxfarm-bench-hops-"))
    procs: list = []
    with (redis_url_or_embedded(args.redis_url, tmp) as url,
          running_farm(url, 0, tmp) as tf,
          gunicorn_server(tf.env, tmp / "web.log", procs=procs) as base):
        redis_pid = int(tf.farm.redis.info("server")["process_id"])
        workers = {w.queue: w.proc.pid for w in tf.workers}
        roles = Roles({"web": procs[0].pid, "acoustic": workers["acoustic"],
                       "vocoder": workers["vocoder"], "redis": redis_pid})
        for i in range(3):  # warm every process and connection pool
            via_stream(base, " ".join(sentences(f"warm{i}", 2)))
        monitor = Monitor(url)
        one, one_windows, one_span = count_pass(base, tf, monitor, roles, 1, "count-1",
                                                args.dump)
        ten, ten_windows, ten_span = count_pass(base, tf, monitor, roles, 10, "count-10")
        idle = idle_pass(monitor, roles, 3.0)
        monitor.close()
        timed = {n: timing_pass(base, tf, roles, n, args.runs, f"time-{n}") for n in (1, 10)}
    direct = Direct()
    model = {n: model_cpu(direct, n, args.runs) for n in (1, 10)}
    size, encode_ms, decode_ms = feature_codec_cost(direct)

    print(f"\nload average during the run: {psutil.getloadavg()}")
    print_counts("one sentence", one, idle, 1, one_windows, one_span, 3.0)
    print_counts("ten-sentence paragraph", ten, idle, 10, ten_windows, ten_span, 3.0)
    stages = ("POST -> job created", "created -> acoustic started",
              "acoustic started -> 1st window stored", "stored -> client's first byte")
    print(f"\nwall time to the first byte (medians of {args.runs}) and CPU per segment\n")
    print(f"| {'':<38} | {'one sentence':>12} | {'paragraph':>12} |")
    print(f"|{'-' * 40}|{'-' * 14}|{'-' * 14}|")
    for i, stage in enumerate(stages):
        print(f"| {stage:<38} | {timed[1][0][i] * 1e3:>10.1f}ms | "
              f"{timed[10][0][i] * 1e3:>10.1f}ms |")
    for role in ("web", "acoustic", "acoustic parent", "vocoder", "vocoder parent",
                 "vocoder other threads", "redis"):
        print(f"| {'CPU per segment: ' + role:<38} | {timed[1][1][role] * 1e3:>10.1f}ms | "
              f"{timed[10][1][role] * 1e3:>10.1f}ms |")
    pools = {n: timed[n][1]["acoustic"] + timed[n][1]["vocoder"] for n in (1, 10)}
    for i, how in enumerate(("whole decode", "all windowed", "as this farm cuts")):
        print(f"| {'CPU per segment: model, ' + how:<38} | {model[1][i] * 1e3:>10.1f}ms | "
              f"{model[10][i] / 10 * 1e3:>10.1f}ms |")
    print(f"| {'CPU per segment: pools less the model':<38} | "
          f"{(pools[1] - model[1][2]) * 1e3:>10.1f}ms | "
          f"{(pools[10] - model[10][2] / 10) * 1e3:>10.1f}ms |")
    print(f"\nfeatures of one sentence: {size} bytes, encode {encode_ms:.3f} ms, "
          f"decode {decode_ms:.3f} ms")


if __name__ == "__main__":
    main()

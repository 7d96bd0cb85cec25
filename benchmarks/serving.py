"""The serving path beside a running job: point-lookup latency and throughput, and what
serving costs the job.

One task (rocksdb + file changelog) preloaded with ``keys`` keys; the **job** is a
writer process that, for ``seconds`` per round, updates 500 random keys and commits,
again and again (a commit every few ms: far more often than a micro-batch job, so the
server applies a commit per refresh), and reports the records it committed per second.

* ``serving http get``: a ``localstate serve`` process (refresh every 100 ms) beside the
  job; this process sends ``GET /v1/stores/<s>/keys/<key>`` for random keys over one
  keep-alive connection, 200 a second (a dashboard's pace, many times over) and then as
  fast as the answers come (``busy``): latency p50/p99 (ms) and requests/s;
* ``serving api get``: :meth:`StateServer.get` in this process beside the job: the same;
* ``job beside serving (following | paced | busy)``: the job's records/s while a server
  only follows its commits, answers 200 GETs/s, or answers one client as fast as it asks,
  vs ``job alone`` (no server); each round runs the four in turn, starting at another one
  each round (the job's state and log grow from run to run), so load that changes during
  the run hits both sides of a pair alike; ``ratio`` is the median of the paired ratios
  (1.0 = free); ``server cpu`` is the server process's CPU seconds per second meanwhile.

The full form runs it all twice: with the file changelog's default segments (64 MiB) and
with 4 MiB ones (the server opens the partition once per commit it follows, which reads
the active segment). Every row is the median of the rounds (``repeats``, at least 3 for the full form).
Wall-clock figures: on a shared machine they carry its load (the suite's processes take
two of its cores: the job and the server, with this process as the client).
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.serving import StateServer, free_port

from .runner import make_row, rows_per_engine
from .timing import Stopwatch

__all__ = ["run"]

ENGINES = ("rocksdb",)
FULL_KEYS, QUICK_KEYS = 100_000, 5_000
FULL_SECONDS, QUICK_SECONDS = 5.0, 1.0
UPDATES_PER_COMMIT = 500
SMALL_SEGMENTS = 4 << 20
"""The full form runs again with the file changelog's segments at 4 MiB: opening a partition
read-only (once per followed commit) reads its active segment (docs/serving.md)."""
STORE = "profiles"

JOB = textwrap.dedent("""
    import json, random, sys, time
    from localstate import Config, TaskStorage
    config, keys, seconds = Config.from_dict(json.loads(sys.argv[1])), int(sys.argv[2]), float(sys.argv[3])
    UPDATES = int(sys.argv[4])
    rng = random.Random()
    records = commits = 0
    with TaskStorage(config, 0) as s:
        store = s.store("profiles")
        print("ready", flush=True)
        sys.stdin.readline()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(UPDATES):
                i = rng.randrange(keys)
                store[f"user{i:08d}"] = {"n": commits, "name": f"user {i}"}
            s.commit()
            records += UPDATES
            commits += 1
        took = time.perf_counter() - t0
    print(json.dumps({"records": records, "commits": commits, "seconds": took}), flush=True)
""")


def _values(root: Path, engine: str) -> dict[str, Any]:
    return {"job.name": "serving-bench", "job.partitions": 1, "job.state.dir": str(root / "state"),
            "systems.file.path": str(root / "changelog"), f"stores.{STORE}.factory": engine,
            f"stores.{STORE}.key.serde": "string", f"stores.{STORE}.msg.serde": "json",
            f"stores.{STORE}.changelog": "file.serving-bench-profiles"}


class _Job:
    """The writer process: started ready, timed from :meth:`go` to its report."""

    def __init__(self, values: dict[str, Any], keys: int, seconds: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", JOB, json.dumps(values), str(keys), str(seconds),
                                      str(UPDATES_PER_COMMIT)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the benchmark job did not start: {self.proc.communicate()[1][-2000:]}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def running(self) -> bool:
        return self.proc.poll() is None

    def result(self) -> float:
        out, err = self.proc.communicate(timeout=300)
        if self.proc.returncode:
            raise RuntimeError(f"the benchmark job failed: {err[-2000:]}")
        report = json.loads(out.strip().splitlines()[-1])
        return report["records"] / report["seconds"]


class _Server:
    """``localstate serve`` in its own process."""

    def __init__(self, config_file: Path, directory: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localstate", "serve", "-c", str(config_file), "--port", str(self.port), "--dir",
             str(directory), "--refresh-ms", "100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline().startswith("serving job"):
            self.proc.kill()
            raise RuntimeError(f"localstate serve did not start: {self.proc.communicate()[1][-2000:]}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


def _http_gets(port: int, keys: int, job: _Job, rng: random.Random) -> list[float]:
    """Latencies (s) of GETs of random keys over one keep-alive connection while the job runs."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out: list[float] = []
    try:
        while len(out) % 64 or job.running():
            key = f"user{rng.randrange(keys):08d}"
            with Stopwatch() as watch:
                conn.request("GET", f"/v1/stores/{STORE}/keys/{key}")
                response = conn.getresponse()
                body = response.read()
            out.append(watch.wall)
            if response.status != 200:
                raise RuntimeError(f"GET {key}: {response.status} {body[:300]!r}")
    finally:
        conn.close()
    return out


def _api_gets(server: StateServer, keys: int, job: _Job, rng: random.Random) -> list[float]:
    out: list[float] = []
    get = server.get
    while len(out) % 256 or job.running():
        key = f"user{rng.randrange(keys):08d}"
        with Stopwatch() as watch:
            found = get(STORE, key)
        out.append(watch.wall)
        if not found.found:
            raise RuntimeError(f"{key} not found")
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _http_paced(port: int, keys: int, job: _Job, rng: random.Random, per_second: float) -> list[float]:
    """GETs at a dashboard's pace (``per_second``) while the job runs."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out: list[float] = []
    start = time.perf_counter()
    try:
        while job.running():
            key = f"user{rng.randrange(keys):08d}"
            with Stopwatch() as watch:
                conn.request("GET", f"/v1/stores/{STORE}/keys/{key}")
                response = conn.getresponse()
                response.read()
            out.append(watch.wall)
            time.sleep(max(0.0, start + len(out) / per_second - time.perf_counter()))
    finally:
        conn.close()
    return out


def _cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


PACED_PER_SECOND = 200.0
"""The request rate of the paced phase (a dashboard's, many times over)."""


def _engine_rows(engine: str, root: Path, keys: int, seconds: float, rounds: int,
                 segment_bytes: int | None = None) -> list[dict[str, Any]]:
    values = _values(root, engine)
    if segment_bytes is not None:
        values["systems.file.segment.bytes"] = segment_bytes
    config = Config.from_dict(values)
    config_file = root / "job.properties"
    config_file.write_text("".join(f"{k} = {v}\n" for k, v in values.items()))
    with TaskStorage(config, 0) as s:
        s.store(STORE).put_all({f"user{i:08d}": {"n": 0, "name": f"user {i}"} for i in range(keys)})
        s.commit()
    rng = random.Random(11)
    runs: dict[str, list[float]] = {}

    def note(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    def job_run(phase: str, server: _Server | None, client: Any = None) -> list[float]:
        """One job run of ``seconds`` beside ``server`` (None: alone), ``client`` asking meanwhile."""
        job = _Job(values, keys, seconds)
        cpu0 = _cpu_seconds(server.proc.pid) if server else 0.0
        with Stopwatch() as watch:
            job.go()
            latencies = client(job) if client else []
            job.proc.wait()
        took = watch.wall
        note(phase, job.result())
        if server is not None:
            note(f"{phase} server cpu", (_cpu_seconds(server.proc.pid) - cpu0) / took)
        if latencies:
            note(f"{phase} rate", len(latencies) / took)
        return latencies

    clients: dict[str, Any] = {
        "alone": None,
        "following": None,  # the server follows the commits; nobody asks
        "paced": lambda job, port: _http_paced(port, keys, job, rng, PACED_PER_SECOND),
        "busy": lambda job, port: _http_gets(port, keys, job, rng),
    }
    phases = list(clients)
    for r in range(rounds):
        # each round runs the phases in another order: the job's own state and log grow from
        # run to run, which would otherwise always favour the phase that comes first
        for phase in phases[r % len(phases):] + phases[:r % len(phases)]:
            if phase == "alone":
                job_run(phase, None)
                continue
            server = _Server(config_file, root / "serving-http")  # caught up before it says it serves
            try:
                client = clients[phase]
                latencies = job_run(phase, server, None if client is None else
                                    lambda job, client=client, port=server.port: client(job, port))
            finally:
                server.close()
            if latencies:
                note(f"{phase} p50", _pct(latencies, 0.5) * 1000)
                note(f"{phase} p99", _pct(latencies, 0.99) * 1000)
        with StateServer(config, root / "serving-api", refresh_ms=100) as api:
            job = _Job(values, keys, seconds)
            job.go()
            with Stopwatch() as watch:
                latencies = _api_gets(api, keys, job, rng)
            took = watch.wall
            job.result()
        note("api p50", _pct(latencies, 0.5) * 1000)
        note("api p99", _pct(latencies, 0.99) * 1000)
        note("api rate", len(latencies) / took)
    params = {"keys": keys, "seconds": seconds, "rounds": rounds, "updates_per_commit": UPDATES_PER_COMMIT,
              "refresh_ms": 100, "segment_bytes": segment_bytes or "default (64 MiB)"}
    if segment_bytes is not None:
        engine = f"{engine}, {segment_bytes >> 20} MiB segments"
    beside = "beside the running job (a commit of 500 updates every few ms); median of rounds"
    paced = f"{PACED_PER_SECOND:.0f} GETs/s over one keep-alive connection"
    busy = "one client asking as fast as it gets answers (one request at a time, keep-alive)"
    rows = [
        make_row("serving http get p50", engine, params, "ms", runs["paced p50"], notes=f"{paced}; {beside}"),
        make_row("serving http get p99", engine, params, "ms", runs["paced p99"], notes=f"{paced}; {beside}"),
        make_row("serving http get p50, busy", engine, params, "ms", runs["busy p50"], notes=f"{busy}; {beside}"),
        make_row("serving http get p99, busy", engine, params, "ms", runs["busy p99"], notes=f"{busy}; {beside}"),
        make_row("serving http get", engine, params, "requests/s", runs["busy rate"], notes=f"{busy}; {beside}"),
        make_row("serving api get p50", engine, params, "ms", runs["api p50"], notes=f"StateServer.get in process; "
                 f"{beside}"),
        make_row("serving api get p99", engine, params, "ms", runs["api p99"], notes=f"StateServer.get in process; "
                 f"{beside}"),
        make_row("serving api get", engine, params, "ops/s", runs["api rate"], notes=f"one thread; {beside}"),
    ]
    for phase, what in (("following", "the server follows every commit, no queries"),
                        ("paced", f"the server answers {paced}"), ("busy", f"the server answers {busy}")):
        row = make_row(f"job beside serving ({phase})", engine, params, "records/s", runs[phase],
                       baseline="job alone", notes=f"the job's committed records/s while {what}; ratio = median of "
                                                   "paired rounds (beside / alone), 1.0 = free")
        row["ratio"] = statistics.median(b / a for a, b in zip(runs["alone"], runs[phase]))
        rows.append(row)
        rows.append(make_row(f"server cpu ({phase})", engine, params, "cpu-s/s", runs[f"{phase} server cpu"],
                             notes=f"the localstate serve process's CPU seconds per second while {what}"))
    rows.append(make_row("job alone", engine, params, "records/s", runs["alone"],
                         notes="the same job with no server (rounds alternate with the served ones)"))
    return rows


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Rows for every installed engine of :data:`ENGINES` (``repeats`` rounds; at least 3
    in the full form)."""
    keys = QUICK_KEYS if quick else FULL_KEYS
    seconds = QUICK_SECONDS if quick else FULL_SECONDS
    rounds = repeats if quick else max(3, repeats)
    rows = []
    for segment_bytes in (None,) if quick else (None, SMALL_SEGMENTS):
        rows += rows_per_engine(
            ENGINES, lambda engine, root, sb=segment_bytes: _engine_rows(engine, root, keys, seconds, rounds, sb),
            workload="serving http get p99", params={"keys": keys}, unit="ms", prefix="localstate-serving-")
    return rows

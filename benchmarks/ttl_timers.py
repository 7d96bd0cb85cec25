"""What TTL and timers cost: TTL put/get vs the same store without TTL, and
timers registered and fired per second.

Rows (each ratio measured in the same run, against the row named in ``baseline``):

* ``ttl put`` / ``ttl get``: ``records`` puts (then gets of random present keys) through
  ``TaskStorage.store()`` (json values, string keys, object cache of 10% of the keys),
  with ``stores.s.ttl.ms = 24h`` and without; ``ratio`` = TTL rate / plain rate (the
  target is TTL costing at most 1.2×, i.e. ratio >= 0.83). One commit at the end of the
  puts is timed with them (it runs the commit-time sweep). The two rows do the same work
  but TTL's: one config but ``ttl.ms`` (serdes, cache, write batch), the same keys in
  the same order, the same value object, the same random reads, trials interleaved.
  ``ttl put (fresh values)`` / ``ttl get (fresh values)``: the same with a new value
  object per put, as a task that computes its values has (see :func:`_ttl_trial`).
Times are CPU seconds of this process (``time.process_time``, all its threads, RocksDB's
included): the machine these figures come from is shared, and wall time there measures
the other tenants more than this code.

* ``timers register batch`` / ``timers fire batch``: ``Timers.register_all`` of
  ``records`` timers, then ``Timers.fire_batch`` of all of them (the batch path; target
  >= 500k timers/s each); ``timers register`` / ``timers fire``: one call per timer
  (``register`` and ``fire`` with a per-timer callback).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.timers import EVENT_TIME, Timers

from .runner import make_row
from .timing import Stopwatch

__all__ = ["run"]

FULL_RECORDS = 200_000
QUICK_RECORDS = 20_000


def _config(root: Path, engine: str, records: int, ttl: bool) -> Config:
    values: dict[str, Any] = {
        "job.name": "ttl-bench",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.s.factory": engine,
        "stores.s.key.serde": "string",
        "stores.s.msg.serde": "json",
        "stores.s.object.cache.size": max(1000, records // 10),
        "stores.s.write.batch.size": 1000,
        "stores.timers.factory": engine,
        "stores.timers.object.cache.size": 0,
    }
    if ttl:
        values["stores.s.ttl.ms"] = "24h"
    return Config.from_dict(values)


def _ttl_trial(engine: str, records: int, ttl: bool, fresh_values: bool = False) -> tuple[float, float]:
    """(puts/s, gets/s) of one fresh task. ``fresh_values``: each put a new value object
    (``{"views": i, ...}``, as a task that computes its values does) instead of one shared
    object — a shared one makes the plain row allocate nothing per put, while TTL's
    ``(expiry, value)`` pair is a new object the garbage collector tracks."""
    root = Path(tempfile.mkdtemp(prefix="ls-ttl-bench-"))
    try:
        keys = [f"user-{i:08d}" for i in range(records)]
        value = {"views": 1, "page": "/index"}
        reads = random.Random(1).choices(keys, k=records)
        with TaskStorage(_config(root, engine, records, ttl)) as st:
            store = st.store("s")
            put = store.put
            with Stopwatch(cpu=True) as writing:
                if fresh_values:
                    for i, k in enumerate(keys):
                        put(k, {"views": i, "page": "/index"})
                else:
                    for k in keys:
                        put(k, value)
                st.commit()
            get = store.get
            with Stopwatch(cpu=True) as reading:
                for k in reads:
                    get(k)
        return records / writing.cpu, records / reading.cpu
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _timer_trial(engine: str, records: int, batched: bool) -> tuple[float, float]:
    """(registered/s, fired/s) of ``records`` timers."""
    root = Path(tempfile.mkdtemp(prefix="ls-timer-bench-"))
    try:
        keys = [f"user-{i:08d}" for i in range(records)]
        stamps = random.Random(2).choices(range(1_000_000), k=records)
        with TaskStorage(_config(root, engine, records, False)) as st:
            timers = Timers(st.store("timers"), EVENT_TIME, lambda: 1 << 40)
            fired = 0

            def on_timers(ks: list[Any], ts: list[int]) -> None:
                nonlocal fired
                fired += len(ks)

            def on_timer(k: Any, ts: int) -> None:
                nonlocal fired
                fired += 1

            with Stopwatch(cpu=True) as registering:
                if batched:
                    timers.register_all(keys, stamps)
                else:
                    register = timers.register
                    for k, ts in zip(keys, stamps):
                        register(k, ts)
            with Stopwatch(cpu=True) as firing:
                if batched:
                    timers.fire_batch(on_timers)
                else:
                    timers.fire(on_timer)
            if fired != records:
                raise AssertionError(f"{fired} of {records} timers fired")
        return records / registering.cpu, records / firing.cpu
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(quick: bool = False, repeats: int = 5, engines: tuple[str, ...] = ("memory", "rocksdb")) -> list[dict[str, Any]]:
    records = QUICK_RECORDS if quick else FULL_RECORDS
    params = {"records": records}
    rows: list[dict[str, Any]] = []
    for engine in engines:
        # (ttl, fresh values) -> trials; interleaved, so load changes hit every row alike
        runs: dict[tuple[bool, bool], list[tuple[float, float]]] = {}
        _ttl_trial(engine, min(records, 5000), True)  # warm-up
        for _ in range(repeats):
            for fresh in (False, True):
                for ttl in (False, True):
                    runs.setdefault((ttl, fresh), []).append(_ttl_trial(engine, records, ttl, fresh))
        for fresh in (False, True):
            suffix = " (fresh values)" if fresh else ""
            for i, op in enumerate(("put", "get")):
                plain = [r[i] for r in runs[(False, fresh)]]
                with_ttl = [r[i] for r in runs[(True, fresh)]]
                rows.append(make_row(f"ttl {op}{suffix}", f"{engine} (no ttl)", params, "ops/s", plain))
                row = make_row(f"ttl {op}{suffix}", engine, params, "ops/s", with_ttl, baseline=f"{engine} (no ttl)",
                               notes="stores.s.ttl.ms = 24h; ratio = TTL rate / plain rate (target >= 0.83)"
                               + ("; a new value object per put" if fresh else "; one value object for every put"))
                row["ratio"] = statistics.median(with_ttl) / statistics.median(plain)
                rows.append(row)
        for batched in (True, False):
            timer_runs = [_timer_trial(engine, records, batched) for _ in range(repeats)]
            suffix = " batch" if batched else ""
            for i, op in enumerate(("register", "fire")):
                rows.append(make_row(f"timers {op}{suffix}", engine, params, "timers/s", [r[i] for r in timer_runs],
                                     notes="target >= 500k/s on the batch path" if batched else "one call per timer"))
    return rows


def fresh_processes(engine: str, trials: int, records: int = FULL_RECORDS) -> dict[str, float]:
    """Medians of ``trials`` rounds, each trial in a new Python process (no warm heap, no
    earlier trial's garbage), interleaved within a round: plain and TTL (shared value),
    then the batch timer trial. Returns rates and the TTL costs (plain rate / TTL rate)."""
    import subprocess
    import sys

    def trial(call: str) -> list[float]:
        code = f"from localstate.benchmarks.ttl_timers import _ttl_trial, _timer_trial; print(*{call})"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        return [float(x) for x in out.split()]

    runs: dict[str, list[list[float]]] = {"plain": [], "ttl": [], "timers": []}
    for _ in range(trials):
        runs["plain"].append(trial(f"_ttl_trial({engine!r}, {records}, False)"))
        runs["ttl"].append(trial(f"_ttl_trial({engine!r}, {records}, True)"))
        runs["timers"].append(trial(f"_timer_trial({engine!r}, {records}, True)"))

    def median(name: str, i: int) -> float:
        return statistics.median(r[i] for r in runs[name])

    return {"put/s": median("plain", 0), "ttl put/s": median("ttl", 0), "get/s": median("plain", 1),
            "ttl get/s": median("ttl", 1), "ttl put cost": median("plain", 0) / median("ttl", 0),
            "ttl get cost": median("plain", 1) / median("ttl", 1),
            "timers registered/s": median("timers", 0), "timers fired/s": median("timers", 1)}


if __name__ == "__main__":  # pragma: no cover - a quick look from a shell
    import json
    import sys

    if "--fresh" in sys.argv:  # python -m localstate.benchmarks.ttl_timers --fresh 5 [memory rocksdb]
        at = sys.argv.index("--fresh")
        n = int(sys.argv[at + 1])
        for engine in [a for a in sys.argv[at + 2:] if not a.startswith("-")] or ["memory", "rocksdb"]:
            print(engine, json.dumps({k: round(v, 3) for k, v in fresh_processes(engine, n).items()}))
        sys.exit(0)
    for r in run(quick="--quick" in sys.argv, repeats=3):
        print(json.dumps({k: r[k] for k in ("workload", "engine", "median", "unit", "ratio")}))

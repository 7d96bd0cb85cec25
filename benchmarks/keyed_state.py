"""What keyed state handles cost over the raw store calls they wrap.

One task (``TaskStorage``) with two stores of the same spec per engine — ``raw`` and
``handle`` (string keys, ``long`` or ``tuple``-keyed values, the default object cache of
1,000 entries, file changelog) — and per-record loops over ``records`` keys drawn from
20,000 distinct ones (most reads miss the cache), written the way a task writes them:

* ``value get+update``: ``keyed.key = k; h.update(h.get(0) + 1)`` vs
  ``s[k] = s.get(k, 0) + 1`` (the key set as the runner sets it per record);
* ``value get``: ``keyed.key = k; h.get()`` vs ``s.get(k)``; ``value get (cache hits)`` the
  same over 500 distinct keys, all in the object cache (the raw call is then one Python
  call, so the handle's own call is the largest share it can be);
* ``map get+put``: ``keyed.key = k; m.put("n", m.get("n", 0) + 1)`` vs
  ``s[(k, "n")] = s.get((k, "n"), 0) + 1``;
* ``reducing add``: ``keyed.key = k; r.add(1)`` vs ``s[k] = s.get(k, 0) + 1``.

Rates in records per CPU second of the task's thread (``time.thread_time``: the calls'
own cost, which the load of other processes on a shared machine does not inflate as it
does wall time; RocksDB's background threads are not counted, and the foreground calls
are the same on both sides); raw and handle runs alternate (at least 9 pairs, ``repeats`` with --quick), and ``ratio`` (handle rate / raw rate,
as every suite's ratio) is the median of the paired ratios, so load that changes during
the run hits both sides of a pair alike. The cost of a handle is ``1 / ratio`` (1.0 =
free; the target is <= 1.1, i.e. ``ratio >= 0.91``).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.keyed import KeyedState

from .runner import make_row, rows_per_engine
from .timing import Stopwatch

__all__ = ["run", "OPS"]

FULL_RECORDS = 200_000
QUICK_RECORDS = 5_000
DISTINCT_KEYS = 20_000
ENGINES = ("memory", "rocksdb")


def _config(root: Path, engine: str) -> Config:
    values: dict[str, Any] = {"job.name": "keyed", "job.state.dir": str(root / "state"),
                              "systems.file.path": str(root / "changelog")}
    for side in ("raw", "handle"):
        for kind, key_serde in (("value", "string"), ("map", "tuple")):
            name = f"{side}_{kind}"
            values.update({f"stores.{name}.factory": engine, f"stores.{name}.key.serde": key_serde,
                           f"stores.{name}.msg.serde": "long", f"stores.{name}.changelog": f"file.keyed-{name}"})
    return Config.from_dict(values)


def _loops(storage: TaskStorage) -> dict[str, tuple[Callable[[list[str]], None], Callable[[list[str]], None]]]:
    """``op -> (raw loop, handle loop)`` over a list of keys."""
    raw, raw_map = storage.store("raw_value"), storage.store("raw_map")
    keyed = KeyedState(storage, {})
    value = keyed.value("handle_value", int)
    mapped = keyed.map("handle_map", str, int)

    def raw_get_update(keys: list[str]) -> None:
        for k in keys:
            raw[k] = raw.get(k, 0) + 1

    def handle_get_update(keys: list[str]) -> None:
        for k in keys:
            keyed.key = k
            value.update(value.get(0) + 1)

    def raw_get(keys: list[str]) -> None:
        for k in keys:
            raw.get(k)

    def handle_get(keys: list[str]) -> None:
        for k in keys:
            keyed.key = k
            value.get()

    def raw_map_get_put(keys: list[str]) -> None:
        for k in keys:
            raw_map[(k, "n")] = raw_map.get((k, "n"), 0) + 1

    def handle_map_get_put(keys: list[str]) -> None:
        for k in keys:
            keyed.key = k
            mapped.put("n", mapped.get("n", 0) + 1)

    loops = {"value get+update": (raw_get_update, handle_get_update), "value get": (raw_get, handle_get),
             "value get (cache hits)": (raw_get, handle_get), "map get+put": (raw_map_get_put, handle_map_get_put)}
    return loops


def _reducing_loops(storage: TaskStorage) -> tuple[Callable[[list[str]], None], Callable[[list[str]], None]]:
    raw = storage.store("raw_value")
    keyed = KeyedState(storage, {})
    total = keyed.reducing("handle_value", int.__add__, int)

    def raw_add(keys: list[str]) -> None:
        for k in keys:
            raw[k] = raw.get(k, 0) + 1

    def handle_add(keys: list[str]) -> None:
        for k in keys:
            keyed.key = k
            total.add(1)

    return raw_add, handle_add


OPS = ("value get+update", "value get", "value get (cache hits)", "map get+put", "reducing add")
HOT_KEYS = 500
"""Distinct keys of the cache-hit row: all of them fit the object cache."""


def _rate(loop: Callable[[list[str]], None], keys: list[str]) -> float:
    """Records per CPU second of this thread: what the calls cost, not what other
    processes on a shared machine took (wall-clock rates are the same on an idle one)."""
    with Stopwatch(cpu=True) as watch:
        loop(keys)
    return len(keys) / watch.thread


def _engine_rows(engine: str, records: int, repeats: int, root: Path) -> list[dict[str, Any]]:
    rng = random.Random(7)
    keys = [f"user{rng.randrange(DISTINCT_KEYS):08d}" for _ in range(records)]
    params = {"records": records, "distinct_keys": DISTINCT_KEYS, "object_cache": 1000, "pairs": repeats}
    rows = []
    with TaskStorage(_config(root, engine)) as storage:
        loops = _loops(storage)
        loops["reducing add"] = _reducing_loops(storage)
        hot = [k for k in keys if int(k[4:]) < HOT_KEYS] * (DISTINCT_KEYS // HOT_KEYS)
        for op in OPS:
            raw_loop, handle_loop = loops[op]
            keys_of_op = hot[:records] if op == "value get (cache hits)" else keys
            raw_loop(keys_of_op)  # warm-up: both stores hold every key before the timed runs
            handle_loop(keys_of_op)
            runs: dict[str, list[float]] = {"raw": [], "handle": []}
            for _ in range(repeats):
                runs["raw"].append(_rate(raw_loop, keys_of_op))
                runs["handle"].append(_rate(handle_loop, keys_of_op))
                storage.commit()
            handle = make_row(f"keyed {op}", engine, params, "records/cpu-s", runs["handle"],
                              baseline=f"raw store {op}",
                              notes="keyed state handle, key set per record; ratio = median of paired "
                                    "handle/raw rates; cost = 1/ratio (target <= 1.1)")
            base = make_row(f"raw store {op}", engine, params, "records/cpu-s", runs["raw"],
                            notes="the same store calls by hand (store[key])")
            handle["ratio"] = statistics.median(h / r for r, h in zip(runs["raw"], runs["handle"]))
            rows += [handle, base]
    return rows


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Rows per op for every installed engine of :data:`ENGINES`."""
    records = QUICK_RECORDS if quick else FULL_RECORDS
    timed = repeats if quick else max(repeats, 9)
    return rows_per_engine(ENGINES, lambda engine, root: _engine_rows(engine, records, timed, root),
                           workload="keyed value get+update", params={"records": records}, unit="records/cpu-s",
                           prefix="localstate-keyed-")

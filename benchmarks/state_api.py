"""The state-query figures: the state-query read rate and what metrics cost the put/get path.

**State query.** A task commits ``records`` keys (16-byte keys, 100-byte JSON string
values) and stays open with its lock held, as a running job does. Timed, in records/s:

* ``state query (StateReader)``: ``StateReader(config).store(s)`` and a full scan —
  checkpoint, changelog replay ``[0, C)`` into memory, decode (what ``localstate dump``
  and the ``localstate-state`` Spark source do per partition);
* ``normal open + scan`` (baseline, same run): the task closed, ``TaskStorage(config)``
  opened over its local copy (no restore needed) and ``store.all()`` scanned — what a
  stopped job's owner could do instead. ``ratio`` = reader rate / normal-open rate.

**Metrics overhead.** The same store stack with and without the ``metered`` layer
(``build_store(..., metered=False)``), memory engine, serdes and object cache on:
``put`` and ``get`` of ``records / 2`` keys (most reads miss the cache) and ``get``s
that hit the cache, ops/s, at least 9 alternating on/off pairs; ``ratio`` = median of
the paired metered / unmetered rates (1.0 = free). The counters are plain integer increments; histograms and the exporter
work once per commit or scrape, not per operation.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from localstate import Config, StateReader, TaskStorage
from localstate.engines.memory import MemoryEngine
from localstate.layers import build_store
from localstate.metrics import StoreMetrics
from localstate.serdes import get_serde

from .runner import make_row, rows_per_engine
from .timing import Stopwatch

__all__ = ["run"]

FULL_RECORDS = 200_000
QUICK_RECORDS = 5_000
ENGINES = ("memory", "rocksdb")


def _config(root: Path, engine: str) -> Config:
    return Config.from_dict({
        "job.name": "query",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.s.factory": engine,
        "stores.s.changelog": "file.query-s",
        "stores.s.key.serde": "string",
        "stores.s.msg.serde": "json",
        "stores.s.object.cache.size": 0,
        "stores.s.write.batch.size": 10_000,
    })


def _fill(config: Config, records: int) -> None:
    value = "v" * 100
    with TaskStorage(config) as s:
        kv = s.store("s")
        for start in range(0, records, 10_000):
            kv.put_all([(f"key{i:013d}", value) for i in range(start, min(records, start + 10_000))])
        s.commit()


def _scan_count(store: Any) -> int:
    with store.all() as it:
        return sum(1 for _ in it)


def _reader_seconds(config: Config, records: int) -> float:
    with Stopwatch() as watch:
        with StateReader(config) as reader:
            n = _scan_count(reader.store("s"))
    elapsed = watch.wall
    assert n == records, (n, records)
    return elapsed


def _open_seconds(config: Config, records: int) -> float:
    with Stopwatch() as watch:
        with TaskStorage(config) as s:
            n = _scan_count(s.store("s"))
    elapsed = watch.wall
    assert n == records, (n, records)
    return elapsed


def _state_query(engine: str, records: int, repeats: int, root: Path) -> list[dict[str, Any]]:
    config = _config(root, engine)
    _fill(config, records)
    params = {"records": records, "value_bytes": 100}
    with TaskStorage(config):  # the running task: lock held while the reader reads
        _reader_seconds(config, records)  # warm-up
        reader_runs = [records / _reader_seconds(config, records) for _ in range(repeats)]
    _open_seconds(config, records)
    open_runs = [records / _open_seconds(config, records) for _ in range(repeats)]
    query = make_row("state query (StateReader)", engine, params, "records/s", reader_runs,
                     baseline="normal open + scan",
                     notes="beside the open task: checkpoint + changelog replay into memory + decode + scan")
    base = make_row("normal open + scan", engine, params, "records/s", open_runs,
                    notes="task stopped: TaskStorage over its local copy (no restore) + scan")
    query["ratio"] = query["median"] / base["median"] if base["median"] else None
    return [query, base]


CACHE = 10_000


def _stack(metered: bool) -> Any:
    return build_store(
        MemoryEngine(), name="bench", key_serde=get_serde("string"), msg_serde=get_serde("json"),
        cache_size=CACHE, batch_size=1_000, metrics=StoreMetrics(), metered=metered,
    )


def _op_rate(metered: bool, op: str, keys: list[str]) -> float:
    store = _stack(metered)
    try:
        value = {"n": 1}
        if op == "put":
            put = store.put
            with Stopwatch() as watch:
                for k in keys:
                    put(k, value)
            return len(keys) / watch.wall
        store.put_all([(k, value) for k in keys])
        get = store.get
        if op == "get (cache hits)":
            hot = keys[:CACHE // 2] * 20
            for k in hot[: CACHE // 2]:
                get(k)  # now cached
            with Stopwatch() as watch:
                for k in hot:
                    get(k)
            return len(hot) / watch.wall
        with Stopwatch() as watch:
            for k in keys:
                get(k)
        return len(keys) / watch.wall
    finally:
        store.close()


METRIC_OPS = ("put", "get", "get (cache hits)")


def _metrics_overhead(records: int, repeats: int) -> list[dict[str, Any]]:
    """Rows per op with and without the metered layer; runs alternate on and off, and
    ``ratio`` is the median of the paired ratios, so load that changes during the run
    (this machine is shared) hits both sides of each pair alike."""
    keys = [f"key{i:013d}" for i in range(records)]
    rows = []
    params = {"records": records, "layers": f"serialized (string/json) + cached ({CACHE})", "pairs": repeats}
    for op in METRIC_OPS:
        runs: dict[bool, list[float]] = {True: [], False: []}
        for metered in (True, False):
            _op_rate(metered, op, keys)  # warm-up
        for _ in range(repeats):
            for metered in (True, False):
                runs[metered].append(_op_rate(metered, op, keys))
        on = make_row(f"{op} with metrics", "memory", params, "ops/s", runs[True], baseline=f"{op} without metrics",
                      notes="metered layer on (the default stack); ratio = median of paired on/off ratios")
        off = make_row(f"{op} without metrics", "memory", params, "ops/s", runs[False],
                       notes="build_store(metered=False)")
        on["ratio"] = statistics.median(a / b for a, b in zip(runs[True], runs[False]))
        rows += [on, off]
    return rows


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """State-query rows for every installed engine of :data:`ENGINES`, then the metrics rows."""
    records = QUICK_RECORDS if quick else FULL_RECORDS
    rows = rows_per_engine(ENGINES, lambda engine, root: _state_query(engine, records, repeats, root),
                           workload="state query (StateReader)", params={"records": records}, unit="records/s",
                           prefix="localstate-query-")
    rows += _metrics_overhead(records // 2, max(repeats, 9))
    return rows

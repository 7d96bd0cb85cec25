"""A/B of the row API and columnar access (``TaskStorage.columns``) for the state work of
one streaming micro-batch (benchmarks/RESULTS.md, "Streaming task path, session 4").

Same process, interleaved, real RocksDB and a real file changelog. Each trial opens a
fresh task and then runs micro-batches of the windowed count's state work: add a grouped
batch of ``(window_start, user_id) -> views`` counts (look up the keys the store holds,
write all of them back), then scan the closed window and delete it. The row side passes
tuples through ``store.get_all`` / ``put_all`` / ``range`` / ``delete_all``, as
``PageViewsPerHour`` did before columnar access. The columnar side passes Arrow columns.
Both must end with the same state (checked). Rates are keys per second of wall time and
of process CPU time. CPU time is the steadier figure on a shared machine.

    python -m localstate.benchmarks.ab_columnar KEYS REPEATS     # e.g. 100000 5 (~1 min)
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from localstate import Config, TaskStorage

BATCHES = 6
HOUR = 3600


def _config(root: Path) -> Config:
    return Config.from_dict({
        "job.name": "ab-columnar", "job.state.dir": str(root / "state"), "systems.file.path": str(root / "log"),
        "stores.hourly.factory": "rocksdb", "stores.hourly.changelog": "file.hourly",
        "stores.hourly.key.serde": "tuple", "stores.hourly.msg.serde": "long",
        "stores.hourly.object.cache.size": 0, "stores.hourly.write.batch.size": 10_000,
    })


def _batch(keys: int, b: int) -> pa.Table:
    """The grouped counts of micro-batch ``b``: every user in the window ``b // 2`` (so each
    window is written twice: once new, once looked up) with a count."""
    return pa.table({"w": pa.array([HOUR * (b // 2)] * keys, pa.int64()),
                     "u": pa.array([f"u{i:07d}" for i in range(keys)]),
                     "n": pa.array([(i + b) % 7 + 1 for i in range(keys)], pa.int64())})


def _row_step(storage: TaskStorage, counts: pa.Table, closing: int) -> int:
    store = storage.store("hourly")
    keys = list(zip(counts.column("w").to_pylist(), counts.column("u").to_pylist()))
    adds = counts.column("n").to_pylist()
    existing = store.get_all(keys)
    store.put_all([(k, existing.get(k, 0) + n) for k, n in zip(keys, adds)])
    closed: list[tuple[Any, int]] = []
    with store.range((0,), (closing,)) as pairs:
        while chunk := pairs.take(65_536):
            closed += chunk
    store.delete_all(list(map(itemgetter(0), closed)))
    return sum(map(itemgetter(1), closed))


def _columnar_step(storage: TaskStorage, counts: pa.Table, closing: int) -> int:
    columns = storage.columns("hourly")
    keys = columns.encode_keys([counts.column("w"), counts.column("u")])
    (stored,) = columns.get_all(keys)
    columns.put_all(keys, [pc.add(counts.column("n").combine_chunks(), pc.fill_null(stored, 0))])
    total, closed = 0, []
    with columns.range((0,), (closing,)) as chunks:
        for chunk in chunks:
            total += pc.sum(chunk.value_columns[0]).as_py() or 0
            closed.append(chunk.keys)
    for done in closed:
        columns.delete_all(done)
    return total


def trial(step: Any, batches: list[pa.Table]) -> tuple[float, float, dict[Any, Any]]:
    """Keys per wall second and per CPU second over the micro-batches, and the final state."""
    root = Path(tempfile.mkdtemp(prefix="ab-columnar-"))
    try:
        with TaskStorage(_config(root)) as storage:
            wall, cpu = time.perf_counter(), time.process_time()
            for b, counts in enumerate(batches):
                step(storage, counts, HOUR * (b // 2))  # closes the window before this one
                storage.commit(input_position=b)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            with storage.store("hourly").all() as pairs:
                state = dict(pairs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keys = sum(t.num_rows for t in batches)
    return keys / wall, keys / cpu, state


def main(keys: int, repeats: int) -> None:
    batches = [_batch(keys, b) for b in range(BATCHES)]
    _, _, row_state = trial(_row_step, batches)  # warm-up pair, outputs compared
    _, _, columnar_state = trial(_columnar_step, batches)
    if row_state != columnar_state:
        raise SystemExit("the row and columnar paths ended with different state")
    rates: dict[str, list[tuple[float, float]]] = {"row": [], "columnar": []}
    for _ in range(repeats):
        for name, step in (("row", _row_step), ("columnar", _columnar_step)):
            wall, cpu, _ = trial(step, batches)
            rates[name].append((wall, cpu))
    print(f"{keys} keys x {BATCHES} micro-batches, rocksdb + file changelog; load {os.getloadavg()}")
    for name, runs in rates.items():
        print(f"{name:9s} wall keys/s {[round(w) for w, _ in runs]} median {statistics.median(w for w, _ in runs):,.0f}"
              f"; CPU keys/s {[round(c) for _, c in runs]} median {statistics.median(c for _, c in runs):,.0f}")
    for i, what in ((0, "wall"), (1, "CPU")):
        ratio = statistics.median(r[i] for r in rates["columnar"]) / statistics.median(r[i] for r in rates["row"])
        print(f"columnar / row ({what}): {ratio:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

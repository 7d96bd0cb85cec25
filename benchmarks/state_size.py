"""How write and read cost grow with state size: rocksdb + file changelog vs raw rocksdict.

One sweep per trial fills a store with random 16-byte keys / 100-byte values, 10,000
per commit (``put_all`` then ``commit()``: changelog append + fsync, engine persist,
task checkpoint), and at each size of :data:`SIZES` records

* ``state_size.put_all`` — the write rate of the stretch that ended at that size (the
  marginal cost of a write *at* that state size, not an average since empty);
* ``state_size.get`` — per-record ``get`` of keys written earlier, random order.

Raw rocksdict does the same with one ``WriteBatch`` per 10,000 keys and ``db.get``, with
the engine's native options, in the same run (ours and raw alternate per repeat). Every
size from 1M keys on holds more data than the default 50 MiB block cache.

CI form (``quick``): 20k and 50k keys. Default: up to 3M keys. The full sweep to 10M
(about 5 minutes per repeat on 2 cores) runs with ``LOCALSTATE_FULL=1`` or::

    python -m localstate.benchmarks.state_size --max-keys 10000000 --repeats 3

``--every-commit`` adds ours with a snapshot at every commit
(``rocksdb.snapshot.interval.records = 0``) to the same run;
``--no-write-behind`` adds ours with rocksdb's write-behind buffer off (each batch from the
layers written as it comes, unsorted).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .runner import add_ratios, make_row
from .timing import Stopwatch

__all__ = ["run", "sweep_ours", "sweep_raw", "SIZES", "NO_WRITE_BEHIND"]

KEY_BYTES = 16
VALUE_BYTES = 100
COMMIT_EVERY = 10_000
GETS_PER_SIZE = 20_000
SIZES = (100_000, 300_000, 1_000_000, 3_000_000, 10_000_000)
QUICK_SIZES = (20_000, 50_000)
_VALUE = random.Random(7).randbytes(VALUE_BYTES)


def _chunk_keys(chunk: int) -> list[bytes]:
    """The keys of commit ``chunk``: random, regenerated on demand (10M keys held in
    Python would cost ~0.5 GB and slow both sides alike)."""
    blob = random.Random(chunk).randbytes(KEY_BYTES * COMMIT_EVERY)
    return [blob[i : i + KEY_BYTES] for i in range(0, len(blob), KEY_BYTES)]


def _probe_keys(written_chunks: int, n: int, seed: int) -> list[bytes]:
    """``n`` keys already written, from random earlier commits, in random order."""
    rng = random.Random(seed)
    out: list[bytes] = []
    while len(out) < n:
        keys = _chunk_keys(rng.randrange(written_chunks))
        out += rng.sample(keys, min(len(keys), n - len(out), 1000))
    return out


Trial = tuple[int, float, float, float]
"""``(size, writes/s, gets/s, writes per second of the main thread's CPU)``."""


def _sweep(sizes: tuple[int, ...], write_chunk: Callable[[int], None], get: Callable[[bytes], Any]) -> Iterator[Trial]:
    """Fill to each size in turn; yield ``(size, writes/s of the last stretch, gets/s,
    writes/s of the main thread's CPU in that stretch)``. The CPU figure is the work done
    on the task's thread (RocksDB's writes hold it; its compactions and the disk's
    fsync wait do not count), steadier than wall time on a shared machine."""
    chunk = 0
    for size in sizes:
        target = size // COMMIT_EVERY
        first = chunk
        with Stopwatch(cpu=True) as watch:
            while chunk < target:
                write_chunk(chunk)
                chunk += 1
        written = (chunk - first) * COMMIT_EVERY
        writes = written / watch.wall
        writes_cpu = written / max(watch.thread, 1e-9)
        probes = _probe_keys(chunk, min(GETS_PER_SIZE, size), seed=size)
        with Stopwatch() as watch:
            for k in probes:
                if get(k) is None:
                    raise RuntimeError(f"state-size sweep: key {k!r} written earlier is missing")
        gets = len(probes) / watch.wall
        yield size, writes, gets, writes_cpu


def sweep_ours(sizes: tuple[int, ...], root: Path, snapshot_interval: int | None = None,
               write_behind: bool = True) -> list[Trial]:
    """The sweep through ``TaskStorage`` (rocksdb + file changelog, bytes serdes, default
    cache); ``snapshot_interval`` sets ``rocksdb.snapshot.interval.records`` (0: a
    snapshot at every commit); ``write_behind=False`` turns rocksdb's
    write-behind buffer off for this sweep."""
    from localstate import Config, TaskStorage
    from localstate.engines.rocksdb import RocksDBEngine

    if not write_behind:
        with _no_write_behind(RocksDBEngine):
            return sweep_ours(sizes, root, snapshot_interval)

    extra = {} if snapshot_interval is None else {"stores.kv.rocksdb.snapshot.interval.records": snapshot_interval}
    config = Config.from_dict({**extra,
        "job.name": "state-size",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.kv.factory": "rocksdb",
        "stores.kv.changelog": "file.kv-log",
        "stores.kv.key.serde": "bytes",
        "stores.kv.msg.serde": "bytes",
    })
    with TaskStorage(config) as storage:
        store = storage.store("kv")
        put_all, commit = store.put_all, storage.commit

        def write_chunk(chunk: int) -> None:
            put_all([(k, _VALUE) for k in _chunk_keys(chunk)])
            commit(input_position=chunk)

        return list(_sweep(sizes, write_chunk, store.get))


def sweep_raw(sizes: tuple[int, ...], root: Path) -> list[Trial]:
    """The same sweep on raw rocksdict: one ``WriteBatch`` per commit's keys, same options."""
    import rocksdict
    from localstate.engines.rocksdb import RocksDBOptions

    db = rocksdict.Rdict(str(root / "raw"), RocksDBOptions().to_native())
    try:
        def write_chunk(chunk: int) -> None:
            batch = rocksdict.WriteBatch(raw_mode=True)
            put = batch.put
            for k in _chunk_keys(chunk):
                put(k, _VALUE)
            db.write(batch)

        return list(_sweep(sizes, write_chunk, db.get))
    finally:
        db.close()


@contextmanager
def _no_write_behind(engine_class: Any) -> Iterator[None]:
    """rocksdb's write-behind buffer off while inside (a class setting, restored after)."""
    saved = engine_class.write_behind_records
    engine_class.write_behind_records = 0
    try:
        yield
    finally:
        engine_class.write_behind_records = saved


def _scratch(prefix: str, body: Callable[[Path], Any]) -> Any:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return body(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


EVERY_COMMIT = "localstate rocksdb, snapshot every commit"
NO_WRITE_BEHIND = "localstate rocksdb, no write-behind"


def run(quick: bool = False, repeats: int = 5, sizes: tuple[int, ...] | None = None,
        every_commit: bool = False, no_write_behind: bool = False) -> list[dict[str, Any]]:
    """The sweep, ours and raw alternating per repeat; at most 3 repeats (each is a whole
    fill, so the first stretch of every sweep is its own warm-up). ``every_commit`` adds
    ours with ``snapshot.interval.records = 0`` (a snapshot at every commit);
    ``no_write_behind`` adds ours without rocksdb's write-behind buffer."""
    if sizes is None:
        full = os.environ.get("LOCALSTATE_FULL") == "1"
        sizes = QUICK_SIZES if quick else SIZES if full else SIZES[:4]
    repeats = min(repeats, 2) if quick else max(1, min(repeats, 3))
    sides: dict[str, Callable[[tuple[int, ...], Path], list[Trial]]] = {
        "localstate rocksdb": sweep_ours, "raw rocksdict": sweep_raw,
    }
    if every_commit:
        sides[EVERY_COMMIT] = lambda sizes, root: sweep_ours(sizes, root, snapshot_interval=0)
    if no_write_behind:
        sides[NO_WRITE_BEHIND] = lambda sizes, root: sweep_ours(sizes, root, write_behind=False)
    runs: dict[str, list[list[Trial]]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, sweep in sides.items():
            runs[name].append(_scratch("state-size-", lambda root, sweep=sweep: sweep(sizes, root)))
    rows: list[dict[str, Any]] = []
    for name, trials in runs.items():
        for i, size in enumerate(sizes):
            params = {"keys": size, "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES, "commit_every": COMMIT_EVERY}
            baseline = None if name == "raw rocksdict" else "raw rocksdict"
            rows.append(make_row("state_size.put_all", name, params, "writes/s", [t[i][1] for t in trials],
                                 baseline=baseline, notes="writes/s of the stretch ending at this size; "
                                 "ours: put_all + commit (file changelog, fsync) per 10k"))
            rows.append(make_row("state_size.put_all.cpu", name, params, "writes/cpu-s", [t[i][3] for t in trials],
                                 baseline=baseline, notes="writes per second of the main thread's CPU "
                                 "(thread_time) in the same stretch"))
            rows.append(make_row("state_size.get", name, {**params, "gets": min(GETS_PER_SIZE, size)}, "gets/s",
                                 [t[i][2] for t in trials], baseline=baseline,
                                 notes="per-record get of earlier keys, random order"))
    add_ratios(rows)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-keys", type=int, default=SIZES[3], help="largest state size of the sweep")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every-commit", action="store_true",
                        help="also ours with a snapshot at every commit (snapshot.interval.records = 0)")
    parser.add_argument("--no-write-behind", action="store_true",
                        help="also ours with rocksdb's write-behind buffer off (the behaviour before it)")
    args = parser.parse_args(argv)
    sizes = tuple(s for s in SIZES if s <= args.max_keys) or (args.max_keys,)
    rows = run(repeats=args.repeats, sizes=sizes, every_commit=args.every_commit,
               no_write_behind=args.no_write_behind)
    print(f"{'workload':<22} {'engine':<42} {'keys':>10} {'median':>12} {'ratio':>6}  runs")
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        runs = ", ".join(f"{x:,.0f}" for x in r["runs"])
        print(f"{r['workload']:<22} {r['engine']:<42} {r['params']['keys']:>10,} {r['median']:>12,.0f} {ratio:>6}  [{runs}]")


if __name__ == "__main__":
    main()

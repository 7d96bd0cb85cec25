"""The key-value engine figures: the ``rocksdb`` and ``leveldb`` engines against rocksdict/plyvel.

1M records (``quick``: a few thousand), 16-byte keys, 100-byte values:

* ``kv_put`` — per-record ``put`` through ``TaskStorage(...).store()`` (string key serde,
  json value serde, object cache, logged to the fsync'd file changelog, a commit every
  10,000 writes) vs the raw library putting the same encoded records in write batches
  of 10,000 (target: ours ≤ 1.5× slower, i.e. ratio ≥ 0.67); ``kv_put_all`` does the
  same through the store's ``put_all`` in chunks of 10,000;
* ``kv_update_all`` — the Spark jobs' pattern on a loaded store: per batch of 50,000
  events on random keys, ``get_all`` of the keys, then ``put_all`` of the updated
  values, a commit per batch (events/s), vs the raw library's multi-get (plyvel: a loop
  of gets) and write batch of the same encoded records;
* ``kv_get_cold`` / ``kv_get_hot`` — 100,000 random point reads on a freshly opened
  database (empty block cache; the OS page cache is not dropped) and again on the same
  keys, through the engine's ``get`` and ``get_all`` (chunks of 1,000) vs the raw
  library's ``get`` and multi-get (plyvel has none: a loop of gets);
* ``kv_restore`` — a full restore from the file changelog into an empty store, as
  ``TaskStorage`` runs it at open (RocksDB: write batches in changelog order, no WAL —
  ``restore.mode = batch``; LevelDB: sorted write batches), records/s and MB/s of changelog bytes (target: RocksDB
  ≥ 1M records/s), vs the raw library loading the same decoded records from memory
  (rocksdict: sorted SST write + ingest; plyvel: write batches); ``kv_restore_1k`` the
  same with 1 KB values (target ≥ 100 MB/s) on 250,000 records;
* ``kv_restore_incremental`` — seconds to reopen after 1% of the keys changed when the
  local copy stands at the previous commit (RocksDB: its older snapshot; LevelDB: a copy
  of the database at that commit), vs a full restore of the same state (ratio).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable
from itertools import repeat, starmap
from pathlib import Path
from typing import Any

import orjson
from localstate import Config, TaskStorage
from localstate.checkpoint import Checkpoint
from localstate.engine import StoreContext
from localstate.store_open import open_system

from .core_figures import json_values
from .runner import add_ratios, make_row
from .timing import Stopwatch, repeat_trials

__all__ = ["run"]

ENGINES = ("rocksdb", "leveldb")
KEY_SIZE = 16
VALUE_SIZE = 100
COMMIT_EVERY = 10_000
GET_SAMPLE = 100_000
MULTI_GET_CHUNK = 1_000


def _keys(n: int) -> list[bytes]:
    order = list(range(n))
    random.Random(3).shuffle(order)
    return [b"user:%011d" % i for i in order]


def _values(size: int, pool: int = 1000) -> list[bytes]:
    rng = random.Random(4)
    # half random, half repeated bytes: compresses about 2:1, like typical JSON state
    return [rng.randbytes(size // 2) + bytes([65 + i % 26]) * (size - size // 2) for i in range(pool)]


def _config(root: Path, engine: str, *, stream: str = "kv-log") -> Config:
    return Config.from_dict({
        "job.name": "kvb",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.kv.factory": engine,
        "stores.kv.changelog": f"file.{stream}",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
    })


# -- writes ----------------------------------------------------------------------------------
def _put_rows(n: int, repeats: int) -> list[dict[str, Any]]:
    import plyvel
    import rocksdict
    from localstate.engines.leveldb import LevelDBOptions
    from localstate.engines.rocksdb import RocksDBOptions

    keys = [k.decode() for k in _keys(n)]
    objs = json_values(1000)
    nvals = len(objs)
    encoded = [(k.encode(), orjson.dumps(objs[i % nvals])) for i, k in enumerate(keys)]
    every = min(COMMIT_EVERY, max(1, n // 10))
    params = {"records": n, "key_size": KEY_SIZE, "value_size": VALUE_SIZE, "commit_every": every,
              "key_serde": "string", "msg_serde": "json", "changelog": "file (fsync)"}

    def stack(engine: str, batched: bool) -> float:
        root = Path(tempfile.mkdtemp(prefix="kvb-put-"))
        try:
            config = _config(root, engine)
            with Stopwatch() as watch:
                with TaskStorage(config) as storage:
                    store = storage.store("kv")
                    put, put_all, commit = store.put, store.put_all, storage.commit
                    for start in range(0, n, every):
                        stop = min(start + every, n)
                        if batched:
                            put_all([(keys[i], objs[i % nvals]) for i in range(start, stop)])
                        else:
                            for i in range(start, stop):
                                put(keys[i], objs[i % nvals])
                        commit(input_position=stop)
            return n / watch.wall
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def raw_rocksdict() -> float:
        root = Path(tempfile.mkdtemp(prefix="kvb-raw-"))
        try:
            with Stopwatch() as watch:
                db = rocksdict.Rdict(str(root / "db"), RocksDBOptions().to_native())
                for start in range(0, n, every):
                    batch = rocksdict.WriteBatch(raw_mode=True)
                    deque(starmap(batch.put, encoded[start : start + every]), 0)
                    db.write(batch)
                db.flush()
                db.close()
            return n / watch.wall
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def raw_plyvel() -> float:
        root = Path(tempfile.mkdtemp(prefix="kvb-raw-"))
        try:
            with Stopwatch() as watch:
                db = plyvel.DB(str(root / "db"), **LevelDBOptions().to_options())
                for start in range(0, n, every):
                    batch = db.write_batch()
                    deque(starmap(batch.put, encoded[start : start + every]), 0)
                    batch.write()
                db.close()
            return n / watch.wall
        finally:
            shutil.rmtree(root, ignore_errors=True)

    rows = []
    for engine, raw_name, raw in (("rocksdb", "rocksdict", raw_rocksdict), ("leveldb", "plyvel", raw_plyvel)):
        rows.append(make_row("kv_put", engine, params, "ops/s", repeat_trials(lambda e=engine: stack(e, False), repeats),
                             baseline=raw_name, notes="per-record put via TaskStorage.store(), commits included; "
                             "target ratio >= 0.67 (<= 1.5x slower than raw)"))
        rows.append(make_row("kv_put_all", engine, params, "ops/s", repeat_trials(lambda e=engine: stack(e, True), repeats),
                             baseline=raw_name, notes=f"store.put_all in chunks of {every}, commits included"))
        raw_runs = repeat_trials(raw, repeats)
        for workload in ("kv_put", "kv_put_all"):
            rows.append(make_row(workload, raw_name, params, "ops/s", raw_runs,
                                 notes=f"raw {raw_name}: encoded records in write batches of {every}"))
    return rows


UPDATE_BATCH = 50_000


def _update_rows(n: int, repeats: int) -> list[dict[str, Any]]:
    import plyvel
    import rocksdict
    from localstate.engines.leveldb import LevelDBOptions
    from localstate.engines.rocksdb import RocksDBOptions

    keys = [k.decode() for k in _keys(n)]
    objs = json_values(1000)
    rng = random.Random(6)
    batch = min(UPDATE_BATCH, n)
    events = [[keys[rng.randrange(n)] for _ in range(batch)] for _ in range(max(1, n // batch))]
    encoded_events = [[k.encode() for k in ks] for ks in events]
    value = orjson.dumps(objs[0])
    total = sum(map(len, events))
    params = {"records": n, "events": total, "batch": batch, "key_serde": "string", "msg_serde": "json",
              "changelog": "file (fsync)"}

    def stack(engine: str) -> float:
        root = Path(tempfile.mkdtemp(prefix="kvb-upd-"))
        try:
            with TaskStorage(_config(root, engine)) as storage:  # setup, untimed
                store = storage.store("kv")
                for start in range(0, n, COMMIT_EVERY):
                    store.put_all([(keys[i], objs[i % len(objs)]) for i in range(start, min(start + COMMIT_EVERY, n))])
                storage.commit(input_position=0)
                with Stopwatch() as watch:
                    for position, ks in enumerate(events, 1):
                        current = store.get_all(ks)
                        store.put_all([(k, {**current[k], "seen": position}) for k in ks])
                        storage.commit(input_position=position)
                return total / watch.wall
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def raw(engine: str) -> float:
        root = Path(tempfile.mkdtemp(prefix="kvb-upd-raw-"))
        try:
            if engine == "rocksdict":
                rdb = rocksdict.Rdict(str(root / "db"), RocksDBOptions().to_native())
                db: Any = rdb

                def write_batch(batch_keys: Any) -> None:
                    batch = rocksdict.WriteBatch(raw_mode=True)
                    deque(map(batch.put, batch_keys, repeat(value)), 0)
                    rdb.write(batch)

                multi_get: Callable[[list[bytes]], Any] = rdb.get
            else:
                ldb = plyvel.DB(str(root / "db"), **LevelDBOptions().to_options())
                db = ldb

                def write_batch(batch_keys: Any) -> None:
                    with ldb.write_batch() as batch:
                        deque(map(batch.put, batch_keys, repeat(value)), 0)

                def multi_get(batch_keys: list[bytes]) -> Any:  # plyvel has no multi-get
                    return list(map(ldb.get, batch_keys))

            for start in range(0, n, COMMIT_EVERY):  # setup, untimed
                write_batch([keys[i].encode() for i in range(start, min(start + COMMIT_EVERY, n))])
            with Stopwatch() as watch:
                for ks in encoded_events:
                    multi_get(ks)
                    write_batch(ks)
            elapsed = watch.wall
            db.close()
            return total / elapsed
        finally:
            shutil.rmtree(root, ignore_errors=True)

    rows = []
    for engine, raw_name in (("rocksdb", "rocksdict"), ("leveldb", "plyvel")):
        rows.append(make_row("kv_update_all", engine, params, "events/s", repeat_trials(lambda e=engine: stack(e), repeats),
                             baseline=raw_name, notes=f"get_all + put_all per batch of {batch} events, a commit "
                             "per batch; target for Spark jobs: >= 1M events/s per core of state work"))
        rows.append(make_row("kv_update_all", raw_name, params, "events/s",
                             repeat_trials(lambda r=raw_name: raw(r), repeats),
                             notes=f"raw {raw_name}: multi-get and write batch of the encoded records per batch"))
    return rows


# -- reads -----------------------------------------------------------------------------------
def _get_rows(n: int, repeats: int) -> list[dict[str, Any]]:
    import plyvel
    import rocksdict
    from localstate.engines.leveldb import LevelDBEngine, LevelDBOptions
    from localstate.engines.rocksdb import RocksDBEngine, RocksDBOptions

    keys = _keys(n)
    values = _values(VALUE_SIZE)
    pairs = [(k, values[i % len(values)]) for i, k in enumerate(keys)]
    sample = random.Random(5).sample(keys, min(GET_SAMPLE, n))  # distinct: get_all returns a dict
    chunks = [sample[i : i + MULTI_GET_CHUNK] for i in range(0, len(sample), MULTI_GET_CHUNK)]
    params = {"records": n, "gets": len(sample), "multi_get_chunk": MULTI_GET_CHUNK,
              "key_size": KEY_SIZE, "value_size": VALUE_SIZE}
    root = Path(tempfile.mkdtemp(prefix="kvb-get-"))
    rows: list[dict[str, Any]] = []
    try:
        ours = {
            "rocksdb": lambda: RocksDBEngine(StoreContext.local(root / "rocksdb", "bench")),
            "leveldb": lambda: LevelDBEngine(StoreContext.local(root / "leveldb", "bench")),
        }
        raws = {
            "rocksdict": lambda: rocksdict.Rdict(str(root / "rocksdict"), RocksDBOptions().to_native()),
            "plyvel": lambda: plyvel.DB(str(root / "plyvel"), **LevelDBOptions().to_options()),
        }
        for opener in ours.values():  # setup, untimed
            e = opener()
            e.put_all(pairs)
            e.close()
        for name, opener in raws.items():
            db = opener()
            if name == "rocksdict":
                batch = rocksdict.WriteBatch(raw_mode=True)
                deque(starmap(batch.put, pairs), 0)
                db.write(batch)
            else:
                with db.write_batch() as batch:
                    deque(starmap(batch.put, pairs), 0)
            db.close()

        def measure(opener: Callable[[], Any], read: Callable[[Any], int]) -> tuple[list[float], list[float]]:
            cold, hot = [], []
            for i in range(repeats + 1):
                db = opener()
                try:
                    with Stopwatch() as first:
                        found = read(db)
                    with Stopwatch() as second:
                        read(db)
                finally:
                    db.close()
                if found != len(sample):
                    raise RuntimeError(f"found {found} of {len(sample)} keys")
                if i:  # the first round is the warm-up
                    cold.append(len(sample) / first.wall)
                    hot.append(len(sample) / second.wall)
            return cold, hot

        def point(db: Any) -> int:
            get = db.get
            return sum(get(k) is not None for k in sample)

        def engine_multi(db: Any) -> int:
            return sum(len(db.get_all(c)) for c in chunks)

        def rocksdict_multi(db: Any) -> int:
            return sum(sum(v is not None for v in db.get(c)) for c in chunks)

        cases = [
            ("rocksdb", "get", ours["rocksdb"], point, "rocksdict"),
            ("rocksdb", "get_all", ours["rocksdb"], engine_multi, "rocksdict multi-get"),
            ("rocksdict", "get", raws["rocksdict"], point, None),
            ("rocksdict multi-get", "get", raws["rocksdict"], rocksdict_multi, None),
            ("leveldb", "get", ours["leveldb"], point, "plyvel"),
            ("leveldb", "get_all", ours["leveldb"], engine_multi, "plyvel"),
            ("plyvel", "get", raws["plyvel"], point, None),
        ]
        for engine, how, opener, read, baseline in cases:
            cold, hot = measure(opener, read)
            label = engine if how == "get" or engine.endswith("multi-get") else f"{engine} get_all"
            note = f"{how} of {len(sample)} random present keys on the engine (no layers)"
            if engine in raws or engine.endswith("multi-get"):
                note = f"raw library, {'multi-get in chunks' if 'multi' in engine else 'point gets'}"
            rows.append(make_row("kv_get_cold", label, params, "ops/s", cold, baseline=baseline,
                                 notes=note + "; database just opened (empty block cache)"))
            rows.append(make_row("kv_get_hot", label, params, "ops/s", hot, baseline=baseline,
                                 notes=note + "; same keys read again"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


# -- restore ---------------------------------------------------------------------------------
def _write_changelog(root: Path, engine: str, pairs: list[tuple[bytes, bytes]]) -> int:
    """Append ``pairs`` to the store's changelog and commit a checkpoint covering them."""
    config = _config(root, engine)
    system = open_system(config, "file")
    try:
        part = system.open_partition("kv-log", 0, 1)
        for i in range(0, len(pairs), 50_000):
            part.append(pairs[i : i + 50_000])
        end = part.flush()
        part.close()
        system.checkpoints().write("kvb", 0, Checkpoint(version=1, input_position=None, offsets={"kv": end}))
    finally:
        system.close()
    return end


def _restore_rows(workload: str, n: int, value_size: int, repeats: int) -> list[dict[str, Any]]:
    import plyvel
    import rocksdict
    from localstate.engines.leveldb import LevelDBOptions
    from localstate.engines.rocksdb import RocksDBOptions

    keys = _keys(n)
    values = _values(value_size)
    pairs = [(k, values[i % len(values)]) for i, k in enumerate(keys)]
    data_mb = sum(len(k) + len(v) for k, v in pairs) / 1e6
    params = {"records": n, "key_size": KEY_SIZE, "value_size": value_size, "changelog": "file"}
    rows: list[dict[str, Any]] = []
    for engine in ENGINES:
        root = Path(tempfile.mkdtemp(prefix="kvb-restore-"))
        try:
            _write_changelog(root, engine, pairs)
            config = _config(root, engine)
            store_dir = root / "state" / "kvb" / "kv"

            def trial(config: Config = config, store_dir: Path = store_dir) -> tuple[float, float]:
                shutil.rmtree(store_dir, ignore_errors=True)
                with TaskStorage(config) as storage:
                    r = storage.last_restore["kv"]
                if r.records != n:
                    raise RuntimeError(f"restored {r.records} records, expected {n}")
                return r.records / r.seconds, r.bytes / 1e6 / r.seconds

            trial()
            runs = [trial() for _ in range(repeats)]
        finally:
            shutil.rmtree(root, ignore_errors=True)
        how = "write batches in changelog order (no WAL)" if engine == "rocksdb" else "dedupe + sorted write batches"
        raw = "rocksdict" if engine == "rocksdb" else "plyvel"
        rows.append(make_row(workload, engine, params, "records/s", [r for r, _ in runs], baseline=raw,
                             notes=f"TaskStorage open of an empty store: changelog read + {how}"))
        rows.append(make_row(workload, engine, params, "MB/s", [m for _, m in runs], baseline=raw,
                             notes="changelog bytes per second (batch headers included)"))

    sorted_pairs = sorted(pairs)

    def raw_rocksdict() -> float:
        root = Path(tempfile.mkdtemp(prefix="kvb-raw-"))
        try:
            native = RocksDBOptions().to_native()
            with Stopwatch() as watch:
                writer = rocksdict.SstFileWriter(native)
                writer.open(str(root / "bulk.sst"))
                deque(starmap(writer.__setitem__, sorted_pairs), 0)
                writer.finish()
                db = rocksdict.Rdict(str(root / "db"), native)
                db.ingest_external_file([str(root / "bulk.sst")])
                db.close()
            return n / watch.wall
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def raw_plyvel() -> float:
        root = Path(tempfile.mkdtemp(prefix="kvb-raw-"))
        try:
            with Stopwatch() as watch:
                db = plyvel.DB(str(root / "db"), **LevelDBOptions().to_options())
                for i in range(0, n, 100_000):
                    with db.write_batch() as batch:
                        deque(starmap(batch.put, sorted_pairs[i : i + 100_000]), 0)
                db.close()
            return n / watch.wall
        finally:
            shutil.rmtree(root, ignore_errors=True)

    for raw_name, raw in (("rocksdict", raw_rocksdict), ("plyvel", raw_plyvel)):
        runs = repeat_trials(raw, repeats)
        what = "sorted SST write + ingest" if raw_name == "rocksdict" else "sorted write batches of 100k"
        rows.append(make_row(workload, raw_name, params, "records/s", runs,
                             notes=f"raw {raw_name}: {what} of the decoded records, already in memory and sorted"))
        rows.append(make_row(workload, raw_name, params, "MB/s", [r * data_mb / n for r in runs],
                             notes="key + value bytes per second"))
    return rows


def _incremental_rows(n: int, repeats: int) -> list[dict[str, Any]]:
    keys = [k.decode() for k in _keys(n)]
    objs = json_values(1000)
    changed = max(1, n // 100)
    params = {"records": n, "changed": changed, "key_size": KEY_SIZE, "value_size": VALUE_SIZE}
    rows: list[dict[str, Any]] = []
    for engine in ENGINES:
        root = Path(tempfile.mkdtemp(prefix="kvb-incr-"))
        try:
            config = _config(root, engine)
            store_dir = root / "state" / "kvb" / "kv" / "0"
            with TaskStorage(config) as storage:
                store = storage.store("kv")
                for i in range(0, n, COMMIT_EVERY):
                    store.put_all([(keys[j], objs[j % 1000]) for j in range(i, min(i + COMMIT_EVERY, n))])
                storage.commit(1)
            saved = root / "db-at-first-commit"
            shutil.copytree(store_dir / "db", saved)
            with TaskStorage(config) as storage:
                storage.store("kv").put_all([(k, {"changed": True}) for k in keys[:changed]])
                storage.commit(2)

            def incremental(engine: str = engine, store_dir: Path = store_dir, saved: Path = saved,
                            config: Config = config) -> float:
                if engine == "rocksdb":
                    # the local copy stands at the first commit: no clean-close claim (as after
                    # a crash) and no snapshot after the first commit's (a restore re-takes one)
                    (store_dir / "db.clean").unlink(missing_ok=True)
                    for snapshot in sorted((store_dir / "snapshots").iterdir())[1:]:
                        shutil.rmtree(snapshot)
                else:
                    shutil.rmtree(store_dir / "db")
                    shutil.copytree(saved, store_dir / "db")
                with Stopwatch() as watch:  # the open, not the close
                    storage = TaskStorage(config)
                with storage:
                    replayed = storage.last_restore["kv"].records
                    if replayed != changed:
                        raise RuntimeError(f"replayed {replayed} records, expected {changed}")
                return watch.wall

            def full(store_dir: Path = store_dir, config: Config = config) -> float:
                shutil.rmtree(store_dir)
                with Stopwatch() as watch:  # the open, not the close
                    storage = TaskStorage(config)
                storage.close()
                return watch.wall

            inc_runs = repeat_trials(incremental, repeats)
            full_runs = repeat_trials(full, repeats)  # last: a full restore leaves a single snapshot
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append(make_row("kv_restore_incremental", engine, params, "s", inc_runs, baseline=f"{engine} full",
                             notes=f"TaskStorage open replaying only the {changed} changed records (1%) on the "
                                   "local copy of the previous commit"))
        rows.append(make_row("kv_restore_incremental", f"{engine} full", params, "s", full_runs,
                             notes="TaskStorage open with no local copy: full restore of the same state"))
    return rows


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """The engine figures (warm-up, then ``repeats`` timed runs each), raw libraries alongside."""
    n = 2_000 if quick else 1_000_000
    n_1k = 1_000 if quick else 250_000
    rows = _put_rows(n, repeats)
    rows += _update_rows(n, repeats)
    rows += _get_rows(n, repeats)
    rows += _restore_rows("kv_restore", n, VALUE_SIZE, repeats)
    rows += _restore_rows("kv_restore_1k", n_1k, 1024, repeats)
    rows += _incremental_rows(n, repeats)
    add_ratios(rows)
    return rows

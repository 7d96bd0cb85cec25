"""Generic key-value workloads over any engine, and the targets they run against.

A :class:`Target` is what a workload is measured on:

* ``store`` — the store a task sees: ``TaskStorage(config).store(...)`` with the
  object cache, the bytes serdes and the changelog (``--changelog``), commits included;
* ``engine`` — the raw engine under it (``TaskStorage.engine``), no layers, no log;
* ``baseline`` — the raw library without localstate: a plain ``dict``, ``rocksdict``,
  ``plyvel``.

Every target is driven through one small :class:`Handle` API (bytes keys and values),
so a workload is written once. Keys are big-endian record numbers of ``key_size``
bytes (so sequential order is key order); values are distinct random bytes.
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from localstate.config import Config
from localstate.errors import ConfigError
from localstate.kv import KeyValueStore
from localstate.metrics import RestoreProgress
from localstate.registry import ENGINES, did_you_mean, resolve_factory
from localstate.storage import TaskStorage

from .registry import FOOTPRINT, GENERIC_SUITE, Trial, Workload, workload
from .runner import (
    BenchParams,
    add_ratios,
    current_rss_bytes,
    describe_error,
    dir_bytes,
    error_row,
    make_row,
    peak_rss_bytes,
    time_trials,
)

__all__ = ["Target", "Handle", "targets_for", "BASELINES", "Dataset", "footprint", "run_generic", "NotApplicable"]

STORE = "bench"


# -- data -----------------------------------------------------------------------------------
@dataclass
class Dataset:
    """Keys and values of one parameter set, generated once (setup is never timed)."""

    keys: list[bytes]
    values: list[bytes]
    missing: list[bytes]

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.keys)) + sum(map(len, self.values))


@lru_cache(maxsize=2)
def dataset(params: BenchParams) -> Dataset:
    n, ks = params.records, params.key_size
    keys = [i.to_bytes(ks, "big") for i in range(n)]
    missing = [(n + i).to_bytes(ks, "big") for i in range(n)]
    rng = random.Random(params.seed)
    pool = rng.randbytes(params.value_size + 4096)
    vs = params.value_size
    values = [pool[i % 4096 : i % 4096 + vs] for i in range(n)]
    # distinct values: stamp the record number into the first bytes
    stamp = min(vs, 4)
    values = [i.to_bytes(8, "big")[-stamp:] + v[stamp:] for i, v in enumerate(values)]
    return Dataset(keys, values, missing)


def key_order(params: BenchParams, n: int, distribution: str | None = None) -> list[int]:
    """``n`` record numbers drawn by ``distribution`` (default ``params.distribution``)."""
    dist = distribution or params.distribution
    rng = random.Random(params.seed + n)
    size = params.records
    if dist == "sequential":
        return [i % size for i in range(n)]
    if dist == "uniform":
        if n == size:
            order = list(range(size))
            rng.shuffle(order)
            return order
        return [rng.randrange(size) for _ in range(n)]
    return zipf_sample(size, n, params.zipf_s, rng)


def zipf_sample(size: int, n: int, s: float, rng: random.Random) -> list[int]:
    """``n`` draws over ``size`` items with Zipf(s) popularity; hot items are scattered."""
    cum = list(itertools.accumulate(1.0 / (r ** s) for r in range(1, size + 1)))
    ranks = rng.choices(range(size), cum_weights=cum, k=n)
    scatter = list(range(size))
    rng.shuffle(scatter)
    return [scatter[r] for r in ranks]


# -- handles --------------------------------------------------------------------------------
class Handle:
    """A bytes key-value target opened for one trial.

    Subclasses bind the library's own methods as ``put``/``get``/... attributes where
    they fit, so a workload's hot loop calls the library directly.
    """

    path: Path

    def put(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def put_all(self, pairs: list[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def get_all(self, keys: list[bytes]) -> Any:
        raise NotImplementedError

    def delete(self, key: bytes) -> None:
        raise NotImplementedError

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        """Read records of ``[start, stop)`` in key order (at most ``limit``); return how many."""
        raise NotImplementedError

    def commit(self) -> None:
        """Make writes visible and durable as the target does at a commit point."""

    def close(self) -> None:
        raise NotImplementedError


def _count(it: Iterator[Any], limit: int | None) -> int:
    n = 0
    if limit is None:
        for _ in it:
            n += 1
    else:
        for _ in itertools.islice(it, limit):
            n += 1
    return n


class KVHandle(Handle):
    """A localstate :class:`KeyValueStore` (the layered store or the raw engine)."""

    def __init__(self, storage: TaskStorage, kv: KeyValueStore[bytes, bytes], path: Path, commit: bool) -> None:
        self.storage, self.kv, self.path, self._commit = storage, kv, path, commit
        self.put = kv.put  # type: ignore[method-assign]
        self.get = kv.get  # type: ignore[method-assign]
        self.delete = kv.delete  # type: ignore[method-assign]
        self.put_all = kv.put_all  # type: ignore[method-assign]
        self.get_all = kv.get_all  # type: ignore[method-assign]

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        with self.kv.range(start, stop) as it:
            return _count(it, limit)

    def commit(self) -> None:
        if self._commit:
            self.storage.commit()
        else:
            self.kv.flush()

    def close(self) -> None:
        self.storage.close()


class DictHandle(Handle):
    """A plain ``dict`` (no order: range scans are not applicable)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        d: dict[bytes, bytes] = {}
        self.d = d
        self.put = d.__setitem__  # type: ignore[method-assign]
        self.get = d.get  # type: ignore[method-assign]
        self.put_all = d.update  # type: ignore[method-assign]

    def get_all(self, keys: list[bytes]) -> Any:
        get = self.d.get
        return [get(k) for k in keys]

    def delete(self, key: bytes) -> None:
        self.d.pop(key, None)

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        if start is not None or stop is not None:
            raise NotApplicable("a plain dict has no key order, so no range scans")
        return _count(iter(self.d.items()), limit)

    def close(self) -> None:
        self.d = {}


class RocksdictHandle(Handle):
    """Raw ``rocksdict`` in raw (bytes) mode; batches via ``WriteBatch``."""

    def __init__(self, path: Path) -> None:
        from rocksdict import Options, Rdict, WriteBatch

        self.path = path
        self._wb = WriteBatch
        self.db = Rdict(str(path), Options(raw_mode=True))
        self.put = self.db.put  # type: ignore[method-assign]
        self.get = self.db.get  # type: ignore[method-assign]
        self.delete = self.db.delete  # type: ignore[method-assign]

    def put_all(self, pairs: list[tuple[bytes, bytes]]) -> None:
        wb = self._wb(raw_mode=True)
        put = wb.put
        for k, v in pairs:
            put(k, v)
        self.db.write(wb)

    def get_all(self, keys: list[bytes]) -> Any:
        return self.db.get(keys)

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        from rocksdict import ReadOptions

        opts = ReadOptions()
        if stop is not None:
            opts.set_iterate_upper_bound(stop)
        return _count(iter(self.db.items(from_key=start, read_opt=opts)), limit)

    def close(self) -> None:
        self.db.close()


class PlyvelHandle(Handle):
    """Raw ``plyvel`` (LevelDB); batches via ``write_batch``."""

    def __init__(self, path: Path) -> None:
        import plyvel

        self.path = path
        self.db = plyvel.DB(str(path), create_if_missing=True)
        self.put = self.db.put  # type: ignore[method-assign]
        self.get = self.db.get  # type: ignore[method-assign]
        self.delete = self.db.delete  # type: ignore[method-assign]

    def put_all(self, pairs: list[tuple[bytes, bytes]]) -> None:
        with self.db.write_batch() as wb:
            put = wb.put
            for k, v in pairs:
                put(k, v)

    def get_all(self, keys: list[bytes]) -> Any:
        get = self.db.get
        return [get(k) for k in keys]

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        with self.db.iterator(start=start, stop=stop) as it:
            return _count(it, limit)

    def close(self) -> None:
        self.db.close()


class NotApplicable(Exception):
    """The workload does not apply to this target; the cell is left out, not an error."""


# -- targets --------------------------------------------------------------------------------
BASELINES: dict[str, tuple[Callable[[Path], Handle], str | None]] = {
    "dict": (DictHandle, None),
    "rocksdict": (RocksdictHandle, "rocksdict"),
    "plyvel": (PlyvelHandle, "plyvel"),
}
"""Raw-library baselines: ``name → (handle class, module that must be importable)``."""

_ENGINE_BASELINE = {"memory": "dict", "rocksdb": "rocksdict", "leveldb": "plyvel"}


@dataclass(frozen=True)
class Target:
    """What a workload runs on; ``baseline`` names the raw-library target it is compared with."""

    name: str
    kind: str  # "store" | "engine" | "baseline" | "changelog"
    engine: str
    baseline: str | None = None

    def open(self, params: BenchParams, root: Path, *, changelog: bool = True) -> Handle:
        """A fresh handle whose files live under ``root`` (which the caller removes)."""
        root.mkdir(parents=True, exist_ok=True)
        if self.kind == "baseline":
            return BASELINES[self.engine][0](root / "db")
        store = self.kind in ("store", "changelog")
        storage = TaskStorage(make_config(self, params, root, changelog=store and changelog), 0)
        try:
            kv = storage.store(STORE) if store else storage.engine(STORE)
            if not isinstance(kv, KeyValueStore):
                raise NotApplicable(f"engine {self.engine!r} is not a key-value engine")
            return KVHandle(storage, kv, root, commit=store)
        except BaseException:
            storage.close()
            raise


def make_config(target: Target, params: BenchParams, root: Path, *, changelog: bool = True) -> Config:
    """One store ``bench`` on ``target.engine`` under ``root``, with the run's knobs."""
    store = target.kind in ("store", "changelog")
    values: dict[str, Any] = {
        "job.name": "bench",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        f"stores.{STORE}.factory": target.engine,
        f"stores.{STORE}.object.cache.size": params.cache_size if store else 0,
        f"stores.{STORE}.write.batch.size": params.batch_size,
    }
    if not changelog or params.changelog == "none":
        values[f"stores.{STORE}.changelog"] = "none"
    elif params.changelog == "kafka":
        if not params.kafka_bootstrap:
            raise ConfigError("--changelog kafka needs a broker: pass --kafka-bootstrap HOST:PORT")
        values["job.changelog.system"] = "kafka"
        values["job.checkpoint.system"] = "file"
        values["systems.kafka.bootstrap.servers"] = params.kafka_bootstrap
        # one topic per trial directory: the restore reopens the same one
        values[f"stores.{STORE}.changelog"] = f"kafka.bench-{os.getpid()}-{root.name}"
    for k, v in params.options:
        values[f"stores.{STORE}.{k}"] = v
    return Config.from_dict(values)


def targets_for(engines: list[str], baselines: bool = True, direct: bool = True) -> list[Target]:
    """Targets for ``engines`` (registered names, entry points or ``module:Factory``):
    the store, the raw engine and the matching raw-library baseline of each.

    Unknown names raise :class:`ConfigError` listing the registered engines; an engine
    whose extra is missing raises with the install hint.
    """
    out: list[Target] = []
    wanted: list[str] = []
    for name in engines:
        if ":" not in name and name not in ENGINES.names():
            hint = did_you_mean(name, ENGINES.names())
            raise ConfigError(
                f"unknown engine {name!r}.{hint if hint.startswith(' Did you mean') else ''} "
                f"Registered engines: {', '.join(ENGINES.names())}; or pass 'package.module:Factory'."
            )
        resolve_factory(name)  # import errors and non-factories are reported up front
        base = _ENGINE_BASELINE.get(name, "dict")
        out.append(Target(name, "store", name, base))
        if direct:
            out.append(Target(f"{name}/direct", "engine", name, base))
        if base not in wanted:
            wanted.append(base)
    if baselines:
        for b in wanted:
            module = BASELINES[b][1]
            if module is not None:
                try:
                    __import__(module)
                except ImportError:
                    continue
            out.append(Target(b, "baseline", b))
    return out


# -- trials ---------------------------------------------------------------------------------
class _Scratch:
    """A temporary directory per trial, removed in cleanup."""

    def __init__(self, params: BenchParams) -> None:
        base = params.workdir
        if base:
            Path(base).mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix="lsbench-", dir=base))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _trial(target: Target, params: BenchParams, body: Callable[[Handle], Callable[[], Any]], ops: int,
           nbytes: int = 0, *, changelog: bool = True) -> Trial:
    scratch = _Scratch(params)
    try:
        h = target.open(params, scratch.path, changelog=changelog)
    except BaseException:
        scratch.remove()
        raise
    try:
        run = body(h)
    except BaseException:
        h.close()
        scratch.remove()
        raise

    def cleanup() -> None:
        try:
            h.close()
        finally:
            scratch.remove()

    return Trial(run, ops, nbytes, cleanup)


def _load(h: Handle, params: BenchParams) -> None:
    ds = dataset(params)
    pairs = list(zip(ds.keys, ds.values))
    b = params.batch_size
    for i in range(0, len(pairs), b):
        h.put_all(pairs[i : i + b])
    h.commit()


def _commit_every(params: BenchParams) -> int:
    return max(params.batch_size, 10_000)


def _puts(h: Handle, params: BenchParams, order: list[int]) -> Callable[[], None]:
    ds = dataset(params)
    keys, values = ds.keys, ds.values
    pairs = [(keys[i], values[i]) for i in order]
    every = _commit_every(params)
    put, commit = h.put, h.commit

    def run() -> None:
        for start in range(0, len(pairs), every):
            for k, v in pairs[start : start + every]:
                put(k, v)
            commit()

    return run


@workload("sequential_put")
def sequential_put(target: Target, params: BenchParams) -> Trial:
    """put() of every record in key order, committing every 10,000 writes (stores)."""
    order = list(range(params.records))
    return _trial(target, params, lambda h: _puts(h, params, order), params.records)


@workload("random_put")
def random_put(target: Target, params: BenchParams) -> Trial:
    """put() of every record in --distribution order, committing every 10,000 writes."""
    dist = "uniform" if params.distribution == "sequential" else params.distribution
    order = key_order(params, params.records, dist)
    return _trial(target, params, lambda h: _puts(h, params, order), params.records)


@workload("put_all")
def put_all(target: Target, params: BenchParams) -> Trial:
    """put_all() of every record in --batch-size batches (random order), one commit."""
    ds = dataset(params)
    order = key_order(params, params.records, "uniform")
    pairs = [(ds.keys[i], ds.values[i]) for i in order]
    b = params.batch_size
    batches = [pairs[i : i + b] for i in range(0, len(pairs), b)]

    def body(h: Handle) -> Callable[[], None]:
        put_all_, commit = h.put_all, h.commit

        def run() -> None:
            for batch in batches:
                put_all_(batch)
            commit()

        return run

    return _trial(target, params, body, params.records)


def _reads(target: Target, params: BenchParams, keys: list[bytes], batch: bool = False) -> Trial:
    b = params.batch_size

    def body(h: Handle) -> Callable[[], None]:
        _load(h, params)
        if batch:
            groups = [keys[i : i + b] for i in range(0, len(keys), b)]
            get_all = h.get_all

            def run_batches() -> None:
                for g in groups:
                    get_all(g)

            return run_batches
        get = h.get

        def run() -> None:
            for k in keys:
                get(k)

        return run

    return _trial(target, params, body, len(keys))


@workload("random_get_hit", read_only=True)
def random_get_hit(target: Target, params: BenchParams) -> Trial:
    """get() of present keys drawn by --distribution (after a load and commit)."""
    ds = dataset(params)
    return _reads(target, params, [ds.keys[i] for i in key_order(params, params.records)])


@workload("get_miss", read_only=True)
def get_miss(target: Target, params: BenchParams) -> Trial:
    """get() of absent keys (after a load and commit)."""
    return _reads(target, params, dataset(params).missing)


@workload("get_all", read_only=True)
def get_all(target: Target, params: BenchParams) -> Trial:
    """get_all() of present keys in --batch-size batches, drawn by --distribution."""
    ds = dataset(params)
    return _reads(target, params, [ds.keys[i] for i in key_order(params, params.records)], batch=True)


@workload("range_scan", unit="records/s", read_only=True)
def range_scan(target: Target, params: BenchParams) -> Trial:
    """Short scans of 100 records each from random start keys (half-open ranges)."""
    ds = dataset(params)
    n_scans = max(1, params.records // params.scan_length)
    rng = random.Random(params.seed)
    length = params.scan_length
    spans = []
    for _ in range(n_scans):
        i = rng.randrange(params.records)
        stop = ds.keys[i + length] if i + length < params.records else None
        spans.append((ds.keys[i], stop))
    expected = sum(min(length, params.records - bisect.bisect_left(ds.keys, s)) for s, _ in spans)

    def body(h: Handle) -> Callable[[], None]:
        _load(h, params)
        scan = h.scan
        scan(spans[0][0], spans[0][1])  # NotApplicable surfaces during setup

        def run() -> None:
            for start, stop in spans:
                scan(start, stop)

        return run

    return _trial(target, params, body, expected)


@workload("full_scan", unit="records/s", read_only=True)
def full_scan(target: Target, params: BenchParams) -> Trial:
    """One scan of every record in key order (hash order for the dict)."""

    def body(h: Handle) -> Callable[[], None]:
        _load(h, params)
        return lambda: h.scan(None, None)

    return _trial(target, params, body, params.records)


@workload("mixed_zipf")
def mixed_zipf(target: Target, params: BenchParams) -> Trial:
    """80% get / 20% put over Zipf-skewed keys (the object cache's case), commit every 10,000."""
    ds = dataset(params)
    n = params.records
    picks = zipf_sample(n, n, params.zipf_s, random.Random(params.seed + 7))
    rng = random.Random(params.seed + 8)
    ops = [(rng.random() < 0.2, ds.keys[i], ds.values[(i + 1) % n]) for i in picks]
    every = _commit_every(params)

    def body(h: Handle) -> Callable[[], None]:
        _load(h, params)
        get, put, commit = h.get, h.put, h.commit

        def run() -> None:
            for start in range(0, n, every):
                for write, k, v in ops[start : start + every]:
                    if write:
                        put(k, v)
                    else:
                        get(k)
                commit()

        return run

    return _trial(target, params, body, n)


@workload("delete_heavy_scan", unit="records/s", read_only=True)
def delete_heavy_scan(target: Target, params: BenchParams) -> Trial:
    """Delete 90% of the records (committed), then time a full scan of the survivors."""
    ds = dataset(params)
    doomed = [k for i, k in enumerate(ds.keys) if i % 10]
    survivors = params.records - len(doomed)

    def body(h: Handle) -> Callable[[], None]:
        _load(h, params)
        delete = h.delete
        for k in doomed:
            delete(k)
        h.commit()
        return lambda: h.scan(None, None)

    return _trial(target, params, body, survivors)


@workload("commit_overhead", unit="commits/s", kinds=("store",))
def commit_overhead(target: Target, params: BenchParams) -> Trial:
    """Time of commit() alone, after each --batch-size random puts (changelog flush + checkpoint)."""
    ds = dataset(params)
    b = params.batch_size
    order = key_order(params, params.records, "uniform")
    groups = [[(ds.keys[i], ds.values[i]) for i in order[j : j + b]] for j in range(0, len(order), b)]
    groups = groups[: max(1, min(len(groups), 200))]
    spent = [0.0]

    def body(h: Handle) -> Callable[[], None]:
        import time

        put, commit = h.put, h.commit

        def run() -> None:
            clock = time.perf_counter
            total = 0.0
            for g in groups:
                for k, v in g:
                    put(k, v)
                t0 = clock()
                commit()
                total += clock() - t0
            spent[0] = total

        return run

    trial = _trial(target, params, body, len(groups))
    trial.seconds = lambda: spent[0]
    return trial


@workload("changelog_append", unit="records/s", kinds=("changelog",), mb_per_s=True)
def changelog_append(target: Target, params: BenchParams) -> Trial:
    """ChangelogPartition.append() of every record in --batch-size batches, then flush()."""
    if params.changelog == "none":
        raise NotApplicable("--changelog none")
    ds = dataset(params)
    b = params.batch_size
    pairs = list(zip(ds.keys, ds.values))
    batches = [pairs[i : i + b] for i in range(0, len(pairs), b)]

    def body(h: Handle) -> Callable[[], None]:
        assert isinstance(h, KVHandle)
        part = h.storage.changelog(STORE)
        assert part is not None

        def run() -> None:
            for batch in batches:
                part.append(batch)
            part.flush()

        return run

    return _trial(target, params, body, params.records, ds.nbytes)


def _restore_trial(target: Target, params: BenchParams, *, incremental: bool) -> Trial:
    """Prepare a reopen: full (local state deleted) or incremental (local state from
    before the last 10% of the writes, as on a machine whose copy fell behind)."""
    if params.changelog == "none":
        raise NotApplicable("--changelog none: nothing to restore from")
    ds = dataset(params)
    scratch = _Scratch(params)
    delta = max(1, params.records // 10)
    state = scratch.path / "state" / "bench" / STORE
    behind = scratch.path / "state-behind"
    try:
        h = target.open(params, scratch.path)
        try:
            _load(h, params)
        finally:
            h.close()
        if incremental:
            shutil.copytree(state, behind)
            h = target.open(params, scratch.path)
            try:
                for i in range(delta):
                    h.put(ds.keys[i], ds.values[-1 - i])
                h.commit()
            finally:
                h.close()
            shutil.rmtree(state)
            behind.rename(state)
        else:
            shutil.rmtree(state, ignore_errors=True)
    except BaseException:
        scratch.remove()
        raise
    config = make_config(target, params, scratch.path)
    trial = Trial(lambda: None, delta, 0, scratch.remove)
    timing: dict[str, Any] = {}

    def run() -> None:
        t0 = time.perf_counter()
        storage = TaskStorage(config, 0)
        timing["open"] = time.perf_counter() - t0
        r = timing["restore"] = storage.last_restore.get(STORE)
        storage.close()
        if not incremental and r is not None:  # rate = records and bytes actually replayed
            trial.ops, trial.nbytes = r.records, r.bytes

    def seconds() -> float:
        if incremental:  # the whole reopen: snapshot load + replay of the delta
            return float(timing["open"])
        r: RestoreProgress | None = timing["restore"]
        return r.seconds if r is not None else 0.0

    trial.run = run
    trial.seconds = seconds
    return trial


@workload("full_restore", unit="records/s", kinds=("store",), mb_per_s=True)
def full_restore(target: Target, params: BenchParams) -> Trial:
    """Reopen with no local state: restore every committed record from the changelog."""
    return _restore_trial(target, params, incremental=False)


@workload("incremental_restore", unit="delta records/s", kinds=("store",))
def incremental_restore(target: Target, params: BenchParams) -> Trial:
    """Reopen with local state from before the last 10% of writes: reopen time per delta record.

    Engines with local snapshots load theirs and replay only the delta; in-memory engines
    replay everything. Timed: the whole ``TaskStorage`` open.
    """
    return _restore_trial(target, params, incremental=True)


@workload("restore_baseline", unit="records/s", kinds=("baseline",), mb_per_s=True)
def restore_baseline(target: Target, params: BenchParams) -> Trial:
    """Raw library: bulk-load every record from memory in --batch-size batches (restore's ideal)."""
    ds = dataset(params)
    pairs = list(zip(ds.keys, ds.values))
    b = params.batch_size
    batches = [pairs[i : i + b] for i in range(0, len(pairs), b)]

    def body(h: Handle) -> Callable[[], None]:
        put_all_ = h.put_all

        def run() -> None:
            for batch in batches:
                put_all_(batch)

        return run

    return _trial(target, params, body, params.records, ds.nbytes)


def footprint(target: Target, params: BenchParams) -> dict[str, int]:
    """``{"disk_bytes", "rss_bytes", "peak_rss_bytes"}`` of loading every record and committing.

    Measured in a fresh (spawned) process per target, so one engine's memory is not
    counted against the next: ``rss_bytes`` is the growth of the resident set while the
    data is held and ``peak_rss_bytes`` the growth of its peak while loading (both over
    the resident set once the benchmark data is generated; where the peak cannot be
    reset, the process's whole peak); ``disk_bytes`` counts the engine's files and the
    changelog.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_footprint_here, target, params).result()


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs`` 5); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_since_reset() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return peak_rss_bytes()


def _footprint_here(target: Target, params: BenchParams) -> dict[str, int]:
    scratch = _Scratch(params)
    try:
        dataset(params)
        before = current_rss_bytes()
        reset = _reset_peak_rss()
        h = target.open(params, scratch.path)
        try:
            _load(h, params)
            if isinstance(h, KVHandle):
                h.kv.flush()
            rss = current_rss_bytes() - before
            peak = (_peak_rss_since_reset() - before) if reset else peak_rss_bytes()
            disk = dir_bytes(scratch.path)
        finally:
            h.close()
        return {"disk_bytes": disk, "rss_bytes": max(rss, 0), "peak_rss_bytes": peak}
    finally:
        scratch.remove()


# -- the generic suite ----------------------------------------------------------------------
RATIO_WORKLOAD = {"full_restore": "restore_baseline"}
"""Which baseline workload a localstate workload is compared with when the names differ."""


def plan(targets: list[Target], workloads: list[Workload], params: BenchParams) -> list[tuple[Workload, Target]]:
    """Every (workload, target) cell to run, in run order (one target at a time)."""
    cells: list[tuple[Workload, Target]] = []
    if params.changelog != "none":
        store = next((t for t in targets if t.kind == "store"), None)
        if store is not None:
            log_target = Target(f"{params.changelog} changelog", "changelog", store.engine)
            cells += [(w, log_target) for w in workloads if "changelog" in w.kinds]
    for t in targets:
        cells += [(w, t) for w in workloads if t.kind in w.kinds]
    return cells


def run_cell(w: Workload, t: Target, params: BenchParams) -> list[dict[str, Any]]:
    """The row(s) of one cell; an exception becomes an error row, NotApplicable no row."""
    common = params.public()
    try:
        rates, mbs, ops = time_trials(lambda: w.prepare(t, params), params.repeats, reuse=w.read_only)
    except NotApplicable:
        return []
    except Exception as e:  # an engine failing mid-run: report it in its cell, go on
        return [error_row(w.name, t.name, common, w.unit, describe_error(e))]
    notes = w.description
    if ops and min(ops) != max(ops):
        notes += f" ({min(ops)}-{max(ops)} ops per run)"
    comparable = "baseline" in w.kinds or w.name in RATIO_WORKLOAD
    baseline = t.baseline if comparable else None
    rows = [make_row(w.name, t.name, common, w.unit, rates, baseline=baseline, notes=notes)]
    if w.mb_per_s:
        rows.append(make_row(w.name, t.name, common, "MB/s", mbs, baseline=baseline, notes=notes))
    for r in rows:
        if w.name in RATIO_WORKLOAD:
            r["ratio_workload"] = RATIO_WORKLOAD[w.name]
        r["suite"] = GENERIC_SUITE
    return rows


def footprint_rows(t: Target, params: BenchParams) -> list[dict[str, Any]]:
    """``disk_bytes``, ``rss_bytes`` and ``peak_rss_bytes`` rows of one store or baseline target."""
    common = params.public()
    try:
        fp = footprint(t, params)
    except NotApplicable:
        return []
    except Exception as e:
        return [error_row("footprint", t.name, common, "bytes", describe_error(e))]
    rows = []
    for key, what in (("disk_bytes", "on-disk bytes (engine files + changelog)"),
                      ("rss_bytes", "resident memory growth while holding the data (own process)"),
                      ("peak_rss_bytes", "peak resident memory growth while loading (own process)")):
        row = make_row(key, t.name, common, "bytes", [float(fp[key])], baseline=t.baseline,
                       notes=f"{what}, after loading {params.records} records")
        row["suite"] = GENERIC_SUITE
        rows.append(row)
    return rows


def run_generic(
    engines: list[str],
    workload_names: list[str] | None,
    params: BenchParams,
    *,
    baselines: bool = True,
    on_start: Callable[[int], None] | None = None,
    on_cell: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the generic workloads over the engines' targets; rows with ratios filled."""
    from .registry import get_workloads

    workloads = get_workloads(workload_names)
    partners = [RATIO_WORKLOAD[w.name] for w in workloads if w.name in RATIO_WORKLOAD]
    if partners:  # the raw-library baseline they are compared with
        workloads += [w for w in get_workloads(partners) if w not in workloads]
    targets = targets_for(engines, baselines=baselines)
    cells = plan(targets, workloads, params)
    measure_fp = not workload_names or FOOTPRINT in workload_names
    fp_targets = [t for t in targets if t.kind in ("store", "baseline")] if measure_fp else []
    if on_start is not None:
        on_start(len(cells) + len(fp_targets))
    rows: list[dict[str, Any]] = []
    for w, t in cells:
        if on_cell is not None:
            on_cell(f"{w.name} × {t.name}")
        rows += run_cell(w, t, params)
    for t in fp_targets:
        if on_cell is not None:
            on_cell(f"footprint × {t.name}")
        rows += footprint_rows(t, params)
    add_ratios(rows)
    for r in rows:
        r.pop("ratio_workload", None)
    return rows

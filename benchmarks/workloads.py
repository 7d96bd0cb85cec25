"""Generic key-value workloads over any engine (registered with
:func:`~localstate.benchmarks.registry.workload`; the registry imports this module when
workloads are asked for). Their data: :mod:`.datasets`; what they run on: :mod:`.targets`.
"""

from __future__ import annotations

import bisect
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localstate.metrics import RestoreProgress
from localstate.storage import TaskStorage

from .datasets import Dataset, dataset, key_order, zipf_sample
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
from .targets import (
    BASELINES,
    STORE,
    Handle,
    KVHandle,
    NotApplicable,
    Target,
    make_config,
    targets_for,
)
from .timing import Stopwatch

__all__ = ["Target", "Handle", "targets_for", "BASELINES", "Dataset", "footprint", "run_generic", "NotApplicable"]


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
        put, commit = h.put, h.commit

        def run() -> None:
            committing = Stopwatch()  # the commits only, summed
            for g in groups:
                for k, v in g:
                    put(k, v)
                with committing:
                    commit()
            spent[0] = committing.wall

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
        with Stopwatch() as watch:
            storage = TaskStorage(config, 0)
        timing["open"] = watch.wall
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

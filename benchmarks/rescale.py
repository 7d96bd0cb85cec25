"""Issue 18's rescale figure: how long ``localstate rescale`` takes, against a full
restore of the same state in the same run.

A job of 4 tasks holds ``records`` keys (16-byte keys, 100-byte values, one store,
file changelog with fsync), committed twice (the second commit rewrites a tenth of the
keys and deletes another tenth, so the log holds more records than the state). Timed,
each from a fresh copy of the job's directories:

* ``rescale 4 -> 6``: :func:`localstate.rescale.rescale` (read every old task's
  committed records, route, write the new changelog and checkpoints, swap);
* baseline ``full restore, 4 tasks``: opening every old task after deleting its local
  state (what a job pays after losing its machine).

``ratio`` = rescale / full restore. Rates are state records (keys) per second.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.partitioning import task_for
from localstate.rescale import rescale

from .runner import paired_rows, rows_per_engine

__all__ = ["run"]

FULL_RECORDS = 200_000
QUICK_RECORDS = 4_000
ENGINES = ("memory", "rocksdb")
OLD, NEW = 4, 6


def _values(root: Path, engine: str) -> dict[str, Any]:
    return {
        "job.name": "rescale",
        "job.partitions": OLD,
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.kv.factory": engine,
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "string",
        "stores.kv.object.cache.size": 10_000,
        "stores.kv.write.batch.size": 5_000,
    }


def _build(root: Path, engine: str, records: int) -> None:
    config = Config.from_dict(_values(root, engine))
    keys = [f"key{i:013d}" for i in range(records)]
    value = "v" * 100
    for version, chosen in ((0, keys), (1, keys[: records // 10])):
        for p in range(OLD):
            with TaskStorage(config, p) as s:
                kv = s.store("kv")
                mine = [k for k in chosen if task_for(k, OLD) == p]
                kv.put_all([(k, value) for k in mine])
                if version:
                    kv.delete_all([k for k in keys[-records // 10:] if task_for(k, OLD) == p])
                s.commit("input", version=version)


def _fresh(pristine: Path, work: Path, engine: str) -> Config:
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(pristine, work)
    shutil.rmtree(work / "state", ignore_errors=True)
    return Config.from_dict(_values(work, engine))


def _time_rescale(pristine: Path, work: Path, engine: str) -> float:
    config = _fresh(pristine, work, engine)
    t0 = time.perf_counter()
    rescale(config, NEW)
    return time.perf_counter() - t0


def _time_restore(pristine: Path, work: Path, engine: str) -> float:
    config = _fresh(pristine, work, engine)
    t0 = time.perf_counter()
    for p in range(OLD):
        TaskStorage(config, p).close()
    return time.perf_counter() - t0


def _measure(engine: str, records: int, repeats: int, root: Path) -> list[dict[str, Any]]:
    pristine = root / "pristine"
    _build(pristine, engine, records)
    state = records - records // 10
    params = {"state_records": state, "from": OLD, "to": NEW}
    return paired_rows(
        engine, params, "records/s",
        (f"rescale {OLD} -> {NEW}", lambda: state / _time_rescale(pristine, root / "work", engine)),
        (f"full restore, {OLD} tasks", lambda: state / _time_restore(pristine, root / "work", engine)),
        repeats, "state records (keys) per second; file changelog with fsync",
    )


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Rows for every installed engine of :data:`ENGINES`."""
    records = QUICK_RECORDS if quick else FULL_RECORDS
    return rows_per_engine(ENGINES, lambda engine, root: _measure(engine, records, repeats, root),
                           workload=f"rescale {OLD} -> {NEW}", params={"records": records}, unit="records/s",
                           prefix="localstate-rescale-")

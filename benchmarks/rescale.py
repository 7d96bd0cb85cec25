"""The rescale figure: how long ``localstate rescale`` takes, against a full
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

Then the same rescale (memory engine) by changelog, interleaved run by run so the shared
machine's load hits each alike: ``file`` (fsync), ``objectstore`` on a local moto S3
endpoint, ``kafka`` on a local tansu broker (both started here, on 127.0.0.1). Each run
rescales a freshly built job (building is not timed); ``ratio`` = rate / file's rate.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.partitioning import task_for
from localstate.rescale import rescale

from .runner import error_row, make_row, paired_rows, rows_per_engine
from .timing import Stopwatch

__all__ = ["run"]

FULL_RECORDS = 200_000
QUICK_RECORDS = 4_000
ENGINES = ("memory", "rocksdb")
OLD, NEW = 4, 6


CHANGELOGS = ("file", "objectstore (moto S3)", "kafka (tansu)")


def _values(root: Path, engine: str, system: dict[str, Any] | None = None) -> dict[str, Any]:
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
        **(system or {}),
    }


def _build(root: Path, engine: str, records: int, system: dict[str, Any] | None = None) -> Config:
    config = Config.from_dict(_values(root, engine, system))
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
    return config


def _fresh(pristine: Path, work: Path, engine: str) -> Config:
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(pristine, work)
    shutil.rmtree(work / "state", ignore_errors=True)
    return Config.from_dict(_values(work, engine))


def _time_rescale(pristine: Path, work: Path, engine: str) -> float:
    config = _fresh(pristine, work, engine)
    with Stopwatch() as watch:
        rescale(config, NEW)
    return watch.wall


def _time_restore(pristine: Path, work: Path, engine: str) -> float:
    config = _fresh(pristine, work, engine)
    with Stopwatch() as watch:
        for p in range(OLD):
            TaskStorage(config, p).close()
    return watch.wall


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


@contextlib.contextmanager
def _servers() -> Iterator[dict[str, Any]]:
    """A moto S3 endpoint and a tansu broker on 127.0.0.1 for the changelog rows."""
    from localstate.testing.kafka import TansuBroker
    from localstate.testing.s3 import MotoServer

    with MotoServer() as s3, TansuBroker() as broker:
        yield {"s3": s3, "bucket": s3.create_bucket(), "kafka": broker.bootstrap}


def _system(kind: str, servers: dict[str, Any], job: str) -> dict[str, Any]:
    if kind.startswith("objectstore"):
        from localstate.testing.s3 import objectstore_options

        return {"job.name": job, "job.changelog.system": "s3", "stores.kv.changelog": f"s3.{job}-kv",
                **objectstore_options(servers["s3"].endpoint, servers["bucket"], job)}
    if kind.startswith("kafka"):
        return {"job.name": job, "job.changelog.system": "kafka", "stores.kv.changelog": f"kafka.{job}-kv",
                "systems.kafka.bootstrap.servers": servers["kafka"], "systems.kafka.checkpoint.topic": f"{job}-ckpt"}
    return {"job.name": job}


def _changelog_rows(records: int, repeats: int, root: Path) -> list[dict[str, Any]]:
    """``rescale 4 -> 6`` of the memory engine on each of :data:`CHANGELOGS`, interleaved."""
    state = records - records // 10
    params = {"state_records": state, "from": OLD, "to": NEW, "engine": "memory"}
    runs: dict[str, list[float]] = {kind: [] for kind in CHANGELOGS}
    with _servers() as servers:
        for r in range(repeats + 1):  # the first round warms up
            for kind in CHANGELOGS:
                job = f"rescale-{r}-{os.urandom(3).hex()}"
                config = _build(root / job, "memory", records, _system(kind, servers, job))
                with Stopwatch() as watch:
                    rescale(config, NEW)
                if r:
                    runs[kind].append(state / watch.wall)
    rows = [make_row(f"rescale {OLD} -> {NEW} by changelog", kind, params, "records/s", runs[kind],
                     baseline=None if kind == "file" else "file",
                     notes="memory engine; each run a freshly built job; servers on 127.0.0.1")
            for kind in CHANGELOGS]
    base = statistics.median(runs["file"])
    for row in rows[1:]:
        row["ratio"] = row["median"] / base if base else None
    return rows


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Rows for every installed engine of :data:`ENGINES`, then by changelog."""
    import tempfile

    records = QUICK_RECORDS if quick else FULL_RECORDS
    rows = rows_per_engine(ENGINES, lambda engine, root: _measure(engine, records, repeats, root),
                           workload=f"rescale {OLD} -> {NEW}", params={"records": records}, unit="records/s",
                           prefix="localstate-rescale-")
    root = Path(tempfile.mkdtemp(prefix="localstate-rescale-changelogs-"))
    try:
        rows += _changelog_rows(records, repeats, root)
    except Exception as e:  # a server that cannot start: one error row, the file rows stand
        rows.append(error_row(f"rescale {OLD} -> {NEW} by changelog", "kafka/objectstore", {"records": records},
                              "records/s", f"{type(e).__name__}: {e}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows

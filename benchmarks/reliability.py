"""The recovery figure: how long a task takes to come back after a SIGKILL.

A child process writes ``records`` keys (16-byte keys, 100-byte values, a commit every
``commit_every`` writes, file changelog with fsync) and is SIGKILLed by the fault
point ``commit.after_changelog_flush`` inside its last commit — so the changelog ends
in an uncommitted tail of ``commit_every`` records. The timed operation is the reopen:
``TaskStorage(config)`` (restore up to the last commit + cutting the tail), from a copy
of the crashed directories each run.

Baseline, same run: reopening the same task after a clean close (no tail to cut);
``ratio`` = crashed reopen / clean reopen (1.0 = a crash costs nothing extra).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage

from .runner import paired_rows, rows_per_engine
from .timing import Stopwatch

__all__ = ["run"]

FULL_RECORDS = 200_000
QUICK_RECORDS = 4_000
ENGINES = ("memory", "rocksdb", "leveldb")

_WRITER = textwrap.dedent(
    """
    import json, sys
    from localstate import Config, TaskStorage
    config = Config.from_dict(json.loads(sys.argv[1]))
    records, every = int(sys.argv[2]), int(sys.argv[3])
    value = "v" * 100
    with TaskStorage(config) as s:
        kv = s.store("kv")
        for start in range(0, records + every, every):
            kv.put_all([("key%013d" % i, value) for i in range(start, start + every)])
            s.commit(input_position=start + every)   # the last one is killed mid-commit
    """
)


def _values(root: Path, engine: str, records: int) -> dict[str, Any]:
    return {
        "job.name": "recovery",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        "stores.kv.factory": engine,
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "string",
        "stores.kv.object.cache.size": 10_000,
        "stores.kv.write.batch.size": 5_000,
    }


def _timed_open(pristine: Path, work: Path, values: dict[str, Any]) -> float:
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(pristine, work)
    v = {**values, "job.state.dir": str(work / "state"), "systems.file.path": str(work / "changelog")}
    config = Config.from_dict(v)
    with Stopwatch() as watch:
        s = TaskStorage(config)
    elapsed = watch.wall
    s.close()
    return elapsed


def _crashed_copy(root: Path, engine: str, records: int, every: int) -> tuple[Path, dict[str, Any]]:
    values = _values(root / "crashed", engine, records)
    commits = records // every + 1
    env = {**os.environ, "LOCALSTATE_FAULTS": f"commit.after_changelog_flush=kill@{commits}"}
    rc = subprocess.run([sys.executable, "-c", _WRITER, json.dumps(values), str(records), str(every)],
                        env=env).returncode
    if rc != -9:
        raise RuntimeError(f"the writer was expected to be SIGKILLed, exit code {rc}")
    return root / "crashed", values


def _measure(engine: str, records: int, every: int, repeats: int, root: Path) -> list[dict[str, Any]]:
    crashed, values = _crashed_copy(root, engine, records, every)
    clean = root / "clean"
    shutil.copytree(crashed, clean)
    v = {**values, "job.state.dir": str(clean / "state"), "systems.file.path": str(clean / "changelog")}
    with TaskStorage(Config.from_dict(v)) as s:  # cuts the tail once; then a clean close
        assert s.checkpoint is not None and s.checkpoint.input_position == records
    params = {"records": records, "commit_every": every, "uncommitted_tail": every}
    return paired_rows(
        engine, params, "s",
        ("reopen after SIGKILL", lambda: _timed_open(crashed, root / "work", values)),
        ("reopen after clean close", lambda: _timed_open(clean, root / "work", values)),
        repeats, "TaskStorage open: restore to the last commit (+ tail cut after a crash)",
    )


def run(quick: bool = False, repeats: int = 5) -> list[dict[str, Any]]:
    """Rows for every installed key-value engine of :data:`ENGINES`."""
    records = QUICK_RECORDS if quick else FULL_RECORDS
    every = records // 20
    return rows_per_engine(ENGINES, lambda engine, root: _measure(engine, records, every, repeats, root),
                           workload="reopen after SIGKILL", params={"records": records}, unit="s",
                           prefix="localstate-recovery-")

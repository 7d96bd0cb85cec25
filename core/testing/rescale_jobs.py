"""A small job for rescale tests (``localstate rescale``): page-view counts per user in a
``counts`` store, written task by task the way the Spark runner routes rows, and read back
per task. Shared by the rescale test modules (test modules cannot import each other)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from localstate import Config, TaskStorage
from localstate.partitioning import task_for

__all__ = ["USERS", "job_values", "run_tasks", "state_of", "tree_digest", "seeded_job", "seeded_values", "expected",
           "rescale_in_child"]

USERS = [f"user-{i}" for i in range(200)]


def job_values(root: Path, factory: str = "memory", partitions: int = 4, **extra: Any) -> dict[str, Any]:
    values = {
        "job.name": "clicks",
        "job.state.dir": str(root / "state"),
        "job.partitions": partitions,
        "systems.file.path": str(root / "changelog"),
        "stores.counts.factory": factory,
        "stores.counts.key.serde": "string",
        "stores.counts.msg.serde": "json",
    }
    values.update(extra)
    return values


def run_tasks(config: Config, updates: dict[str, Any], *, version: int | None = None,
              position: Any = "same", deletes: tuple[str, ...] = ()) -> None:
    """Apply ``updates`` (key -> value) and ``deletes`` in the tasks the keys route to, and commit every task."""
    n = config.partitions
    for p in range(n):
        with TaskStorage(config, p) as storage:
            counts = storage.store("counts")
            for k, v in updates.items():
                if task_for(k, n) == p:
                    counts[k] = v
            for k in deletes:
                if task_for(k, n) == p and k in counts:
                    del counts[k]
            storage.commit(position, version=version)


def state_of(config: Config, store: str = "counts") -> dict[int, dict[str, Any]]:
    out = {}
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage:
            with storage.store(store).all() as items:
                out[p] = dict(items)
    return out


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (lock files aside) and its content hash: 'nothing changed'."""
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file() and f.name != ".lock" and not f.name.endswith(".lock")}


def seeded_job(tmp_path: Path, factory: str = "memory", **extra: Any) -> Config:
    """A job at 4 partitions with two commits (versions 0 and 1): :func:`expected` is its state."""
    return seeded_values(job_values(tmp_path, factory, **extra))


def expected(n: int) -> dict[int, dict[str, Any]]:
    want: dict[int, dict[str, Any]] = {q: {} for q in range(n)}
    for i, u in enumerate(USERS[:150]):
        want[task_for(u, n)][u] = {"n": i * 10 if i < 50 else i}
    return want


def seeded_values(values: dict[str, Any]) -> Config:
    """The job of ``values`` after two commits: every user, then 50 updated and 50 deleted."""
    config = Config.from_dict(values)
    run_tasks(config, {u: {"n": i} for i, u in enumerate(USERS)}, version=0)
    run_tasks(config, {u: {"n": i * 10} for i, u in enumerate(USERS[:50])}, version=1, deletes=tuple(USERS[150:]))
    return config


def rescale_in_child(root: Path, to: int, fault: str, values: dict[str, Any] | None = None) -> int:
    code = textwrap.dedent(f"""
        import json, sys
        from localstate import Config
        from localstate.rescale import rescale
        rescale(Config.from_dict(json.loads(sys.argv[1])), {to})
    """)
    env = {**os.environ, "LOCALSTATE_FAULTS": fault}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(values or job_values(root))], env=env,
                          capture_output=True, timeout=120)
    return proc.returncode

"""Helpers of the changelog conformance kits (:mod:`localstate.testing.changelog_conformance`)
that a plug-in's own tests use too: record lists, unique names, a job's config, a store's
contents, "another machine", damaged files."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

from localstate.config import Config
from localstate.registry import ENGINES
from localstate.storage import TaskStorage

__all__ = ["KV_ENGINES", "unique", "records", "on_another_machine", "dump", "task_values", "local_files",
           "damage_files"]

KV_ENGINES = tuple(n for n in ("memory", "rocksdb", "leveldb") if ENGINES.installed(n)[0])
"""The built-in KV engines installed here (the exact-restore check runs over each)."""


def unique(prefix: str) -> str:
    """``prefix`` plus a random suffix: a stream, topic or job name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def records(lo: int, hi: int, prefix: bytes = b"k") -> list[tuple[bytes, bytes | None]]:
    """Changelog records ``prefix<i> -> v<i>`` for ``i`` in ``[lo, hi)``."""
    return [(prefix + b"%d" % i, b"v%d" % i) for i in range(lo, hi)]


def on_another_machine(values: dict[str, Any], tmp_path: Path, name: str) -> Config:
    """The same job on "another machine": an empty state directory."""
    return Config.from_dict({**values, "job.state.dir": str(tmp_path / name)})


def dump(storage: TaskStorage, store: str = "kv") -> dict:
    """Everything ``store`` holds, as a dict."""
    with storage.store(store).all() as it:
        return dict(it)


def task_values(job_values: dict[str, Any], tmp_path: Path, factory: str = "memory", **extra: Any) -> dict[str, Any]:
    """Config of a fresh job (unique name, state under ``tmp_path``) with one ``kv`` store
    (string keys, JSON values, a small cache and write batch) logged to the changelog
    system ``job_values`` configure (``job.changelog.system``, else ``file``)."""
    job = unique("job")
    system = job_values.get("job.changelog.system", "file")
    return {
        "job.name": job,
        "job.state.dir": str(tmp_path / "state"),
        "stores.kv.factory": factory,
        "stores.kv.changelog": f"{system}.{job}-kv",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "json",
        "stores.kv.object.cache.size": 64,
        "stores.kv.write.batch.size": 32,
        **job_values,
        **extra,
    }


def local_files(state_dir: Path) -> dict[str, bytes]:
    """Every file under ``state_dir`` but the task locks, relative path → bytes."""
    return {str(p.relative_to(state_dir)): p.read_bytes() for p in state_dir.rglob("*")
            if p.is_file() and p.suffix != ".lock"}


def damage_files(paths: list[Path]) -> int:
    """Replace each file by garbage of its size (a new inode: a hard link elsewhere, such
    as the local snapshot it was shipped from, keeps the good bytes); how many."""
    for path in paths:
        size = path.stat().st_size
        path.unlink()
        path.write_bytes(bytes(random.Random(size).getrandbits(8) for _ in range(size)))
    return len(paths)

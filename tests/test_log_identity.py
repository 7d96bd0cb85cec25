"""A local copy is trusted only for the log it was built from, also when that log was
deleted and written again by a new run of the job (the objectstore prefix wiped, then the
job started over elsewhere): the new stream has another identity (``stream.json``'s
``id``), so an old machine's RocksDB copy — live database with its clean-close claim, or
a snapshot — whose offsets line up with the new log's is rebuilt, never loaded.
On the moto S3 server and on file:// URLs, with real RocksDB files."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.testing.changelog_conformance import dump, task_values

pytestmark = pytest.mark.s3



@pytest.fixture
def where(objectstore_where: dict[str, Any]) -> dict[str, Any]:
    """A fresh objectstore location: a moto bucket, then a file:// directory."""
    return objectstore_where


def _wipe(values: dict[str, Any], tmp_path: Path) -> None:
    """Delete every object of the job (the operator's `aws s3 rm --recursive`)."""
    path = values["systems.s3.path"]
    if path.startswith("file://"):
        shutil.rmtree(path[len("file://"):])
        return
    options = {k[len("systems.s3."):]: v for k, v in values.items()
               if k.startswith("systems.s3.") and k != "systems.s3.type"}
    system = ObjectStoreChangelogSystem("s3", options, values["job.name"])
    store = system.store
    store.delete([f"{p}/{n}" for p in ("_checkpoints", f"{values['job.name']}-kv", "_generations")
                  for n, _ in store.list(p)])
    assert not store.list(f"{values['job.name']}-kv") and not store.list("_checkpoints")
    system.close()


def _run(cfg: Config, prefix: str, commits: int = 5) -> dict[str, Any]:
    with TaskStorage(cfg) as s:
        assert s.checkpoint is None or s.checkpoint.input_position is None  # a new job: nothing committed
        for i in range(commits):
            s.store("kv").put(f"k{i}", f"{prefix}{i}")
            s.commit(input_position=i)
        return dump(s)


@pytest.mark.parametrize("interval", [None, 0])
def test_a_copy_of_a_deleted_and_rewritten_log_is_rebuilt(where, tmp_path, interval):
    extra = {"stores.kv.rocksdb.snapshot.interval.records": interval} if interval is not None else {}
    values = task_values({"job.changelog.system": "s3", "job.checkpoint.system": "s3", **where}, tmp_path,
                         "rocksdb", **extra)
    machine_a = Config.from_dict({**values, "job.state.dir": str(tmp_path / "a")})
    machine_b = Config.from_dict({**values, "job.state.dir": str(tmp_path / "b")})
    assert _run(machine_a, "old") == {f"k{i}": f"old{i}" for i in range(5)}
    _wipe(values, tmp_path)
    new = _run(machine_b, "new")  # the job started over, elsewhere: same offsets, new values
    assert new == {f"k{i}": f"new{i}" for i in range(5)}
    with TaskStorage(machine_a) as s:  # machine A still holds its copy of the old log
        assert dump(s) == new
        assert s.checkpoint.input_position == 4

"""Resource faults: disk full during commit, read-only changelog/state directories, a Kafka
broker stopped (SIGSTOP) in the middle of a commit and resumed.

In every case the commit fails loudly (an error naming the path or brokers and the
fix), nothing half-written counts as committed, and after the resource is back and
the task reopened, the next commit is consistent.

Disk full and read-only use real file systems: a small tmpfs mounted for the test
(``mount -t tmpfs -o size=...``; remounted ``ro`` for the read-only case — root
ignores file permissions, a read-only mount it cannot). Where mounting is not
permitted the tests fall back to injecting ``ENOSPC``/``EROFS`` at the changelog's
write call (a declared test double) so the area is never skipped.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localstate import Config, TaskStorage
from localstate.changelog.file import FileChangelogPartition
from localstate.errors import ChangelogError, LocalStateError


def _mount(point: Path, size: str) -> bool:
    point.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                       capture_output=True)
    return r.returncode == 0


def _umount(point: Path) -> None:
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _remount(point: Path, mode: str) -> bool:
    return subprocess.run(["mount", "-o", f"remount,{mode}", str(point)], capture_output=True).returncode == 0


@pytest.fixture
def small_fs(tmp_path, monkeypatch) -> Iterator[dict[str, Any]]:
    """A 512 KiB tmpfs at ``tmp_path/fs``, or (mount not permitted) an injected fault."""
    point = tmp_path / "fs"
    mounted = _mount(point, "512k")
    info: dict[str, Any] = {"path": point, "mounted": mounted, "inject": None}
    if not mounted:
        # Declared test double: the write path raises the errno a full/read-only disk would.
        original = FileChangelogPartition._sync

        def sync(self: FileChangelogPartition) -> None:
            if info["inject"] is not None:
                raise_io = OSError(info["inject"], "injected: " + errno.errorcode[info["inject"]])
                from localstate.locking import io_error

                raise io_error(raise_io, "flush", self.directory)
            original(self)

        monkeypatch.setattr(FileChangelogPartition, "_sync", sync)
    try:
        yield info
    finally:
        if mounted:
            _remount(point, "rw")
            _umount(point)


def values(tmp_path: Path, changelog_root: Path, **extra: Any) -> dict[str, Any]:
    v = {
        "job.name": "res",
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(changelog_root),
        "systems.file.segment.bytes": 65536,
        "stores.kv.factory": "memory",
        "stores.kv.key.serde": "string",
        "stores.kv.msg.serde": "string",
        "stores.kv.object.cache.size": 1000,
        "stores.kv.write.batch.size": 200,
    }
    v.update(extra)
    return v


def dump(s: TaskStorage) -> dict[str, str]:
    with s.store("kv").all() as it:
        return dict(it)


def fill(fs: dict[str, Any], leave: int) -> Path | None:
    """Fill the tmpfs so that about ``leave`` bytes stay free."""
    if not fs["mounted"]:
        return None
    usage = shutil.disk_usage(fs["path"])
    filler = fs["path"] / "filler"
    with open(filler, "ab") as f:
        f.write(b"\0" * max(0, usage.free - leave))
    return filler


def make_full(fs: dict[str, Any], leave: int) -> None:
    if fs["mounted"]:
        fill(fs, leave)
    else:
        fs["inject"] = errno.ENOSPC


def free_up(fs: dict[str, Any]) -> None:
    if fs["mounted"]:
        (fs["path"] / "filler").unlink(missing_ok=True)
    fs["inject"] = None


@pytest.mark.parametrize("leave", [0, 4096, 10000, 24576])
def test_disk_full_during_commit_fails_loudly_then_recovers(tmp_path, small_fs, leave):
    """The disk fills up at different points of a commit (segment append, flush, the
    checkpoint file): the commit raises, the checkpoint stays at the last commit, and
    after space is freed the reopened task equals the last commit and commits again."""
    config = Config.from_dict(values(tmp_path, small_fs["path"] / "changelog",
                                     **{"systems.file.segment.bytes": 8192}))
    committed: dict[str, str] = {}
    with TaskStorage(config) as s:
        kv = s.store("kv")
        for i in range(50):
            kv.put(f"k{i}", "v" * 100)
        s.commit(input_position=1)
        committed = dump(s)
        make_full(small_fs, leave)
        failed = None
        for batch in range(2, 200):  # keep writing until the disk is full
            for i in range(20):
                kv.put(f"k{batch}-{i}", "x" * 200)
            try:
                s.commit(input_position=batch)
                committed = dump(s)
            except LocalStateError as e:
                failed = e
                break
        assert failed is not None, "the disk never filled up"
        assert isinstance(failed, ChangelogError), repr(failed)
        assert "disk is full" in str(failed) or "No space left" in str(failed)
        assert str(small_fs["path"]) in str(failed)
        position = s.checkpoint.input_position
        with pytest.raises(LocalStateError, match="previous commit .* failed"):
            s.commit(input_position=batch)  # refused until reopened
    free_up(small_fs)
    with TaskStorage(config) as s:
        assert s.checkpoint.input_position == position
        assert dump(s) == committed
        s.store("kv").put("after", "ok")
        s.commit(input_position=position + 1)
    with TaskStorage(config) as s:
        assert dump(s) == {**committed, "after": "ok"}
        assert s.checkpoint.input_position == position + 1


def test_changelog_turning_read_only_mid_task_fails_the_commit(tmp_path, monkeypatch):
    """Declared test double: a file system cannot be remounted read-only while the task
    holds files open for writing (EBUSY), so EROFS is injected at the changelog's
    flush — the call a read-only file system fails."""
    from localstate.locking import io_error

    config = Config.from_dict(values(tmp_path, tmp_path / "changelog"))
    s = TaskStorage(config)
    kv = s.store("kv")
    kv.put("a", "1")
    s.commit(input_position=1)
    kv.put("a", "2")
    kv.put("b", "2")

    def read_only(self: FileChangelogPartition) -> None:
        raise io_error(OSError(errno.EROFS, "Read-only file system"), "flush", self.directory)

    monkeypatch.setattr(FileChangelogPartition, "_sync", read_only)
    with pytest.raises(ChangelogError, match="read-only; point the path elsewhere") as e:
        s.commit(input_position=2)
    assert str(tmp_path / "changelog") in str(e.value)
    assert s.checkpoint.input_position == 1
    s.close()
    monkeypatch.undo()
    with TaskStorage(config) as s:
        assert s.checkpoint.input_position == 1 and dump(s) == {"a": "1"}
        s.store("kv").put("b", "3")
        s.commit(input_position=2)
    with TaskStorage(config) as s:
        assert dump(s) == {"a": "1", "b": "3"}


def test_read_only_changelog_mount_refuses_to_open_the_task(tmp_path, small_fs):
    if not small_fs["mounted"]:
        pytest.skip("needs a mount; the injected read-only case above covers the write path")
    config = Config.from_dict(values(tmp_path, small_fs["path"] / "changelog"))
    with TaskStorage(config) as s:
        s.store("kv").put("a", "1")
        s.commit(input_position=1)
    assert _remount(small_fs["path"], "ro")
    try:
        with pytest.raises(ChangelogError, match="read-only") as e:
            TaskStorage(config)
        assert str(small_fs["path"]) in str(e.value)
    finally:
        assert _remount(small_fs["path"], "rw")
    with TaskStorage(config) as s:
        assert s.checkpoint.input_position == 1 and dump(s) == {"a": "1"}


def test_read_only_state_dir_is_a_clear_error(tmp_path, small_fs):
    if not small_fs["mounted"]:
        pytest.skip("needs a mount; the changelog case above covers the injected form")
    state = small_fs["path"] / "state"
    state.mkdir()
    assert _remount(small_fs["path"], "ro")
    v = values(tmp_path, tmp_path / "changelog", **{"job.state.dir": str(state)})
    with pytest.raises(LocalStateError, match="read-only") as e:
        TaskStorage(Config.from_dict(v))
    assert str(state) in str(e.value)


@pytest.mark.kafka
def test_kafka_broker_stopped_mid_commit_then_resumed(fresh_kafka_broker, tmp_path):
    """SIGSTOP the broker while a commit is in flight and SIGCONT it 2 s later: the
    commit either rides out the pause (retries) or fails loudly; either way the reopened
    task equals what its checkpoint says, and the next commit is consistent."""
    v = values(tmp_path, tmp_path / "changelog", **{
        "job.changelog.system": "kafka",
        "stores.kv.changelog": "kafka.res-kv",
        "systems.kafka.bootstrap.servers": fresh_kafka_broker.bootstrap,
        "systems.kafka.timeout.ms": 1500,
        "systems.kafka.retries": 1,
        "systems.kafka.retry.backoff.ms": 200,
    })
    config = Config.from_dict(v)
    s = TaskStorage(config)
    kv = s.store("kv")
    for i in range(300):
        kv.put(f"k{i}", "a")
    s.commit(input_position=1)
    committed = dump(s)
    for i in range(150, 450):
        kv.put(f"k{i}", "b")
    expected_if_ok = dump(s)
    timer = threading.Timer(0.05, fresh_kafka_broker.pause)
    resume = threading.Timer(2.0, fresh_kafka_broker.resume)
    timer.start()
    resume.start()
    t0 = time.monotonic()
    try:
        s.commit(input_position=2)
        outcome = "ok"
    except ChangelogError as e:
        outcome = "failed"
        assert fresh_kafka_broker.bootstrap in str(e)
    finally:
        timer.join()
        resume.join()
    assert time.monotonic() - t0 < 60
    s.close()
    moved = Config.from_dict({**v, "job.state.dir": str(tmp_path / "machine-b")})
    with TaskStorage(moved) as s2:
        pos = s2.checkpoint.input_position
        if outcome == "ok":
            assert (pos, dump(s2)) == (2, expected_if_ok)
        else:  # a commit that timed out client-side may still have landed: state matches position
            assert (pos, dump(s2)) in ((1, committed), (2, expected_if_ok))
        s2.store("kv").put("z", "after")
        s2.commit(input_position=pos + 1)
        final = dump(s2)
    with TaskStorage(Config.from_dict({**v, "job.state.dir": str(tmp_path / "machine-c")})) as s3:
        assert dump(s3) == final and s3.checkpoint.input_position == pos + 1

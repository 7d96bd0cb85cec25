"""The tag of a local copy (the identity of the log it was built from,
``localstate.rescale_copies``): a cut uncommitted tail gives the file log a new identity,
so the copy the task restored keeps serving its later opens (no replay), while a copy of
the cut tail elsewhere is rebuilt; an untagged copy (written before the tag existed) is
rebuilt once. Real RocksDB and LevelDB files, file changelog."""

from __future__ import annotations

import pytest
from localstate import Config, TaskStorage
from localstate.faults import InjectedFault, configure
from localstate.rescale_copies import TAG_FILE
from localstate.testing.rescale_jobs import USERS, job_values


@pytest.mark.parametrize("factory", ["rocksdb", "leveldb"])
def test_after_a_cut_tail_the_restored_copy_is_kept_without_a_replay(tmp_path, factory):
    """A task attempt writes past its last commit and dies (Spark retries the batch): the
    next open restores to the commit and cuts the tail. Opens after that reuse the local
    copy (0 records replayed) instead of replaying the log below a horizon past the tail."""
    config = Config.from_dict(job_values(tmp_path, factory, 1))
    with TaskStorage(config, 0) as storage:
        storage.store("counts").put_all({u: {"n": 1} for u in USERS})
        storage.commit("p1")
    storage = TaskStorage(config, 0)  # a failed attempt: its writes reach the log, never committed
    storage.store("counts").put_all({u: {"n": -1} for u in USERS[:50]})
    configure("commit.after_changelog_flush=raise")
    try:
        with pytest.raises(InjectedFault):
            storage.commit("p2")
    finally:
        configure("")
        storage.close()
    with TaskStorage(config, 0) as storage:  # the retry: restores to the commit, cuts the tail
        assert storage.changelog("counts").end_offset() == len(USERS)
        assert storage.store("counts")[USERS[0]] == {"n": 1}
        storage.commit("p1")
    for _ in range(2):
        with TaskStorage(config, 0) as storage:
            assert storage.last_restore["counts"].records == 0
            with storage.store("counts").all() as items:
                assert dict(items) == {u: {"n": 1} for u in USERS}


def test_an_untagged_copy_is_rebuilt_once(tmp_path):
    # nothing shipped beside the log: the rebuild replays the changelog
    config = Config.from_dict({**job_values(tmp_path, "rocksdb", 1), "systems.file.snapshots": False})
    with TaskStorage(config, 0) as storage:
        storage.store("counts").put_all({u: {"n": 1} for u in USERS})
        storage.commit("p1")
    tag = tmp_path / "state" / "clicks" / "counts" / "0" / TAG_FILE
    assert tag.is_file()
    tag.unlink()  # as the release before the tag left it
    with TaskStorage(config, 0) as storage:
        assert storage.last_restore["counts"].records == len(USERS)
        with storage.store("counts").all() as items:
            assert dict(items) == {u: {"n": 1} for u in USERS}
    with TaskStorage(config, 0) as storage:
        assert storage.last_restore["counts"].records == 0

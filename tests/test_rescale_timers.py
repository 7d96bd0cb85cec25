"""Rescaling a job with timers: the timers store's record keys carry the key each timer
was registered for (the input key), so ``stores.<timers>.rescale.key = timer`` moves
every timer to the task its key's rows go to; after the rescale each timer fires exactly
once, at that task. Without the setting the refusal names it."""

from __future__ import annotations

import pytest
from localstate import Config, ConfigError, TaskStorage
from localstate.partitioning import task_for
from localstate.rescale import rescale
from localstate.testing.rescale_jobs import USERS, job_values, tree_digest
from localstate.timers import EVENT_TIME, PROCESSING_TIME, Timers

TIMERS = {"stores.timers.factory": "rocksdb", "stores.timers.key.serde": "bytes", "stores.timers.msg.serde": "bytes"}


def _timers(storage: TaskStorage, domain: bytes = EVENT_TIME) -> Timers:
    return Timers(storage.store("timers"), domain, lambda: storage.event_time or 0)


def _seed(config: Config) -> dict[tuple[str, int], int]:
    """Every task registers event-time timers (and a processing-time one) for its users;
    some fire before the rescale. Returns the pending event-time timers -> old task."""
    pending: dict[tuple[str, int], int] = {}
    n = config.partitions
    for p in range(n):
        with TaskStorage(config, p) as storage:
            storage.advance_event_time(1_000)
            timers = _timers(storage)
            for i, user in enumerate(u for u in USERS[:120] if task_for(u, n) == p):
                timers.register(user, 2_000 + i)  # fires before the rescale
                timers.register(user, 10_000 + i)
                pending[(user, 10_000 + i)] = p
                _timers(storage, PROCESSING_TIME).register(user, 1 << 60)
            storage.store("counts").put_all({u: {"n": 1} for u in USERS[:120] if task_for(u, n) == p})
            storage.advance_event_time(5_000)
            fired: list = []
            timers.fire(lambda k, ts, fired=fired: fired.append((k, ts)))
            assert fired and all(ts < 5_000 for _, ts in fired)
            storage.commit("same", version=1)
    return pending


@pytest.mark.parametrize("to", [3, 6])
def test_a_job_with_timers_is_rescaled_and_each_timer_fires_once_at_its_new_task(tmp_path, to):
    config = Config.from_dict(job_values(tmp_path, "rocksdb", 4, **TIMERS))
    pending = _seed(config)
    digest = tree_digest(tmp_path)
    with pytest.raises(ConfigError, match="set stores.timers.rescale.key = timer"):
        rescale(config, to)
    assert tree_digest(tmp_path) == digest
    timed = config.with_overrides({"stores.timers.rescale.key": "timer"})
    new = rescale(timed, to).config
    fired: dict[tuple, list[int]] = {}
    for q in range(to):
        with TaskStorage(new, q) as storage:
            assert storage.event_time == 5_000
            timers = _timers(storage)
            assert all(task_for(k, to) == q for k, _ in timers.pending())
            assert len(_timers(storage, PROCESSING_TIME).pending()) == sum(
                1 for u in USERS[:120] if task_for(u, to) == q)
            storage.advance_event_time(30_000)
            timers.fire(lambda k, ts, q=q: fired.setdefault((k, ts), []).append(q))
            storage.commit("same", version=2)
    assert set(fired) == set(pending)  # every pending timer, none of those fired before
    assert all(qs == [task_for(k, to)] for (k, _), qs in fired.items())  # once, at the key's task
    for q in range(to):  # committed: nothing fires again
        with TaskStorage(new, q) as storage:
            assert _timers(storage).pending() == []

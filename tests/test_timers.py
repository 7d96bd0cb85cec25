"""Timers (localstate.timers) and their use in StreamTask: order, persistence, bad input."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest
from localstate import ConfigError, InvalidValueError, TaskStorage
from localstate.contrib.spark.runner import Emitter, StreamTask, TaskContext, TaskRun, run_partition
from localstate.timers import EVENT_TIME, PROCESSING_TIME, Timers

TIMERS = {"factory": "memory", "object.cache.size": 64, "write.batch.size": 16}


def event_timers(st: TaskStorage) -> Timers:
    return Timers(st.store("timers"), EVENT_TIME, lambda: st.event_time or 0)


def test_timers_fire_in_timestamp_then_key_order_once(make_config):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = event_timers(st)
        for key, ts in [("b", 5), ("a", 5), ("z", -3), (("x", 1), 10), ("a", 5), (7, 1)]:
            t.register(key, ts)
        assert t.pending() == [("z", -3), (7, 1), ("a", 5), ("b", 5), (("x", 1), 10)]  # ("a", 5) once
        t.delete("b", 5)
        t.delete("never", 99)  # not an error
        fired: list[tuple[Any, int]] = []
        assert t.fire(lambda k, ts: fired.append((k, ts)), up_to=5) == 3
        assert fired == [("z", -3), (7, 1), ("a", 5)]
        assert t.fire(lambda k, ts: fired.append((k, ts)), up_to=5) == 0  # fired timers are gone
        assert t.pending() == [(("x", 1), 10)]


def test_a_timer_in_the_past_fires_at_the_next_advance_in_order(make_config):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        st.advance_event_time(100)
        t = event_timers(st)
        t.register("late", 50)  # already passed: fires at the next fire(), as in Flink
        fired: list[tuple[Any, int]] = []

        def on_timer(key: Any, ts: int) -> None:
            fired.append((key, ts))
            if key == "late":
                t.register("chained", 60)  # registered while firing, already due: fires in this call
                t.register("future", 500)

        t.register("on-time", 100)
        assert t.fire(on_timer) == 3
        assert fired == [("late", 50), ("chained", 60), ("on-time", 100)]
        assert t.pending() == [("future", 500)]


def test_event_and_processing_timers_are_separate(make_config):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        ev = event_timers(st)
        pt = Timers(st.store("timers"), PROCESSING_TIME, lambda: time.time_ns() // 1_000_000)
        ev.register("k", 10)
        pt.register("k", 10)
        assert ev.pending() == [("k", 10)] and pt.pending() == [("k", 10)]
        assert pt.fire(lambda k, ts: None) == 1  # wall clock is far past 10
        assert ev.pending() == [("k", 10)] and pt.pending() == []


def test_timers_are_committed_and_restored_with_the_state(make_config):
    config = make_config(timers=TIMERS)
    with TaskStorage(config) as st:
        t = event_timers(st)
        t.register_all([f"k{i}" for i in range(100)], range(100))
        st.advance_event_time(9)
        assert t.fire(lambda k, ts: None) == 10
        st.commit()
        t.register("uncommitted", 1)
        assert t.fire(lambda k, ts: None, up_to=50) == 42  # k10..k50 and "uncommitted", never committed
        st.store("timers").flush()
    with TaskStorage(config) as st:
        t = event_timers(st)
        assert st.event_time == 9
        assert t.pending()[:2] == [("k10", 10), ("k11", 11)] and len(t.pending()) == 90
        assert ("uncommitted", 1) not in t.pending()


def test_fire_batch_gives_chunks_in_order(make_config):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = event_timers(st)
        t.register_all(range(1000, 0, -1), range(1000, 0, -1))
        seen: list[int] = []
        assert t.fire_batch(lambda keys, stamps: seen.extend(stamps), up_to=700, chunk=128) == 700
        assert seen == list(range(1, 701))


@pytest.mark.parametrize("factory", ["memory", "rocksdb"])
def test_fire_batch_fires_what_on_timers_registers_even_before_the_last_fired_timer(make_config, factory):
    # each chunk's scan resumes after the previous chunk; a timer registered while firing
    # that sorts before that point must still fire (the scan restarts at the domain start)
    with TaskStorage(make_config(timers={**TIMERS, "factory": factory})) as st:
        t = event_timers(st)
        t.register_all([f"k{i:04d}" for i in range(300)], [i * 2 for i in range(300)])
        seen: list[tuple[Any, int]] = []

        def on_timers(keys: list[Any], stamps: list[int]) -> None:
            seen.extend(zip(keys, stamps))
            if len(seen) == 100:
                t.register_all(["early", "due-late", "future"], [1, 500, 10_000])

        assert t.fire_batch(on_timers, up_to=598, chunk=100) == 302
        assert seen[100] == ("early", 1)  # the next chunk: the rescan finds it first
        assert [ts for _, ts in seen[101:]] == sorted(ts for _, ts in seen[101:])
        assert ("due-late", 500) in seen and len(set(seen)) == 302
        assert t.pending() == [("future", 10_000)]


@pytest.mark.parametrize("factory", ["memory", "rocksdb"])
def test_fire_resumes_after_each_chunk_and_fires_everything_once(make_config, factory):
    with TaskStorage(make_config(timers={**TIMERS, "factory": factory})) as st:
        t = event_timers(st)
        n = 10_000  # more than one scan chunk of fire()
        t.register_all([f"u{i}" for i in range(n)], [i % 97 for i in range(n)])
        fired: list[tuple[Any, int]] = []
        assert t.fire(lambda k, ts: fired.append((k, ts)), up_to=96) == n
        assert len(set(fired)) == n and [ts for _, ts in fired] == sorted(ts for _, ts in fired)
        assert t.pending() == []


def test_register_all_collapses_duplicates_and_checks_every_timestamp(make_config):
    import numpy as np

    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = event_timers(st)
        t.register_all(["a", "a", "b"], [5, 5, np.int64(7)])  # numpy ints are ints
        t.register_all([], [])
        assert t.pending() == [("a", 5), ("b", 7)]
        with pytest.raises(InvalidValueError, match="'x'"):
            t.register_all(["k1", "k2"], [3, "x"])  # the bad one is named; nothing stored
        with pytest.raises(InvalidValueError, match="timestamp must be an int"):
            t.register_all(["k1", "k2"], [3, -(1 << 63) - 1])
        assert t.pending() == [("a", 5), ("b", 7)]


@pytest.mark.parametrize("ts", [1.5, "10", True, None, 1 << 64])
def test_bad_timestamps_are_errors_that_change_nothing(make_config, ts):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = event_timers(st)
        with pytest.raises(InvalidValueError, match="timestamp must be an int"):
            t.register("k", ts)
        with pytest.raises(InvalidValueError):
            t.register_all(["k"], [ts])
        assert t.pending() == []


def test_bad_keys_and_mismatched_batches(make_config):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = event_timers(st)
        with pytest.raises(InvalidValueError, match="timer key"):
            t.register({"a": 1}, 5)
        with pytest.raises(InvalidValueError, match="2 keys but 1 timestamps"):
            t.register_all(["a", "b"], [1])
        assert t.pending() == []


# -- in a StreamTask (the runner's partition loop, driven without Spark) ------------------------------
class SessionEnd(StreamTask):
    """Emits (user, last_seen) once a user has been quiet for 100 ms of event time."""

    event_time_column = "ts"
    OUTPUT = pa.schema([("user", pa.string()), ("ended_at", pa.int64())])

    def init(self, context: TaskContext) -> None:
        self.last = context.store("last")
        self.timers = context.timers

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        user, ts = record["user"], record["ts"]
        previous = self.last.get(user)
        if previous is not None:
            self.timers.delete(user, previous + 100)
        self.last[user] = ts
        self.timers.register(user, ts + 100)

    def on_timer(self, key: Any, ts: int, emit: Emitter) -> None:
        emit({"user": key, "ended_at": ts})
        self.last.delete(key)


def run(config: Any, rows: list[tuple[str, int]], task: type[StreamTask] = SessionEnd) -> list[tuple[str, int]]:
    batch = pa.record_batch({"user": [u for u, _ in rows], "ts": pa.array([t for _, t in rows], pa.int64())})
    out = pa.Table.from_batches(list(run_partition(TaskRun(config, task, SessionEnd.OUTPUT), 0, iter([batch]))),
                                schema=SessionEnd.OUTPUT)
    return list(zip(out["user"].to_pylist(), out["ended_at"].to_pylist()))


def stores(make_config: Any, **extra: Any) -> Any:
    return make_config(timers=TIMERS, last={"factory": "memory", "key.serde": "string", "msg.serde": "json"},
                       **extra)


def test_stream_task_timers_fire_when_the_watermark_passes_them(make_config):
    config = stores(make_config)
    assert run(config, [("a", 0), ("b", 50), ("a", 120)]) == []  # watermark 120: a's 100 was deleted
    # next run: watermark 400 passes b@150 and a@220, in timestamp order
    assert run(config, [("c", 400)]) == [("b", 150), ("a", 220)]
    assert run(config, [("c", 450)]) == []  # nothing fires twice across runs
    with TaskStorage(config) as st:
        assert st.event_time == 450
        assert st.store("last").get("a") is None and st.store("last")["c"] == 450


def test_stream_task_without_a_timers_store_is_told_how_to_add_one(make_config):
    config = make_config(last={"factory": "memory", "key.serde": "string", "msg.serde": "json"})
    with pytest.raises(ConfigError, match="stores.timers.factory"):
        run(config, [("a", 0)])


def test_timers_store_with_serdes_is_refused(make_config):
    config = make_config(timers={"factory": "memory", "key.serde": "string"},
                         last={"factory": "memory", "key.serde": "string", "msg.serde": "json"})
    with pytest.raises(ConfigError, match="key.serde = bytes"):
        run(config, [("a", 0)])


def test_event_time_column_must_exist_and_be_a_time(make_config):
    class Wrong(SessionEnd):
        event_time_column = "user"

    with pytest.raises(ConfigError, match="timestamp or an integer column"):
        run(stores(make_config), [("a", 0)], Wrong)


def test_a_task_that_registers_timers_but_has_no_on_timer(make_config):
    class NoCallback(SessionEnd):
        on_timer = StreamTask.on_timer  # type: ignore[assignment]

    with pytest.raises(NotImplementedError, match="on_timer"):
        run(stores(make_config), [("a", 0), ("b", 500)], NoCallback)


class Reminder(StreamTask):
    """Processing-time timers: remind once per user, at a wall-clock time already passed."""

    OUTPUT = SessionEnd.OUTPUT

    def init(self, context: TaskContext) -> None:
        self.timers = context.processing_timers

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        self.timers.register(record["user"], 1)  # long past: fires at the next check, once

    def on_timer(self, key: Any, ts: int, emit: Emitter) -> None:
        emit({"user": key, "ended_at": ts})


def test_processing_time_timers_fire_after_the_batch_that_registered_them(make_config):
    config = stores(make_config)
    assert sorted(run(config, [("a", 0), ("b", 0), ("a", 0)], Reminder)) == [("a", 1), ("b", 1)]
    assert run(config, [], Reminder) == []


@pytest.mark.spark
def test_timers_in_a_spark_batch_job(spark: Any, make_config: Any) -> None:
    from localstate.contrib.spark import StatefulJob

    config = stores(make_config)
    job = StatefulJob(config, SessionEnd, key="user", output_schema="user string, ended_at long")
    first = spark.createDataFrame([("a", 0), ("b", 50), ("c", 500)], "user string, ts long")
    assert sorted(tuple(r) for r in job.run(first).collect()) == [("a", 100), ("b", 150)]
    later = spark.createDataFrame([("d", 10_000)], "user string, ts long")
    assert [tuple(r) for r in job.run(later).collect()] == [("c", 600)]  # the pending timer, once
    with TaskStorage(config) as st:
        assert st.event_time == 10_000 and st.checkpoint.version == 1


def test_timers_store_must_be_a_key_value_store(make_config):
    config = make_config(timers={"factory": "topn"},
                         last={"factory": "memory", "key.serde": "string", "msg.serde": "json"})
    with pytest.raises(ConfigError, match="must be a key-value store"):
        run(config, [("a", 0)])


@pytest.mark.parametrize("ts", [1.5, True, "10", None])
def test_advance_event_time_takes_int_ms_only(make_config, ts):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        with pytest.raises(InvalidValueError, match="event time must be an int"):
            st.advance_event_time(ts)
        assert st.event_time is None
        st.advance_event_time(5)
        assert st.advance_event_time(3) == 5  # never moves back


def test_delete_all_removes_each_pair_and_checks_its_input(make_config):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = event_timers(st)
        t.register_all(["a", "b", "c"], [1, 2, 3])
        t.delete_all(["a", "c", "never"], [1, 3, 9])  # an absent timer is not an error
        t.delete_all([], [])
        assert t.pending() == [("b", 2)]
        with pytest.raises(InvalidValueError, match="2 keys but 1 timestamps"):
            t.delete_all(["a", "b"], [1])
        with pytest.raises(InvalidValueError, match="timestamp must be an int"):
            t.delete_all(["b"], [2.0])
        assert t.pending() == [("b", 2)]


@pytest.mark.parametrize("chunk", [0, -5, 2.0])
def test_fire_batch_refuses_a_chunk_that_would_fire_nothing_or_is_not_an_int(make_config, chunk):
    with TaskStorage(make_config(timers=TIMERS)) as st:
        t = event_timers(st)
        t.register("a", 1)
        with pytest.raises(InvalidValueError, match="chunk"):
            t.fire_batch(lambda keys, stamps: None, up_to=5, chunk=chunk)
        assert t.pending() == [("a", 1)]  # nothing fired, nothing deleted

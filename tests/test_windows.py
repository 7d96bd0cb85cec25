"""Windowed aggregation (localstate.windows): exact windows of every kind on memory and
rocksdb against an oracle, out-of-order and late records, session merges, emit-on-update,
restore mid-window, bad input, the page-views port byte for byte, and the Spark runner."""

from __future__ import annotations

import io
import random
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from localstate import ConfigError, InvalidValueError, TaskStorage
from localstate.contrib.spark.runner import Emitter, StreamTask, TaskContext, TaskRun, run_partition
from localstate.windows import (
    CLOCK,
    Aggregate,
    Count,
    Hopping,
    Max,
    Min,
    Reduce,
    Session,
    Sliding,
    Sum,
    Tumbling,
    WindowedAggregation,
)

from .test_spark_jobs import write_hour_files

ENGINES = ["memory", "rocksdb"]


_RUNS = iter(range(1 << 30))


def windows_config(make_config: Any, engine: str, serde: str = "msgpack", cache: int = 0) -> Any:
    """A config with one windows store ``w`` under a directory of its own (the parent of its state dir)."""
    probe = make_config()
    root = Path(probe.state_dir).parent / f"run{next(_RUNS)}"
    config = make_config({"job.state.dir": str(root / "state"), "systems.file.path": str(root / "changelog")},
                         w={"factory": engine, "key.serde": "tuple", "msg.serde": serde, "object.cache.size": cache})
    return config


def rows(table: pa.Table) -> list[tuple[int, int, Any, Any]]:
    return [(r["window_start"], r["window_end"], r["key"], r["value"]) for r in table.to_pylist()]


def feed(config: Any, windows: Any, aggregator: Any, batches: list[list[tuple[str, int, int]]], *,
         vectorised: bool, reopen: bool = False, final: int | None = None) -> tuple[list[Any], int]:
    """Feed each batch, close at the stream time after it, commit; then close at ``final``.
    With ``reopen`` every batch runs in a freshly opened (restored) TaskStorage."""
    out: list[Any] = []
    late = 0
    storage = TaskStorage(config, 0)
    try:
        for i, batch in enumerate(batches + [[]]):
            if reopen and i:
                storage.close()
                storage = TaskStorage(config, 0)
            op = WindowedAggregation(storage, "w", windows, aggregator)
            if vectorised:
                if batch:
                    keys, times, values = zip(*batch)
                    op.add_batch(pa.record_batch({"k": list(keys), "t": list(times), "v": list(values)}),
                                 key="k", time="t", value="v")
            else:
                for k, t, v in batch:
                    op.add(k, t, v)
            out += rows(op.close(final if i == len(batches) else None))
            late += op.late_records
            storage.commit({"batch": i})
    finally:
        storage.close()
    return out, late


def random_batches(seed: int, n: int = 400, keys: int = 4, span: int = 500, disorder: int = 60) -> list[Any]:
    """Mostly rising times with out-of-order records; a few far-behind (late) ones."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        t = i * span // n + rng.randint(-disorder, disorder)
        if rng.random() < 0.03:
            t -= 200  # far behind: late unless its window is still open
        records.append((f"k{rng.randrange(keys)}", t, rng.randint(1, 9)))
    cut = sorted(rng.sample(range(1, n), 8))
    return [records[a:b] for a, b in zip([0] + cut, cut + [n])]


def timed_oracle(batches: list[Any], size: int, hop: int, grace: int, fold: Any) -> tuple[list[Any], int]:
    """Tumbling/hopping windows: a record joins each window not closed at the last close."""
    windows: dict[tuple[int, str], list[int]] = defaultdict(list)
    closed_at = None
    stream = None
    late = 0
    for batch in batches:
        for k, t, v in batch:
            for s in range(t - t % hop, t - size, -hop):
                if closed_at is not None and s + size + grace <= closed_at:
                    late += 1
                else:
                    windows[(s, k)].append(v)
            stream = t if stream is None else max(stream, t)
        closed_at = stream if closed_at is None else max(closed_at, stream)
    return sorted((s, s + size, k, fold(vs)) for (s, k), vs in windows.items()), late


def sliding_oracle(batches: list[Any], size: int, grace: int, fold: Any) -> tuple[list[Any], int]:
    kept: dict[str, list[tuple[int, int]]] = defaultdict(list)
    closed_at = None
    stream = None
    late = 0
    for batch in batches:
        for k, t, v in batch:
            if closed_at is not None and t + grace <= closed_at:
                late += 1
            else:
                kept[k].append((t, v))
            stream = t if stream is None else max(stream, t)
        closed_at = stream if closed_at is None else max(closed_at, stream)
    out = []
    for k, recs in kept.items():
        for end in {t for t, _ in recs}:
            out.append((end - size, end, k, fold([v for t, v in recs if end - size <= t <= end])))
    return sorted(out), late


FOLDS = [(Count(), len), (Sum(), sum), (Min(), min), (Max(), max),
         (Reduce(lambda a, b: a + b), sum),
         (Aggregate(lambda: [0, 0], lambda acc, v: [acc[0] + v, acc[1] + 1], lambda a, b: [a[0] + b[0], a[1] + b[1]],
                    lambda acc: acc[0] * 1000 // acc[1]), lambda vs: sum(vs) * 1000 // len(vs))]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", ["tumbling", "hopping", "hopping-uneven"])
def test_time_windows_equal_the_oracle_on_both_paths(make_config: Any, engine: str, kind: str) -> None:
    size, hop = {"tumbling": (50, 50), "hopping": (60, 20), "hopping-uneven": (50, 20)}[kind]
    grace = 15
    windows = Tumbling(size, grace=grace) if kind == "tumbling" else Hopping(size, hop, grace=grace)
    for seed, (aggregator, fold) in enumerate(FOLDS):
        batches = random_batches(seed)
        expected, expected_late = timed_oracle(batches, size, hop, grace, fold)
        assert expected_late, "the input has late records"
        for vectorised in (True, False):
            config = windows_config(make_config, engine, "long" if fold in (len, sum, min, max) else "msgpack")
            out, late = feed(config, windows, aggregator, batches, vectorised=vectorised, final=1 << 40)
            assert sorted(out) == expected, (aggregator, vectorised)
            assert late == expected_late
            _wipe(config)


def _wipe(config: Any) -> None:
    """Remove the state and changelog of ``config`` (made by :func:`windows_config`)."""
    import shutil

    shutil.rmtree(Path(config.state_dir).parent, ignore_errors=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_sliding_windows_equal_the_oracle(make_config: Any, engine: str) -> None:
    for seed, (aggregator, fold) in enumerate(FOLDS[:2] + FOLDS[4:]):
        batches = random_batches(seed, n=200)
        expected, expected_late = sliding_oracle(batches, 40, 15, fold)
        assert expected_late
        for vectorised in (True, False):
            config = windows_config(make_config, engine)
            out, late = feed(config, Sliding(40, grace=15), aggregator, batches, vectorised=vectorised, final=1 << 40)
            assert sorted(out) == expected
            assert late == expected_late
            _wipe(config)


def session_oracle(records: list[tuple[str, int, int]], gap: int) -> list[Any]:
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for k, t, v in records:
        by_key[k].append((t, v))
    out = []
    for k, recs in by_key.items():
        recs.sort()
        run = [recs[0]]
        for t, v in recs[1:]:
            if t - run[-1][0] > gap:
                out.append((run[0][0], run[-1][0], k, sum(x for _, x in run)))
                run = []
            run.append((t, v))
        out.append((run[0][0], run[-1][0], k, sum(x for _, x in run)))
    return sorted(out)


@pytest.mark.parametrize("engine", ENGINES)
def test_sessions_of_shuffled_records_equal_the_offline_split(make_config: Any, engine: str) -> None:
    rng = random.Random(5)
    records = [(f"k{rng.randrange(3)}", rng.randrange(2000), rng.randint(1, 9)) for _ in range(300)]
    rng.shuffle(records)
    batches = [records[i:i + 50] for i in range(0, 300, 50)]
    for vectorised in (True, False):
        config = windows_config(make_config, engine)
        # grace covers the whole disorder: no session closes before the final close
        out, late = feed(config, Session(25, grace=5000), Sum(), batches, vectorised=vectorised, final=1 << 40)
        assert sorted(out) == session_oracle(records, 25) and late == 0
        _wipe(config)


@pytest.mark.parametrize("engine", ENGINES)
def test_sessions_with_late_records_are_the_same_per_record_and_per_batch(make_config: Any, engine: str) -> None:
    for seed in range(3):
        batches = random_batches(seed, n=300, keys=3)
        got = []
        for vectorised in (True, False):
            config = windows_config(make_config, engine)
            got.append(feed(config, Session(6, grace=10), Sum(), batches, vectorised=vectorised, final=1 << 40))
            _wipe(config)
        assert got[0] == got[1] and got[0][1] > 0, "late records were dropped alike"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_record_that_bridges_two_sessions_merges_them(make_config: Any, engine: str) -> None:
    config = windows_config(make_config, engine)
    with TaskStorage(config, 0) as storage:
        op = WindowedAggregation(storage, "w", Session(15, grace=100), Count(), emit="update")
        assert op.add("a", 100) == [(100, 100, "a", 1)]
        assert op.add("a", 105) == [(100, 105, "a", 2)]
        assert op.add("a", 130) == [(130, 130, "a", 1)]  # 25 after 105: a new session
        assert op.add("b", 118) == [(118, 118, "b", 1)]  # another key never merges
        assert op.add("a", 118) == [(100, 130, "a", 4)]  # within 15 of 105 and of 130: one session
        assert rows(op.close(1000)) == [(100, 130, "a", 4, ), (118, 118, "b", 1)]
        with storage.store("w").all() as left:
            assert [k for k, _ in left if k[0] != CLOCK] == []


@pytest.mark.parametrize("engine", ENGINES)
def test_late_records_are_dropped_and_counted_never_merged(make_config: Any, engine: str) -> None:
    config = windows_config(make_config, engine, "long")
    with TaskStorage(config, 0) as storage:
        op = WindowedAggregation(storage, "w", Tumbling(10, grace=5), Count())
        op.add_batch(pa.record_batch({"k": ["a", "a", "a"], "t": [1, 14, 3]}), key="k", time="t")
        assert rows(op.close()) == []  # [0, 10) closes at 10 + grace 5 > stream time 14
        op.add("a", 9)  # still open: 9 joins [0, 10), though 5 behind stream time
        op.add("a", 16)
        assert rows(op.close()) == [(0, 10, "a", 3)]
        op.add("a", 2)  # [0, 10) is closed: dropped, counted
        op.add_batch(pa.record_batch({"k": ["a", "b"], "t": [4, 12]}), key="k", time="t")
        assert op.late_records == 2 and storage.metrics("w").late_records == 2  # the store's metric too
        assert rows(op.close(40)) == [(10, 20, "a", 2), (10, 20, "b", 1)]
        storage.commit({"records": 8})
    # the clock is committed with the windows: a reopened operator still refuses the late record
    with TaskStorage(config, 0) as storage:
        op = WindowedAggregation(storage, "w", Tumbling(10, grace=5), Count())
        assert (op.stream_time, op.closed_at) == (16, 40)
        op.add("a", 7)
        assert op.late_records == 1 and rows(op.close(41)) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_emit_on_update_returns_every_change(make_config: Any, engine: str) -> None:
    config = windows_config(make_config, engine, "long")
    with TaskStorage(config, 0) as storage:
        op = WindowedAggregation(storage, "w", Hopping(10, 5, grace=0), Sum(), emit="update")
        assert op.add("a", 7, 2) == [(5, 15, "a", 2), (0, 10, "a", 2)]
        changed = op.add_batch(pa.record_batch({"k": ["a", "a"], "t": [8, 12], "v": [1, 4]}), key="k", time="t",
                               value="v")
        assert sorted(rows(changed)) == [(0, 10, "a", 3), (5, 15, "a", 7), (10, 20, "a", 4)]
        assert rows(op.close()) == [(0, 10, "a", 3)]  # the final value of what closed
    config = windows_config(make_config, engine)
    with TaskStorage(config, 0) as storage:
        op = WindowedAggregation(storage, "w", Sliding(10), Sum(), emit="update")
        assert op.add("a", 5, 1) == [(-5, 5, "a", 1)]
        assert op.add("a", 12, 2) == [(2, 12, "a", 3)]
        assert op.add("a", 3, 4) == [(-7, 3, "a", 4), (-5, 5, "a", 5), (2, 12, "a", 7)]
        # the same records as one batch: each changed window once, as it stands after the batch
        batch = pa.record_batch({"k": ["b", "b", "b", "c"], "t": [5, 12, 3, 40], "v": [1, 2, 4, 9]})
        changed = op.add_batch(batch, key="k", time="t", value="v")
        assert sorted(rows(changed)) == [(-7, 3, "b", 4), (-5, 5, "b", 5), (2, 12, "b", 7), (30, 40, "c", 9)]


@pytest.mark.parametrize("engine", ENGINES)
def test_reopen_mid_window_gives_the_same_final_output(make_config: Any, engine: str) -> None:
    batches = random_batches(3)
    for windows, aggregator, serde in [(Tumbling(50, grace=10), Count(), "long"), (Hopping(60, 20), Sum(), "long"),
                                       (Sliding(40, grace=10), Sum(), "msgpack"), (Session(8, grace=10), Sum(), "msgpack")]:
        for vectorised in (True, False):
            config = windows_config(make_config, engine, serde)
            straight = feed(config, windows, aggregator, batches, vectorised=vectorised, final=1 << 40)
            _wipe(config)
            restored = feed(config, windows, aggregator, batches, vectorised=vectorised, reopen=True, final=1 << 40)
            _wipe(config)
            assert straight == restored, windows


def test_bad_declarations_are_clear_errors(make_config: Any) -> None:
    for bad, match in [(lambda: Tumbling(0), "size must be >= 1"), (lambda: Tumbling(-5), "size must be >= 1"),
                       (lambda: Tumbling(10.0), "size must be an int"), (lambda: Tumbling(True), "size must be an int"),
                       (lambda: Hopping(10, 20), r"hop \(20\) must be <= size \(10\)"),
                       (lambda: Hopping(10, 0), "hop must be >= 1"),
                       (lambda: Tumbling(10, grace=-1), "grace must be >= 0"),
                       (lambda: Session(1.5), "gap must be an int"), (lambda: Sliding(10, grace=0.5), "grace must be an int")]:
        with pytest.raises(ConfigError, match=match):
            bad()
    config = make_config(w={"factory": "memory", "key.serde": "string", "msg.serde": "long"},
                         s={"factory": "memory", "key.serde": "tuple", "msg.serde": "long"})
    with TaskStorage(config, 0) as storage:
        with pytest.raises(ConfigError, match="key.serde = tuple"):
            WindowedAggregation(storage, "w", Tumbling(10), Count())
        with pytest.raises(ConfigError, match="stores.s.msg.serde = msgpack"):
            WindowedAggregation(storage, "s", Session(10), Count())
        with pytest.raises(ConfigError, match="does not declare"):
            WindowedAggregation(storage, "nope", Tumbling(10), Count())
        with pytest.raises(ConfigError, match="emit must be"):
            WindowedAggregation(storage, "s", Tumbling(10), Count(), emit="final")
        with pytest.raises(ConfigError, match="give Aggregate.* a merger"):
            WindowedAggregation(storage, "s", Session(10), Aggregate(list, lambda a, v: a + [v]))


def test_a_store_written_with_other_windows_is_refused_unchanged(make_config: Any) -> None:
    config = windows_config(make_config, "rocksdb", "long")
    with TaskStorage(config, 0) as storage:
        op = WindowedAggregation(storage, "w", Tumbling(10, grace=5), Count())
        op.add("a", 3)
        op.close()
        storage.commit({"records": 1})
    for other in (Tumbling(20, grace=5), Tumbling(10, grace=6), Hopping(10, 5, grace=5)):
        with TaskStorage(config, 0) as storage:
            with pytest.raises(ConfigError, match="store 'w' holds windows written with other window"):
                WindowedAggregation(storage, "w", other, Count())
    with TaskStorage(config, 0) as storage:
        with pytest.raises(ConfigError, match="other window or aggregate settings"):
            WindowedAggregation(storage, "w", Tumbling(10, grace=5), Sum())
        op = WindowedAggregation(storage, "w", Tumbling(10, grace=5), Count())
        assert rows(op.close(100)) == [(0, 10, "a", 1)]


@pytest.mark.parametrize("vectorised", [True, False])
def test_records_without_event_time_are_refused_naming_the_column(make_config: Any, vectorised: bool) -> None:
    config = windows_config(make_config, "memory", "long", cache=0 if vectorised else 1000)
    with TaskStorage(config, 0) as storage:
        op = WindowedAggregation(storage, "w", Tumbling(10), Count())
        with pytest.raises(InvalidValueError, match="no event time .*column 'ts'"):
            op.add_batch(pa.record_batch({"user": ["a", "b"], "ts": [1, None]}), key="user", time="ts")
        with pytest.raises(InvalidValueError, match="event-time column 'ts' has type double"):
            op.add_batch(pa.record_batch({"user": ["a"], "ts": [1.5]}), key="user", time="ts")
        with pytest.raises(InvalidValueError, match="time column 'when' is not an input column"):
            op.add_batch(pa.record_batch({"user": ["a"], "ts": [1]}), key="user", time="when")
        with pytest.raises(InvalidValueError, match="record with key 'a' has no event time"):
            op.add("a", None)  # type: ignore[arg-type]
        with pytest.raises(InvalidValueError, match="event time must be an int"):
            op.add("a", 1.5)  # type: ignore[arg-type]
        assert rows(op.close(100)) == []


# -- the page-views port ------------------------------------------------------------------------
def run_pageviews(task_cls: type, config: Any, table: pa.Table, chunks: int, *, per_record: bool = False) -> bytes:
    """Run every partition through the runner's commit path in ``chunks`` runs; the output
    batches in order as Arrow IPC bytes."""
    schema = _schema(task_cls.OUTPUT_SCHEMA)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema) as writer:
        keys = table.column(task_cls.KEY).to_pylist()
        for p in range(config.partitions):
            part = table.take(pa.array([i for i, k in enumerate(keys) if zlib.crc32(k.encode()) % config.partitions == p],
                                       pa.int64()))
            step = -(-part.num_rows // chunks) or 1
            for c in range(chunks):
                piece = part.slice(c * step, step)
                batches = iter(piece.to_batches(500))
                task = task_cls
                if per_record:
                    task = type("PerRecord", (task_cls,), {"process_batch": StreamTask.process_batch})
                for out in run_partition(TaskRun(config, task, schema, batch_id=c), p, batches):
                    writer.write_batch(out)
    return sink.getvalue()


def _schema(ddl: str) -> pa.Schema:
    types = {"long": pa.int64(), "string": pa.string()}
    return pa.schema([(name, types[t]) for name, t in (f.split() for f in ddl.split(", "))])


@pytest.mark.parametrize("engine", ENGINES)
def test_the_windowed_page_views_port_is_byte_identical(tmp_path: Path, engine: str) -> None:
    from localstate.contrib.spark.job_windowed import PageViewsPerHour, PageViewsPerHourWindowed
    from localstate.contrib.spark.jobs import job_config
    from localstate.contrib.spark.workload import generate

    views = PageViewsPerHour.input_table(generate(20_000, hours=5, seed=11))
    late = pa.table({"ts": [views["ts"][0].as_py()] * 3, "user_id": ["u1", "u2", "u3"]})  # late by the end
    views = pa.concat_tables([views, late])
    old = run_pageviews(PageViewsPerHour, job_config(PageViewsPerHour, tmp_path / "old", partitions=3,
                                                     engine=engine), views, chunks=4)
    new = run_pageviews(PageViewsPerHourWindowed, job_config(PageViewsPerHourWindowed, tmp_path / "new",
                                                             partitions=3, engine=engine), views, chunks=4)
    assert len(old) > 10_000 and new == old
    per_record = run_pageviews(PageViewsPerHourWindowed, job_config(PageViewsPerHourWindowed, tmp_path / "rec",
                                                                    partitions=3, engine=engine), views, chunks=4,
                               per_record=True)
    got = pa.ipc.open_stream(per_record).read_all()
    want = pa.ipc.open_stream(old).read_all()
    assert sorted(got.to_pylist(), key=str) == sorted(want.to_pylist(), key=str)


# -- a task on the runner ------------------------------------------------------------------------
class ClickSessions(StreamTask):
    """Clicks per user session (gap 30 s, grace 10 s), closed on the task's watermark."""

    OUTPUT = pa.schema([("user", pa.string()), ("start", pa.int64()), ("end", pa.int64()), ("clicks", pa.int64())])
    event_time_column = "ts"

    def init(self, context: TaskContext) -> None:
        self.context = context
        self.sessions = WindowedAggregation(context.storage, "sessions", Session(30_000, grace=10_000), Count())

    def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
        self.sessions.add_batch(batch, key="user", time="ts")

    def window(self, emit: Emitter) -> None:
        closed = self.sessions.close(self.context.watermark)
        emit.rows({"user": k, "start": s, "end": e, "clicks": n} for s, e, k, n in rows(closed))


def test_sessions_close_on_the_task_watermark_through_the_runner(make_config: Any) -> None:
    config = make_config(sessions={"factory": "rocksdb", "key.serde": "tuple", "msg.serde": "msgpack"})

    def run(batch_id: int, users: list[str], ts: list[int]) -> list[dict[str, Any]]:
        batch = pa.record_batch({"user": users, "ts": ts})
        out = run_partition(TaskRun(config, ClickSessions, ClickSessions.OUTPUT, batch_id=batch_id), 0, iter([batch]))
        return pa.Table.from_batches(list(out), ClickSessions.OUTPUT).to_pylist()

    assert run(0, ["a", "a", "b"], [0, 20_000, 5_000]) == []
    # watermark 90 s: a's merged session [0, 45 s] closes at 45 + 30 + 10 s, b's at 45 s
    assert run(1, ["a", "c"], [45_000, 90_000]) == [{"user": "a", "start": 0, "end": 45_000, "clicks": 3},
                                                    {"user": "b", "start": 5_000, "end": 5_000, "clicks": 1}]
    assert run(2, ["c"], [200_000]) == [{"user": "c", "start": 90_000, "end": 90_000, "clicks": 1}]


# -- Spark: StatefulJob ---------------------------------------------------------------------------
def test_the_windowed_port_on_spark_batch_and_stream_equals_the_hand_written_job(spark: Any, tmp_path: Path) -> None:
    """StatefulJob.run (two batch runs) and run_stream (a micro-batch per hour of input):
    the windowed port emits exactly what the hand-written job does."""
    from localstate.contrib.spark import StatefulJob
    from localstate.contrib.spark.job_windowed import PageViewsPerHour, PageViewsPerHourWindowed
    from localstate.contrib.spark.jobs import job_config, run_example
    from localstate.contrib.spark.workload import generate

    workload = generate(3_000, hours=3, seed=4)
    key = lambda r: (r["window_start"], r["user_id"])  # noqa: E731
    batch = {}
    for task in (PageViewsPerHour, PageViewsPerHourWindowed):
        out = run_example(task, spark, workload, tmp_path / f"batch-{task.NAME}", partitions=2, engine="rocksdb")
        batch[task] = sorted(out.output.to_pylist(), key=key)
    assert batch[PageViewsPerHour] and batch[PageViewsPerHourWindowed] == batch[PageViewsPerHour]

    source = tmp_path / "views"
    hours = write_hour_files(workload.page_views, source)
    streamed = {}
    for task in (PageViewsPerHour, PageViewsPerHourWindowed):
        config = job_config(task, tmp_path / f"stream-{task.NAME}", partitions=2, engine="rocksdb")
        stream = spark.readStream.schema("ts long, user_id string").option("maxFilesPerTrigger", 1).json(str(source))
        by_batch: dict[int, list[dict[str, Any]]] = {}

        def collect(df: Any, batch_id: int, by_batch: dict[int, Any] = by_batch) -> None:
            by_batch[batch_id] = sorted(df.toArrow().to_pylist(), key=key)

        job = StatefulJob(config, task, key="user_id", output_schema=task.OUTPUT_SCHEMA)
        query = job.run_stream(stream, checkpoint_location=str(tmp_path / f"ckpt-{task.NAME}"),
                               trigger={"availableNow": True}, output=collect)
        query.awaitTermination(300)
        streamed[task] = by_batch
    assert len(streamed[PageViewsPerHour]) == len(hours)
    assert streamed[PageViewsPerHourWindowed] == streamed[PageViewsPerHour]


# -- crash trials (core/testing/torture.py, --workload windows) --------------------------------------
def test_the_windows_workload_closes_windows_and_drops_late_records(tmp_path: Path) -> None:
    """The crash-free reference: the workload really emits, keeps windows open and drops late records."""
    from localstate.testing.torture import kill_plan, reference_run

    final = reference_run(kill_plan("rocksdb", (), batches=8, workload="windows"), tmp_path).states[-1]
    emitted = {k: n for k, n in final.items() if k.startswith("emitted:") and not k.startswith("emitted:late:")}
    assert len(emitted) > 20 and set(emitted.values()) == {1}
    assert {k.split(":")[1] for k in emitted} == {"session", "hopping"}
    assert sum(n for k, n in final.items() if k.startswith("emitted:late:")) > 0
    assert any(k.startswith("open:sessions:") for k in final) and any(k.startswith("open:hopping:") for k in final)


@pytest.mark.parametrize("engine", ENGINES)
def test_kills_around_window_closing_emit_every_window_exactly_once(engine: str, tmp_path: Path) -> None:
    from localstate.testing.torture import kill_plan, run_trial

    faults = ("windows.after_close=kill@3", "commit.after_changelog_flush=kill@2", "windows.after_close=kill@9",
              "checkpoint.before_rename=kill@2")
    result = run_trial(kill_plan(engine, faults, workload="windows"), tmp_path)
    assert result.ok, result.divergence
    assert result.crashes == len(faults), "a fault point was not reached: the kill did not happen"
    assert result.positions[0] == 0 and max(result.positions) > 0


def test_the_bench_suite_quick_form_checks_the_port_and_gives_a_ratio() -> None:
    from localstate.benchmarks import windows as bench
    from localstate.benchmarks.registry import SUITES

    assert SUITES["windows"][0] == "localstate.benchmarks.windows"
    rows = bench.run(quick=True, repeats=1)
    by = {(r["workload"], r["engine"].split(" ")[0]): r for r in rows}
    ported = by[("window_stream", "PageViewsPerHourWindowed")]
    assert ported["baseline"] == "PageViewsPerHour (hand-written)"
    assert ported["ratio"] == ported["median"] / by[("window_stream", "PageViewsPerHour")]["median"]
    assert {r["engine"] for r in rows if r["workload"] == "window_operator"} == set(bench.KINDS)
    assert all(r["median"] > 0 for r in rows)

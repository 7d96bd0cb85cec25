"""Keyed state handles (localstate.keyed): value, list, map, reducing, aggregating, scoped
to the current key, on the stores' engines, TTL, changelog and restore."""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import pyarrow as pa
import pytest
from localstate import ConfigError, InvalidValueError, StateReader, TaskStorage
from localstate.contrib.spark.task import Emitter, StreamTask, TaskContext
from localstate.keyed import NO_KEY, Aggregate, NoCurrentKeyError

ENGINES = ["memory", "rocksdb"]


def keyed_stores(engine: str, **ttl: Any) -> dict[str, dict[str, Any]]:
    base = {"factory": engine, "key.serde": "string", "object.cache.size": 100, "write.batch.size": 10}
    return {
        "last_seen": {**base, "msg.serde": "long", **ttl},
        "clicks": {**base, "msg.serde": "json"},
        "pages": {**base, "key.serde": "tuple", "msg.serde": "long", **ttl},
        "total": {**base, "msg.serde": "long"},
        "avg": {**base, "msg.serde": "json"},
        "plain": {**base, "msg.serde": "json"},
        "timers": {"factory": engine},
    }


MEAN = Aggregate(create=lambda: [0, 0], add=lambda acc, v: [acc[0] + v, acc[1] + 1],
                 result=lambda acc: acc[0] / acc[1])


def context(storage: TaskStorage) -> TaskContext:
    return TaskContext(partition=0, partitions=1, config=storage.config, storage=storage)


@pytest.mark.parametrize("engine", ENGINES)
def test_value_handle_is_scoped_to_the_current_key(make_config, engine):
    with TaskStorage(make_config(**keyed_stores(engine))) as st:
        keyed = context(st).keyed
        last = keyed.value("last_seen", int, key_type=str)
        keyed.key = "ann"
        assert last.get() is None and last.get(-1) == -1 and not last.exists()
        last.update(5)
        keyed.key = "bob"
        assert last.get() is None
        last.update(7)
        keyed.key = "ann"
        assert last.get() == 5 and last.exists()
        last.clear()
        assert last.get() is None
        assert dict(st.store("last_seen").items()) == {"bob": 7}  # the layout: the key itself


@pytest.mark.parametrize("engine", ENGINES)
def test_list_handle(make_config, engine):
    with TaskStorage(make_config(**keyed_stores(engine))) as st:
        keyed = context(st).keyed
        clicks = keyed.list("clicks", str)
        keyed.key = "ann"
        assert clicks.get() == [] and not clicks.exists()
        clicks.add("a")
        clicks.add_all(["b", "c"])
        got = clicks.get()
        got.append("not stored")  # get() is a copy
        assert clicks.get() == ["a", "b", "c"]
        keyed.key = "bob"
        clicks.update(["x"])
        assert clicks.get() == ["x"]
        clicks.update([])
        assert not clicks.exists()
        keyed.key = "ann"
        assert clicks.get() == ["a", "b", "c"]
        clicks.clear()
        assert clicks.get() == []


@pytest.mark.parametrize("engine", ENGINES)
def test_map_handle_iterates_one_keys_entries_only(make_config, engine):
    with TaskStorage(make_config(**keyed_stores(engine))) as st:
        keyed = context(st).keyed
        pages = keyed.map("pages", str, int)
        for user, entries in {"an": {"p1": 1, "p2": 2}, "ann": {"p0": 9}, "anna": {"p3": 3}}.items():
            keyed.key = user
            pages.put_all(entries)
        keyed.key = "ann"  # a prefix of "anna" as a string: not as a tuple element
        assert list(pages.items()) == [("p0", 9)]
        keyed.key = "an"
        assert list(pages.keys()) == ["p1", "p2"] and list(pages.values()) == [1, 2]
        assert pages.get("p1") == 1 and pages.get("zz", 0) == 0 and pages.contains("p2")
        pages.put("p1", 10)
        pages.remove("p2")
        pages.remove("absent")
        assert dict(pages.items()) == {"p1": 10}
        pages.clear()
        assert pages.is_empty() and not pages.exists()
        keyed.key = "anna"
        assert dict(pages.items()) == {"p3": 3}
        assert sorted(st.store("pages").keys()) == [("ann", "p0"), ("anna", "p3")]


@pytest.mark.parametrize("engine", ENGINES)
def test_reducing_and_aggregating_handles(make_config, engine):
    with TaskStorage(make_config(**keyed_stores(engine))) as st:
        keyed = context(st).keyed
        total = keyed.reducing("total", lambda a, b: a + b, int)
        avg = keyed.aggregating("avg", MEAN, list)
        for user, v in [("ann", 2), ("bob", 10), ("ann", 4)]:
            keyed.key = user
            total.add(v)
            avg.add(v)
        keyed.key = "ann"
        assert total.get() == 6 and avg.get() == 3.0
        keyed.key = "bob"
        assert total.get() == 10 and avg.get() == 10.0
        avg.clear()
        assert avg.get() is None and not avg.exists()
        keyed.key = "cid"
        assert total.get() is None and avg.get() is None


def test_no_current_key_is_an_error(make_config):
    with TaskStorage(make_config(**keyed_stores("memory"))) as st:
        keyed = context(st).keyed
        handles = [keyed.value("last_seen", int), keyed.list("clicks"), keyed.map("pages", str, int),
                   keyed.reducing("total", max, int), keyed.aggregating("avg", MEAN)]
        assert keyed.key is NO_KEY
        for handle in handles:
            with pytest.raises(NoCurrentKeyError, match="no current key.*context.keyed.key"):
                handle.get() if not hasattr(handle, "put") else handle.get("p")
        with pytest.raises(NoCurrentKeyError):
            handles[0].update(1)


def test_a_value_of_the_wrong_type_is_refused_before_anything_is_written(make_config):
    with TaskStorage(make_config(**keyed_stores("memory"))) as st:
        keyed = context(st).keyed
        last, clicks = keyed.value("last_seen", int), keyed.list("clicks", str)
        pages, total = keyed.map("pages", str, int), keyed.reducing("total", lambda a, b: str(a + b), int)
        keyed.key = "ann"
        for call, match in [(lambda: last.update("5"), "values are int, got str '5'"),
                            (lambda: last.update(None), "None; use clear"),
                            (lambda: clicks.add_all(["ok", 3]), "elements are str, got int 3"),
                            (lambda: pages.put(1, 1), "map keys are str, got int 1"),
                            (lambda: pages.put_all({"a": 1, "b": "x"}), "values are int, got str 'x'"),
                            (lambda: total.add(1.5), "values are int, got float")]:
            with pytest.raises(InvalidValueError, match=match):
                call()
            assert "nothing was written" in str(pytest.raises(InvalidValueError, call).value)
        total.add(1)
        with pytest.raises(InvalidValueError, match="reduce results are int, got str '2'"):
            total.add(1)
        assert total.get() == 1
        for name in ("last_seen", "clicks", "pages"):
            assert list(st.store(name).items()) == []


def test_declaration_errors(make_config):
    stores = keyed_stores("memory")
    stores["heap"] = {"factory": "topn", "topn.size": 3}
    with TaskStorage(make_config(**stores)) as st:
        ctx = context(st)
        keyed = ctx.keyed
        ctx.store("plain")
        with pytest.raises(ConfigError, match="'plain' is already the task's plain store"):
            keyed.value("plain")
        with pytest.raises(ConfigError, match="'timers' is already the task's timer store"):
            keyed.value("timers")
        keyed.value("last_seen", int)
        with pytest.raises(ConfigError, match="declared twice"):
            keyed.map("last_seen")
        with pytest.raises(ConfigError, match="handle 'last_seen'"):
            ctx.store("last_seen")
        with pytest.raises(ConfigError, match="does not declare.*stores.last_sen.factory.*Did you mean 'last_seen'"):
            keyed.value("last_sen")
        with pytest.raises(ConfigError, match=r"stores.heap.factory = 'topn' is not an ordered key-value"):
            keyed.map("heap")
        with pytest.raises(ConfigError, match="key.serde = tuple.*it has 'string'"):
            keyed.map("clicks")
        with pytest.raises(ConfigError, match="map keys are elements.*got 'dict'"):
            keyed.map("pages", dict, int)
        with pytest.raises(ConfigError, match="keyed value state 'total'.*asked for values of type str"):
            keyed.value("total", str)
        with pytest.raises(ConfigError, match="keyed list state 'total'.*type list"):
            keyed.list("total")


class LastSeen(StreamTask):
    """Per record: the key's previous timestamp and a timer; on_timer reads the key's state."""

    def init(self, context: TaskContext) -> None:
        self.last = context.keyed.value("last_seen", int)
        self.clicks = context.keyed.list("clicks", str)
        self.timers = context.timers

    def process(self, record: dict[str, Any], emit: Emitter) -> None:
        emit({"user": record["user"], "previous": self.last.get(), "clicks": len(self.clicks.get())})
        self.last.update(record["ts"])
        self.clicks.add(record["page"])
        self.timers.register(record["user"], record["ts"] + 100)

    def on_timer(self, key: Any, ts: int, emit: Emitter) -> None:
        emit({"user": key, "previous": self.last.get(), "clicks": -len(self.clicks.get())})
        self.clicks.clear()


OUT = pa.schema([("user", pa.string()), ("previous", pa.int64()), ("clicks", pa.int64())])


def run_last_seen(storage: TaskStorage, rows: list[dict[str, Any]], key_column: str | None = "user") -> list[dict]:
    task = LastSeen()
    ctx = TaskContext(partition=0, partitions=1, config=storage.config, storage=storage, key_column=key_column)
    task.init(ctx)
    emit = Emitter(OUT)
    batch = pa.RecordBatch.from_pylist(rows)
    ctx.observe_event_time(task, batch) if task.event_time_column else None
    ctx.process(task, batch, emit)
    storage.advance_event_time(max(r["ts"] for r in rows) + 1000)
    ctx.fire_timers(task, emit)
    assert ctx.keyed.key is NO_KEY  # not left at the last record's key
    return [r for b in emit.drain() for r in b.to_pylist()]


def test_the_runner_scopes_process_and_on_timer_to_the_key(make_config):
    with TaskStorage(make_config(**keyed_stores("rocksdb"))) as st:
        rows = [{"user": "ann", "ts": 1, "page": "a"}, {"user": "bob", "ts": 2, "page": "b"},
                {"user": "ann", "ts": 3, "page": "c"}]
        out = run_last_seen(st, rows)
        assert out[:3] == [{"user": "ann", "previous": None, "clicks": 0}, {"user": "bob", "previous": None, "clicks": 0},
                           {"user": "ann", "previous": 1, "clicks": 1}]
        assert out[3:] == [{"user": "ann", "previous": 3, "clicks": -2},  # timers in (ts, key) order: 101,
                           {"user": "bob", "previous": 2, "clicks": -1},  # 102, then ann's second at 103
                           {"user": "ann", "previous": 3, "clicks": 0}]
        with pytest.raises(NoCurrentKeyError):  # no key column known: process has no key
            run_last_seen(st, rows, key_column=None)


@pytest.mark.parametrize("engine", ENGINES)
def test_handles_are_changelogged_and_restored_exactly(make_config, engine, tmp_path):
    config = make_config(**keyed_stores(engine))
    with TaskStorage(config) as st:
        keyed = context(st).keyed
        last, pages, avg = keyed.value("last_seen", int), keyed.map("pages", str, int), keyed.aggregating("avg", MEAN)
        for i, user in enumerate(["ann", "bob", "ann", "cid"]):
            keyed.key = user
            last.update(i)
            pages.put(f"p{i}", i)
            avg.add(i)
        keyed.key = "cid"
        pages.clear()
        st.commit(input_position=4)
        keyed.key = "ann"
        last.update(99)  # never committed: gone after the restore
        pages.put("uncommitted", 1)
        st.store("last_seen").flush()
    import shutil

    shutil.rmtree(tmp_path / "state")  # the local copy lost: rebuilt from the changelog alone
    with TaskStorage(config) as st:
        keyed = context(st).keyed
        last, pages, avg = keyed.value("last_seen", int), keyed.map("pages", str, int), keyed.aggregating("avg", MEAN)
        keyed.key = "ann"
        assert last.get() == 2 and dict(pages.items()) == {"p0": 0, "p2": 2} and avg.get() == 1.0
        keyed.key = "cid"
        assert last.get() == 3 and pages.is_empty() and avg.get() == 3.0
    with StateReader(config, 0) as reader:
        assert reader.get("last_seen", "bob") == 1 and reader.get("pages", ("ann", "p2")) == 2


def test_ttl_per_handle_hides_expired_entries_also_from_the_reader(make_config):
    ttl = {"ttl.ms": 100, "ttl.time": "event"}
    config = make_config(**keyed_stores("rocksdb", **ttl))
    with TaskStorage(config) as st:
        keyed = context(st).keyed
        last, pages, clicks = keyed.value("last_seen", int), keyed.map("pages", str, int), keyed.list("clicks", str)
        st.advance_event_time(0)
        keyed.key = "ann"
        last.update(1)
        pages.put("old", 1)
        clicks.add("kept")  # the clicks store has no TTL
        st.advance_event_time(60)
        pages.put("new", 2)
        st.advance_event_time(100)  # last_seen and pages/old expire at 100; pages/new at 160
        assert last.get() is None and not last.exists()
        assert dict(pages.items()) == {"new": 2} and pages.get("old") is None
        assert clicks.get() == ["kept"]
        st.commit(input_position=1)
    with StateReader(config, 0) as reader:
        assert reader.get("last_seen", "ann") is None and reader.get("pages", ("ann", "old")) is None
        assert reader.get("pages", ("ann", "new")) == 2


# -- crash trials: `localstate torture --workload keyed-state` ------------------------------------
KEYED_WORKLOAD = "keyed-state"


def test_the_keyed_workload_exercises_every_handle(tmp_path):
    from localstate.testing.torture import kill_plan, reference_run

    ref = reference_run(kill_plan("rocksdb", (), batches=6, workload=KEYED_WORKLOAD), tmp_path)
    final = ref.states[-1]
    counters = {k: v for k, v in final.items() if k.startswith("s:")}
    assert counters and sum(v["n"] for v in counters.values()) == 6 * 40  # every row once
    assert any(v["timers"] for v in counters.values())  # timers fired, scoped to their key
    assert any(k.startswith("pages:") for k in final) and any(k.startswith("stats:") for k in final)
    assert any(k.startswith("total:") for k in final) and any(k.startswith("timer:") for k in final)
    written = {k for state in ref.states for k in state if k.startswith("pages:")}
    assert len(written) > len([k for k in final if k.startswith("pages:")])  # map entries expired (TTL)


@pytest.mark.parametrize("engine", ENGINES)
def test_kills_inside_commits_timers_and_ttl_sweeps_restore_the_handles_exactly(engine, tmp_path):
    from localstate.testing import FULL
    from localstate.testing.torture import kill_plan, run_trial

    faults = ("commit.after_changelog_flush=kill@1", "timers.after_fire=kill@2", "ttl.after_sweep=kill@2",
              "checkpoint.before_rename=kill@2")
    if not FULL:
        faults = faults[:3]
    result = run_trial(kill_plan(engine, faults, workload=KEYED_WORKLOAD), tmp_path)
    assert result.ok, result.divergence
    assert result.crashes == len(faults), "a fault point was not reached: the kill did not happen"


def test_random_trials_of_the_keyed_workload(tmp_path):
    from localstate.testing import FULL
    from localstate.testing.torture import run_trials

    report = run_trials("rocksdb", "file", 4 if FULL else 2, seed=31, batches=8, workload=KEYED_WORKLOAD,
                        workdir=tmp_path)
    assert not report.divergences, report.summary()["first_divergence"]


# -- the example job: per-user sessions (contrib/spark/job_keyed.py) ------------------------------
GAP = 30 * 60 * 1000


def session_input(users: int, seed: int, start_ms: int) -> list[dict[str, Any]]:
    """Views per user with in-session gaps of 1-10 min and session gaps of 40 min-3 h, in time order."""
    import random

    rng = random.Random(seed)
    rows = []
    for u in range(users):
        ts = start_ms + rng.randrange(GAP)
        for _ in range(rng.randrange(3, 25)):
            rows.append({"ts_ms": ts, "user_id": f"user{u}", "page": f"/p{rng.randrange(5)}",
                         "duration_ms": rng.randrange(100, 5000)})
            ts += rng.choice([rng.randrange(60_000, 600_000)] * 3 + [rng.randrange(40 * 60_000, 3 * 3600_000)])
    return sorted(rows, key=lambda r: (r["ts_ms"], r["user_id"]))


def oracle_sessions(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, int, int]]]:
    """``user -> [(start, end, views), ...]`` split at gaps of GAP or more."""
    out: dict[str, list[list[int]]] = {}
    for r in rows:
        sessions = out.setdefault(r["user_id"], [])
        if sessions and r["ts_ms"] < sessions[-1][1] + GAP:
            sessions[-1][1] = r["ts_ms"]
            sessions[-1][2] += 1
        else:
            sessions.append([r["ts_ms"], r["ts_ms"], 1])
    return {u: [tuple(s) for s in ss] for u, ss in out.items()}  # type: ignore[misc]


def emitted_and_open(config: Any, emitted: list[dict[str, Any]]) -> dict[str, list[tuple[int, int, int]]]:
    """The sessions the job emitted plus those still open in its committed state."""
    got: dict[str, list[tuple[int, int, int]]] = {}
    for r in emitted:
        got.setdefault(r["user_id"], []).append((r["session_start"], r["session_end"], r["views"]))
    for p in range(config.partitions):
        with StateReader(config, p) as reader, reader.store("session").all() as it:
            for user, (start, end, views, _total) in it:
                got.setdefault(user, []).append((start, end, views))
    return {u: sorted(ss) for u, ss in got.items()}


def run_sessions(config: Any, partition: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Task ``partition`` of the example over ``rows`` in batches of 17, as the runner runs it; committed."""
    from localstate.contrib.spark.job_keyed import UserSessions

    schema = pa.schema([(f.split()[0], pa.int64() if f.split()[1] == "long" else pa.string())
                        for f in UserSessions.OUTPUT_SCHEMA.split(", ")])
    with TaskStorage(config, partition) as st:
        task = UserSessions()
        ctx = TaskContext(partition=partition, partitions=config.partitions, config=config, storage=st,
                          key_column="user_id")
        task.init(ctx)
        emit = Emitter(schema)
        for i in range(0, len(rows), 17):
            batch = pa.RecordBatch.from_pylist(rows[i:i + 17])
            ctx.observe_event_time(task, batch)
            ctx.process(task, batch, emit)
            ctx.fire_timers(task, emit)
        st.commit(input_position=len(rows))
        return [r for b in emit.drain() for r in b.to_pylist()]


def test_user_sessions_example_without_spark(tmp_path):
    from localstate.contrib.spark.job_keyed import UserSessions
    from localstate.contrib.spark.jobs import job_config

    config = job_config(UserSessions, tmp_path, partitions=1, engine="rocksdb")
    rows = session_input(12, seed=3, start_ms=1_700_000_000_000)
    out = run_sessions(config, 0, rows)
    assert emitted_and_open(config, out) == oracle_sessions(rows)
    by_user: dict[str, list[dict[str, Any]]] = {}
    for r in out:
        by_user.setdefault(r["user_id"], []).append(r)
    for sessions in by_user.values():
        assert [s["session_no"] for s in sessions] == list(range(1, len(sessions) + 1))
        assert [s["lifetime_views"] for s in sessions] == list(accumulate(s["views"] for s in sessions))
        assert all(s["distinct_pages"] <= 5 and len(s["last_pages"].split(",")) <= 3 for s in sessions)


def test_rescale_moves_every_handle_entry_to_the_task_of_its_key(tmp_path):
    """The documented layout is what `localstate rescale` routes by: the key, or key[0] of a
    map handle's (key, map_key) entries."""
    from localstate.contrib.spark.job_keyed import UserSessions
    from localstate.contrib.spark.jobs import job_config
    from localstate.partitioning import spark_hash
    from localstate.rescale import rescale

    config = job_config(UserSessions, tmp_path, partitions=2, engine="memory")
    rows = session_input(16, seed=9, start_ms=1_700_000_000_000)
    for p in range(2):
        run_sessions(config, p, [r for r in rows if spark_hash(r["user_id"]) % 2 == p])

    def state(cfg: Any) -> dict[str, dict[Any, tuple[int, Any]]]:
        out: dict[str, dict[Any, tuple[int, Any]]] = {}
        for p in range(cfg.partitions):
            with StateReader(cfg, p) as reader:
                for name in ("session", "pages", "recent", "lifetime", "closed"):
                    with reader.store(name).all() as it:
                        out.setdefault(name, {}).update({k: (p, v) for k, v in it})
        return out

    before = state(config)
    assert before["pages"] and before["closed"]
    after_config = rescale(config, 3, input_position=1).config
    after = state(after_config)
    for name, entries in after.items():
        assert {k: v for k, (_, v) in entries.items()} == {k: v for k, (_, v) in before[name].items()}, name
        for key, (p, _) in entries.items():
            user = key[0] if name == "pages" else key
            assert p == spark_hash(user) % 3, (name, key, p)


def test_user_sessions_example_on_spark_restores_and_continues(spark, tmp_path):
    """The example through StatefulJob (the runner scopes process and on_timer to user_id):
    two runs, the local state deleted between them, so the second restores every handle
    from its changelog; emitted + open sessions equal the exact sessions after each."""
    import shutil

    from localstate.contrib.spark.job_keyed import UserSessions
    from localstate.contrib.spark.jobs import job_config
    from localstate.contrib.spark.runner import StatefulJob

    config = job_config(UserSessions, tmp_path, partitions=2, engine="rocksdb")
    # every run closes its tasks (no worker keeps one open): the state dir is deleted
    # between runs, and a worker closing a kept task could write into it meanwhile
    job = StatefulJob(config, UserSessions, key="user_id", output_schema=UserSessions.OUTPUT_SCHEMA,
                      keep_open_s=0)
    first = session_input(10, seed=5, start_ms=1_700_000_000_000)
    later = session_input(10, seed=6, start_ms=first[-1]["ts_ms"] + 4 * 3600_000)
    emitted: list[dict[str, Any]] = []
    seen: list[dict[str, Any]] = []
    for rows in (first, later):
        seen += rows
        df = spark.createDataFrame(pa.Table.from_pylist(rows).to_pandas()).coalesce(1)  # time order kept
        emitted += [r.asDict() for r in job.run(df).collect()]
        assert emitted_and_open(config, emitted) == oracle_sessions(seen)
        shutil.rmtree(tmp_path / "state")
    assert any(r["session_start"] >= later[0]["ts_ms"] for r in emitted)
    for r in emitted:  # the reducing handle counted every view up to the session's end, across the restore
        assert r["lifetime_views"] == sum(1 for v in seen if v["user_id"] == r["user_id"]
                                          and v["ts_ms"] <= r["session_end"])


def test_localstate_get_and_dump_hide_a_handles_expired_entries(tmp_path):
    """Processing-time TTL: the CLI reads the committed state with the task's visibility rule."""
    import time

    from click.testing import CliRunner
    from localstate import Config
    from localstate.cli import cli

    ttl_ms = 3000
    props = tmp_path / "job.properties"
    props.write_text(f"job.name = keyed\njob.state.dir = {tmp_path}/state\nsystems.file.path = {tmp_path}/log\n"
                     "stores.cart.factory = rocksdb\nstores.cart.key.serde = tuple\nstores.cart.msg.serde = long\n"
                     f"stores.cart.ttl.ms = {ttl_ms}\n")
    config = Config.load(props)
    with TaskStorage(config) as st:
        keyed = context(st).keyed
        cart = keyed.map("cart", str, int)
        keyed.key = "ann"
        put_at = time.time()
        cart.put("apple", 2)
        st.commit(input_position=1)
        runner = CliRunner()
        got = runner.invoke(cli, ["get", "-c", str(props), "cart", '["ann", "apple"]'])
        # the TTL leaves the first read seconds, even on a loaded machine
        assert got.exit_code == 0 and got.output.strip() == "2", got.output
        time.sleep(max(0.0, put_at + ttl_ms / 1000 + 0.05 - time.time()))
        # expired: gone for the handle and for every reader, swept or not
        assert cart.get("apple") is None
        got = runner.invoke(cli, ["get", "-c", str(props), "cart", '["ann", "apple"]'])
        assert got.exit_code == 1 and "is not in the committed state" in got.output
        dumped = runner.invoke(cli, ["dump", "-c", str(props), "cart"])
        assert dumped.exit_code == 0 and "apple" not in dumped.output


def test_the_keyed_bench_suite_gives_paired_rows(monkeypatch):
    from localstate.benchmarks import keyed_state
    from localstate.benchmarks.registry import SUITES
    from localstate.benchmarks.runner import normalize_row

    monkeypatch.setattr(keyed_state, "QUICK_RECORDS", 1000)
    rows = [normalize_row(r, "keyed") for r in keyed_state.run(quick=True, repeats=1)]
    assert all(r["error"] is None for r in rows)
    by = {(r["workload"], r["engine"]): r for r in rows}
    for engine in ENGINES:
        for op in keyed_state.OPS:
            handle, raw = by[(f"keyed {op}", engine)], by[(f"raw store {op}", engine)]
            assert handle["baseline"] == f"raw store {op}" and handle["ratio"] > 0 and raw["median"] > 0
    assert SUITES["keyed"][0] == "localstate.benchmarks.keyed_state"


def test_a_vectorised_task_sets_the_key_itself_and_none_is_left_after_the_batch(make_config):
    class Vectorised(StreamTask):
        def init(self, context: TaskContext) -> None:
            self.keyed = context.keyed
            self.total = context.keyed.reducing("total", int.__add__, int)

        def process_batch(self, batch: pa.RecordBatch, emit: Emitter) -> None:
            for user, n in zip(batch["user"].to_pylist(), batch["n"].to_pylist()):
                self.keyed.key = user
                self.total.add(n)

        def window(self, emit: Emitter) -> None:
            self.total.get()  # no current key here

    with TaskStorage(make_config(**keyed_stores("memory"))) as st:
        task = Vectorised()
        ctx = TaskContext(partition=0, partitions=1, config=st.config, storage=st, key_column="user")
        task.init(ctx)
        ctx.process(task, pa.RecordBatch.from_pylist([{"user": "a", "n": 2}, {"user": "b", "n": 1},
                                                      {"user": "a", "n": 3}]), Emitter(OUT))
        assert dict(st.store("total").items()) == {"a": 5, "b": 1} and ctx.keyed.key is NO_KEY
        with pytest.raises(NoCurrentKeyError, match="'total' used with no current key"):
            task.window(Emitter(OUT))

"""The example jobs: each task's logic against an independent recomputation, with real
stores and a real file changelog, across commits, task restarts and a machine loss;
then each job end to end on local Spark.

The harness below drives a task exactly as the runner does on an executor
(``TaskStorage`` → ``init`` → ``process_batch`` per Arrow batch → ``window`` →
``commit`` → ``close``), with a collecting emitter, so the task logic is tested
without Spark; the Spark tests then check the same jobs through ``StatefulJob``.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from localstate import Config, ConfigError, TaskStorage
from localstate.contrib.spark import TaskContext
from localstate.contrib.spark.job_engines import (
    DistinctViewers,
    ProfileSearch,
    TrendingPages,
    merge_top,
    search_profiles,
)
from localstate.contrib.spark.job_joins import (
    JOIN_WINDOW_S,
    AdClickJoin,
    PageViewEnrich,
    ProfileSettingsJoin,
)
from localstate.contrib.spark.job_windowed import ALLOWED_LATENESS_S, CLOCK_WINDOW, PageViewsPerHour
from localstate.contrib.spark.jobs import (
    JOBS,
    default_kv_engine,
    job_config,
    restore_state,
    run_example,
    snapshot_state,
)
from localstate.contrib.spark.workload import HOUR, generate

ENGINE = default_kv_engine()[0]


class Collect:
    """The emitter the harness passes to a task: collects every emitted row."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []

    def __call__(self, row: dict[str, Any]) -> None:
        self.out.append(row)

    def rows(self, rows: list[dict[str, Any]]) -> None:
        self.out.extend(rows)

    def arrow(self, batch: pa.RecordBatch) -> None:
        self.out.extend(batch.to_pylist())


def partition_of(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions


def run_task(
    task_cls: type,
    config: Config,
    table: pa.Table,
    *,
    chunks: int = 1,
    batch_rows: int = 1000,
    per_record: bool = False,
) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    """Feed ``table`` to every partition of the job in ``chunks`` runs; each run opens
    the partition's TaskStorage (restoring it), processes, windows, commits, closes.
    Returns the emitted rows and the last task instance per partition."""
    parts = [[] for _ in range(config.partitions)]
    for i, key in enumerate(table.column(task_cls.KEY).to_pylist()):
        parts[partition_of(key, config.partitions)].append(i)
    out = Collect()
    tasks: dict[int, Any] = {}
    for p, rows in enumerate(parts):
        mine = table.take(pa.array(rows, pa.int64()))
        step = -(-mine.num_rows // chunks) or 1
        for c in range(chunks):
            piece = mine.slice(c * step, step)
            with TaskStorage(config, p) as storage:
                ctx = TaskContext(partition=p, partitions=config.partitions, config=config, storage=storage)
                task = task_cls()
                task.init(ctx)
                for batch in piece.to_batches(batch_rows):
                    if per_record:
                        for record in batch.to_pylist():
                            task.process(record, out)
                    else:
                        task.process_batch(batch, out)
                task.window(out)
                storage.commit(input_position=c)
                task.close()
                tasks[p] = task
    return out.out, tasks


def store_items(config: Config, store: str) -> dict[Any, Any]:
    """The decoded contents of ``store`` over every partition."""
    items: dict[Any, Any] = {}
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage, storage.store(store).all() as it:
            items.update(it)
    return items


def open_windows(config: Config) -> dict[tuple[int, str], int]:
    """The windows the ``hourly`` store holds (without the task clock's two keys)."""
    return {k: v for k, v in store_items(config, "hourly").items() if k[0] != CLOCK_WINDOW}


@pytest.fixture(scope="module")
def workload() -> Any:
    return generate(20_000, hours=4, seed=11)


# -- 1. windowed aggregation ------------------------------------------------------------------------
def test_hourly_counts_emitted_plus_open_windows_equal_exact_counts(tmp_path: Path, workload: Any) -> None:
    config = job_config(PageViewsPerHour, tmp_path, partitions=3, engine=ENGINE)
    views = PageViewsPerHour.input_table(workload)
    out, tasks = run_task(PageViewsPerHour, config, views, chunks=3)
    exact = Counter((ts - ts % HOUR, u) for ts, u in zip(views["ts"].to_pylist(), views["user_id"].to_pylist()))
    emitted = Counter()
    for row in out:
        key = (row["window_start"], row["user_id"])
        assert key not in emitted, f"window {key} emitted twice"
        emitted[key] = row["views"]
    still_open = open_windows(config)
    assert not set(emitted) & set(still_open), "an emitted window is still in the store"
    assert emitted + Counter(still_open) == exact
    assert sum(t.late_events for t in tasks.values()) == 0
    # Closed windows were emitted: only the last hour (and lateness) can remain open.
    last_hour = workload.end - HOUR
    assert {ws for ws, _ in still_open} <= {last_hour, last_hour - HOUR}
    assert {row["window_start"] for row in out} == set(range(workload.start, last_hour, HOUR))


def test_hourly_per_record_path_equals_arrow_path(tmp_path: Path, workload: Any) -> None:
    views = PageViewsPerHour.input_table(workload).slice(0, 6000)
    fast = job_config(PageViewsPerHour, tmp_path / "fast", partitions=2, engine=ENGINE)
    slow = job_config(PageViewsPerHour, tmp_path / "slow", partitions=2, engine=ENGINE)
    out_fast, _ = run_task(PageViewsPerHour, fast, views, chunks=2)
    out_slow, _ = run_task(PageViewsPerHour, slow, views, chunks=2, per_record=True)
    key = lambda r: (r["window_start"], r["user_id"])  # noqa: E731
    assert sorted(out_fast, key=key) == sorted(out_slow, key=key)
    assert store_items(fast, "hourly") == store_items(slow, "hourly")


def test_hourly_late_event_is_dropped_and_counted(tmp_path: Path) -> None:
    config = job_config(PageViewsPerHour, tmp_path, partitions=1, engine=ENGINE)
    t0 = 1_767_225_600
    first = pa.table({"ts": [t0 + 10, t0 + 20, t0 + 2 * HOUR + 5 * 60], "user_id": ["a", "a", "b"]})
    out, _ = run_task(PageViewsPerHour, config, first)
    assert out == [{"window_start": t0, "user_id": "a", "views": 2}]
    late = pa.table({"ts": [t0 + 30, t0 + 2 * HOUR + 6 * 60], "user_id": ["a", "b"]})
    out, tasks = run_task(PageViewsPerHour, config, late)
    assert out == [] and tasks[0].late_events == 1
    assert open_windows(config) == {(t0 + 2 * HOUR, "b"): 2}
    # The hour mark plus the allowed lateness closes the last window.
    closer = pa.table({"ts": [t0 + 3 * HOUR + ALLOWED_LATENESS_S], "user_id": ["c"]})
    out, _ = run_task(PageViewsPerHour, config, closer)
    assert out == [{"window_start": t0 + 2 * HOUR, "user_id": "b", "views": 2}]
    assert store_items(config, "hourly")[(CLOCK_WINDOW, "watermark")] == t0 + 3 * HOUR + ALLOWED_LATENESS_S


def test_hourly_state_of_the_former_clock_store_layout_is_refused_unchanged(tmp_path: Path) -> None:
    """State committed by the layout before issue 17 (watermark in a store ``clock``) is
    refused with a message naming it, and nothing is written."""
    former = job_config(PageViewsPerHour, tmp_path, partitions=1, engine=ENGINE, extra={
        "stores.clock.factory": ENGINE, "stores.clock.key.serde": "string", "stores.clock.msg.serde": "long"})
    with TaskStorage(former, 0) as storage:
        storage.store("clock")["watermark"] = 1_767_225_600
        storage.store("hourly")[(1_767_225_600, "a")] = 3
        storage.commit({"rows": 3})
    config = job_config(PageViewsPerHour, tmp_path, partitions=1, engine=ENGINE)
    with pytest.raises(ConfigError, match="older PageViewsPerHour .* store 'clock'"):
        run_task(PageViewsPerHour, config, pa.table({"ts": [1_767_229_200], "user_id": ["b"]}))
    assert store_items(former, "hourly") == {(1_767_225_600, "a"): 3}
    assert store_items(former, "clock") == {"watermark": 1_767_225_600}


def write_hour_files(page_views: pa.Table, source: Path) -> list[int]:
    """``page_views`` as one JSON-lines file per hour under ``source``, oldest hour first by
    mtime (the file source takes one per micro-batch with ``maxFilesPerTrigger=1``); returns
    the hours' starts, in that order."""
    import json
    import os

    views = page_views.to_pylist()
    source.mkdir()
    hours = sorted({r["ts"] - r["ts"] % HOUR for r in views})
    for i, hour in enumerate(hours):
        path = source / f"hour-{i}.json"
        path.write_text("".join(json.dumps({"ts": r["ts"], "user_id": r["user_id"]}) + "\n"
                                for r in views if hour <= r["ts"] < hour + HOUR))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    return hours


# -- 2. table-table join --------------------------------------------------------------------------
def expected_join(table: pa.Table) -> dict[str, dict[str, Any]]:
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in table.to_pylist():
        k = (row["table"], row["user_id"])
        if k not in newest or row["ts"] >= newest[k]["ts"]:
            newest[k] = row
    joined = {}
    for (side, user), p in newest.items():
        s = newest.get(("settings", user))
        if side != "profile" or s is None or p["deleted"]:
            continue
        joined[user] = {"name": p["name"], "zip": p["zip"], "city": p["city"], "language": s["language"],
                        "theme": s["theme"], "notifications": s["notifications"], "ts": max(p["ts"], s["ts"])}
    return joined


def test_table_table_join_state_output_and_changelog_agree(tmp_path: Path, workload: Any) -> None:
    config = job_config(ProfileSettingsJoin, tmp_path, partitions=2, engine=ENGINE)
    table = ProfileSettingsJoin.input_table(workload)
    out, _ = run_task(ProfileSettingsJoin, config, table, chunks=3, batch_rows=300)
    expected = expected_join(table)
    assert len(expected) > 100 and any(r["op"] == "delete" for r in out)
    assert store_items(config, "joined") == expected
    # The output stream, applied in order, gives the same table.
    applied: dict[str, Any] = {}
    for row in out:
        if row["op"] == "delete":
            applied.pop(row["user_id"], None)
        else:
            applied[row["user_id"]] = {k: v for k, v in row.items() if k not in ("op", "user_id")}
    assert applied == expected
    # The joined store's changelog is the join's output stream: replaying it gives the table.
    from_changelog: dict[str, Any] = {}
    for p in range(config.partitions):
        with TaskStorage(config, p) as storage:
            end = storage.checkpoint.offsets["joined"]
            for key, value in storage.changelog("joined").read(0, end):
                if value is None:
                    from_changelog.pop(key.decode(), None)
                else:
                    from_changelog[key.decode()] = msgpack.unpackb(value)
    assert from_changelog == expected


def test_table_table_join_does_not_depend_on_arrival_order(tmp_path: Path, workload: Any) -> None:
    table = ProfileSettingsJoin.input_table(workload)
    order = list(range(table.num_rows))
    random.Random(3).shuffle(order)
    config = job_config(ProfileSettingsJoin, tmp_path, partitions=2, engine=ENGINE)
    run_task(ProfileSettingsJoin, config, table.take(pa.array(order)), chunks=2, batch_rows=500)
    assert store_items(config, "joined") == expected_join(table)


# -- 3. stream-table join --------------------------------------------------------------------------
def expected_enrich(table: pa.Table) -> list[dict[str, Any]]:
    """Sequential per-record processing in input order (the input is in ts order)."""
    zips: dict[str, str | None] = {}
    out = []
    for r in table.to_pylist():
        if r["kind"] == "profile":
            zips[r["user_id"]] = None if r["deleted"] else r["zip"]
        else:
            out.append({"ts": r["ts"], "user_id": r["user_id"], "page": r["page"], "zip": zips.get(r["user_id"])})
    return out


def test_stream_table_join_equals_sequential_enrichment(tmp_path: Path, workload: Any) -> None:
    config = job_config(PageViewEnrich, tmp_path, partitions=2, engine=ENGINE)
    table = PageViewEnrich.input_table(workload)
    out, _ = run_task(PageViewEnrich, config, table, chunks=3, batch_rows=2000)
    expected = expected_enrich(table)
    key = lambda r: (r["ts"], r["user_id"], r["page"])  # noqa: E731
    assert sorted(out, key=key) == sorted(expected, key=key)
    moved = Counter(r["user_id"] for r in workload.profiles.to_pylist())
    assert any(n > 1 for n in moved.values()), "the workload should contain profile changes"
    assert any(r["zip"] is None for r in out) and sum(r["zip"] is not None for r in out) > 0.9 * len(out)


# -- 4. stream-stream join --------------------------------------------------------------------------
def test_stream_stream_join_matches_within_window_and_expires_the_rest(tmp_path: Path, workload: Any) -> None:
    config = job_config(AdClickJoin, tmp_path, partitions=2, engine=ENGINE)
    table = AdClickJoin.input_table(workload)
    out, _ = run_task(AdClickJoin, config, table, chunks=3, batch_rows=700)
    imps = {r["impression_id"]: r for r in workload.impressions.to_pylist()}
    clicks = {r["impression_id"]: r["ts"] for r in workload.clicks.to_pylist()}
    matched = {i: c for i, c in clicks.items() if 0 <= c - imps[i]["ts"] <= JOIN_WINDOW_S}
    late = len(clicks) - len(matched)
    assert matched and late, "the workload should have both joinable and too-late clicks"
    by_id: dict[str, dict[str, Any]] = {}
    for row in out:
        assert row["impression_id"] not in by_id, "an impression was emitted twice"
        by_id[row["impression_id"]] = row
    assert {i for i, r in by_id.items() if r["clicked"]} == set(matched)
    for i, c in matched.items():
        r = by_id[i]
        assert (r["click_ts"], r["impression_ts"], r["ad_id"], r["user_id"]) == (
            c, imps[i]["ts"], imps[i]["ad_id"], imps[i]["user_id"])
    # Every impression is either emitted or still waiting inside the window.
    waiting = store_items(config, "impressions")
    assert set(by_id) | set(waiting) == set(imps) and not set(by_id) & set(waiting)
    # Expired and matched entries leave the expiry timers too: they are exactly what waits.
    waiting_clicks = store_items(config, "clicks")
    timers = expiry_timers(config)
    assert sorted(timers) == sorted([("i" + k, v[0]) for k, v in waiting.items()]
                                    + [("c" + k, ts) for k, ts in waiting_clicks.items()])
    assert set(waiting_clicks) <= set(clicks) - set(matched)


def expiry_timers(config: Any) -> list[tuple[Any, int]]:
    """The pending expiry timers of every partition of the ad-click join."""
    from localstate.timers import EVENT_TIME, Timers

    pending: list[tuple[Any, int]] = []
    for p in range(config.partitions):
        with TaskStorage(config, p) as st:
            pending += Timers(st.store("expiry"), EVENT_TIME, lambda: 0).pending()
    return pending


def test_stream_stream_join_click_before_impression(tmp_path: Path) -> None:
    config = job_config(AdClickJoin, tmp_path, partitions=1, engine=ENGINE)
    rows = [
        {"kind": "click", "impression_id": "i1", "ts": 1000, "user_id": "u", "ad_id": "a", "page": None},
        {"kind": "impression", "impression_id": "i1", "ts": 990, "user_id": "u", "ad_id": "a", "page": "/"},
        {"kind": "impression", "impression_id": "i2", "ts": 1001, "user_id": "v", "ad_id": "b", "page": "/x"},
    ]
    first, _ = run_task(AdClickJoin, config, pa.Table.from_pylist(rows[:1]))
    assert first == [] and store_items(config, "clicks") == {"i1": 1000}
    out, _ = run_task(AdClickJoin, config, pa.Table.from_pylist(rows[1:]))
    assert out == [{"impression_id": "i1", "user_id": "u", "ad_id": "a", "page": "/", "impression_ts": 990,
                    "click_ts": 1000, "clicked": True}]
    later = pa.Table.from_pylist([{"kind": "click", "impression_id": "zz", "ts": 1001 + JOIN_WINDOW_S + 5,
                                   "user_id": "w", "ad_id": "c", "page": None}])
    out, _ = run_task(AdClickJoin, config, later)
    assert [r["impression_id"] for r in out] == ["i2"] and out[0]["clicked"] is False
    assert store_items(config, "impressions") == {} and store_items(config, "clicks") == {"zz": 1606}


# -- restore after machine loss ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(JOBS))
def test_restore_after_machine_loss_gives_identical_state(tmp_path: Path, workload: Any, name: str) -> None:
    task = JOBS[name]
    config = job_config(task, tmp_path, partitions=2, engine=ENGINE)
    run_task(task, config, task.input_table(workload), chunks=2)
    before = snapshot_state(config)
    assert any(before.values()), "the job should leave state behind"
    report = restore_state(config)
    assert report.records > 0 and report.bytes > 0
    assert report.snapshot == before


# -- 5. special engines ---------------------------------------------------------------------------
def test_trending_pages_top_n_equals_exact_top_n(tmp_path: Path, workload: Any) -> None:
    config = job_config(TrendingPages, tmp_path, partitions=3, engine=ENGINE)
    views = TrendingPages.input_table(workload)
    out, _ = run_task(TrendingPages, config, views, chunks=2)
    exact = Counter(views["page"].to_pylist())
    top = merge_top(pa.Table.from_pylist(out), 10)
    assert [v for _, v in top] == [v for _, v in exact.most_common(10)]
    assert all(exact[page] == v for page, v in top)
    # Each task's list is its own best pages, best first.
    last = {}
    for row in out:
        last.setdefault(row["partition"], []).append(row)
    for rows in last.values():
        final = rows[-TrendingPages.TOP_N:]
        assert [r["rank"] for r in final] == list(range(1, len(final) + 1))
        assert [r["views"] for r in final] == sorted((r["views"] for r in final), reverse=True)


def test_distinct_viewers_estimates_are_close_to_exact(tmp_path: Path, workload: Any) -> None:
    config = job_config(DistinctViewers, tmp_path, partitions=2, engine=ENGINE)
    table = DistinctViewers.input_table(workload)
    out, _ = run_task(DistinctViewers, config, table, chunks=2)
    exact: dict[str, set[str]] = {}
    for page, user in zip(table["page"].to_pylist(), table["user_id"].to_pylist()):
        exact.setdefault(page, set()).add(user)
    latest = {r["page"]: r["distinct_viewers"] for r in out}
    assert set(latest) == set(exact)
    for page, users in exact.items():
        assert abs(latest[page] - len(users)) <= max(2, 0.03 * len(users)), (page, latest[page], len(users))


def test_profile_search_finds_current_profiles_only(tmp_path: Path, workload: Any) -> None:
    config = job_config(ProfileSearch, tmp_path, partitions=2, engine=ENGINE)
    profiles = ProfileSearch.input_table(workload)
    out, _ = run_task(ProfileSearch, config, profiles, chunks=2, batch_rows=400)
    current: dict[str, dict[str, Any]] = {}
    for row in profiles.to_pylist():
        if row["deleted"]:
            current.pop(row["user_id"], None)
        else:
            current[row["user_id"]] = row
    assert sum(r["indexed"] for r in out) >= len(current)
    city, interest = "Seattle", "jazz"
    expected = {u for u, r in current.items() if r["city"] == city and interest in r["bio"].split()}
    hits = search_profiles(config, f"city:{city.lower()} AND bio:{interest}", limit=10_000)
    assert expected and {user for user, _, _ in hits} == expected
    for user, _, doc in hits:
        assert doc["zip"] == current[user]["zip"] and doc["name"] == current[user]["name"]
    gone = {r["user_id"] for r in profiles.to_pylist() if r["deleted"]}
    assert gone and not gone & set(current)
    assert {u for u, _, _ in search_profiles(config, "likes", limit=100_000)} == set(current)


# -- on Spark ---------------------------------------------------------------------------------------
def check_hourly(config: Config, w: Any, out: list[dict[str, Any]]) -> None:
    views = w.page_views
    exact = Counter((ts - ts % HOUR, u) for ts, u in zip(views["ts"].to_pylist(), views["user_id"].to_pylist()))
    emitted = Counter({(r["window_start"], r["user_id"]): r["views"] for r in out})
    assert len(emitted) == len(out), "a window was emitted twice"
    assert emitted + Counter(open_windows(config)) == exact
    assert emitted


def check_join(config: Config, w: Any, out: list[dict[str, Any]]) -> None:
    assert store_items(config, "joined") == expected_join(ProfileSettingsJoin.input_table(w))
    assert out


def check_enrich(config: Config, w: Any, out: list[dict[str, Any]]) -> None:
    # Spark may deliver a key's rows in another order than the input's, so only users
    # whose ZIP never changed during the views have one right answer.
    profiles = w.profiles.to_pylist()
    changes = Counter(r["user_id"] for r in profiles)
    zip_of = {r["user_id"]: r["zip"] for r in profiles}
    assert len(out) == w.page_views.num_rows
    stable = [r for r in out if changes[r["user_id"]] == 1]
    assert stable and all(r["zip"] == zip_of[r["user_id"]] for r in stable)


def check_clicks(config: Config, w: Any, out: list[dict[str, Any]]) -> None:
    imps = {r["impression_id"]: r["ts"] for r in w.impressions.to_pylist()}
    matched = {r["impression_id"] for r in w.clicks.to_pylist()
               if 0 <= r["ts"] - imps[r["impression_id"]] <= JOIN_WINDOW_S}
    assert {r["impression_id"] for r in out if r["clicked"]} == matched
    emitted = [r["impression_id"] for r in out]
    waiting = store_items(config, "impressions")
    assert len(emitted) == len(set(emitted)) and set(emitted) | set(waiting) == set(imps)


def check_trending(config: Config, w: Any, out: list[dict[str, Any]]) -> None:
    exact = Counter(w.page_views["page"].to_pylist())
    assert [v for _, v in merge_top(pa.Table.from_pylist(out), 5)] == [v for _, v in exact.most_common(5)]


def check_distinct(config: Config, w: Any, out: list[dict[str, Any]]) -> None:
    exact: dict[str, set[str]] = {}
    for page, user in zip(w.page_views["page"].to_pylist(), w.page_views["user_id"].to_pylist()):
        exact.setdefault(page, set()).add(user)
    got = {r["page"]: r["distinct_viewers"] for r in out}
    assert set(got) == set(exact)
    assert all(abs(got[p] - len(u)) <= max(2, 0.03 * len(u)) for p, u in exact.items())


def check_search(config: Config, w: Any, out: list[dict[str, Any]]) -> None:
    current: dict[str, dict[str, Any]] = {}
    for row in w.profiles.to_pylist():
        if row["deleted"]:
            current.pop(row["user_id"], None)
        else:
            current[row["user_id"]] = row
    hits = search_profiles(config, "likes", limit=100_000)
    assert {u for u, _, _ in hits} == set(current)


CHECKS = {
    PageViewsPerHour.NAME: check_hourly,
    ProfileSettingsJoin.NAME: check_join,
    PageViewEnrich.NAME: check_enrich,
    AdClickJoin.NAME: check_clicks,
    TrendingPages.NAME: check_trending,
    DistinctViewers.NAME: check_distinct,
    ProfileSearch.NAME: check_search,
}


def test_every_job_has_a_spark_check() -> None:
    assert set(CHECKS) == set(JOBS)


@pytest.fixture(scope="module")
def small_workload() -> Any:
    return generate(4000, hours=3, seed=5)


@pytest.mark.spark
@pytest.mark.parametrize("name", list(JOBS))
def test_job_on_spark(spark: Any, tmp_path: Path, small_workload: Any, name: str) -> None:
    task = JOBS[name]
    result = run_example(task, spark, small_workload, tmp_path, partitions=2, engine=ENGINE)
    assert result.output.schema.names == [f.split()[0] for f in task.OUTPUT_SCHEMA.split(", ")]
    CHECKS[name](result.config, small_workload, result.output.to_pylist())


@pytest.mark.spark
def test_hourly_job_on_spark_continues_from_committed_state(spark: Any, tmp_path: Path, small_workload: Any) -> None:
    """Two Spark runs over the two halves of the views: the second restores/continues
    the first's state, and together they count every view exactly once."""
    views = small_workload.page_views
    half = views.num_rows // 2
    first = dataclasses.replace(small_workload, page_views=views.slice(0, half))
    second = dataclasses.replace(small_workload, page_views=views.slice(half))
    out = run_example(PageViewsPerHour, spark, first, tmp_path, partitions=2, engine=ENGINE).output.to_pylist()
    out += run_example(PageViewsPerHour, spark, second, tmp_path, partitions=2, engine=ENGINE).output.to_pylist()
    check_hourly(job_config(PageViewsPerHour, tmp_path, partitions=2, engine=ENGINE), small_workload, out)


@pytest.mark.spark
def test_hourly_job_in_structured_streaming_emits_each_hour_when_it_closes(
    spark: Any, tmp_path: Path, small_workload: Any
) -> None:
    """One JSON-lines file per hour, one file per micro-batch: hour h is emitted by the
    micro-batch that brings hour h + 1, and never again."""
    from localstate.contrib.spark import StatefulJob

    source = tmp_path / "views"
    hours = write_hour_files(small_workload.page_views, source)
    config = job_config(PageViewsPerHour, tmp_path / "job", partitions=2, engine=ENGINE)
    stream = spark.readStream.schema("ts long, user_id string").option("maxFilesPerTrigger", 1).json(str(source))
    emitted_by_batch: dict[int, list[dict[str, Any]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        emitted_by_batch[batch_id] = df.toArrow().to_pylist()

    job = StatefulJob(config, PageViewsPerHour, key="user_id", output_schema=PageViewsPerHour.OUTPUT_SCHEMA)
    query = job.run_stream(stream, checkpoint_location=str(tmp_path / "spark-checkpoint"),
                           trigger={"availableNow": True}, output=collect)
    query.awaitTermination(300)
    assert sorted(emitted_by_batch) == list(range(len(hours)))
    for batch_id, rows in emitted_by_batch.items():
        assert {r["window_start"] for r in rows} == ({hours[batch_id - 1]} if batch_id else set())
    check_hourly(config, small_workload, [r for rows in emitted_by_batch.values() for r in rows])

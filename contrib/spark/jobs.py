"""The example jobs: the registry, how to configure and run one on Spark, and
``localstate run <job>``.

Every example is a :class:`~localstate.contrib.spark.StreamTask` subclass that also
declares, as class attributes, what a job needs to run it:

* ``NAME`` (the CLI name), ``KEY`` (the column the input is partitioned by),
  ``OUTPUT_SCHEMA`` (Spark DDL of the emitted rows);
* ``STORES``: ``stores.<name>.*`` options per store, where ``"factory": "kv"`` means
  "the key-value engine this run uses" (``rocksdb`` by default);
* ``input_table(workload)``: the job's input as a :class:`pyarrow.Table` built from a
  :class:`~localstate.contrib.spark.workload.Workload`.

>>> from localstate.contrib.spark.jobs import JOBS, job_config, run_example  # doctest: +SKIP
>>> result = run_example(JOBS["pageviews-hourly"], spark, workload, "/tmp/demo")  # doctest: +SKIP
>>> result.output.num_rows  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc
from localstate import Config, KeyValueStore, LocalStateError, RestoreProgress, TaskStorage
from localstate.layout import job_dir
from localstate.metrics import TransferRate
from localstate.registry import resolve_factory
from localstate.terminal import make_console, quiet_stderr

from .compat import dataframe_from_arrow, dataframe_to_arrow
from .job_engines import DistinctViewers, ProfileSearch, TrendingPages, merge_top, search_profiles
from .job_joins import AdClickJoin, PageViewEnrich, ProfileSettingsJoin
from .job_windowed import PageViewsPerHour
from .runner import StatefulJob, StreamTask
from .workload import Workload, generate

__all__ = [
    "JOBS",
    "KV_PLACEHOLDER",
    "JobRun",
    "default_kv_engine",
    "job_config",
    "run_example",
    "snapshot_state",
    "restore_state",
    "summarize",
    "print_summary",
    "make_console",
    "DEMO_QUERIES",
    "run_job",
]

KV_PLACEHOLDER = "kv"
"""``stores.<s>.factory`` value in a task's ``STORES`` meaning "the run's KV engine"."""

JOBS: dict[str, Any] = {  # type[StreamTask] plus the class attributes above: no such type in Python
    task.NAME: task
    for task in (PageViewsPerHour, ProfileSettingsJoin, PageViewEnrich, AdClickJoin, TrendingPages,
                 DistinctViewers, ProfileSearch)
}
"""Example jobs by CLI name, in the order the demo runs them."""


def default_kv_engine() -> tuple[str, str | None]:
    """``("rocksdb", None)`` when RocksDB is usable, else ``("memory", why)``."""
    try:
        resolve_factory("rocksdb")
    except (LocalStateError, ImportError) as e:
        return "memory", str(e)
    return "rocksdb", None


def job_config(
    task: type[StreamTask],
    root: str | Path,
    *,
    partitions: int = 4,
    engine: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Config:
    """The config of example ``task`` with state under ``root/state`` and the file
    changelog (and task checkpoints) under ``root/changelog``.

    ``engine`` replaces every ``"kv"`` factory in ``task.STORES`` (default:
    :func:`default_kv_engine`); ``extra`` adds or overrides keys.
    """
    root = Path(root).resolve()
    kv = engine or default_kv_engine()[0]
    values: dict[str, Any] = {
        "job.name": task.NAME,
        "job.state.dir": str(root / "state"),
        "job.partitions": partitions,
        "systems.file.path": str(root / "changelog"),
    }
    for store, options in task.STORES.items():
        for key, value in options.items():
            if key == "factory" and value == KV_PLACEHOLDER:
                value = kv
            values[f"stores.{store}.{key}"] = value
    values.update(extra or {})
    return Config.from_dict(values)


@dataclass
class JobRun:
    """What one run of an example job produced."""

    task: type[StreamTask]
    config: Config
    output: pa.Table
    input_rows: int
    seconds: float

    @property
    def events_per_second(self) -> float:
        return self.input_rows / self.seconds if self.seconds > 0 else float("inf")


def run_example(
    task: type[StreamTask],
    spark: Any,
    workload: Workload,
    root: str | Path,
    *,
    partitions: int = 4,
    engine: str | None = None,
    config: Config | None = None,
) -> JobRun:
    """Run example ``task`` over ``workload`` as a batch :class:`StatefulJob` on ``spark``.

    State and changelog go under ``root`` (see :func:`job_config`; ``config`` overrides
    it, and its ``job.partitions`` is the task count); running again with the same root
    continues from the committed state. Returns the emitted rows.
    """
    config = config or job_config(task, root, partitions=partitions, engine=engine)
    table = task.input_table(workload)
    t0 = time.perf_counter()
    df = dataframe_from_arrow(spark, table)
    job = StatefulJob(config, task, key=task.KEY, output_schema=task.OUTPUT_SCHEMA)
    output = dataframe_to_arrow(job.run(df))
    return JobRun(task, config, output, table.num_rows, time.perf_counter() - t0)


StateSnapshot = dict[tuple[str, int], dict[bytes, bytes]]
"""``(store, partition)`` → the store's state as change records (key → value)."""


def _store_state(storage: TaskStorage, name: str) -> dict[bytes, bytes]:
    engine = storage.engine(name)
    if isinstance(engine, KeyValueStore):
        with engine.all() as items:
            return dict(items)
    changelog = storage.changelog(name)
    checkpoint = storage.checkpoint
    if changelog is None or checkpoint is None:
        return {}
    keys = {k for k, _ in changelog.read(0, checkpoint.offsets.get(name, 0))}
    return {k: v for k, v in engine.current(sorted(keys)) if v is not None}


def snapshot_state(
    config: Config,
    listener: Callable[[RestoreProgress], None] | None = None,
    open_seconds: list[float] | None = None,
) -> StateSnapshot:
    """Open every task partition of ``config`` (restoring it if needed) and return the
    state of each store as change records: all pairs of a key-value engine, and
    ``engine.current(keys)`` over every change-record key in the committed changelog
    for the others. Two snapshots are equal exactly when the stores hold the same state.

    The wall time of each ``TaskStorage`` open (restore included) is appended to
    ``open_seconds`` when given.
    """
    out: StateSnapshot = {}
    for p in range(config.partitions):
        t0 = time.perf_counter()
        with TaskStorage(config, p, restore_listener=listener) as storage:
            if open_seconds is not None:
                open_seconds.append(time.perf_counter() - t0)
            for name in storage.stores:
                out[(name, p)] = _store_state(storage, name)
    return out


@dataclass
class RestoreReport(TransferRate):
    """Totals of a restore from the changelog, over every store and partition."""

    snapshot: StateSnapshot
    records: int
    bytes: int
    seconds: float
    """Wall time of opening every task, restore included (the state dump is not)."""



def restore_state(config: Config, listener: Callable[[RestoreProgress], None] | None = None) -> RestoreReport:
    """Simulate the loss of the machine: delete the job's local state
    (``job.state.dir/<job>``; the changelog and checkpoints survive), then restore
    every partition from the changelog and snapshot it (see :func:`snapshot_state`)."""
    local = job_dir(config)
    if local.exists():
        shutil.rmtree(local)
    done: list[RestoreProgress] = []

    def on_progress(ev: RestoreProgress) -> None:
        if ev.done:
            done.append(ev)
        if listener is not None:
            listener(ev)

    opened: list[float] = []
    snapshot = snapshot_state(config, on_progress, opened)
    return RestoreReport(snapshot, sum(e.records for e in done), sum(e.bytes for e in done), sum(opened))


# -- readable summaries ------------------------------------------------------------------------
@dataclass
class Summary:
    """A small table a person can read, for the demo and ``localstate run``."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""


def _top(table: pa.Table, by: str, k: int) -> pa.Table:
    return table.take(pc.sort_indices(table, [(by, "descending")])[:k]) if table.num_rows else table


def _hour(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:00", time.gmtime(ts))


def _summarize_hourly(out: pa.Table, k: int) -> Summary:
    top = _top(out, "views", k)
    rows = [[_hour(r["window_start"]), r["user_id"], r["views"]] for r in top.to_pylist()]
    hours = len(set(out.column("window_start").to_pylist())) if out.num_rows else 0
    return Summary("Busiest users per hour (closed windows)", ["hour (UTC)", "user", "views"], rows,
                   f"{out.num_rows:,} (hour, user) windows emitted over {hours} closed hours")


def _summarize_join(out: pa.Table, k: int) -> Summary:
    ups = out.filter(pc.equal(out["op"], "upsert"))
    # The newest row per user is the current join result.
    latest = {r["user_id"]: r for r in out.to_pylist()}
    current = [r for r in latest.values() if r["op"] == "upsert"]
    by_city: dict[str, list[Any]] = {}
    for r in current:
        c = by_city.setdefault(r["city"], [0, {}, 0])
        c[0] += 1
        c[1][r["language"]] = c[1].get(r["language"], 0) + 1
        c[2] += bool(r["notifications"])
    rows = [
        [city, n, max(langs, key=langs.get), f"{100 * notif / n:.0f}%"]
        for city, (n, langs, notif) in sorted(by_city.items(), key=lambda x: -x[1][0])[:k]
    ]
    return Summary("Profiles ⋈ settings: joined users per city", ["city", "users", "top language", "notifications on"],
                   rows, f"join output stream: {ups.num_rows:,} upserts, {out.num_rows - ups.num_rows:,} deletes; "
                   f"{len(current):,} users currently joined")


def _summarize_enrich(out: pa.Table, k: int) -> Summary:
    counts = out.group_by("zip").aggregate([("ts", "count")]).rename_columns(["zip", "views"])
    missing = out.num_rows - out["zip"].drop_null().__len__() if out.num_rows else 0
    top = _top(counts.filter(pc.is_valid(counts["zip"])), "views", k)
    from .workload import ZIP_CODES

    city = dict(ZIP_CODES)
    rows = [[r["zip"], city.get(r["zip"], "?"), r["views"]] for r in top.to_pylist()]
    return Summary("Page views ⋈ profiles: views per ZIP code", ["zip", "city", "views"], rows,
                   f"{out.num_rows:,} views enriched; {missing:,} without a profile (deleted accounts)")


def _summarize_clicks(out: pa.Table, k: int) -> Summary:
    if out.num_rows == 0:
        return Summary("Ad clicks ⋈ impressions", ["ad", "impressions", "clicks", "CTR", "median s to click"], [])
    per_ad: dict[str, list[Any]] = {}
    for ad, clicked, its, cts in zip(out["ad_id"].to_pylist(), out["clicked"].to_pylist(),
                                     out["impression_ts"].to_pylist(), out["click_ts"].to_pylist()):
        a = per_ad.setdefault(ad, [0, 0, []])
        a[0] += 1
        if clicked:
            a[1] += 1
            a[2].append(cts - its)
    rows = []
    for ad, (n, c, lat) in sorted(per_ad.items(), key=lambda x: -x[1][1])[:k]:
        rows.append([ad, n, c, f"{100 * c / n:.1f}%", sorted(lat)[len(lat) // 2] if lat else "-"])
    clicked = pc.sum(out["clicked"].cast(pa.int64())).as_py() or 0
    return Summary("Ad clicks ⋈ impressions (10-minute window)",
                   ["ad", "impressions", "clicks", "CTR", "median s to click"], rows,
                   f"{clicked:,} matched clicks; {out.num_rows - clicked:,} impressions expired unclicked "
                   "(impressions still inside the window stay in state)")


def _summarize_trending(out: pa.Table, k: int) -> Summary:
    rows = [[rank, page, views] for rank, (page, views) in enumerate(merge_top(out, k), 1)]
    return Summary("Trending pages (top-N heap per task, merged)", ["rank", "page", "views"], rows,
                   f"each task keeps its best {TrendingPages.TOP_N} pages in a topn store")


def _summarize_distinct(out: pa.Table, k: int) -> Summary:
    latest = {r["page"]: r for r in out.to_pylist()}
    best = sorted(latest.values(), key=lambda r: -r["distinct_viewers"])[:k]
    rows = [[r["page"], r["distinct_viewers"], r["views"], f"{r['views'] / max(1, r['distinct_viewers']):.2f}"]
            for r in best]
    return Summary("Distinct viewers per page (HyperLogLog)", ["page", "viewers", "views", "views per viewer"],
                   rows, f"{len(latest):,} pages counted; estimates within about 1%")


DEMO_QUERIES = ("bio:jazz AND city:seattle", "chess hiking", 'city:"san francisco" AND name:maya')
"""Queries the demo and ``localstate run profile-search`` show results for."""


def _summarize_search(out: pa.Table, k: int, config: Config | None) -> Summary:
    indexed = sum(out["indexed"].to_pylist())
    deleted = sum(out["deleted"].to_pylist())
    rows: list[list[Any]] = []
    if config is not None:
        for query in DEMO_QUERIES:
            for i, (user, score, doc) in enumerate(search_profiles(config, query, limit=3)):
                rows.append([query if i == 0 else "", f"{doc.get('name')} ({user})", doc.get("city"),
                             doc.get("bio"), f"{score:.2f}"])
    return Summary("Profile search (tantivy index per task)", ["query", "profile", "city", "bio", "score"],
                   rows[: 3 * k], f"{indexed:,} profile versions indexed, {deleted:,} accounts removed")


_SUMMARIES: dict[str, Callable[[pa.Table, int], Summary]] = {
    PageViewsPerHour.NAME: _summarize_hourly,
    ProfileSettingsJoin.NAME: _summarize_join,
    PageViewEnrich.NAME: _summarize_enrich,
    AdClickJoin.NAME: _summarize_clicks,
    TrendingPages.NAME: _summarize_trending,
    DistinctViewers.NAME: _summarize_distinct,
}


def summarize(task: type[StreamTask], output: pa.Table, k: int = 8, config: Config | None = None) -> Summary:
    """A readable table of example ``task``'s output (top ``k`` rows); jobs whose result
    lives in their stores (profile search) query them through ``config``."""
    if task is ProfileSearch:
        return _summarize_search(output, k, config)
    fn = _SUMMARIES.get(task.NAME)
    if fn is not None:
        return fn(output, k)
    head = output.slice(0, k).to_pylist()
    return Summary(task.NAME, list(output.column_names), [list(r.values()) for r in head])


_NUMERIC = frozenset({"views", "users", "impressions", "clicks", "viewers", "rank", "score", "CTR"})




def print_summary(console: Any, summary: Summary) -> None:
    """Print a :class:`Summary` as a rich table."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(summary.title), caption=escape(summary.caption or "") or None,
                  title_justify="left", caption_justify="left")
    for i, col in enumerate(summary.columns):
        table.add_column(escape(col), justify="right" if col in _NUMERIC else "left", no_wrap=i == 0)
    for row in summary.rows:  # cells are data (page names, search text): never rich markup
        table.add_row(*(f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else escape(str(v)) for v in row))
    console.print(table)


# -- the CLI -------------------------------------------------------------------------------------
def workload_options(dir_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options ``localstate run`` and ``localstate demo`` share: workload size and seed,
    tasks, engine, where state lives (``dir_help``) and the Spark master."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed((
            click.option("--events", type=click.IntRange(min=1), default=100_000, show_default=True,
                         help="page views in the synthetic workload"),
            click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True,
                         help="tasks (= changelog partitions)"),
            click.option("--engine", default=None, help="key-value engine for the stores [default: rocksdb, else memory]"),
            click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
                         help=dir_help),
            click.option("--master", default="local[*]", show_default=True, help="Spark master"),
            click.option("--seed", type=int, default=7, show_default=True, help="workload seed"),
        )):
            command = option(command)
        return command
    return decorate


@click.command("run")
@click.argument("job_name", metavar="JOB")
@workload_options("keep state and changelog here; running again adds the workload to the kept state "
                  "(use another --seed for new data) [default: a temporary directory, removed after]")
@click.option("--rows", type=click.IntRange(min=0), default=10, show_default=True, help="rows in the result table")
def run_job(job_name: str, events: int, partitions: int, engine: str | None, directory: Path | None,
            master: str, rows: int, seed: int) -> None:
    """Run one example job on Spark over a synthetic workload and print its result.

    JOB is one of the names listed below.
    """
    from rich.markup import escape

    from .compat import require_pyspark
    from .session import spark_session

    require_pyspark()  # before any work: name the missing extra, not a later ImportError
    task = JOBS.get(job_name)
    if task is None:
        from localstate.registry import did_you_mean

        raise click.BadParameter(f"unknown job {job_name!r}.{did_you_mean(job_name, JOBS)}", param_hint="JOB")
    console = make_console()
    if engine is None:
        engine, why = default_kv_engine()
        if why:
            console.print(f"[yellow]note:[/] RocksDB is not available ({escape(why)}); using the memory engine")
    tmp = None
    if directory is None:
        tmp = tempfile.mkdtemp(prefix=f"localstate-{job_name}-")
        directory = Path(tmp)
    try:
        # Spark's JVM (started here, so it inherits the quiet stderr) writes around the spinners
        with quiet_stderr(console.is_terminal, "Spark"):
            with console.status("generating the workload"):
                workload = generate(events, seed=seed)
            with console.status(f"starting Spark ({escape(master)})"):
                spark = spark_session(master, app_name=f"localstate-{job_name}")
            with console.status(escape(f"running {job_name} with {partitions} tasks on {engine}")):
                result = run_example(task, spark, workload, directory, partitions=partitions, engine=engine)
        print_summary(console, summarize(task, result.output, rows, result.config))
        where = (f"state in {escape(str(directory))}" if tmp is None else
                 "state was in a temporary directory, removed now (pass --dir to keep it)")
        console.print(
            f"{job_name}: {result.input_rows:,} input rows → {result.output.num_rows:,} output rows in "
            f"{result.seconds:.1f}s ({result.events_per_second:,.0f} rows/s incl. Spark); {where}"
        )
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


run_job.help = inspect.cleandoc(run_job.help or "") + "\n\nJobs: " + ", ".join(JOBS)

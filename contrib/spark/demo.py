"""``localstate demo``: the example jobs on local Spark, a machine loss, and a restore.

1. generate a seeded synthetic page-view / profile / ad workload;
2. run every example job (:data:`~localstate.contrib.spark.jobs.JOBS`) as a batch
   :class:`~localstate.contrib.spark.StatefulJob` on local Spark, RocksDB stores
   (the memory engine, with a note, if RocksDB is not installed) and the embedded
   file changelog, and print what each job found;
3. snapshot every store of every task, then delete all local state — what losing the
   machine leaves behind is the changelog and the task checkpoints;
4. restore every task from the changelog, compare with the snapshot (OK/FAIL; the
   command exits with status 1 on FAIL) and print the restore speed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from localstate import Config, LocalStateError, RestoreProgress
from localstate.reader import read_checkpoint_readonly
from localstate.store_open import open_system
from localstate.terminal import quiet_stderr

from .jobs import (
    JOBS,
    JobRun,
    default_kv_engine,
    job_config,
    make_console,
    print_summary,
    restore_state,
    run_example,
    snapshot_state,
    summarize,
    workload_options,
)
from .workload import generate

__all__ = ["demo", "run_demo", "committed_records"]


def committed_records(config: Config) -> int:
    """Changelog records below the committed offsets of every store and partition:
    what a full restore of ``config``'s job replays (at most; compaction may drop some)."""
    system = open_system(config, config.checkpoint_system)
    try:
        checkpoints = system.checkpoints()
        total = 0
        for p in range(config.partitions):
            ckpt = read_checkpoint_readonly(checkpoints, config.job_name, p)
            if ckpt is not None:
                total += sum(ckpt.offsets.values())
        return total
    finally:
        system.close()


def _progress(console: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


def run_demo(
    *,
    events: int,
    partitions: int,
    root: Path,
    engine: str | None = None,
    master: str = "local[*]",
    seed: int = 7,
    console: Any = None,
) -> bool:
    """Run the whole demo under ``root``; True when every restored store matched."""
    from rich.markup import escape
    from rich.table import Table

    from .session import spark_session

    console = console or make_console()
    if engine is None:
        engine, why = default_kv_engine()
        if why:
            console.print(f"[yellow]note:[/] RocksDB is not available ({escape(why)}); the demo uses the memory engine")
    console.rule("[bold]localstate demo")
    console.print(f"state and changelog under {escape(str(root))}; engine [bold]{escape(engine)}[/], "
                  f"{partitions} tasks per job, Spark {escape(master)}")

    with console.status(f"generating {events:,} page views and the profiles, settings and ads around them"):
        workload = generate(events, seed=seed)
    sizes = Table(title="Synthetic workload (seeded)", title_justify="left")
    for col in ("table", "rows"):
        sizes.add_column(col, justify="right" if col == "rows" else "left")
    for name, n in workload.sizes().items():
        sizes.add_row(name, f"{n:,}")
    console.print(sizes)

    with console.status(f"starting Spark ({escape(master)}) and its Python workers"):
        t0 = time.perf_counter()
        spark = spark_session(master, app_name="localstate-demo")
        # Warm-up: the first Python task of a session pays for the workers' start, which
        # would otherwise be charged to the first job's time.
        spark.range(0, partitions, 1, partitions).mapInArrow(lambda batches: batches, "id long").collect()
    console.print(f"Spark {spark.version} started in {time.perf_counter() - t0:.1f}s")

    runs: dict[str, JobRun] = {}
    with _progress(console) as progress:
        bar = progress.add_task("running jobs", total=len(JOBS))
        for name, task in JOBS.items():
            progress.update(bar, description=f"running {name}")
            runs[name] = run_example(task, spark, workload, root, partitions=partitions, engine=engine)
            progress.advance(bar)
        progress.update(bar, description="jobs done")

    for run in runs.values():
        print_summary(console, summarize(run.task, run.output, config=run.config))
    jobs_table = Table(title="Jobs (batch runs on Spark, Arrow path)", title_justify="left")
    for col in ("job", "input rows", "output rows", "seconds", "rows/s incl. Spark"):
        jobs_table.add_column(col, justify="left" if col == "job" else "right", no_wrap=col == "job")
    for name, run in runs.items():
        jobs_table.add_row(name, f"{run.input_rows:,}", f"{run.output.num_rows:,}", f"{run.seconds:.1f}",
                           f"{run.events_per_second:,.0f}")
    console.print(jobs_table)

    configs = {name: job_config(JOBS[name], root, partitions=partitions, engine=engine) for name in runs}
    with console.status("snapshotting every store of every task"):
        before = {name: snapshot_state(config) for name, config in configs.items()}
    console.rule("[bold]machine loss")
    console.print(f"deleting all local state under {escape(str(root / 'state'))}; the changelog and task "
                  f"checkpoints under {escape(str(root / 'changelog'))} survive")

    total = sum(committed_records(c) for c in configs.values())
    reports = {}
    with _progress(console) as progress:
        bar = progress.add_task("restoring from the changelog", total=max(1, total))
        seen: dict[tuple[str, str, int], int] = {}

        def on_restore(ev: RestoreProgress, job: str = "") -> None:
            key = (job, ev.store, ev.partition)
            progress.advance(bar, ev.records - seen.get(key, 0))
            seen[key] = ev.records

        for name, config in configs.items():
            reports[name] = restore_state(config, lambda ev, job=name: on_restore(ev, job))
        progress.update(bar, completed=max(1, total))

    result = Table(title="Restore after machine loss", title_justify="left")
    for col in ("job", "stores×tasks", "records", "MB", "seconds", "records/s", "MB/s", "state"):
        result.add_column(col, justify="left" if col in ("job", "state") else "right", no_wrap=col == "job")
    ok_all = True
    records = nbytes = 0
    seconds = 0.0
    for name, report in reports.items():
        ok = report.snapshot == before[name]
        ok_all &= ok
        records += report.records
        nbytes += report.bytes
        seconds += report.seconds
        result.add_row(name, str(len(report.snapshot)), f"{report.records:,}", f"{report.bytes / 1e6:.1f}",
                       f"{report.seconds:.2f}", f"{report.records_per_second:,.0f}",
                       f"{report.mb_per_second:.1f}", "[green]OK[/]" if ok else "[red]FAIL[/]")
    result.add_row("[bold]total", "", f"{records:,}", f"{nbytes / 1e6:.1f}", f"{seconds:.2f}",
                   f"{records / seconds if seconds else 0:,.0f}",
                   f"{nbytes / 1e6 / seconds if seconds else 0:.1f}",
                   "[green]OK[/]" if ok_all else "[red]FAIL[/]")
    console.print(result)
    if ok_all:
        console.print("[bold green]OK[/]: every store of every task was restored from the changelog to exactly "
                      "its committed state")
    else:
        bad = [n for n, r in reports.items() if r.snapshot != before[n]]
        console.print(f"[bold red]FAIL[/]: restored state differs from the original in {escape(', '.join(bad))}")
    return ok_all


@click.command("demo")
@workload_options("keep state and changelog here (must be empty or absent) [default: a temporary directory, "
                  "removed after]")
def demo(events: int, partitions: int, engine: str | None, directory: Path | None, master: str, seed: int) -> None:
    """The demo pipeline: example jobs on local Spark, machine loss, restore, verify."""
    from .compat import require_pyspark

    require_pyspark()  # before any work: name the missing extra, not a later ImportError
    if directory is not None and directory.exists() and any(directory.iterdir()):
        raise click.BadParameter(f"{directory} is not empty; pass a new directory", param_hint="--dir")
    root = directory if directory is not None else Path(tempfile.mkdtemp(prefix="localstate-demo-"))
    console = make_console()
    try:
        # Spark's JVM (started inside, so it inherits the quiet stderr) writes around the progress bars
        with quiet_stderr(console.is_terminal, "Spark"):
            ok = run_demo(events=events, partitions=partitions, root=root.resolve(), engine=engine,
                          master=master, seed=seed, console=console)
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e
    finally:
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)
    if not ok:
        raise SystemExit(1)

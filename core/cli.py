"""The ``localstate`` command line.

Core commands live here; the heavier ones (``bench``, ``torture``, ``demo``,
``new-engine``) are imported only when invoked, so ``localstate engines`` stays fast
and works without the extras.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from .cli_options import job_options, load_config, partitions_of
from .errors import LocalStateError

__all__ = ["main", "cli"]

LAZY_COMMANDS = {
    "bench": ("localstate.benchmarks.cli:bench", "Benchmark engines and changelogs (--quick: about 15 s)."),
    "torture": ("localstate.testing.torture:torture", "Crash trials: kill a task at random points, verify no loss."),
    "demo": ("localstate.contrib.spark.demo:demo", "The demo: example jobs on local Spark, machine loss, restore."),
    "new-engine": ("localstate.contrib.scaffold:new_engine", "Write a ready-to-fill engine plug-in package."),
    "run": ("localstate.contrib.spark.jobs:run_job", "Run one of the example jobs on local Spark."),
    "get": ("localstate.cli_state:get", "Read keys from a job's committed state (read-only, beside the running job)."),
    "dump": ("localstate.cli_state:dump", "Print a store's committed state (read-only, beside the running job)."),
    "rescale": ("localstate.cli_state:rescale_command", "Re-partition a stopped job's state to a new partition count."),
    "serve": ("localstate.cli_serve:serve", "Serve point lookups of a running job's committed state over HTTP."),
}
"""``name → ("module:command", short help)``: the commands defined outside this module,
each imported only when it runs (every other command is defined below).
Short helps are sentences, like the docstrings of the core commands."""


def extra_for_module(module: str | None) -> str:
    """The ``localstate[extra]`` that installs ``module`` (from the package's own
    requirements, so pyproject.toml stays the one list), or ``all`` when none does."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    if not module:
        return "all"
    wanted = module.split(".")[0].lower().replace("_", "-")
    try:
        reqs = requires("localstate") or []
    except PackageNotFoundError:
        reqs = []
    for req in reqs:  # e.g. "pyspark>=4.2; extra == 'spark'"
        dist = re.match(r"\s*([A-Za-z0-9_.-]+)", req)
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        if dist and extra and dist[1].lower().replace("_", "-") == wanted and extra[1] not in ("all", "dev"):
            return extra[1]
    return "all"


def _unavailable(name: str, help_text: str, error: ImportError | AttributeError) -> click.Command:
    """A stand-in for a lazy command whose extra is missing: any arguments, one clear message."""
    module = getattr(error, "name", None)
    why = f"it needs the module {module!r}, which is not installed" if module else str(error)

    @click.command(name=name, help=help_text, add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def unavailable() -> None:
        raise click.ClickException(
            f"'localstate {name}' is unavailable: {why}. Install it with: "
            f"pip install 'localstate[{extra_for_module(module)}]'"
        )

    return unavailable


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY_COMMANDS:
            return cmd
        from .registry import import_path

        path, help_text = LAZY_COMMANDS[name]
        try:
            return import_path(path)
        except (ImportError, AttributeError) as e:
            return _unavailable(name, help_text, e)

    def invoke(self, ctx: click.Context) -> Any:
        """Every command's LocalStateError (a bad config, a damaged file) becomes click's
        one-line ``Error: ...`` with exit code 1, never a traceback."""
        try:
            return super().invoke(ctx)
        except LocalStateError as e:
            raise click.ClickException(str(e)) from e

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                rows.append((name, LAZY_COMMANDS[name][1]))
            else:
                cmd = super().get_command(ctx, name)
                if cmd is not None:
                    rows.append((name, cmd.get_short_help_str(90)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="localstate")
def cli() -> None:
    """localstate: local, fault-tolerant state for stream tasks."""


system_option = click.option("--system", "system_name", metavar="NAME",
                             help="only the stores whose changelog is on systems.NAME [default: all]")
"""``--system``: the same filter on ``inspect`` and ``verify``, checked by :func:`_system`."""


def _system(config: Any, name: str | None) -> str | None:
    """``--system NAME`` checked against the job: a system the config names and the job uses."""
    if name is None:
        return None
    used = sorted({config.checkpoint_system} | {s.changelog[0] for s in config.stores.values() if s.changelog})
    if name not in used:
        from .registry import did_you_mean

        raise click.BadParameter(f"job {config.job_name!r} keeps nothing on a system named {name!r}."
                                 f"{did_you_mean(name, used)}", param_hint="--system")
    return name


def _console() -> Any:
    from .terminal import make_console

    return make_console()


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def engines(as_json: bool) -> None:
    """List registered storage engines and whether their extra is installed."""
    from .registry import available

    info = available()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="storage engines")
    for col in ("name", "installed", "origin", "notes"):
        table.add_column(col)
    for name, row in sorted(info.items()):
        note = ""
        if row["installed"]:
            from .registry import resolve_factory

            try:
                note = resolve_factory(name).description
            except LocalStateError as e:
                note = str(e)
        else:
            note = row["hint"]
        table.add_row(escape(name), "yes" if row["installed"] else "no", escape(row["origin"]), escape(note))
    _console().print(table)


def _when(epoch: Any) -> str:
    """A checkpoint's ``written_at`` (seconds since the epoch) as local time and age."""
    import datetime as dt

    if not isinstance(epoch, (int, float)) or epoch <= 0:
        return ""
    at = dt.datetime.fromtimestamp(epoch).astimezone()
    age = max(0.0, dt.datetime.now().astimezone().timestamp() - epoch)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if age >= size:
            ago = f"{age / size:.0f} {unit} ago"
            break
    else:
        ago = f"{age:.0f} s ago"
    return f"{at:%Y-%m-%d %H:%M:%S %Z} ({ago})"


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> Any:
    """A rich table whose cells are escaped text (paths and names may contain '[')."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title))
    for col in columns:
        table.add_column(col, justify="right" if col in _NUMERIC_COLUMNS else "left")
    for row in rows:
        table.add_row(*(escape("" if v is None else str(v)) for v in row))
    return table


def _newest(offsets: list[int] | None) -> str:
    """The newest shipped snapshot's offset, and how many there are."""
    if not offsets:
        return ""
    return f"{offsets[-1]}" + (f" (+{len(offsets) - 1} older)" if len(offsets) > 1 else "")


_NUMERIC_COLUMNS = frozenset({"partition", "version", "segments", "end offset", "records", "bytes", "files",
                              "before", "after", "removed", "tombstones dropped"})


def _with_root(columns: tuple[str, ...], rows: list[dict[str, Any]], values: list[tuple[Any, ...]]
               ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """Prefix a ``root`` column when the rows come from more than one root directory."""
    if len({r.get("root") for r in rows}) < 2:
        return columns, values
    return ("root", *columns), [(r.get("root"), *v) for r, v in zip(rows, values)]


@cli.command()
@click.argument("path", required=False)
@job_options
@system_option
@click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
              help="with an object-store URL: a setting of its system, e.g. config.endpoint=http://host:9000")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def inspect(path: str | None, config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...],
            system_name: str | None, options: tuple[str, ...], as_json: bool) -> None:
    """Show what a job has committed: checkpoints, changelog partitions, local stores.

    With -c job.toml: the job's tasks on its own changelog systems (file, Kafka or
    object store) and its local stores in job.state.dir. With PATH: everything under a
    changelog or state directory, or in an object-store URL such as s3://bucket/prefix
    (its settings given with -o). Read-only: never locks, truncates or writes, so it is
    safe beside a live task.
    """
    from .inspect import inspect_job, inspect_path, inspect_remote

    given = [flag for flag, value in (("-c", config_path), ("--set", overrides)) if value]
    if path is not None and given:
        raise click.UsageError(f"give PATH or -c job.toml, not both (PATH {path!r} with {' and '.join(given)})")
    if path is None and (partitions or system_name) and not given:
        raise click.UsageError("--partition and --system select from a job: pass -c job.toml")
    if path is not None and (partitions or system_name):
        raise click.UsageError("--partition and --system select from a job: pass -c job.toml instead of PATH")
    if options and (path is None or "://" not in path):
        raise click.UsageError("-o settings are for an object-store URL (inspect s3://bucket/prefix -o KEY=VALUE)")
    if path is None and not given:
        raise click.UsageError("give -c job.toml, a directory, or an object-store URL")
    if path is None:
        config = load_config(config_path, overrides)
        report = inspect_job(config, partitions_of(config, partitions), _system(config, system_name))
    elif "://" in path:
        report = inspect_remote(path, options=options)
        report["where"] = dict.fromkeys(report, path)
    elif not Path(path).exists():
        raise click.BadParameter(f"{path!r} does not exist (give a state or changelog directory, or an "
                                 "object-store URL)", param_hint="PATH")
    elif not Path(path).is_dir():
        raise click.BadParameter(f"{path!r} is not a directory (nor an object-store URL)", param_hint="PATH")
    else:
        report = {"generations": [], **inspect_path(Path(path))}
        report["where"] = dict.fromkeys(report, path)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    _print_report(report, job=path is None)


def _print_report(report: dict[str, Any], job: bool) -> None:
    """The tables of an inspection, each titled with where it was read (a job's tables
    also when empty, so a missing commit shows; a directory's only when something is there)."""
    from .inspect import SECTIONS

    console = _console()
    where = report["where"]

    def title(what: str, section: str) -> str:
        return f"{what} {'in' if job else 'under'} {where[section]}"

    if report["checkpoints"]:
        rows = report["checkpoints"]
        columns, values = _with_root(
            ("job", "partition", "version", "input position", "offsets", "written"), rows,
            [(c["job"], c["partition"], c.get("version", ""),
              _clip(json.dumps(c["input_position"])) if "input_position" in c else "",
              json.dumps(c["offsets"]) if "offsets" in c else f"unreadable: {c['error']}" if "error" in c
              else c.get("note", ""), _when(c.get("written_at"))) for c in rows])
        console.print(_table(title("task checkpoints", "checkpoints"), columns, values))
    if report["partitions"]:
        rows = report["partitions"]
        columns, values = _with_root(
            ("stream", "partition", "segments", "end offset", "records", "bytes", "tombstone horizon",
             "shipped snapshot", "locked by"),
            rows,
            [(p["stream"], p["partition"], p["segments"], p["end_offset"], _count(p["records"]),
              f"{p['bytes']:,}", p["tombstone_horizon"], _newest(p.get("shipped_snapshots")),
              p.get("locked_by") or "") for p in rows])
        console.print(_table(title("changelog partitions", "partitions"), columns, values))
        for p in rows:
            if p.get("error"):
                console.print(_escape(f"{p['stream']}[{p['partition']}]: {p['error']}"))
    if report["stores"]:
        rows = report["stores"]
        columns, values = _with_root(
            ("job", "store", "partition", "local files", "copy of version", "left by", "copy"), rows,
            [(s["job"], s["store"], s["partition"],
              f"{s['files']:,} files, {s['bytes']:,} bytes" if s["files"] else "in memory (no local files)",
              "" if s.get("copy_version") is None else s["copy_version"],
              (s.get("left_by") or "") + (" (standby)" if s.get("copy_role") == "standby" else ""),
              s.get("copy", "")) for s in rows])
        console.print(_table(title("local stores", "stores"), columns, values))
    elif job:
        console.print(_escape(f"no local store copies in {where['stores']} (rebuilt from the changelog on open)"))
    if report.get("generations"):
        rows = report["generations"]
        console.print(_table(title("rescaled jobs", "generations"), ("job", "generation", "partitions", "was",
                                                                     "checkpoints of"),
                             [(g["job"], g.get("generation", "?"), g.get("partitions", "?"),
                               g.get("previous_partitions", "?"), g.get("checkpoints_of", g.get("error", "")))
                              for g in rows]))
    if not any(report[section] for section in SECTIONS):
        console.print(f"nothing localstate recognises under {_escape(where['checkpoints'])}")


def _clip(text: str, limit: int = 48) -> str:
    """A long value cut for a table cell (``--json`` has it whole)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _escape(value: Any) -> str:
    from rich.markup import escape

    return escape(str(value))


def _check_wipe(config: Any, partition: int, console: Any, recovering: bool) -> None:
    """``restore --wipe``: say which local store files will be deleted, after checking
    that the changelog can rebuild them (else the local files may be the only good
    copy) unless a recovery option says how to proceed. The deletion itself happens
    under the task lock when the task opens (``TaskStorage(discard_local=True)``), so
    it never runs beside a live task."""
    from .inspect import lock_holder
    from .layout import lock_path, store_dir
    from .verify import verify_job

    holder = lock_holder(lock_path(config, partition))  # the friendly early word; the lock is the guard
    if holder is not None:
        raise click.ClickException(
            f"task {config.job_name}/partition {partition} is open in pid {holder}; stop it before --wipe"
        )
    if not recovering:
        problems = [f"{c.store}[{c.partition}]: {problem}" for c in verify_job(config, [partition], deep=False)
                    for problem in c.problems]
        if problems:
            raise click.ClickException(
                "not wiping: the changelog could not rebuild what --wipe would delete, so the local files may "
                "be the only good copy. " + " ".join(problems) + " (see `localstate verify`; a recovery option "
                "such as --accept-log-end STORE says how to proceed)"
            )
    for name in config.stores:
        d = store_dir(config, name, partition)
        if d.is_dir() and any(d.iterdir()):  # engines that keep no local files have nothing to delete
            console.print(f"--wipe: deleting local files of {_escape(name)}[{partition}] in {_escape(d)}")


def _restore_total(config: Any, store: str, partition: int, start: int, stop: int) -> int:
    """Records a restore of ``store`` replays from ``[start, stop)``: counted where the
    changelog can count them cheaply (the file log: after compaction far fewer than the
    offsets); elsewhere the bar is sized by offsets and completes when done."""
    from .store_open import open_system

    spec = config.stores[store]
    if spec.changelog is None:
        return stop - start
    system_name, stream = spec.changelog
    system = open_system(config, system_name)
    try:
        counted = system.count_records(stream, partition, config.partitions, start, stop)
    finally:
        system.close()
    return stop - start if counted is None else counted


@cli.command()
@job_options
@click.option("--store", "stores", multiple=True, help="only these stores [default: all]")
@click.option("--wipe", is_flag=True,
              help="DELETE the local store files first and rebuild them from the changelog; off by default, "
                   "which keeps them and replays only what they miss")
@click.option("--accept-log-end", "accept_log_end", multiple=True, metavar="STORE",
              help="take STORE's changelog, up to its last readable record, as committed (a lost checkpoint, "
                   "damaged committed records)")
@click.option("--reset", "reset", multiple=True, metavar="STORE",
              help="give up STORE's state: empty its changelog and local copy")
@click.option("--use-previous-checkpoint", is_flag=True,
              help="the latest task checkpoint is lost or damaged: go back to the one before it")
@click.option("--accept-config-change", "accept_config_change", multiple=True, metavar="STORE",
              help="STORE's engine or serdes changed and read the same records: rebuild its local copy")
def restore(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...],
            stores: tuple[str, ...], wipe: bool, accept_log_end: tuple[str, ...], reset: tuple[str, ...],
            use_previous_checkpoint: bool, accept_config_change: tuple[str, ...]) -> None:
    """Bring stores up to the last commit from their changelog (with a progress bar).

    Deletes nothing unless --wipe is given: local store files are kept and only the
    records they miss are replayed (engines that keep no local files replay all).
    --wipe deletes them first, a full rebuild, and says so for each store; it refuses
    while a task has the partition open.

    The recovery options are explicit answers to errors that opening a task raises
    instead of guessing (RELIABILITY.md, "operator damage"); each is written into the
    task checkpoint, so the next open needs no option.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .storage import Recovery, TaskStorage
    from .terminal import quiet_stderr

    recovery = Recovery(accept_log_end=frozenset(accept_log_end), reset=frozenset(reset),
                        use_previous_checkpoint=use_previous_checkpoint,
                        accept_config_change=frozenset(accept_config_change))
    config = load_config(config_path, overrides)
    if stores:
        unknown = set(stores) - set(config.stores)
        if unknown:
            raise click.BadParameter(f"unknown store(s) {sorted(unknown)}; the config has {sorted(config.stores)}",
                                     param_hint="--store")
        config = config.__class__({k: v for k, v in config.to_dict().items()
                                   if not k.startswith("stores.") or k.split(".")[1] in stores})
    parts = partitions_of(config, partitions)
    console = _console()
    # quiet_stderr outside the display: its lines are shown once the bars have stopped
    with quiet_stderr(console.is_terminal, "restore", show_after=True), \
            Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("records"),
                     TimeElapsedColumn(), console=console) as progress:
        for p in parts:
            if wipe:
                _check_wipe(config, p, progress.console, recovering=bool(recovery))
            bars: dict[str, Any] = {}

            def listener(ev: Any, p: int = p, bars: dict[str, Any] = bars) -> None:
                if ev.store not in bars:  # a store done at its first report needs no count
                    total = ev.records if ev.done else _restore_total(config, ev.store, p, ev.start_offset,
                                                                      ev.stop_offset)
                    bars[ev.store] = progress.add_task(_escape(f"{ev.store}[{p}]"), total=max(1, total))
                if ev.done:  # the final count is the truth even where the total was an offset estimate
                    progress.update(bars[ev.store], completed=ev.records, total=ev.records)
                else:
                    progress.update(bars[ev.store], completed=ev.records)

            with TaskStorage(config, p, restore_listener=listener, recovery=recovery,
                             discard_local=wipe) as storage:
                for name, ev in storage.last_restore.items():
                    if ev.records == 0:
                        line = (f"{name}[{p}]: local copy kept, already at offset {ev.stop_offset} "
                                "(nothing to replay; --wipe rebuilds it from the changelog)")
                    else:
                        line = (f"{name}[{p}]: {ev.records:,} records, {ev.bytes / 1e6:.1f} MB in {ev.seconds:.2f}s "
                                f"({ev.records_per_second:,.0f} records/s) up to offset {ev.stop_offset}")
                    progress.console.print(_escape(line))


@cli.command()
@job_options
def compact(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...]) -> None:
    """Compact changelogs below each task's committed offset (the task must be stopped).

    Only closed segments are compacted: the active one, which the task appends to, is
    left alone, so a young changelog with one segment has nothing to compact yet.
    """
    from .storage import TaskStorage

    config = load_config(config_path, overrides)
    rows: list[tuple[Any, ...]] = []
    idle: list[str] = []
    for p in partitions_of(config, partitions):
        with TaskStorage(config, p) as storage:
            for store, stats in storage.compact().items():
                if not stats.get("segments"):
                    idle.append(f"{store}[{p}]")
                    continue
                before, after = stats.get("records_before", 0), stats.get("records_after", 0)
                rows.append((store, p, stats["segments"], f"{before:,}", f"{after:,}", f"{before - after:,}",
                             f"{stats.get('tombstones_dropped', 0):,}"))
    console = _console()
    if rows:
        console.print(_table("changelog compaction", ("store", "partition", "segments", "before", "after", "removed",
                                                      "tombstones dropped"), rows))
    if idle:
        console.print(_escape(f"nothing to compact (only the active segment): {', '.join(idle)}"))
    if not rows and not idle:
        console.print("nothing to compact: no store of this job has a changelog")


@cli.command()
@job_options
@system_option
@click.option("--quick", is_flag=True, help="check checkpoints and log ends only, not every record batch")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def verify(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...],
           system_name: str | None, quick: bool, as_json: bool) -> None:
    """Check a job's changelogs against its checkpoints (exit 1 on a problem).

    Every checkpoint parses, every changelog's records are explained by a checkpoint,
    committed offsets are within their log, and (unless --quick) every record batch
    passes its CRC. Read-only, on every changelog system: safe beside live tasks and
    cheap enough to run on a schedule.
    """
    from .verify import verify_job

    config = load_config(config_path, overrides)
    checks = verify_job(config, list(partitions_of(config, partitions)), deep=not quick,
                        system=_system(config, system_name))
    bad = [c for c in checks if not c.ok]
    if as_json:
        click.echo(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        for c in checks:
            status = "PROBLEM" if not c.ok else "ok" if c.committed is not None or c.end_offset else "nothing committed"
            click.echo(f"{c.store}[{c.partition}]: {status}  committed={c.committed} end={c.end_offset} "
                       f"batches={c.batches} bytes={c.bytes:,} {c.seconds:.3f}s")
            for problem in c.problems:
                click.echo(f"    - {problem}")
        click.echo(f"{len(checks)} store partition(s) checked, {len(bad)} with problems")
        if checks and all(c.committed is None and not c.end_offset for c in checks):
            click.echo(f"job {config.job_name!r} has committed nothing there yet: a new job, or job.name and "
                       "the systems.* settings point elsewhere (relative paths are read from the current "
                       "directory; localstate inspect -c shows where each system is)")
    if bad:
        sys.exit(1)


def main(argv: list[str] | None = None) -> Any:
    """Entry point (``localstate`` and ``python -m localstate``); errors are one line and exit code 1."""
    try:
        return cli.main(args=argv, prog_name="localstate", standalone_mode=True)
    except LocalStateError as e:  # pragma: no cover - the group's invoke() converts those it sees
        click.echo(f"Error: {e}", err=True)
        sys.exit(1)

"""``localstate bench``: run suites of workloads × engines; table, JSON and PNG charts.

Examples::

    localstate bench --quick                                  # in-process suites, tiny sizes (~15 s)
    localstate bench --suite generic --engine rocksdb --engine leveldb --records 1000000
    localstate bench --suite generic --engine mypkg.engines:MyFactory --workload random_get_hit
    localstate bench --suite core,kv,special --out benchmarks/results
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from localstate.errors import ConfigError
from localstate.registry import ENGINES

from .registry import (
    GENERIC_SUITE,
    SUITES,
    WORKLOADS,
    get_suites,
    get_workloads,
    load_workload_modules,
)
from .runner import (
    CHANGELOGS,
    DISTRIBUTIONS,
    QUICK_RECORDS,
    BenchParams,
    check_resources,
    machine_info,
    peak_rss_bytes,
    suite_rows,
)
from .timing import Stopwatch

__all__ = ["bench", "run_bench", "selected_suites", "DEFAULT_ENGINES", "QUICK_SUITES"]

QUICK_SUITES = ("generic", "core", "kv", "special", "search", "reliability")
"""What --quick runs when no --suite is named: the suites that need no broker or JVM."""

DEFAULT_ENGINES = ("memory", "rocksdb", "leveldb")
"""The key-value engines the generic suite covers when no --engine is given (if installed)."""


def default_engines() -> list[str]:
    return [e for e in DEFAULT_ENGINES if ENGINES.installed(e)[0]]


def selected_suites(spec: str | None, *, quick: bool, generic_only: bool) -> list[str]:
    """The suites to run: those named in ``spec``; else ``generic`` when engines or
    workloads were named, the in-process :data:`QUICK_SUITES` with --quick, or all."""
    if spec is None and generic_only:
        spec = GENERIC_SUITE
    elif spec is None and quick:
        spec = ",".join(QUICK_SUITES)
    return get_suites(spec)


def run_bench(
    suites: list[str],
    engines: list[str],
    workloads: list[str] | None,
    params: BenchParams,
    *,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run the selected suites and return every row (error cells included)."""
    from localstate.terminal import quiet_stderr
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .workloads import run_generic

    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    # the kafka and spark suites start a broker and a JVM that write to fd 2 under the bar;
    # quiet_stderr is outside the display, so a failure's lines come after the bar is gone
    with quiet_stderr(progress, "the benchmark's broker, JVM or libraries"), Progress(
        TextColumn("[bold]{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        disable=not progress, transient=True, console=None,
    ) as bar:
        task = bar.add_task("starting", total=len(suites))

        def step(desc: str) -> None:
            """Advance the bar; without a terminal, log a line per step to stderr instead."""
            bar.update(task, description=escape(desc))
            if not progress:
                done, total = bar.tasks[0].completed, bar.tasks[0].total
                click.echo(f"[{time.perf_counter() - t0:7.1f}s {done:.0f}/{total:.0f}] {desc}", err=True)

        for suite in suites:
            if suite == GENERIC_SUITE:
                def on_start(n: int) -> None:  # the suite's one step becomes its n cells
                    bar.update(task, total=(bar.tasks[0].total or 0) - 1 + n)

                def on_cell(desc: str) -> None:
                    step(desc)
                    bar.advance(task)

                rows += run_generic(engines, workloads, params, on_start=on_start, on_cell=on_cell)
            else:
                step(f"suite {suite}")
                rows += suite_rows(SUITES[suite][0], suite, params.quick, params.repeats)
                bar.advance(task)
    return rows


def _list_everything() -> None:
    load_workload_modules()

    click.echo("Suites (--suite a,b or all):")
    for name, (_mod, desc) in SUITES.items():
        click.echo(f"  {name:<10} {desc}")
    click.echo("Generic workloads (--workload):")
    for w in WORKLOADS.values():
        click.echo(f"  {w.name:<20} [{w.unit}] {w.description}")
    click.echo("Engines (--engine NAME, an entry-point name, or package.module:Factory):")
    for name in ENGINES.names():
        ok, why = ENGINES.installed(name)
        click.echo(f"  {name:<12} {'installed' if ok else 'missing: ' + why}")
    click.echo("Each engine runs twice in the generic suite: <engine> is the full store (serdes, object cache,\n"
               "changelog), <engine>/direct the engine alone; the difference is what the store layers cost.")


def _parse_options(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for v in values:
        key, eq, val = v.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--option {v!r}: expected KEY=VALUE, e.g. rocksdb.block.cache.size.bytes=16777216")
        out.append((key.strip(), val.strip()))
    return tuple(out)


@click.command(name="bench")
@click.option("--suite", "suite", default=None, metavar="NAMES",
              help=f"comma-separated suites: all, {', '.join(SUITES)} [default: all; with --quick the "
                   "in-process ones; with --engine/--workload generic]")
@click.option("--engine", "engines", multiple=True, metavar="NAME",
              help="engine for the generic suite (repeatable): registered name, entry point or "
                   f"package.module:Factory [default: {', '.join(DEFAULT_ENGINES)} if installed]")
@click.option("--workload", "workloads", multiple=True, metavar="NAME", help="generic workload (repeatable) [default: all]")
@click.option("--records", type=click.IntRange(min=1), default=None,
              help=f"records per trial [default: 100000; {QUICK_RECORDS} with --quick]")
@click.option("--key-size", type=click.IntRange(min=4), default=16, show_default=True, help="key bytes")
@click.option("--value-size", type=click.IntRange(min=1), default=100, show_default=True, help="value bytes")
@click.option("--distribution", type=click.Choice(DISTRIBUTIONS), default="uniform", show_default=True,
              help="key order of random puts and gets")
@click.option("--cache-size", type=click.IntRange(min=0), default=1000, show_default=True,
              help="object cache entries per store (0 = off)")
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
              help="write.batch.size and put_all/get_all batch")
@click.option("--changelog", type=click.Choice(CHANGELOGS), default="file", show_default=True,
              help="changelog of the localstate stores")
@click.option("--kafka-bootstrap", default=None, metavar="HOST:PORT", help="broker for --changelog kafka")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="extra stores.<s>.KEY for every localstate store (e.g. rocksdb.block.cache.size.bytes=...)")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="timed runs after one warm-up [default: 5; 2 with --quick]")
@click.option("--quick", is_flag=True,
              help=f"tiny sizes and the in-process suites only ({', '.join(QUICK_SUITES)}): about 15 s on "
                   "2 quiet cores, more on a busy machine; name kafka or spark in --suite to add them "
                   "(a broker, a JVM: slower)")
@click.option("--table", "full_table", is_flag=True,
              help="print every row (the full table) instead of the engine × workload summary")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write results.json, results.md and PNG charts here")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where trial data is written [default: a temporary directory]")
@click.option("--strict", is_flag=True, help="exit with status 1 if any cell failed")
@click.option("--merge", is_flag=True,
              help="update an existing --out/results.json: re-run suites replace their rows, generic cells one by one")
@click.option("--list", "list_", is_flag=True, help="list suites, workloads and engines, then exit")
def bench(
    suite: str | None, engines: tuple[str, ...], workloads: tuple[str, ...], records: int | None,
    key_size: int, value_size: int, distribution: str, cache_size: int, batch_size: int,
    changelog: str, kafka_bootstrap: str | None, options: tuple[str, ...], repeats: int | None,
    quick: bool, full_table: bool, out: Path | None, workdir: Path | None, strict: bool, merge: bool,
    list_: bool,
) -> None:
    """Benchmark engines: generic key-value workloads and the per-area suites.

    Each cell is a warm-up then the median of --repeats runs, with the raw library
    (dict, rocksdict, plyvel) measured in the same run as the baseline. Prints a
    summary, engine × workload with each figure's ratio to its baseline (for rates
    above 1 is faster, for seconds above 1 is slower); --table prints every row and
    --out writes them all (results.json, results.md, charts).

    Engines appear twice: <engine> is the full store (serdes, object cache,
    changelog), <engine>/direct the engine alone, so the difference is what the
    store layers cost.
    """
    if list_:
        _list_everything()
        return
    try:
        suites = selected_suites(suite, quick=quick, generic_only=bool(engines or workloads))
        if workloads:
            get_workloads(list(workloads))
        selected = list(engines) or default_engines()
        if GENERIC_SUITE in suites:
            from .targets import targets_for

            targets_for(selected, baselines=False, direct=False)  # unknown engines fail before any work
        params = BenchParams(
            records=records if records is not None else (QUICK_RECORDS if quick else 100_000),
            key_size=key_size, value_size=value_size, distribution=distribution,
            cache_size=cache_size, batch_size=batch_size, changelog=changelog,
            repeats=repeats if repeats is not None else (2 if quick else 5), quick=quick,
            kafka_bootstrap=kafka_bootstrap, workdir=str(workdir) if workdir else None,
            options=_parse_options(options),
        )
        if GENERIC_SUITE in suites:
            from .targets import Target, make_config

            for engine in selected:  # --option keys are validated against each engine up front
                make_config(Target(engine, "store", engine), replace(params, changelog="none"), Path("."))
            check_resources(params, len(selected), workdir or Path(tempfile.gettempdir()))
    except ConfigError as e:
        raise click.UsageError(str(e)) from e

    with contextlib.ExitStack() as stack:
        if changelog == "kafka" and not kafka_bootstrap and GENERIC_SUITE in suites:
            params = replace(params, kafka_bootstrap=_start_broker(stack))
        _run_and_report(suites, selected, workloads, params, out, strict, merge, full_table)


def _command_line() -> str:
    """The invocation as typed (or, when called in-process, rebuilt from the non-default options)."""
    if Path(sys.argv[0]).name == "localstate":
        return " ".join(["localstate", *map(shlex.quote, sys.argv[1:])])
    ctx = click.get_current_context()
    parts = ["localstate", "bench"]
    for p in ctx.command.params:
        value = ctx.params.get(p.name)  # type: ignore[arg-type]
        if value in (None, False, ()) or value == p.default:
            continue
        flag = max(p.opts, key=len)
        for v in value if isinstance(value, tuple) else (value,):
            parts += [flag] if v is True else [flag, shlex.quote(str(v))]
    return " ".join(parts)


def _merged(path: Path, rows: list[dict[str, Any]], suites: list[str], command: str,
            seconds: float, run: dict[str, Any]) -> tuple[list[dict[str, Any]], str, float, list[dict[str, Any]]]:
    """The rows of ``path`` updated with this run's rows; commands joined; the runs
    (command, machine, load) that measured the rows kept, with ``run`` appended.

    A re-run area suite replaces all of its old rows; generic rows are replaced cell by
    cell (same workload, engine and unit), so one workload can be re-measured alone.
    """
    import json

    try:
        old = json.loads(path.read_text())
        old_rows = list(old["rows"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise click.ClickException(f"--merge: cannot read {path}: {e}") from e

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r.get("suite"), r.get("workload"), r.get("engine"), r.get("unit"))

    new = {key(r): r for r in rows}
    merged: list[dict[str, Any]] = []
    for r in old_rows:
        if r.get("suite") in suites and r.get("suite") != GENERIC_SUITE:
            continue
        if key(r) in new:
            merged.append(new.pop(key(r)))
            continue
        for k in ("median", "min", "max"):
            if r.get(k) is None:
                r[k] = float("nan")
        merged.append(r)
    merged += [r for r in rows if key(r) in new]
    runs = old.get("runs")
    if not isinstance(runs, list):  # a document written before runs were recorded: one run
        runs = [{k: old.get(k) for k in ("started", "command", "seconds", "machine", "params")}]
        for r in merged:
            r.setdefault("run", old.get("started"))
    used = {r.get("run") for r in merged}
    runs = [r for r in runs if isinstance(r, dict) and r.get("started") in used and r.get("started") != run["started"]]
    return merged, f"{old.get('command', '?')} ; {command}", float(old.get("seconds") or 0) + seconds, runs + [run]


def _start_broker(stack: contextlib.ExitStack) -> str:
    """Start a local tansu broker for ``--changelog kafka`` (stopped when the run ends)."""
    try:
        from localstate.testing.kafka import TansuBroker

        broker = stack.enter_context(TansuBroker().start())
    except Exception as e:
        raise click.UsageError(
            f"--changelog kafka without --kafka-bootstrap starts a local tansu broker, which failed: {e}. "
            "Install 'localstate[kafka,test]' (the test extra has the tansu broker) or pass --kafka-bootstrap HOST:PORT"
        ) from e
    click.echo(f"started a tansu broker on {broker.bootstrap} for --changelog kafka", err=True)
    return broker.bootstrap


def _run_and_report(suites: list[str], selected: list[str], workloads: tuple[str, ...], params: BenchParams,
                    out: Path | None, strict: bool, merge: bool = False, full_table: bool = False) -> None:
    command = _command_line()
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
    machine = machine_info()
    with Stopwatch() as watch:
        rows = run_bench(suites, selected, list(workloads) or None, params, progress=sys.stderr.isatty())
    seconds = watch.wall
    machine["peak_rss_bytes"] = peak_rss_bytes()

    from .report import render_summary, render_table, write_charts, write_json, write_markdown

    title = f"localstate bench ({', '.join(suites)}) on {machine['cores']} cores, {seconds:.0f}s"
    if full_table:
        render_table(rows, title=title)
    else:
        render_summary(rows, title=title)
        if out is None:
            click.echo(f"{len(rows)} rows: --table prints them all, --out DIR writes them (results.md, JSON, charts)")
    meta = {**params.public(), "suites": suites, "engines": selected, "repeats": params.repeats,
            "quick": params.quick}
    for r in rows:
        r["run"] = started
    runs = [{"started": started, "command": command, "seconds": round(seconds, 3), "machine": machine,
             "params": meta}]
    if out is not None and merge and (out / "results.json").exists():
        rows, command, seconds, runs = _merged(out / "results.json", rows, suites, command, seconds, runs[0])
    if out is not None:
        path = write_json(out / "results.json", rows, machine=machine, command=command, params=meta,
                          started=started, seconds=seconds, runs=runs)
        write_markdown(out / "results.md", rows, machine=machine, command=command, started=started, seconds=seconds,
                       runs=runs)
        charts = write_charts(out, rows)
        click.echo(f"wrote {path}, results.md" + "".join(f", {c.name}" for c in charts))
    failed = [r for r in rows if r.get("error")]
    if failed:
        click.echo(f"{len(failed)} cell(s) failed; see 'failed cells' (or the error column of --table)", err=True)
        if strict:
            sys.exit(1)

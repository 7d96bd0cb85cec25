"""The ``localstate`` command line.

Core commands live here; the heavier ones (``bench``, ``torture``, ``demo``,
``new-engine``) are imported only when invoked, so ``localstate engines`` stays fast
and works without the extras.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import click

from .errors import LocalStateError

__all__ = ["main", "cli"]

LAZY_COMMANDS = {
    "bench": ("localstate.benchmarks.cli:bench", "run the benchmark suite"),
    "torture": ("localstate.testing.torture:torture", "crash trials: kill a task at random points, verify no loss"),
    "demo": ("localstate.contrib.spark.demo:demo", "the demo pipeline on local Spark"),
    "new-engine": ("localstate.contrib.scaffold:new_engine", "write a ready-to-fill engine plug-in package"),
    "run": ("localstate.contrib.spark.jobs:run_job", "run one of the example jobs"),
}


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
            reason = str(e)

            @click.command(name=name, help=help_text)
            def unavailable() -> None:
                raise click.ClickException(
                    f"'localstate {name}' is unavailable: {reason}. Install everything with: "
                    "pip install 'localstate[all]'"
                )

            return unavailable

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                rows.append((name, LAZY_COMMANDS[name][1]))
            else:
                cmd = super().get_command(ctx, name)
                if cmd is not None:
                    rows.append((name, cmd.get_short_help_str(60)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="localstate")
def cli() -> None:
    """localstate: local, fault-tolerant state for stream tasks."""


def _load_config(path: str | None, overrides: tuple[str, ...]) -> Any:
    from .config import Config

    values: dict[str, Any] = {}
    if path:
        values = Config.load(path).to_dict()
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--set")
        values[key.strip()] = value.strip()
    return Config.from_dict(values)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def engines(as_json: bool) -> None:
    """List registered storage engines and whether their extra is installed."""
    from .registry import available

    info = available()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="storage engines")
    for col in ("name", "installed", "origin", "notes"):
        table.add_column(col)
    for name, row in sorted(info.items()):
        note = ""
        if row["installed"]:
            from .registry import resolve_factory

            try:
                note = getattr(resolve_factory(name), "description", "")
            except LocalStateError as e:
                note = str(e)
        else:
            note = row["hint"]
        table.add_row(name, "yes" if row["installed"] else "no", row["origin"], note)
    Console().print(table)


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def inspect(path: Path, as_json: bool) -> None:
    """Describe a changelog directory (systems.file.path) or a state directory.

    Read-only: never locks, truncates or writes, so it is safe on a live task.
    """
    from .inspect import inspect_path

    report = inspect_path(path)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if report.get("checkpoints"):
        t = Table(title=f"task checkpoints under {path}")
        for col in ("job", "partition", "version", "input position", "offsets", "written"):
            t.add_column(col)
        for c in report["checkpoints"]:
            t.add_row(c["job"], str(c["partition"]), str(c.get("version", "")), json.dumps(c.get("input_position")),
                      json.dumps(c.get("offsets", c.get("error", ""))), str(c.get("written_at", "")))
        console.print(t)
    if report.get("partitions"):
        t = Table(title=f"changelog partitions under {path}")
        for col in ("stream", "partition", "segments", "end offset", "records", "bytes", "horizon", "locked by"):
            t.add_column(col)
        for p in report["partitions"]:
            t.add_row(p["stream"], str(p["partition"]), str(p["segments"]), str(p["end_offset"]),
                      str(p["records"]), f"{p['bytes']:,}", str(p["tombstone_horizon"]), str(p.get("locked_by") or ""))
        console.print(t)
    if report.get("stores"):
        t = Table(title=f"local stores under {path}")
        for col in ("job", "store", "partition", "files", "bytes"):
            t.add_column(col)
        for s in report["stores"]:
            t.add_row(s["job"], s["store"], str(s["partition"]), str(s["files"]), f"{s['bytes']:,}")
        console.print(t)
    if not any(report.get(k) for k in ("checkpoints", "partitions", "stores")):
        console.print(f"nothing localstate recognises under {path}")


@cli.command()
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help=".toml or .properties job config")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config key")
@click.option("--partition", "-p", "partitions", type=int, multiple=True, help="task partition(s); default all")
@click.option("--store", "stores", multiple=True, help="only these stores (default all)")
@click.option("--wipe/--no-wipe", default=True, help="delete local store files first (full rebuild)")
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
    """Rebuild stores from their changelog to the last commit (with a progress bar).

    The recovery options are explicit answers to errors that opening a task raises
    instead of guessing (RELIABILITY.md, "operator damage"); each is written into the
    task checkpoint, so the next open needs no option.
    """
    import shutil

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .storage import Recovery, TaskStorage

    recovery = Recovery(accept_log_end=frozenset(accept_log_end), reset=frozenset(reset),
                        use_previous_checkpoint=use_previous_checkpoint,
                        accept_config_change=frozenset(accept_config_change))
    config = _load_config(config_path, overrides)
    if stores:
        unknown = set(stores) - set(config.stores)
        if unknown:
            raise click.BadParameter(f"unknown store(s) {sorted(unknown)}; the config has {sorted(config.stores)}")
        config = config.__class__({k: v for k, v in config.to_dict().items()
                                   if not k.startswith("stores.") or k.split(".")[1] in stores})
    parts = partitions or tuple(range(config.partitions))
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,} records"),
                  TimeElapsedColumn()) as progress:
        for p in parts:
            if wipe:
                for name in config.stores:
                    d = config.state_dir / config.job_name / name / str(p)
                    if d.exists():
                        shutil.rmtree(d)
            bars: dict[str, Any] = {}

            def listener(ev: Any, p: int = p, bars: dict[str, Any] = bars) -> None:
                if ev.store not in bars:
                    bars[ev.store] = progress.add_task(f"{ev.store}[{p}]", total=max(1, ev.stop_offset - ev.start_offset))
                progress.update(bars[ev.store], completed=ev.records)

            try:
                with TaskStorage(config, p, restore_listener=listener, recovery=recovery) as storage:
                    for name, ev in storage.last_restore.items():
                        progress.console.print(
                            f"{name}[{p}]: {ev.records:,} records, {ev.bytes / 1e6:.1f} MB in {ev.seconds:.2f}s "
                            f"({ev.records_per_second:,.0f} records/s) up to offset {ev.stop_offset}"
                        )
            except LocalStateError as e:
                raise click.ClickException(str(e)) from e


@cli.command()
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help=".toml or .properties job config")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config key")
@click.option("--partition", "-p", "partitions", type=int, multiple=True, help="task partition(s); default all")
def compact(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...]) -> None:
    """Compact changelogs below each task's committed offset (the task must be stopped)."""
    from .storage import TaskStorage

    config = _load_config(config_path, overrides)
    for p in partitions or range(config.partitions):
        try:
            with TaskStorage(config, p) as storage:
                for store, stats in storage.compact().items():
                    click.echo(f"{store}[{p}]: {stats}")
        except LocalStateError as e:
            raise click.ClickException(str(e)) from e


@cli.command()
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help=".toml or .properties job config")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config key")
@click.option("--partition", "-p", "partitions", type=int, multiple=True, help="task partition(s); default all")
@click.option("--quick", is_flag=True, help="check checkpoints and log ends only, not every record batch")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def verify(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...], quick: bool,
           as_json: bool) -> None:
    """Check changelogs against checkpoints without changing anything (exit 1 on a problem).

    Every checkpoint parses, every changelog's records are explained by a checkpoint,
    committed offsets are within their log, and (unless --quick) every record batch
    passes its CRC. Safe beside live tasks; cheap enough to run on a schedule.
    """
    from .verify import verify_job

    config = _load_config(config_path, overrides)
    try:
        checks = verify_job(config, list(partitions) or None, deep=not quick)
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e
    bad = [c for c in checks if not c.ok]
    if as_json:
        click.echo(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        for c in checks:
            status = "ok" if c.ok else "PROBLEM"
            click.echo(f"{c.store}[{c.partition}]: {status}  committed={c.committed} end={c.end_offset} "
                       f"batches={c.batches} bytes={c.bytes:,} {c.seconds:.3f}s")
            for problem in c.problems:
                click.echo(f"    - {problem}")
        click.echo(f"{len(checks)} store partition(s) checked, {len(bad)} with problems")
    if bad:
        sys.exit(1)


def _parse_key(text: str, serde: str, store: str) -> Any:
    """A key typed on the command line, as the store's key serde wants it."""
    if serde == "string":
        return text
    if serde == "bytes":
        return text.encode()
    try:
        if serde in ("int", "long"):
            return int(text)
        value = json.loads(text)
    except ValueError as e:
        raise click.BadParameter(
            f"{text!r} is not a key of store {store!r} (key.serde {serde!r}): {e}", param_hint="KEY"
        ) from e
    return tuple(value) if serde == "tuple" and isinstance(value, list) else value


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        return {"base64": base64.b64encode(bytes(obj)).decode()}
    return repr(obj)


def _show(obj: Any) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj, default=_json_default, sort_keys=True)


def _read_partitions(config: Any, store: str, partition: int | None) -> list[int]:
    if store not in config.stores:
        from .registry import did_you_mean

        raise click.ClickException(f"no store named {store!r} in job {config.job_name!r}.{did_you_mean(store, config.stores)}")
    if partition is None:
        return list(range(config.partitions))
    if not 0 <= partition < config.partitions:
        raise click.BadParameter(f"{partition} is out of range: job.partitions = {config.partitions}", param_hint="--partition")
    return [partition]


@cli.command()
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help=".toml or .properties job config")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config key")
@click.option("--partition", "-p", type=int, default=None, help="only this task partition (default: look in all)")
@click.option("--json", "as_json", is_flag=True, help="print {partition, key, value} as JSON")
@click.argument("store")
@click.argument("key")
def get(config_path: str | None, overrides: tuple[str, ...], partition: int | None, as_json: bool,
        store: str, key: str) -> None:
    """Print the committed value of KEY in STORE (exit 1 if absent).

    Reads the state as of each task's last commit, beside the running job (no lock, no
    writes). KEY is parsed for the store's key serde: text for ``string``, a number
    for ``int``/``long``, JSON for ``json``/``tuple`` (``'[1, "u"]'``).
    """
    from .reader import StateReader

    config = _load_config(config_path, overrides)
    spec = config.stores.get(store)
    parts = _read_partitions(config, store, partition)
    wanted = _parse_key(key, spec.key_serde, store)
    try:
        for p in parts:
            with StateReader(config, p) as reader:
                value = reader.get(store, wanted)
            if value is not None:
                if as_json:
                    click.echo(json.dumps({"partition": p, "key": wanted, "value": value}, default=_json_default))
                else:
                    click.echo(_show(value))
                return
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"key {wanted!r} is not in the committed state of store {store!r} (partitions {parts})", err=True)
    sys.exit(1)


@cli.command()
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help=".toml or .properties job config")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config key")
@click.option("--partition", "-p", type=int, default=None, help="only this task partition (default: all)")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=None, help="stop after N records")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line: {partition, key, value}")
@click.option("--on-disk", is_flag=True, help="rebuild each partition with the store's engine in a temp dir, not in memory")
@click.argument("store")
def dump(config_path: str | None, overrides: tuple[str, ...], partition: int | None, limit: int | None,
         as_json: bool, on_disk: bool, store: str) -> None:
    """Print the committed state of STORE: ``partition<TAB>key<TAB>value`` lines in key
    order per partition, or JSON lines. Reads beside the running job (no lock, no writes)."""
    from .reader import read_committed

    config = _load_config(config_path, overrides)
    parts = _read_partitions(config, store, partition)
    if limit == 0:
        return
    n = 0
    try:
        for p, k, v in read_committed(config, store, parts, in_memory=not on_disk):
            if as_json:
                click.echo(json.dumps({"partition": p, "key": k, "value": v}, default=_json_default))
            else:
                click.echo(f"{p}\t{_show(k)}\t{_show(v)}")
            n += 1
            if limit is not None and n >= limit:
                break
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e


def main(argv: list[str] | None = None) -> Any:
    """Entry point; turns LocalStateError into a one-line message and exit code 1."""
    try:
        return cli.main(args=argv, prog_name="localstate", standalone_mode=True)
    except LocalStateError as e:  # pragma: no cover - click handles most
        click.echo(f"error: {e}", err=True)
        sys.exit(1)

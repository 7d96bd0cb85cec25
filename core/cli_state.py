"""The state commands of the ``localstate`` CLI: ``get`` and ``dump`` (read a job's
committed state, read-only, beside a running job) and ``rescale`` (re-partition a
stopped job). Listed in :data:`localstate.cli.LAZY_COMMANDS`, imported when one of them runs."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .cli_options import job_options, load_config, partitions_of
from .errors import InvalidValueError, LocalStateError
from .serving_answers import json_default, parse_key

__all__ = ["dump", "get", "rescale_command"]


def _parse_key(text: str, serde: str, store: str) -> Any:
    """A key typed on the command line, as the store's key serde wants it."""
    try:
        return parse_key(text, serde, store)
    except InvalidValueError as e:
        raise click.BadParameter(str(e), param_hint="KEY") from e


def _show(obj: Any) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj, default=json_default, sort_keys=True)


def _check_store(config: Any, store: str) -> None:
    if store not in config.stores:
        from .registry import did_you_mean

        raise click.ClickException(f"no store named {store!r} in job {config.job_name!r}.{did_you_mean(store, config.stores)}")


@click.command()
@job_options
@click.option("--json", "as_json", is_flag=True, help="print {partition, key, value} as JSON")
@click.argument("store")
@click.argument("key")
def get(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...], as_json: bool,
        store: str, key: str) -> None:
    """Print the committed value of KEY in STORE (exit 1 if absent).

    Reads the state as of each task's last commit, beside the running job (no lock, no
    writes), on every changelog system; looks in each task partition in turn. KEY is
    parsed for the store's key serde: text for string, a number for int or long, JSON
    for json or tuple (for example '[1, "u"]').
    """
    from .reader import StateReader

    config = load_config(config_path, overrides)
    _check_store(config, store)
    spec = config.stores[store]
    parts = partitions_of(config, partitions)
    wanted = _parse_key(key, spec.key_serde, store)
    try:
        for p in parts:
            with StateReader(config, p) as reader:
                value = reader.get(store, wanted)
            if value is not None:
                if as_json:
                    click.echo(json.dumps({"partition": p, "key": wanted, "value": value}, default=json_default))
                else:
                    click.echo(_show(value))
                return
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"key {wanted!r} is not in the committed state of store {store!r} (partitions {list(parts)})",
               err=True)
    sys.exit(1)


@click.command()
@job_options
@click.option("--limit", "-n", type=click.IntRange(min=0), default=None, help="stop after N records")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line: {partition, key, value}")
@click.option("--on-disk", is_flag=True, help="rebuild each partition with the store's engine in a temp dir, not in memory")
@click.argument("store")
def dump(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...], limit: int | None,
         as_json: bool, on_disk: bool, store: str) -> None:
    """Print the committed state of STORE, one record per line.

    Lines are partition, key and value separated by tabs, in key order within each task
    partition (or JSON lines with --json). Reads beside the running job (no lock, no
    writes), on every changelog system.
    """
    from .reader import read_committed

    config = load_config(config_path, overrides)
    _check_store(config, store)
    parts = partitions_of(config, partitions)
    if limit == 0:
        return
    n = 0
    try:
        for p, k, v in read_committed(config, store, parts, in_memory=not on_disk):
            if as_json:
                click.echo(json.dumps({"partition": p, "key": k, "value": v}, default=json_default))
            else:
                click.echo(f"{p}\t{_show(k)}\t{_show(v)}")
            n += 1
            if limit is not None and n >= limit:
                break
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e


@click.command("rescale")
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False), required=True,
              help="the job config, a .toml or .properties file (its job.partitions is updated when done)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config key")
@click.option("--to", "to", type=click.IntRange(min=1), required=True, help="the new partition (task) count")
@click.option("--input-position", "input_position", default=None, metavar="JSON",
              help="the input position every new task resumes from [default: the old tasks' common one]")
@click.option("--spark-runner", is_flag=True,
              help="the job is run by StatefulJob: new tasks resume after the committed micro-batch")
@click.option("--spark", "use_spark", is_flag=True, help="read, route and write the state on Spark executors")
@click.option("--master", default="local[*]", show_default=True, help="Spark master for --spark")
@click.option("--keep-config", is_flag=True, help="do not rewrite job.partitions in the config file")
def rescale_command(config_path: str, overrides: tuple[str, ...], to: int, input_position: str | None,
                    spark_runner: bool, use_spark: bool, master: str, keep_config: bool) -> None:
    """Re-partition a stopped job's committed state into --to tasks (docs/rescale.md).

    Every key's state moves to the task Spark routes its rows to. Refuses (changing
    nothing) while the job runs, when its tasks are not at one commit, or when a
    store cannot be split. A crash midway leaves the old job intact, or a rescale
    that running the same command again completes.
    """
    from .rescale import SAME_POSITION, check_state_count, rescale, update_config_file

    if input_position is not None and spark_runner:
        raise click.BadParameter("give --input-position or --spark-runner, not both")
    position: Any = SAME_POSITION
    if input_position is not None:
        try:
            position = json.loads(input_position)
        except ValueError as e:
            raise click.BadParameter(f"{input_position!r} is not JSON: {e}", param_hint="--input-position") from e
    elif spark_runner:
        from localstate.contrib.spark.streaming import rescaled_position

        position = rescaled_position
    config = load_config(config_path, overrides)
    if config.partitions == to:  # a re-run after a finished rescale (and config update)
        try:
            check_state_count(config)
        except LocalStateError as e:
            raise click.ClickException(str(e)) from e
        click.echo(f"{config.job_name}: already at {to} partitions (job.partitions = {to} in {config_path}); "
                   "nothing to do")
        return
    spark = None
    if use_spark:
        from localstate.contrib.spark.runner import spark_session

        spark = spark_session(master, app_name=f"localstate-rescale-{config.job_name}")
    try:
        result = rescale(config, to, input_position=position, spark=spark)
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e
    if result.already_done:
        click.echo(f"{config.job_name}: the state is already at {to} partitions (an earlier rescale finished)")
    else:
        click.echo(f"{config.job_name}: rescaled from {result.from_partitions} to {result.to_partitions} partitions "
                   f"at version {result.version} in {result.seconds:.2f}s; records per store: {result.records}")
    if keep_config:
        click.echo(f"set job.partitions = {to} in {config_path} before the job runs again")
        return
    try:
        edit = update_config_file(config_path, to)
    except LocalStateError as e:  # the rescale stands: say what to write, and succeed
        click.echo(f"the state is rescaled, but {e}; until then the job refuses to start", err=True)
        return
    click.echo(f"{config_path}: job.partitions = {to} ({edit})")

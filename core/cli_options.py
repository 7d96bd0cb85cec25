"""The options every ``localstate`` command that reads a job shares, and their checks."""

from __future__ import annotations

from typing import Any

import click

__all__ = ["PARTITION", "job_options", "load_config", "partitions_of"]

PARTITION = click.IntRange(min=0)
"""Task partition numbers (``-p``): counted from 0."""


def job_options(command: Any) -> Any:
    """``-c/--config``, ``--set`` and ``-p/--partition``: one spelling and one meaning on
    every command that reads a job (checked by :func:`load_config` and :func:`partitions_of`)."""
    for option in reversed((
        click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False),
                     help="the job config, a .toml or .properties file"),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config key"),
        click.option("--partition", "-p", "partitions", type=PARTITION, multiple=True, metavar="N",
                     help="task partition, counted from 0 (repeatable) [default: all]"),
    )):
        command = option(command)
    return command


def load_config(path: str | None, overrides: tuple[str, ...]) -> Any:
    from .config import Config

    values: dict[str, Any] = {}
    if path:
        values = Config.load(path).to_dict()
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--set")
        values[key.strip()] = value.strip()
    if not path and "job.name" not in values:
        raise click.UsageError("no job config: pass -c job.toml (or a .properties file)")
    return Config.from_dict(values)


def partitions_of(config: Any, chosen: tuple[int, ...]) -> tuple[int, ...]:
    """``-p`` values checked against ``job.partitions`` before anything is touched (all when none)."""
    bad = sorted(p for p in chosen if p >= config.partitions)
    if bad:
        raise click.BadParameter(f"{bad} out of range: job.partitions = {config.partitions}, so 0..{config.partitions - 1}",
                                 param_hint="--partition")
    return tuple(dict.fromkeys(chosen)) or tuple(range(config.partitions))

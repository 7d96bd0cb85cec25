"""``localstate serve``: answer point lookups of a running job's committed state over HTTP
(:class:`~localstate.serving.StateServer`). Imported only when the command runs."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from .cli_options import job_options, load_config, partitions_of
from .errors import LocalStateError

__all__ = ["serve"]


def _routes(config: Any, given: tuple[str, ...]) -> dict[int, str]:
    """``--route 2,3=http://host:port`` → ``{2: url, 3: url}``."""
    out: dict[int, str] = {}
    for item in given:
        tasks, eq, url = item.partition("=")
        try:
            parts = [int(t) for t in tasks.split(",") if t.strip()]
        except ValueError:
            parts = []
        if not eq or not parts or not url.strip():
            raise click.BadParameter(f"{item!r}: expected TASKS=URL, e.g. 2,3=http://127.0.0.1:8001",
                                     param_hint="--route")
        for p in parts:
            out[p] = url.strip()
    return out


@click.command("serve")
@job_options
@click.option("--port", type=click.IntRange(0, 65535), required=True, help="HTTP port (0: any free port)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="where the server keeps its copies [default: <job.state.dir>-serving/<port>]")
@click.option("--route", "routes", multiple=True, metavar="TASKS=URL",
              help="the server holding other tasks, e.g. 2,3=http://127.0.0.1:8001 (repeatable)")
@click.option("--store", "stores", multiple=True, help="only these stores [default: every key-value store]")
@click.option("--refresh-ms", type=click.IntRange(min=1), default=100, show_default=True,
              help="how often each copy is brought to its task's newest commit")
@click.option("--redirect", is_flag=True, help="answer keys of other servers' tasks with a 307, not by forwarding")
def serve(config_path: str | None, overrides: tuple[str, ...], partitions: tuple[int, ...], port: int, host: str,
          directory: str | None, routes: tuple[str, ...], stores: tuple[str, ...], refresh_ms: int,
          redirect: bool) -> None:
    """Serve point lookups of the job's committed state over HTTP (docs/serving.md).

    Keeps a copy of each task given with -p (all by default) in a directory of its own,
    brought to the task's newest commit every --refresh-ms while the job runs (no lock
    taken from the job, only committed data, one commit per answer), and answers
    GET /v1/stores/STORE/keys/KEY and GET /v1/metadata/STORE/KEY. Runs until stopped
    (Ctrl-C or SIGTERM).
    """
    from .serving import StateServer

    config = load_config(config_path, overrides)
    tasks = partitions_of(config, partitions)
    where = Path(directory) if directory else Path(f"{config.state_dir}-serving") / str(port)
    try:
        server = StateServer(config, where, tasks=tasks, stores=stores or None, routes=_routes(config, routes),
                             refresh_ms=refresh_ms, host=host, port=port, forward=not redirect).start()
    except LocalStateError as e:
        raise click.ClickException(str(e)) from e
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        click.echo(f"serving job {config.job_name!r} tasks {list(tasks)} at {server.url} (copies in {where})",
                   nl=True)
        for status in server.status():
            click.echo(f"  task {status.partition}: {status.status}"
                       + (f" at version {status.version}" if status.version is not None else "")
                       + (f" ({status.error})" if status.error else ""))
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        server.close()

"""Read-only inspection of changelog and state directories (``localstate inspect``)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import Config
from .copies import COPIES, read_copy_record
from .errors import ConfigError, LocalStateError
from .layout import LOCKS

SECTIONS = ("checkpoints", "partitions", "stores", "generations")
"""The tables of an inspection report, in the order they are shown."""

__all__ = ["inspect_path", "inspect_remote", "inspect_job", "lock_holder"]


def lock_holder(lock: Path) -> str | None:
    """The pid holding ``lock`` if a live process holds it actively, else None (never
    blocks). A *parked* holder (an idle task kept open, :mod:`localstate.kept_open`) gives
    the lock up to whoever takes it, so it counts as free."""
    if not lock.exists():
        return None
    fd = os.open(lock, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            record = os.pread(fd, 64, 0).decode(errors="replace").split()  # "<pid> active|parked"
            if len(record) == 2 and record[1] == "parked":
                return None
            return record[0] if record else "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def relative_root(path: Path, holder: Path) -> str:
    """``holder`` relative to the inspected ``path`` ("." for the path itself)."""
    try:
        return str(holder.relative_to(path)) or "."
    except ValueError:
        return str(holder)


def dir_size(path: Path) -> tuple[int, int]:
    """``(files, bytes)`` under ``path`` (a store copy's log tag not counted)."""
    from .rescale_copies import TAG_FILE

    files = size = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            if n == TAG_FILE and root == str(path):
                continue  # the tag of which log the copies are from, not a copy
            try:
                size += os.stat(os.path.join(root, n)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def inspect_path(path: Path) -> dict[str, Any]:
    """``{"checkpoints": [...], "partitions": [...], "stores": [...]}`` found under ``path``.

    Each row's ``root`` is the directory holding it, relative to ``path``: the checkpoint
    or changelog root (``systems.file.path``) or the state dir (``job.state.dir``), so
    several jobs' roots under one directory can be told apart.
    """

    from .registry import SYSTEMS

    path = Path(path)
    report: dict[str, list[dict[str, Any]]] = {"checkpoints": [], "partitions": [], "stores": []}
    report.update(SYSTEMS.get("file").inspect_location("file", {"path": str(path)}))
    committed = {(c["job"], c["partition"]): c.get("version") for c in report["checkpoints"]}
    for lockdir in sorted(path.glob(f"**/{LOCKS}")):
        jobdir = lockdir.parent
        for sdir in sorted(d for d in jobdir.iterdir() if d.is_dir() and not d.name.startswith(".")):
            for pdir in sorted(d for d in sdir.iterdir() if d.is_dir() and d.name.isdigit()):
                files, size = dir_size(pdir)
                row = {"job": jobdir.name, "store": sdir.name, "partition": int(pdir.name),
                       "files": files, "bytes": size, "path": str(pdir), "root": relative_root(path, jobdir.parent)}
                row.update(_copy_status(jobdir, int(pdir.name), committed.get((jobdir.name, int(pdir.name)))))
                report["stores"].append(row)
    return report


def _copy_status(jobdir: Path, partition: int, committed: int | None) -> dict[str, Any]:
    """Whose copy a store directory is and how current: the version, executor and role
    (active or standby) its copy record names (:mod:`localstate.copies`), and, when the task's checkpoint was found
    under the same inspected path, ``current`` or ``stale`` against its version."""
    record = read_copy_record(jobdir / COPIES / f"partition-{partition}.json")
    if record is None:
        return {"copy_version": None, "left_by": None, "copy_role": None, "copy": "no record"}
    version = record.get("version")
    status = "unknown (checkpoint not under this path)"
    if isinstance(committed, int) and isinstance(version, int):
        status = "current" if version >= committed else f"stale (committed version {committed})"
    return {"copy_version": version, "left_by": record.get("executor"), "copy_role": record.get("role", "active"),
            "copy": status}


def inspect_remote(url: str, options: Sequence[str] = ()) -> dict[str, Any]:
    """What the objectstore changelog at ``url`` holds (every job's), with ``options``:
    ``KEY=VALUE`` settings of its ``systems.<name>.*``. Rows as :func:`inspect_path` gives,
    plus ``generations`` (rescaled jobs). Raises :class:`ConfigError` naming what is wrong.
    A job's own view, on any changelog system, is :func:`inspect_job`."""
    opts: dict[str, Any] = {"type": "objectstore", "path": url}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"inspect -o {item!r}: expected KEY=VALUE (e.g. config.endpoint=http://host:9000)")
        opts[key.strip()] = value.strip()
    from .registry import SYSTEMS

    return SYSTEMS.get("objectstore").inspect_location("objectstore", opts)


def inspect_job(config: Config, partitions: Sequence[int] | None = None, system: str | None = None
                ) -> dict[str, Any]:
    """What the job of ``config`` has committed, read-only, the same on every changelog
    system: its tasks' latest checkpoints, its stores' changelog partitions, its local
    store copies under ``job.state.dir`` and, once rescaled, its generation. Rows as
    :func:`inspect_path` gives (names as stored: a rescaled job's ``<job>.gen<n>``), each
    with the ``system`` it was read from; ``where`` gives each table's location.

    ``partitions``: only these tasks (all by default); ``system``: only the stores whose
    changelog is on that system (the checkpoints are read from the checkpoint system either
    way). Refuses a config whose partition count disagrees with the stored state, as
    opening a task does. Raises :class:`LocalStateError` naming the system when it cannot
    be read (an unreachable broker or bucket)."""
    from .rescale_copies import check_layout
    from .store_open import open_system

    wanted = list(range(config.partitions) if partitions is None else partitions)
    changelogs: dict[str, list[str]] = {}
    for spec in config.stores.values():
        if spec.changelog is not None and system in (None, spec.changelog[0]):
            changelogs.setdefault(spec.changelog[0], []).append(spec.changelog[1])
    report: dict[str, Any] = {section: [] for section in SECTIONS}
    where: dict[str, list[str]] = {section: [] for section in SECTIONS}
    opened: dict[str, Any] = {}
    try:
        for name in dict.fromkeys([config.checkpoint_system, *changelogs]):
            opened[name] = open_system(config, name)
            check_layout(config, opened[name])
        ckpt_system = opened[config.checkpoint_system]
        generation = ckpt_system.generation()
        where["checkpoints"].append(ckpt_system.describe())
        if generation.number:
            where["generations"].append(ckpt_system.describe())
            report["generations"].append(
                {"job": config.job_name, "generation": generation.number, "partitions": generation.partitions,
                 "previous_partitions": generation.previous_partitions,
                 "checkpoints_of": generation.job(config.job_name), "system": config.checkpoint_system})
        report["checkpoints"] = _job_checkpoints(config, ckpt_system, generation.job(config.job_name), wanted)
        for name, streams in changelogs.items():
            source = opened[name]
            where["partitions"].append(source.describe())
            for stream in streams:
                physical = source.generation().stream(stream)
                for p in wanted:
                    row = source.inspect_partition(stream, physical, p, config.partitions)
                    report["partitions"].append({**row, "system": name})
    finally:
        for opened_system in opened.values():
            opened_system.close()
    state_dir = config.state_dir
    where["stores"].append(str(state_dir))
    if state_dir.is_dir():
        stores = {spec.name for spec in config.stores.values()
                  if system is None or (spec.changelog is not None and spec.changelog[0] == system)}
        report["stores"] = [row for row in inspect_path(state_dir)["stores"]
                            if row["job"] == config.job_name and row["store"] in stores
                            and row["partition"] in wanted]
    report["where"] = {section: "; ".join(places) for section, places in where.items()}
    return report


def _job_checkpoints(config: Config, system: Any, stored_as: str, partitions: Sequence[int]
                     ) -> list[dict[str, Any]]:
    from .reader import read_checkpoint_readonly

    store = system.checkpoints()
    rows: list[dict[str, Any]] = []
    for p in partitions:
        row: dict[str, Any] = {"job": stored_as, "partition": p, "system": config.checkpoint_system}
        try:
            c = read_checkpoint_readonly(store, config.job_name, p)
        except LocalStateError as e:
            row["error"] = str(e)
        else:
            if c is None:
                row["note"] = "no checkpoint: this task has not committed yet"
            else:
                row.update(version=c.version, input_position=c.input_position, offsets=dict(c.offsets),
                           epoch=c.epoch, written_at=c.written_at)
        rows.append(row)
    return rows

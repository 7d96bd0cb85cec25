"""Read-only inspection of changelog and state directories (``localstate inspect``)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint
from .config import Config
from .copies import COPIES, read_copy_record
from .errors import ConfigError, LocalStateError
from .layout import LOCKS

SECTIONS = ("checkpoints", "partitions", "stores", "generations")
"""The tables of an inspection report, in the order they are shown."""

__all__ = ["inspect_path", "inspect_remote", "inspect_job", "lock_holder", "count_records"]


def lock_holder(lock: Path) -> str | None:
    """The pid holding ``lock`` if it is held by a live process, else None (never blocks)."""
    if not lock.exists():
        return None
    fd = os.open(lock, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_live(path: Path, attempts: int = 20) -> bytes:
    """Read a file a live task replaces by rename: a checkpoint is absent for a moment
    between its two renames (``current -> prev``, ``tmp -> current``), so retry briefly."""
    for attempt in range(attempts):
        try:
            return path.read_bytes()
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.005)
    raise AssertionError("unreachable")


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


def count_records(part: Any, start: int = 0, stop: int | None = None) -> int:
    """Records a file changelog partition holds at offsets ``[start, stop)``.

    After compaction this is far fewer than ``stop - start`` (compacted batches keep
    their offset span but only the surviving records), which is why a progress bar
    sized by offsets stalls. Reads batch headers only, decoding just the compacted
    batches, whose offsets are sparse; stops at a torn tail, past which nothing is read.
    """
    from localstate.changelog.format import FLAG_COMPACTED, decode_payload, walk

    stop = part.end_offset() if stop is None else stop
    total = 0
    for base, next_offset, seg in part.segments():
        if next_offset <= start or base >= stop:
            continue
        data = seg.read_bytes()
        for h, _pos in walk(data):
            if h is None:
                break
            if h.next_offset <= start or h.base_offset >= stop:
                continue
            if h.flags & FLAG_COMPACTED:
                _records, offsets = decode_payload(data, h, str(seg))
                total += sum(1 for o in offsets or () if start <= o < stop)
            else:
                total += min(h.next_offset, stop) - max(h.base_offset, start)
    return total


def _root(path: Path, holder: Path) -> str:
    """``holder`` relative to the inspected ``path`` ("." for the path itself)."""
    try:
        return str(holder.relative_to(path)) or "."
    except ValueError:
        return str(holder)


def inspect_path(path: Path) -> dict[str, Any]:
    """``{"checkpoints": [...], "partitions": [...], "stores": [...]}`` found under ``path``.

    Each row's ``root`` is the directory holding it, relative to ``path``: the checkpoint
    or changelog root (``systems.file.path``) or the state dir (``job.state.dir``), so
    several jobs' roots under one directory can be told apart.
    """

    report: dict[str, list[dict[str, Any]]] = {"checkpoints": [], "partitions": [], "stores": []}
    path = Path(path)
    for ck in sorted(path.glob("**/_checkpoints/*/partition-*.ckpt")):
        row: dict[str, Any] = {"job": ck.parent.name, "partition": int(ck.stem.split("-")[1]), "path": str(ck),
                               "root": _root(path, ck.parents[2])}
        try:
            c = Checkpoint.from_bytes(_read_live(ck), where=str(ck))
            row.update(version=c.version, input_position=c.input_position, offsets=dict(c.offsets),
                       epoch=c.epoch, written_at=c.written_at)
        except LocalStateError as e:
            row["error"] = str(e)
        except FileNotFoundError:
            continue  # removed since the glob (a store wiped by its task): nothing to report
        report["checkpoints"].append(row)
    for meta in sorted(path.glob("**/stream.json")):
        sdir = meta.parent
        for pdir in sorted((d for d in sdir.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name)):
            row = _file_partition_row(pdir, _root(path, sdir.parent))
            report["partitions"].append(row)
    committed = {(c["job"], c["partition"]): c.get("version") for c in report["checkpoints"]}
    for lockdir in sorted(path.glob(f"**/{LOCKS}")):
        jobdir = lockdir.parent
        for sdir in sorted(d for d in jobdir.iterdir() if d.is_dir() and not d.name.startswith(".")):
            for pdir in sorted(d for d in sdir.iterdir() if d.is_dir() and d.name.isdigit()):
                files, size = dir_size(pdir)
                row = {"job": jobdir.name, "store": sdir.name, "partition": int(pdir.name),
                       "files": files, "bytes": size, "path": str(pdir), "root": _root(path, jobdir.parent)}
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
    from localstate.changelog.objectstore.inspect import inspect_objectstore

    return inspect_objectstore("objectstore", opts)


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
    from localstate.changelog.file import FileChangelogSystem

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
                    if isinstance(source, FileChangelogSystem):  # as `inspect DIR` shows it: segments, writer pid
                        row = _file_partition_row(source.partition_dir(physical, p), str(source.root))
                    else:
                        row = _partition_row(source, stream, physical, p, config.partitions)
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


def _file_partition_row(pdir: Path, root: str) -> dict[str, Any]:
    """One file changelog partition: segments, end offset, the records it holds (after
    compaction fewer than the offsets), bytes, horizon, and the pid of a live writer."""
    from localstate.changelog.file import FileChangelogPartition

    row: dict[str, Any] = {"stream": pdir.parent.name, "partition": int(pdir.name), "path": str(pdir),
                           "root": root, "locked_by": lock_holder(pdir / ".lock")}
    if not pdir.is_dir():
        return {**row, **_NOTHING}
    try:
        part = FileChangelogPartition(pdir, readonly=True)
        try:
            row.update(segments=len(part.segments()), end_offset=part.end_offset(), records=count_records(part),
                       bytes=part.size_bytes(), tombstone_horizon=part.min_valid_snapshot_offset(),
                       shipped_snapshots=part.shipped_snapshots())
        finally:
            part.close()
    except LocalStateError as e:
        row.update(segments="?", end_offset="?", records="?", bytes=0, tombstone_horizon="?", error=str(e))
    return row


_NOTHING = {"segments": 0, "end_offset": 0, "records": 0, "bytes": 0, "tombstone_horizon": 0,
            "note": "nothing written yet"}
"""A job's changelog partition that does not exist yet (its task never wrote)."""


def _partition_row(system: Any, stream: str, physical: str, p: int, partitions: int) -> dict[str, Any]:
    """One changelog partition read through the :class:`ChangelogSystem` interface (any
    system): end offset, and the records and bytes read back up to it."""
    row: dict[str, Any] = {"stream": physical, "partition": p, "root": system.describe(), "locked_by": None}
    if not system.stream_exists(stream):  # a system where reading a stream would create it
        return {**row, **_NOTHING}
    try:
        part = system.open_partition(stream, p, partitions, readonly=True)
        try:
            end = part.end_offset()
            records = nbytes = 0
            for batch, size in part.read_batches(0, end):
                records += len(batch)
                nbytes += size
            row.update(segments="", end_offset=end, records=records, bytes=nbytes, path=part.describe(),
                       tombstone_horizon=part.min_valid_snapshot_offset(), shipped_snapshots=part.shipped_snapshots())
        finally:
            part.close()
    except LocalStateError as e:
        row.update(segments="?", end_offset="?", records="?", bytes=0, tombstone_horizon="?", error=str(e))
    return row

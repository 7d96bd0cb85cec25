"""Read-only inspection of changelog and state directories (``localstate inspect``)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint
from .copies import COPIES, read_copy_record
from .errors import ConfigError, LocalStateError
from .layout import LOCKS

__all__ = ["inspect_path", "inspect_remote", "lock_holder", "count_records"]


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


def _dir_size(path: Path) -> tuple[int, int]:
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
    from localstate.changelog.file import FileChangelogPartition

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
            row = {"stream": sdir.name, "partition": int(pdir.name), "path": str(pdir),
                   "root": _root(path, sdir.parent), "locked_by": lock_holder(pdir / ".lock")}
            try:
                part = FileChangelogPartition(pdir, readonly=True)
                try:
                    segs = part.segments()
                    records = count_records(part)
                    row.update(segments=len(segs), end_offset=part.end_offset(), records=records,
                               bytes=part.size_bytes(), tombstone_horizon=part.min_valid_snapshot_offset())
                finally:
                    part.close()
            except LocalStateError as e:
                row.update(segments="?", end_offset="?", records="?", bytes=0, tombstone_horizon="?", error=str(e))
            report["partitions"].append(row)
    committed = {(c["job"], c["partition"]): c.get("version") for c in report["checkpoints"]}
    for lockdir in sorted(path.glob(f"**/{LOCKS}")):
        jobdir = lockdir.parent
        for sdir in sorted(d for d in jobdir.iterdir() if d.is_dir() and not d.name.startswith(".")):
            for pdir in sorted(d for d in sdir.iterdir() if d.is_dir() and d.name.isdigit()):
                files, size = _dir_size(pdir)
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


def inspect_remote(url: str | None, config_path: str | None = None, system: str | None = None,
                   options: Sequence[str] = ()) -> dict[str, Any]:
    """What objectstore changelogs hold: the one at ``url`` (with ``options``, ``KEY=VALUE``
    settings of its ``systems.<name>.*``), or every objectstore system of the job config
    at ``config_path`` (only ``system`` if given). Rows as :func:`inspect_path` gives,
    plus ``generations`` (rescaled jobs). Raises :class:`ConfigError` naming what is wrong."""
    from .config import Config

    targets: list[tuple[str, dict[str, Any]]] = []
    if config_path is not None:
        if url is not None:
            raise ConfigError(f"inspect: give an object-store URL ({url}) or -c {config_path}, not both")
        config = Config.load(config_path)
        for name, opts in sorted(config.systems.items()):
            if str(opts.get("type", name)) == "objectstore" and system in (None, name):
                targets.append((name, dict(opts)))
        if not targets:
            raise ConfigError(f"{config_path} has no objectstore system"
                              + (f" named {system!r}" if system else "") + " to inspect")
        from .rescale_copies import check_layout
        from .store_open import open_system

        for name, _ in targets:
            opened = open_system(config, name)
            try:
                check_layout(config, opened)
            finally:
                opened.close()
    else:
        assert url is not None
        opts: dict[str, Any] = {"type": "objectstore", "path": url}
        for item in options:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"inspect -o {item!r}: expected KEY=VALUE (e.g. config.endpoint=http://host:9000)")
            opts[key.strip()] = value.strip()
        targets.append(("objectstore", opts))
    from localstate.changelog.objectstore_inspect import inspect_objectstore

    report: dict[str, list[dict[str, Any]]] = {"checkpoints": [], "partitions": [], "stores": [], "generations": []}
    for name, opts in targets:
        for section, rows in inspect_objectstore(name, opts).items():
            report[section].extend(rows)
    return report

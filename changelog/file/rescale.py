"""How the file changelog rescales a stopped job: a staging area, a manifest and a swap.

The new job is written under ``<systems.file.path>/_rescale/<job>/new``; ``manifest.json``
beside it is the commit point; the swap renames each stream directory and the job's
checkpoint directory aside and the new ones into place (checkpoints last) and is
idempotent, so a re-run after a crash finishes it. Before the manifest nothing of the old
job changes. What is refused and where each record goes is :mod:`localstate.rescale`'s.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localstate.checkpoint import Checkpoint
from localstate.engine import ChangeRecord
from localstate.errors import ChangelogError, CorruptionError, InvalidValueError, LocalStateError
from localstate.faults import fault_point
from localstate.locking import FileLock, atomic_write, fsync_dir
from localstate.rescale_job import (
    RescaleJob,
    RescalePlan,
    RescaleStrategy,
    carried_event_time,
    drop_local_copies,
    streams,
)
from localstate.store_open import store_meta

from .checkpoints import FileCheckpointStore

if TYPE_CHECKING:
    from localstate.rescale import RescaleResult

__all__ = ["FileRescale"]

log = logging.getLogger("localstate.rescale")

_WRITE_CHUNK = 10_000


def _root(job: RescaleJob) -> Path:
    return Path(job.system.root)


def _staging(job: RescaleJob) -> Path:
    return _root(job) / "_rescale" / job.config.job_name


def _checkpoint_dir(job: RescaleJob) -> Path:
    return _root(job) / "_checkpoints" / job.config.job_name


class FileRescale(RescaleStrategy):
    """Stage the new job beside the old one, commit it with a manifest, swap directories."""

    def locks(self, job: RescaleJob) -> list[FileLock]:
        """Every old changelog partition's lock (a running writer holds it)."""
        held: list[FileLock] = []
        try:
            for stream in streams(job):
                for p in range(job.old):
                    d = _root(job) / stream / str(p)
                    if d.is_dir():
                        held.append(FileLock(d / ".lock", f"changelog partition {d}"))
        except BaseException:
            for lock in held:
                lock.release()
            raise
        return held

    def run(self, job: RescaleJob, plan: RescalePlan) -> RescaleResult:
        config = job.config
        staging = _staging(job)
        manifest = _pending(job)
        if manifest is not None:
            if manifest["to"] != job.new or manifest["from"] not in (job.old, job.new):
                raise LocalStateError(
                    f"job {config.job_name!r}: an earlier rescale from {manifest['from']} to {manifest['to']} "
                    f"partitions was committed but not finished ({staging}); finish it first with --to {manifest['to']}"
                )
            if _manifest_still_valid(job, manifest):
                log.warning("job %r: finishing the rescale to %d partitions that a crash interrupted",
                            config.job_name, job.new)
                _swap(job, manifest)
                return plan.done(manifest["version"], dict(manifest["records"]), manifest["from"])
            log.warning("job %r committed again after an unfinished rescale was staged: restaging", config.job_name)
            shutil.rmtree(staging)
        counts = {s: _stream_count(job, s) for s in streams(job)}
        if counts and all(c == job.new for c in counts.values()) and job.old != job.new:
            return plan.already_done(job.system.checkpoints().read(config.job_name, 0))
        if job.old == job.new:
            raise InvalidValueError(f"job {config.job_name!r} already has {job.new} partitions: nothing to rescale")
        for stream, count in counts.items():
            if count is not None and count != job.old:
                raise ChangelogError(
                    f"changelog stream {stream!r} at {_root(job) / stream} has {count} partitions but the job has "
                    f"job.partitions = {job.old}: rescale from the count the state is at. Nothing was changed."
                )
        ckpts, version, position = plan.prepare()
        if staging.exists():
            shutil.rmtree(staging)
        try:
            ends, records = plan.stage(ckpts)(None)
            _write_staging(job, ends, records, version, position, ckpts)
        except Exception:
            # A refusal found while staging (a later store's keys): the old job was never
            # touched; remove what was staged so a refusal changes nothing on disk.
            if not (staging / "manifest.json").exists():
                shutil.rmtree(staging, ignore_errors=True)
                try:
                    staging.parent.rmdir()
                except OSError:
                    pass
            raise
        manifest = _pending(job)
        assert manifest is not None
        _swap(job, manifest)
        return plan.done(version, records)

    def write_partition(self, job: RescaleJob, target: Any, name: str, q: int, records: Mapping[bytes, bytes]) -> int:
        """Write new task ``q``'s records of store ``name`` (sorted by key) into the staging
        area; returns the partition's end offset (its committed offset)."""
        d = _staging(job) / "new" / job.stores[name].changelog[1] / str(q)  # type: ignore[index]
        if d.exists():
            shutil.rmtree(d)  # a failed attempt of the same Spark task
        end = _write_partition(job, d, sorted(records.items()))
        fault_point("rescale.staging")
        return end


def _stream_count(job: RescaleJob, stream: str) -> int | None:
    """The partition count ``stream.json`` records for ``stream`` (None: no such stream)."""
    meta = _root(job) / stream / "stream.json"
    try:
        return int(json.loads(meta.read_text())["partitions"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{meta} is corrupt ({e}); nothing was changed") from e


def _write_partition(job: RescaleJob, directory: Path, records: Iterable[ChangeRecord]) -> int:
    from .partition import FileChangelogPartition

    part = FileChangelogPartition(directory, segment_bytes=job.system.segment_bytes, fsync=job.system.fsync)
    try:
        records = iter(records)
        while chunk := list(islice(records, _WRITE_CHUNK)):
            part.append(chunk)
        end = part.flush()
        # a new partition directory: the log gets a new identity, so a local copy of the
        # old task with this number that rescale cannot reach is rebuilt, never loaded
    finally:
        part.close()
    return end


def _write_staging(job: RescaleJob, ends: Mapping[str, list[int]], counts: Mapping[str, int], version: int,
                   position: Any, ckpts: Mapping[int, Checkpoint]) -> None:
    """Complete the new job under ``staging/new`` (whose changelog partitions are
    written): stream counts, checkpoints, and the manifest last — the commit point."""
    staging = _staging(job)
    new = staging / "new"
    streams = sorted({job.stores[n].changelog[1] for n in ends})  # type: ignore[index]
    for stream in streams:
        sdir = new / stream
        atomic_write(sdir / "stream.json", json.dumps({"partitions": job.new}).encode())
        fsync_dir(sdir)
    meta = {name: store_meta(spec) for name, spec in job.stores.items()}
    epoch = max(c.epoch for c in ckpts.values()) + 1
    store = FileCheckpointStore(new / "_checkpoints")
    for q in range(job.new):
        offsets = {name: per_task[q] for name, per_task in ends.items()}
        store.write(job.config.job_name, q, Checkpoint(version=version, input_position=position, offsets=offsets,
                                                       epoch=epoch, stores=meta, event_time=carried_event_time(ckpts)))
    fsync_dir(new)
    fault_point("rescale.before_manifest")
    manifest = {
        "job": job.config.job_name,
        "from": job.old,
        "to": job.new,
        "streams": streams,
        "old_checkpoints": {str(p): [c.version, c.epoch, c.written_at] for p, c in ckpts.items()},
        "records": dict(counts),
        "version": version,
    }
    atomic_write(staging / "manifest.json", json.dumps(manifest, sort_keys=True).encode())
    fault_point("rescale.after_manifest")


def _swap(job: RescaleJob, manifest: Mapping[str, Any]) -> None:
    """Rename every new stream and the new checkpoints into place (idempotent: a re-run
    after a crash continues where it stopped). Checkpoints go last."""
    staging = _staging(job)
    pairs = [(_root(job) / s, staging / "new" / s, staging / "old" / s) for s in manifest["streams"]]
    pairs.append((_checkpoint_dir(job), staging / "new" / "_checkpoints" / job.config.job_name,
                  staging / "old" / "_checkpoints"))
    (staging / "old").mkdir(exist_ok=True)
    for live, new, aside in pairs:
        if not new.exists():
            continue  # already swapped
        if live.exists():
            os.replace(live, aside)
        fault_point("rescale.swap")
        live.parent.mkdir(parents=True, exist_ok=True)
        os.replace(new, live)
        fsync_dir(live.parent)
    fault_point("rescale.after_swap")
    drop_local_copies(job.config)
    shutil.rmtree(staging)
    try:
        staging.parent.rmdir()  # only when no other job's rescale is pending there
    except OSError:
        pass
    fsync_dir(_root(job))


def _pending(job: RescaleJob) -> dict[str, Any] | None:
    """A committed but unfinished rescale's manifest, or None (an unfinished staging area
    without a manifest is discarded: the old job is untouched)."""
    staging = _staging(job)
    if not staging.exists():
        return None
    try:
        manifest = json.loads((staging / "manifest.json").read_bytes())
    except FileNotFoundError:
        log.warning("discarding an unfinished rescale of job %r at %s (it crashed before its manifest; the "
                    "old job was never changed)", job.config.job_name, staging)
        shutil.rmtree(staging)
        return None
    except (OSError, ValueError) as e:
        raise CorruptionError(f"{staging / 'manifest.json'} is unreadable ({e}); the old job is in its place "
                              f"until the swap starts: inspect {staging}") from e
    return manifest


def _manifest_still_valid(job: RescaleJob, manifest: Mapping[str, Any]) -> bool:
    """False when the old job committed again after the manifest (it ran before the swap
    began): the staged state is stale and must be rebuilt."""
    if not (_staging(job) / "new" / "_checkpoints" / job.config.job_name).exists():
        return True  # checkpoints swapped: the swap is past the point of no return
    if any((_staging(job) / "old" / s).exists() for s in manifest["streams"]):
        return True  # the swap began: the old job can no longer run (stream counts differ)
    store = job.system.checkpoints()
    for p, (version, epoch, written_at) in manifest["old_checkpoints"].items():
        c = store.read(job.config.job_name, int(p))
        if c is None or [c.version, c.epoch, c.written_at] != [version, epoch, written_at]:
            return False
    return True

"""Where ``localstate rescale`` writes: the staging area, the manifest and the swap.

The file half of :mod:`localstate.rescale` (which decides what goes where). The new job
is written under ``<systems.file.path>/_rescale/<job>/new``; ``manifest.json`` beside it
is the commit point; the swap renames each stream directory and the job's checkpoint
directory aside and the new ones into place (checkpoints last) and is idempotent, so a
re-run after a crash finishes it. Before the manifest nothing of the old job changes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint
from .config import Config
from .engine import ChangeRecord, StoreSpec
from .errors import CorruptionError
from .faults import fault_point
from .store_open import store_meta

__all__ = [
    "JobFiles",
    "drop_local_copies",
    "manifest_still_valid",
    "pending",
    "stream_count",
    "streams",
    "swap",
    "write_new_partition",
    "write_staging",
]

log = logging.getLogger("localstate.rescale")

_WRITE_CHUNK = 10_000


@dataclass
class JobFiles:
    """A stopped job being rescaled from ``old`` to ``new`` tasks, and where its files are."""

    config: Config
    old: int
    new: int
    system: Any
    root: Path | None
    """The file changelog's directory; None for a changelog rescaled by generations."""
    stores: dict[str, StoreSpec]
    """Every store of the job (each has a changelog: rescale refuses unlogged stores)."""

    @property
    def files(self) -> Path:
        assert self.root is not None, "a file changelog step on a changelog rescaled by generations"
        return self.root

    @property
    def staging(self) -> Path:
        return self.files / "_rescale" / self.config.job_name

    def checkpoint_dir(self) -> Path:
        return self.files / "_checkpoints" / self.config.job_name


def stream_count(job: JobFiles, stream: str) -> int | None:
    """The partition count ``stream.json`` records for ``stream`` (None: no such stream)."""
    meta = job.files / stream / "stream.json"
    try:
        return int(json.loads(meta.read_text())["partitions"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptionError(f"{meta} is corrupt ({e}); nothing was changed") from e


def streams(job: JobFiles) -> list[str]:
    """The changelog streams of the job's stores."""
    return sorted({s.changelog[1] for s in job.stores.values()})  # type: ignore[index]


def _write_partition(job: JobFiles, directory: Path, records: Iterable[ChangeRecord]) -> int:
    from localstate.changelog.file import FileChangelogPartition

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


def write_new_partition(job: JobFiles, name: str, q: int, records: Mapping[bytes, bytes]) -> int:
    """Write new task ``q``'s records of store ``name`` (sorted by key) into the staging
    area; returns the partition's end offset (its committed offset)."""
    sdir = job.staging / "new" / job.stores[name].changelog[1]  # type: ignore[index]
    d = sdir / str(q)
    if d.exists():
        shutil.rmtree(d)  # a failed attempt of the same Spark task
    end = _write_partition(job, d, sorted(records.items()))
    fault_point("rescale.staging")
    return end


def carried_event_time(ckpts: Mapping[int, Checkpoint]) -> int | None:
    """The new tasks' event-time clock: the latest of the old tasks' clocks. A key's new
    task then never runs behind the task that held it, so an entry that had expired there
    (event-time TTL) stays expired and a timer that had fired does not wait again; entries
    of a task whose clock was behind may expire up to that skew earlier."""
    times = [c.event_time for c in ckpts.values() if c.event_time is not None]
    return max(times) if times else None


def write_staging(job: JobFiles, ends: Mapping[str, list[int]], counts: Mapping[str, int], version: int,
                   position: Any, ckpts: Mapping[int, Checkpoint]) -> None:
    """Complete the new job under ``staging/new`` (whose changelog partitions are
    written): stream counts, checkpoints, and the manifest last — the commit point."""
    from localstate.changelog.file.checkpoints import FileCheckpointStore
    from localstate.locking import atomic_write, fsync_dir

    staging = job.staging
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


def swap(job: JobFiles, manifest: Mapping[str, Any]) -> None:
    """Rename every new stream and the new checkpoints into place (idempotent: a re-run
    after a crash continues where it stopped). Checkpoints go last."""
    from localstate.locking import fsync_dir

    staging = job.staging
    pairs = [(job.files / s, staging / "new" / s, staging / "old" / s) for s in manifest["streams"]]
    pairs.append((job.checkpoint_dir(), staging / "new" / "_checkpoints" / job.config.job_name,
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
    fsync_dir(job.files)


def drop_local_copies(config: Config) -> None:
    """Delete every reachable local copy of the job's stores (all partitions): they hold
    the old tasks' keys. With ``{executor}`` in ``job.state.dir`` every executor's
    directory on this file system is found by pattern."""
    state_dir = str(config.state_dir)
    if "{executor}" in state_dir:
        parent = Path(state_dir.split("{executor}")[0]).parent
        pattern = state_dir.replace("{executor}", "*")
        roots = [p for p in parent.glob(str(Path(pattern).relative_to(parent)))] if parent.exists() else []
    else:
        roots = [config.state_dir]
    for root in roots:
        for name in config.stores:
            d = root / config.job_name / name
            if d.exists():
                shutil.rmtree(d)


def pending(job: JobFiles) -> dict[str, Any] | None:
    """A committed but unfinished rescale's manifest, or None (an unfinished staging area
    without a manifest is discarded: the old job is untouched)."""
    staging = job.staging
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


def manifest_still_valid(job: JobFiles, manifest: Mapping[str, Any]) -> bool:
    """False when the old job committed again after the manifest (it ran before the swap
    began): the staged state is stale and must be rebuilt."""
    if not (job.staging / "new" / "_checkpoints" / job.config.job_name).exists():
        return True  # checkpoints swapped: the swap is past the point of no return
    if any((job.staging / "old" / s).exists() for s in manifest["streams"]):
        return True  # the swap began: the old job can no longer run (stream counts differ)
    store = job.system.checkpoints()
    for p, (version, epoch, written_at) in manifest["old_checkpoints"].items():
        c = store.read(job.config.job_name, int(p))
        if c is None or [c.version, c.epoch, c.written_at] != [version, epoch, written_at]:
            return False
    return True

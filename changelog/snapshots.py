"""RocksDB-style local snapshots kept in shared storage beside a changelog partition.

Used by every changelog system: the object store keeps them under the partition's
prefix, the file changelog in the partition's directory (a ``file://`` store), Kafka in
the store its ``snapshots.path`` names. They make a task's first open on another
machine (a move, a lost executor) replay only the records since the newest shipped
snapshot instead of the partition's whole history.

**When a snapshot is shipped** (:meth:`RemoteSnapshots.ship`, after a commit's
checkpoint): whenever the engine took a local snapshot at the committed offset (RocksDB
takes one every ``snapshot.interval.records`` records), so a move replays about that
many records at most; and, when ``every`` is set, every ``every`` commits (the engine
takes the snapshot it deferred). Each immutable file is shipped once and shared by later
snapshots; on a local filesystem it is hard-linked, not copied, when it can be.

**Fetching** is incremental: a file the machine already holds in one of the engine's
local snapshots (same name, size and CRC32) is linked from there, not downloaded.

Layout under the partition's prefix::

    sst/<epoch:010d>-<file>                 immutable snapshot files (SST, blob), shared
    snapshots/<offset:020d>-<epoch:010d>.json   a snapshot at a committed offset: its
                                            files' keys, sizes and CRC32s; the small
                                            metadata files (MANIFEST, CURRENT, OPTIONS) inline

Works with an engine that has ``snapshots() -> [(offset, directory)]`` and
``snapshot_path(offset)``. Snapshots are an optimization: a damaged or missing one is
skipped with a warning naming its key, and the changelog replay covers the difference.
A snapshot is shipped only after the checkpoint of its offset is written, so it is of
committed records; a shipped snapshot past a task's committed offset (its checkpoint
went back) is deleted with the uncommitted tail and never fetched.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localstate.errors import ChangelogError, ConfigError, CorruptionError
from localstate.faults import fault_point

from .directory_store import DirectoryStore, first_line

if TYPE_CHECKING:
    from .objectstore.client import ObjectStoreClient

__all__ = ["RemoteSnapshots", "has_snapshots"]

log = logging.getLogger("localstate.changelog.objectstore")

_MANIFEST_NAME = re.compile(r"^(\d{20})-(\d{10})\.json$")
_SHARED_SUFFIXES = (".sst", ".blob")  # immutable snapshot files: uploaded once, shared
_DOWNLOADS = 8  # files fetched at once


def instance_epoch() -> int:
    """For systems without writer epochs (file, Kafka): this process's start in ms, the
    tie-break in shipped snapshot names that keeps two instances' files of one name
    (RocksDB numbers its files per database) under different keys."""
    return _STARTED_MS % 10**10


_STARTED_MS = time.time_ns() // 1_000_000


def snapshot_store(raw: Mapping[str, str], prefix: str, *, connect: bool = True) -> tuple[Any, int]:
    """The store and ``every`` of a ``<prefix>.*`` group naming where snapshots are shipped
    (the Kafka changelog's ``snapshots.*``): ``path`` (``file:///shared/dir`` or any
    object-store URL: ``s3://bucket/prefix``, ``gs://``, ``az://``, ``webhdfs://``),
    ``every`` (commits; 0: when the engine takes a snapshot) and, for an object store,
    ``config.*`` / ``client.*`` as the objectstore changelog takes them. ``connect=False``
    only checks the keys (:class:`ConfigError` naming the key)."""
    rest = dict(raw)
    url = str(rest.pop("path", "")).strip()
    every_raw = rest.pop("every", "0")
    try:
        every = int(str(every_raw))
    except ValueError:
        every = -1
    if every < 0:
        raise ConfigError(f"{prefix}.every = {every_raw!r}: must be a whole number of commits >= 0")
    if "://" not in url:
        raise ConfigError(f"{prefix}.path = {url!r}: where engine snapshots are shipped, a URL such as "
                          "file:///shared/dir or s3://bucket/prefix")
    if url.startswith("file://"):
        root = url[len("file://"):]
        if not root.startswith("/"):
            raise ConfigError(f"{prefix}.path = {url!r}: a file:// URL needs an absolute path (file:///dir)")
        if rest:
            raise ConfigError(f"{prefix}: {', '.join(sorted(rest))}: not used with a file:// path")
        return (DirectoryStore(Path(root)) if connect else None), every
    try:
        from localstate.options import parse_options

        from .objectstore.client import ObjectStoreSettings
        from .objectstore.client import connect as connect_store
    except ImportError as e:
        raise ConfigError(f"{prefix}.path = {url!r}: {e}") from e
    settings = parse_options(ObjectStoreSettings, {"path": url, **rest}, prefix, ("config", "client"))
    return (connect_store(settings, prefix) if connect else None), every


def has_snapshots(engine: Any) -> bool:
    """Whether ``engine`` keeps local snapshots that can be shipped and fetched."""
    return hasattr(engine, "snapshots") and hasattr(engine, "snapshot_path")


def _link_held(held: Any, meta: dict[str, Any], target: Path) -> bool:
    """Put a local file equal to the shipped one ``meta`` (size and CRC32) at ``target``
    (a hard link: snapshot files are immutable); False if none of ``held`` is."""
    for path in held:
        try:
            if path.stat().st_size != meta["size"] or zlib.crc32(path.read_bytes()) != meta["crc32"]:
                continue
            os.link(path, target)
        except OSError:
            continue
        return True
    return False


class RemoteSnapshots:
    """The shipped snapshots of one changelog partition (``prefix`` in ``store``)."""

    def __init__(self, store: ObjectStoreClient | DirectoryStore, prefix: str, describe: str, every: int = 0) -> None:
        self.store = store
        self.prefix = prefix
        self.describe = describe
        self.every = every
        self._remote_files: dict[str, dict[str, Any]] = {}  # local file name -> {key, size, crc32}
        self._commits_since = 0
        self._shipped = -1  # offset of the newest snapshot this instance shipped or fetched
        self.fetched_files = self.linked_files = 0  # of the last fetch: downloaded, found here

    def ship(self, engine: Any, offset: int, epoch: int, fenced: Callable[[], str | None] | None = None) -> bool:
        """After the commit at ``offset`` (its checkpoint is written): ship the engine's
        snapshot at ``offset`` when it took one there, or when ``every`` commits passed
        since the last one. ``fenced`` returns why this writer must not ship (a newer
        instance took over), checked before anything is written. True if shipped."""
        if not has_snapshots(engine):
            return False
        self._commits_since += 1
        took_one = offset > self._shipped and any(o == offset for o, _ in engine.snapshots())
        if not took_one and not (self.every and self._commits_since >= self.every):
            return False
        why = fenced() if fenced is not None else None
        if why is not None:  # its clean-up would delete manifests and files the new owner may use
            log.warning("%s: snapshot not shipped: a newer instance of the task took over (%s)", self.describe, why)
            return False
        if not self.upload(engine, offset, epoch):
            return False
        self._commits_since = 0
        self._shipped = offset
        return True

    def _manifests(self) -> list[tuple[tuple[int, int], str]]:
        """``((offset, epoch), name)`` of the snapshot manifests, oldest first."""
        out = []
        for name, _ in self.store.list(f"{self.prefix}/snapshots"):
            m = _MANIFEST_NAME.match(name)
            if m is not None:
                out.append(((int(m.group(1)), int(m.group(2))), name))
        return sorted(out)

    def offsets(self) -> list[int]:
        """The offsets of the shipped snapshots (their manifests), oldest first."""
        return sorted({key[0] for key, _ in self._manifests()})

    def upload(self, engine: Any, offset: int, epoch: int) -> bool:
        """Upload the engine's snapshot at ``offset`` (each shared file once, by writer
        ``epoch``); False if the engine has no snapshot there."""
        ensure = getattr(engine, "ensure_snapshot", None)
        if ensure is not None:
            ensure(offset)  # an engine that defers snapshots between commits takes it now
        local = dict(engine.snapshots())
        if offset not in local:
            return False
        directory: Path = local[offset]
        if not self._remote_files:
            self._learn_remote_files(directory)
        files: dict[str, dict[str, Any]] = {}
        inline: dict[str, str] = {}
        for f in sorted(directory.iterdir()):
            if f.suffix not in _SHARED_SUFFIXES:
                inline[f.name] = base64.b64encode(f.read_bytes()).decode()
                continue
            known = self._remote_files.get(f.name)
            if known is None or known["size"] != f.stat().st_size:
                key = f"{self.prefix}/sst/{epoch:010d}-{f.name}"
                size, crc = self.store.put_file(key, f)
                known = {"key": key, "size": size, "crc32": crc}
                self._remote_files[f.name] = known
            files[f.name] = known
        fault_point("snapshot.ship.before_manifest")
        manifest = {"format": 1, "offset": offset, "epoch": epoch, "files": files, "inline": inline}
        name = f"{offset:020d}-{epoch:010d}.json"
        self.store.put(f"{self.prefix}/snapshots/{name}", json.dumps(manifest).encode())
        self._drop_old_snapshots(keep=name, epoch=epoch)
        return True

    def _learn_remote_files(self, directory: Path) -> None:
        """Reuse the files the newest remote snapshot already holds (same name, size and
        CRC32 as the local file), so a restarted task does not upload them again."""
        manifests = self._manifests()
        if not manifests:
            return
        manifest = self._read_manifest(manifests[-1][1])
        for fname, meta in (manifest or {}).get("files", {}).items():
            local = directory / fname
            if local.is_file() and local.stat().st_size == meta["size"] and zlib.crc32(local.read_bytes()) == meta["crc32"]:
                self._remote_files[fname] = meta

    def _read_manifest(self, name: str) -> dict[str, Any] | None:
        key = f"{self.prefix}/snapshots/{name}"
        try:
            manifest = json.loads(self.store.get(key))
            if manifest.get("format") != 1 or not isinstance(manifest.get("files"), dict):
                raise ValueError("not a snapshot manifest")
            return manifest
        except (*self.store.missing, ValueError, ChangelogError) as e:
            log.warning("snapshot manifest %s is unusable (%s); it is skipped", self.store.where(key), e)
            return None

    def _drop_old_snapshots(self, keep: str, epoch: int) -> None:
        """Keep the two newest manifests; delete older ones, the files only they use, and
        files of older writers that no manifest uses (an upload killed before its manifest).
        A file of this writer or a newer one is never taken for such a leftover: it may
        belong to a snapshot whose manifest is still to come."""
        manifests = [n for _, n in self._manifests()]
        if keep not in manifests:
            return
        kept, dropped = manifests[-2:], manifests[:-2]
        in_use = set()
        for name in kept:
            in_use |= {m["key"] for m in (self._read_manifest(name) or {"files": {}})["files"].values()}
        garbage = set()
        for name in dropped:
            garbage |= {m["key"] for m in (self._read_manifest(name) or {"files": {}})["files"].values()}
        for fname, _ in self.store.list(f"{self.prefix}/sst"):
            writer = fname.split("-", 1)[0]
            if writer.isdigit() and int(writer) < epoch:
                garbage.add(f"{self.prefix}/sst/{fname}")
        if not dropped and not garbage - in_use:
            return
        try:
            self.store.delete([f"{self.prefix}/snapshots/{n}" for n in dropped])
            self.store.delete(sorted(garbage - in_use))
        except ChangelogError as e:
            log.warning("%s: old snapshots not deleted (%s)", self.describe, e)

    def fetch(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Before a restore: fetch the newest shipped snapshot at ``min_valid <= L <=
        committed`` that is newer than every local one into ``engine.snapshot_path(L)``;
        returns ``L``, or None if none was needed or usable (the replay covers it). Files
        the engine's local snapshots already hold are linked from there."""
        if not has_snapshots(engine):
            return None
        local = engine.snapshots()
        local_best = max((o for o, _ in local if min_valid <= o <= committed), default=-1)
        parent = Path(engine.snapshot_path(0)).parent
        for leftover in parent.glob(".fetch-*") if parent.is_dir() else ():
            shutil.rmtree(leftover, ignore_errors=True)  # a download a crash interrupted
        candidates = [(key, n) for key, n in self._manifests() if local_best < key[0] <= committed and key[0] >= min_valid]
        held: dict[str, list[Path]] = {}
        for _, directory in local:
            for f in directory.iterdir():
                if f.suffix in _SHARED_SUFFIXES:
                    held.setdefault(f.name, []).append(f)
        for (offset, _epoch), name in reversed(candidates):
            manifest = self._read_manifest(name)
            if manifest is None or manifest.get("offset") != offset:
                continue
            target: Path = engine.snapshot_path(offset)
            tmp = target.with_name(f".fetch-{target.name}")
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                items = list(manifest["files"].items())
                missing = [(f, m) for f, m in items if not _link_held(held.get(f, ()), m, tmp / f)]
                with ThreadPoolExecutor(max_workers=_DOWNLOADS) as pool:
                    for (fname, meta), data in zip(missing, pool.map(lambda it: self.store.get(it[1]["key"]), missing)):
                        if len(data) != meta["size"] or zlib.crc32(data) != meta["crc32"]:
                            raise CorruptionError(f"{self.store.where(meta['key'])} does not match its size/CRC32 "
                                                  f"in snapshot manifest {name}")
                        (tmp / fname).write_bytes(data)
                for fname, b64 in manifest.get("inline", {}).items():
                    (tmp / fname).write_bytes(base64.b64decode(b64))
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
            except (CorruptionError, ChangelogError, *self.store.missing, ValueError, KeyError, OSError) as e:
                shutil.rmtree(tmp, ignore_errors=True)
                log.warning("%s: snapshot %s cannot be used (%s); trying an older one or replaying the changelog",
                            self.describe, name, first_line(e))
                continue
            self._remote_files = {f: dict(m) for f, m in manifest["files"].items()}
            self._shipped = offset
            self.fetched_files, self.linked_files = len(missing), len(items) - len(missing)
            log.info("%s: fetched the snapshot at offset %d (%d files downloaded, %d already here)",
                     self.describe, offset, len(missing), len(items) - len(missing))
            return offset
        return None

    def delete_past(self, offset: int) -> None:
        """Delete the manifests of snapshots past ``offset`` (records about to be discarded:
        such a snapshot must never be used); ``-1``: all of them."""
        self.store.delete([f"{self.prefix}/snapshots/{n}" for (off, _), n in self._manifests() if off > offset])

"""RocksDB-style local snapshots kept in the object store beside a changelog partition.

Layout under the partition's prefix::

    sst/<epoch:010d>-<file>                 immutable snapshot files (SST, blob), shared
    snapshots/<offset:020d>-<epoch:010d>.json   a snapshot at a committed offset: its
                                            files' keys, sizes and CRC32s; the small
                                            metadata files (MANIFEST, CURRENT, OPTIONS) inline

Works with an engine that has ``snapshots() -> [(offset, directory)]`` and
``snapshot_path(offset)``. Snapshots are an optimization: a damaged or missing one is
skipped with a warning naming its key, and the changelog replay covers the difference.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from localstate.errors import ChangelogError, CorruptionError
from localstate.faults import fault_point

from .objectstore_client import MISSING, ObjectStoreClient, first_line

__all__ = ["RemoteSnapshots"]

log = logging.getLogger("localstate.changelog.objectstore")

_MANIFEST_NAME = re.compile(r"^(\d{20})-(\d{10})\.json$")
_SHARED_SUFFIXES = (".sst", ".blob")  # immutable snapshot files: uploaded once, shared
_DOWNLOADS = 8  # files fetched at once


class RemoteSnapshots:
    """The snapshots of one changelog partition (``prefix``) in the object store."""

    def __init__(self, store: ObjectStoreClient, prefix: str, describe: str) -> None:
        self.store = store
        self.prefix = prefix
        self.describe = describe
        self._remote_files: dict[str, dict[str, Any]] = {}  # local file name -> {key, size, crc32}

    def _manifests(self) -> list[tuple[tuple[int, int], str]]:
        """``((offset, epoch), name)`` of the snapshot manifests, oldest first."""
        out = []
        for name, _ in self.store.list(f"{self.prefix}/snapshots"):
            m = _MANIFEST_NAME.match(name)
            if m is not None:
                out.append(((int(m.group(1)), int(m.group(2))), name))
        return sorted(out)

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
                data = f.read_bytes()
                known = {"key": f"{self.prefix}/sst/{epoch:010d}-{f.name}", "size": len(data),
                         "crc32": zlib.crc32(data)}
                self.store.put(known["key"], data)
                self._remote_files[f.name] = known
            files[f.name] = known
        fault_point("objectstore.snapshot.before_manifest")
        manifest = {"format": 1, "offset": offset, "epoch": epoch, "files": files, "inline": inline}
        name = f"{offset:020d}-{epoch:010d}.json"
        self.store.put(f"{self.prefix}/snapshots/{name}", json.dumps(manifest).encode())
        self._drop_old_snapshots(keep=name)
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
        except (*MISSING, ValueError, ChangelogError) as e:
            log.warning("snapshot manifest %s is unusable (%s); it is skipped", self.store.where(key), e)
            return None

    def _drop_old_snapshots(self, keep: str) -> None:
        """Keep the two newest manifests; delete older ones and the files only they use."""
        manifests = [n for _, n in self._manifests()]
        if keep not in manifests:
            return
        kept, dropped = manifests[-2:], manifests[:-2]
        if not dropped:
            return
        in_use = set()
        for name in kept:
            in_use |= {m["key"] for m in (self._read_manifest(name) or {"files": {}})["files"].values()}
        garbage = set()
        for name in dropped:
            garbage |= {m["key"] for m in (self._read_manifest(name) or {"files": {}})["files"].values()}
        try:
            self.store.delete([f"{self.prefix}/snapshots/{n}" for n in dropped])
            self.store.delete(sorted(garbage - in_use))
        except ChangelogError as e:
            log.warning("%s: old snapshots not deleted (%s)", self.describe, e)

    def fetch(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Before a restore: download the newest remote snapshot at ``min_valid <= L <=
        committed`` that is newer than every local one into ``engine.snapshot_path(L)``;
        returns ``L``, or None if none was needed or usable (the replay covers it)."""
        if not (hasattr(engine, "snapshots") and hasattr(engine, "snapshot_path")):
            return None
        local_best = max((o for o, _ in engine.snapshots() if min_valid <= o <= committed), default=-1)
        parent = Path(engine.snapshot_path(0)).parent
        for leftover in parent.glob(".fetch-*") if parent.is_dir() else ():
            shutil.rmtree(leftover, ignore_errors=True)  # a download a crash interrupted
        candidates = [(key, n) for key, n in self._manifests() if local_best < key[0] <= committed and key[0] >= min_valid]
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
                with ThreadPoolExecutor(max_workers=_DOWNLOADS) as pool:
                    for (fname, meta), data in zip(items, pool.map(lambda it: self.store.get(it[1]["key"]), items)):
                        if len(data) != meta["size"] or zlib.crc32(data) != meta["crc32"]:
                            raise CorruptionError(f"{self.store.where(meta['key'])} does not match its size/CRC32 "
                                                  f"in snapshot manifest {name}")
                        (tmp / fname).write_bytes(data)
                for fname, b64 in manifest.get("inline", {}).items():
                    (tmp / fname).write_bytes(base64.b64decode(b64))
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
            except (CorruptionError, ChangelogError, *MISSING, ValueError, KeyError) as e:
                shutil.rmtree(tmp, ignore_errors=True)
                log.warning("%s: snapshot %s cannot be used (%s); trying an older one or replaying the changelog",
                            self.describe, name, first_line(e))
                continue
            self._remote_files = {f: dict(m) for f, m in manifest["files"].items()}
            log.info("%s: downloaded the snapshot at offset %d (%d files)", self.describe, offset, len(items))
            return offset
        return None

    def delete_past(self, offset: int) -> None:
        """Delete the manifests of snapshots past ``offset`` (records about to be discarded:
        such a snapshot must never be used); ``-1``: all of them."""
        self.store.delete([f"{self.prefix}/snapshots/{n}" for (off, _), n in self._manifests() if off > offset])

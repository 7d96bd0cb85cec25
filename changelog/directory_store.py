"""The few object-store operations shipped engine snapshots need
(``objectstore_snapshots.py``), on a directory: the file changelog's partition
directories, or a mounted shared directory named by ``file://`` — no obstore needed.

Writes are atomic (a temporary name, fsync, rename); immutable files are hard-linked
when source and target share a filesystem, copied otherwise.
"""

from __future__ import annotations

import os
import shutil
import zlib
from pathlib import Path

from localstate.locking import atomic_write, fsync_dir

__all__ = ["DirectoryStore", "first_line", "link_file"]


def first_line(e: BaseException) -> str:
    """Client errors can carry a multi-line dump; the first line says what happened."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def link_file(path: Path, target: Path) -> bool:
    """Hard-link the immutable file ``path`` as ``target`` (replacing it atomically);
    False when they are on different filesystems or links are not allowed."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.link")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        os.link(path, tmp)
        os.replace(tmp, target)
        return True
    except OSError:
        tmp.unlink(missing_ok=True)
        return False


class DirectoryStore:
    """Keys are paths relative to ``root``."""

    missing: tuple[type[BaseException], ...] = (FileNotFoundError,)
    """What :meth:`get` raises for a missing key."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def where(self, key: str) -> str:
        return str(self.root / key)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)

    def put_file(self, key: str, path: Path) -> tuple[int, int]:
        """Store the immutable file ``path`` as ``key``; its ``(size, CRC32)``."""
        data = path.read_bytes()
        target = self.root / key
        if link_file(path, target):
            fsync_dir(target.parent)
        else:
            self.put(key, data)
        return len(data), zlib.crc32(data)

    def get(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """``(name relative to prefix, size)`` of every file under ``prefix/`` (none: [])."""
        base = self.root / prefix
        if not base.is_dir():
            return []
        return [(str(p.relative_to(base)), p.stat().st_size) for p in sorted(base.rglob("*"))
                if p.is_file() and not p.name.startswith(".")]

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            path = self.root / key
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

"""Task checkpoints of the file changelog: small checksummed files under
``<systems.file.path>/_checkpoints/<job>/partition-<p>.ckpt``, replaced atomically, the
previous one kept beside as ``.ckpt.prev`` (the commit point: step 4 of the commit in docs/design/protocol.md).

The previous one is hard-linked to ``.prev`` before the new one is renamed over it, so no
crash leaves only ``.prev``. A missing or corrupt ``.ckpt`` is damage and an error;
``.prev`` is used only when asked (``localstate restore --use-previous-checkpoint``)."""

from __future__ import annotations

import os
from pathlib import Path

from localstate.checkpoint import Checkpoint
from localstate.errors import CorruptionError
from localstate.faults import fault_point
from localstate.locking import fsync_dir, io_error

from ..base import CheckpointStore

__all__ = ["FileCheckpointStore"]


class FileCheckpointStore(CheckpointStore):
    """Checkpoints as small checksummed files, replaced atomically; the previous one kept."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _paths(self, job: str, partition: int) -> tuple[Path, Path]:
        d = self.root / job
        return d / f"partition-{partition}.ckpt", d / f"partition-{partition}.ckpt.prev"

    def _load(self, path: Path) -> Checkpoint | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise io_error(e, "read checkpoint", path) from e
        return Checkpoint.from_bytes(data, where=f"checkpoint {path}")

    def read(self, job: str, partition: int) -> Checkpoint | None:
        current, prev = self._paths(job, partition)
        try:
            ckpt = self._load(current)
        except CorruptionError as e:
            raise CorruptionError(f"{e}. {self._recovery(prev)}") from e
        if ckpt is None and prev.exists():
            raise CorruptionError(
                f"checkpoint {current} is missing but {prev.name} exists: the latest checkpoint was deleted "
                f"(a commit never leaves only {prev.name}). Nothing was changed. {self._recovery(prev)}"
            )
        return ckpt

    @staticmethod
    def _recovery(prev: Path) -> str:
        return (
            f"Restore the file from a backup; or go back one commit with `localstate restore "
            f"--use-previous-checkpoint` (uses {prev.name}: the last commit is undone and its input is "
            "processed again); or decide each store's state with `localstate restore --accept-log-end STORE` "
            "or `--reset STORE`"
        )

    def previous(self, job: str, partition: int) -> Checkpoint | None:
        """The checkpoint the latest one replaced (``.prev``), None if there is none."""
        _, prev = self._paths(job, partition)
        return self._load(prev)

    def write(self, job: str, partition: int, checkpoint: Checkpoint) -> None:
        current, prev = self._paths(job, partition)
        try:
            current.parent.mkdir(parents=True, exist_ok=True)
            tmp = current.with_name(current.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(checkpoint.to_bytes())
                f.flush()
                os.fsync(f.fileno())
            fault_point("checkpoint.before_rename")
            if current.exists():
                # .prev becomes a second name of the current file, then the new file is
                # renamed over .ckpt: at every moment .ckpt is a complete checkpoint.
                link = prev.with_name(prev.name + ".tmp")
                link.unlink(missing_ok=True)
                os.link(current, link)
                os.replace(link, prev)
            os.replace(tmp, current)
            fault_point("checkpoint.after_rename")
            fsync_dir(current.parent)
        except OSError as e:
            raise io_error(e, "write checkpoint", current) from e

"""The engine snapshots a file changelog partition ships into its ``shipped/`` directory
after commits, so an open on another machine replays only what follows the newest one
(:class:`~localstate.changelog.snapshots.RemoteSnapshots` over the directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..directory_store import DirectoryStore
from ..snapshots import RemoteSnapshots, instance_epoch

__all__ = ["SHIPPED", "ShippedSnapshots"]

SHIPPED = "shipped"
"""In a partition directory: the engine snapshots shipped after commits."""


class ShippedSnapshots:
    """The ``shipped/`` snapshots of one partition directory. ``enabled``: this partition
    ships (``systems.<name>.snapshots``), also every ``every`` commits when > 0."""

    def __init__(self, directory: Path, describe: str, *, enabled: bool, every: int) -> None:
        self.directory = directory
        self.describe = describe
        self.enabled = enabled
        self.every = every
        self._remote: RemoteSnapshots | None = None

    def _shipping(self) -> RemoteSnapshots | None:
        if not self.enabled:
            return None
        if self._remote is None:
            self._remote = self._in_directory(self.every)
        return self._remote

    def _in_directory(self, every: int = 0) -> RemoteSnapshots:
        return RemoteSnapshots(DirectoryStore(self.directory), SHIPPED, self.describe, every)

    def _here(self) -> RemoteSnapshots | None:
        """The snapshots in ``shipped/``, also when this partition ships none (turned off
        since, or opened by a tool)."""
        if not (self.directory / SHIPPED).is_dir():
            return None
        return self._shipping() or self._in_directory()

    def upload(self, engine: Any, offset: int) -> bool:
        """Ship the engine's snapshot at ``offset`` when it took one; True if shipped."""
        remote = self._shipping()
        return False if remote is None else remote.ship(engine, offset, instance_epoch())

    def fetch(self, engine: Any, committed: int, min_valid: int) -> int | None:
        """Put the newest usable shipped snapshot among the engine's local ones."""
        remote = self._shipping()
        return None if remote is None else remote.fetch(engine, committed, min_valid)

    @property
    def fetched_files(self) -> int:
        """Files the last :meth:`fetch` downloaded."""
        return 0 if self._remote is None else self._remote.fetched_files

    @property
    def linked_files(self) -> int:
        """Files the last :meth:`fetch` found here already."""
        return 0 if self._remote is None else self._remote.linked_files

    def offsets(self) -> list[int]:
        here = self._here()
        return [] if here is None else here.offsets()

    def drop_past(self, offset: int) -> None:
        """Before offsets past ``offset`` are written again: no shipped snapshot of the
        discarded records may be fetched (``-1``: none at all)."""
        here = self._here()
        if here is not None:
            here.delete_past(offset)

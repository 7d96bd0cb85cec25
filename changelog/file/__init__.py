"""The embedded file changelog (the default): segmented append-only files with CRCs, its
checkpoint files, its clean-close claim and its rescale strategy.

The names below are imported on first use, so importing one submodule does not import
the whole system."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localstate.lazy import lazy_exports

if TYPE_CHECKING:
    from .checkpoints import FileCheckpointStore
    from .partition import FileChangelogPartition
    from .system import FileChangelogOptions, FileChangelogSystem

__all__ = ["FileChangelogSystem", "FileChangelogPartition", "FileChangelogOptions", "FileCheckpointStore"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "FileChangelogSystem": ".system",
    "FileChangelogPartition": ".partition",
    "FileChangelogOptions": ".system",
    "FileCheckpointStore": ".checkpoints",
})

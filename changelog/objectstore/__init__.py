"""The object-store changelog (S3, GCS, ADLS, HDFS through WebHDFS, ``file://``): immutable
batch objects, create-only checkpoint objects that fence older writers, and its inspection.

The names below are imported on first use, so importing one submodule does not import
the whole system."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localstate.lazy import lazy_exports

if TYPE_CHECKING:
    from .chain import ObjectName
    from .checkpoints import ObjectStoreCheckpointStore
    from .client import ObjectStoreSettings
    from .partition import ObjectStoreChangelogPartition
    from .system import ObjectStoreChangelogSystem

__all__ = ["ObjectStoreChangelogSystem", "ObjectStoreChangelogPartition", "ObjectStoreCheckpointStore", "ObjectStoreSettings", "ObjectName"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "ObjectStoreChangelogSystem": ".system",
    "ObjectStoreChangelogPartition": ".partition",
    "ObjectStoreCheckpointStore": ".checkpoints",
    "ObjectStoreSettings": ".client",
    "ObjectName": ".chain",
})

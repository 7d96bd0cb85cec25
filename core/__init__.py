"""localstate: local, fault-tolerant state for stream-processing tasks.

Each task owns its stores on local disk; every change also goes to a changelog;
after a crash or a move the store is rebuilt from that changelog to exactly the last
commit. Engines are pluggable by name.

The names below are imported on first use (``from localstate import TaskStorage``
works as always), except the errors: a process that needs only part of localstate —
Spark's streaming-source runner, a fresh interpreter per query that reads a
``localstate-kafka`` stream — then does not import the storage, the engines' registry
and the layers (~60 ms at every query start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    ChangelogError,
    ConfigError,
    CorruptionError,
    EngineError,
    FencedError,
    InvalidValueError,
    LocalStateError,
    ReadOnlyStoreError,
    SerializationError,
    StoreClosedError,
    StoreLockedError,
    UnknownEngineError,
    UnknownSerdeError,
    UnknownSystemError,
)
from .lazy import lazy_exports

if TYPE_CHECKING:
    from .changelogger import ChangeLogger
    from .checkpoint import Checkpoint
    from .config import Config
    from .engine import (
        ChangeRecord,
        KeyValueEngine,
        StorageEngine,
        StorageEngineFactory,
        StoreContext,
        StoreSpec,
    )
    from .kv import CloseableIterator, KeyValueIterator, KeyValueStore
    from .metrics import RestoreProgress, StoreMetrics
    from .reader import StateReader, read_committed
    from .registry import register_engine, register_system
    from .serdes import Serde, get_serde, register_serde
    from .storage import TaskStorage

__version__ = "0.1.0"

__all__ = [
    "ChangeLogger",
    "ChangeRecord",
    "ChangelogError",
    "CloseableIterator",
    "Checkpoint",
    "Config",
    "ConfigError",
    "CorruptionError",
    "EngineError",
    "FencedError",
    "InvalidValueError",
    "KeyValueEngine",
    "KeyValueIterator",
    "KeyValueStore",
    "LocalStateError",
    "ReadOnlyStoreError",
    "RestoreProgress",
    "Serde",
    "SerializationError",
    "StorageEngine",
    "StorageEngineFactory",
    "StoreClosedError",
    "StoreContext",
    "StoreLockedError",
    "StoreMetrics",
    "StateReader",
    "StoreSpec",
    "TaskStorage",
    "UnknownEngineError",
    "UnknownSystemError",
    "UnknownSerdeError",
    "get_serde",
    "read_committed",
    "register_engine",
    "register_serde",
    "register_system",
    "__version__",
]


_LAZY = {  # the module of each name of __all__ not imported above (see the module docstring)
    "ChangeLogger": ".changelogger",
    "Checkpoint": ".checkpoint",
    "Config": ".config",
    **dict.fromkeys(("ChangeRecord", "KeyValueEngine", "StorageEngine", "StorageEngineFactory", "StoreContext",
                     "StoreSpec"), ".engine"),
    **dict.fromkeys(("CloseableIterator", "KeyValueIterator", "KeyValueStore"), ".kv"),
    **dict.fromkeys(("RestoreProgress", "StoreMetrics"), ".metrics"),
    **dict.fromkeys(("StateReader", "read_committed"), ".reader"),
    **dict.fromkeys(("register_engine", "register_system"), ".registry"),
    **dict.fromkeys(("Serde", "get_serde", "register_serde"), ".serdes"),
    "TaskStorage": ".storage",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

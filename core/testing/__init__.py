"""Test kits shipped with localstate so plug-in authors can run them.

* :class:`KeyValueStoreConformance` — subclass it in a pytest module and provide a
  ``store`` fixture yielding an empty store; every KeyValueStore contract is checked.
* :func:`layer_stack` / :data:`LAYER_COMBOS` — wrap any KV engine in each layer
  combination the framework uses.
* :class:`StorageEngineConformance` — the engine half: exact restore into empty and
  stale engines, uncommitted close, SIGKILL trials (set ``engine = "module:Factory"``).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["KeyValueStoreConformance", "layer_stack", "LAYER_COMBOS", "StorageEngineConformance", "FULL"]

FULL = os.environ.get("LOCALSTATE_FULL") == "1"
"""Soak, crash and property tests run a shortened form (what CI runs) unless
``LOCALSTATE_FULL=1`` asks for the full one."""


def __getattr__(name: str) -> Any:
    # Lazy, so that importing a sibling module (e.g. the torture harness in its many
    # short-lived child processes) does not pay for pytest, which conformance imports.
    if name == "StorageEngineConformance":
        from . import engine_conformance

        return engine_conformance.StorageEngineConformance
    if name in __all__ and name != "FULL":
        from . import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

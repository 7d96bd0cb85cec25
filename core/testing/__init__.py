"""Test kits shipped with localstate so plug-in authors can run them.

* :class:`KeyValueStoreConformance` — subclass it in a pytest module and provide a
  ``store`` fixture yielding an empty store; every KeyValueStore contract is checked.
* :func:`layer_stack` / :data:`LAYER_COMBOS` — wrap any KV engine in each layer
  combination the framework uses.
"""

from __future__ import annotations

from .conformance import LAYER_COMBOS, KeyValueStoreConformance, layer_stack

__all__ = ["KeyValueStoreConformance", "layer_stack", "LAYER_COMBOS"]

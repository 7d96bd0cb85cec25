"""The shipped conformance suite over the memory engine × every layer combination."""

from __future__ import annotations

import pytest
from localstate.engine import StoreContext
from localstate.engines.memory import MemoryEngine
from localstate.testing import LAYER_COMBOS, KeyValueStoreConformance, layer_stack


class TestMemoryConformance(KeyValueStoreConformance):
    @pytest.fixture(params=LAYER_COMBOS)
    def store(self, request, tmp_path):
        with layer_stack(MemoryEngine(StoreContext.local(tmp_path / "mem", "mem")), request.param, tmp_path) as s:
            yield s

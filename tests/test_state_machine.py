"""A hypothesis state machine: random put/delete/range/commit/crash-and-reopen vs a dict model.

After every reopen the store equals the model as of the last commit, and the
checkpoint's input position is the number of operations committed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from localstate import Config, StateReader, TaskStorage
from localstate.testing import FULL

keys = st.sampled_from([f"k{i:02d}" for i in range(24)])


class StorageMachine(RuleBasedStateMachine):
    factory = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ls-sm-"))
        self.config = Config.from_dict({
            "job.name": "sm",
            "job.state.dir": str(self.dir / "state"),
            "systems.file.path": str(self.dir / "changelog"),
            "systems.file.segment.bytes": 4096,
            "stores.kv.factory": self.factory,
            "stores.kv.key.serde": "string",
            "stores.kv.msg.serde": "json",
            "stores.kv.object.cache.size": 8,
            "stores.kv.write.batch.size": 4,
        })
        self.storage = TaskStorage(self.config)
        self.model: dict[str, int] = {}
        self.committed: dict[str, int] = {}
        self.ops = 0
        self.committed_ops = 0

    @property
    def store(self):
        return self.storage.store("kv")

    @rule(k=keys, v=st.integers(0, 1000))
    def put(self, k, v):
        self.store.put(k, v)
        self.model[k] = v
        self.ops += 1

    @rule(k=keys)
    def delete(self, k):
        self.store.delete(k)
        self.model.pop(k, None)
        self.ops += 1

    @rule(k=keys)
    def get(self, k):
        assert self.store.get(k) == self.model.get(k)

    # -- the mapping protocol (each write counts as one op) --------------------------------
    @rule(k=keys, d=st.integers(-5, -1))
    def pop(self, k, d):
        expect = self.model.pop(k, d)
        assert self.store.pop(k, d) == expect
        self.ops += 1

    @rule(k=keys, v=st.integers(0, 1000))
    def setdefault(self, k, v):
        expect = self.model.setdefault(k, v)
        assert self.store.setdefault(k, v) == expect
        self.ops += 1

    @rule(batch=st.dictionaries(keys, st.integers(0, 1000), max_size=5))
    def update(self, batch):
        self.store.update(batch)
        self.model.update(batch)
        self.ops += 1

    @rule()
    def popitem(self):
        if not self.model:
            assert not self.store
            return
        k = min(self.model)
        assert self.store.popitem() == (k, self.model.pop(k))
        self.ops += 1

    @rule()
    def read_committed_state(self):
        """A StateReader beside the open task sees exactly the last commit."""
        with StateReader(self.config) as reader:
            if self.storage.checkpoint is None:
                return
            assert dict(reader.store("kv")) == self.committed

    @rule(a=keys, b=keys)
    def range_scan(self, a, b):
        with self.store.range(a, b) as it:
            assert list(it) == sorted((k, v) for k, v in self.model.items() if a <= k < b)

    @rule()
    def commit(self):
        ck = self.storage.commit(input_position=self.ops)
        self.committed = dict(self.model)
        self.committed_ops = self.ops
        assert ck.input_position == self.ops

    @rule()
    def compact(self):
        self.storage.compact()

    @rule()
    def crash_and_reopen(self):
        self.storage.close()  # close never commits: everything since the last commit is lost
        self.storage = TaskStorage(self.config)
        self.model = dict(self.committed)
        self.ops = self.committed_ops
        pos = self.storage.checkpoint.input_position if self.storage.checkpoint else 0
        assert (pos or 0) == self.committed_ops

    @invariant()
    def all_matches_model(self):
        with self.store.all() as it:
            assert dict(it) == self.model
        assert len(self.store) == len(self.model)

    def teardown(self):
        self.storage.close()
        shutil.rmtree(self.dir, ignore_errors=True)


StorageMachine.TestCase.settings = settings(
    max_examples=200 if FULL else 25, stateful_step_count=40, deadline=None
)
TestMemoryStateMachine = StorageMachine.TestCase

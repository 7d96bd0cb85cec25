"""The crash-trial workload in one process (:mod:`localstate.testing.torture`): the
seed's batches applied and committed, the crash-free reference run, and the child
process's entry point that reports what it found when it opened the task."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localstate.config import Config
from localstate.errors import ConfigError
from localstate.kv import KeyValueStore
from localstate.storage import TaskStorage

from .torture_adapters import WorkloadAdapter, adapter_for
from .torture_plans import STORE, TrialPlan

__all__ = ["RESUMED", "Reference", "reference_run", "child_main", "work", "batch_rng", "norm", "logged_keys",
           "fingerprint", "check_adapter"]


def batch_rng(seed: int, batch: int) -> random.Random:
    """The random source of input batch ``batch`` of trial ``seed`` (the same in every run)."""
    return random.Random(f"work:{seed}:{batch}")


def norm(x: Any) -> Any:
    """``x`` as JSON sees it (so a reference state and a child's report compare equal)."""
    return json.loads(json.dumps(x, sort_keys=True))


def logged_keys(storage: TaskStorage) -> set[bytes]:
    changelog = storage.changelog(STORE)
    ckpt = storage.checkpoint
    if changelog is None or ckpt is None:
        return set()
    return {k for k, _ in changelog.read(0, ckpt.offsets.get(STORE, 0))}


def fingerprint(storage: TaskStorage, keys: set[bytes]) -> dict[str, str]:
    """The engine's committed change record for each key (hex), tombstones left out."""
    return {k.hex(): v.hex() for k, v in storage.engine(STORE).current(sorted(keys)) if v is not None}


RESUMED = "LOCALSTATE_TORTURERESUMED"
"""A zombie child's environment: a file that exists once it has been resumed beside a newer
instance; from then on each of its batches gets more operations before its commit (its
input moved on), so records it never committed differ from the ones the newer instance
commits at the same offsets."""


def work(storage: TaskStorage, plan: TrialPlan, adapter: WorkloadAdapter,
          after_commit: Callable[[int], None] | None = None) -> None:
    start = storage.checkpoint.input_position if storage.checkpoint else 0
    store = storage.store(STORE)
    resumed = os.environ.get(RESUMED)
    for batch in range(int(start or 0) + 1, plan.batches + 1):
        adapter.apply_batch(store, batch, batch_rng(plan.seed, batch), plan.ops, plan.keys)
        if resumed and os.path.exists(resumed):
            adapter.apply_batch(store, batch, batch_rng(plan.seed + 7919, batch), plan.ops, plan.keys)
        storage.commit(input_position=batch)
        if plan.compact_every and batch % plan.compact_every == 0:
            storage.compact()
        if after_commit is not None:
            after_commit(batch)


@dataclass
class Reference:
    states: list[Any]
    """``states[p]``: what the store shows after committing input batch ``p``."""
    fingerprint: dict[str, str]
    logged: set[bytes]
    seconds: float


def reference_run(plan: TrialPlan, root: Path) -> Reference:
    """Run ``plan`` without faults in this process, on the file changelog without fsync
    (the reference state does not depend on the changelog system)."""
    adapter = adapter_for(plan.engine, plan.workload)
    values = plan.values(root, None, "ref", changelog="file")
    values["systems.file.fsync"] = False
    config = Config.from_dict(values)
    t0 = time.perf_counter()
    states: list[Any] = []
    with TaskStorage(config) as storage:
        check_adapter(storage, plan.engine, adapter)
        adapter.open(storage)
        store = storage.store(STORE)
        states.append(norm(adapter.observe(store, plan.keys)))
        work(storage, plan, adapter, lambda _b: states.append(norm(adapter.observe(store, plan.keys))))
        logged = logged_keys(storage)
        fp = fingerprint(storage, logged)
    return Reference(states, fp, logged, time.perf_counter() - t0)


def check_adapter(storage: TaskStorage, engine: str, adapter: WorkloadAdapter) -> None:
    if adapter.key_value and not isinstance(storage.engine(STORE), KeyValueStore):
        raise ConfigError(
            f"engine {engine!r} is not a key-value engine and has no torture workload adapter; "
            "register one with localstate.testing.torture.register_adapter()"
        )


def child_main() -> None:
    """Entry point of a trial's child process: ``argv[1]`` = plan JSON, ``argv[2]`` = config JSON.

    Prints one JSON line when the task is open (position, restore seconds, state) and
    one when the workload is done; a fault point may SIGKILL it anywhere in between.
    """
    plan = TrialPlan(**{**json.loads(sys.argv[1]), "faults": ()})
    config = Config.from_dict(json.loads(sys.argv[2]))
    adapter = adapter_for(plan.engine, plan.workload)
    t0 = time.perf_counter()
    with TaskStorage(config) as storage:
        opened = time.perf_counter() - t0
        adapter.open(storage)
        ckpt = storage.checkpoint
        restored = storage.last_restore.get(STORE)
        line = {
            "event": "opened",
            "position": int(ckpt.input_position or 0) if ckpt else 0,
            "restore_s": opened,
            "records": restored.records if restored else 0,
            "state": adapter.observe(storage.store(STORE), plan.keys),
        }
        print(json.dumps(line, sort_keys=True), flush=True)
        work(storage, plan, adapter,
              after_commit=lambda batch: print(json.dumps({"event": "committed", "batch": batch}), flush=True))
    print(json.dumps({"event": "done"}), flush=True)

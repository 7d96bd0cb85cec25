"""One crash trial (:mod:`localstate.testing.torture`): the reference run, the crash
rounds of its children, each reopen checked against the reference, and the final check."""

from __future__ import annotations

import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localstate.config import Config
from localstate.errors import ConfigError, LocalStateError
from localstate.storage import TaskStorage

from .torture_adapters import WorkloadAdapter, adapter_for
from .torture_children import (
    Child,
    moved_machine,
    run_child,
    start_zombie,
    zombie_ending,
    zombie_machine,
)
from .torture_plans import STORE, TrialPlan, reproducer
from .torture_work import Reference, fingerprint, logged_keys, norm, reference_run

__all__ = ["TrialResult", "run_trial"]


@dataclass
class TrialResult:
    seed: int
    engine: str
    changelog: str
    faults: tuple[str, ...]
    crashes: int = 0
    """Children that were really killed (a fault point may not be reached)."""
    zombies: int = 0
    """Children that went on as zombies beside a newer instance (objectstore)."""
    moves: int = 0
    """Times the task moved to another machine's empty state dir after a crash round."""
    restores: list[float] = field(default_factory=list)
    """Seconds each reopen after a crash took (TaskStorage open incl. restore)."""
    restored_records: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    """The committed input position each child found when it opened the task."""
    divergence: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.divergence is None


def divergence(plan: TrialPlan, stage: str, position: int, expected: Any, actual: Any,
                adapter: WorkloadAdapter, **extra: Any) -> dict[str, Any]:
    diff = adapter.classify(expected, actual) if isinstance(expected, dict) and isinstance(actual, dict) else {}
    first = next((k for kind in ("lost", "duplicated", "resurrected", "differs") for k in diff.get(kind, [])), None)
    return {
        "stage": stage,
        "position": position,
        **{kind: keys for kind, keys in diff.items()},
        "first_key": first,
        "expected": expected.get(first) if first is not None and isinstance(expected, dict) else None,
        "actual": actual.get(first) if first is not None and isinstance(actual, dict) else None,
        "reproduce": reproducer(plan),
        **extra,
    }



def run_trial(plan: TrialPlan, workdir: Path, bootstrap: str | None = None) -> TrialResult:
    """Run one trial in ``workdir`` (created; left for inspection if the trial diverges)."""
    t0 = time.perf_counter()
    adapter = adapter_for(plan.engine, plan.workload)
    result = TrialResult(plan.seed, plan.engine, plan.changelog, plan.faults)
    ref = reference_run(plan, workdir / "ref")
    values = plan.values(workdir / "crash", bootstrap, "", namespace=uuid.uuid4().hex[:8])
    run_rounds(plan, values, ref, adapter, result)
    if result.divergence is None:
        try:
            result.divergence = verify_final(plan, values, ref, adapter)
        except LocalStateError as e:  # the last open refused: damage a trial must never leave
            result.divergence = {"stage": "final open", "error": str(e), "reproduce": reproducer(plan)}
    result.seconds = time.perf_counter() - t0
    return result


def run_rounds(plan: TrialPlan, values: dict[str, Any], ref: Reference, adapter: WorkloadAdapter,
                result: TrialResult) -> None:
    """The crash rounds of one trial and its last child (a divergence ends them)."""
    crashed_before = False
    zombie: Child | None = None
    try:
        for round_no, fault in enumerate((*plan.faults, None)):
            if fault is not None and fault.startswith("zombie:"):
                if zombie is not None:
                    raise ConfigError(f"{fault}: one zombie round per trial ({reproducer(plan)})")
                child = start_zombie(plan, values, fault.split(":", 1)[1])
                rc, lines, err = (None if child.stopped else child.wait()), child.lines, ""
            else:
                rc, lines, err = run_child(plan, values, fault, on_opened=zombie.resume_fenced if zombie else None)
                child = None
            if not check_round(plan, ref, adapter, result, fault, rc, lines, child.err if child else err,
                          crashed_before, child):
                return
            if child is not None and child.stopped:
                zombie = child
                crashed_before = True
                continue
            crashed_before = crashed_before or rc == -signal.SIGKILL
            if round_no in plan.moves and zombie is None:
                # the task moves: the next child starts on another machine's empty state dir
                values.update(moved_machine(values, round_no))
                result.moves += 1
            if zombie is not None:
                result.divergence = zombie_ending(zombie, plan)
                result.zombies += 1
                zombie = None
                if result.divergence is not None:
                    return
                # the rest of the trial (and the final check) runs on the zombie's machine:
                # its local copy, built from records it never committed, must not be trusted
                values.update(zombie_machine(values))
    finally:
        if zombie is not None:
            zombie.kill()


def check_round(plan: TrialPlan, ref: Reference, adapter: WorkloadAdapter, result: TrialResult, fault: str | None,
           rc: int | None, lines: list[dict], err: str, crashed_before: bool, zombie: Child | None) -> bool:
    """Check one child's round (``zombie``: the child was stopped to go on as a zombie
    later); False, with ``result.divergence`` set, to stop the trial."""
    opened = next((x for x in lines if x.get("event") == "opened"), None)
    if opened is not None:
        pos = opened["position"]
        result.positions.append(pos)
        if crashed_before:
            result.restores.append(opened["restore_s"])
            result.restored_records.append(opened["records"])
        if not 0 <= pos <= plan.batches or norm(opened["state"]) != ref.states[pos]:
            expected = ref.states[pos] if 0 <= pos <= plan.batches else None
            result.divergence = divergence(plan, f"reopen after {result.crashes} crash(es)", pos,
                                            expected, norm(opened["state"]), adapter, fault=fault)
            return False
    if zombie is not None and zombie.stopped:
        result.crashes += 1  # a takeover, as after a kill
        return True
    killed = rc == -signal.SIGKILL
    if rc is None or not (rc == 0 or (killed and fault is not None)):
        result.divergence = {"stage": f"child with fault {fault!r}", "returncode": rc, "stderr": err,
                             "reproduce": reproducer(plan)}
        return False
    if killed:
        result.crashes += 1
    elif not any(x.get("event") == "done" for x in lines):
        result.divergence = {"stage": f"child with fault {fault!r} exited 0 without finishing",
                             "stderr": err, "reproduce": reproducer(plan)}
        return False
    return True


def verify_final(plan: TrialPlan, values: dict[str, Any], ref: Reference,
                  adapter: WorkloadAdapter) -> dict[str, Any] | None:
    with TaskStorage(Config.from_dict(values)) as storage:
        adapter.open(storage)
        ckpt = storage.checkpoint
        pos = int(ckpt.input_position or 0) if ckpt else 0
        state = norm(adapter.observe(storage.store(STORE), plan.keys))
        if pos != plan.batches or state != ref.states[-1]:
            return divergence(plan, "final state", pos, ref.states[-1], state, adapter)
        fp = fingerprint(storage, ref.logged | logged_keys(storage))
    if fp != ref.fingerprint:
        return divergence(plan, "final change records (engine.current)", pos, ref.fingerprint, fp, adapter)
    return None


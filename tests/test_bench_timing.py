"""The benchmarks' one timer: what it times, what it leaves out, what it repeats."""

from __future__ import annotations

import time
from pathlib import Path

from localstate.benchmarks.timing import (
    Stopwatch,
    interleaved_trials,
    repeat_trials,
    spread,
    timed_runs,
)


def test_a_stopwatch_sums_the_blocks_it_times_and_nothing_between() -> None:
    watch = Stopwatch(cpu=True)
    start = time.perf_counter()
    for _ in range(2):
        with watch:
            time.sleep(0.02)
        time.sleep(0.05)  # between the blocks: not timed
    total = time.perf_counter() - start
    assert 0.04 <= watch.wall <= total - 0.1
    assert watch.cpu < 0.03 and watch.thread < 0.03  # asleep: next to no CPU
    busy = Stopwatch(cpu=True)
    with busy:
        spun = time.thread_time() + 0.02
        while time.thread_time() < spun:
            pass
    assert busy.wall >= busy.thread >= 0.02 and busy.cpu >= 0.02


def test_timed_runs_drop_the_warm_up_and_leave_setup_and_teardown_untimed() -> None:
    calls: list[str] = []

    def setup() -> str:
        calls.append("setup")
        time.sleep(0.2)
        return "state"

    def body(state: str) -> None:
        calls.append(f"body {state}")

    runs = timed_runs(body, 2, setup=setup, teardown=lambda state: calls.append(f"teardown {state}"))
    assert len(runs) == 2 and max(runs) < 0.2
    assert calls == ["setup", "body state", "teardown state"] * 3


def test_repeat_trials_give_each_trial_a_fresh_scratch_dir_and_drop_the_warm_up(tmp_path: Path) -> None:
    seen: list[Path] = []

    def trial(root: Path) -> float:
        assert root.is_dir() and not any(root.iterdir())
        (root / "f").write_text("x")
        seen.append(root)
        return float(len(seen))

    assert repeat_trials(trial, 3, scratch="ls-timing-test") == [2.0, 3.0, 4.0]
    assert len(set(seen)) == 4 and not any(p.exists() for p in seen)
    order: list[str] = []
    figures = interleaved_trials({"a": lambda: order.append("a") or 1, "b": lambda: order.append("b") or 2}, 2)
    assert figures == {"a": [1, 1], "b": [2, 2]} and order == ["a", "b"] * 3
    assert spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)

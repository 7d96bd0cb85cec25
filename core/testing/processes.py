"""Process-tree helpers for crash tests that SIGKILL Spark drivers and executors (Linux).

A test that kills a driver must also be sure nothing it started lives on: a JVM
orphaned by a SIGKILL keeps its ports, threads and memory and would disturb every
later test. These helpers read ``/proc`` directly (no extra dependency) and identify a
process by (pid, start time), so a recycled pid is never mistaken for the old one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["process_stat", "cmdline", "descendants", "alive", "kill_all", "kill_tree", "executor_jvms", "EXECUTOR_MAIN",
           "GroupRun", "run_process_group"]

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
"""The main class of a Spark executor JVM (how one is told from the other processes)."""


def process_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces
    if fields[0] == "Z":  # a zombie has exited; only its exit status is left
        return None
    return int(fields[1]), int(fields[19])


def cmdline(pid: int) -> list[str]:
    """The arguments of ``pid`` (empty if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def descendants(root: int) -> dict[int, int]:
    """Every live process below ``root``: pid → start time."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := process_stat(int(entry.name))) is not None:
            children.setdefault(st[0], []).append((int(entry.name), st[1]))
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            if pid not in out:
                out[pid] = started
                todo.append(pid)
    return out


def alive(seen: dict[int, int]) -> dict[int, int]:
    """The processes of ``seen`` (pid → start time) that still run as the same process."""
    out = {}
    for pid, started in seen.items():
        st = process_stat(pid)
        if st is not None and st[1] == started:
            out[pid] = started
    return out


def kill_all(seen: dict[int, int]) -> None:
    """SIGKILL every process in ``seen`` that is still the same process (same start time)."""
    for pid in alive(seen):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it at once (an executor JVM with its
    Python daemon and workers, as when its host is lost: a Python worker left to notice
    its JVM's death by itself could still finish, even commit, its task meanwhile)."""
    st = process_stat(pid)
    kill_all({**({pid: st[1]} if st is not None else {}), **descendants(pid)})


def executor_jvms(root: int) -> dict[str, int]:
    """The Spark executor JVMs below process ``root`` (a driver or a worker): executor id → pid."""
    out = {}
    for pid in descendants(root):
        args = cmdline(pid)
        if EXECUTOR_MAIN in args and "--executor-id" in args:
            out[args[args.index("--executor-id") + 1]] = pid
    return out


@dataclass
class GroupRun:
    """How a :func:`run_process_group` run ended."""

    returncode: int | None
    moment: Any
    """What ``kill_when`` returned when it named the moment of the SIGKILL (None: not killed)."""
    seconds: float
    survivors: dict[int, int]
    """Processes of the group still alive 10 s after it ended (then SIGKILLed): orphans."""
    timed_out: bool


def run_process_group(cmd: Sequence[str], env: Mapping[str, str], log: Path, *, timeout_s: float,
                      kill_when: Callable[[], Any] | None = None, poll_s: float = 0.05,
                      scan_s: float = 0.0) -> GroupRun:
    """Run ``cmd`` in a process group of its own, output to ``log``; SIGKILL the whole group
    as soon as ``kill_when()`` returns something other than None, or at ``timeout_s``. Every
    process the group started is tracked (``/proc``, every ``scan_s`` seconds) so that what
    outlives the group is found, killed and reported, never left to disturb later tests."""
    seen: dict[int, int] = {}
    moment: Any = None
    timed_out = False
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True)
        try:
            last_scan = 0.0
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    timed_out = True
                    break
                if time.monotonic() - last_scan >= scan_s:
                    seen.update(descendants(proc.pid))
                    last_scan = time.monotonic()
                if kill_when is not None and (moment := kill_when()) is not None:
                    break
                time.sleep(poll_s)
        finally:
            if proc.poll() is None:
                seen.update(descendants(proc.pid))
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    # Everything the command started was in its group: give the kernel a moment to reap,
    # then whatever is left is an orphan.
    deadline = time.monotonic() + 10.0
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = alive(seen)
    kill_all(survivors)
    return GroupRun(proc.returncode, moment, time.monotonic() - t0, survivors, timed_out)

"""Process-tree helpers for crash tests that SIGKILL Spark drivers and executors (Linux).

A test that kills a driver must also be sure nothing it started lives on: a JVM
orphaned by a SIGKILL keeps its ports, threads and memory and would disturb every
later test. These helpers read ``/proc`` directly (no extra dependency) and identify a
process by (pid, start time), so a recycled pid is never mistaken for the old one.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["process_stat", "cmdline", "descendants", "alive", "kill_all", "executor_jvms", "EXECUTOR_MAIN"]

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


def executor_jvms(root: int) -> dict[str, int]:
    """The Spark executor JVMs below process ``root`` (a driver or a worker): executor id → pid."""
    out = {}
    for pid in descendants(root):
        args = cmdline(pid)
        if EXECUTOR_MAIN in args and "--executor-id" in args:
            out[args[args.index("--executor-id") + 1]] = pid
    return out

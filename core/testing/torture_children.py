"""The child processes of a crash trial (:mod:`localstate.testing.torture`): one run to
its end or its kill, and the zombie round's child stopped and resumed beside a newer one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .torture_plans import TrialPlan, reproducer
from .torture_work import RESUMED

__all__ = ["CHILD_TIMEOUT_S", "Child", "run_child", "start_zombie", "zombie_ending", "zombie_machine",
           "moved_machine"]

CHILD_TIMEOUT_S = 180.0


class Child:
    """One child process of a trial, its output read as it comes (so a zombie round can
    act when the next child has opened the task)."""

    def __init__(self, plan: TrialPlan, values: dict[str, Any], faults: str | None,
                 on_opened: Callable[[], None] | None = None, resumed_flag: Path | None = None) -> None:
        env = dict(os.environ)
        env.pop("LOCALSTATE_FAULTS", None)
        env.pop(RESUMED, None)
        if faults:
            env["LOCALSTATE_FAULTS"] = faults
        self._flag = resumed_flag
        if resumed_flag is not None:
            env[RESUMED] = str(resumed_flag)
        cmd = [sys.executable, "-c", "from localstate.testing.torture_work import child_main; child_main()",
               json.dumps(asdict(plan)), json.dumps(values)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[dict] = []
        self.opened = threading.Event()
        self.commits = 0
        self.committed = threading.Condition()
        self.stopped = False
        self._on_opened = on_opened
        self._err = b""
        self._threads = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a line cut by the kill
            self.lines.append(line)
            if line.get("event") == "committed":
                with self.committed:
                    self.commits += 1
                    self.committed.notify_all()
            if line.get("event") == "opened":
                self.opened.set()
                if self._on_opened is not None:
                    self._on_opened()
        self.opened.set()
        with self.committed:
            self.commits = 1 << 30  # ended: nobody waits for more
            self.committed.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self._err = self.proc.stderr.read()

    @property
    def err(self) -> str:
        return self._err.decode(errors="replace")[-2000:]

    def wait(self, timeout: float = CHILD_TIMEOUT_S) -> int | None:
        """The exit code (None: killed after ``timeout``), all output read."""
        try:
            rc: int | None = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        for t in self._threads:
            t.join(10)
        return rc

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self, *, fenced: bool = False) -> None:
        """Continue a stopped child; ``fenced``: a newer instance has opened the task, so
        the child is a zombie from here on (its input moves on: see ``RESUMED``)."""
        if self.stopped:
            self.stopped = False
            if fenced and self._flag is not None:
                self._flag.touch()
            os.kill(self.proc.pid, signal.SIGCONT)

    def resume_fenced(self) -> None:
        self.resume(fenced=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run_child(plan: TrialPlan, values: dict[str, Any], fault: str | None,
              on_opened: Callable[[], None] | None = None) -> tuple[int | None, list[dict], str]:
    """Run one child with ``fault`` (a fault point spec, ``timer:<s>`` or None) to its end;
    ``on_opened`` is called once it has opened the task."""
    timer = fault is not None and fault.startswith("timer:")
    child = Child(plan, values, None if timer else fault, on_opened)
    if timer:
        assert fault is not None
        try:
            child.proc.wait(timeout=float(fault.split(":", 1)[1]))
        except subprocess.TimeoutExpired:
            os.kill(child.proc.pid, signal.SIGKILL)
    rc = child.wait()
    return rc, child.lines, child.err


def zombie_machine(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` on the zombie's machine: a state dir of its own (the next child must not
    meet its task lock)."""
    return {**values, "job.state.dir": str(Path(values["job.state.dir"]).with_name("zombie-state"))}


def moved_machine(values: dict[str, Any], round_no: int) -> dict[str, Any]:
    """``values`` on the machine the task moves to after round ``round_no``: a state dir
    of its own, empty."""
    return {**values, "job.state.dir": str(Path(values["job.state.dir"]).with_name(f"moved-{round_no}-state"))}


def start_zombie(plan: TrialPlan, values: dict[str, Any], spec: str) -> Child:
    """A child on the zombie's machine stopped ``s`` seconds after it opened the task and
    made its ``k``-th commit (``spec`` = ``"k@s"``; unless it ended first)."""
    commits, _, pause = spec.partition("@")
    machine = zombie_machine(values)
    flag = Path(machine["job.state.dir"]).with_name(f"resumed-{uuid.uuid4().hex[:8]}")
    child = Child(plan, machine, None, resumed_flag=flag)
    child.opened.wait(CHILD_TIMEOUT_S)  # it claimed the task: the next child fences it
    with child.committed:
        child.committed.wait_for(lambda: child.commits >= int(commits), CHILD_TIMEOUT_S)
    try:
        child.proc.wait(timeout=float(pause or 0))
    except subprocess.TimeoutExpired:
        child.stop()
    return child


def zombie_ending(zombie: Child, plan: TrialPlan) -> dict[str, Any] | None:
    """Resume a zombie (if the newer child never opened the task, as the owner it may still
    be) and wait for it: it must finish, or fail its commit with FencedError; anything else
    is a divergence."""
    zombie.resume()
    rc = zombie.wait()
    if rc == 0 and any(x.get("event") == "done" for x in zombie.lines):
        return None
    if rc == 1 and "FencedError" in zombie.err:
        return None
    return {"stage": "zombie (a stopped child resumed beside a newer one)", "returncode": rc,
            "stderr": zombie.err, "reproduce": reproducer(plan)}


"""Named fault points for crash tests.

Production code calls ``fault_point("commit.after_changelog_flush")`` at the
places a crash matters. Nothing happens unless the environment variable
``LOCALSTATE_FAULTS`` (or :func:`configure`) enables a point, e.g.::

    LOCALSTATE_FAULTS="commit.after_changelog_flush=kill@3,restore.mid=raise"

``kill`` SIGKILLs the process (a real crash: no cleanup, no atexit), ``raise`` raises
:class:`InjectedFault`, ``exit`` calls ``os._exit(3)``; ``@N`` fires on the N-th hit
(1-based) instead of the first. This is the only way tests cause faults they could
not otherwise cause at an exact point.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import LocalStateError

__all__ = ["fault_point", "configure", "paused", "FAULT_POINTS", "InjectedFault"]


class InjectedFault(LocalStateError):
    """Raised by a test fault point configured with the ``raise`` action (test
    machinery, not part of the public error hierarchy in :mod:`localstate.errors`)."""

FAULT_POINTS = (
    "commit.before_changelog_flush",
    "commit.after_changelog_flush",
    "commit.after_engine_checkpoint",
    "checkpoint.before_rename",
    "checkpoint.after_rename",
    "snapshot.mid",
    "compaction.before_rename",
    "compaction.mid",
    "restore.mid",
    "standby.mid",
    "standby.before_snapshot",
    "changelog.append",
    "rescale.staging",
    "rescale.before_manifest",
    "rescale.after_manifest",
    "rescale.swap",
    "rescale.after_swap",
    "sink.file.before_rename",
    "sink.file.after_rename",
    "sink.kafka.before_commit",
    "sink.kafka.after_commit",
)

_armed: dict[str, list] = {}
_paused = 0


def configure(spec: str | None) -> None:
    """Arm fault points from a spec string (see module doc); ``None``/"" disarms all."""
    _armed.clear()
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, _, action = part.partition("=")
        action = action or "kill"
        nth = 1
        if "@" in action:
            action, _, n = action.partition("@")
            nth = int(n)
        if action not in ("kill", "raise", "exit"):
            raise ValueError(f"fault action must be kill, raise or exit, not {action!r}")
        _armed[name] = [action, nth]


def fault_point(name: str) -> None:
    """Fire the fault armed at ``name``, if any (a dict lookup when none is)."""
    if not _armed or _paused:
        return
    slot = _armed.get(name)
    if slot is None:
        return
    slot[1] -= 1
    if slot[1] > 0:
        return
    action = slot[0]
    del _armed[name]
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "exit":
        os._exit(3)
    raise InjectedFault(f"injected fault at {name}")


@contextmanager
def paused() -> Iterator[None]:
    """Fault points neither fire nor count inside (the checkpoint a task writes when it
    opens — genesis, a new store — so ``@N`` keeps counting commits)."""
    global _paused
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1


configure(os.environ.get("LOCALSTATE_FAULTS"))

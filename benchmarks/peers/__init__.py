"""Peers that cannot share localstate's virtualenv, run as subprocesses.

Quix Streams 3.28 pins ``confluent-kafka<2.13`` (localstate is tested with 2.16) and would
downgrade pydantic, so it is not a dependency of any extra: a benchmark that compares
with it runs a peer script under the Python named by ``LOCALSTATE_QUIX_PYTHON`` (a
virtualenv of its own), or under this interpreter when it can import quixstreams::

    python3 -m venv /tmp/quix && /tmp/quix/bin/pip install quixstreams==3.28.1
    LOCALSTATE_QUIX_PYTHON=/tmp/quix/bin/python localstate bench --suite kafka,restore,spark

Each peer script prints its figures as one JSON object on its last line of output.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["QUIX_ENV", "QUIX_VERSION", "quix_python", "run_peer"]

QUIX_ENV = "LOCALSTATE_QUIX_PYTHON"


QUIX_VERSION = "3.28.1"
"""The Quix Streams release the figures in RESULTS.md were measured against."""


@functools.cache
def _check_quix(python: str) -> None:
    probe = f"import quixstreams, sys; sys.exit(quixstreams.__version__ != {QUIX_VERSION!r})"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except OSError as e:
        raise RuntimeError(f"{QUIX_ENV}={python!r} cannot be run: {e}") from e
    if done.returncode != 0:
        raise RuntimeError(f"{QUIX_ENV}={python!r} has no quixstreams {QUIX_VERSION} (python3 -m venv q && "
                           f"q/bin/pip install quixstreams=={QUIX_VERSION}, then point the variable at "
                           f"q/bin/python): {done.stderr.strip()[-300:]}")


def quix_python() -> tuple[str | None, str]:
    """The interpreter for a Quix peer, or None; and how it was found (or why not). A
    ``LOCALSTATE_QUIX_PYTHON`` that does not run quixstreams 3.28.1 is an error (before
    minutes of filling a topic, not after), not a silently skipped peer."""
    explicit = os.environ.get(QUIX_ENV)
    if explicit:
        _check_quix(explicit)
        return explicit, f"{QUIX_ENV}={explicit}"
    if importlib.util.find_spec("quixstreams") is not None:
        return sys.executable, "this interpreter"
    return None, (f"quixstreams is not installed here and {QUIX_ENV} is not set (quixstreams 3.28 pins "
                  "confluent-kafka<2.13: install it in its own virtualenv and point the variable at its python)")


def run_peer(python: str, script: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``benchmarks/peers/<script>`` under ``python`` and return the JSON object on the last
    line of its output; a failure raises naming the script and the end of its stderr."""
    path = Path(__file__).with_name(script)
    try:
        proc = subprocess.run([python, str(path), *args], capture_output=True, text=True, timeout=timeout_s)
    except OSError as e:
        raise RuntimeError(f"the peer {script} cannot be run with {python!r}: {e}") from e
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the peer {script} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])

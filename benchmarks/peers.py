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

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["QUIX_ENV", "quix_python", "run_peer"]

QUIX_ENV = "LOCALSTATE_QUIX_PYTHON"


def quix_python() -> tuple[str | None, str]:
    """The interpreter for a Quix peer, or None; and how it was found (or why not)."""
    explicit = os.environ.get(QUIX_ENV)
    if explicit:
        return explicit, f"{QUIX_ENV}={explicit}"
    if importlib.util.find_spec("quixstreams") is not None:
        return sys.executable, "this interpreter"
    return None, (f"quixstreams is not installed here and {QUIX_ENV} is not set (quixstreams 3.28 pins "
                  "confluent-kafka<2.13: install it in its own virtualenv and point the variable at its python)")


def run_peer(python: str, script: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` under ``python`` and return the JSON object on the last
    line of its output; a failure raises naming the script and the end of its stderr."""
    path = Path(__file__).with_name(script)
    proc = subprocess.run([python, str(path), *args], capture_output=True, text=True, timeout=timeout_s)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the peer {script} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])

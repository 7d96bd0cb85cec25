"""Peers that cannot share localstate's virtualenv, run as subprocesses.

Quix Streams 3.28 pins ``confluent-kafka<2.13`` (localstate is tested with 2.16) and would
downgrade pydantic, so it is not a dependency of any extra: a benchmark that compares
with it runs a peer script under the Python named by ``LOCALSTATE_QUIX_PYTHON`` (a
virtualenv of its own), or under this interpreter when it can import quixstreams::

    python3 -m venv /tmp/quix && /tmp/quix/bin/pip install quixstreams==3.28.1
    LOCALSTATE_QUIX_PYTHON=/tmp/quix/bin/python localstate bench --suite kafka,restore,spark

Apache Flink (``apache-flink``, PyFlink with its JVM runtime bundled) likewise pins its own
pyarrow, pandas and numpy: the streaming shape of ``--suite spark`` runs its Flink peer
under the Python named by ``LOCALSTATE_FLINK_PYTHON``::

    python3 -m venv /tmp/flink && /tmp/flink/bin/pip install apache-flink==2.3.0
    LOCALSTATE_FLINK_PYTHON=/tmp/flink/bin/python localstate bench --suite spark

Each peer script prints its figures as one JSON object on its last line of output (the
Flink peer, which serves several runs from one warm JVM, one line per run).
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

__all__ = ["QUIX_ENV", "QUIX_VERSION", "quix_python", "FLINK_ENV", "FLINK_VERSION", "flink_python", "run_peer", "ServedPeer"]

QUIX_ENV = "LOCALSTATE_QUIX_PYTHON"


QUIX_VERSION = "3.28.1"
"""The Quix Streams release the figures in RESULTS.md were measured against."""


FLINK_ENV = "LOCALSTATE_FLINK_PYTHON"

FLINK_VERSION = "2.3.0"
"""The Apache Flink (PyFlink) release the figures in RESULTS.md were measured against."""


@functools.cache
def _check_peer(env: str, python: str, probe: str, package: str) -> None:
    """Raise naming ``env`` unless ``python`` runs ``probe`` (exit 0: ``package`` is there)."""
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except OSError as e:
        raise RuntimeError(f"{env}={python!r} cannot be run: {e}") from e
    if done.returncode != 0:
        raise RuntimeError(f"{env}={python!r} has no {package} (python3 -m venv v && v/bin/pip install "
                           f"{package}, then point the variable at v/bin/python): {done.stderr.strip()[-300:]}")


def quix_python() -> tuple[str | None, str]:
    """The interpreter for a Quix peer, or None; and how it was found (or why not). A
    ``LOCALSTATE_QUIX_PYTHON`` that does not run quixstreams 3.28.1 is an error (before
    minutes of filling a topic, not after), not a silently skipped peer."""
    explicit = os.environ.get(QUIX_ENV)
    if explicit:
        _check_peer(QUIX_ENV, explicit,
                    f"import quixstreams, sys; sys.exit(quixstreams.__version__ != {QUIX_VERSION!r})",
                    f"quixstreams=={QUIX_VERSION}")
        return explicit, f"{QUIX_ENV}={explicit}"
    if importlib.util.find_spec("quixstreams") is not None:
        return sys.executable, "this interpreter"
    return None, (f"quixstreams is not installed here and {QUIX_ENV} is not set (quixstreams 3.28 pins "
                  "confluent-kafka<2.13: install it in its own virtualenv and point the variable at its python)")


def flink_python() -> tuple[str | None, str]:
    """The interpreter for the Flink peer, or None; and how it was found (or why not).
    Only ``LOCALSTATE_FLINK_PYTHON`` is looked at (apache-flink cannot share localstate's
    virtualenv); one that does not run apache-flink 2.3.0 is an error, not a skipped peer."""
    explicit = os.environ.get(FLINK_ENV)
    if not explicit:
        return None, (f"{FLINK_ENV} is not set (apache-flink pins its own pyarrow, pandas and numpy: "
                      f"install apache-flink=={FLINK_VERSION} in its own virtualenv and point the variable "
                      "at its python)")
    _check_peer(FLINK_ENV, explicit,
                f"import sys; from pyflink.version import __version__ as v; sys.exit(v != {FLINK_VERSION!r})",
                f"apache-flink=={FLINK_VERSION}")
    return explicit, f"{FLINK_ENV}={explicit}"


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


class ServedPeer:
    """A peer script that serves several runs from one process (one warm JVM): started with
    ``python benchmarks/peers/<script> ARGS``, it answers each JSON command written to its
    standard input with one line ``<prefix><JSON>`` on standard output (other output lines
    are skipped; standard error goes to ``stderr_path``). The first answer comes unasked,
    when the peer is ready. Use as a context manager: leaving it ends the process."""

    def __init__(self, python: str, script: str, args: list[str], prefix: str, stderr_path: Path) -> None:
        self.script, self.prefix, self.stderr_path = script, prefix, stderr_path
        self._stderr = stderr_path.open("w")
        try:
            self.proc = subprocess.Popen([python, str(Path(__file__).with_name(script)), *args], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        except OSError as e:
            self._stderr.close()
            raise RuntimeError(f"the peer {script} cannot be run with {python!r}: {e}") from e
        self.ready = self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(self.prefix):
                return json.loads(line[len(self.prefix):])
        self.proc.wait(timeout=60)
        self._stderr.flush()
        tail = self.stderr_path.read_text(errors="replace").strip()[-2000:]
        raise RuntimeError(f"the peer {self.script} ended (exit {self.proc.returncode}) without answering: {tail}")

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send ``command`` and return the peer's answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        """Ask the peer to quit; kill it when it has not within 60 s."""
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self._stderr.close()

    def __enter__(self) -> ServedPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

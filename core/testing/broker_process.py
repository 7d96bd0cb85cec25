"""One Kafka-protocol broker process on 127.0.0.1, stopped by its PID: what the tansu and
the Apache Kafka test brokers share (start-up wait, pause, resume, stop).

Standard library only at import time: ``.ci/run`` runs the Apache Kafka module as a plain
script before anything is installed.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import time
from typing import Any

__all__ = ["BrokerProcess"]


class BrokerProcess:
    """A broker subclass provides ``start()``, ``log_tail()`` and ``close()``; it sets
    ``port`` and ``process``. ``name`` says which broker an error is about."""

    name = "broker"
    ready_timeout_s = 60.0
    stop_grace_s = 5.0
    """How long a SIGTERM may take before the broker is killed."""

    port: int
    process: subprocess.Popen[bytes] | None
    _started_by: int | None = None
    """The process that started the broker first (it stops it at its exit)."""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def log_tail(self, nbytes: int = 2000) -> str:
        raise NotImplementedError

    def _answers(self, admin: Any, deadline: float) -> bool:
        """Whether the broker is ready, asked through ``admin`` (an AdminClient)."""
        admin.list_topics(timeout=1.0)
        return True

    def _wait_ready(self) -> None:
        """Wait until the broker answers; its exit or the timeout raise with its log."""
        from confluent_kafka.admin import AdminClient

        if self._started_by is None:
            # a script that dies before its close() (an uncaught error) leaves no broker behind
            self._started_by = os.getpid()
            atexit.register(self._stop_at_exit)
        deadline = time.monotonic() + self.ready_timeout_s
        admin = AdminClient({
            "bootstrap.servers": self.bootstrap,
            "socket.connection.setup.timeout.ms": 1000,
            "logger": logging.getLogger("localstate.testing.kafka"),  # "connection refused" while starting
        })
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode} on port {self.port}; "
                                   f"log: {self.log_tail()}")
            try:
                if self._answers(admin, deadline):
                    return
            except Exception as e:  # KafkaException while the listener comes up
                last = e
            time.sleep(0.1)
        self.stop(kill=True)
        raise RuntimeError(f"{self.name} on {self.bootstrap} was not ready after {self.ready_timeout_s}s ({last})")

    def _stop_at_exit(self) -> None:
        if os.getpid() == self._started_by:  # not in a forked child that inherited the hook
            self.stop(kill=True)

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing is answered."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the broker by PID: SIGTERM (SIGKILL after ``stop_grace_s``), or SIGKILL at
        once if ``kill``. A paused broker is resumed first, so the signal is handled."""
        proc = self.process
        if proc is None:
            return
        self.process = None
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(self, *exc: object) -> None:
        self.close()

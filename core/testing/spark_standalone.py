"""A Spark standalone cluster on this machine, started from the PySpark installation.

``spark-class org.apache.spark.deploy.master.Master`` and one
``org.apache.spark.deploy.worker.Worker`` per worker, as a cluster operator starts
them, each worker with its own work directory and its own local state directory (the
environment variable :data:`WORKER_STATE_ENV`, which the executors a worker launches
inherit: ``job.state.dir = {env:LOCALSTATE_WORKER_STATE_DIR}``)::

    with StandaloneCluster(root, workers=3) as cluster:
        spark_session(cluster.url, ...)

Used by ``tests/test_spark_standalone.py`` and ``localstate bench --suite cluster``
(its standalone runs).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from localstate import LocalStateError

from .processes import EXECUTOR_MAIN, descendants, executor_jvms, kill_all

__all__ = ["StandaloneCluster", "WORKER_STATE_ENV", "EXECUTOR_MAIN", "spark_home"]

WORKER_STATE_ENV = "LOCALSTATE_WORKER_STATE_DIR"
"""Set for each worker (and so for its executors) to that worker's local state directory."""
START_TIMEOUT_S = 120.0


def spark_home() -> Path:
    """The PySpark installation (``SPARK_HOME`` of a pip-installed PySpark)."""
    import pyspark

    return Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` cores, ``memory`` each) under ``root``:
    ``root/master.log``, ``root/worker-<i>/{work,state,worker.log}``. A context manager;
    :meth:`stop` kills every process it started (and the executors they launched)."""

    def __init__(self, root: Path, *, workers: int = 3, cores: int = 1, memory: str = "1g") -> None:
        self.root = Path(root)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self._seen: dict[int, int] = {}

    def worker_dir(self, i: int) -> Path:
        return self.root / f"worker-{i}"

    def _spawn(self, args: list[str], log: Path, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1", **extra_env}
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.processes.append(proc)
        return proc

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker has registered."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                     "--webui-port", str(_free_port())], self.root / "master.log", {})
        for i in range(self.workers):
            wdir = self.worker_dir(i)
            (wdir / "state").mkdir(parents=True, exist_ok=True)
            self._spawn(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(self.cores),
                         "--memory", self.memory, "--work-dir", str(wdir / "work"), "--webui-port",
                         str(_free_port()), self.url],
                        wdir / "worker.log", {WORKER_STATE_ENV: str(wdir / "state"),
                                              "SPARK_LOCAL_DIRS": str(wdir / "local")})
        deadline = time.monotonic() + START_TIMEOUT_S
        log = self.root / "master.log"
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            if text.count("Registering worker") >= self.workers:
                return self
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise LocalStateError(
                    f"the standalone cluster under {self.root} did not start ({len(self.processes)} processes, "
                    f"exited: {dead}); see master.log and worker-*/worker.log there")
            time.sleep(0.25)

    def executors(self) -> dict[str, tuple[int, int]]:
        """Executor JVMs running now: executor id → (worker index, pid)."""
        return {executor: (i, pid) for i, proc in enumerate(self.processes[1:])
                for executor, pid in executor_jvms(proc.pid).items()}

    def stop(self) -> None:
        """Kill the workers' executors, the workers and the master (each by pid)."""
        for proc in self.processes:
            self._seen.update(descendants(proc.pid))
        kill_all(self._seen)
        for proc in reversed(self.processes):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        self.processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

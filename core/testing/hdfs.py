"""A real HDFS for tests: Hadoop's MiniDFSCluster (one NameNode, one DataNode) on
127.0.0.1 with WebHDFS, in a JVM of its own.

Use the fixture ``hdfs_cluster`` (session-scoped :class:`MiniHdfsCluster`; import it
into a test module, or list this module in ``pytest_plugins``). What it needs: Java 17
(``java``, ``javac``) and Maven (``mvn``) on the PATH, and Maven Central once:

* the first time, ``mvn`` resolves ``org.apache.hadoop:hadoop-minicluster`` (and the
  versions Hadoop's own build pins, through its ``hadoop-project`` BOM) into the local
  Maven repository (~105 MB) and writes the classpath, and ``javac`` compiles
  ``MiniHdfs.java`` beside this module; both are cached in :func:`cache_dir` and
  reused while the jars and the source are unchanged (a file lock makes concurrent
  first runs wait for one another);
* every session then starts the cluster in a few seconds and stops it at the end
  (stdin closed, then SIGTERM, then SIGKILL, by PID); a test process that dies closes
  the JVM's stdin too, so no cluster outlives its tests.

The non-shaded ``hadoop-minicluster`` is used on purpose: in the shaded
``hadoop-client-minicluster`` 3.4.1 the NameNode's WebHDFS resources are not found
(every ``/webhdfs/v1`` request answers 404 or 500).
"""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["HADOOP_VERSION", "MiniHdfsCluster", "cache_dir", "prepare", "hdfs_options", "hdfs_cluster"]

HADOOP_VERSION = "3.4.1"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
_SOURCE = Path(__file__).with_name("MiniHdfs.java")
_READY_TIMEOUT_S = 120.0
# Java 17: the JAXB that Jersey uses for WebHDFS answers defines classes through
# java.lang.ClassLoader's internals (without this, the first request may answer 500)
_JVM_FLAGS = ["-Xmx1g", "--add-opens=java.base/java.lang=ALL-UNNAMED"]
_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>localstate.testing</groupId>
  <artifactId>minihdfs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.apache.hadoop</groupId><artifactId>hadoop-project</artifactId>
        <version>{HADOOP_VERSION}</version><type>pom</type><scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>org.apache.hadoop</groupId><artifactId>hadoop-minicluster</artifactId>
      <version>{HADOOP_VERSION}</version>
    </dependency>
    <!-- MiniDFSCluster's readiness check goes through NameNodeAdapter, which uses Mockito -->
    <dependency><groupId>org.mockito</groupId><artifactId>mockito-core</artifactId></dependency>
  </dependencies>
</project>
"""


def cache_dir() -> Path:
    """Where the classpath and the compiled class are kept: ``$LOCALSTATE_HDFS_CACHE``,
    else ``~/.cache/localstate/minihdfs-<hadoop version>``."""
    env = os.environ.get("LOCALSTATE_HDFS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "localstate" / f"minihdfs-{HADOOP_VERSION}"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"the MiniDFSCluster fixture needs {name!r} on the PATH (Java 17 and Maven)")
    return path


def prepare() -> str:
    """The JVM classpath that runs ``MiniHdfs`` (fetching and compiling on first use)."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    stamp = hashlib.sha256(_SOURCE.read_bytes() + _POM.encode()).hexdigest()
    classes, cp_file, stamp_file = cache / "classes", cache / "classpath.txt", cache / "stamp"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent first run waits for this one
        if stamp_file.exists() and stamp_file.read_text() == stamp and cp_file.exists():
            jars = cp_file.read_text().strip()
            if all(Path(j).exists() for j in jars.split(os.pathsep)):
                return f"{classes}{os.pathsep}{jars}"
        stamp_file.unlink(missing_ok=True)
        (cache / "pom.xml").write_text(_POM)
        _run([_tool("mvn"), "-B", "-q", "-f", str(cache / "pom.xml"), f"{_DEPENDENCY_PLUGIN}:build-classpath",
              f"-Dmdep.outputFile={cp_file}"], "fetch the Hadoop jars with Maven", attempts=2)
        jars = cp_file.read_text().strip()
        shutil.rmtree(classes, ignore_errors=True)
        classes.mkdir()
        _run([_tool("javac"), "-d", str(classes), "-cp", jars, str(_SOURCE)], "compile MiniHdfs.java")
        stamp_file.write_text(stamp)
        return f"{classes}{os.pathsep}{jars}"


def _run(cmd: list[str], what: str, attempts: int = 1) -> None:
    """Run ``cmd``; a second attempt (``attempts=2``) rides out a download that failed midway."""
    for attempt in range(attempts):
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
        if done.returncode == 0:
            return
        if attempt + 1 == attempts:
            raise RuntimeError(f"could not {what} ({' '.join(cmd[:6])} …, exit {done.returncode}):\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")


class MiniHdfsCluster:
    """One MiniDFSCluster JVM on 127.0.0.1 (data in a temporary directory), stopped by PID.
    ``conf`` entries are set in its Hadoop configuration (Hadoop's defaults otherwise)."""

    def __init__(self, conf: dict[str, str] | None = None) -> None:
        self.conf = dict(conf or {})
        self.webhdfs_port = 0
        self.rpc_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.start_s = 0.0
        self._dir = Path(tempfile.mkdtemp(prefix="minihdfs-"))
        self.log = self._dir / "minihdfs.log"

    def start(self) -> MiniHdfsCluster:
        classpath = prepare()
        began = time.monotonic()
        ports = self._dir / "ports"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [_tool("java"), *_JVM_FLAGS, "-cp", classpath, "MiniHdfs", str(self._dir / "data"), str(ports),
                 *(f"{k}={v}" for k, v in self.conf.items())],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = began + _READY_TIMEOUT_S
        while not ports.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"MiniDFSCluster exited with code {self.process.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"MiniDFSCluster was not up after {_READY_TIMEOUT_S}s: {self.log_tail()}")
            time.sleep(0.1)
        found = dict(line.split("=", 1) for line in ports.read_text().split())
        self.webhdfs_port, self.rpc_port = int(found["webhdfs"]), int(found["rpc"])
        self._warm_up()
        self.start_s = time.monotonic() - began
        return self

    def _warm_up(self) -> None:
        """One file written, read and deleted through WebHDFS: the JVM's first requests
        take seconds (class loading, JIT), which would otherwise land on the first test."""
        import requests  # here, not at the top: the plug-in loads in test runs without the extra

        base = f"http://127.0.0.1:{self.webhdfs_port}/webhdfs/v1/.warm-up"
        with requests.Session() as s:
            first = s.put(f"{base}?op=CREATE&user.name={getpass.getuser()}", allow_redirects=False, timeout=60)
            s.put(first.headers["Location"], data=b"x", timeout=60).raise_for_status()
            s.get(f"{base}?op=OPEN&user.name={getpass.getuser()}", timeout=60).raise_for_status()
            s.delete(f"{base}?op=DELETE&user.name={getpass.getuser()}", timeout=60).raise_for_status()

    def url(self, path: str = "/") -> str:
        """``webhdfs://127.0.0.1:<port><path>``."""
        return f"webhdfs://127.0.0.1:{self.webhdfs_port}/{path.lstrip('/')}"

    def log_tail(self, nbytes: int = 3000) -> str:
        try:
            return self.log.read_bytes()[-nbytes:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Close the JVM's stdin (it shuts the cluster down), then SIGTERM, then SIGKILL."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and proc.poll() is None:
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=20)
                return
            except subprocess.TimeoutExpired:
                continue

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> MiniHdfsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def hdfs_options(cluster: MiniHdfsCluster, path: str, *, system: str = "s3", **extra: Any) -> dict[str, Any]:
    """``systems.<system>.*`` keys of an objectstore system in ``path`` on ``cluster``."""
    pre = f"systems.{system}"
    opts: dict[str, Any] = {f"{pre}.type": "objectstore", f"{pre}.path": cluster.url(path)}
    opts.update({f"{pre}.{k}": v for k, v in extra.items()})
    return opts


@pytest.fixture(scope="session")
def hdfs_cluster() -> Iterator[MiniHdfsCluster]:
    """The session's MiniDFSCluster (shared: never stop it). Skipped where Java 17 or
    Maven is missing, except under CI (``CI=true``), where that fails the run."""
    missing = [t for t in ("java", "javac", "mvn") if shutil.which(t) is None]
    if missing and os.environ.get("CI") != "true":
        pytest.skip(f"the MiniDFSCluster needs {', '.join(missing)} (Java 17 and Maven) on the PATH")
    cluster = MiniHdfsCluster()
    try:
        cluster.start()
    except (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired) as e:
        cluster.close()
        pytest.fail(f"could not start the MiniDFSCluster: {e}")
    try:
        yield cluster
    finally:
        cluster.close()

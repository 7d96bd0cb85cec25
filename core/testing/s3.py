"""A real S3 API for tests: the ``moto`` server on 127.0.0.1, and a fault-injecting proxy.

Use it as a pytest plugin (``pytest_plugins = ["localstate.testing.s3"]``) to get:

* ``s3_server`` — session-scoped :class:`MotoServer` (``moto_server -H 127.0.0.1 -p PORT``);
* ``s3_bucket`` — a new empty bucket on it per test; yields its name;
* ``fresh_s3_server`` — a server of this test's own, which the test may stop.

moto keeps objects in memory: a stopped and restarted server has lost every bucket.
It honours ``If-None-Match: *`` on PutObject (412 PreconditionFailed), which the
objectstore changelog's fencing relies on.

:class:`FaultProxy` is a **test double** for faults a real S3 endpoint shows but moto
cannot be made to produce on demand: 500 / 503 SlowDown answers, slow answers, and a
connection dropped halfway through an upload. It forwards every other request to moto
unchanged (moto does not check signatures, so the proxy's Host header is fine).
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .kafka import free_port

__all__ = ["MotoServer", "FaultProxy", "objectstore_options", "s3_server", "s3_bucket", "fresh_s3_server",
           "objectstore_where", "QUICK_RETRIES"]

_READY_TIMEOUT_S = 30.0
ACCESS_KEY = "localstate-test"
SECRET_KEY = "localstate-test-secret"
REGION = "us-east-1"


def _moto_binary() -> str:
    candidate = Path(sys.executable).parent / "moto_server"
    if candidate.exists():
        return str(candidate)
    return "moto_server"


class MotoServer:
    """One ``moto_server`` process on 127.0.0.1, stopped by its PID."""

    def __init__(self, port: int | None = None, env: dict[str, str] | None = None) -> None:
        """``env``: extra environment for the server (``INITIAL_NO_AUTH_ACTION_COUNT=0``
        makes it check credentials, as S3 does)."""
        self.port = port or free_port()
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        if self.process is not None and self.process.poll() is None:
            return self
        self.process = subprocess.Popen(
            [_moto_binary(), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env} if self.env else None,
        )
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited with code {self.process.returncode}: {self.log_tail()}")
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).read()
                return self
            except urllib.error.HTTPError:
                return self  # it answers (a server checking credentials refuses the anonymous probe)
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto_server on {self.endpoint} was not ready after {_READY_TIMEOUT_S}s")

    def log_tail(self, nbytes: int = 2000) -> str:
        try:
            return Path(self._log.name).read_bytes()[-nbytes:].decode(errors="replace")
        except OSError:
            return ""

    def client(self) -> Any:
        """A boto3 S3 client for this server (tests use it to inspect and damage objects)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"ls-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """Stop the server by PID (SIGKILL: as abrupt as a lost endpoint). Its data is lost."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def objectstore_options(endpoint: str, bucket: str, prefix: str = "changelog", *, system: str = "s3",
                        **extra: Any) -> dict[str, Any]:
    """``systems.<system>.*`` keys of an objectstore system on a test endpoint."""
    pre = f"systems.{system}"
    opts: dict[str, Any] = {
        f"{pre}.type": "objectstore",
        f"{pre}.path": f"s3://{bucket}/{prefix}",
        f"{pre}.config.endpoint": endpoint,
        f"{pre}.config.access_key_id": ACCESS_KEY,
        f"{pre}.config.secret_access_key": SECRET_KEY,
        f"{pre}.config.region": REGION,
        f"{pre}.client.allow_http": True,
    }
    opts.update({f"{pre}.{k}": v for k, v in extra.items()})
    return opts


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto that injects faults (a test double).

    ``fail(n, status)`` answers the next ``n`` requests (matching ``method`` and a
    ``path_contains`` substring if given) with ``status`` (503 is answered as S3's SlowDown); ``delay_s`` delays every answer;
    ``cut_upload(n)`` reads half the body of the next ``n`` PUTs, forwards that half to
    moto as the whole object, and drops the connection without answering.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.port = free_port()
        self.delay_s = 0.0
        self._fail: list[tuple[int, str | None, str]] = []
        self._cut = 0
        self.seen: list[tuple[str, str, int]] = []  # (method, path, status answered)
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, n: int, status: int = 503, method: str | None = None, path_contains: str = "") -> None:
        with self._lock:
            self._fail.extend([(status, method, path_contains)] * n)

    def clear(self) -> None:
        """Drop the faults not injected yet."""
        with self._lock:
            self._fail.clear()
            self._cut = 0

    def cut_upload(self, n: int = 1) -> None:
        with self._lock:
            self._cut += n

    def _take_fault(self, method: str, path: str) -> int | None:
        with self._lock:
            for i, (status, m, part) in enumerate(self._fail):
                if (m is None or m == method) and part in path:
                    del self._fail[i]
                    return status
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            cut = h.command == "PUT" and self._cut > 0 and length > 1
            if cut:
                self._cut -= 1
        if cut:
            half = h.rfile.read(length // 2)
            self._forward(h, half, length=len(half))
            self.seen.append((h.command, h.path, 0))
            h.close_connection = True
            h.connection.shutdown(2)
            return
        body = h.rfile.read(length) if length else b""
        status = self._take_fault(h.command, h.path)
        if status is not None:
            code = "SlowDown" if status == 503 else "InternalError"
            payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                       f"<Message>injected by FaultProxy</Message></Error>").encode()
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            self.seen.append((h.command, h.path, status))
            return
        resp_status, headers, data = self._forward(h, body, length=length)
        h.send_response(resp_status)
        for k, v in headers:
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
        self.seen.append((h.command, h.path, resp_status))

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes, *, length: int) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("content-length", "connection")}
        headers["Content-Length"] = str(length)
        # moto checks the payload hash it was told about: a cut body must not claim the full one
        if length != int(h.headers.get("Content-Length") or 0):
            headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
            headers.pop("Content-MD5", None)
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """The session's moto S3 server (shared: never stop it; use ``fresh_s3_server``)."""
    try:
        server = MotoServer()
        server.start()
    except (RuntimeError, OSError) as e:
        pytest.fail(f"could not start moto_server (pip install 'moto[server]'): {e}")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def s3_bucket(s3_server: MotoServer) -> str:
    """A new empty bucket on the session's server."""
    return s3_server.create_bucket()


@pytest.fixture
def fresh_s3_server() -> Iterator[MotoServer]:
    """A moto server of this test's own, which the test may stop."""
    with MotoServer() as server:
        yield server


QUICK_RETRIES = {"timeout.ms": 2000, "retries": 2, "retry.backoff.ms": 20}
"""Object-store settings that fail fast in tests (the defaults retry for seconds)."""


@pytest.fixture(params=["s3", "file"])
def objectstore_where(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """``systems.s3.*`` keys of a fresh objectstore location with quick retries: a new
    bucket on the session's moto server, then a ``file://`` directory (the test runs on both)."""
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        return objectstore_options(server.endpoint, server.create_bucket(), **QUICK_RETRIES)
    return {"systems.s3.type": "objectstore", "systems.s3.path": f"file://{tmp_path}/objects",
            **{f"systems.s3.{k}": v for k, v in QUICK_RETRIES.items()}}

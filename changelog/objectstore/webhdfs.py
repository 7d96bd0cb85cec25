"""The ``objectstore`` changelog on HDFS, through WebHDFS (REST over HTTP: no JVM, no
libhdfs, no Hadoop installation on the executors; ``requests`` only).

Configuration (``systems.<name>.*``; everything else as for any objectstore path)::

    systems.hdfs.type = objectstore
    systems.hdfs.path = webhdfs://namenode:9870/state     # the NameNode's HTTP port
    systems.hdfs.path = swebhdfs://namenode:9871/state    # the same over HTTPS
    systems.hdfs.path = hdfs://namenode:8020/state        # the RPC port is not used: WebHDFS
    systems.hdfs.config.webhdfs_port = 9870               # ... runs on this one (hdfs:// only)
    systems.hdfs.config.namenodes = nn1:9870,nn2:9870     # HA: every NameNode's HTTP address
    systems.hdfs.config.user = etl                        # user.name (simple authentication)

**Objects are files**, ``<path>/<key>``, and every operation of the client keeps the
object-store semantics the protocol relies on:

* *A PUT is atomic.* An HDFS file is visible from the moment it is created, while its
  bytes are still on their way to the DataNode, so a reader could see it empty or cut
  short where S3 shows nothing or everything. A PUT therefore writes a hidden temporary
  file beside the key (the two-step ``op=CREATE``: the NameNode answers 307 with a
  DataNode's address, the bytes go there) and then renames it onto the key, one atomic
  NameNode operation; listings never show temporary files.
* *A create is create-if-absent* (S3's ``If-None-Match: *``): the rename is the plain
  ``op=RENAME``, which the NameNode refuses (``{"boolean": false}``) when the key
  exists, atomically against every other create. A create that lost the race raises
  :class:`FileExistsError`, one of :data:`EXISTS` like S3's 412; a retried create whose
  first rename went through but whose answer was lost finds the key and says so too,
  as on S3 (the checkpoint store then recognises its own token). ``op=CREATE`` with
  ``overwrite=false`` alone would not do: its check happens on the DataNode's create,
  and the file it creates is visible before its bytes are.
* A plain PUT renames with ``renameoptions=OVERWRITE`` (atomic replace).
* *Listing is consistent*: the NameNode answers from its namespace. A LIST walks the
  directories under the prefix (one ``LISTSTATUS`` each) and returns the files sorted
  by key, as S3 does.
* A GET of a missing key, and a LIST of a missing prefix, behave as on S3
  (:class:`FileNotFoundError`; an empty list). A DELETE of a missing key is no error.

**Errors and retries** go through :class:`ObjectStoreClient`'s one retry policy: server
errors (5xx), a NameNode in safe mode or standby, retriable NameNode answers, dropped
connections and timeouts are retried with backoff; then :class:`ChangelogError` names
the URL. A refusal that a retry cannot fix (permission denied, Kerberos required, a bad
path) is a :class:`ChangelogError` naming the URL and the fix at once. With several
``namenodes``, a standby or unreachable NameNode sends the next attempt to the next one.

Not supported: Kerberos (SPNEGO) authentication — a secure cluster answers 401, and the
error says so; ``viewfs://`` (its mount table is client-side Hadoop configuration).
A temporary file left by a writer killed between its upload and its rename is garbage,
never read (like a zombie's objects past its fence).
"""

from __future__ import annotations

import getpass
import os
import re
import threading
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from localstate.errors import ChangelogError, ConfigError

from .client import ObjectStoreClient, ObjectStoreSettings

try:
    import requests
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the objectstore changelog on HDFS needs requests: pip install 'localstate[objectstore]'"
    ) from _e

__all__ = ["WebHdfsClient", "HDFS_SCHEMES", "DEFAULT_WEBHDFS_PORT", "check_hdfs_settings"]

HDFS_SCHEMES = frozenset({"hdfs", "webhdfs", "swebhdfs"})
"""URL schemes served by :class:`WebHdfsClient` (``viewfs://`` is refused)."""

DEFAULT_WEBHDFS_PORT = {"webhdfs": 9870, "hdfs": 9870, "swebhdfs": 9871}
"""The NameNode's HTTP(S) port in Hadoop 3 (``dfs.namenode.http-address``)."""

_CONFIG_KEYS = ("user", "webhdfs_port", "namenodes")

_TMP_SUFFIX = ".ls-tmp"
_TMP_NAME = re.compile(r"^\..*\.[0-9a-f]{16}" + re.escape(_TMP_SUFFIX) + r"$")

# NameNode answers that another attempt (later, or on another NameNode) can get past
_RETRIABLE_EXCEPTIONS = frozenset({"StandbyException", "RetriableException", "SafeModeException",
                                   "ObserverRetryOnActiveException", "ConnectException",
                                   "SocketTimeoutException", "EOFException", "IOException"})
_DENIED_EXCEPTIONS = frozenset({"AccessControlException", "SecurityException", "AuthorizationException",
                                "InvalidToken", "SecretManager$InvalidToken"})


def check_hdfs_settings(settings: ObjectStoreSettings, prefix: str) -> None:
    """Refuse an HDFS path this client cannot serve, or settings it would ignore
    (:class:`ConfigError` naming the key and what to write instead)."""
    url = settings.path.strip()
    scheme = url.split("://", 1)[0].lower()
    if scheme not in HDFS_SCHEMES:
        raise ConfigError(
            f"{prefix}.path = {url!r}: {scheme}:// needs Hadoop's client-side mount table, which the "
            "objectstore changelog does not read. Name the NameNode that holds the directory: "
            "webhdfs://namenode:9870/dir (or hdfs://namenode/dir)"
        )
    parts = urlsplit(url)
    if not parts.hostname or parts.path.strip("/") == "":
        raise ConfigError(
            f"{prefix}.path = {url!r}: an HDFS path needs a NameNode and a directory, "
            f"e.g. {scheme}://namenode:{DEFAULT_WEBHDFS_PORT[scheme]}/localstate"
        )
    if settings.client:
        raise ConfigError(
            f"{prefix}.client.{next(iter(settings.client))}: client.* options are obstore's and do not "
            f"apply to HDFS; the WebHDFS client takes {', '.join(f'{prefix}.config.' + k for k in _CONFIG_KEYS)}"
        )
    for key in settings.config:
        if key not in _CONFIG_KEYS:
            raise ConfigError(
                f"{prefix}.config.{key}: not an HDFS setting; the WebHDFS client takes "
                f"{', '.join(f'{prefix}.config.' + k for k in _CONFIG_KEYS)}"
            )
    _namenodes(settings, prefix)


def _namenodes(settings: ObjectStoreSettings, prefix: str) -> list[str]:
    """``host:port`` of every NameNode's HTTP server, the URL's first."""
    parts = urlsplit(settings.path.strip())
    scheme = parts.scheme.lower()
    listed = settings.config.get("namenodes", "")
    if listed:
        nodes = [n.strip() for n in str(listed).split(",") if n.strip()]
        for node in nodes:
            host, _, number = node.rpartition(":")
            if not host or not number.isdigit():
                raise ConfigError(f"{prefix}.config.namenodes = {listed!r}: write host:port[,host:port...] "
                                  "(each NameNode's HTTP address, dfs.namenode.http-address)")
        return nodes
    port_setting = settings.config.get("webhdfs_port")
    if port_setting is not None and scheme != "hdfs":
        raise ConfigError(f"{prefix}.config.webhdfs_port: only for hdfs:// paths; in a {scheme}:// URL "
                          "the port is the WebHDFS port already")
    if scheme == "hdfs":
        # an hdfs:// URL's port is the NameNode's RPC port; WebHDFS is on its HTTP port
        try:
            port = int(port_setting) if port_setting is not None else DEFAULT_WEBHDFS_PORT["hdfs"]
        except ValueError:
            raise ConfigError(f"{prefix}.config.webhdfs_port = {port_setting!r}: must be a port number") from None
    else:
        port = parts.port or DEFAULT_WEBHDFS_PORT[scheme]
    return [f"{parts.hostname}:{port}"]


class _Retry(OSError):
    """A WebHDFS answer or connection failure the retry policy retries (5xx, standby, safe
    mode, refused or dropped connections, timeouts)."""


def _unreachable(e: requests.RequestException, what: str) -> _Retry:
    """A failed or timed-out connection in one line (requests' own text nests three)."""
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", str(e))
    reason = errno.group(0) if errno else type(e).__name__
    return _Retry(f"{what}: {'timed out' if isinstance(e, requests.Timeout) else 'connection failed'} ({reason})")


class WebHdfsClient(ObjectStoreClient):
    """An HDFS directory as an object store, over WebHDFS, with the objectstore
    changelog's retry policy; every error names the URL (see the module docstring)."""

    def __init__(self, settings: ObjectStoreSettings, system: str = "objectstore") -> None:
        self.settings = settings
        self.system = system
        self.url = settings.url
        check_hdfs_settings(settings, f"systems.{system}")
        parts = urlsplit(self.url)
        self._http = "https" if parts.scheme.lower() == "swebhdfs" else "http"
        self._nodes = _namenodes(settings, f"systems.{system}")
        self._active = 0
        self._root = "/" + parts.path.strip("/")
        self._user = str(settings.config.get("user") or os.environ.get("HADOOP_USER_NAME") or getpass.getuser())
        self._timeout = (min(settings.timeout_ms, 10_000) / 1000, settings.timeout_ms / 1000)
        self._local = threading.local()
        self.requests: dict[str, int] = {"put": 0, "get": 0, "list": 0, "delete": 0}
        self.bytes_put = 0
        self.bytes_got = 0

    # -- HTTP ------------------------------------------------------------------------------
    def _setup_problem(self, e: BaseException) -> str | None:
        return None  # WebHDFS answers are read where they arrive (permission, quota, safe mode)

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _path(self, key: str) -> str:
        return f"{self._root}/{key}" if key else self._root

    def _call(self, method: str, key: str, op: str, *, params: Mapping[str, str] | None = None,
              redirect: bool = True, about: str | None = None) -> requests.Response:
        """One WebHDFS request on ``key`` to the active NameNode; an error answer raised as
        FileNotFoundError / FileExistsError / :class:`_Retry` / ChangelogError naming
        ``about`` (the key the caller works on; ``key`` itself by default)."""
        node = self._nodes[self._active]
        url = f"{self._http}://{node}/webhdfs/v1{quote(self._path(key))}"
        query = {"op": op, "user.name": self._user, **(params or {})}
        try:
            resp = self._session().request(method, url, params=query, timeout=self._timeout,
                                           allow_redirects=redirect)
        except requests.RequestException as e:
            if isinstance(e, requests.ConnectionError):
                self._fail_over()
            raise _unreachable(e, f"WebHDFS {op} of {self.where(about or key)} on {self._http}://{node}") from e
        self._check(resp, op, about or key)
        return resp

    def _fail_over(self) -> None:
        """Send the next attempt to the next NameNode (with several configured)."""
        self._active = (self._active + 1) % len(self._nodes)

    def _check(self, resp: requests.Response, op: str, key: str) -> None:
        if resp.status_code < 400:
            return
        exc, message = "", resp.text.strip()
        try:
            remote = resp.json()["RemoteException"]
            exc, message = str(remote.get("exception", "")), str(remote.get("message", "")).split("\n")[0]
        except (ValueError, KeyError, TypeError):
            message = message.splitlines()[0][:200] if message else resp.reason or ""
        what = f"WebHDFS {op} of {self.where(key)} on {resp.url.split('?')[0].split('/webhdfs/')[0]}"
        if exc == "FileNotFoundException" or (resp.status_code == 404 and not exc):
            raise FileNotFoundError(f"{what}: not found: {message}")
        if exc == "FileAlreadyExistsException":
            raise FileExistsError(f"{what}: exists: {message}")
        if exc in ("StandbyException", "ObserverRetryOnActiveException"):
            self._fail_over()
        if resp.status_code >= 500 or exc in _RETRIABLE_EXCEPTIONS:
            raise _Retry(f"{what}: HTTP {resp.status_code} {exc or resp.reason}: {message}")
        if resp.status_code == 401:
            raise ChangelogError(
                f"{what}: HTTP 401, the cluster asks for authentication (Kerberos/SPNEGO), which the "
                "objectstore changelog's WebHDFS client does not do; use a cluster or gateway with simple "
                f"authentication (systems.{self.system}.config.user), or an object store"
            )
        if exc in _DENIED_EXCEPTIONS:
            raise ChangelogError(
                f"{what}: permission denied for user {self._user!r}: {message}. Grant that user write access "
                f"to {self._root} (hdfs dfs -chown / -chmod), or run as its owner with "
                f"systems.{self.system}.config.user; nothing from this operation counts as done"
            )
        if "QuotaExceeded" in exc:
            raise ChangelogError(
                f"{what}: the directory's quota is used up: {message}. Raise it (hdfs dfsadmin -setSpaceQuota / "
                "-setQuota) or free space; nothing from this operation counts as done"
            )
        raise ChangelogError(f"{what}: HTTP {resp.status_code} {exc}: {message}; nothing from this operation "
                             "counts as done")

    # -- the object-store operations --------------------------------------------------------
    def put(self, key: str, data: bytes, *, create: bool = False) -> None:
        """Upload ``data`` to ``key`` atomically; ``create=True`` raises FileExistsError
        if ``key`` exists (a create-if-absent, decided by the NameNode's rename)."""
        head, _, base = key.rpartition("/")
        def op() -> None:
            self.requests["put"] += 1
            tmp = f"{head}{'/' if head else ''}.{base}.{uuid.uuid4().hex[:16]}{_TMP_SUFFIX}"
            rename = {"destination": self._path(key)} if create else {"destination": self._path(key),
                                                                       "renameoptions": "OVERWRITE"}
            try:
                self._upload(tmp, data, key)
                renamed = self._call("PUT", tmp, "RENAME", params=rename, about=key)
            except (OSError, ChangelogError):
                self._discard(tmp)
                raise
            if create and not renamed.json().get("boolean"):
                # the plain rename refuses an existing destination: the create lost the race
                self._discard(tmp)
                if self._exists(key):
                    raise FileExistsError(f"{self.where(key)} exists")
                raise _Retry(f"WebHDFS RENAME onto {self.where(key)} refused, and the key does not exist")
        try:
            self._retry("write", key, op)
        except FileNotFoundError as e:
            raise ChangelogError(
                f"object store: could not write {self.where(key)}: {e}; nothing from this operation counts as done"
            ) from e
        self.bytes_put += len(data)

    def _upload(self, tmp: str, data: bytes, key: str) -> None:
        """The two-step CREATE of ``tmp`` (for ``key``): the NameNode names a DataNode
        (307), the bytes go there."""
        first = self._call("PUT", tmp, "CREATE", params={"overwrite": "false"}, redirect=False, about=key)
        location = first.headers.get("Location")
        if first.status_code != 307 or not location:
            raise _Retry(f"WebHDFS CREATE of {self.where(key)}: the NameNode answered HTTP {first.status_code} "
                         "without a DataNode to write to")
        try:
            resp = self._session().put(location, data=data, timeout=self._timeout,
                                       headers={"Content-Type": "application/octet-stream"})
        except requests.RequestException as e:
            raise _unreachable(e, f"WebHDFS CREATE of {self.where(key)} on the DataNode "
                                  f"{urlsplit(location).netloc}") from e
        self._check(resp, "CREATE", key)

    def _discard(self, key: str) -> None:
        """Best-effort delete of a temporary file (garbage if it fails: never listed)."""
        try:
            self._call("DELETE", key, "DELETE", params={"recursive": "false"})
        except (OSError, ChangelogError):
            pass

    def _exists(self, key: str) -> bool:
        try:
            self._call("GET", key, "GETFILESTATUS")
        except FileNotFoundError:
            return False
        return True

    def get(self, key: str) -> bytes:
        """The file's bytes; raises FileNotFoundError if it is missing."""
        def op() -> bytes:
            self.requests["get"] += 1
            return self._call("GET", key, "OPEN").content
        data: bytes = self._retry("read", key, op)
        self.bytes_got += len(data)
        return data

    def _status(self, prefix: str) -> list[dict[str, Any]]:
        """LISTSTATUS of the directory ``prefix`` (empty if it does not exist)."""
        self.requests["list"] += 1
        try:
            found = self._call("GET", prefix, "LISTSTATUS").json()["FileStatuses"]["FileStatus"]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as e:
            raise _Retry(f"WebHDFS LISTSTATUS of {self.where(prefix)}: unexpected answer ({e})") from e
        return [s for s in found if s.get("pathSuffix") and not _TMP_NAME.match(s["pathSuffix"])]

    def children(self, prefix: str) -> tuple[list[str], list[tuple[str, int]]]:
        """One level under ``prefix`` ("" for the system's root): directory names and
        ``(name, size)`` of the files (for inspection)."""
        def op() -> tuple[list[str], list[tuple[str, int]]]:
            found = self._status(prefix)
            return (sorted(s["pathSuffix"] for s in found if s.get("type") == "DIRECTORY"),
                    sorted((s["pathSuffix"], int(s.get("length", 0))) for s in found if s.get("type") != "DIRECTORY"))
        result: tuple[list[str], list[tuple[str, int]]] = self._retry("list", f"{prefix}/" if prefix else "", op)
        return result

    def delete(self, keys: list[str]) -> None:
        """Delete ``keys`` (files; a missing one is no error)."""
        for key in keys:
            def op(key: str = key) -> None:
                self.requests["delete"] += 1
                self._call("DELETE", key, "DELETE", params={"recursive": "false"})  # false: it was missing
            self._retry("delete", key, op)

    # defined last: in the class body, annotations after it would take ``list`` for this method
    def list(self, prefix: str) -> list[tuple[str, int]]:
        """``(name relative to prefix, size)`` of every file under ``prefix/``, sorted."""
        def op() -> list[tuple[str, int]]:
            out: list[tuple[str, int]] = []
            todo = [""]
            while todo:
                rel = todo.pop()
                for s in self._status("/".join(part for part in (prefix, rel.rstrip("/")) if part)):
                    name = f"{rel}{s['pathSuffix']}"
                    if s.get("type") == "DIRECTORY":
                        todo.append(name + "/")
                    else:
                        out.append((name, int(s.get("length", 0))))
            return sorted(out)
        result: list[tuple[str, int]] = self._retry("list", prefix + "/", op)
        return result

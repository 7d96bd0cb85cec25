"""The object-store client of the ``objectstore`` changelog: settings, one obstore store,
and the retry policy every request goes through (errors name the URL: bucket and key).

Retries are ours, not obstore's (its own are turned off): one policy in one place,
which also covers PUT timeouts (obstore does not retry a PUT that timed out). Server
errors (500, 503 SlowDown), dropped connections and timeouts are retried with
exponential backoff and full jitter, ``retries`` times at most; then
:class:`ChangelogError` names the URL and nothing of the operation counts as done.
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from localstate.errors import ChangelogError, ConfigError
from localstate.options import coerce

from ..directory_store import first_line, link_file

try:
    import obstore
    from obstore.exceptions import (
        AlreadyExistsError,
        BaseError,
        GenericError,
        NotFoundError,
        PreconditionError,
    )
    from obstore.store import from_url
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the objectstore changelog needs obstore: pip install 'localstate[objectstore]'"
    ) from _e

__all__ = ["ObjectStoreSettings", "ObjectStoreClient", "connect", "first_line", "MISSING", "EXISTS"]

log = logging.getLogger("localstate.changelog.objectstore")

T = TypeVar("T")

_MAX_BACKOFF_S = 5.0
MISSING = (NotFoundError, FileNotFoundError)
"""What a GET, PUT or LIST of a missing object (or bucket) raises."""
EXISTS = (AlreadyExistsError, PreconditionError, FileExistsError)
"""What a create (``If-None-Match: *``) of an existing object raises."""


@dataclass(frozen=True)
class ObjectStoreSettings:
    """``systems.<name>.*`` of an object-store changelog system (parsed by the options
    mechanism engines use; ``config.*`` and ``client.*`` pass through to obstore)::

        systems.s3.type = objectstore
        systems.s3.path = s3://bucket/prefix        # gs://, az://, file:///absolute/dir
        systems.s3.config.region = eu-west-1        # obstore store config
        systems.s3.client.allow_http = true         # obstore client options
    """

    path: str = ""
    timeout_ms: int = 30_000
    retries: int = 5
    retry_backoff_ms: int = 100
    rollup_objects: int = 16
    rollup_bytes: int = 64 * 1024 * 1024
    snapshot_every: int = 10
    config: dict[str, str] = field(default_factory=dict)
    client: dict[str, str] = field(default_factory=dict)

    def validate(self, prefix: str) -> None:
        url = self.path.strip()
        if "://" not in url:
            raise ConfigError(
                f"{prefix}.path = {url!r}: the objectstore changelog needs a URL such as "
                "s3://bucket/prefix, gs://bucket/prefix, az://container/prefix or file:///absolute/dir"
            )
        scheme = url.split("://", 1)[0].lower()
        if scheme in _HDFS_SCHEMES:  # served over WebHDFS (objectstore_webhdfs.py)
            from .webhdfs import check_hdfs_settings
            check_hdfs_settings(self, prefix)
        if url.startswith("file://") and not url[len("file://"):].startswith("/"):
            raise ConfigError(f"{prefix}.path = {url!r}: a file:// URL needs an absolute path (file:///dir)")
        for key, value, low in (("timeout.ms", self.timeout_ms, 100), ("retries", self.retries, 0),
                                ("retry.backoff.ms", self.retry_backoff_ms, 0),
                                ("rollup.objects", self.rollup_objects, 2), ("rollup.bytes", self.rollup_bytes, 4096),
                                ("snapshot.every", self.snapshot_every, 0)):
            if value < low:
                raise ConfigError(f"{prefix}.{key} = {value}: must be >= {low}")
        for key, value in self.client.items():
            _client_value(key, value, f"{prefix}.client.{key}")

    @property
    def url(self) -> str:
        return self.path.strip().rstrip("/")

    def client_options(self) -> dict[str, Any]:
        """``client.*`` with obstore's types (booleans for its flags)."""
        return {k: _client_value(k, v, f"client.{k}") for k, v in self.client.items()}


_HDFS_SCHEMES = frozenset({"hdfs", "viewfs", "webhdfs", "swebhdfs"})

_BOOL_CLIENT_KEYS = frozenset({"allow_http", "allow_invalid_certificates", "http1_only", "http2_only"})


def _client_value(key: str, value: Any, where: str) -> Any:
    if key in _BOOL_CLIENT_KEYS:
        return coerce(value, bool, where)
    return str(value)


_NO_BUCKET = "<Code>NoSuchBucket</Code>"
_DENIED = ("<Code>InvalidAccessKeyId</Code>", "<Code>SignatureDoesNotMatch</Code>", "<Code>AccessDenied</Code>",
           "<Code>InvalidToken</Code>", "<Code>ExpiredToken</Code>", "403 Forbidden")
_METADATA_ADDRESS = "169.254.169.254"  # where the AWS SDKs look for instance credentials


def setup_problem(e: BaseException, url: str, system: str) -> str | None:
    """What a request's failure says about the system's settings, when it says something:
    the bucket does not exist, the credentials were refused, or none were configured (the
    client then asked the instance-metadata address). ``None`` for any other failure.
    Such a failure is never retried and never read as a missing object: a GET in a bucket
    that does not exist answers 404 like a missing key, and an empty state must not be
    built from that."""
    text = str(e)
    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    if _NO_BUCKET in text:
        return (f"the bucket {bucket!r} does not exist (systems.{system}.path = {url}). Create it, or fix the "
                f"bucket name in systems.{system}.path or the endpoint in systems.{system}.config.endpoint")
    if _METADATA_ADDRESS in text:
        return (f"no credentials for {url}: none are set, so the client asked the cloud's instance-metadata "
                f"address, which did not answer. Set systems.{system}.config.access_key_id and "
                f"systems.{system}.config.secret_access_key (or the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                "environment variables)")
    if any(code in text for code in _DENIED):
        return (f"the object store refused the credentials for {url} ({first_line(e)[:160]}). Check "
                f"systems.{system}.config.access_key_id / secret_access_key (and the region in "
                f"systems.{system}.config.region), and that they may read and write the bucket {bucket!r}")
    return None


class ObjectStoreClient:
    """One obstore store with the system's retry policy; every error names the URL."""

    missing = MISSING

    def __init__(self, settings: ObjectStoreSettings, system: str = "objectstore") -> None:
        self.settings = settings
        self.system = system
        self.url = settings.url
        client: dict[str, Any] = {"timeout": timedelta(milliseconds=settings.timeout_ms),
                                  "connect_timeout": timedelta(milliseconds=min(settings.timeout_ms, 10_000))}
        client.update(settings.client_options())
        kwargs: dict[str, Any] = {}
        if self.url.startswith("file://"):
            kwargs["mkdir"] = True
        try:
            # Retries are ours (one policy, one place, and it covers PUT timeouts too).
            self.store = from_url(self.url, config=settings.config or None, client_options=client,
                                  retry_config={"max_retries": 0}, **kwargs)
        except (BaseError, ValueError, OSError) as e:
            raise ConfigError(
                f"systems.{system}.path = {self.url!r}: cannot open the object store: {first_line(e)}"
            ) from e
        self.requests: dict[str, int] = {"put": 0, "get": 0, "list": 0, "delete": 0}
        self.bytes_put = 0
        self.bytes_got = 0

    def where(self, key: str) -> str:
        return f"{self.url}/{key}"

    def _setup_problem(self, e: BaseException) -> str | None:
        """:func:`setup_problem` for obstore's answers (a client for another protocol
        overrides this with its own reading of its errors)."""
        return setup_problem(e, self.url, self.system)

    def _retry(self, what: str, key: str, op: Callable[[], T]) -> T:
        s = self.settings
        for attempt in range(s.retries + 1):
            try:
                return op()
            except Exception as e:
                problem = self._setup_problem(e)
                if problem is not None:
                    raise ChangelogError(f"object store: could not {what} {self.where(key)}: {problem}; "
                                         "nothing from this operation counts as done") from e
                if isinstance(e, (NotFoundError, AlreadyExistsError, PreconditionError, FileNotFoundError,
                                  FileExistsError)):
                    raise
                if not isinstance(e, (GenericError, OSError, TimeoutError)):
                    if isinstance(e, BaseError):  # permission, authentication, bad path: not retried
                        raise ChangelogError(
                            f"object store: could not {what} {self.where(key)}: {first_line(e)}"
                        ) from e
                    raise
                if attempt == s.retries:
                    raise ChangelogError(
                        f"object store: could not {what} {self.where(key)} after {attempt + 1} attempt(s): "
                        f"{first_line(e)}. Check that the store is reachable (systems.{self.system}.config."
                        f"endpoint) and the settings under systems.{self.system}.*; nothing from this "
                        "operation counts as done"
                    ) from e
                # full jitter: attempts of many tasks that failed together spread out
                delay = random.uniform(0, min(_MAX_BACKOFF_S, s.retry_backoff_ms / 1000 * 2**attempt))
                log.warning("object store: %s %s failed (%s); retry %d/%d in %.2fs",
                            what, self.where(key), first_line(e), attempt + 1, s.retries, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def put(self, key: str, data: bytes, *, create: bool = False) -> None:
        """Upload ``data``; ``create=True`` fails with AlreadyExistsError if ``key`` exists."""
        def op() -> None:
            self.requests["put"] += 1
            if create:
                obstore.put(self.store, key, data, mode="create")
            else:
                obstore.put(self.store, key, data)
        try:
            self._retry("write", key, op)
        except (NotFoundError, FileNotFoundError) as e:  # a PUT finds no bucket / container
            raise ChangelogError(
                f"object store: could not write {self.where(key)}: {first_line(e)}. Does the bucket exist? "
                f"(systems.{self.system}.path = {self.url}); nothing from this operation counts as done"
            ) from e
        self.bytes_put += len(data)

    def put_file(self, key: str, path: Path) -> tuple[int, int]:
        """Upload the immutable file ``path`` as ``key``; returns its ``(size, CRC32)``.
        In a ``file://`` store on the same filesystem it is hard-linked, not copied."""
        data = path.read_bytes()
        if not (self.url.startswith("file://") and link_file(path, Path(self.url[len("file://"):]) / key)):
            self.put(key, data)
        return len(data), zlib.crc32(data)

    def get(self, key: str) -> bytes:
        """The object's bytes; raises NotFoundError/FileNotFoundError if it is missing."""
        def op() -> bytes:
            self.requests["get"] += 1
            return bytes(obstore.get(self.store, key).bytes())
        data = self._retry("read", key, op)
        self.bytes_got += len(data)
        return data

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """``(name relative to prefix, size)`` of every object under ``prefix/``."""
        def op() -> list[tuple[str, int]]:
            out = []
            self.requests["list"] += 1
            for i, chunk in enumerate(obstore.list(self.store, prefix + "/")):
                self.requests["list"] += i > 0
                for meta in chunk:
                    out.append((meta["path"][len(prefix) + 1:], int(meta["size"])))
            return out
        return self._retry("list", prefix + "/", op)

    def children(self, prefix: str) -> tuple[list[str], list[tuple[str, int]]]:
        """One level under ``prefix`` ("" for the system's root): the names of the
        "directories" and ``(name, size)`` of the objects (for inspection)."""
        def op() -> tuple[list[str], list[tuple[str, int]]]:
            self.requests["list"] += 1
            found = obstore.list_with_delimiter(self.store, prefix or None)
            cut = len(prefix) + 1 if prefix else 0
            return ([p[cut:] for p in found["common_prefixes"]],
                    [(o["path"][cut:], int(o["size"])) for o in found["objects"]])
        return self._retry("list", prefix + "/", op)

    def delete(self, keys: list[str]) -> None:
        if not keys:
            return
        def op() -> None:
            self.requests["delete"] += 1
            try:
                obstore.delete(self.store, keys)
            except (NotFoundError, FileNotFoundError):
                pass  # already gone: a delete is idempotent
        self._retry("delete", keys[0], op)


def connect(settings: ObjectStoreSettings, system: str = "objectstore") -> ObjectStoreClient:
    """The client for ``settings.path``: WebHDFS for an HDFS URL, obstore for the others."""
    if settings.url.split("://", 1)[0].lower() in _HDFS_SCHEMES:
        from .webhdfs import WebHdfsClient
        return WebHdfsClient(settings, system)
    return ObjectStoreClient(settings, system)

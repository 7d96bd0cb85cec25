"""Serving point lookups of a running job's committed state: :class:`StateServer`.

Kafka Streams' interactive queries answer a key from the live local stores of the
instance that holds it. localstate's writer holds its stores' engines (RocksDB takes
the writer's lock) and its local copy holds writes made since the last commit, so a
server keeps **follower copies** of its own instead, one per task it is given, in a
directory of its own (never the job's state dir):

* the copy of task ``p`` is built as the task's own open builds one (the engine picks
  its local state at ``L`` — a copy the server left on an earlier run — and the
  changelog ``[L, C)`` is replayed, ``C`` being the committed offset the checkpoint
  names); afterwards a refresh thread reads the checkpoint every ``refresh_ms`` and,
  when the task committed, reads the changelog ``[C_old, C_new)`` into memory (last
  record per key), checks that the read was exact (the reader's rule: the task has
  committed at most once more meanwhile, so compaction cannot have removed a record of
  the range), and only then applies it to the copy;
* **one commit per answer**: the apply of a commit (a deduplicated batch, already read)
  and every read hold the task copy's lock, so a read sees the state of exactly one
  commit and says which (``version``). Reading the changelog, the slow part, holds no
  lock; the lock is held for one write batch. Nothing is ever applied at or past
  ``C``: an answer is always committed state;
* the writer is never touched: the server takes no lock of the job, opens every
  changelog read-only, reads checkpoints without fencing, and writes only under its
  own directory (where it holds each task's lock, so two servers cannot share a copy);
* a copy is trusted only as far as the task's open would trust it: it is tagged with
  the log it was built from and rebuilt when that log changes (a cut tail, a reset, a
  rescale), when the task's checkpoint goes back (a rollback), when the changelog's
  compaction horizon passes it, and when an engine error shows it damaged (it is then
  deleted and rebuilt from the changelog; until then its keys answer "unavailable",
  never a wrong value).

Keys are routed to tasks by the job's own rule: the store key's routing value
(``stores.<s>.rescale.key``: the key itself by default) hashed as Spark's
``repartition(N, key)`` does (:func:`localstate.partitioning.task_for`). A server
holds some tasks; ``routes`` names the servers of the others, so a lookup of any key
can be sent to any server: it answers from its copy, or forwards the request to the
server that holds the key's task. HTTP (standard library ``ThreadingHTTPServer``,
:mod:`localstate.serving_http`)::

    GET /v1/stores/<store>/keys/<key>       the value, its task and commit version
    GET /v1/stores/<store>/keys?key=a&key=b several keys; each task's keys at one commit
    GET /v1/stores/<store>/range?from=a&to=b&limit=n   keys in [a, b) of this server's tasks
    GET /v1/metadata/<store>/<key>          which task and server hold the key
    GET /v1/tasks                           this server's tasks: version, status, error
    GET /v1/health                          200 when every task is served, else 503

A key in a path is text parsed for the store's key serde as ``localstate get`` parses
it: the text itself for ``string``, a number for ``int``/``long``, JSON for ``json`` and
``tuple``. Answers are JSON; ``bytes`` values are ``{"base64": ...}``.
"""

from __future__ import annotations

import base64
import http.server
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .changelogger import NullChangeLogger
from .checkpoint import Checkpoint
from .config import Config
from .engine import ChangeRecord, StorageEngine, StoreContext, StoreSpec
from .errors import ConfigError, InvalidValueError, LocalStateError
from .kv import KeyValueStore
from .layers import build_store
from .layers.readonly import ReadOnlyStore
from .layers.ttl import ttl_clock
from .layout import job_dir, store_dir, task_lock
from .locking import io_error, remove_tree
from .metrics import StoreMetrics
from .partitioning import task_for
from .reader import READ_ATTEMPTS, _creates_kv, read_checkpoint_readonly, still_exact
from .registry import did_you_mean, resolve_factory
from .rescale_copies import check_layout, claim_local_copy, log_identity
from .rescale_routing import route_of
from .serdes import describe_encode_error, get_serde
from .standby import _skip_reason
from .store_open import engine_phase, open_system, restore_start, task_partition

if TYPE_CHECKING:
    from localstate.changelog.base import ChangelogSystem

__all__ = [
    "StateServer",
    "Lookup",
    "KeyMetadata",
    "TaskStatus",
    "NotLocalError",
    "UnavailableError",
    "UnknownStoreError",
    "parse_key",
    "json_default",
    "free_port",
    "partition_for",
]

log = logging.getLogger("localstate")

HOP_HEADER = "X-Localstate-Forwarded"
"""Set on a request one server forwards to another (:mod:`localstate.serving_http`): the
receiver answers it itself or refuses (421), so a request never travels on (two servers
whose routes disagree cannot loop)."""
MAX_RANGE_LIMIT = 10_000
"""The most keys a range request returns (a range is for dashboards, not for dumps)."""


class NotLocalError(LocalStateError):
    """The key's task is not held by this server; ``partition`` is its task and ``server``
    the base URL of the server that holds it (None: no route is known)."""

    def __init__(self, message: str, partition: int, server: str | None) -> None:
        super().__init__(message)
        self.partition = partition
        self.server = server


class UnknownStoreError(ConfigError, LookupError):
    """The job has no store of that name."""


class UnavailableError(LocalStateError):
    """The task's copy is not served now (being built, rebuilt after damage, or the task has
    not committed yet); try again shortly."""


def parse_key(text: str, serde: str, store: str) -> Any:
    """A key typed as text (a URL path, a command line) as the store's key serde wants it:
    the text for ``string``, its UTF-8 bytes for ``bytes``, a number for ``int``/``long``,
    JSON for the others (a JSON list is a tuple for ``tuple``). :class:`InvalidValueError`
    naming the store and the serde when it does not parse."""
    if serde == "string":
        return text
    if serde == "bytes":
        return text.encode()
    try:
        if serde in ("int", "long"):
            return int(text)
        value = json.loads(text)
    except ValueError as e:
        raise InvalidValueError(f"{text!r} is not a key of store {store!r} (key.serde {serde!r}): {e}") from e
    return tuple(value) if serde == "tuple" and isinstance(value, list) else value


def json_default(obj: Any) -> Any:
    """``json.dumps`` ``default`` for state values: bytes as ``{"base64": ...}``, anything
    else JSON cannot say as its ``repr``."""
    if isinstance(obj, (bytes, bytearray)):
        return {"base64": base64.b64encode(bytes(obj)).decode()}
    return repr(obj)


@dataclass(frozen=True)
class Lookup:
    """The answer to a point lookup: ``value`` (None when ``found`` is False) as of commit
    ``version`` of task ``partition``."""

    store: str
    key: Any
    value: Any
    found: bool
    partition: int
    version: int

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "key": self.key, "value": self.value, "found": self.found,
                "partition": self.partition, "version": self.version}


@dataclass(frozen=True)
class KeyMetadata:
    """Where a key lives (Kafka Streams' ``queryMetadataForKey``): its task, the base URL of
    the server that holds that task (None: no route known), whether that is this server,
    and the version this server's copy holds (None when not local or not ready)."""

    store: str
    key: Any
    partition: int
    server: str | None
    local: bool
    version: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "key": self.key, "partition": self.partition, "server": self.server,
                "local": self.local, "version": self.version}


@dataclass(frozen=True)
class TaskStatus:
    """One task copy of a server: the committed ``version`` it serves (None: not served),
    ``status`` (``serving``, ``building``, ``nothing committed``, ``failed``) and the last
    error, if any."""

    partition: int
    status: str
    version: int | None
    error: str | None = None
    stores: dict[str, int] = field(default_factory=dict)
    """The changelog offset each store's copy equals."""

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "status": self.status, "version": self.version,
                "error": self.error, "stores": dict(self.stores)}


SERVING = "serving"
BUILDING = "building"
NOTHING_COMMITTED = "nothing committed"
FAILED = "failed"


@dataclass
class _StoreCopy:
    spec: StoreSpec
    engine: StorageEngine
    view: KeyValueStore[Any, Any]
    offset: int
    identity: str


class _Rebuild(Exception):
    """The copy cannot be advanced to the new commit; build it again (reason in args)."""


class _TaskCopy:
    """The follower copy of one task: the stores, the commit they equal, and the lock that
    makes an apply and a read exclusive."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.lock = threading.Lock()
        self.stores: dict[str, _StoreCopy] = {}
        self.skipped: dict[str, str] = {}
        self.ckpt: Checkpoint | None = None
        self.status = BUILDING
        self.error: str | None = None
        self.damaged = False
        """Set by a read that got an engine error: the refresher deletes and rebuilds the copy."""
        self.failures = 0
        self.retry_at = 0.0


class StateServer:
    """Serve point lookups of ``config``'s job from follower copies kept in ``directory``.

    ``tasks``: the task partitions this server holds (all by default); ``stores``: the
    key-value stores to serve (every key-value store with a changelog by default);
    ``routes``: ``{partition: base URL}`` of the servers holding other tasks;
    ``refresh_ms``: how often each copy is brought to the task's newest commit;
    ``port``: serve HTTP on ``host:port`` (0: any free port; None: no HTTP, Python API
    only). ``directory`` must not be the job's state dir: the server keeps its own copies.

    :meth:`start` builds every copy (returning when each is served, or has failed with
    its error recorded), then refreshes them in a background thread. A context manager;
    :meth:`close` is idempotent.

    >>> with StateServer(config, "./serving", port=0) as server:   # doctest: +SKIP
    ...     server.get("counts", "user-1")          # Lookup(value=..., version=...)
    ...     server.url                              # http://127.0.0.1:PORT
    """

    def __init__(
        self,
        config: Config,
        directory: str | Path,
        *,
        tasks: Iterable[int] | None = None,
        stores: Iterable[str] | None = None,
        routes: Mapping[int, str] | None = None,
        refresh_ms: int = 100,
        host: str = "127.0.0.1",
        port: int | None = None,
        forward: bool = True,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"StateServer needs a localstate.Config, got {type(config).__name__}")
        self.config = config
        self.job = config.job_name
        self.directory = Path(directory)
        _check_directory(config, self.directory)
        self.copies_config = config.with_overrides({"job.state.dir": str(self.directory)})
        self.tasks = _check_tasks(config, tasks)
        self.specs = _serving_specs(config, stores)
        self.routes = _check_routes(config, routes or {}, self.tasks)
        if isinstance(refresh_ms, bool) or not isinstance(refresh_ms, int) or refresh_ms < 1:
            raise ConfigError(f"refresh_ms must be an int >= 1, got {refresh_ms!r}")
        self.refresh_ms = refresh_ms
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
        self.host, self.port, self.forward = host, port, forward
        self._routers = {name: route_of(spec) for name, spec in self.specs.items()}
        self._copies = {p: _TaskCopy(p) for p in self.tasks}
        self._systems: dict[str, ChangelogSystem] = {}
        self._locks: list[Any] = []
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._http: http.server.ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self.refreshes = 0
        """Refresh passes run so far (a pass looks at every task once)."""

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> StateServer:
        """Bind the HTTP port (if any), take this directory's task locks, build every copy,
        start the refresh thread and the HTTP server. Returns ``self``."""
        if self._started:
            return self
        self._started = True
        try:
            if self.port is not None:
                from .serving_http import bind

                self._http = bind(self, self.host, self.port)
            for p in self.tasks:
                self._locks.append(task_lock(self.copies_config, p))
            self.refresh()
            self._thread = threading.Thread(target=self._refresh_loop, name="localstate-serving-refresh",
                                            daemon=True)
            self._thread.start()
            if self._http is not None:
                self._http_thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.2},
                                                     name="localstate-serving-http", daemon=True)
                self._http_thread.start()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def url(self) -> str | None:
        """``http://host:port`` this server answers on (None without HTTP)."""
        if self._http is None:
            return None
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop the HTTP server and the refresh thread, close the copies (kept on disk for the
        next start) and release the task locks; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._http is not None:
            if self._http_thread is not None:
                self._http.shutdown()
            self._http.server_close()
        if self._thread is not None:
            self._thread.join()
        with self._refresh_lock:
            for copy in self._copies.values():
                with copy.lock:
                    self._drop(copy)
            self._close_systems()
        for lock in self._locks:
            lock.release()
        self._locks.clear()

    def __enter__(self) -> StateServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateServer(job={self.job!r}, tasks={list(self.tasks)}, url={self.url!r})"

    # -- reads -----------------------------------------------------------------------------------
    def partition_for(self, store: str, key: Any) -> int:
        """The task the job routes ``key`` of ``store`` to (its rows' partition)."""
        spec = self._spec(store)
        return self._partition_of(spec, self._encode(spec, key))

    def metadata(self, store: str, key: Any) -> KeyMetadata:
        """Which task holds ``key`` of ``store`` and which server serves that task."""
        p = self.partition_for(store, key)
        copy = self._copies.get(p)
        version = None
        if copy is not None:
            with copy.lock:
                version = None if copy.ckpt is None else copy.ckpt.version
        return KeyMetadata(store, key, p, self.url if copy is not None else self.routes.get(p), copy is not None,
                           version)

    def get(self, store: str, key: Any) -> Lookup:
        """``key``'s committed value in ``store``, from this server's copy of its task.

        :class:`NotLocalError` when another server holds the task (it names it),
        :class:`UnavailableError` while the copy is not served; errors for an unknown
        store and a key the store's serde cannot encode."""
        return self.get_all(store, [key])[0]

    def get_all(self, store: str, keys: Iterable[Any]) -> list[Lookup]:
        """Lookups of ``keys`` in order; the keys of one task are read at one commit."""
        spec = self._spec(store)
        keys = list(keys)
        by_task: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            p = self._partition_of(spec, self._encode(spec, key))
            by_task.setdefault(p, []).append(i)
        out: list[Lookup | None] = [None] * len(keys)
        for p, idx in by_task.items():
            copy = self._local(p, store)
            with copy.lock:
                view, version = self._served(copy, store)
                values = self._read(copy, lambda view=view, idx=idx: [view.get(keys[i]) for i in idx])
            for i, value in zip(idx, values):
                out[i] = Lookup(store, keys[i], value, value is not None, p, version)
        return [x for x in out if x is not None]

    def range(self, store: str, start: Any = None, stop: Any = None, *, limit: int = 100,
              partitions: Iterable[int] | None = None) -> list[Lookup]:
        """The first ``limit`` entries with keys in ``[start, stop)`` over this server's tasks
        (``partitions``: some of them), in encoded-key order as :meth:`KeyValueStore.range`
        (None: unbounded); each task's entries are of one commit (its ``version``)."""
        spec = self._spec(store)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_RANGE_LIMIT:
            raise InvalidValueError(f"limit must be an int in 0..{MAX_RANGE_LIMIT}, got {limit!r}")
        for bound in (start, stop):
            if bound is not None:
                self._encode(spec, bound)
        parts = self.tasks if partitions is None else [self._check_local_partition(p) for p in partitions]
        out: list[tuple[bytes, Lookup]] = []
        for p in parts:
            copy = self._local(p, store)
            with copy.lock:
                view, version = self._served(copy, store)

                def scan(view: Any = view) -> list[tuple[Any, Any]]:
                    with view.range(start, stop) as it:
                        return [kv for kv, _ in zip(it, range(limit))]

                items = self._read(copy, scan)
            out += [(self._encode(spec, k), Lookup(store, k, v, True, p, version)) for k, v in items]
        out.sort(key=lambda pair: pair[0])
        return [lookup for _, lookup in out[:limit]]

    def status(self) -> list[TaskStatus]:
        """Each task copy's state: what it serves, or why not."""
        out = []
        for p, copy in self._copies.items():
            with copy.lock:
                version = None if copy.ckpt is None or copy.status != SERVING else copy.ckpt.version
                out.append(TaskStatus(p, copy.status, version, copy.error,
                                      {n: s.offset for n, s in copy.stores.items()}))
        return out

    def wait_for(self, version: int, *, partitions: Iterable[int] | None = None, timeout: float = 30.0) -> None:
        """Block until every given task's copy (all of this server's by default) serves
        commit ``version`` or a later one; :class:`TimeoutError` after ``timeout`` seconds."""
        wanted = list(self.tasks if partitions is None else partitions)
        deadline = time.monotonic() + timeout
        while True:
            behind = [s for s in self.status() if s.partition in wanted and (s.version is None or s.version < version)]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"tasks {[s.partition for s in behind]} of job {self.job!r} did not reach "
                                   f"version {version} within {timeout}s: {[s.to_dict() for s in behind]}")
            time.sleep(min(0.02, self.refresh_ms / 1000))

    def _spec(self, store: str) -> StoreSpec:
        spec = self.specs.get(store)
        if spec is not None:
            return spec
        if store in self.config.stores:
            raise ConfigError(_not_served(self.config.stores[store]))
        raise UnknownStoreError(f"job {self.job!r} has no store named {store!r}.{did_you_mean(store, self.specs)} "
                          f"Served stores: {', '.join(self.specs) or 'none'}")

    @staticmethod
    def _encode(spec: StoreSpec, key: Any) -> bytes:
        if key is None:
            raise InvalidValueError(f"store {spec.name!r}: None is not a valid key")
        serde = get_serde(spec.key_serde, store=spec.name)
        try:
            return serde.encode(key)
        except Exception as e:
            raise describe_encode_error(spec.name, "key", serde, key, e) from e

    def _partition_of(self, spec: StoreSpec, encoded: bytes) -> int:
        return _routed(spec, self._routers[spec.name], encoded, self.config.partitions)

    def _check_local_partition(self, p: Any) -> int:
        p = task_partition(p)
        if not 0 <= p < self.config.partitions:
            raise InvalidValueError(f"job {self.job!r} has no task {p}: job.partitions = {self.config.partitions}, "
                                    f"so 0..{self.config.partitions - 1}")
        if p not in self._copies:
            raise NotLocalError(f"task {p} of job {self.job!r} is not held by this server (it holds "
                                f"{list(self.tasks)})", p, self.routes.get(p))
        return p

    def _local(self, p: int, store: str) -> _TaskCopy:
        copy = self._copies.get(p)
        if copy is None:
            server = self.routes.get(p)
            where = f"the server at {server}" if server else "no server known here (give its route)"
            raise NotLocalError(f"store {store!r}: the key belongs to task {p} of job {self.job!r}, held by {where}",
                                p, server)
        return copy

    def _served(self, copy: _TaskCopy, store: str) -> tuple[KeyValueStore[Any, Any], int]:
        """Under ``copy.lock``: the store's view and the commit it equals, or UnavailableError."""
        if self._closed:
            raise UnavailableError(f"the state server of job {self.job!r} is closed")
        if copy.status != SERVING or copy.ckpt is None:
            why = f": {copy.error}" if copy.error else ""
            raise UnavailableError(f"task {copy.partition} of job {self.job!r} is not served now ({copy.status}{why})")
        sc = copy.stores.get(store)
        if sc is None:
            raise UnavailableError(f"store {store!r} of task {copy.partition} is not served: "
                                   f"{copy.skipped.get(store, 'not built')}")
        return sc.view, copy.ckpt.version

    def _read(self, copy: _TaskCopy, read: Any) -> Any:
        """Run ``read()`` under ``copy.lock``; an engine error marks the copy damaged (it is
        deleted and rebuilt by the refresher) and is raised as UnavailableError."""
        try:
            return read()
        except (InvalidValueError, ConfigError):
            raise
        except Exception as e:  # the engine failed: never answer from this copy again
            copy.damaged, copy.status = True, FAILED
            copy.error = f"a read failed, the copy is rebuilt: {type(e).__name__}: {e}"
            log.warning("task %d of job %r: %s", copy.partition, self.job, copy.error)
            raise UnavailableError(f"task {copy.partition} of job {self.job!r}: {copy.error}") from e

    # -- refresh -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Bring every task copy to its task's newest commit now (the refresh thread calls
        this every ``refresh_ms``). A task whose refresh fails keeps no copy it cannot
        trust: its status says the error, and it is rebuilt on a later pass (backing off)."""
        with self._refresh_lock:
            if self._closed and self._started:
                return
            for copy in self._copies.values():
                if copy.status == FAILED and time.monotonic() < copy.retry_at and not copy.damaged:
                    continue
                try:
                    self._refresh_task(copy)
                    copy.failures = 0
                except _Rebuild as why:  # nothing trusted was kept: the next pass builds again
                    with copy.lock:
                        copy.status, copy.error = BUILDING, str(why)
                    self._close_systems()  # a new log (a rescale?) is checked against the config again
                except Exception as e:
                    self._failed(copy, e)
            self.refreshes += 1

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_ms / 1000):
            try:
                self.refresh()
            except Exception:  # pragma: no cover - refresh records per-task errors itself
                log.exception("state server of job %r: refresh failed", self.job)

    def _system(self, name: str) -> ChangelogSystem:
        if name not in self._systems:
            self._systems[name] = open_system(self.config, name)
            check_layout(self.config, self._systems[name])
        return self._systems[name]

    def _close_systems(self) -> None:
        """Forget the open changelog systems: the next use opens them again and checks the
        job's layout (:func:`~localstate.rescale_copies.check_layout`) against the config."""
        systems, self._systems = self._systems, {}
        for system in systems.values():
            try:
                system.close()
            except Exception as e:  # a system that fails to close is dropped all the same
                log.warning("state server of job %r: closing %s failed: %s", self.job, system.name, e)

    def _latest(self, p: int) -> Checkpoint | None:
        return read_checkpoint_readonly(self._system(self.config.checkpoint_system).checkpoints(), self.job, p)

    def _refresh_task(self, copy: _TaskCopy) -> None:
        if copy.damaged:
            with copy.lock:
                self._drop(copy, wipe=True)
        ckpt = self._latest(copy.partition)
        if ckpt is None or not ckpt.committed:
            with copy.lock:
                self._drop(copy)
                copy.status, copy.error = NOTHING_COMMITTED, None
            return
        if copy.ckpt is not None and copy.status == SERVING:
            if copy.ckpt == ckpt:
                return
            try:
                self._advance(copy, ckpt)
                return
            except _Rebuild as why:
                log.info("task %d of job %r: its copy is rebuilt (%s)", copy.partition, self.job, why)
                self._close_systems()
        with copy.lock:
            self._drop(copy)
            copy.status = BUILDING
        self._build(copy, ckpt)

    def _failed(self, copy: _TaskCopy, e: BaseException) -> None:
        copy.failures += 1
        backoff = min(30.0, self.refresh_ms / 1000 * 2 ** min(copy.failures, 10))
        with copy.lock:
            try:
                self._drop(copy, wipe=not isinstance(e, LocalStateError) or copy.damaged)
            except LocalStateError as drop_error:  # the copy stays unserved; the next pass tries again
                log.warning("task %d of job %r: %s", copy.partition, self.job, drop_error)
            copy.status, copy.error = FAILED, f"{type(e).__name__}: {e}"
            copy.retry_at = time.monotonic() + backoff
        log.warning("task %d of job %r is not served (retrying in %.1fs): %s", copy.partition, self.job, backoff,
                    copy.error)

    def _drop(self, copy: _TaskCopy, *, wipe: bool = False) -> None:
        """Under ``copy.lock``: stop serving the copy and close its engines; ``wipe`` also
        deletes its files (a damaged copy is rebuilt from the changelog)."""
        stores, copy.stores, copy.ckpt = copy.stores, {}, None
        copy.status = BUILDING
        for sc in stores.values():
            try:
                with engine_phase(sc.spec, "close"):
                    sc.engine.close()
            except LocalStateError as e:
                log.warning("task %d of job %r: %s", copy.partition, self.job, e)
        if wipe:
            for name in self.specs:
                directory = store_dir(self.copies_config, name, copy.partition)
                try:
                    remove_tree(directory)
                except OSError as e:
                    raise io_error(e, "delete the damaged copy in", directory, LocalStateError) from e
            copy.damaged = False

    def _open_changelog(self, spec: StoreSpec, p: int) -> tuple[Any, str]:
        assert spec.changelog is not None
        system_name, stream = spec.changelog
        system = self._system(system_name)
        part = system.open_partition(stream, p, self.config.partitions, readonly=True)
        return part, log_identity(system, part)

    def _build(self, copy: _TaskCopy, ckpt: Checkpoint) -> None:
        """Build every store's copy at ``ckpt`` (from the local copy an earlier run left, if
        the engine keeps it), catch up until the read was exact, persist and publish."""
        p = copy.partition
        built: dict[str, _StoreCopy] = {}
        skipped: dict[str, str] = {}
        try:
            for name, spec in self.specs.items():
                reason = _skip_reason(spec, ckpt)
                if reason is not None:
                    skipped[name] = reason
                    continue
                built[name] = self._build_store(spec, p, ckpt)

            def apply(name: str) -> Callable[[list[ChangeRecord]], None]:
                engine = built[name].engine
                return lambda batch: engine.restore(batch)

            settled = self._settle(p, ckpt, built, apply)
            if settled is None:
                # records of the range may have been compacted away while they were read: the
                # copies are closed unpersisted (the engine drops what it applied) and built again
                raise _Rebuild(f"the task committed faster than its copy could be built (version {ckpt.version})")
            for sc in built.values():
                sc.offset = settled.offsets[sc.spec.name]
                with engine_phase(sc.spec, "persist"):
                    sc.engine.persist(sc.offset)
        except BaseException:
            for sc in built.values():
                try:
                    sc.engine.close()
                except Exception as e:  # the error that got here is the one to report
                    log.warning("store %r of task %d: close failed: %s", sc.spec.name, p, e)
            raise
        with copy.lock:
            copy.stores, copy.skipped, copy.ckpt = built, skipped, settled
            copy.status, copy.error = SERVING, None

    def _build_store(self, spec: StoreSpec, p: int, ckpt: Checkpoint) -> _StoreCopy:
        committed = ckpt.offsets[spec.name]
        part, identity = self._open_changelog(spec, p)
        try:
            if committed > part.end_offset():
                raise part.missing_committed(committed)
            directory = store_dir(self.copies_config, spec.name, p)
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_error(e, "create store directory", directory, LocalStateError) from e
            claim_local_copy(directory, identity, spec.name)
            metrics = StoreMetrics()
            key_serde = get_serde(spec.key_serde, store=spec.name)
            msg_serde = get_serde(spec.msg_serde, store=spec.name)
            context = StoreContext(
                job=self.job, store=spec.name, partition=p, partitions=self.config.partitions, directory=directory,
                change_logger=NullChangeLogger(spec.name, metrics), metrics=metrics, key_serde=key_serde,
                msg_serde=msg_serde, logged=True,
            )
            with engine_phase(spec, "create"):
                engine = resolve_factory(spec.factory, store=spec.name).create(spec, context)
            try:
                start, _fetched = restore_start(spec, engine, part, committed)
                if start < committed:
                    records = (r for batch, _ in part.read_batches(start, committed) for r in batch)
                    with engine_phase(spec, "restore"):
                        engine.restore(records, into_empty=start == 0)
            except BaseException:
                engine.close()
                raise
        finally:
            part.close()
        copy = self._copies[p]
        clock = ttl_clock(spec.ttl, lambda: None if copy.ckpt is None else copy.ckpt.event_time)
        assert isinstance(engine, KeyValueStore)
        view = build_store(engine, name=spec.name, key_serde=key_serde, msg_serde=msg_serde, metered=False,
                           ttl=spec.ttl, clock=clock)
        view = ReadOnlyStore(view, f"a served copy of task {self.job}/partition {p}")
        return _StoreCopy(spec, engine, view, committed, identity)

    def _settle(self, p: int, ckpt: Checkpoint, stores: Mapping[str, _StoreCopy],
                sink: Callable[[str], Callable[[list[ChangeRecord]], None]]) -> Checkpoint | None:
        """Hand each store's records from its copy's offset up to ``ckpt``'s to ``sink(name)``,
        then check the read was exact (:func:`~localstate.reader.still_exact`); if the task
        committed more than once meanwhile, read on to its newest commit and check again.
        The checkpoint the records now reach, or None when the task kept committing faster
        than the records could be read (the next pass tries again)."""
        at = {name: sc.offset for name, sc in stores.items()}
        opened: dict[str, Any] = {}
        """Per store, the changelog partition opened in this pass: opening one (a file log
        reads its active segment) is most of a pass's cost, and a partition opened for one
        commit often already holds the next ones (the task flushes before it commits)."""
        try:
            for _ in range(READ_ATTEMPTS):
                for name, sc in stores.items():
                    if _skip_reason(sc.spec, ckpt) is not None:
                        raise _Rebuild(f"store {name!r} changed its configuration at version {ckpt.version}")
                    target = ckpt.offsets[name]
                    if target < at[name]:
                        raise _Rebuild(f"store {name!r}'s committed offset went back from {at[name]} to {target}")
                    # even with no new record: a rolled-back commit re-done on a cut log reuses offsets
                    part = opened.get(name)
                    if part is None or target > part.end_offset():
                        if part is not None:
                            part.close()
                        part = opened[name] = self._open_checked(sc, p)
                    self._read_records(sc, part, at[name], target, sink(name))
                    at[name] = target
                latest = self._latest(p)
                if latest is None or latest.version < ckpt.version:
                    raise _Rebuild(f"the task went back from version {ckpt.version}")
                if all(still_exact(ckpt, latest, n) for n in stores):
                    return ckpt
                ckpt = latest
            return None
        finally:
            for part in opened.values():
                part.close()

    def _open_checked(self, sc: _StoreCopy, p: int) -> Any:
        """The store's changelog partition, read-only, if it is the log the copy was built
        from (another log: :class:`_Rebuild`)."""
        part, identity = self._open_changelog(sc.spec, p)
        if identity != sc.identity:
            part.close()
            raise _Rebuild(f"store {sc.spec.name!r}'s changelog is another log now ({identity}, was {sc.identity})")
        return part

    @staticmethod
    def _read_records(sc: _StoreCopy, part: Any, start: int, stop: int,
                      sink: Callable[[list[ChangeRecord]], None]) -> None:
        """Hand the store's change records ``[start, stop)`` to ``sink``, batch by batch."""
        if stop > part.end_offset():
            raise part.missing_committed(stop)
        if start < stop:
            for batch, _ in part.read_batches(start, stop):
                sink(batch)
        if start and part.min_valid_snapshot_offset() > start:
            raise _Rebuild(f"store {sc.spec.name!r}'s changelog was compacted past the copy's offset {start}")

    def _advance(self, copy: _TaskCopy, ckpt: Checkpoint) -> None:
        """Read each store's records ``[C_old, C_new)`` into memory (last one per key), until
        the read was exact, then apply them all under the copy's lock: readers see the old
        commit or the new one, never a mix."""
        old = copy.ckpt
        assert old is not None
        if ckpt.version < old.version:
            raise _Rebuild(f"the task went back from version {old.version} to {ckpt.version}")
        deltas: dict[str, dict[bytes, bytes | None]] = {name: {} for name in copy.stores}
        settled = self._settle(copy.partition, ckpt, copy.stores, lambda name: deltas[name].update)
        if settled is None:
            return
        with copy.lock:
            if copy.ckpt is not old:  # dropped meanwhile (a damaged read): the next pass rebuilds
                return
            try:
                for name, delta in deltas.items():
                    sc = copy.stores[name]
                    puts = [(k, v) for k, v in delta.items() if v is not None]
                    deletes = [k for k, v in delta.items() if v is None]
                    with engine_phase(sc.spec, "apply"):
                        engine: Any = sc.engine
                        if puts:
                            engine.put_all(puts)
                        if deletes:
                            engine.delete_all(deletes)
                        engine.persist(settled.offsets[name])
            except BaseException:
                copy.damaged = True  # half applied: never served; deleted and rebuilt
                copy.status = FAILED
                raise
            for name, sc in copy.stores.items():
                sc.offset = settled.offsets[name]
            copy.ckpt = settled


def partition_for(config: Config, store: str, key: Any) -> int:
    """The task ``config``'s job routes ``key`` of key-value store ``store`` to (the
    partition of the input rows it comes from), as :meth:`StateServer.partition_for`."""
    spec = _serving_specs(config, [store])[store]
    return _routed(spec, route_of(spec), StateServer._encode(spec, key), config.partitions)


def _routed(spec: StoreSpec, route: Callable[[bytes], Any], encoded: bytes, partitions: int) -> int:
    """The task of a store key: its routing value (``stores.<s>.rescale.key``) hashed as
    Spark's ``repartition(N, key)`` hashes the input key."""
    value = route(encoded)
    try:
        return task_for(value, partitions, as_int32=getattr(route, "as_int32", False))
    except InvalidValueError as e:
        raise InvalidValueError(
            f"store {spec.name!r}: {e}. If the store's key carries the input key, say where: "
            f"stores.{spec.name}.rescale.key = key[i] (element i of a tuple key)"
        ) from e


def _not_served(spec: StoreSpec) -> str:
    if spec.changelog is None:
        return (f"store {spec.name!r} has no changelog (stores.{spec.name}.changelog): its state lives only in the "
                "running task, so it cannot be served")
    return (f"store {spec.name!r} uses engine {spec.factory!r}, not a key-value engine: it cannot be served by key "
            "(read it with localstate.StateReader)")


def _serving_specs(config: Config, stores: Iterable[str] | None) -> dict[str, StoreSpec]:
    servable = {n: s for n, s in config.stores.items()
                if s.changelog is not None and _creates_kv(resolve_factory(s.factory, store=n))}
    if stores is None:
        return servable
    out = {}
    for name in stores:
        if name not in config.stores:
            raise UnknownStoreError(f"job {config.job_name!r} has no store named {name!r}."
                                    f"{did_you_mean(name, config.stores)}")
        if name not in servable:
            raise ConfigError(_not_served(config.stores[name]))
        out[name] = servable[name]
    return out


def _check_tasks(config: Config, tasks: Iterable[int] | None) -> tuple[int, ...]:
    if tasks is None:
        return tuple(range(config.partitions))
    out = tuple(dict.fromkeys(task_partition(p) for p in tasks))
    bad = [p for p in out if not 0 <= p < config.partitions]
    if bad:
        raise ConfigError(f"tasks {bad} are out of range: job {config.job_name!r} has job.partitions = "
                          f"{config.partitions}, so 0..{config.partitions - 1}")
    if not out:
        raise ConfigError("a state server needs at least one task")
    return out


def _check_routes(config: Config, routes: Mapping[int, str], tasks: tuple[int, ...]) -> dict[int, str]:
    out = {}
    for p, url in routes.items():
        p = task_partition(p)
        if not 0 <= p < config.partitions:
            raise ConfigError(f"route for task {p}: job {config.job_name!r} has tasks 0..{config.partitions - 1}")
        if p in tasks:
            continue  # this server holds it: its own copy answers
        parsed = urllib.parse.urlsplit(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"route for task {p}: {url!r} is not an http:// base URL (e.g. http://127.0.0.1:8001)")
        out[p] = str(url).rstrip("/")
    return out


def _check_directory(config: Config, directory: Path) -> None:
    """The server's copies never live where the job's tasks keep theirs."""
    mine = directory.resolve()
    state, job = config.state_dir.resolve(), job_dir(config).resolve()
    if mine == state or mine.is_relative_to(job) or job.is_relative_to(mine):
        raise ConfigError(
            f"the state server's directory {directory} is (or holds, or lies in) the job's state "
            f"{job}: the server keeps copies of its own and never touches the writer's; give another directory"
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (for tests and examples)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

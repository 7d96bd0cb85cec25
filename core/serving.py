"""Serving point lookups of a running job's committed state: :class:`StateServer`.

A server keeps a follower copy of each task it is given (:mod:`localstate.serving_copies`),
in a directory of its own, brought to the task's newest commit every ``refresh_ms``; it
never touches the writer. Keys are routed to tasks by the job's own rule
(:mod:`localstate.serving_routing`); a key of a task another server holds is forwarded
there. What it answers is in :mod:`localstate.serving_answers`; docs/serving.md states
the rules. HTTP (standard library ``ThreadingHTTPServer``, :mod:`localstate.serving_http`)::

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

import http.server
import logging
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .config import Config
from .engine import StoreSpec
from .errors import ConfigError, InvalidValueError, LocalStateError
from .kv import KeyValueStore
from .layout import task_lock
from .registry import did_you_mean
from .rescale_routing import route_of
from .serving_answers import (
    BUILDING,
    FAILED,
    HOP_HEADER,
    MAX_RANGE_LIMIT,
    SERVING,
    KeyMetadata,
    Lookup,
    NotLocalError,
    TaskStatus,
    UnavailableError,
    UnknownStoreError,
    json_default,
    parse_key,
)
from .serving_copies import FollowerCopies, Rebuild, TaskCopy
from .serving_routing import (
    check_directory,
    check_routes,
    check_tasks,
    encode_key,
    not_served,
    partition_for,
    routed,
    serving_specs,
)
from .store_open import task_partition

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
    "HOP_HEADER",
    "MAX_RANGE_LIMIT",
]

log = logging.getLogger("localstate")


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
        check_directory(config, self.directory)
        self.copies_config = config.with_overrides({"job.state.dir": str(self.directory)})
        self.tasks = check_tasks(config, tasks)
        self.specs = serving_specs(config, stores)
        self.routes = check_routes(config, routes or {}, self.tasks)
        if isinstance(refresh_ms, bool) or not isinstance(refresh_ms, int) or refresh_ms < 1:
            raise ConfigError(f"refresh_ms must be an int >= 1, got {refresh_ms!r}")
        self.refresh_ms = refresh_ms
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
        self.host, self.port, self.forward = host, port, forward
        self._routers = {name: route_of(spec) for name, spec in self.specs.items()}
        self._followers = FollowerCopies(config, self.copies_config, self.specs, self.tasks)
        self._copies = self._followers.copies
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
                    self._followers.drop(copy)
            self._followers.close_systems()
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
        return self._partition_of(spec, encode_key(spec, key))

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
            p = self._partition_of(spec, encode_key(spec, key))
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
                encode_key(spec, bound)
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
            out += [(encode_key(spec, k), Lookup(store, k, v, True, p, version)) for k, v in items]
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
            raise ConfigError(not_served(self.config.stores[store]))
        raise UnknownStoreError(f"job {self.job!r} has no store named {store!r}.{did_you_mean(store, self.specs)} "
                          f"Served stores: {', '.join(self.specs) or 'none'}")

    def _partition_of(self, spec: StoreSpec, encoded: bytes) -> int:
        return routed(spec, self._routers[spec.name], encoded, self.config.partitions)

    def _check_local_partition(self, p: Any) -> int:
        p = task_partition(p)
        if not 0 <= p < self.config.partitions:
            raise InvalidValueError(f"job {self.job!r} has no task {p}: job.partitions = {self.config.partitions}, "
                                    f"so 0..{self.config.partitions - 1}")
        if p not in self._copies:
            raise NotLocalError(f"task {p} of job {self.job!r} is not held by this server (it holds "
                                f"{list(self.tasks)})", p, self.routes.get(p))
        return p

    def _local(self, p: int, store: str) -> TaskCopy:
        copy = self._copies.get(p)
        if copy is None:
            server = self.routes.get(p)
            where = f"the server at {server}" if server else "no server known here (give its route)"
            raise NotLocalError(f"store {store!r}: the key belongs to task {p} of job {self.job!r}, held by {where}",
                                p, server)
        return copy

    def _served(self, copy: TaskCopy, store: str) -> tuple[KeyValueStore[Any, Any], int]:
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

    def _read(self, copy: TaskCopy, read: Any) -> Any:
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
                    self._followers.refresh(copy)
                    copy.failures = 0
                except Rebuild as why:  # nothing trusted was kept: the next pass builds again
                    with copy.lock:
                        copy.status, copy.error = BUILDING, str(why)
                    self._followers.close_systems()  # a new log (a rescale?) is checked against the config again
                except Exception as e:
                    self._failed(copy, e)
            self.refreshes += 1

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_ms / 1000):
            try:
                self.refresh()
            except Exception:  # pragma: no cover - refresh records per-task errors itself
                log.exception("state server of job %r: refresh failed", self.job)


    def _failed(self, copy: TaskCopy, e: BaseException) -> None:
        copy.failures += 1
        backoff = min(30.0, self.refresh_ms / 1000 * 2 ** min(copy.failures, 10))
        with copy.lock:
            try:
                self._followers.drop(copy, wipe=not isinstance(e, LocalStateError) or copy.damaged)
            except LocalStateError as drop_error:  # the copy stays unserved; the next pass tries again
                log.warning("task %d of job %r: %s", copy.partition, self.job, drop_error)
            copy.status, copy.error = FAILED, f"{type(e).__name__}: {e}"
            copy.retry_at = time.monotonic() + backoff
        log.warning("task %d of job %r is not served (retrying in %.1fs): %s", copy.partition, self.job, backoff,
                    copy.error)



def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (for tests and examples)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

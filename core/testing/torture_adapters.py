"""How crash trials drive each engine: one :class:`WorkloadAdapter` per engine type.

Key-value engines use :class:`KeyValueWorkload` (read-modify-write counters); other
engines register an adapter for their own API with :func:`register_adapter` — the
built-in ones here, a plug-in's in its own module (e.g. ``localstate.contrib.latest_events``),
which :func:`adapter_for` imports by resolving the engine first.

A *named workload* exercises a feature over the engine under test rather than the
engine's own API: :class:`TtlTimersWorkload` (``--workload ttl-timers``) kills tasks
around TTL expiry and timer firing, :class:`KeyedStateWorkload` (``--workload
keyed-state``) a task that keeps keyed state handles, :class:`WindowsWorkload`
(``--workload windows``) windows closing in the task's commits. Register more with
:func:`register_workload`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from localstate.errors import ConfigError, LocalStateError
from localstate.kv import KeyValueStore
from localstate.registry import available, did_you_mean, resolve_factory
from localstate.timers import EVENT_TIME, Timers

if TYPE_CHECKING:
    from localstate.storage import TaskStorage

__all__ = [
    "WorkloadAdapter",
    "KeyValueWorkload",
    "TopNWorkload",
    "HyperLogLogWorkload",
    "BloomWorkload",
    "SearchWorkload",
    "TtlTimersWorkload",
    "KeyedStateWorkload",
    "WindowsWorkload",
    "register_adapter",
    "register_workload",
    "workloads",
    "adapter_for",
    "torture_engines",
    "CONTRIB_ENGINES",
]

CONTRIB_ENGINES = (
    "localstate.contrib.sqlite_engine:SQLiteEngineFactory",
    "localstate.contrib.latest_events:LatestEventsFactory",
)
"""The contrib example engines every torture run covers beside the registered ones."""


class WorkloadAdapter(ABC):
    """Drives one engine type with a deterministic workload and shows its state.

    ``apply_batch`` must derive every operation from ``rng`` only (never from time or
    state order), so a batch applied to the same state always has the same effect.
    ``observe`` returns a JSON-serialisable view of the store as a user sees it.
    """

    store_options: dict[str, Any] = {}
    """Options of the store under test (``stores.s.*``, after its factory)."""
    extra_stores: dict[str, dict[str, Any]] = {}
    """More stores the workload uses, by name: their options (``factory`` defaults to the
    engine under test; each gets its own changelog stream)."""
    crash_points: tuple[str, ...] = ()
    """Fault points of this workload that random trials may kill at, beside the commit's."""
    key_value = False
    """Whether the store under test must be a key-value store."""

    def open(self, storage: TaskStorage) -> None:
        """Called with the task's storage each time it is (re)opened, before ``observe``
        or ``apply_batch``: for workloads that need more than the store under test."""

    @abstractmethod
    def apply_batch(self, store: Any, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        """Apply input batch number ``batch`` (1-based) to ``store``."""

    @abstractmethod
    def observe(self, store: Any, keys: int) -> Any:
        """The store's user-visible state (JSON-serialisable)."""

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        """Per-key differences between two ``observe`` results (dicts by default)."""
        lost, extra, differs = [], [], []
        for k in sorted(set(expected) | set(actual)):
            if k not in actual:
                lost.append(k)
            elif k not in expected:
                extra.append(k)
            elif expected[k] != actual[k]:
                differs.append(k)
        return {"lost": lost, "resurrected": extra, "duplicated": [], "differs": differs}


class KeyValueWorkload(WorkloadAdapter):
    """Any KV engine: read-modify-write counters that record which operations hit them.

    A value is ``{"n": updates, "ops": [last 4 operation ids]}``, so an input batch
    applied twice shows as ``n`` too high (**duplicated**) and a lost commit as ``n``
    too low or a missing key (**lost**); a deleted key coming back is **resurrected**.
    """

    store_options = {"key.serde": "string", "msg.serde": "json", "object.cache.size": 16,
                     "write.batch.size": 8}
    key_value = True

    def apply_batch(self, store: KeyValueStore, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        for i in range(ops):
            r = rng.random()
            op = f"{batch}.{i}"
            if r < 0.15:
                store.delete(f"k{rng.randrange(keys)}")
            elif r < 0.25:
                names = sorted({f"k{rng.randrange(keys)}" for _ in range(3)})
                have = store.get_all(names)
                store.put_all([(k, _bump(have.get(k), op)) for k in names])
            else:
                k = f"k{rng.randrange(keys)}"
                store.put(k, _bump(store.get(k), op))

    def observe(self, store: KeyValueStore, keys: int) -> dict[str, Any]:
        with store.all() as it:
            return dict(it)

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        return _by_counter(super().classify(expected, actual), expected, actual, _count_n)


def _count_n(value: Any) -> Any:
    return value.get("n", 0) if isinstance(value, dict) else 0


def _by_counter(out: dict[str, list[str]], expected: Any, actual: Any,
                count: Callable[[Any], Any]) -> dict[str, list[str]]:
    """Split ``out["differs"]`` by a per-key update counter: higher = duplicated, lower = lost."""
    differs, out["differs"] = out["differs"], []
    for k in differs:
        try:
            e, a = count(expected[k]), count(actual[k])
            kind = "duplicated" if a > e else "lost" if a < e else "differs"
        except TypeError:
            kind = "differs"
        out[kind].append(k)
    return out


def _bump(value: Any, op: str) -> dict[str, Any]:
    if value is None:
        return {"n": 1, "ops": [op]}
    return {"n": value["n"] + 1, "ops": (value["ops"] + [op])[-4:]}


class TopNWorkload(WorkloadAdapter):
    """``topn`` (capacity 10): score read-modify-write offers, removes and pops, so a
    replayed batch shows as a score too high (**duplicated**), a lost one as too low."""

    store_options = {"key.serde": "string", "msg.serde": "string", "topn.size": 10}

    def apply_batch(self, store: Any, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        for i in range(ops):
            r = rng.random()
            member = f"k{rng.randrange(keys)}"
            if r < 0.1:
                store.remove(member)
            elif r < 0.13:
                if store.top(1):
                    store.pop()
            else:
                store.offer(member, (store.score(member) or 0) + rng.randrange(1, 100), f"{batch}.{i}")

    def observe(self, store: Any, keys: int) -> dict[str, Any]:
        return {e.member: [rank, e.score, e.payload] for rank, e in enumerate(store.top())}

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        return _by_counter(super().classify(expected, actual), expected, actual, lambda v: v[1])


class HyperLogLogWorkload(WorkloadAdapter):
    """``hyperloglog`` (precision 6): items added per key, a few deletes; the observed
    state is every key's registers, so any lost or extra register update shows."""

    store_options = {"key.serde": "string", "hyperloglog.precision": 6}

    def apply_batch(self, store: Any, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        for _ in range(ops):
            k = f"k{rng.randrange(keys)}"
            r = rng.random()
            if r < 0.05:
                store.delete(k)
            elif r < 0.2:
                store.add_all(k, [f"item{rng.randrange(10_000)}" for _ in range(5)])  # the bulk path
            else:
                store.add(k, f"item{rng.randrange(10_000)}")

    def observe(self, store: Any, keys: int) -> dict[str, Any]:
        return {k: [store.count(k), store.registers(k).tobytes().hex()] for k in sorted(store.keys())}


class SearchWorkload(WorkloadAdapter):
    """``search``: documents with a read-modify-write counter field and words, deletes;
    the observed state is every document read back through the index plus per-word hit
    counts (so the inverted index itself is checked, not only stored documents)."""

    store_options = {"key.serde": "string", "search.fields": "words:text:stored, n:int:stored"}
    _WORDS = 8

    def apply_batch(self, store: Any, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        for _ in range(ops):
            k = f"k{rng.randrange(keys)}"
            if rng.random() < 0.15:
                store.delete(k)
            else:
                old = store.get(k)
                words = " ".join(f"w{rng.randrange(self._WORDS)}" for _ in range(3))
                store.index(k, {"words": words, "n": (old["n"] if old else 0) + 1})

    def observe(self, store: Any, keys: int) -> dict[str, Any]:
        out: dict[str, Any] = dict(store.documents())
        out.update({f"#w{i}": store.count(f"words:w{i}") for i in range(self._WORDS)})
        return out

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        return _by_counter(super().classify(expected, actual), expected, actual, _count_n)


class BloomWorkload(WorkloadAdapter):
    """``bloom`` (keyed, small filters): adds per key and a few key deletes; the observed
    state is every key's filter words, so any lost or extra word update shows."""

    store_options = {"key.serde": "string", "bloom.keyed": True, "bloom.capacity": 200,
                     "bloom.fp.rate": 0.05}

    def apply_batch(self, store: Any, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        for _ in range(ops):
            k = f"k{rng.randrange(keys)}"
            r = rng.random()
            if r < 0.05:
                store.delete(key=k)
            elif r < 0.2:
                store.add_all([f"item{rng.randrange(10_000)}" for _ in range(5)], key=k)  # the bulk path
            else:
                store.add(f"item{rng.randrange(10_000)}", key=k)

    def observe(self, store: Any, keys: int) -> dict[str, Any]:
        return {k: store.words(key=k).tobytes().hex() for k in sorted(store.keys())}


class TtlTimersWorkload(WorkloadAdapter):
    """Event-time TTL and timers over any key-value engine (``--workload ttl-timers``).

    Each batch advances the task's event time by :attr:`STEP_MS`, writes and deletes
    entries of the TTL store under test (``ttl.ms = 2 steps``: an entry not rewritten
    for two batches expires, and the commit's sweep deletes it as a logged tombstone),
    registers timers up to 2.5 steps ahead — one at a time and in batches, some already
    due — deletes some, and fires the due ones, per timer on odd batches and in chunks
    (``fire_batch``) on even ones; some firings register a chained timer that is due at
    once. A firing counts itself into the ``fired`` store in the same commit, so a timer
    fired twice shows as a count of 2 (**duplicated**), a lost firing as a missing count
    or a timer still pending (**lost**), and an expired entry back as **resurrected**.
    The timers live in a store on the engine under test.
    """

    STEP_MS = 100
    store_options = {"key.serde": "string", "msg.serde": "json", "ttl.ms": 2 * STEP_MS, "ttl.time": "event",
                     "object.cache.size": 16, "write.batch.size": 8}
    extra_stores = {
        "timers": {"object.cache.size": 16, "write.batch.size": 8},
        "fired": {"factory": "memory", "key.serde": "string", "msg.serde": "json", "write.batch.size": 8},
    }
    crash_points = ("ttl.after_sweep", "timers.after_fire")
    key_value = True

    def open(self, storage: TaskStorage) -> None:
        self.storage = storage
        self.fired = storage.store("fired")
        self.timers = Timers(storage.store("timers"), EVENT_TIME, lambda: storage.event_time or 0)

    def apply_batch(self, store: KeyValueStore, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        now = batch * self.STEP_MS
        self.storage.advance_event_time(now)
        timers, fired = self.timers, self.fired
        bulk: list[tuple[str, int]] = []
        for i in range(ops):
            k = f"k{rng.randrange(keys)}"
            r = rng.random()
            if r < 0.4:
                store.put(k, {"batch": batch, "op": i})
            elif r < 0.5:
                store.delete(k)
            elif r < 0.7:
                timers.register(k, now + rng.choice((50, 150, 250)))
            elif r < 0.9:
                bulk.append((k, now + rng.choice((0, 100, 200))))  # 0: due now, fires below
            else:
                timers.delete(k, now + 50)  # a timer registered one batch ago at +150
        timers.register_all([k for k, _ in bulk], [t for _, t in bulk])

        def on_timer(key: str, ts: int) -> None:
            name = f"{key}@{ts}"
            fired[name] = fired.get(name, 0) + 1
            if ts % 3 == 0 and not key.startswith("chain-"):
                timers.register(f"chain-{key}", ts)  # due at once: fires in this same call

        def on_timers(keys_: list[str], stamps: list[int]) -> None:
            names = [f"{k}@{t}" for k, t in zip(keys_, stamps)]
            have = fired.get_all(names)
            fired.put_all([(n, have.get(n, 0) + 1) for n in names])
            chained = [(f"chain-{k}", t) for k, t in zip(keys_, stamps) if t % 3 == 0 and not k.startswith("chain-")]
            timers.register_all([k for k, _ in chained], [t for _, t in chained])

        if batch % 2:
            timers.fire(on_timer, up_to=now)
        else:
            timers.fire_batch(on_timers, up_to=now, chunk=7)

    def observe(self, store: KeyValueStore, keys: int) -> dict[str, Any]:
        with store.all() as it:
            out: dict[str, Any] = {f"live:{k}": v for k, v in it}
        with self.fired.all() as it:
            out.update({f"fired:{k}": n for k, n in it})
        out.update({f"timer:{k}@{ts}": 1 for k, ts in self.timers.pending()})
        out["event_time"] = self.storage.event_time
        return out

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        return _by_counter(super().classify(expected, actual), expected, actual,
                           lambda v: v if type(v) is int else 0)


class KeyedStateWorkload(WorkloadAdapter):
    """A task keeping keyed state handles (:mod:`localstate.keyed`) over any key-value
    engine (``--workload keyed-state``), run through :class:`TaskContext` as the Spark
    runner runs it: each batch is an Arrow batch of ``(user, page, n)`` rows handed to
    ``context.process`` with the key column ``user`` (the handles scoped per row), then
    the due event-time timers fire (scoped to the timer's key).

    Per row: the value handle under test (``s``: a per-user counter ``{"n": ...}``, so a
    row applied twice shows as **duplicated**), a list handle (the user's last 4 pages), a
    map handle (per-page counts; ``ttl.ms`` = 2 batches of event time: a page not seen for
    two batches expires), a reducing (sum of ``n``) and an aggregating handle (count and
    max), and a timer 150 ms ahead; the timer clears the user's list and counts its firing
    in the value handle's ``timers`` field. Every handle is a store on the engine under
    test with its own changelog, so the observed state is all of them."""

    STEP_MS = 100
    store_options = {"key.serde": "string", "msg.serde": "json", "object.cache.size": 16, "write.batch.size": 8}
    extra_stores = {
        "recent": {"key.serde": "string", "msg.serde": "json", "object.cache.size": 16, "write.batch.size": 8},
        "pages": {"key.serde": "tuple", "msg.serde": "long", "ttl.ms": 2 * STEP_MS, "ttl.time": "event",
                  "object.cache.size": 16, "write.batch.size": 8},
        "total": {"key.serde": "string", "msg.serde": "long", "object.cache.size": 0},
        "stats": {"key.serde": "string", "msg.serde": "json", "object.cache.size": 16, "write.batch.size": 8},
        "timers": {"object.cache.size": 16, "write.batch.size": 8},
    }
    crash_points = ("ttl.after_sweep", "timers.after_fire")
    key_value = True

    def open(self, storage: TaskStorage) -> None:
        import pyarrow as pa
        from localstate.contrib.spark.task import Emitter, TaskContext

        self.storage = storage
        self.task = _keyed_task()
        self.context = TaskContext(partition=0, partitions=1, config=storage.config, storage=storage,
                                   key_column="user")
        self.task.init(self.context)
        self.emit = Emitter(pa.schema([("user", pa.string())]))
        self._batch = pa.RecordBatch.from_pylist

    def apply_batch(self, store: KeyValueStore, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        self.storage.advance_event_time(batch * self.STEP_MS)
        rows = [{"user": f"u{rng.randrange(keys)}", "page": f"p{rng.randrange(6)}", "n": rng.randrange(1, 10),
                 "ts": batch * self.STEP_MS} for _ in range(ops)]
        self.context.process(self.task, self._batch(rows), self.emit)
        self.context.fire_timers(self.task, self.emit)
        self.emit.drain()

    def observe(self, store: KeyValueStore, keys: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("s", *(n for n in self.extra_stores if n != "timers")):
            with self.storage.store(name).all() as it:
                out.update({f"{name}:{k}": v for k, v in it})
        out.update({f"timer:{k}@{ts}": 1 for k, ts in self.context.timers.pending()})
        out["event_time"] = self.storage.event_time
        return out

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        return _by_counter(super().classify(expected, actual), expected, actual, _count_n)


def _keyed_task() -> Any:
    """The task of :class:`KeyedStateWorkload`: a ``StreamTask`` with ``process`` and
    ``on_timer`` only (defined here, on first use: the Spark extra is imported lazily)."""
    from localstate.contrib.spark.task import StreamTask
    from localstate.keyed import Aggregate

    class KeyedTask(StreamTask):
        def init(self, context: Any) -> None:
            keyed = context.keyed
            self.count = keyed.value("s", dict)
            self.recent = keyed.list("recent", str)
            self.pages = keyed.map("pages", str, int)
            self.total = keyed.reducing("total", int.__add__, int)
            self.stats = keyed.aggregating("stats", Aggregate(lambda: [0, 0], lambda a, n: [a[0] + 1, max(a[1], n)]))
            self.timers = context.timers

        def process(self, record: dict[str, Any], emit: Any) -> None:
            counter = self.count.get() or {"n": 0, "timers": 0}
            self.count.update({**counter, "n": counter["n"] + 1})
            recent = self.recent.get()[-3:]
            self.recent.update([*recent, record["page"]])
            self.pages.put(record["page"], self.pages.get(record["page"], 0) + 1)
            self.total.add(record["n"])
            self.stats.add(record["n"])
            self.timers.register(record["user"], record["ts"] + 150)

        def on_timer(self, key: Any, ts: int, emit: Any) -> None:
            counter = self.count.get()
            self.count.update({**counter, "timers": counter["timers"] + 1})
            self.recent.clear()

    return KeyedTask()

class WindowsWorkload(WorkloadAdapter):
    """Windowed aggregation over any key-value engine (``--workload windows``).

    Each batch feeds out-of-order records (some late) to session windows on the store
    under test (per record on odd batches, as an Arrow batch on even ones) and to
    hopping windows folded in Arrow on a second store of the same engine, then closes
    both at their stream time. Every closed window is counted into the ``emitted`` store
    in the same commit as its close, and so are the late records: a window emitted twice
    shows as a count of 2 (**duplicated**), a lost one as missing, and a window that a
    restore brought back after it closed as an open window too many (**resurrected**).
    """

    STEP = 100
    store_options = {"key.serde": "tuple", "msg.serde": "msgpack", "object.cache.size": 16, "write.batch.size": 8}
    extra_stores = {
        "hopping": {"key.serde": "tuple", "msg.serde": "long", "object.cache.size": 0, "write.batch.size": 8},
        "emitted": {"factory": "memory", "key.serde": "string", "msg.serde": "json", "write.batch.size": 8},
    }
    crash_points = ("windows.after_close",)
    key_value = True

    def open(self, storage: TaskStorage) -> None:
        from localstate.windows import Hopping, Session, Sum, WindowedAggregation

        from .torture_plans import STORE

        self.storage = storage
        self.emitted = storage.store("emitted")
        self.sessions = WindowedAggregation(storage, STORE, Session(60, grace=50), Sum())
        self.hopping = WindowedAggregation(storage, "hopping", Hopping(200, 100, grace=50), Sum())

    def apply_batch(self, store: KeyValueStore, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        import pyarrow as pa

        records = [(f"k{rng.randrange(keys)}", batch * self.STEP + rng.randint(-2 * self.STEP, self.STEP),
                    rng.randint(1, 9)) for _ in range(ops)]
        columns = pa.record_batch({"k": [r[0] for r in records], "t": [r[1] for r in records],
                                   "v": [r[2] for r in records]})
        if batch % 2:
            for k, t, v in records:
                self.sessions.add(k, t, v)
        else:
            self.sessions.add_batch(columns, key="k", time="t", value="v")
        self.hopping.add_batch(columns, key="k", time="t", value="v")
        counts: dict[str, int] = {}
        for kind, op in (("session", self.sessions), ("hopping", self.hopping)):
            for row in op.close().to_pylist():
                name = f"{kind}:{row['key']}@{row['window_start']}-{row['window_end']}={row['value']}"
                counts[name] = counts.get(name, 0) + 1
            counts[f"late:{kind}@{batch}"] = op.late_records
            op.late_records = 0
        have = self.emitted.get_all(list(counts))
        self.emitted.put_all([(k, have.get(k, 0) + n) for k, n in counts.items()])

    def observe(self, store: KeyValueStore, keys: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, view in (("sessions", store), ("hopping", self.storage.store("hopping"))):
            with view.all() as it:
                out.update({f"open:{name}:{k!r}": v for k, v in it})
        with self.emitted.all() as it:
            out.update({f"emitted:{k}": n for k, n in it})
        return out

    def classify(self, expected: Any, actual: Any) -> dict[str, list[str]]:
        return _by_counter(super().classify(expected, actual), expected, actual,
                           lambda v: v if type(v) is int else 0)


_ADAPTERS: dict[str, Callable[[], WorkloadAdapter]] = {
    "topn": TopNWorkload,
    "bloom": BloomWorkload,
    "hyperloglog": HyperLogLogWorkload,
    "search": SearchWorkload,
}


def register_adapter(engine: str, adapter: Callable[[], WorkloadAdapter]) -> None:
    """Use ``adapter()`` to drive engine ``engine`` (a registry name or ``module:Factory``)."""
    _ADAPTERS[engine] = adapter


def _ticks_workload() -> WorkloadAdapter:
    from .torture_ticks import TickSessionsWorkload  # its own module: it imports this one

    return TickSessionsWorkload()


_WORKLOADS: dict[str, Callable[[], WorkloadAdapter]] = {"ttl-timers": TtlTimersWorkload,
                                                       "keyed-state": KeyedStateWorkload,
                                                       "windows": WindowsWorkload,
                                                       "ticks": _ticks_workload}


def register_workload(name: str, adapter: Callable[[], WorkloadAdapter]) -> None:
    """Make ``adapter()`` available as ``localstate torture --workload name``."""
    _WORKLOADS[name] = adapter


def workloads() -> list[str]:
    """The names of the registered workloads."""
    return sorted(_WORKLOADS)


def adapter_for(engine: str, workload: str | None = None) -> WorkloadAdapter:
    """The adapter of ``workload`` if given, else the registered adapter of ``engine``;
    key-value engines default to :class:`KeyValueWorkload`.

    A plug-in engine's module may register its own adapter when it is imported (as the
    contrib ``latest_events`` engine does), so the engine is resolved first."""
    if workload is not None:
        if workload not in _WORKLOADS:
            raise ConfigError(f"unknown torture workload {workload!r}.{did_you_mean(workload, _WORKLOADS)}")
        return _WORKLOADS[workload]()
    if engine not in _ADAPTERS:
        try:
            resolve_factory(engine)
        except LocalStateError:
            pass  # not resolvable here: the trial reports it when it opens the store
    return _ADAPTERS.get(engine, KeyValueWorkload)()


def torture_engines() -> list[str]:
    """Every installed registered engine plus the contrib example engines."""
    return [name for name, row in sorted(available().items()) if row["installed"]] + list(CONTRIB_ENGINES)



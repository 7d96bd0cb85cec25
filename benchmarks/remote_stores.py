"""Local state against a remote store: a stream-table join, looked up locally or over a socket.

The workload: page views ``(user_id, ts)`` enriched with a user-profile table
(``users`` profiles, JSON), in micro-batches of ``batch`` views. Before each batch a
stream of profile updates (``updates`` per batch, the table's changelog) is applied to
the table, so every variant keeps the table current the same way. The same views and
updates, in the same order, go through each variant:

* ``local state``: a :class:`~localstate.TaskStorage` store (rocksdb engine, file
  changelog, default object cache) holds the profiles; updates are ``put_all`` and one
  ``commit`` per batch (the changelog before the checkpoint, as a task does).
* ``redis``: ``redis-server`` on 127.0.0.1 (append-only file, ``appendfsync always``:
  each batch's updates durable before its lookups, as local state's commit makes them);
  updates are one ``MSET`` per batch.
* ``postgresql``: ``postgres`` on 127.0.0.1 (defaults: fsync, synchronous commit);
  updates are one upsert statement (``unnest`` of the batch) per batch, autocommit.

Each in two modes: **per request** (one ``store.get`` / ``GET`` / ``SELECT ... WHERE
id = $1`` per view) and **batched** (the batch's distinct users in one ``get_all`` /
``MGET`` / ``SELECT ... WHERE id = ANY($1)``). Both servers are started by the suite on
free ports in a temporary directory and stopped after; a server or client library that
is missing makes its rows error cells that name what is missing.

Rows: ``lookups <mode>`` (views looked up per second, the lookup calls only),
``join <mode>`` (views enriched per second, counting the updates, the lookups and the
enrichment), ``updates <mode>`` (milliseconds per batch to apply its updates durably), and ``local state × <mode>`` per remote store (local's rate / the remote
store's, per repeat, then the median). Trials are interleaved (one of each variant per
repeat, the order rotated), times are wall-clock (the remote stores' work happens in
their own processes). Every variant's join must give the same result as local
state's, or its rows are error cells.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
from localstate import Config, TaskStorage

from .runner import describe_error, error_row, make_row
from .timing import Stopwatch

__all__ = ["run", "write_chart", "CHART"]

FULL_USERS, QUICK_USERS = 100_000, 2_000
FULL_VIEWS, QUICK_VIEWS = 100_000, 4_000
FULL_BATCH, QUICK_BATCH = 1_000, 500
FULL_UPDATES, QUICK_UPDATES = 50, 20
MODES = ("per request", "batched")
LOCAL = "local state (rocksdb + file changelog)"
REMOTES = ("redis", "postgresql")
CHART = Path(__file__).resolve().parent / "results" / "remote_stores.png"
"""Where a full run writes its chart (only in a source checkout, where the folder exists)."""

_PG_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/*/bin")


class Missing(RuntimeError):
    """A server binary or client library the variant needs is not installed."""


def _profile(uid: int, version: int) -> dict[str, Any]:
    return {"user_id": uid, "name": f"user-{uid}", "country": ("de", "fr", "us", "jp", "br")[uid % 5],
            "plan": ("free", "pro", "team")[(uid + version) % 3], "age": 18 + (uid * 7 + version) % 60}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            if ready():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not accept connections within 60 s (log: {log})")


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the three tables: load(profiles), apply(updates), get(uid), get_many(uids), close() -----------
class LocalTable:
    """The profiles in a localstate store: rocksdb engine, file changelog, a commit per batch."""

    def __init__(self, root: Path) -> None:
        self.storage = TaskStorage(Config.from_dict({
            "job.name": "remote-bench",
            "job.state.dir": str(root / "state"),
            "systems.file.path": str(root / "changelog"),
            "stores.profiles.factory": "rocksdb",
            "stores.profiles.key.serde": "long",
            "stores.profiles.msg.serde": "json",
        }))
        self.store = self.storage.store("profiles")
        self.get = self.store.get
        self.get_many = self.store.get_all

    def load(self, profiles: dict[int, dict[str, Any]]) -> None:
        self.store.put_all(profiles)
        self.storage.commit()

    def apply(self, updates: list[tuple[int, dict[str, Any]]]) -> None:
        self.store.put_all(updates)
        self.storage.commit()

    def close(self) -> None:
        self.storage.close()


class RedisTable:
    """The profiles in Redis, one JSON string per user under ``u:<id>``."""

    def __init__(self, port: int) -> None:
        import redis

        self.client = redis.Redis(host="127.0.0.1", port=port)
        get, mget, loads = self.client.get, self.client.mget, orjson.loads

        def get_one(uid: int) -> Any:
            raw = get(b"u:%d" % uid)
            return None if raw is None else loads(raw)

        def get_many(uids: list[int]) -> dict[int, Any]:
            raws = mget([b"u:%d" % u for u in uids])
            return {u: loads(r) for u, r in zip(uids, raws) if r is not None}

        self.get, self.get_many = get_one, get_many

    def load(self, profiles: dict[int, dict[str, Any]]) -> None:
        items = [(b"u:%d" % u, orjson.dumps(p)) for u, p in profiles.items()]
        for i in range(0, len(items), 10_000):
            self.client.mset(dict(items[i:i + 10_000]))

    def apply(self, updates: list[tuple[int, dict[str, Any]]]) -> None:
        self.client.mset({b"u:%d" % u: orjson.dumps(p) for u, p in updates})

    def close(self) -> None:
        self.client.close()


class PostgresTable:
    """The profiles in PostgreSQL: ``profiles(id bigint primary key, profile text)``."""

    def __init__(self, port: int) -> None:
        import psycopg

        self.conn = psycopg.connect(host="127.0.0.1", port=port, user="bench", dbname="postgres", autocommit=True)
        self.cur = self.conn.cursor()
        self.cur.execute("CREATE TABLE profiles (id bigint PRIMARY KEY, profile text NOT NULL)")
        execute, fetchone, fetchall, loads = self.cur.execute, self.cur.fetchone, self.cur.fetchall, orjson.loads
        one = "SELECT profile FROM profiles WHERE id = %s"
        many = "SELECT id, profile FROM profiles WHERE id = ANY(%s)"

        def get_one(uid: int) -> Any:
            execute(one, (uid,), prepare=True)
            row = fetchone()
            return None if row is None else loads(row[0])

        def get_many(uids: list[int]) -> dict[int, Any]:
            execute(many, (uids,), prepare=True)
            return {u: loads(p) for u, p in fetchall()}

        self.get, self.get_many = get_one, get_many

    def load(self, profiles: dict[int, dict[str, Any]]) -> None:
        with self.cur.copy("COPY profiles (id, profile) FROM STDIN") as copy:
            for u, p in profiles.items():
                copy.write_row((u, orjson.dumps(p).decode()))
        self.cur.execute("ANALYZE profiles")

    def apply(self, updates: list[tuple[int, dict[str, Any]]]) -> None:
        self.cur.execute(
            "INSERT INTO profiles SELECT * FROM unnest(%s::bigint[], %s::text[]) "
            "ON CONFLICT (id) DO UPDATE SET profile = EXCLUDED.profile",
            ([u for u, _ in updates], [orjson.dumps(p).decode() for _, p in updates]), prepare=True)

    def close(self) -> None:
        self.conn.close()


# -- the servers ------------------------------------------------------------------------------------
@contextmanager
def redis_server(root: Path) -> Iterator[int]:
    """``redis-server`` on a free port of 127.0.0.1, its files in ``root``; yields the port."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise Missing("redis-server not found on PATH (Debian: apt-get install redis-server)")
    try:
        import redis
    except ImportError as e:
        raise Missing("the Python client 'redis' is not installed (pip install 'localstate[bench]')") from e
    port, log = _free_port(), root / "redis.log"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root), "--save", "",
         "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--logfile", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping()), proc, "redis-server", log)
        yield port
    finally:
        _stop(proc, signal.SIGTERM)


def _pg_binary(name: str) -> str | None:
    import glob

    found = shutil.which(name)
    if found:
        return found
    for pattern in _PG_DIRS:
        for d in sorted(glob.glob(pattern), reverse=True):
            if os.access(os.path.join(d, name), os.X_OK):
                return os.path.join(d, name)
    return None


@contextmanager
def postgres_server(root: Path) -> Iterator[int]:
    """A fresh PostgreSQL cluster (``initdb``) served by ``postgres`` on a free port of
    127.0.0.1, trust auth for user ``bench``; yields the port. As root, it runs as the
    ``postgres`` (else ``nobody``) account, since PostgreSQL refuses to run as root."""
    initdb, postgres = _pg_binary("initdb"), _pg_binary("postgres")
    if initdb is None or postgres is None:
        missing = " and ".join(n for n, b in (("initdb", initdb), ("postgres", postgres)) if b is None)
        raise Missing(f"{missing} not found on PATH, /usr/local/bin or /usr/lib/postgresql/*/bin "
                      "(Debian: apt-get install postgresql)")
    try:
        import psycopg
    except ImportError as e:
        raise Missing("the Python client 'psycopg' is not installed (pip install 'localstate[bench]')") from e
    user: str | None = None
    data = root / "pg"
    data.mkdir()
    if os.geteuid() == 0:
        import pwd

        for name in ("postgres", "nobody"):
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            user = name
            os.chmod(root, 0o755)
            os.chown(data, pw.pw_uid, pw.pw_gid)
            break
    log = root / "postgres.log"
    with open(log, "wb") as out:
        done = subprocess.run([initdb, "-D", str(data), "-U", "bench", "--auth=trust", "-E", "UTF8", "--no-sync"],
                              stdout=out, stderr=subprocess.STDOUT, user=user)
    if done.returncode:
        raise RuntimeError(f"initdb exited with {done.returncode}: {log.read_text(errors='replace')[-2000:]}")
    port = _free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [postgres, "-D", str(data), "-p", str(port), "-k", str(data), "-c", "listen_addresses=127.0.0.1"],
            stdout=out, stderr=subprocess.STDOUT, user=user)
    def accepts() -> bool:
        psycopg.connect(host="127.0.0.1", port=port, user="bench", dbname="postgres", connect_timeout=2).close()
        return True

    try:
        _wait(accepts, proc, "postgres", log)
        yield port
    finally:
        _stop(proc, signal.SIGINT)  # fast shutdown


# -- the join ---------------------------------------------------------------------------------------
def _workload(users: int, views: int, batch: int, updates: int) -> tuple[list[list[int]], list[list[tuple[int, dict[str, Any]]]]]:
    """Page views' user ids per batch (uniform over the users), and the updates applied before each batch."""
    rng = random.Random(29)
    ids = [rng.randrange(users) for _ in range(views)]
    batches = [ids[i:i + batch] for i in range(0, views, batch)]
    changes = [[(u, _profile(u, b + 1)) for u in rng.sample(range(users), updates)] for b in range(len(batches))]
    return batches, changes


def _join(
    table: Any, mode: str, batches: list[list[int]], changes: list[list[tuple[int, dict[str, Any]]]]
) -> tuple[float, float, float, int]:
    """One pass of the stream: (lookup seconds, update seconds, total seconds, a checksum of the join's output)."""
    get, get_many, apply = table.get, table.get_many, table.apply
    lookup, applying, total = Stopwatch(), Stopwatch(), Stopwatch()  # each summed over the batches
    checksum = 0
    for ids, upd in zip(batches, changes):
        with total:
            with applying:
                apply(upd)
            with lookup:
                if mode == "per request":
                    profiles = [get(u) for u in ids]
                else:
                    found = get_many(list(dict.fromkeys(ids)))
                    profiles = list(map(found.get, ids))
            enriched = [(u, ts, p["country"], p["plan"], p["age"]) for ts, (u, p) in enumerate(zip(ids, profiles))]
            checksum += sum(e[4] for e in enriched) + sum(1 for e in enriched if e[3] == "pro")
    return lookup.wall, applying.wall, total.wall, checksum


def run(quick: bool = False, repeats: int = 5, chart: Path | None = None) -> list[dict[str, Any]]:
    """The rows of the suite (see the module docstring); a full run also writes :data:`CHART`."""
    users = QUICK_USERS if quick else FULL_USERS
    views = QUICK_VIEWS if quick else FULL_VIEWS
    batch = QUICK_BATCH if quick else FULL_BATCH
    per_batch = QUICK_UPDATES if quick else FULL_UPDATES
    repeats = max(repeats, 3)
    params = {"users": users, "views": views, "batch": batch, "updates per batch": per_batch, "repeats": repeats}
    batches, changes = _workload(users, views, batch, per_batch)
    profiles = {u: _profile(u, 0) for u in range(users)}
    load_before = os.getloadavg()

    root = Path(tempfile.mkdtemp(prefix="ls-remote-bench-"))
    os.chmod(root, 0o755)  # postgres runs as another account (see postgres_server) and needs to reach its folder
    errors: dict[str, str] = {}
    got: dict[tuple[str, str], list[tuple[float, float, int, float]]] = {}
    tables: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        with ExitStack() as stack:
            for name, make in ((LOCAL, lambda: LocalTable(root / "local")),
                               ("redis", lambda: RedisTable(stack.enter_context(redis_server(_mkdir(root / "redis"))))),
                               ("postgresql", lambda: PostgresTable(stack.enter_context(postgres_server(_mkdir(root / "postgresql")))))):
                try:
                    table = make()
                    stack.callback(table.close)
                    table.load(profiles)
                    tables[name] = table
                except Missing as e:
                    errors[name] = f"missing: {e}"
                except Exception as e:
                    errors[name] = describe_error(e)
            variants = [(name, mode) for mode in MODES for name in tables]
            # (name, mode) -> [(lookups/s, events/s, checksum, ms per batch of updates)] per timed repeat
            got.update({v: [] for v in variants})
            failed: set[tuple[str, str]] = set()
            for i in range(repeats + 1):  # the first is the warm-up
                shift = i % max(len(variants), 1)
                for name, mode in variants[shift:] + variants[:shift]:
                    if (name, mode) in failed:
                        continue
                    try:
                        lookup, applying, total, checksum = _join(tables[name], mode, batches, changes)
                    except Exception as e:
                        errors[f"{name}/{mode}"] = describe_error(e)
                        failed.add((name, mode))
                        continue
                    if i:
                        got[(name, mode)].append(
                            (views / lookup, views / total, checksum, applying / len(batches) * 1000))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = f"load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}"

    medians: dict[tuple[str, str, str], float] = {}
    for mode in MODES:
        local_runs = got.get((LOCAL, mode), []) if LOCAL in tables else []
        for kind, unit, idx in (("lookups", "lookups/s", 0), ("join", "events/s", 1), ("updates", "ms/batch", 3)):
            for name in (LOCAL, *REMOTES):
                workload = f"{kind} {mode}"
                err = errors.get(name) or errors.get(f"{name}/{mode}")
                runs = got.get((name, mode), [])
                if not err and local_runs and [r[2] for r in runs] != [r[2] for r in local_runs]:
                    err = f"the join's result differs from local state's: {[r[2] for r in runs]} != {[r[2] for r in local_runs]}"
                if err or not runs:
                    rows.append(error_row(workload, name, params, unit, err or "no trials ran", load))
                    continue
                rows.append(make_row(workload, name, params, unit, [r[idx] for r in runs], notes=load))
                medians[(kind, mode, name)] = rows[-1]["median"]
        for name in REMOTES:
            for kind, idx in (("lookups", 0), ("join", 1)):
                workload = f"local state × {kind} {mode}"
                runs = got.get((name, mode), [])
                bad = next((r for r in rows if r["engine"] in (name, LOCAL) and r["workload"] == f"{kind} {mode}"
                            and r["error"]), None)
                if bad is not None:
                    rows.append(error_row(workload, name, params, "×", f"{bad['engine']}: {bad['error']}", load))
                    continue
                ratios = [loc[idx] / rem[idx] for loc, rem in zip(local_runs, runs)]
                rows.append(make_row(workload, name, params, "×", ratios, notes=f"local state's rate / {name}'s, "
                                     f"per repeat; {load}"))
    if chart is None and not quick and CHART.parent.is_dir():
        chart = CHART
    if chart is not None:
        try:
            write_chart(rows, chart)
        except ImportError as e:
            rows.append(error_row("chart", "-", params, "", f"missing: {e} (pip install 'localstate[bench]')", load))
    return rows


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_chart(rows: list[dict[str, Any]], path: Path) -> Path:
    """Lookups/s per store and mode (log scale), each remote bar labelled "local N× faster" (or slower)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["workload"], r["engine"]): r for r in rows if not r.get("error")}
    stores = (LOCAL, *REMOTES)
    labels = ("local state\n(rocksdb + file changelog)", "Redis\n(127.0.0.1)", "PostgreSQL\n(127.0.0.1)")
    colors = ("#2a7d4f", "#c0392b", "#2c6fbb")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    width = 0.26
    for j, (store, label, color) in enumerate(zip(stores, labels, colors)):
        xs, heights = [], []
        for i, mode in enumerate(MODES):
            row = by.get((f"lookups {mode}", store))
            if row is not None:
                xs.append(i + (j - 1) * width)
                heights.append(row["median"])
        bars = ax.bar(xs, heights, width, label=label.replace("\n", " "), color=color)
        for bar, mode in zip(bars, [m for m in MODES if (f"lookups {m}", store) in by]):
            text = f"{bar.get_height():,.0f}/s"
            ratio = by.get((f"local state × lookups {mode}", store))
            if ratio is not None:
                x = ratio["median"]
                text += f"\nlocal {x:.{0 if x >= 10 else 1}f}× faster" if x >= 1 else f"\nlocal {1 / x:.1f}× slower"
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 2), textcoords="offset points")
    params: dict[str, Any] = next((r["params"] for r in rows if r.get("params")), {})
    ax.set_yscale("log")
    ax.set_xticks(range(len(MODES)), [f"{m} lookups" for m in MODES])
    ax.set_ylabel("profile lookups per second (log)")
    ax.set_title(f"Stream-table join: profile lookups, local state vs a remote store\n"
                 f"{params.get('users', '?'):,} users, {params.get('views', '?'):,} views in batches of "
                 f"{params.get('batch', '?'):,}, medians of {params.get('repeats', '?')}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.margins(y=0.25)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

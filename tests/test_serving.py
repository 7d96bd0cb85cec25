"""The serving path (:class:`localstate.serving.StateServer`, ``localstate serve``): point
lookups of a running job's committed state from follower copies kept at the newest commit.

Real engines (RocksDB, memory), the real file changelog, the session's Kafka broker and
moto S3 server; the job's writer is a separate process committing while readers hammer
the server; ``localstate serve`` is a real subprocess, SIGKILLed and restarted; routing is
checked against a real Spark job's partitioning.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from localstate import (
    Config,
    ConfigError,
    InvalidValueError,
    LocalStateError,
    SerializationError,
    StateReader,
    TaskStorage,
)
from localstate.layout import store_dir
from localstate.partitioning import task_for
from localstate.rescale_copies import TAG_FILE
from localstate.serving import (
    HOP_HEADER,
    NotLocalError,
    StateServer,
    UnknownStoreError,
    free_port,
)
from localstate.store_open import Recovery

from tests.test_standby import changelog_values
from tests.test_state_reader import _tree_digest

STORE = "balances"


def _values(tmp_path: Path, where: str, engine: str, request: pytest.FixtureRequest, partitions: int = 2
            ) -> dict[str, Any]:
    name = f"serving{random.randrange(1 << 30)}"
    values: dict[str, Any] = {
        "job.name": name,
        "job.partitions": partitions,
        "job.state.dir": str(tmp_path / "state"),
        "systems.file.path": str(tmp_path / "changelog"),
        f"stores.{STORE}.factory": engine,
        f"stores.{STORE}.key.serde": "string",
        f"stores.{STORE}.msg.serde": "json",
        "stores.local.factory": "memory",
        "stores.local.changelog": "none",
    }
    values.update(changelog_values(where, STORE, f"{name}-balances", request))
    return values


def _keys_of(task: int, partitions: int, n: int, prefix: str = "acct") -> list[str]:
    """``n`` keys the job routes to ``task``."""
    out, i = [], 0
    while len(out) < n:
        k = f"{prefix}{i}"
        if task_for(k, partitions) == task:
            out.append(k)
        i += 1
    return out


def _committed(config: Config, partition: int) -> dict[str, Any]:
    with StateReader(config, partition) as reader:
        return dict(reader.store(STORE))


def _http(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# -- one commit per answer, beside a running writer ---------------------------------------------

WRITER = textwrap.dedent("""
    import json, sys, time
    from localstate import Config, TaskStorage
    values, keys, commits, pause = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    # optional: a file the readers write the newest commit they saw into; the writer waits
    # (up to 30 s) for its readers before the next commit, so a slow refresh on a loaded
    # machine cannot let the commits pass unseen
    ack = sys.argv[5] if len(sys.argv) > 5 else None

    def wait_seen(v):
        deadline = time.monotonic() + 30
        while ack and time.monotonic() < deadline:
            try:
                if int(open(ack).read() or 0) >= v:
                    return
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.005)
    config = Config.from_dict(values)
    with TaskStorage(config, 0) as s:
        store = s.store("balances")
        for _ in range(commits):
            v = (s.checkpoint.version if s.checkpoint else 0) + 1
            # every key of the commit holds v; one of them is deleted in odd commits (a
            # tombstone in the delta), and the total is kept as its own key
            for k in keys:
                store[k] = {"v": v}
            if v % 2:
                del store[keys[-1]]
            store["total"] = {"v": v, "n": len(keys) - v % 2}
            store.flush()
            s.changelog("balances").flush()   # uncommitted records in the engine and the changelog
            time.sleep(pause)
            assert s.commit().version == v
            print(v, flush=True)
            wait_seen(v)
""")


def _check_one_commit(results: list[dict[str, Any]], keys: list[str], seen: list[int]) -> None:
    """Every key of one answer holds the commit number the answer reports (never a mix of two
    commits, never an uncommitted value), and versions never go back."""
    version = results[0]["version"]
    assert {r["version"] for r in results} == {version}
    for r in results:
        if r["key"] == keys[-1] and version % 2:
            assert not r["found"], r
        elif r["key"] == "total":
            assert r["value"] == {"v": version, "n": len(keys) - version % 2}, r
        else:
            assert r["value"] == {"v": version}, r
    assert not seen or version >= seen[-1], (seen[-1], version)
    seen.append(version)


CASES = [("file", "rocksdb"), ("file", "memory"), ("kafka", "rocksdb"), ("objectstore", "rocksdb")]


@pytest.mark.parametrize(("where", "engine"), CASES, ids=[f"{w}-{e}" for w, e in CASES])
def test_reads_beside_a_running_writer_see_one_commit_only(tmp_path: Path, where: str, engine: str,
                                                          request: pytest.FixtureRequest) -> None:
    values = _values(tmp_path, where, engine, request, partitions=1)
    config = Config.from_dict(values)
    keys = [f"acct{i}" for i in range(40)]
    # a remote checkpoint takes ~0.1 s to read: the writer commits a few times a second there
    commits, pause = (40, 0.02) if where == "file" else (12, 0.3)
    with TaskStorage(config, 0) as s:  # version 1 exists before the server starts
        s.store(STORE).put_all({k: {"v": 1} for k in keys} | {"total": {"v": 1, "n": len(keys) - 1}})
        s.store(STORE).delete(keys[-1])
        s.commit()
    ack = tmp_path / "seen"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(values), json.dumps(keys), str(commits),
                               str(pause), str(ack)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen_api: list[int] = []
    seen_http: list[int] = []
    errors: list[BaseException] = []

    def acknowledge() -> None:
        """Tell the writer the newest commit both readers have seen (it waits for it)."""
        if seen_api and seen_http:
            tmp = ack.with_suffix(".tmp")
            tmp.write_text(str(min(seen_api[-1], seen_http[-1])))
            os.replace(tmp, ack)
    with StateServer(config, tmp_path / "serving", port=0, refresh_ms=5) as server:
        url = f"{server.url}/v1/stores/{STORE}/keys?" + urllib.parse.urlencode([("key", k) for k in [*keys, "total"]])

        def hammer_http() -> None:
            try:
                while writer.poll() is None:
                    status, body, _ = _http(url)
                    assert status == 200, body
                    _check_one_commit(body["results"], keys, seen_http)
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=hammer_http)
        thread.start()
        try:
            while writer.poll() is None:
                _check_one_commit([x.to_dict() for x in server.get_all(STORE, [*keys, "total"])], keys, seen_api)
                acknowledge()
                with_range = server.range(STORE, "acct", "acct~", limit=100)
                assert len({x.version for x in with_range}) == 1
                assert all(x.value == {"v": x.version} for x in with_range)
        finally:
            thread.join()
        out, err = writer.communicate()
        assert writer.returncode == 0, err
        assert not errors, errors
        last = commits + 1
        server.wait_for(last)
        assert dict((x.key, x.value) for x in server.range(STORE, limit=1000)) == _committed(config, 0)
    # the readers saw the commits go by, not one frozen version
    assert len(set(seen_api)) > 3 and seen_api[-1] <= last, seen_api[-5:]
    assert len(set(seen_http)) > 3, seen_http[-5:]


KILL_POINTS = ["commit.after_changelog_flush", "commit.after_engine_checkpoint", "checkpoint.before_rename",
               "checkpoint.after_rename"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_writer_sigkilled_mid_commit_never_shows_through(tmp_path: Path, point: str,
                                                           request: pytest.FixtureRequest) -> None:
    """Crash trial: the job's writer is SIGKILLed at a point of its 4th commit while readers
    hammer the server; then the job runs again (its open cuts the dead attempt's tail). Every
    answer, across both, is one commit's state, and the end state is the committed one."""
    values = _values(tmp_path, "file", "rocksdb", request, partitions=1)
    config = Config.from_dict(values)
    keys = [f"acct{i}" for i in range(20)]
    with TaskStorage(config, 0) as s:
        s.store(STORE).put_all({k: {"v": 1} for k in keys} | {"total": {"v": 1, "n": len(keys) - 1}})
        s.store(STORE).delete(keys[-1])
        s.commit()
    seen: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    with StateServer(config, tmp_path / "serving", refresh_ms=5) as server:
        def hammer() -> None:
            try:
                while not stop.is_set():
                    try:
                        results = server.get_all(STORE, [*keys, "total"])
                    except LocalStateError as e:  # unavailable while its copy is rebuilt: fine
                        assert "not served" in str(e), e
                        continue
                    _check_one_commit([x.to_dict() for x in results], keys, seen)
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            env = {**os.environ, "LOCALSTATE_FAULTS": f"{point}=kill@4"}
            killed = subprocess.run([sys.executable, "-c", WRITER, json.dumps(values), json.dumps(keys), "8", "0.01"],
                                    env=env, capture_output=True, text=True, timeout=120)
            assert killed.returncode == -signal.SIGKILL, killed.stderr
            again = subprocess.run([sys.executable, "-c", WRITER, json.dumps(values), json.dumps(keys), "3", "0.01"],
                                   capture_output=True, text=True, timeout=120)
            assert again.returncode == 0, again.stderr
            last = int(again.stdout.split()[-1])
            server.wait_for(last)
            # the reader's answer in flight may predate the server reaching `last`: let it
            # read at least once more before it is stopped
            deadline = time.monotonic() + 30
            while not errors and (not seen or seen[-1] != last) and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            stop.set()
            thread.join()
        assert not errors, errors
        assert {x.key: x.value for x in server.range(STORE, limit=1000)} == _committed(config, 0)
    assert seen[-1] == last and len(set(seen)) > 2


def test_a_rolled_back_commit_on_a_cut_changelog_is_rebuilt_not_mixed(tmp_path: Path,
                                                                      request: pytest.FixtureRequest) -> None:
    """The file log cuts an uncommitted tail on the writer's next open and reuses its offsets
    for new records: a copy at the old offsets must be rebuilt from the new log."""
    config = Config.from_dict(_values(tmp_path, "file", "rocksdb", request, partitions=1))
    with TaskStorage(config, 0) as s:
        s.store(STORE).put_all({"a": 1, "b": 2})
        s.commit()
    with StateServer(config, tmp_path / "serving") as server:
        assert server.get(STORE, "a").value == 1
        with TaskStorage(config, 0) as s:
            s.store(STORE).put_all({"a": 10, "c": 30})
            s.store(STORE).flush()
            s.changelog(STORE).flush()  # a tail that never commits (the attempt dies)
        server.refresh()
        assert server.get(STORE, "a").value == 1 and not server.get(STORE, "c").found
        with TaskStorage(config, 0) as s:  # the next attempt: the tail is cut, offsets reused
            s.store(STORE).put_all({"b": 20, "d": 40})
            assert s.commit().version == 2
        server.wait_for(2)
        got = {k: server.get(STORE, k) for k in "abcd"}
        assert {k: g.value for k, g in got.items() if g.found} == {"a": 1, "b": 20, "d": 40} == _committed(config, 0)
        assert {g.version for g in got.values()} == {2}


def test_a_commit_undone_and_done_again_at_the_same_offsets_is_rebuilt(tmp_path: Path,
                                                                        request: pytest.FixtureRequest) -> None:
    """A task that goes back to its previous checkpoint (a re-run batch) cuts the log and
    commits the same version again at the same offsets: the copy must notice the new log."""
    config = Config.from_dict(_values(tmp_path, "file", "rocksdb", request, partitions=1))
    with TaskStorage(config, 0) as s:
        s.store(STORE).put_all({"a": 1, "b": 2})
        s.commit()
        s.store(STORE).put_all({"a": 10, "c": 30})
        s.commit()
    with StateServer(config, tmp_path / "serving", refresh_ms=10**6) as server:  # refreshed by hand
        assert (server.get(STORE, "a").value, server.get(STORE, "a").version) == (10, 2)
        with TaskStorage(config, 0, recovery=Recovery(use_previous_checkpoint=True)) as s:
            s.store(STORE).put_all({"b": 20, "d": 40})
            assert s.commit().version == 2 and s.committed_offset(STORE) == server.status()[0].stores[STORE]
        server.refresh()
        got = {k: server.get(STORE, k) for k in "abcd"}
        assert {k: g.value for k, g in got.items() if g.found} == {"a": 1, "b": 20, "d": 40} == _committed(config, 0)


def test_a_ttl_store_hides_what_the_task_hides_as_of_the_served_commit(tmp_path: Path,
                                                                       request: pytest.FixtureRequest) -> None:
    """Event-time TTL: "now" is the event time committed with the commit the copy serves, so
    an expired, unswept entry is hidden as the task and StateReader hide it, and an entry
    expires in the copy when (and only when) a commit moves the event time past it."""
    values = _values(tmp_path, "file", "rocksdb", request, partitions=1)
    values.update({f"stores.{STORE}.ttl.ms": "1000", f"stores.{STORE}.ttl.time": "event",
                   f"stores.{STORE}.ttl.cleanup.batch": "0"})
    config = Config.from_dict(values)
    with TaskStorage(config, 0) as s:
        s.advance_event_time(0)
        s.store(STORE)["old"] = {"n": 1}
        s.advance_event_time(600)
        s.store(STORE)["new"] = {"n": 2}
        s.advance_event_time(1000)  # "old" expired, not swept
        s.commit()
    with StateServer(config, tmp_path / "serving", refresh_ms=10) as server:
        assert not server.get(STORE, "old").found and server.get(STORE, "new").value == {"n": 2}
        assert [x.key for x in server.range(STORE)] == ["new"] == list(_committed(config, 0))
        with TaskStorage(config, 0) as s:
            s.advance_event_time(1700)  # "new" (written at 600) expires; no record changes
            s.commit()
        server.wait_for(2)
        assert not server.get(STORE, "new").found and server.range(STORE) == [] == list(_committed(config, 0))


def test_a_rescaled_job_is_refused_by_a_server_of_the_old_layout(tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    """After `localstate rescale` the keys live in other tasks: a server still configured
    for the old task count stops answering (naming the fix) instead of answering from the
    old layout; one started with the new count answers exactly."""
    from localstate.rescale import rescale

    values = _values(tmp_path, "file", "rocksdb", request, partitions=2)
    values = {k: v for k, v in values.items() if not k.startswith("stores.local.")}  # rescale refuses unlogged
    config = Config.from_dict(values)
    users = [f"user{i}" for i in range(60)]
    for p in range(2):
        with TaskStorage(config, p) as s:
            s.store(STORE).put_all({u: {"u": u} for u in users if task_for(u, 2) == p})
            s.commit()
    with StateServer(config, tmp_path / "serving", refresh_ms=10**6) as server:
        assert server.get(STORE, "user1").value == {"u": "user1"}
        rescale(config, 3)
        server.refresh()
        server.refresh()
        for status in server.status():
            assert status.version is None and "job.partitions = 3" in (status.error or ""), status
        with pytest.raises(LocalStateError, match="not served"):
            server.get(STORE, "user1")
    rescaled = Config.from_dict({**values, "job.partitions": 3})
    with StateServer(rescaled, tmp_path / "serving") as server:
        assert [server.get(STORE, u).value for u in users] == [{"u": u} for u in users]
        assert all(server.get(STORE, u).partition == task_for(u, 3) for u in users)


# -- routing -------------------------------------------------------------------------------------

def test_key_routing_follows_the_stores_routing_rule(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    values = _values(tmp_path, "file", "memory", request, partitions=5)
    values.update({"stores.windows.factory": "memory", "stores.windows.key.serde": "tuple",
                   "stores.windows.msg.serde": "long", "stores.windows.changelog": "file.w",
                   "stores.windows.rescale.key": "key[1]", "stores.ids.factory": "memory",
                   "stores.ids.key.serde": "long", "stores.ids.msg.serde": "long", "stores.ids.changelog": "file.i",
                   "stores.ids.rescale.key": "key as int32"})
    config = Config.from_dict(values)
    with StateServer(config, tmp_path / "serving") as server:
        for user in ("u1", "user-77", "é"):
            assert server.partition_for("windows", (3600, user)) == task_for(user, 5)
            assert server.partition_for(STORE, user) == task_for(user, 5)
        for n in (0, 7, -3, 2**31 - 1):
            assert server.partition_for("ids", n) == task_for(n, 5, as_int32=True)
        plain = Config.from_dict({**values, "stores.windows.rescale.key": "key"})
        with pytest.raises(InvalidValueError, match=r"stores\.windows\.rescale\.key = key\[i\]"):
            StateServer(plain, tmp_path / "plain").partition_for("windows", (3600, "u1"))
        meta = server.metadata("windows", (0, "u1"))
        assert (meta.partition, meta.local, meta.server) == (task_for("u1", 5), True, None)


@pytest.mark.spark
def test_key_routing_agrees_with_a_spark_jobs_partitioning(spark: Any, tmp_path: Path) -> None:
    """Every key a real StatefulJob committed in task p is routed to p, and served with the
    value the task committed."""
    from localstate import read_committed
    from localstate.contrib.spark import StatefulJob
    from localstate.contrib.spark.compat import dataframe_from_arrow
    from localstate.contrib.spark.jobs import JOBS, job_config
    from localstate.contrib.spark.workload import generate

    task = JOBS["profile-settings-join"]
    config = job_config(task, tmp_path / "job", partitions=3)
    df = dataframe_from_arrow(spark, task.input_table(generate(3000)))
    StatefulJob(config, task, key=task.KEY, output_schema=task.OUTPUT_SCHEMA).run(df)
    committed = list(read_committed(config, "profiles"))
    assert len({p for p, _k, _v in committed}) == 3
    with StateServer(config, tmp_path / "serving", stores=["profiles"]) as server:
        for p, key, value in committed:
            assert server.metadata("profiles", key).partition == p, key
            got = server.get("profiles", key)
            assert (got.partition, got.value) == (p, value)


def test_servers_holding_task_subsets_route_forward_and_redirect(tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    config = Config.from_dict(_values(tmp_path, "file", "rocksdb", request, partitions=4))
    state: dict[str, Any] = {}
    for p in range(4):
        with TaskStorage(config, p) as s:
            mine = {k: {"p": p, "k": k} for k in _keys_of(p, 4, 5)}
            s.store(STORE).put_all(mine)
            state.update(mine)
            s.commit()
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    with StateServer(config, tmp_path / "a", tasks=[0, 1], routes={2: url_b, 3: url_b}, port=port_a) as a, \
            StateServer(config, tmp_path / "b", tasks=[2, 3], routes={0: url_a, 1: url_a}, port=port_b,
                        forward=False) as b:
        for key, value in state.items():
            p = task_for(key, 4)
            for server in (url_a,):  # A forwards what B holds
                status, body, _ = _http(f"{server}/v1/stores/{STORE}/keys/{key}")
                assert (status, body["value"], body["partition"], body["version"]) == (200, value, p, 1)
            status, body, _ = _http(f"{url_b}/v1/metadata/{STORE}/{key}")
            assert body == {"store": STORE, "key": key, "partition": p, "server": url_a if p < 2 else url_b,
                            "local": p >= 2, "version": 1 if p >= 2 else None}
        key0, key2 = _keys_of(0, 4, 1)[0], _keys_of(2, 4, 1)[0]
        status, _body, headers = _http(f"{url_b}/v1/stores/{STORE}/keys/{key0}")  # B redirects
        assert status == 307 and headers["Location"] == f"{url_a}/v1/stores/{STORE}/keys/{key0}"
        # a forwarded request is answered where it lands or refused: it never travels on
        status, body, _ = _http(f"{url_a}/v1/stores/{STORE}/keys/{key2}", {HOP_HEADER: "1"})
        assert status == 421 and "task 2" in body["error"]
        # several keys over both servers in one request
        keys = [key0, key2, "nobody-has-this"]
        status, body, _ = _http(f"{url_a}/v1/stores/{STORE}/keys?" + urllib.parse.urlencode([("key", k) for k in keys]))
        assert status == 200 and [r["value"] for r in body["results"]] == [state[key0], state[key2], None]
        # a range over every task: each server answers for its own, merged in key order
        for url in (url_a, url_b):
            status, body, _ = _http(f"{url}/v1/stores/{STORE}/range?all=1&limit=1000")
            assert (status, body["partitions"], body["missing_partitions"]) == (200, [0, 1, 2, 3], [])
            assert [(r["key"], r["value"]) for r in body["results"]] == sorted(state.items())
        status, body, _ = _http(f"{url_a}/v1/stores/{STORE}/range?all=1&limit=3&from=acct1")
        assert [r["key"] for r in body["results"]] == sorted(k for k in state if k >= "acct1")[:3]
        mine = [r["key"] for r in _http(f"{url_a}/v1/stores/{STORE}/range?limit=1000")[1]["results"]]
        assert mine == sorted(k for k in state if task_for(k, 4) < 2)
        with pytest.raises(NotLocalError) as info:
            a.get(STORE, key2)
        assert (info.value.partition, info.value.server) == (2, url_b)
        assert b.get(STORE, key2).value == state[key2]
    with StateServer(config, tmp_path / "c", tasks=[0], port=0) as alone:  # no route to task 2: say so
        with pytest.raises(NotLocalError, match="no server known"):
            alone.get(STORE, key2)
        body = _http(f"{alone.url}/v1/stores/{STORE}/range?all=1")[1]
        assert body["missing_partitions"] == [1, 2, 3] and {r["partition"] for r in body["results"]} == {0}


# -- restart, SIGKILL, damage ------------------------------------------------------------------

def _serve(config_file: Path, port: int, directory: Path, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "localstate", "serve", "-c", str(config_file), "--port", str(port),
                             "--dir", str(directory), "--refresh-ms", "20", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("serving job"):
        proc.kill()
        raise AssertionError(f"localstate serve did not start: {line}{proc.communicate()[1]}")
    return proc


def _write_config(values: dict[str, Any], path: Path) -> Path:
    path.write_text("".join(f"{k} = {v}\n" for k, v in values.items()))
    return path


def _all_served(url: str, keys: list[str]) -> dict[str, Any]:
    status, body, _ = _http(f"{url}/v1/stores/{STORE}/keys?" + urllib.parse.urlencode([("key", k) for k in keys]))
    assert status == 200, body
    return {r["key"]: r["value"] for r in body["results"] if r["found"]}


def _commit_random(config: Config, keys: list[str], rng: random.Random) -> int:
    with TaskStorage(config, 0) as s:
        store = s.store(STORE)
        for k in rng.sample(keys, 30):
            if rng.random() < 0.2:
                store.delete(k)
            else:
                store[k] = {"n": rng.randrange(1000)}
        return s.commit().version


@pytest.mark.parametrize("engine", ["rocksdb", "memory"])
def test_a_sigkilled_server_comes_back_exact(tmp_path: Path, engine: str, request: pytest.FixtureRequest) -> None:
    values = _values(tmp_path, "file", engine, request, partitions=1)
    if engine == "rocksdb":  # snapshots now and then: a restart starts from one and replays the rest
        values[f"stores.{STORE}.rocksdb.snapshot.interval.records"] = 50
    config = Config.from_dict(values)
    config_file = _write_config(values, tmp_path / "job.properties")
    keys = [f"k{i}" for i in range(200)]
    rng = random.Random(3)
    for _ in range(3):
        _commit_random(config, keys, rng)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(config_file, port, tmp_path / "serving")
    try:
        assert _all_served(url, keys) == _committed(config, 0)
        for _ in range(5):  # commits applied while it runs, then a SIGKILL mid-way through others
            version = _commit_random(config, keys, rng)
        deadline = time.monotonic() + 20
        while _http(f"{url}/v1/tasks")[1]["tasks"][0]["version"] != version and time.monotonic() < deadline:
            time.sleep(0.02)
        _commit_random(config, keys, rng)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.communicate()
    for _ in range(2):
        _commit_random(config, keys, rng)
    proc = _serve(config_file, port, tmp_path / "serving")
    try:
        status, body, _ = _http(f"{url}/v1/tasks")
        assert body["tasks"][0]["status"] == "serving" and body["tasks"][0]["version"] == 11
        assert _all_served(url, keys) == _committed(config, 0)
        proc.send_signal(signal.SIGTERM)  # a clean stop: exit code 0, copies kept
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.communicate()


def test_two_serve_processes_with_routes_answer_every_key(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """`localstate serve -p ... --route TASKS=URL` twice: each answers every key, its own
    tasks' from its copy and the other's forwarded (or redirected with --redirect)."""
    values = _values(tmp_path, "file", "rocksdb", request, partitions=3)
    config = Config.from_dict(values)
    state: dict[str, Any] = {}
    for p in range(3):
        with TaskStorage(config, p) as s:
            mine = {k: {"k": k} for k in _keys_of(p, 3, 4)}
            s.store(STORE).put_all(mine)
            state.update(mine)
            s.commit()
    config_file = _write_config(values, tmp_path / "job.properties")
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    a = _serve(config_file, port_a, tmp_path / "a", "-p", "0", "--route", f"1,2={url_b}")
    try:
        b = _serve(config_file, port_b, tmp_path / "b", "-p", "1", "-p", "2", "--route", f"0={url_a}", "--redirect")
        try:
            for key, value in state.items():
                status, body, _ = _http(f"{url_a}/v1/stores/{STORE}/keys/{key}")
                assert (status, body["value"], body["partition"]) == (200, value, task_for(key, 3))
                status, body, headers = _http(f"{url_b}/v1/stores/{STORE}/keys/{key}")
                if task_for(key, 3) == 0:
                    assert status == 307 and headers["Location"].startswith(url_a)
                else:
                    assert (status, body["value"]) == (200, value)
            tasks = _http(f"{url_b}/v1/tasks")[1]
            assert [t["partition"] for t in tasks["tasks"]] == [1, 2] and tasks["routes"] == {"0": url_a}
        finally:
            b.terminate()
            b.communicate(timeout=30)
    finally:
        a.terminate()
        a.communicate(timeout=30)


DAMAGE = ["delete the copy", "foreign tag", "garbage in every file"]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_copy_is_rebuilt_not_served_wrong(tmp_path: Path, damage: str,
                                                    request: pytest.FixtureRequest) -> None:
    config = Config.from_dict(_values(tmp_path, "file", "rocksdb", request, partitions=1))
    keys = [f"k{i}" for i in range(200)]
    rng = random.Random(5)
    for _ in range(3):
        _commit_random(config, keys, rng)
    with StateServer(config, tmp_path / "serving") as server:
        assert {x.key: x.value for x in server.range(STORE, limit=1000)} == _committed(config, 0)
    directory = store_dir(server.copies_config, STORE, 0)
    assert directory.is_dir()
    if damage == "delete the copy":
        shutil.rmtree(directory)
    elif damage == "foreign tag":
        (directory / TAG_FILE).write_text("7:another-log")
    else:
        for f in directory.rglob("*"):
            if f.is_file() and f.name != TAG_FILE:
                f.write_bytes(b"\x00garbage" * 64)
    for _ in range(2):
        _commit_random(config, keys, rng)
    with StateServer(config, tmp_path / "serving") as server:
        statuses = server.status()
        if statuses[0].status == "serving":
            assert {x.key: x.value for x in server.range(STORE, limit=1000)} == _committed(config, 0)
        else:  # refused what it found: never an answer from it; the next pass rebuilds it
            server.wait_for(5)
            assert {x.key: x.value for x in server.range(STORE, limit=1000)} == _committed(config, 0)


def test_a_copy_damaged_under_a_running_server_is_rebuilt(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    config = Config.from_dict(_values(tmp_path, "file", "rocksdb", request, partitions=1))
    keys = [f"k{i}" for i in range(200)]
    rng = random.Random(9)
    _commit_random(config, keys, rng)
    with StateServer(config, tmp_path / "serving", refresh_ms=10) as server:
        directory = store_dir(server.copies_config, STORE, 0)
        copy = server._copies[0]
        # a read that fails in the engine (as RocksDB does on a corrupt block) drops the copy
        engine = copy.stores[STORE].engine

        def broken(*args: Any, **kwargs: Any) -> Any:  # test double: the fault a bad disk causes
            raise OSError("Corruption: block checksum mismatch")

        engine.get = broken  # type: ignore[method-assign]
        with pytest.raises(LocalStateError, match="rebuilt"):
            server.get(STORE, "k1")
        version = _commit_random(config, keys, rng)
        server.wait_for(version)
        assert server._copies[0].stores[STORE].engine is not engine and directory.is_dir()
        assert {x.key: x.value for x in server.range(STORE, limit=1000)} == _committed(config, 0)


# -- bad input ----------------------------------------------------------------------------------

def test_bad_input_is_a_clear_error_and_changes_nothing(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    values = _values(tmp_path, "file", "rocksdb", request, partitions=2)
    values.update({"stores.ids.factory": "rocksdb", "stores.ids.key.serde": "long", "stores.ids.msg.serde": "json",
                   "stores.ids.changelog": "file.ids", "stores.top.factory": "topn", "stores.top.changelog": "file.top"})
    config = Config.from_dict(values)
    for p in range(2):
        with TaskStorage(config, p) as s:
            s.store(STORE).put_all({k: 1 for k in _keys_of(p, 2, 3)})
            s.commit()
    config_file = _write_config(values, tmp_path / "job.properties")
    job_files = (tmp_path / "state", tmp_path / "changelog")
    before = _tree_digest(*job_files)

    with pytest.raises(ConfigError, match="out of range"):
        StateServer(config, tmp_path / "s1", tasks=[2])
    with pytest.raises(UnknownStoreError, match="Did you mean 'balances'"):
        StateServer(config, tmp_path / "s1", stores=["balance"])
    with pytest.raises(ConfigError, match="not a key-value engine"):
        StateServer(config, tmp_path / "s1", stores=["top"])
    with pytest.raises(ConfigError, match="no changelog"):
        StateServer(config, tmp_path / "s1", stores=["local"])
    with pytest.raises(ConfigError, match="job's state"):
        StateServer(config, tmp_path / "state")
    with pytest.raises(ConfigError, match="port"):
        StateServer(config, tmp_path / "s1", port=70000)
    with pytest.raises(ConfigError, match="not an http:// base URL"):
        StateServer(config, tmp_path / "s1", tasks=[0], routes={1: "127.0.0.1:9"})
    assert not (tmp_path / "s1").exists()

    with StateServer(config, tmp_path / "s1", port=0) as server:
        with pytest.raises(LocalStateError, match="in use"):  # the port is taken: nothing created
            StateServer(config, tmp_path / "s2", port=int(server.url.rsplit(":", 1)[1])).start()
        assert not (tmp_path / "s2").exists()
        with pytest.raises(LocalStateError, match="locked|held"):  # one directory, one server
            StateServer(config, tmp_path / "s1").start()
        with pytest.raises(SerializationError, match="store 'ids'"):
            server.get("ids", "not-a-number")
        with pytest.raises(InvalidValueError, match="None"):
            server.get(STORE, None)
        for path, status, text in [
            ("/v1/stores/nope/keys/a", 404, "no store named 'nope'"),
            ("/v1/stores/top/keys/a", 400, "not a key-value engine"),
            ("/v1/stores/ids/keys/abc", 400, "key.serde 'long'"),
            (f"/v1/stores/{STORE}/range?limit=x", 400, "limit"),
            (f"/v1/stores/{STORE}/range?limit=100000", 400, "limit"),
            (f"/v1/stores/{STORE}/range?partition=9", 400, "has no task 9"),
            (f"/v1/stores/{STORE}/keys", 400, "?key="),
            ("/v2/anything", 404, "no such endpoint"),
        ]:
            got, body, _ = _http(server.url + path)
            assert (got, text in body.get("error", "")) == (status, True), (path, body)
        got, body, _ = _http(f"{server.url}/v1/stores/{STORE}/keys/absent")
        assert got == 404 and body["found"] is False and body["version"] == 1
    assert _tree_digest(*job_files) == before

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "localstate", "serve", "-c", str(config_file), *args],
                              capture_output=True, text=True, timeout=60)

    for args, text in [(["--port", "70000"], "70000"), (["--port", "0", "-p", "5"], "out of range"),
                       (["--port", "0", "--route", "x=y"], "TASKS=URL"),
                       (["--port", "0", "--store", "nope"], "no store named 'nope'"),
                       (["--port", "0", "--dir", str(tmp_path / "state")], "job's state")]:
        result = cli(*args)
        assert result.returncode != 0 and text in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert _tree_digest(*job_files) == before


def test_a_task_that_never_committed_is_unavailable_until_it_does(tmp_path: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    config = Config.from_dict(_values(tmp_path, "file", "memory", request, partitions=1))
    with StateServer(config, tmp_path / "serving", port=0, refresh_ms=10) as server:
        status, body, headers = _http(f"{server.url}/v1/stores/{STORE}/keys/a")
        assert status == 503 and "nothing committed" in body["error"] and headers["Retry-After"]
        assert _http(f"{server.url}/v1/health")[0] == 503
        with TaskStorage(config, 0) as s:
            s.store(STORE)["a"] = [1, 2]
            s.commit()
        server.wait_for(1)
        assert _http(f"{server.url}/v1/stores/{STORE}/keys/a")[1]["value"] == [1, 2]
        assert _http(f"{server.url}/v1/health")[0] == 200

"""The objectstore changelog on a real HDFS: Hadoop's MiniDFSCluster (one NameNode, one
DataNode, WebHDFS on 127.0.0.1; ``localstate.testing.hdfs`` fetches it with Maven once).

* the shipped changelog conformance suite: the partition contract, exact restore to the
  last commit with the uncommitted tail invisible (every KV engine), a zombie fenced;
* the client's object-store semantics on HDFS: create-if-absent under a race (exactly one
  winner, the others EXISTS), atomic PUTs (temporary files never listed), listing;
* a SIGKILL inside the commit restores the last commit exactly; a RocksDB snapshot on
  HDFS serves a moved task; ``hdfs://`` with the WebHDFS port; NameNode fail-over;
* errors name the URL and the fix: a NameNode that does not answer, permission denied,
  settings HDFS cannot use; NameNode 500 / 503 answers are retried, then fail the commit
  (through :class:`~localstate.testing.s3.FaultProxy`, a test double: a NameNode cannot
  be made to answer those on demand); a create whose answer was lost is EXISTS, and a
  commit is not mistaken for fencing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import requests
from click.testing import CliRunner
from localstate import Config, TaskStorage
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.changelog.objectstore.client import EXISTS, ObjectStoreSettings, connect
from localstate.changelog.objectstore.inspect import inspect_objectstore
from localstate.cli import cli
from localstate.errors import ChangelogError, ConfigError
from localstate.registry import ENGINES
from localstate.testing import torture as T
from localstate.testing.changelog_conformance import (
    ChangelogSystemConformance,
    ObjectStoreConformanceHooks,
    dump,
    task_values,
    unique,
)
from localstate.testing.changelog_conformance import on_another_machine as moved
from localstate.testing.hdfs import MiniHdfsCluster, hdfs_options
from localstate.testing.kafka import free_port
from localstate.testing.s3 import FaultProxy

pytestmark = pytest.mark.hdfs

FAST = {"timeout.ms": 5000, "retries": 2, "retry.backoff.ms": 20}
needs_rocksdb = pytest.mark.skipif(not ENGINES.installed("rocksdb")[0], reason="rocksdb not installed")


@pytest.fixture
def where(hdfs_cluster: MiniHdfsCluster) -> dict[str, Any]:
    """``systems.s3.*`` keys of a fresh directory on the MiniDFSCluster."""
    return hdfs_options(hdfs_cluster, f"/{unique('t')}", **FAST)


def system_options(opts: dict[str, Any], name: str = "s3") -> dict[str, Any]:
    pre = f"systems.{name}."
    return {k[len(pre):]: v for k, v in opts.items() if k.startswith(pre) and k != f"{pre}type"}


def make_system(opts: dict[str, Any], job: str = "job") -> ObjectStoreChangelogSystem:
    return ObjectStoreChangelogSystem("s3", system_options(opts), job)


def job_values(opts: dict[str, Any]) -> dict[str, Any]:
    return {"job.changelog.system": "s3", "job.checkpoint.system": "s3", **opts}


def client(opts: dict[str, Any], **config: str) -> Any:
    options = system_options(opts)
    settings = ObjectStoreSettings(path=options["path"], timeout_ms=options["timeout.ms"],
                                   retries=options["retries"], retry_backoff_ms=options["retry.backoff.ms"],
                                   config=config)
    settings.validate("systems.s3")
    return connect(settings, "s3")


class TestHdfsChangelogConformance(ObjectStoreConformanceHooks, ChangelogSystemConformance):
    fenced_match = r"_checkpoints/.*was already written by a newer instance"

    @pytest.fixture
    def make_system(self, where) -> Callable[[], ObjectStoreChangelogSystem]:
        job = unique("job")
        return lambda: make_system(where, job)

    @pytest.fixture
    def job_values(self, where) -> dict[str, Any]:
        return job_values(where)


# -- object-store semantics on HDFS --------------------------------------------------------
def test_a_create_race_has_exactly_one_winner_and_the_losers_see_exists(where):
    clients = [client(where) for _ in range(6)]
    results: dict[int, str] = {}
    start = threading.Barrier(len(clients))

    def create(i: int) -> None:
        start.wait()
        try:
            clients[i].put("_checkpoints/j/partition-0/00000000000000000001", b"writer %d" % i, create=True)
            results[i] = "won"
        except EXISTS:
            results[i] = "exists"

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in results.items() if r == "won"]
    assert len(results) == len(clients) and len(winners) == 1, results
    assert clients[0].get("_checkpoints/j/partition-0/00000000000000000001") == b"writer %d" % winners[0]
    # nothing but the key: the losers' temporary files are gone, and none is ever listed
    assert clients[0].list("_checkpoints/j") == [("partition-0/00000000000000000001", len(b"writer 0"))]


def test_puts_replace_whole_objects_and_listing_is_sorted_and_recursive(where, hdfs_cluster):
    c = client(where)
    c.put("s/0/log/b", b"one")
    c.put("s/0/log/b", b"three")  # a plain PUT replaces
    c.put("s/0/log/a", b"")
    c.put("s/1/x", b"12")
    assert c.get("s/0/log/b") == b"three"
    assert c.list("s") == [("0/log/a", 0), ("0/log/b", 5), ("1/x", 2)]
    assert c.children("s") == (["0", "1"], [])
    assert c.list("no/such/prefix") == []
    with pytest.raises(FileNotFoundError, match="s/0/log/zz"):
        c.get("s/0/log/zz")
    c.delete(["s/0/log/a", "s/0/log/never-there"])  # a missing key is no error
    assert c.list("s/0") == [("log/b", 5)]
    # a temporary file a killed writer left beside the keys is never listed
    path = where["systems.s3.path"].split(str(hdfs_cluster.webhdfs_port), 1)[1]
    base = f"http://127.0.0.1:{hdfs_cluster.webhdfs_port}/webhdfs/v1{path}/s/0/log"
    first = requests.put(f"{base}/.c.0123456789abcdef.ls-tmp?op=CREATE&user.name=root", allow_redirects=False)
    assert requests.put(first.headers["Location"], data=b"half").status_code == 201
    assert c.list("s/0") == [("log/b", 5)] and c.children("s/0/log") == ([], [("b", 5)])


# -- crashes and moves -----------------------------------------------------------------------
@pytest.mark.parametrize("point", ["commit.after_changelog_flush", "checkpoint.before_rename",
                                   "objectstore.rollup.after_put"])
def test_sigkill_inside_the_commit_restores_the_last_commit(hdfs_cluster, tmp_path, point):
    """The crash-trial harness's child and reference (localstate.testing.torture) on HDFS,
    with roll-ups every 2 objects so a roll-up is killed too."""
    plan = T.kill_plan("memory", (f"{point}=kill@3",), changelog="objectstore", batches=5)
    reference = T.reference_run(plan, tmp_path / "ref").states
    values = {**plan.values(tmp_path / "crash", None, "", namespace=unique("ns")),
              "systems.objectstore.path": hdfs_cluster.url(f"/{unique('crash')}"),
              "systems.objectstore.rollup.objects": 2}
    rc, _, err = T.run_child(plan, values, plan.faults[0])
    assert rc == -9, err
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        pos = s.checkpoint.input_position
        assert pos == (4 if point == "objectstore.rollup.after_put" else 2)  # roll-ups follow the commit
        assert dump(s, T.STORE) == reference[pos]
    rc, _, err = T.run_child(plan, values, None)
    assert rc == 0, err
    with TaskStorage(moved(values, tmp_path, "machine-c")) as s:
        assert s.checkpoint.input_position == 5
        assert dump(s, T.STORE) == reference[5]


@needs_rocksdb
def test_a_moved_task_downloads_the_newest_snapshot_from_hdfs(where, tmp_path):
    values = task_values(job_values(where), tmp_path, "rocksdb", **{"systems.s3.snapshot.every": 2})
    model: dict[str, int] = {}
    with TaskStorage(Config.from_dict(values)) as s:
        kv = s.store("kv")
        for batch in range(1, 7):
            for i in range(20):
                kv.put(f"k{(batch * 7 + i) % 50}", batch)
                model[f"k{(batch * 7 + i) % 50}"] = batch
            s.commit(input_position=batch)
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        # shipped at commit 1 (the engine's first snapshot), then every 2 commits: 3 and 5
        assert s.last_restore["kv"].start_offset == 100  # the snapshot of commit 5
        assert s.last_restore["kv"].records == 20
        assert dump(s) == model


def test_hdfs_url_with_the_webhdfs_port_and_inspect(hdfs_cluster, tmp_path):
    """``hdfs://host:<rpc port>/dir`` reaches WebHDFS on ``config.webhdfs_port``."""
    where = {"systems.s3.type": "objectstore",
             "systems.s3.path": f"hdfs://127.0.0.1:{hdfs_cluster.rpc_port}/{unique('h')}",
             "systems.s3.config.webhdfs_port": str(hdfs_cluster.webhdfs_port),
             **{f"systems.s3.{k}": v for k, v in FAST.items()}}
    values = task_values(job_values(where), tmp_path)
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put("a", 1)
        s.commit(input_position=1)
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert dump(s) == {"a": 1}
    report = inspect_objectstore("s3", system_options(where))
    [row] = report["checkpoints"]
    assert row["job"] == values["job.name"] and row["input_position"] == 1
    assert row["path"].startswith(where["systems.s3.path"])
    shown = CliRunner().invoke(cli, ["inspect", where["systems.s3.path"], "-o",
                                     f"config.webhdfs_port={hdfs_cluster.webhdfs_port}", "--json"])
    assert shown.exit_code == 0, shown.output
    assert [(r["stream"], r["end_offset"]) for r in json.loads(shown.output)["partitions"]] == [
        (f"{values['job.name']}-kv", 1)]


def test_a_standby_or_dead_namenode_fails_over_to_the_next(hdfs_cluster, tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    where = {**hdfs_options(hdfs_cluster, f"/{unique('ha')}", **FAST),
             "systems.s3.config.namenodes": f"{dead},127.0.0.1:{hdfs_cluster.webhdfs_port}"}
    values = task_values(job_values(where), tmp_path)
    with TaskStorage(Config.from_dict(values)) as s:
        s.store("kv").put("a", 1)
        s.commit(input_position=1)
    with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
        assert dump(s) == {"a": 1}


# -- errors ----------------------------------------------------------------------------------
def test_a_namenode_that_does_not_answer_fails_the_commit_naming_the_url(tmp_path):
    port = free_port()  # nothing listens there
    where = {"systems.s3.type": "objectstore", "systems.s3.path": f"webhdfs://127.0.0.1:{port}/state",
             "systems.s3.retries": 1, "systems.s3.retry.backoff.ms": 10, "systems.s3.timeout.ms": 1000}
    with pytest.raises(ChangelogError, match=rf"webhdfs://127\.0\.0\.1:{port}/state/.* after 2 attempt\(s\).*"
                                             r"systems\.s3\.\*"):
        TaskStorage(Config.from_dict(task_values(job_values(where), tmp_path)))


def test_namenode_server_errors_are_retried_then_fail_the_commit_naming_the_url(hdfs_cluster, tmp_path):
    with FaultProxy(f"http://127.0.0.1:{hdfs_cluster.webhdfs_port}") as proxy:
        where = {"systems.s3.type": "objectstore", "systems.s3.path": f"webhdfs://127.0.0.1:{proxy.port}/{unique('f')}",
                 **{f"systems.s3.{k}": v for k, v in FAST.items()}}
        values = task_values(job_values(where), tmp_path)
        with TaskStorage(Config.from_dict(values)) as s:
            s.store("kv").put("a", 1)
            proxy.fail(2, 503, method="PUT")
            s.commit(input_position=1)  # both answers retried
            assert [st for _, _, st in proxy.seen].count(503) == 2
            s.store("kv").put("a", 2)
            proxy.fail(50, 500, method="PUT")
            with pytest.raises(ChangelogError, match=rf"webhdfs://127\.0\.0\.1:{proxy.port}/.* after 3 attempt\(s\)"):
                s.commit(input_position=2)
            proxy.clear()
        with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
            assert s.checkpoint.input_position == 1 and dump(s) == {"a": 1}


class DropCreateAnswers(FaultProxy):
    """A test double: forwards every request to the NameNode, but of the next ``drops``
    create-if-absent renames (``op=RENAME`` without ``renameoptions``) the NameNode's
    answer is dropped after the NameNode carried the rename out — a connection lost at the
    worst moment, which a real NameNode cannot be made to show on demand."""

    drops = 0

    def _handle(self, h: Any) -> None:
        if h.command == "PUT" and "op=RENAME" in h.path and "renameoptions" not in h.path and self.drops > 0:
            self.drops -= 1
            self._forward(h, b"", length=0)
            self.seen.append((h.command, h.path, 0))
            h.close_connection = True
            h.connection.shutdown(2)
            return
        super()._handle(h)


def test_a_create_whose_answer_was_lost_is_exists_and_a_commit_is_not_mistaken_for_fencing(hdfs_cluster, tmp_path):
    with DropCreateAnswers(f"http://127.0.0.1:{hdfs_cluster.webhdfs_port}") as proxy:
        where = {"systems.s3.type": "objectstore", "systems.s3.path": f"webhdfs://127.0.0.1:{proxy.port}/{unique('d')}",
                 **{f"systems.s3.{k}": v for k, v in FAST.items()}}
        c = client(where)
        proxy.drops = 1
        with pytest.raises(EXISTS):  # the retry finds the key its first attempt created, as on S3
            c.put("k", b"mine", create=True)
        assert proxy.drops == 0 and c.get("k") == b"mine"
        values = task_values(job_values(where), tmp_path)
        with TaskStorage(Config.from_dict(values)) as s:
            s.store("kv").put("a", 1)
            proxy.drops = 1
            s.commit(input_position=1)  # the checkpoint store recognises its own object
            assert proxy.drops == 0
            s.store("kv").put("a", 2)
            s.commit(input_position=2)
        with TaskStorage(moved(values, tmp_path, "machine-b")) as s:
            assert s.checkpoint.input_position == 2 and dump(s) == {"a": 2}


def test_permission_denied_names_the_url_user_and_fix_and_is_not_retried(hdfs_cluster, where):
    root = client(where)
    root.put("owned-by-root", b"x")  # creates the directory, owned by the cluster's superuser
    other = client(where, user="nobody")
    with pytest.raises(ChangelogError, match=r"(?s)webhdfs://.*/k.*permission denied for user 'nobody'.*"
                                             r"systems\.s3\.config\.user"):
        other.put("k", b"y")
    assert other.requests["put"] == 1  # refused at once, not retried
    assert root.list("") == [("owned-by-root", 1)]


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"systems.s3.path": "viewfs://cluster/state"}, r"systems\.s3\.path = 'viewfs://cluster/state': .*mount table"),
        ({"systems.s3.path": "webhdfs://nn:9870/"}, "needs a NameNode and a directory"),
        ({"systems.s3.path": "webhdfs://nn:9870/s", "systems.s3.client.allow_http": "true"},
         r"systems\.s3\.client\.allow_http: .* do not apply to HDFS"),
        ({"systems.s3.path": "webhdfs://nn:9870/s", "systems.s3.config.endpoint": "x"},
         r"systems\.s3\.config\.endpoint: not an HDFS setting.*config\.user"),
        ({"systems.s3.path": "webhdfs://nn:9870/s", "systems.s3.config.webhdfs_port": "9870"},
         "only for hdfs:// paths"),
        ({"systems.s3.path": "hdfs://nn/s", "systems.s3.config.webhdfs_port": "http"}, "must be a port number"),
        ({"systems.s3.path": "hdfs://nn/s", "systems.s3.config.namenodes": "nn1,nn2"}, "write host:port"),
    ],
)
def test_settings_hdfs_cannot_use_are_refused_when_the_config_is_read(tmp_path, keys, match):
    values = {"job.name": "j", "job.state.dir": str(tmp_path), "job.changelog.system": "s3",
              "job.checkpoint.system": "s3", "stores.kv.factory": "memory", "systems.s3.type": "objectstore",
              **keys}
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(values)


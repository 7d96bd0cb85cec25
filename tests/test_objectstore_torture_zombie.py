"""A shortened form of ``localstate torture --changelog objectstore`` with zombie rounds on
the moto S3 server: a child stopped after it opened the task, a newer child taking over,
the stopped one resumed beside it (uploading, rolling up, committing: fenced), and the rest
of the trial on the zombie's machine. Zero divergences, as in the full runs."""

from __future__ import annotations

import json

import pytest
from localstate.registry import ENGINES
from localstate.testing import torture as T

pytestmark = pytest.mark.s3

ENGINES_HERE = [e for e in ("memory", "rocksdb") if ENGINES.installed(e)[0]]


@pytest.fixture
def endpoint(s3_server) -> str:
    try:
        s3_server.create_bucket(T.TORTURE_BUCKET)
    except Exception as e:  # created by an earlier test on the same server
        assert "BucketAlready" in str(e)
    return s3_server.endpoint


@pytest.mark.parametrize("engine", ENGINES_HERE)
@pytest.mark.parametrize("faults", [
    ("zombie:0@0",),
    ("zombie:2@0", "commit.after_changelog_flush=kill@3"),
    ("zombie:3@0.01", "objectstore.rollup.after_put=kill@2"),
])
def test_zombie_rounds_never_diverge(engine, faults, endpoint, tmp_path):
    plan = T.kill_plan(engine, faults, changelog="objectstore", batches=12)
    result = T.run_trial(plan, tmp_path, endpoint)
    assert result.ok, json.dumps(result.divergence, indent=2, default=str)
    assert result.zombies == 1


def test_objectstore_plans_have_zombie_rounds_and_others_none():
    plans = [T.plan_trial(s, "memory", "objectstore") for s in range(60)]
    zombies = [p for p in plans if any(f.startswith("zombie:") for f in p.faults)]
    assert 10 <= len(zombies) <= 35 and all(sum(f.startswith("zombie:") for f in p.faults) == 1 for p in zombies)
    assert not any(f.startswith("zombie:") for s in range(60) for f in T.plan_trial(s, "memory", "file").faults)


def test_a_short_torture_run_with_zombies(endpoint, tmp_path):
    report = T.run_trials("memory", "objectstore", 4, seed=2, workdir=tmp_path, batches=8, ops=20,
                          bootstrap=endpoint)
    s = report.summary()
    assert s["trials"] == 4 and s["divergences"] == 0, json.dumps(s["first_divergence"], indent=2, default=str)
    assert s["zombies"] >= 1

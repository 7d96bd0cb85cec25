"""The guide's non-KV example engine survives commit, crash (close without commit) and restore."""

from __future__ import annotations

import pytest
from localstate import ConfigError, TaskStorage

STORE = {"factory": "localstate.contrib.latest_events:LatestEventsFactory", "latest.size": 3,
         "key.serde": "string", "msg.serde": "json"}


def test_keeps_latest_n_and_restores_exactly(make_config):
    config = make_config(recent=STORE)
    with TaskStorage(config) as s:
        r = s.store("recent")
        for i in range(10):
            r.append("u1", {"n": i})
        r.append("u2", {"n": 100})
        r.clear("u2")
        r.append("u3", {"n": 7})
        s.commit()
        r.append("u1", {"n": "uncommitted"})
        assert r.latest("u1")[0] == {"n": "uncommitted"}
    with TaskStorage(config) as s:
        r = s.store("recent")
        assert r.latest("u1") == [{"n": 9}, {"n": 8}, {"n": 7}]
        assert r.latest("u2") == [] and r.latest("u3") == [{"n": 7}]
        assert s.last_restore["recent"].records <= 3 + 3 + 1  # slots are overwritten, not appended
        current = dict(s.engine("recent").current([b"u1\x00\x00\x00", b"zz\x00\x00\x00"]))
        assert current[b"zz\x00\x00\x00"] is None and current[b"u1\x00\x00\x00"] is not None


def test_bad_size_is_rejected(make_config):
    with pytest.raises(ConfigError, match="stores.recent.latest.size"):
        make_config(recent={**STORE, "latest.size": 0})

"""Config loading and up-front validation (errors name the key and the fix)."""

from __future__ import annotations

import pickle

import pytest
from localstate import (
    Config,
    ConfigError,
    UnknownEngineError,
    UnknownSerdeError,
    UnknownSystemError,
)

BASE = {"job.name": "j", "stores.s.factory": "memory"}


def test_from_dict_defaults():
    c = Config.from_dict(BASE)
    spec = c.stores["s"]
    assert spec.factory == "memory"
    assert spec.changelog == ("file", "j-s")
    assert (spec.object_cache_size, spec.write_batch_size) == (1000, 500)
    assert c.partitions == 1 and c.checkpoint_system == "file"


def test_nested_dict_flattens():
    c = Config.from_dict({"job": {"name": "j"}, "stores": {"s": {"factory": "memory", "msg.serde": "json"}}})
    assert c.stores["s"].msg_serde == "json"


def test_properties_and_toml_agree(tmp_path):
    props = tmp_path / "job.properties"
    props.write_text(
        "# comment\njob.name = pv\nstores.counts.factory = memory\n"
        "stores.counts.object.cache.size = 2000   # trailing comment\nstores.counts.changelog = file.pv-counts\n"
    )
    toml = tmp_path / "job.toml"
    toml.write_text(
        '[job]\nname = "pv"\n[stores.counts]\nfactory = "memory"\n"object.cache.size" = 2000\n'
        'changelog = "file.pv-counts"\n'
    )
    a, b = Config.from_properties(props), Config.from_toml(toml)
    assert a.stores == b.stores
    assert a.stores["counts"].object_cache_size == 2000
    assert Config.load(toml).job_name == "pv"


def test_config_pickles_for_executors():
    c = Config.from_dict(BASE)
    assert pickle.loads(pickle.dumps(c)).stores == c.stores


def test_changelog_none_disables_logging():
    c = Config.from_dict({**BASE, "stores.s.changelog": "none"})
    assert c.stores["s"].changelog is None


@pytest.mark.parametrize(
    "values, error, fragment",
    [
        ({"stores.s.factory": "memory"}, ConfigError, "job.name"),
        ({**BASE, "stores.s.factroy": "memory"}, ConfigError, "Did you mean 'factory'"),
        ({**BASE, "stores.s.object.cache.size": "10", "stores.s.write.batch.size": "50"}, ConfigError, "smaller than"),
        ({**BASE, "stores.s.object.cache.size": "lots"}, ConfigError, "stores.s.object.cache.size"),
        ({"job.name": "j", "stores.s.factory": "rocksbd"}, UnknownEngineError, "Did you mean 'rocksdb'"),
        ({"job.name": "j", "stores.t.key.serde": "json"}, ConfigError, "stores.t.factory"),
        ({**BASE, "stores.s.key.serde": "jsn"}, UnknownSerdeError, "Did you mean 'json'"),
        ({**BASE, "stores.s.changelog": "nodot"}, ConfigError, "<system>.<stream>"),
        ({**BASE, "job.partitons": 2}, ConfigError, "job.partitions"),
        ({**BASE, "job.partitions": 0}, ConfigError, ">= 1"),
        ({**BASE, "systems.file.segmnt.bytes": 1}, ConfigError, "segment.bytes"),
        ({**BASE, "systems.file.segment.bytes": 10}, ConfigError, ">= 4096"),
        ({**BASE, "stores.s.changelog": "nosuch.stream"}, UnknownSystemError, "systems.nosuch"),
        ({**BASE, "stores.s.factory": "no.such.module:Factory"}, ConfigError, "no.such"),
        ({**BASE, "stores.s.write.batch.size": 0}, ConfigError, ">= 1"),
        ({**BASE, "job.name": "bad name"}, ConfigError, "job.name"),
    ],
)
def test_bad_config_is_rejected_with_a_clear_message(values, error, fragment):
    with pytest.raises(error, match=None) as info:
        Config.from_dict(values)
    assert fragment in str(info.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        Config.from_properties(tmp_path / "missing.properties")
    bad = tmp_path / "bad.toml"
    bad.write_text("[job\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.from_toml(bad)
    with pytest.raises(ConfigError, match=".toml or .properties"):
        Config.load(tmp_path / "x.yaml")


def test_with_overrides_revalidates():
    c = Config.from_dict(BASE).with_overrides({"stores.s.msg.serde": "json"})
    assert c.stores["s"].msg_serde == "json"
    with pytest.raises(ConfigError):
        Config.from_dict(BASE).with_overrides({"stores.s.bogus": 1})

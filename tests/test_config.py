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
        "stores.counts.object.cache.size = 2000\nstores.counts.changelog = file.pv-counts\n"
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


# -- .properties with Java's semantics (java.util.Properties, via javaproperties) ---------------
PROPS_BASE = "job.name = pv\nstores.s.factory = memory\n"


def props(tmp_path, text: str) -> Config:
    p = tmp_path / "job.properties"
    p.write_bytes(text.encode("utf-8"))
    return Config.from_properties(p)


@pytest.mark.parametrize(("line", "state_dir"), [
    ("job.state.dir = ./a #b", "./a #b"),                       # '#' inside a value is data
    ("job.state.dir : ./colon", "./colon"),                     # ':' separates like '='
    ("job.state.dir ./space", "./space"),                       # so does whitespace
    ("job.state.dir=./a\\u00e9", "./aé"),                       # \uXXXX escapes
    ("job.state.dir = ./tab\\tx", "./tab\tx"),                  # \t is a tab
    ("job.state.dir = ./one\\\n      two", "./onetwo"),        # continuation: next line's indent dropped
    ("job.state.dir = ./x\\\\", "./x\\"),                     # an escaped backslash ends the line
    ("job.state.di\\\n  r = ./key-cont", "./key-cont"),         # continuation inside a key
    ("job.state.dir = ./é", "./é"),                             # UTF-8 file
])
def test_properties_rules(tmp_path, line, state_dir):
    assert str(props(tmp_path, PROPS_BASE + line + "\n").get("job.state.dir")) == state_dir


def test_properties_comments_only_at_line_start_and_last_duplicate_wins(tmp_path):
    c = props(tmp_path, "# a comment\n   ! another\n" + PROPS_BASE
              + "stores.s.object.cache.size = 10\nstores.s.write.batch.size = 5\nstores.s.object.cache.size = 20\n")
    assert c.stores["s"].object_cache_size == 20
    with pytest.raises(ConfigError, match="no trailing comments"):
        props(tmp_path, PROPS_BASE + "stores.s.object.cache.size = 2000   # trailing comment\n")


def test_properties_escaped_key_chars_and_bad_escape(tmp_path):
    with pytest.raises(ConfigError, match=r"stores.s.key.serde=x"):
        props(tmp_path, PROPS_BASE + "stores.s.key.serde\\=x = string\n")  # '\\=' is part of the key
    with pytest.raises(ConfigError, match=r"job.properties:3"):
        props(tmp_path, PROPS_BASE + "stores.s.msg.serde = \\u12\n")
    with pytest.raises(ConfigError, match=r"job.properties:3: expected 'key = value'"):
        props(tmp_path, PROPS_BASE + "= orphan\n")


# -- units on every *.ms / *.bytes key -------------------------------------------------------------
@pytest.mark.parametrize(("value", "ms"), [
    ("500ms", 500), ("30s", 30_000), ("24h", 86_400_000), ("1h30m", 5_400_000), ("2 min", 120_000),
    ("1.5s", 1500), ("1_000", 1000), (250, 250), ("7d", 7 * 86_400_000),
])
def test_durations_with_units(value, ms):
    c = Config.from_dict({**BASE, "systems.file.delete.retention.ms": value})
    from localstate.options import parse_duration_ms
    assert parse_duration_ms(c.systems["file"]["delete.retention.ms"], "systems.file.delete.retention") == ms


@pytest.mark.parametrize(("value", "nbytes"), [
    ("50MB", 50 << 20), ("64 MiB", 64 << 20), ("1.5GiB", 3 << 29), ("16k", 16 << 10), ("4096", 4096),
    ("8 kb", 8192),
])
def test_sizes_with_units(value, nbytes):
    c = Config.from_dict({**BASE, "stores.s.factory": "rocksdb", "stores.s.rocksdb.block.cache.size.bytes": value})
    assert c.stores["s"].options.block_cache_size_bytes == nbytes


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("systems.file.segment.bytes", "12 parsecs", "unknown unit 'parsecs'"),
    ("systems.file.segment.bytes", "0.3B", "not a whole number"),
    ("systems.file.delete.retention.ms", "0.5ms", "not a whole number"),
    ("systems.file.delete.retention.ms", "1h 30", "every part of a duration needs a unit"),
    ("systems.file.delete.retention.ms", "soon", "expected a duration"),
])
def test_bad_units_name_the_key(key, value, fragment):
    with pytest.raises(ConfigError, match=fragment) as e:
        Config.from_dict({**BASE, key: value})
    assert key in str(e.value)


def test_all_config_errors_are_reported_at_once():
    with pytest.raises(ConfigError) as e:
        Config.from_dict({
            "job.name": "bad name", "job.partitions": "two", "job.nmae": "x",
            "stores.a.factory": "memory", "stores.a.object.cache.size": "lots", "stores.a.colour": "red",
            "stores.b.factory": "rockdb",
            "systems.file.segment.bytes": "tiny",
        })
    text = str(e.value)
    for fragment in ("problems in the config", "job.name = 'bad name'", "job.partitions = 'two'", "job.nmae",
                     "stores.a.object.cache.size", "stores.a.colour", "stores.b.factory", "segment.bytes"):
        assert fragment in text, fragment

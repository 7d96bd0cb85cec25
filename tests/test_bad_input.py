"""Bad input table: every row is a mistake a user can make, the error type it must raise
and a fragment of the message (which must name the key/store/path and the fix).

Rows cover config, serdes, keys/values, engine options, changelog settings and CLI
arguments; one test per row (the id is the row name).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from localstate import Config, TaskStorage
from localstate.cli import cli
from localstate.errors import (
    ChangelogError,
    ConfigError,
    InvalidValueError,
    LocalStateError,
    SerializationError,
    StoreClosedError,
    UnknownEngineError,
    UnknownSerdeError,
)


def base(tmp: Path, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "job.name": "bad",
        "job.state.dir": str(tmp / "state"),
        "systems.file.path": str(tmp / "changelog"),
        "stores.s.factory": "memory",
    }
    values.update(extra)
    return values


def config(tmp: Path, **extra: Any) -> Config:
    return Config.from_dict(base(tmp, **extra))


def without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


def with_store(tmp: Path, action: Callable[[Any], Any], **extra: Any) -> Any:
    with TaskStorage(config(tmp, **extra)) as s:
        return action(s.store("s"))


def closed_store(tmp: Path) -> Any:
    with TaskStorage(config(tmp)) as s:
        store = s.store("s")
    return store.get(b"k")


def partitions_changed(tmp: Path) -> Any:
    with TaskStorage(config(tmp)) as s:
        s.commit()
    with TaskStorage(config(tmp, **{"job.partitions": 2})):
        pass


def properties_file(tmp: Path, text: str, suffix: str = ".properties") -> Config:
    p = tmp / f"job{suffix}"
    p.write_text(text)
    return Config.load(p)


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    raise CliExit(result.exit_code, result.output)


class CliExit(Exception):
    """How a CLI row reports its exit code and output to the table."""

    def __init__(self, code: int, output: str) -> None:
        super().__init__(f"exit {code}: {output}")
        self.code = code


ROWS: list[tuple[str, Callable[[Path], Any], type[BaseException], str]] = [
    # -- config -----------------------------------------------------------------------------
    ("config-missing-job-name", lambda t: Config.from_dict(without(base(t), "job.name")),
     ConfigError, "missing required config key 'job.name'"),
    ("config-misspelt-job-key", lambda t: config(t, **{"job.nmae": "x"}),
     ConfigError, "Did you mean 'job.name'"),
    ("config-partitions-zero", lambda t: config(t, **{"job.partitions": 0}),
     ConfigError, "job.partitions = 0: must be >= 1"),
    ("config-partitions-not-int", lambda t: config(t, **{"job.partitions": "two"}),
     ConfigError, "job.partitions = 'two'"),
    ("config-store-without-factory", lambda t: Config.from_dict(without(base(t, **{"stores.s.key.serde": "string"}), "stores.s.factory")),
     ConfigError, "set stores.s.factory"),
    ("config-unknown-engine", lambda t: config(t, **{"stores.s.factory": "memroy"}),
     UnknownEngineError, "Did you mean 'memory'"),
    ("config-unknown-store-key", lambda t: config(t, **{"stores.s.write.batch": 10}),
     ConfigError, "stores.s.write.batch"),
    ("config-cache-smaller-than-batch", lambda t: config(t, **{"stores.s.object.cache.size": 5, "stores.s.write.batch.size": 50}),
     ConfigError, "Raise the cache size to at least 50"),
    ("config-bad-store-name", lambda t: config(t, **{"stores.a b.factory": "memory"}),
     ConfigError, "letters, digits"),
    ("config-properties-syntax", lambda t: properties_file(t, "job.name = x\n= orphan value\n"),
     ConfigError, "job.properties:2"),
    ("config-invalid-toml", lambda t: properties_file(t, "[job\nname = 1\n", ".toml"),
     ConfigError, "is not valid TOML"),
    ("config-unknown-file-type", lambda t: properties_file(t, "{}", ".yaml"),
     ConfigError, "must end in .toml or .properties"),
    ("config-partition-out-of-range", lambda t: TaskStorage(config(t), 3),
     LocalStateError, "partition 3 is out of range"),
    # -- serdes ------------------------------------------------------------------------------
    ("serde-unknown-name", lambda t: config(t, **{"stores.s.msg.serde": "jsn"}),
     UnknownSerdeError, "json"),
    ("serde-key-of-wrong-type", lambda t: with_store(t, lambda s: s.put(42, "v"), **{"stores.s.key.serde": "string", "stores.s.msg.serde": "string"}),
     SerializationError, "store 's'"),
    ("serde-value-not-json", lambda t: with_store(t, lambda s: s.put("k", object()), **{"stores.s.key.serde": "string", "stores.s.msg.serde": "json"}),
     SerializationError, "store 's'"),
    ("serde-int-key-out-of-range", lambda t: with_store(t, lambda s: s.put(1 << 80, b"v"), **{"stores.s.key.serde": "long"}),
     SerializationError, "store 's'"),
    # -- keys and values ---------------------------------------------------------------------------
    ("value-none-is-not-delete", lambda t: with_store(t, lambda s: s.put(b"k", None)),
     InvalidValueError, "delete"),
    ("key-str-into-bytes-store", lambda t: with_store(t, lambda s: s.put("k", b"v")),
     SerializationError, "store 's'"),
    ("store-used-after-close", closed_store, StoreClosedError, "closed"),
    ("unknown-store-name", lambda t: TaskStorage(config(t)).store("z"), LocalStateError, "no store named 'z'"),
    # -- engine options ------------------------------------------------------------------------------
    ("engine-option-unknown", lambda t: config(t, **{"stores.s.factory": "topn", "stores.s.topn.sise": 3}),
     ConfigError, "Did you mean 'size'"),
    ("engine-option-negative", lambda t: config(t, **{"stores.s.factory": "topn", "stores.s.topn.size": -1}),
     ConfigError, "stores.s.topn.size = -1"),
    ("engine-option-bad-choice", lambda t: config(t, **{"stores.s.factory": "topn", "stores.s.topn.order": "maxx"}),
     ConfigError, "stores.s.topn.order"),
    ("engine-option-wrong-type", lambda t: config(t, **{"stores.s.factory": "topn", "stores.s.topn.size": "ten"}),
     ConfigError, "stores.s.topn.size = 'ten'"),
    ("engine-plugin-option-range", lambda t: config(t, **{"stores.s.factory": "localstate.contrib.latest_events:LatestEventsFactory", "stores.s.latest.size": 0}),
     ConfigError, "stores.s.latest.size = 0: must be between 1 and 65535"),
    ("engine-bad-module-path", lambda t: config(t, **{"stores.s.factory": "nosuch_pkg_xyz.mod:Factory"}),
     ConfigError, "nosuch_pkg_xyz"),
    # -- changelog settings --------------------------------------------------------------------------
    ("changelog-bad-stream-spec", lambda t: config(t, **{"stores.s.changelog": "nodot"}),
     ConfigError, "expected '<system>.<stream>'"),
    ("changelog-unknown-system", lambda t: config(t, **{"stores.s.changelog": "nosuch.stream"}),
     ConfigError, "systems.nosuch"),
    ("changelog-segment-too-small", lambda t: config(t, **{"systems.file.segment.bytes": 100}),
     ConfigError, "systems.file.segment.bytes = 100: must be >= 4096"),
    ("changelog-negative-retention", lambda t: config(t, **{"systems.file.delete.retention.ms": -1}),
     ConfigError, "systems.file.delete.retention.ms = -1"),
    ("changelog-unknown-file-key", lambda t: config(t, **{"systems.file.segment.byte": 8192}),
     ConfigError, "Did you mean 'segment.bytes'"),
    ("changelog-kafka-without-brokers", lambda t: config(t, **{"stores.s.changelog": "kafka.s"}),
     ConfigError, "systems.kafka.bootstrap.servers is required"),
    ("changelog-partition-count-changed", partitions_changed, ChangelogError, "job.partitions = 2"),
    # -- CLI arguments -------------------------------------------------------------------------------
    ("cli-torture-zero-trials", lambda t: run_cli("torture", "--trials", "0"), CliExit, "--trials"),
    ("cli-torture-unknown-changelog", lambda t: run_cli("torture", "--changelog", "s3"), CliExit, "'s3' is not one of"),
    ("cli-set-without-equals", lambda t: run_cli("restore", "--set", "job.name"), CliExit, "expected KEY=VALUE"),
    ("cli-inspect-missing-path", lambda t: run_cli("inspect", str(t / "nope")), CliExit, "does not exist"),
    ("cli-restore-unknown-store", lambda t: run_cli("restore", "--set", "job.name=x", "--set", f"job.state.dir={t}",
                                                    "--set", "stores.s.factory=memory", "--store", "zz"),
     CliExit, "unknown store(s) ['zz']"),
]


@pytest.mark.parametrize("make, error, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_row(tmp_path, make, error, fragment):
    with pytest.raises(error) as info:
        make(tmp_path)
    if isinstance(info.value, CliExit):
        assert info.value.code == 2, str(info.value)  # click usage error, not a traceback
    assert fragment in str(info.value), str(info.value)


def test_table_has_every_category():
    cats = {name.split("-")[0] for name, *_ in ROWS}
    assert {"config", "serde", "value", "engine", "changelog", "cli"} <= cats
    assert len(ROWS) >= 20

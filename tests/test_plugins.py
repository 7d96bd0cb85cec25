"""Plug-in authoring: entry points, registration clashes, broken plug-ins, the scaffold."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from localstate import Config, ConfigError, EngineError, TaskStorage, register_engine
from localstate.cli import cli
from localstate.registry import ENGINES, resolve_factory


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A throwaway installed distribution: a module plus a .dist-info with an entry point,
    placed on sys.path (how an installed wheel looks to importlib.metadata)."""

    def make(dist: str, entry_points: dict[str, str], module_code: str | None) -> None:
        site = tmp_path / f"site-{dist}"
        site.mkdir()
        if module_code is not None:
            (site / f"{dist}_mod.py").write_text(textwrap.dedent(module_code))
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
        (info / "entry_points.txt").write_text(f"[localstate.engines]\n{eps}")
        monkeypatch.syspath_prepend(str(site))
        ENGINES.reset_for_tests()

    yield make
    sys.modules.pop("goodplugin_mod", None)
    ENGINES.reset_for_tests()


GOOD = """
from localstate.engines.memory import MemoryEngine
from localstate import StorageEngineFactory

class Factory(StorageEngineFactory):
    description = "a plug-in from an entry point"
    def create(self, spec, context):
        return MemoryEngine(spec.name)
"""


def test_entry_point_plugin_is_used_by_name_from_config(plugin_dist, make_config):
    plugin_dist("goodplugin", {"viaep": "goodplugin_mod:Factory"}, GOOD)
    config = make_config(s={"factory": "viaep", "key.serde": "string", "msg.serde": "json"})
    with TaskStorage(config) as storage:
        storage.store("s")["a"] = 1
        storage.commit()
    with TaskStorage(config) as storage:
        assert storage.store("s")["a"] == 1
    assert "viaep" in CliRunner().invoke(cli, ["engines"]).output


def test_entry_point_that_fails_to_import_names_distribution(plugin_dist):
    plugin_dist("brokenplugin", {"broken": "brokenplugin_mod:Factory"}, "raise RuntimeError('boom')\n")
    with pytest.raises(EngineError) as info:
        resolve_factory("broken")
    msg = str(info.value)
    assert "brokenplugin" in msg and "'broken'" in msg and "boom" in msg


def test_entry_point_missing_module_names_it(plugin_dist):
    plugin_dist("ghostplugin", {"ghost": "ghost_missing_mod:Factory"}, None)
    with pytest.raises(ConfigError, match="ghost_missing_mod"):
        resolve_factory("ghost")


def test_two_engines_claiming_one_name(plugin_dist):
    plugin_dist("clashplugin", {"rocksdb": "goodplugin_mod:Factory"}, None)
    with pytest.raises(EngineError, match="two storage engines claim the name 'rocksdb'"):
        ENGINES.names()


def test_register_engine_clash_needs_clobber():
    with pytest.raises(ConfigError, match="already registered"):
        register_engine("memory", "x.y:Z")


def test_factory_returning_a_non_engine(make_config):
    class DictFactory:  # the bad plug-in under test: not a StorageEngineFactory
        pass

    from localstate import StorageEngineFactory

    class BadFactory(StorageEngineFactory):
        def create(self, spec, context):
            return {}

    register_engine("returns-dict", BadFactory, clobber=True)
    with pytest.raises(EngineError, match="not a localstate.StorageEngine"):
        TaskStorage(make_config(s={"factory": "returns-dict"}))
    register_engine("not-a-factory", DictFactory, clobber=True)
    try:
        with pytest.raises(EngineError, match="not a StorageEngineFactory"):
            Config.from_dict({"job.name": "j", "stores.s.factory": "not-a-factory"})
    finally:
        ENGINES.unregister("returns-dict")
        ENGINES.unregister("not-a-factory")


def test_scaffold_output_passes_its_own_tests(tmp_path):
    result = CliRunner().invoke(cli, ["new-engine", "ringbuf", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    root = tmp_path / "localstate-ringbuf"
    assert (root / "pyproject.toml").read_text().count('ringbuf = "localstate_ringbuf.engine:RingbufFactory"') == 1
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=root, capture_output=True, text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " passed" in proc.stdout
    again = CliRunner().invoke(cli, ["new-engine", "ringbuf", "--dir", str(tmp_path)])
    assert again.exit_code != 0 and "already exists" in again.output
    bad = CliRunner().invoke(cli, ["new-engine", "Bad-Name", "--dir", str(tmp_path)])
    assert bad.exit_code != 0 and "lower-case" in bad.output

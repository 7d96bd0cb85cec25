"""Plug-in authoring: entry points, registration clashes, broken plug-ins, the scaffold."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from localstate import Config, ConfigError, EngineError, TaskStorage, register_engine
from localstate.cli import cli
from localstate.registry import ENGINES, available, resolve_factory


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
        return MemoryEngine(context)
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


def test_two_engines_claiming_one_name_break_only_that_name(plugin_dist, make_config):
    """Issue 14 case 16: a name conflict used to make every registry call (and so
    ``import localstate``) fail; now only the contested name is refused, on use."""
    plugin_dist("clashplugin", {"rocksdb": "goodplugin_mod:Factory"}, None)
    assert "rocksdb" in ENGINES.names() and "memory" in ENGINES.names()
    with pytest.raises(EngineError, match="two storage engines claim the name 'rocksdb'.*clashplugin"):
        resolve_factory("rocksdb")
    info = available()
    assert info["rocksdb"]["installed"] is False and "claim the name" in info["rocksdb"]["hint"]
    assert info["memory"]["installed"] is True
    config = make_config(s={"factory": "memory", "key.serde": "string", "msg.serde": "json"})
    with TaskStorage(config) as storage:
        storage.store("s")["a"] = 1


def test_a_conflicting_or_broken_plugin_does_not_break_import_or_torture(tmp_path):
    import subprocess

    site = tmp_path / "site"
    info = site / "evil-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[localstate.engines]\nmemory = evil_mod:Factory\nexploding = evil_mod:Factory\n")
    (site / "evil_mod.py").write_text("raise RuntimeError('boom at import')\n")
    code = (
        "import localstate\n"
        "from localstate.testing.torture import torture_engines\n"
        "from localstate.registry import available\n"
        "names = torture_engines()\n"
        "assert 'rocksdb' in names and 'memory' not in names and 'exploding' not in names, names\n"
        "print(available()['exploding']['hint'])\n"
        "print(available()['memory']['hint'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "boom at import" in out.stdout and "evil" in out.stdout
    assert "claim the name 'memory'" in out.stdout


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


RAISING = """
from localstate.engines.memory import MemoryEngine
from localstate import StorageEngineFactory

class Engine(MemoryEngine):
    def persist(self, offset):
        raise ZeroDivisionError("plug-in bug")

class Factory(StorageEngineFactory):
    def create(self, spec, context):
        return Engine(spec.name)
"""


def test_errors_inside_a_plugin_are_wrapped_with_store_phase_and_engine(plugin_dist, make_config):
    plugin_dist("raisingplugin", {"raising": "raisingplugin_mod:Factory"}, RAISING)
    config = make_config(s={"factory": "raising", "key.serde": "string", "msg.serde": "json"})
    with TaskStorage(config) as storage:
        storage.store("s")["a"] = 1
        with pytest.raises(EngineError, match=r"store 's': engine 'raising' failed in persist\(\): "
                                              r"ZeroDivisionError: plug-in bug") as info:
            storage.commit()
        assert isinstance(info.value.__cause__, ZeroDivisionError)
    sys.modules.pop("raisingplugin_mod", None)

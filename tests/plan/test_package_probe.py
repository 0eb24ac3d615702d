"""hpcrl.plan.package_probe: package versions from metadata folders, nothing imported; the
same answer in this process and from another interpreter, and importlib.metadata's."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

from hpcrl.plan.job_python import probe_versions
from hpcrl.plan.package_probe import installed_versions, module_found, probe
from hpcrl.plan.requirements import SUPPORTED


def test_versions_come_from_dist_info_and_egg_info_folders_first_entry_first(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "foo_bar-1.2.3.dist-info").mkdir(parents=True)
    (first / "Legacy-Name-2.0.dist-info").mkdir()  # an old tool's spelling: '-' in the name
    egg = first / "eggy.egg-info"  # a develop install: no version in the folder's name
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: eggy\nVersion: 0.5\n\nbody: x\n")
    (first / "flat-3.1-py3.11.egg-info").write_text("Name: flat\nVersion: 3.1\n")
    (second / "foo_bar-9.9.dist-info").mkdir(parents=True)
    (second / "other-1.0.dist-info").mkdir()
    found = installed_versions([str(first), str(second), str(tmp_path / "missing")])
    assert found == {"foo_bar": "1.2.3", "legacy_name": "2.0", "eggy": "0.5", "flat": "3.1",
                     "other": "1.0"}  # fmt: skip
    rows = [[["Foo.Bar"], "foo_bar"], [["absent", "legacy-name"], "legacy"], [["nope"], "nope"]]
    assert probe(rows, [str(first)]) == {"foo_bar": "1.2.3", "legacy": "2.0", "nope": None}


def test_a_submodule_is_found_without_importing_its_package(tmp_path):
    package = tmp_path / "loud"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "core" / "__init__.py").write_text("")
    (tmp_path / "flat.py").write_text("")
    entries = [str(tmp_path)]
    assert module_found("loud.core", entries) and module_found("loud", entries)
    assert not module_found("loud.missing", entries)
    assert not module_found("flat.sub", entries)  # a plain module has no submodules
    assert module_found("flat", entries) and "loud" not in sys.modules
    assert probe([[["loud"], "loud.core"]], entries) == {"loud.core": ""}  # no metadata


def test_this_interpreter_and_another_process_give_importlib_metadatas_answer():
    rows = tuple(SUPPORTED)
    here = probe_versions((sys.executable,), rows)  # in this process
    # the same interpreter under another argv: asked in a subprocess (the module's text)
    other = probe_versions((sys.executable, "-s"), rows)
    assert isinstance(here, dict) and here == other, (here, other)
    for row in rows:
        expected = None
        for name in row.distributions:
            try:
                expected = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        assert here[row.module] == expected, row.module
    assert here["torch"] and here["ray"]  # the test environment has both


def test_the_probe_script_runs_on_its_own():
    """Another interpreter runs the module's text, without hpcrl on its path."""
    script = Path(sys.modules["hpcrl.plan.package_probe"].__file__).read_text()
    result = subprocess.run(
        [sys.executable, "-I", "-c", script, '[[["pip"], "pip"], [["nothing-here"], "nothing"]]'],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    pip = importlib.metadata.version("pip")
    assert result.stdout.strip() == f'{{"pip": "{pip}", "nothing": null}}'

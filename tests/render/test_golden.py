"""Golden files: the exact script for every shipped recipe × shipped profile.

A pair that plans has ``golden/<recipe>__<profile>.sbatch``; a pair that is invalid by design
(e.g. a 2-node GPU recipe on ``local``) has ``golden/<recipe>__<profile>.problems`` holding the
problems the planner must report. Regenerate after an intended change with:

    HPCRL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/render -k golden

and review the diff. Run folder and $HOME are fixed so the files are deterministic, and so is
where the recipes lie: the planner checks a data file only where a container mount covers it
(``slurm-test-pyxis`` mounts /tmp), so a checkout under /tmp and one elsewhere gave different
problems. The recipes are read from a copy under /tmp, whatever the checkout's path.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hpcrl.config import ConfigError, format_problems, list_recipes, load_profile, load_recipe
from hpcrl.config.locate import shipped_profiles_dir, shipped_recipes_dir
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.plan.planning_inputs import GOLDEN_HOST, GOLDEN_RUN_DIR, isolate_from_user_profiles
from tests.render.shell import assert_bash_parses, assert_shellcheck_clean
from tests.require import under_ci

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_COMMAND = "HPCRL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/render -k golden"
SUFFIXES = (".sbatch", ".problems")


def shipped_profiles() -> dict[str, Path]:
    return {path.stem: path for path in sorted(shipped_profiles_dir().glob("*.yaml"))}


PAIRS = [(recipe, profile) for recipe in list_recipes() for profile in shipped_profiles()]


@pytest.fixture(scope="module")
def recipes_copy():
    """The shipped recipes (and their data) copied under /tmp itself, not $TMPDIR."""
    root = Path(tempfile.mkdtemp(prefix="hpcrl-golden-", dir="/tmp"))
    copy = root / "recipes"
    shutil.copytree(shipped_recipes_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    yield copy
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def golden_environment(monkeypatch, tmp_path, recipes_copy):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    return recipes_copy


def render_pair(recipe_name: str, profile_name: str, recipes_dir: Path) -> tuple[str, str]:
    """(suffix, text): the script, or the problems when the pair does not plan."""
    loaded = load_recipe(recipes_dir / f"{recipe_name}.yaml")
    profile = load_profile(shipped_profiles()[profile_name])
    try:
        spec = plan(
            loaded.recipe,
            profile,
            run_dir=GOLDEN_RUN_DIR,
            recipe_source=recipe_name,
            profile_source=profile_name,
            host=GOLDEN_HOST,
        )
    except ConfigError as error:
        return ".problems", format_problems(error.problems) + "\n"
    return ".sbatch", render_sbatch(spec)


@pytest.mark.parametrize(
    ("recipe_name", "profile_name"), PAIRS, ids=[f"{r}__{p}" for r, p in PAIRS]
)
def test_golden(recipe_name, profile_name, golden_environment):
    suffix, text = render_pair(recipe_name, profile_name, golden_environment)
    stem = f"{recipe_name}__{profile_name}"
    expected_path = GOLDEN_DIR / f"{stem}{suffix}"
    other_path = GOLDEN_DIR / f"{stem}{SUFFIXES[1 - SUFFIXES.index(suffix)]}"
    if os.environ.get("HPCRL_UPDATE_GOLDEN") == "1":
        if under_ci():
            pytest.fail(
                "HPCRL_UPDATE_GOLDEN=1 is refused under CI: it would rewrite the expected files "
                f"and pass. Run `{UPDATE_COMMAND}` locally, review the diff, commit it.",
                pytrace=False,
            )
        expected_path.write_text(text)
        other_path.unlink(missing_ok=True)
    if other_path.exists():
        pytest.fail(
            f"{recipe_name} on {profile_name} now gives a {suffix} but {other_path.name} is expected "
            f"(the pair {'stopped' if suffix == '.problems' else 'started'} planning):\n{text}\n"
            f"If intended, regenerate: {UPDATE_COMMAND}"
        )
    assert expected_path.exists(), (
        f"no golden file {expected_path.name}; create it with: {UPDATE_COMMAND}"
    )
    expected = expected_path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"golden/{expected_path.name}",
                tofile="rendered",
            )
        )
        pytest.fail(
            f"rendered output differs from the golden file:\n{diff}\nIf intended, regenerate: {UPDATE_COMMAND}"
        )
    if suffix == ".sbatch":
        assert_bash_parses(text)
        assert_shellcheck_clean(text)


def test_no_stale_golden_files():
    expected = {f"{recipe}__{profile}{suffix}" for recipe, profile in PAIRS for suffix in SUFFIXES}
    stale = sorted(path.name for path in GOLDEN_DIR.iterdir() if path.name not in expected)
    assert not stale, f"golden files for pairs that no longer exist: {stale}; delete them"


def test_every_shipped_profile_renders_at_least_one_recipe():
    planned = {
        path.name.split("__")[1].removesuffix(".sbatch") for path in GOLDEN_DIR.glob("*.sbatch")
    }
    assert planned == set(shipped_profiles())


@pytest.mark.parametrize("ci_setting", [("CI", "true"), ("HPCRL_REQUIRE_SLURM", "1")])
def test_golden_update_is_refused_under_ci(monkeypatch, golden_environment, tmp_path, ci_setting):
    recipe_name, profile_name = PAIRS[0]
    suffix, text = render_pair(recipe_name, profile_name, golden_environment)
    stale = tmp_path / f"{recipe_name}__{profile_name}{suffix}"
    stale.write_text(text + "# a line an update would remove\n")
    monkeypatch.setitem(globals(), "GOLDEN_DIR", tmp_path)
    for flag in ("CI", "HPCRL_REQUIRE_DEPS", "HPCRL_REQUIRE_SLURM", "HPCRL_REQUIRE_VLLM"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv(*ci_setting)
    monkeypatch.setenv("HPCRL_UPDATE_GOLDEN", "1")
    with pytest.raises(pytest.fail.Exception, match="HPCRL_UPDATE_GOLDEN=1 is refused under CI"):
        test_golden(recipe_name, profile_name, golden_environment)
    assert stale.read_text() == text + "# a line an update would remove\n"
    monkeypatch.delenv(ci_setting[0])  # the same call updates the file outside CI
    test_golden(recipe_name, profile_name, golden_environment)
    assert stale.read_text() == text

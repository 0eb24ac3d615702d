"""``hpcrl diff`` on real rendered run folders, and ``hpcrl completion``'s scripts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpcrl.cli.main import build_parser, main
from tests.plan.planning_inputs import isolate_from_user_profiles


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_diff_names_each_override_and_resolved_key_that_differs(cli):
    assert cli("render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", "a")[0] == 0
    assert cli("render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", "b", "grpo.seed=7",
               "policy.train_global_batch_size=16")[0] == 0  # fmt: skip
    code, out, _ = cli("diff", "a", "b")
    assert code == 0
    assert out == (
        "a: a\nb: b\noverrides:\n  + grpo.seed=7\n  + policy.train_global_batch_size=16\n"
        "resolved recipe (2 key(s) differ):\n  grpo.seed: 42 → 7\n"
        "  policy.train_global_batch_size: 32 → 16\n"
    )
    code, out, _ = cli("diff", "b", "a", "--json")
    assert json.loads(out) == {
        "manifest": {},
        "overrides": {"only_in_a": ["grpo.seed=7", "policy.train_global_batch_size=16"],
                      "only_in_b": []},
        "recipe": {"grpo.seed": [7, 42], "policy.train_global_batch_size": [16, 32]},
    }  # fmt: skip
    assert cli("diff", "a", "a")[1].endswith("same recipe, overrides and provenance\n")
    assert cli("render", "sft-tiny-1n-cpu", "--cluster", "local", "-o", "s")[0] == 0
    out = cli("diff", "a", "s")[1]
    assert "recipe_source: grpo-tiny-1n-cpu → sft-tiny-1n-cpu" in out
    assert "  grpo.max_num_steps: 20 → (absent)" in out


def test_diff_of_a_folder_without_a_recipe_is_one_line(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = cli("diff", "empty", "nope")
    assert code == 1
    assert err == (
        f"hpcrl diff: error: {tmp_path / 'empty'}: no recipe.resolved.yaml (fix: give two run "
        "folders that hpcrl render or submit wrote)\n"
    )


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh"])
def test_completion_scripts_know_every_command_and_complete_folders(cli, shell):
    code, script, _ = cli("completion", shell)
    assert code == 0
    for command in ("validate", "submit", "sweep", "status", "logs", "cancel", "report", "diff"):
        assert command in script
    if shell != "tcsh":  # shtab's tcsh script completes commands and positionals only
        assert "--attempt" in script and "--since" in script
    if shell == "bash":
        assert "_shtab_compgen_dirs" in script
        checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr


def test_the_parser_is_built_without_shtab() -> None:
    """``hpcrl --help`` stays light: only ``hpcrl completion`` imports shtab."""
    code = "import sys; from hpcrl.cli.main import build_parser; build_parser(); print('shtab' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
    assert build_parser().parse_args(["completion", "bash"]).shell == "bash"

"""``hpcrl diff`` on real rendered run folders, and ``hpcrl completion``'s scripts."""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.cli.main import COMMAND_MODULES, SHORT_COMMANDS, build_parser, main
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


#: Every command, in the order ``hpcrl --help`` lists them.
COMMANDS = ("validate", "render", "show", "submit", "sweep", "status", "logs", "cancel",
            "resume", "rerun", "export", "report", "diff", "completion")  # fmt: skip


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (commands,) = [action for action in parser._actions if action.dest == "command"]
    return dict(commands.choices)


def test_the_completion_tests_list_every_command():
    assert tuple(_choices(build_parser())) == COMMANDS


def test_a_command_builds_its_own_module_only_and_parses_as_the_whole_parser():
    """``hpcrl validate ...`` builds the parsers of hpcrl.cli.prepare alone (item 6 of issue
    25: start-up time); the table of which module registers which command is right, and each
    command's parser is the whole parser's."""
    whole = _choices(build_parser())
    assert [c for _, commands in COMMAND_MODULES for c in commands] == list(COMMANDS)
    for module, commands in COMMAND_MODULES:
        registered = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(registered)
        assert tuple(registered.choices) == commands, module
        for command in commands:
            own = _choices(build_parser(command))
            assert tuple(own) == commands
            assert own[command].format_help() == whole[command].format_help()
    assert tuple(_choices(build_parser("no-such-command"))) == COMMANDS


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh"])
def test_completion_scripts_know_every_command_and_complete_folders(cli, shell):
    code, script, _ = cli("completion", shell)
    assert code == 0
    listed = {
        "bash": f"\n_shtab_hpcrl_subparsers=({' '.join(COMMANDS)})\n",
        "tcsh": f"'p/1/({' '.join(COMMANDS)})/'",
    }
    if shell in listed:
        assert listed[shell] in script
    else:  # zsh: one described line per command
        for command in COMMANDS:
            assert f"\n    {command}:'" in script, command
    for command in ("resume", "rerun", "export"):  # RUN is a run folder
        if shell == "zsh":
            options = script.split(f"\n_shtab_hpcrl_{command}_options=(\n", 1)[1].split("\n)")[0]
            assert ':_files -/"' in options, options
        else:
            assert {"bash": f"\n_shtab_hpcrl_{command}_pos_0_COMPGEN=_shtab_compgen_dirs\n",
                    "tcsh": f"'n/{command}/d/'"}[shell] in script, command  # fmt: skip
    if shell != "tcsh":  # tcsh's spells options without their dashes
        assert "--attempt" in script and "--since" in script
    if shell == "tcsh":
        # shtab's tcsh script offers one option list for every command (tcsh's `complete`
        # has no per-command option sets); status --recipe is text, not a file
        assert (
            "'c/--/(attempt best cluster debug driver follow grid help here json no-submit node "
            "out point raw recipe runs-dir since state step verbose version wait wide zip)/'"
        ) in script
        assert "'n/--recipe/f/'" not in script and "'n/submit/f/'" in script
        assert "'n/--cluster/(eos local local-gpu slurm-test slurm-test-pyxis)/'" in script
        assert "'n/completion/(bash zsh tcsh)/'" in script
    if shell == "bash":
        assert "_shtab_compgen_dirs" in script
        checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["status", "--s"], ["--state", "--since"]),
        (["logs", "--at"], ["--attempt"]),
        (["completion", ""], ["bash", "zsh", "tcsh"]),
        (["sub"], ["submit"]),
    ],
)
def test_bash_completes_options_per_command(cli, words, expected):
    """The bash script, sourced, completes as a shell would (COMP_WORDS at the cursor)."""
    _, script, _ = cli("completion", "bash")
    words_text = " ".join(f"'{word}'" for word in ["hpcrl", *words])
    probe = (f"source /dev/stdin; COMP_WORDS=({words_text}); COMP_CWORD={len(words)}; "
             "_shtab_hpcrl; printf '%s\\n' \"${COMPREPLY[@]}\"")  # fmt: skip
    done = subprocess.run(["bash", "-c", probe], input=script, text=True, capture_output=True)
    assert done.stdout.splitlines() == expected, done.stderr


def test_the_parser_is_built_without_shtab() -> None:
    """``hpcrl --help`` stays light: only ``hpcrl completion`` imports shtab."""
    code = "import sys; from hpcrl.cli.main import build_parser; build_parser(); print('shtab' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
    assert build_parser().parse_args(["completion", "bash"]).shell == "bash"


def _complete(script: str, words: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    words_text = " ".join(f"'{word}'" for word in ["hpcrl", *words])
    probe = (f"source /dev/stdin; COMP_WORDS=({words_text}); COMP_CWORD={len(words)}; "
             "_shtab_hpcrl; printf '%s\\n' \"${COMPREPLY[@]}\"")  # fmt: skip
    done = subprocess.run(["bash", "-c", probe], input=script, text=True, capture_output=True,
                          cwd=cwd, env=env)  # fmt: skip
    assert not done.stderr, done.stderr
    return sorted(line for line in done.stdout.splitlines() if line)


def test_bash_completes_profile_and_recipe_names(cli, tmp_path):
    """``--cluster <TAB>``: the shipped profiles and the user's own, as they are when
    completing; ``submit grpo<TAB>``: shipped recipes, recipe files and folders, never
    ``__init__.py`` or ``__pycache__`` (issue 26 item 10: 167264e completed files only)."""
    _, script, _ = cli("completion", "bash")
    config = tmp_path / "config"
    (config / "hpcrl" / "cluster_profiles").mkdir(parents=True)
    (config / "hpcrl" / "cluster_profiles" / "mysite.yaml").write_text("name: mysite\n")
    work = tmp_path / "work"
    (work / "__pycache__").mkdir(parents=True)
    (work / "grpo-folder").mkdir()
    for name in ("__init__.py", "grpo-mine.yaml", "grpo-notes.txt"):
        (work / name).write_text("")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(config)}
    assert _complete(script, ["submit", "x.yaml", "--cluster", ""], work, env) == [
        "eos", "local", "local-gpu", "mysite", "slurm-test", "slurm-test-pyxis"
    ]  # fmt: skip
    assert _complete(script, ["validate", "--cluster", "local", "grpo-l"], work, env) == [
        "grpo-llama-1b-1n1g-automodel", "grpo-llama-1b-1n1g-megatron",
        "grpo-llama3.1-8b-1n1g-automodel", "grpo-llama3.1-8b-1n1g-megatron",
        "grpo-llama3.1-8b-2n8g-automodel",
    ]  # fmt: skip
    found = _complete(script, ["submit", "grpo"], work, env)
    assert "grpo-mine.yaml" in found and "grpo-folder" in found and "grpo-tiny-1n-cpu" in found
    assert "grpo-notes.txt" not in found
    assert _complete(script, ["submit", "_"], work, env) == []  # no __init__.py, __pycache__


def test_the_collector_stays_off_for_short_commands_only(cli, tmp_path):
    """``hpcrl.cli.main.run`` (the script) turns Python's cyclic garbage collector off for
    start-up (~10 ms of a validate: docs/performance.md, item 6): a short command keeps it off
    to its end, any other gets it back before its work; ``main`` alone leaves it as found.
    ``run`` freezes what the command made before the interpreter's exit (its last collection
    skips it)."""
    assert SHORT_COMMANDS < set(COMMANDS)
    assert cli("validate", "grpo-tiny-1n-cpu", "--cluster", "local")[0] == 0
    assert gc.isenabled()  # main() in a process of its own caller: untouched
    gc.disable()  # as run() leaves it
    try:
        assert cli("validate", "grpo-tiny-1n-cpu", "--cluster", "local")[0] == 0
        assert not gc.isenabled()
        cli("status", str(tmp_path / "no-such-run"))  # fails, after the collector is back
        assert gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
    script = subprocess.run(
        [sys.executable, "-c", "import gc, sys; sys.argv[1:] = ['validate', 'grpo-tiny-1n-cpu', "
         "'--cluster', 'local']; import atexit; "
         "atexit.register(lambda: print(gc.isenabled(), gc.get_freeze_count() > 0)); "
         "from hpcrl.cli.main import run; run()"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert script.stdout.splitlines()[-1] == "False True"  # off, and frozen for the exit

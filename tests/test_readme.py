"""A newcomer's run-through of README.md (issue 26, "Done when"): the commands of its "Using
it" block, read from the README itself, do what the README says.

The Quickstart's command (a real local run to the documented reward) is run by
tests/core/test_demo.py. Here, with the user's own copy of the ``eos`` profile that the README
and the profile's header ask for (account and project set; the checkout's data mounted, as
``validate`` asks when the checkout is not under /lustre): ``validate``, ``render`` and ``show``
succeed as printed, ``render`` writes ``runs/<name>/job.sbatch``, and ``submit`` and ``sweep``
pass every check and reach ``sbatch`` (a stand-in that refuses: nothing reaches a cluster).
With the shipped profile, ``submit`` refuses its placeholders, as the README says. The lines
that take a RUN are forms: every option they show must be one the command has."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles
from tests.robust.harness import write_scheduler_standins

REPO = Path(__file__).resolve().parents[1]
PLANNING = ("validate", "render", "show", "submit", "sweep")


def using_it_commands() -> list[list[str]]:
    """The "Using it" block's commands as argv (continuation lines joined, comments cut)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Using it", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def planning_commands() -> list[list[str]]:
    return [argv for argv in using_it_commands() if argv[:1] == ["hpcrl"] and argv[1] in PLANNING]


@pytest.fixture
def newcomer(tmp_path, monkeypatch, capsys):
    """A shell in an empty folder, with sbatch/sacct stand-ins first on PATH; runs ``hpcrl``
    in-process and gives (exit code, stdout, stderr on one line)."""
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    standins = write_scheduler_standins(tmp_path / "bin", "empty")  # sbatch refuses
    monkeypatch.setenv("PATH", f"{standins}:/usr/bin:/bin")

    def run(argv: list[str]) -> tuple[int, str, str]:
        assert argv[0] == "hpcrl"
        args = [str(REPO / word) if word.startswith("recipes/") else word for word in argv[1:]]
        code = main(args)
        out, err = capsys.readouterr()
        return code, out, " ".join(err.split())

    return run


def own_eos_copy(folder: Path) -> Path:
    """The shipped eos profile as a user's copy: account and project set, and the checkout's
    data folder mounted read-only (the fix ``validate`` names)."""
    text = (REPO / "cluster_profiles" / "eos.yaml").read_text()
    text = text.replace("your_account", "acct").replace("your_project", "proj")
    data = REPO / "recipes" / "data"
    mount = "    - /lustre:/lustre\n"
    assert mount in text
    text = text.replace(mount, f"{mount}    - {data}:{data}:ro\n")
    folder.mkdir()
    (folder / "eos.yaml").write_text(text)
    return folder


def test_the_readme_shows_each_planning_command_once():
    assert [argv[1] for argv in planning_commands()] == list(PLANNING)


def test_the_planning_commands_run_as_printed_with_the_users_eos_copy(
    newcomer, tmp_path, monkeypatch
):
    monkeypatch.setenv("HPCRL_CLUSTER_PROFILES", str(own_eos_copy(tmp_path / "profiles")))
    results, scripts = {}, []
    for argv in planning_commands():
        results[argv[1]] = newcomer(argv)
        if argv[1] == "render":
            scripts = [path.read_text() for path in (tmp_path / "runs").glob("*/job.sbatch")]
    for command in ("validate", "render", "show"):
        code, _, err = results[command]
        assert code == 0, (command, err)
        assert " error " not in f" {err} ", (command, err)
    said = results["validate"][1].splitlines()[-1]
    assert said.startswith(f"OK: {REPO}/recipes/grpo-qwen2-1.5b-2n8g-megatron.yaml plans on eos")
    (script,) = scripts  # "writes runs/<name>/job.sbatch"
    assert results["show"][1] == script  # the script render wrote
    assert "'--container-image=nvcr.io#nvidia/nemo-rl:v0.7.0'" in script
    for command in ("submit", "sweep"):  # every check passed: only the scheduler said no
        code, _, err = results[command]
        assert code == 1 and "Batch job submission failed: Invalid account" in err, err


def test_submit_refuses_the_shipped_profiles_placeholders(newcomer):
    (submit,) = [argv for argv in planning_commands() if argv[1] == "submit"]
    code, _, err = newcomer(submit)
    assert code == 2, err
    assert "error profile[eos] 5 values still hold the example profile's placeholders: " in err
    assert "slurm.account ('your_account')" in err
    assert "sbatch" not in err


def test_every_option_the_readme_shows_is_one_the_command_has(capsys):
    forms = [argv for argv in using_it_commands() if argv[:1] == ["hpcrl"]]
    assert {argv[1] for argv in forms} >= {
        "status", "logs", "cancel", "report", "diff", "resume", "rerun", "export"
    }  # fmt: skip
    for argv in forms:
        options = {word.strip("[]").split("|")[0] for word in argv if word.startswith(("-", "[-"))}
        with pytest.raises(SystemExit):
            main([argv[1], "--help"])
        helped = capsys.readouterr().out
        missing = sorted(option for option in options if option not in helped)
        assert not missing, f"hpcrl {argv[1]} has no {missing}"


def test_the_completion_line_prints_a_bash_script(capsys):
    (line,) = [argv for argv in using_it_commands() if argv[0] == "eval"]
    assert line == ["eval", "$(hpcrl completion bash)"]
    assert main(["completion", "bash"]) == 0
    assert capsys.readouterr().out.endswith("complete -o bashdefault -F _shtab_hpcrl hpcrl")

"""``submit`` checks what ``validate`` checks (issue 26 item 4): one function
(``hpcrl.plan.environment.environment_problems``) runs after planning for every command, so
each case below gives the same problems through both commands. ``submit`` adds only its own
(placeholders are errors). Through the real CLI; scheduler commands are the corpus's
stand-ins (tests/robust/harness.py), so nothing reaches the shared cluster: ``sbatch`` refuses
whatever the check lets through."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles
from tests.robust.harness import write_scheduler_standins

CASES = {
    # name: (argv after the command, the problem's text as the CLI prints it)
    "job-python-lacks-vllm": (
        ("grpo-tiny-vllm-1n-cpu", "--cluster", "local"),
        "error python = '{python}' the job's Python lacks vllm (vLLM generation needs "
        "vllm>=0.32,<0.33) fix: install vllm>=0.32,<0.33 for that Python, or set the profile's "
        "python to one that has it",
    ),
    "no-such-tiny-model": (
        ("grpo-tiny-1n-cpu", "--cluster", "local", "policy.model_name=tiny:nope"),
        "error policy.model_name = 'tiny:nope' not one of hpcrl's built-in tiny models: the job "
        "would fail to build it fix: use one of tiny:qwen2, tiny:llama, tiny:llama-1b, "
        "tiny:llama3.1-8b, tiny:llama3.2-3b, tiny:qwen3, tiny:mistral, tiny:qwen2-vllm, or a Hugging Face name or local folder",
    ),
    "data-outside-every-mount": (
        ("grpo-tiny-2n-cpu", "--cluster", "slurm-test-pyxis", "data.train_path={data}"),
        "error data.train_path = '{data}' on this machine but under no container mount, so the "
        "job inside the container would not find it fix: add "
        "{data_dir}:{data_dir}:ro to the profile's container.mounts, or move the file under a "
        "mounted folder",
    ),
    "run-folder-under-tmp": (
        ("grpo-tiny-2n-cpu", "--cluster", "slurm-test"),
        "warning run_dir the run folder is under /tmp, which on most clusters is each "
        "machine's own disk: if so, the compute nodes cannot see it and the job fails as it "
        "starts fix: write runs to a filesystem every node mounts (-o/--out, e.g. "
        "under /lustre or your home), unless this cluster shares it",
    ),
}


@pytest.fixture
def data_outside_tmp():
    """A data file outside /tmp (slurm-test-pyxis mounts /tmp, where pytest's folders are)."""
    folder = Path(tempfile.mkdtemp(prefix="hpcrl-one-check-", dir="/var/tmp"))
    data = folder / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n' * 64)
    yield data
    shutil.rmtree(folder)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run ``hpcrl`` in-process in ``tmp_path``; (exit code, stderr on one line)."""
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    standins = write_scheduler_standins(tmp_path / "bin", "empty")  # sbatch refuses
    monkeypatch.setenv("PATH", f"{standins}:/usr/bin:/bin")

    def run(*argv: str) -> tuple[int, str]:
        code = main(list(argv))
        return code, " ".join(capsys.readouterr().err.split())

    return run


def problems_of(stderr: str) -> list[str]:
    """Each problem as printed (severity, path, value, message, fix), on one line."""
    start = re.search(r"\b(error|warning) ", stderr)
    end = re.search(r"\d+ errors?, \d+ warnings?", stderr)
    assert start and end, stderr
    listed = stderr[start.start() : end.start()].strip()
    return re.split(r" (?=(?:error|warning) [\w.\[\]-]+ )", listed)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_validate_and_submit_find_the_same_problems(case, cli, tmp_path, data_outside_tmp):
    argv_text, expected = CASES[case]
    fill = {"data": str(data_outside_tmp), "data_dir": str(data_outside_tmp.parent),
            "python": str(Path(sys.executable).parent / "python")}  # fmt: skip
    argv = [word.format(**fill) for word in argv_text]
    validate_code, validate_err = cli("validate", *argv)
    submit_code, submit_err = cli("submit", *argv)
    written = sorted((tmp_path / "runs").glob("grpo-*"))
    fill["run_dir"] = str(written[0]) if written else ""
    found = problems_of(validate_err)
    assert expected.format(**fill) in found, found
    assert problems_of(submit_err) == found
    if expected.startswith("error"):
        assert (validate_code, submit_code) == (2, 2)
        assert written == []  # refused before a folder was written
    else:
        assert validate_code == 0
        assert "Batch job submission failed" in submit_err  # the stand-in refused it


def test_the_planner_knows_every_tiny_model_the_job_builds():
    """The login side's list of ``tiny:`` names (it may not import the job side) is the job's."""
    from hpcrl.config.tiny_models import TINY_MODEL_NAMES, TINY_PREFIX
    from hpcrl.core.models.tiny import TINY_PREFIX as JOB_PREFIX
    from hpcrl.core.models.tiny import TINY_SPECS

    assert (TINY_MODEL_NAMES, TINY_PREFIX) == (tuple(TINY_SPECS), JOB_PREFIX)

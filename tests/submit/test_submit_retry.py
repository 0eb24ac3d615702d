"""A submission that fails leaves a folder that can be submitted again (issue 26 item 3), and
a hanging sbatch cannot hang ``hpcrl submit``. The refusal on the real cluster is in
tests/submit/test_slurm_jobs.py; here ``sbatch`` is a stand-in script on PATH that never
answers (a real Slurm controller cannot be made to hang on demand), with ``srun`` and
``scontrol`` stand-ins beside it so submitit takes the machine for a Slurm login node."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpcrl.cli.main import main
from hpcrl.run.folder_lock import holds_submitted_job
from tests.plan.planning_inputs import isolate_from_user_profiles

RECIPE = "grpo-tiny-2n-cpu"


@pytest.fixture
def hanging_sbatch(tmp_path, monkeypatch):
    """PATH with an sbatch that sleeps (until killed) and records that it ran."""
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "sbatch": f'#!/bin/sh\n# stand-in: a controller that never answers\necho "$@" >> '
        f"{tmp_path}/sbatch.calls\nexec sleep 600\n",
        "srun": "#!/bin/sh\n# stand-in: never run here\nexit 1\n",
        "scontrol": "#!/bin/sh\n# stand-in\nexit 1\n",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("HPCRL_SBATCH_TIMEOUT_S", "2")
    return tmp_path


def test_a_hanging_sbatch_is_given_up_on_naming_the_command_and_the_time(hanging_sbatch, capsys):
    run = hanging_sbatch / "runs" / "x"
    started = time.monotonic()
    code = main(["submit", RECIPE, "--cluster", "slurm-test", "-o", str(run)])
    took_s = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 1
    assert took_s < 30, took_s  # 167264e waited for sbatch for ever
    err = err[err.index("not submitted: ") :]  # after the warnings (a run folder under /tmp)
    assert err.startswith(
        f"not submitted: sbatch did not answer within 2 s (sbatch {run}/job.sbatch): the Slurm "
        "controller is overloaded or down; the job may have been queued anyway\n"
        "fix: check with squeue --me --name grpo-tiny-2n-cpu before running the same command "
        "again (it reuses the run folder); HPCRL_SBATCH_TIMEOUT_S=SECONDS waits longer"
    ), err
    assert (hanging_sbatch / "sbatch.calls").read_text().count("\n") == 1
    # the folder is as rendered, saying why it was not submitted, and may be submitted again
    assert not holds_submitted_job(run) and not (run / "submitit").exists()
    note = json.loads((run / "submit_failed.json").read_text())
    assert note["error"] == (
        "sbatch did not answer within 2 s (the job may have been queued anyway)"
    )
    assert main(["status", "--json", str(run)]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    assert status["state"] == "NOT_SUBMITTED"
    assert status["cause"] == f"{note['error']} ({note['at']})"
    assert main(["submit", RECIPE, "--cluster", "slurm-test", "-o", str(run)]) == 1
    assert "sbatch did not answer within 2 s" in capsys.readouterr().err  # tried, not refused
    assert (hanging_sbatch / "sbatch.calls").read_text().count("\n") == 2


def test_a_folder_holds_a_job_by_its_record_or_submitits_files_of_a_job_id(tmp_path: Path):
    run = tmp_path / "run"
    (run / "submitit").mkdir(parents=True)
    (run / "submitit" / "0123456789abcdef0123456789abcdef.pkl").write_text("")
    assert not holds_submitted_job(run)  # what a failed submission leaves
    (run / "submitit" / "41_submitted.pkl").write_text("")
    assert holds_submitted_job(run)  # the record could not be written, the job is real
    (run / "submitit" / "41_submitted.pkl").unlink()
    (run / "job.json").write_text("{}")
    assert holds_submitted_job(run)

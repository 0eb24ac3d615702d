"""The plan of an export job: a run's checkpoint → a Hugging Face folder, on a compute node.

``hpcrl export RUN`` on a Slurm run submits one task on one node that runs the export module
(``python -m hpcrl.core.export``) with exactly what the run's job had: its Python and code
(``JobSpec.code``), container image and mounts, environment (``HF_HOME``, ...), setup lines,
account, partition, QoS and node shape (an 8B model's weights need a compute node's memory,
and Megatron's conversion needs megatron-bridge, which lives in the job's image, not on the
login node). Only what makes it a training job goes: its node count, the array, the
preemption signal and requeue. It converts on the node's CPU; its submitit files and logs go
to ``RUN/exports/submitit``.

Everything here is derived from the run's ``JobSpec`` (read back from ``jobspec.json``): the
export job never re-plans the run.
"""

from __future__ import annotations

import posixpath

import attrs

from hpcrl.config.shared_methods import SharedMethods
from hpcrl.plan.mounts import parse_mount, same_path_mount
from hpcrl.run.jobspec import SUBMITIT_TASK_TAIL, JobSpec

EXPORTS_DIR_NAME = "exports"
EXPORT_MODULE = "hpcrl.core.export"
#: The run's #SBATCH keys an export job does not take over (it sets its own or none).
TRAINING_ONLY_DIRECTIVES = frozenset(
    {"job-name", "nodes", "ntasks-per-node", "output", "error", "open-mode", "signal",
     "requeue", "array"}
)  # fmt: skip


@attrs.frozen(kw_only=True)
class ExportJob(SharedMethods):
    """One export, planned. ``export_argv`` is what the task runs (the job's Python and
    code, then ``-m hpcrl.core.export RUN CHECKPOINT OUT``); ``task_argv`` is submitit's task
    command around it; ``run`` is the run's plan (env, setup lines, pass_env, code)."""

    run: JobSpec
    step: int
    checkpoint_dir: str
    out_dir: str
    job_name: str
    sbatch_directives: tuple[tuple[str, str | None], ...]
    srun_args: tuple[str, ...]
    export_argv: tuple[str, ...]
    task_argv: tuple[str, ...]
    submitit_folder: str
    stdout_path: str
    stderr_path: str

    @property
    def python_command(self) -> str:
        """What submitit calls ``python``: the task command before ``-u -m``."""
        import shlex

        return shlex.join(self.task_argv[: -len(SUBMITIT_TASK_TAIL) - 1])

    @property
    def task_command(self) -> str:
        import shlex

        return shlex.join(self.task_argv)


def export_argv(run: JobSpec, checkpoint_dir: str, out_dir: str) -> tuple[str, ...]:
    """The export module under the run's own Python and code (bundle entry included)."""
    return (*run.code.entry_argv, "-u", "-m", EXPORT_MODULE, run.run_dir, checkpoint_dir, out_dir)


def default_out_dir(run_dir: str, step: int) -> str:
    return posixpath.join(run_dir, EXPORTS_DIR_NAME, f"step_{step:06d}")


def plan_export_job(run: JobSpec, step: int, checkpoint_dir: str, out_dir: str) -> ExportJob:
    """The export job of ``checkpoint_dir`` (step ``step`` of the run ``run``) → ``out_dir``
    (absolute paths; ``out_dir``'s parent must exist: a container mounts it)."""
    assert run.scheduler == "slurm", "local runs export in a subprocess, not a job"
    folder = posixpath.join(run.run_dir, EXPORTS_DIR_NAME, "submitit")
    stdout, stderr = f"{folder}/%j_%t_log.out", f"{folder}/%j_%t_log.err"
    directives = {key: value for key, value in run.sbatch_directives
                  if key not in TRAINING_ONLY_DIRECTIVES}  # fmt: skip
    job_name = f"{run.job_name}-export"
    directives.update({
        "job-name": job_name, "nodes": "1", "ntasks-per-node": "1", "open-mode": "append",
        "output": stdout.replace("%t", "0"), "error": stderr.replace("%t", "0"),
    })  # fmt: skip
    argv = export_argv(run, checkpoint_dir, out_dir)
    return ExportJob(
        run=run, step=step, checkpoint_dir=checkpoint_dir, out_dir=out_dir, job_name=job_name,
        sbatch_directives=tuple(sorted(directives.items())),
        srun_args=_srun_args(run, (stdout, stderr), posixpath.dirname(out_dir)),
        export_argv=argv,
        task_argv=(*run.code.entry_argv, *SUBMITIT_TASK_TAIL, folder),
        submitit_folder=folder, stdout_path=stdout, stderr_path=stderr,
    )  # fmt: skip


def _srun_args(run: JobSpec, log_paths: tuple[str, str], out_parent: str) -> tuple[str, ...]:
    """The run's srun arguments with the export's log paths and, in a container, a 1:1
    mount of the folder the export is written into when no mount shows it there."""
    stdout, stderr = log_paths
    replaced = {f"--output={run.stdout_path}": f"--output={stdout}",
                f"--error={run.stderr_path}": f"--error={stderr}"}  # fmt: skip
    args = [replaced.get(arg, arg) for arg in run.srun_args]
    assert len(set(args) & set(replaced)) == 0 and f"--output={stdout}" in args, run.srun_args
    if run.container is None:
        return tuple(args)
    mounts = [mount for text in run.container.mounts if (mount := parse_mount(text))]
    extra = same_path_mount(out_parent, mounts)
    if extra is None:
        return tuple(args)
    all_mounts = f"--container-mounts={','.join((*run.container.mounts, extra))}"
    for index, arg in enumerate(args):
        if arg.startswith("--container-mounts="):
            args[index] = all_mounts
            return tuple(args)
    image = next(i for i, arg in enumerate(args) if arg.startswith("--container-image="))
    args.insert(image + 1, all_mounts)
    return tuple(args)

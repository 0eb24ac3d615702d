"""``JobSpec`` → script text: pure and deterministic (no clock, no host, no user)."""

from __future__ import annotations

from hpcrl.plan.export_job import ExportJob
from hpcrl.render.environment import environment
from hpcrl.run.jobspec import JobSpec

SLURM_TEMPLATE = "job.sbatch.sh.j2"
LOCAL_TEMPLATE = "job.local.sh.j2"


def render_sbatch(spec: JobSpec) -> str:
    """The job script for ``spec``: an sbatch/pyxis script on Slurm, a bash script on local."""
    _assert_single_line_directives(spec)
    name = SLURM_TEMPLATE if spec.scheduler == "slurm" else LOCAL_TEMPLATE
    return environment().get_template(name).render(spec=spec)


def _assert_single_line_directives(spec: JobSpec) -> None:
    # #SBATCH lines are comments: a line break would end one and start a command.
    for key, value in spec.sbatch_directives:
        assert "\n" not in key and (value is None or not any(c in value for c in "\n\r\0")), (
            key,
            value,
        )


EXPORT_TEMPLATE = "export.sbatch.sh.j2"


def render_export_script(job: ExportJob) -> str:
    """The sbatch script of an export job (``hpcrl.plan.export_job``): pure, like the run's."""
    for key, value in job.sbatch_directives:
        assert "\n" not in key and (value is None or not any(c in value for c in "\n\r\0"))
    return environment().get_template(EXPORT_TEMPLATE).render(spec=job.run, job=job)

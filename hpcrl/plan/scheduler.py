"""Slurm-facing parts of a plan: ``#SBATCH`` directives, srun arguments, submitit's log paths.

Values here end up on ``#SBATCH`` lines, which are shell comments: a newline in one would
end the comment and turn the rest into a command, so single-line values are enforced here.
"""

from __future__ import annotations

import re

from hpcrl.config.profile import ClusterProfile
from hpcrl.plan.findings import Findings
from hpcrl.plan.layout import profile_path
from hpcrl.run.jobspec import SUBMITIT_SIGNAL, ContainerSpec

_EXTRA_ARG = re.compile(r"--([a-z][a-z0-9-]*)(?:=(.+))?")
_TIME_LIMIT = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+")

#: #SBATCH keys hpcrl sets itself, and the profile field to use instead of a raw argument.
OWNED_SBATCH_KEYS = {
    "job-name": "the recipe file name",
    "nodes": "cluster.num_nodes in the recipe (every node of the job, generation's included)",
    "ntasks-per-node": "nothing (hpcrl runs one task per node)",
    "output": "nothing (submitit's log paths are fixed)",
    "error": "nothing (submitit's log paths are fixed)",
    "open-mode": "nothing",
    "signal": "slurm.signal_delay_s",
    "array": "hpcrl sweep",
    "time": "slurm.time_limit",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "mem": "slurm.mem_gb",
    "exclusive": "slurm.exclusive",
    "gres": "gpus_per_node and slurm.gres_form",
    "gpus-per-node": "gpus_per_node and slurm.gres_form",
    "cpus-per-task": "cpus_per_node",
    "requeue": "nothing (submitit requeues on timeout/preemption)",
}


def submitit_log_paths(run_dir: str, is_array: bool) -> tuple[str, str, str]:
    """``(folder, stdout, stderr)`` exactly as submitit's ``JobPaths`` names per-task logs."""
    folder = f"{run_dir}/submitit"
    job_id = "%A_%a" if is_array else "%j"
    return folder, f"{folder}/{job_id}_%t_log.out", f"{folder}/{job_id}_%t_log.err"


def single_line_problem(value: str) -> bool:
    """True when ``value`` cannot sit on an #SBATCH line: any control or other non-printable
    character (line breaks of every kind, NUL, tabs) is refused, not escaped."""
    return not value.isprintable()


def sbatch_directives(
    num_nodes: int,
    profile: ClusterProfile,
    job_name: str,
    log_paths: tuple[str, str],
    array: tuple[int, int] | None,
    findings: Findings,
) -> tuple[tuple[str, str | None], ...]:
    """Sorted ``(key, value)`` pairs; ``None`` marks a bare flag."""
    slurm = profile.slurm
    stdout, stderr = log_paths
    directives: dict[str, str | None] = {
        "job-name": job_name,
        "nodes": str(num_nodes),  # training + separate generation nodes
        "ntasks-per-node": "1",
        "time": slurm.time_limit,
        # the batch step is task 0 of no srun step: submitit names its log with task 0
        "output": stdout.replace("%t", "0"),
        "error": stderr.replace("%t", "0"),
        "signal": f"{SUBMITIT_SIGNAL}@{slurm.signal_delay_s}",
        "open-mode": "append",
        "requeue": None,
    }
    if profile.device == "gpu" and slurm.gres_form == "gres":
        directives["gres"] = f"gpu:{profile.gpus_per_node}"
    elif profile.device == "gpu" and slurm.gres_form == "gpus_per_node":
        directives["gpus-per-node"] = str(profile.gpus_per_node)
    if profile.cpus_per_node:
        directives["cpus-per-task"] = str(profile.cpus_per_node)
    if slurm.mem_gb is not None:
        directives["mem"] = f"{slurm.mem_gb}G"
    if slurm.exclusive:
        directives["exclusive"] = None
    for key in ("partition", "account", "qos"):
        if getattr(slurm, key):
            directives[key] = getattr(slurm, key)
    if array is not None:
        size, parallelism = array
        directives["array"] = f"0-{size - 1}%{min(size, parallelism)}"
    _check_time_limit(profile, findings)
    _check_single_line(profile, directives, findings)
    directives.update(_extra_sbatch_args(profile, findings))
    return tuple(sorted(directives.items()))


def srun_args(
    profile: ClusterProfile, container: ContainerSpec | None, log_paths: tuple[str, str]
) -> tuple[str, ...]:
    """One task per node; pyxis container options when the profile has a container."""
    stdout, stderr = log_paths
    args = [
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        f"--output={stdout}",
        f"--error={stderr}",
    ]
    if container is not None:
        args.append(f"--container-image={container.image}")
        if container.mounts:
            args.append(f"--container-mounts={','.join(container.mounts)}")
        if container.workdir:
            args.append(f"--container-workdir={container.workdir}")
        if not container.mount_home:
            args.append("--no-container-mount-home")
    args.extend(profile.slurm.srun_args)
    return tuple(args)


def _extra_sbatch_args(profile: ClusterProfile, findings: Findings) -> dict[str, str | None]:
    extra: dict[str, str | None] = {}
    for index, text in enumerate(profile.slurm.sbatch_args):
        path = profile_path(profile, f"slurm.sbatch_args[{index}]")
        match = _EXTRA_ARG.fullmatch(text)
        if match is None or single_line_problem(text):
            findings.error(
                path,
                "an extra sbatch argument is one long option, --key or --key=value, printable, on one line",
                value=text,
                fix='write it like "--reservation=my_resv" or "--constraint=h100"',
            )
            continue
        key, value = match.group(1), match.group(2)
        if key in OWNED_SBATCH_KEYS:
            findings.error(
                path,
                f"hpcrl sets --{key} itself",
                value=text,
                fix=f"remove it from slurm.sbatch_args; set {OWNED_SBATCH_KEYS[key]} instead",
            )
            continue
        extra[key] = value
    return extra


def _check_time_limit(profile: ClusterProfile, findings: Findings) -> None:
    if not _TIME_LIMIT.fullmatch(profile.slurm.time_limit):
        findings.error(
            profile_path(profile, "slurm.time_limit"),
            "not a Slurm time limit",
            value=profile.slurm.time_limit,
            fix='write it as "HH:MM:SS" or "D-HH:MM:SS", e.g. "04:00:00"',
        )


def _check_single_line(
    profile: ClusterProfile, directives: dict[str, str | None], findings: Findings
) -> None:
    for key, value in directives.items():
        if value is not None and single_line_problem(value):
            findings.error(
                profile_path(profile, f"slurm.{key}")
                if key in ("partition", "account", "qos")
                else key,
                "an #SBATCH value must be one line of printable characters (no line breaks or control characters)",
                value=value,
                fix="remove the line break",
            )

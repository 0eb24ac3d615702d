"""Cross-field rules of a cluster profile (allocation vs recipe is the planner's job)."""

from __future__ import annotations

import re

import attrs

from hpcrl.config.errors import Problem
from hpcrl.config.port_bands import FIRST_BAND_PORT, bands_end
from hpcrl.config.profile import ClusterProfile

# Slurm's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
SLURM_TIME = re.compile(r"^\d+(:\d{1,2}){0,2}$|^\d+-\d{1,2}(:\d{1,2}){0,2}$")
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "APIKEY")


def check_profile(profile: ClusterProfile) -> list[Problem]:
    """Every profile rule's problems, in a fixed order."""
    problems: list[Problem] = []
    for rule in PROFILE_RULES:
        problems += rule(profile)
    return problems


def rule_counts_positive(profile: ClusterProfile) -> list[Problem]:
    problems = []
    if profile.device == "gpu" and profile.gpus_per_node != "auto" and profile.gpus_per_node < 1:
        problems.append(
            _positive(
                "gpus_per_node",
                profile.gpus_per_node,
                "GPU profiles need at least one GPU per node",
            )
        )
    if profile.device == "cpu" and profile.worker_slots_per_node < 1:
        problems.append(
            _positive(
                "worker_slots_per_node",
                profile.worker_slots_per_node,
                "CPU profiles run this many workers per node",
            )
        )
    if profile.cpus_per_node is not None and profile.cpus_per_node < 1:
        problems.append(
            _positive("cpus_per_node", profile.cpus_per_node, "or remove it for Slurm's default")
        )
    if profile.slurm.mem_gb is not None and profile.slurm.mem_gb < 1:
        problems.append(
            _positive("slurm.mem_gb", profile.slurm.mem_gb, "or remove it for Slurm's default")
        )
    return problems


def rule_auto_gpus_only_here(profile: ClusterProfile) -> list[Problem]:
    if profile.gpus_per_node != "auto" or profile.scheduler == "local":
        return []
    return [
        Problem(
            path="gpus_per_node",
            value="auto",
            message="auto counts the GPUs of the machine running hpcrl, which is not where a "
            "Slurm job runs",
            fix="set gpus_per_node to the GPUs of one compute node, e.g. gpus_per_node: 8",
        )
    ]


def rule_bundle_packages(profile: ClusterProfile) -> list[Problem]:
    problems = [
        Problem(
            path=f"bundle_packages[{index}]",
            value=name,
            message="not a distribution name",
            fix="write the name pip knows it by, e.g. einops (no versions: the installed one is copied)",
        )
        for index, name in enumerate(profile.bundle_packages)
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name)
    ]
    if profile.bundle_packages and profile.code_mode == "installed":
        problems.append(
            Problem(
                path="bundle_packages",
                value=list(profile.bundle_packages),
                message="only a code bundle carries extra packages, and this profile runs the "
                "installed code (code: installed)",
                fix="set code: bundle, or remove bundle_packages",
                severity="warning",
            )
        )
    return problems


def rule_time_limit(profile: ClusterProfile) -> list[Problem]:
    if SLURM_TIME.match(profile.slurm.time_limit):
        return []
    return [
        Problem(
            path="slurm.time_limit",
            value=profile.slurm.time_limit,
            message="not a Slurm time limit",
            fix='write [D-]HH:MM:SS, e.g. slurm.time_limit: "04:00:00"',
        )
    ]


def rule_cpu_profile_without_gres(profile: ClusterProfile) -> list[Problem]:
    if profile.device != "cpu" or profile.slurm.gres_form == "none" or profile.scheduler != "slurm":
        return []
    return [
        Problem(
            path="slurm.gres_form",
            value=profile.slurm.gres_form,
            message="a CPU profile (device: cpu) must not request GPUs",
            fix="set slurm.gres_form: none",
        )
    ]


def rule_gpu_profile_requests_gpus(profile: ClusterProfile) -> list[Problem]:
    if profile.device != "gpu" or profile.scheduler != "slurm" or profile.slurm.gres_form != "none":
        return []
    return [
        Problem(
            path="slurm.gres_form",
            value="none",
            message="a GPU profile that requests no GPUs relies on the site handing them out anyway",
            fix="set slurm.gres_form: gres (--gres=gpu:N) or gpus_per_node (--gpus-per-node=N)",
            severity="warning",
        )
    ]


def rule_container_needs_slurm(profile: ClusterProfile) -> list[Problem]:
    if profile.container is None or profile.scheduler == "slurm":
        return []
    return [
        Problem(
            path="container",
            value=profile.container.image,
            message="containers run through pyxis on srun; the local scheduler runs on this machine directly",
            fix="remove the container section, or use scheduler: slurm on a cluster with pyxis",
        )
    ]


def rule_ray_ports(profile: ClusterProfile) -> list[Problem]:
    ports = profile.ray_ports.named  # the ports the profile sets; the rest come from the job's band
    problems = [
        Problem(
            path=f"ray_ports.{name}",
            value=port,
            message="not a TCP port",
            fix="use a port in 1024..32767",
        )
        for name, port in ports.items()
        if not 1024 <= port <= 65535
    ]
    problems += _worker_range_problems(ports)
    fixed = {
        name: port
        for name, port in ports.items()
        if name not in ("min_worker_port", "max_worker_port")
    }
    problems += _duplicate_ports(fixed) + _ports_in_worker_band(fixed, ports)
    uses_band = len(ports) < len(attrs.fields(type(profile.ray_ports)))
    return problems + _ports_in_job_bands(ports, uses_band)


def _worker_range_problems(ports: dict[str, int]) -> list[Problem]:
    low, high = ports.get("min_worker_port"), ports.get("max_worker_port")
    if (low is None) != (high is None):
        name = "min_worker_port" if low is not None else "max_worker_port"
        return [
            Problem(
                path=f"ray_ports.{name}",
                value=ports[name],
                message="set without the other end of the worker port range",
                fix="set both min_worker_port and max_worker_port, or neither (the job's band)",
            )
        ]
    if low is not None and high is not None and low > high:
        return [
            Problem(
                path="ray_ports.min_worker_port",
                value=low,
                message=f"greater than ray_ports.max_worker_port ({high})",
                fix="make min_worker_port <= max_worker_port",
            )
        ]
    return []


def rule_no_secrets_in_env(profile: ClusterProfile) -> list[Problem]:
    return [
        Problem(
            path=f"env.{name}",
            value="<hidden>",
            message="looks like a secret; profiles are shared and scripts are written to disk",
            fix=f"remove env.{name} and add {name} to pass_env (copied from the submitting shell)",
        )
        for name in sorted(profile.env)
        if any(word in name.upper() for word in SECRET_WORDS)
    ]


def rule_pass_env_names(profile: ClusterProfile) -> list[Problem]:
    return [
        Problem(
            path=f"pass_env[{index}]",
            value=name,
            message="not an environment variable name",
            fix="use letters, digits and _ (e.g. HF_TOKEN); values never go here",
        )
        for index, name in enumerate(profile.pass_env)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
    ]


def rule_container_mounts(profile: ClusterProfile) -> list[Problem]:
    if profile.container is None:
        return []
    return [
        Problem(
            path=f"container.mounts[{index}]",
            value=mount,
            message="a mount is host:container[:flags] with absolute paths",
            fix="e.g. /lustre:/lustre or /lustre/hf:/root/.cache/huggingface:ro",
        )
        for index, mount in enumerate(profile.container.mounts)
        if not _is_valid_mount(mount)
    ]


def _is_valid_mount(mount: str) -> bool:
    fields = mount.split(":")
    return (
        2 <= len(fields) <= 3 and all(field.startswith("/") for field in fields[:2]) and all(fields)
    )


def _duplicate_ports(fixed: dict[str, int]) -> list[Problem]:
    seen: dict[int, str] = {}
    problems = []
    for name, port in fixed.items():
        if port in seen:
            problems.append(
                Problem(
                    path=f"ray_ports.{name}",
                    value=port,
                    message=f"same port as ray_ports.{seen[port]}",
                    fix="give each port its own number",
                )
            )
        seen.setdefault(port, name)
    return problems


def _ports_in_worker_band(fixed: dict[str, int], ports: dict[str, int]) -> list[Problem]:
    low, high = ports.get("min_worker_port"), ports.get("max_worker_port")
    if low is None or high is None:
        return []
    return [
        Problem(
            path=f"ray_ports.{name}",
            value=port,
            message=f"inside the worker port band {low}..{high}",
            fix="move it out of [min_worker_port, max_worker_port]",
        )
        for name, port in fixed.items()
        if low <= port <= high
    ]


def _positive(path: str, value: int, fix: str) -> Problem:
    return Problem(path=path, value=value, message="must be at least 1", fix=fix)


def _ports_in_job_bands(ports: dict[str, int], uses_band: bool) -> list[Problem]:
    # A named port inside the bands could be one of this job's own band ports.
    if not uses_band:
        return []
    low, high = FIRST_BAND_PORT, bands_end()
    return [
        Problem(
            path=f"ray_ports.{name}",
            value=port,
            message=f"inside the per-job Ray port bands {low}..{high}, which the unset ports come from",
            fix=f"choose a port below {low}, or set every ray_ports entry (then run one job per node)",
        )
        for name, port in ports.items()
        if low <= port <= high
    ]


PROFILE_RULES = (
    rule_counts_positive,
    rule_auto_gpus_only_here,
    rule_bundle_packages,
    rule_time_limit,
    rule_cpu_profile_without_gres,
    rule_gpu_profile_requests_gpus,
    rule_container_needs_slurm,
    rule_ray_ports,
    rule_no_secrets_in_env,
    rule_pass_env_names,
    rule_container_mounts,
)

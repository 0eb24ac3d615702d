"""Cross-field rules of a cluster profile (allocation vs recipe is the planner's job)."""

from __future__ import annotations

import re

import attrs

from hpcrl.config.errors import Problem
from hpcrl.config.field_bounds import check_field_bounds
from hpcrl.config.port_bands import FIRST_BAND_PORT, bands_end
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.secrets import (
    PASS_ENV_FIX,
    find_secrets,
    is_secret_name,
    literal_secret_assignments,
)

# Slurm's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
SLURM_TIME = re.compile(r"^\d+(:\d{1,2}){0,2}$|^\d+-\d{1,2}(:\d{1,2}){0,2}$")
#: Slurm keeps a time limit as 32-bit seconds: 2**31 - 1 s, 24855-03:14:07, is the longest
#: it holds (longer ones wrap around: measured on the test cluster's Slurm 22.05).
MAX_SLURM_TIME_LIMIT_S = 2**31 - 1
MAX_SLURM_TIME_LIMIT = "24855-03:14:07"
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: An absolute path or a bare command name, without shell syntax or spaces.
PYTHON_COMMAND = re.compile(r"/[A-Za-z0-9._+/-]+|[A-Za-z0-9._+-]+")


def check_profile(profile: ClusterProfile) -> list[Problem]:
    """Every profile rule's problems, in a fixed order."""
    problems: list[Problem] = []
    for rule in PROFILE_RULES:
        problems += rule(profile)
    return problems


def rule_field_bounds(profile: ClusterProfile) -> list[Problem]:
    """Each field's own range, declared beside it (``bounded`` in ``hpcrl.config.profile``)."""
    return check_field_bounds(profile)


def rule_device_counts_positive(profile: ClusterProfile) -> list[Problem]:
    problems = []
    if profile.device == "gpu" and profile.gpus_per_node == 0:  # negative: rule_field_bounds
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
    seconds = time_limit_s(profile.slurm.time_limit)
    if seconds is None or seconds == 0:
        message = "not a Slurm time limit" if seconds is None else "a time limit of zero"
        if seconds is None and SLURM_TIME.match(profile.slurm.time_limit):
            message = "out of range (minutes and seconds go to 59, hours after a day to 23)"
        return [
            Problem(
                path="slurm.time_limit",
                value=profile.slurm.time_limit,
                message=message,
                fix='write [D-]HH:MM:SS, e.g. slurm.time_limit: "04:00:00"',
            )
        ]
    if seconds > MAX_SLURM_TIME_LIMIT_S:
        return [
            Problem(
                path="slurm.time_limit",
                value=profile.slurm.time_limit,
                message="longer than Slurm can hold: it counts a time limit in 32-bit seconds "
                f"(at most {MAX_SLURM_TIME_LIMIT}), and a longer one wraps around to another "
                "limit (Slurm 22.05 turns 99999999-00:00:00 into 2965552-16:25:00)",
                fix="write the time the run needs, at most the partition's MaxTime (scontrol "
                'show partition), e.g. slurm.time_limit: "04:00:00"',
            )
        ]
    if profile.slurm.signal_delay_s >= seconds:
        return [
            Problem(
                path="slurm.signal_delay_s",
                value=profile.slurm.signal_delay_s,
                message=f"not shorter than slurm.time_limit ({profile.slurm.time_limit}): the "
                "job would be told to stop before it starts",
                fix="e.g. slurm.signal_delay_s: 90, or a longer slurm.time_limit",
            )
        ]
    return []


def time_limit_s(text: str) -> int | None:
    """Seconds in a Slurm time limit (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); None when it is
    not one or a field is out of range."""
    if not SLURM_TIME.match(text):
        return None
    days, dash, clock = text.partition("-")
    if not dash:
        days, clock = "0", text
    fields = [int(field) for field in clock.split(":")]
    if dash:
        hours, minutes, seconds = (fields + [0, 0])[:3]
    elif len(fields) == 3:
        hours, minutes, seconds = fields
    else:
        hours, minutes, seconds = 0, fields[0], (fields[1:] or [0])[0]
    minutes_bounded = bool(dash) or len(fields) == 3
    if seconds > 59 or (minutes_bounded and minutes > 59) or (dash and hours > 23):
        return None
    return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds


def rule_names_and_images(profile: ClusterProfile) -> list[Problem]:
    """The profile's name names run folders and jobs; an empty image would run nothing."""
    problems = []
    if not PROFILE_NAME.fullmatch(profile.name):
        problems.append(
            Problem(
                path="name",
                value=profile.name,
                message="a profile name is letters, digits, '.', '_' or '-' (it names run folders)",
                fix="e.g. name: eos, or remove it to use the file name",
            )
        )
    if profile.container is not None and not profile.container.image.strip():
        problems.append(
            Problem(
                path="container.image",
                value=profile.container.image,
                message="empty",
                fix="set the image pyxis runs (e.g. nvcr.io#nvidia/nemo-rl:v0.7.0), or remove "
                "the container section",
            )
        )
    return problems


def rule_python(profile: ClusterProfile) -> list[Problem]:
    """The job's interpreter: an absolute path or a command name found on the job's PATH."""
    if profile.python is None or PYTHON_COMMAND.fullmatch(profile.python):
        return []  # unset: the image's python3, or the interpreter running hpcrl
    return [
        Problem(
            path="python",
            value=profile.python,
            message="not an absolute path or a command name (one word, no shell syntax)",
            fix="e.g. python: python3, or python: /opt/venv/bin/python",
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
    problems = _worker_range_problems(ports)  # each port's own range: rule_field_bounds
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
        if is_secret_name(name)
    ]


def rule_no_secrets_in_script_text(profile: ClusterProfile) -> list[Problem]:
    """Profile text copied into job.sbatch: no secret-shaped name given a literal value
    (``export HF_TOKEN=...``), no well-known token."""
    problems = []
    for path, text in _script_texts(profile):
        names = literal_secret_assignments(text)
        kinds = find_secrets(text, environ={})
        if not names and not kinds:
            continue
        what = ", ".join([f"{name}=<literal>" for name in names] + kinds)
        fix = PASS_ENV_FIX.format(name=names[0] if names else "the variable")
        if names and path.startswith("slurm."):
            fix += f"; an --export list may name it without a value (--export=ALL,{names[0]})"
        elif names:
            fix += f'; a line may read it at run time: {names[0]}="${names[0]}"'
        problems.append(
            Problem(
                path=path,
                value="<hidden>",
                message=f"holds a secret ({what}); this text is written into job.sbatch",
                fix=fix,
            )
        )
    return problems


def _script_texts(profile: ClusterProfile) -> list[tuple[str, str]]:
    texts = [(f"setup_lines[{i}]", line) for i, line in enumerate(profile.setup_lines)]
    texts += [(f"slurm.sbatch_args[{i}]", arg) for i, arg in enumerate(profile.slurm.sbatch_args)]
    texts += [(f"slurm.srun_args[{i}]", arg) for i, arg in enumerate(profile.slurm.srun_args)]
    texts += [
        (f"env.{name}", value)
        for name, value in sorted(profile.env.items())
        if not is_secret_name(name)  # rule_no_secrets_in_env reports those
    ]
    texts += [("python", profile.python or "")]
    for key in ("account", "partition", "qos"):
        texts += [(f"slurm.{key}", getattr(profile.slurm, key) or "")]
    if profile.container is not None:
        texts += [("container.image", profile.container.image)]
        texts += [(f"container.mounts[{i}]", m) for i, m in enumerate(profile.container.mounts)]
        texts += [("container.workdir", profile.container.workdir or "")]
    return texts


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
    rule_field_bounds,
    rule_device_counts_positive,
    rule_auto_gpus_only_here,
    rule_bundle_packages,
    rule_time_limit,
    rule_names_and_images,
    rule_python,
    rule_cpu_profile_without_gres,
    rule_gpu_profile_requests_gpus,
    rule_container_needs_slurm,
    rule_ray_ports,
    rule_no_secrets_in_env,
    rule_no_secrets_in_script_text,
    rule_pass_env_names,
    rule_container_mounts,
)

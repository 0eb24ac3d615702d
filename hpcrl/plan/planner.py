"""Pre-flight: recipe × cluster profile → ``JobSpec``, or every problem at once.

Everything that can be checked on the login node is checked here, before the job waits in a
queue: allocation vs layout, batch divisibility, the Megatron checkpoint dir as the job will
see it, container mounts, names that reach the script, Ray ports.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcrl.config.datasets import resolve_data_sections
from hpcrl.config.env_rules import VLLM_ENV_VARS, training_env_vars
from hpcrl.config.moe_dispatch import FlexDispatch, hybridep_env
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from hpcrl.plan import generation as generation_checks
from hpcrl.plan import layout as layout_checks
from hpcrl.plan import mounts as mount_checks
from hpcrl.plan import ray_auth as ray_auth_checks
from hpcrl.plan import scheduler
from hpcrl.plan.code import plan_code
from hpcrl.plan.compile_cache import CACHE_VARIABLES, compile_cache_env, plan_compile_cache
from hpcrl.plan.data_files import check_data_files
from hpcrl.plan.findings import Findings
from hpcrl.plan.gpus import resolve_local_gpus
from hpcrl.plan.images import check_image_reference
from hpcrl.plan.layout import profile_path
from hpcrl.plan.machine_needs import machine_needs
from hpcrl.plan.placeholders import check_placeholders
from hpcrl.plan.submit_host import SubmitHost, bundles_dir_for, describe_submit_host
from hpcrl.run.jobspec import (
    SUBMITIT_TASK_TAIL,
    ContainerSpec,
    GenerationPlacement,
    JobSpec,
    ParallelLayout,
)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Set for every job: Ray phones home by default and waits 30 s on SIGTERM otherwise.
DEFAULT_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
RESERVED_ENV_PREFIXES = ("HPCRL_", "SUBMITIT_", "SLURM_")


def plan(
    recipe: Recipe,
    profile: ClusterProfile,
    *,
    run_dir: str,
    overrides: Sequence[str] = (),
    recipe_source: str,
    profile_source: str | None = None,
    job_name: str | None = None,
    array_size: int | None = None,
    host: SubmitHost | None = None,
    for_submission: bool = False,
    written_by: Sequence[str] | None = None,
) -> JobSpec:
    """Check ``recipe`` against ``profile`` and return the job's plan.

    ``run_dir`` is the absolute run folder (the same path inside a container: hpcrl mounts
    it 1:1 when no profile mount covers it). ``recipe_source`` is the recipe as the user gave
    it (path or shipped name) and ``profile_source`` the ``--cluster`` argument (default: the
    profile's name); both go into the command that reproduces the script. ``host``: the
    submitting side (interpreter, code bundle, local GPUs); None describes this process,
    keeping bundles beside ``run_dir``. ``for_submission``: placeholders of an example
    profile are errors instead of warnings. ``written_by``: the command that writes the script
    (default ``hpcrl render RECIPE --cluster C OVERRIDES``; the CLI adds ``-o`` and names
    sweeps and reruns). Raises ``ConfigError`` holding every error (and warning) found.
    """
    findings = Findings()
    if host is None:
        host = describe_submit_host(profile, bundles_dir_for(Path(posixpath.dirname(run_dir))))
    profile, visible_gpus = resolve_local_gpus(profile, host.local_gpus, findings)
    check_placeholders(profile, findings, refuse=for_submission)
    job_name = job_name or _job_name_from(recipe_source)
    _check_run_dir(run_dir, profile, findings)
    generation = generation_checks.plan_generation(recipe, profile, findings)
    reward_model = generation_checks.plan_reward_model(recipe)
    if reward_model is not None:
        findings.passed("reward_model", reward_model.describe(generation_checks.unit(profile)))
    layout = _plan_layout(recipe, profile, generation, findings)
    # The job asks Slurm (and Ray, and a local job's CUDA_VISIBLE_DEVICES) for only the GPUs
    # it uses: a recipe may train on fewer than a node holds (check_allocation warns).
    requested = layout_checks.requested_slots_per_node(recipe, profile)
    profile = layout_checks.narrow_to_request(profile, requested)
    visible_gpus = visible_gpus[:requested] if visible_gpus is not None else None
    # cluster.num_nodes is the whole job, generation's nodes included (NeMo RL's meaning).
    num_nodes = recipe.cluster.num_nodes
    mounts = mount_checks.check_mount_syntax(profile, findings)
    check_image_reference(profile, findings)
    code, bundle_mount = plan_code(recipe, profile, host, mounts, findings)
    runs_dir = posixpath.dirname(host.bundles_dir)  # the bundles' folder: <runs>/.hpcrl-bundles
    compile_dir, compile_mount = plan_compile_cache(profile, runs_dir, mounts, findings)
    container = _container_spec(profile, run_dir, mounts, (bundle_mount, compile_mount))
    ckpt_dir, ckpt_source = mount_checks.plan_megatron_checkpoint_dir(
        recipe, profile, mounts, findings
    )
    mount_checks.check_hf_home(profile, mounts, findings)
    check_data_files(recipe, profile, mounts, findings)
    env = _job_env(recipe, profile, run_dir, compile_cache_env(compile_dir), findings)
    _check_script_inputs(recipe, profile, dict(env), findings)
    launch = _launch_fields(profile, container, run_dir, num_nodes, job_name, array_size, findings)
    findings.raise_if_errors()
    cluster = profile_source or profile.name  # as the user named it, for the re-render command
    assert layout is not None  # an unfactorable layout is always reported as an error
    return JobSpec(
        job_name=job_name,
        scheduler=profile.scheduler,
        device=profile.device,
        profile_name=profile.name,
        recipe_source=recipe_source,
        algorithm=recipe.algorithm,
        overrides=tuple(overrides),
        recipe=resolve_data_sections(recipe),  # the job merges no data defaults
        written_by=tuple(written_by or render_argv(recipe_source, cluster, overrides)),
        run_dir=run_dir,
        num_nodes=num_nodes,
        slots_per_node=profile.slots_per_node,
        cpus_per_node=profile.cpus_per_node,
        layout=layout,
        container=container,
        env=env,
        pass_env=tuple(profile.pass_env),
        setup_lines=tuple(profile.setup_lines),
        ray_ports=profile.ray_ports,
        ray_auth=profile.ray_auth,
        megatron_checkpoint_dir=ckpt_dir,
        megatron_checkpoint_dir_source=ckpt_source,
        compile_cache_dir=compile_dir,
        code=code,
        task_argv=(*code.entry_argv, *SUBMITIT_TASK_TAIL, launch["submitit_folder"]),
        checks=tuple(findings.checks),
        machine_needs=machine_needs(recipe),
        generation=generation,
        reward_model=reward_model,
        colocated_engine_ranks=generation_checks.colocated_engine_ranks(recipe),
        visible_gpus=visible_gpus,
        **launch,
    )


def _launch_fields(
    profile: ClusterProfile,
    container: ContainerSpec | None,
    run_dir: str,
    num_nodes: int,
    job_name: str,
    array_size: int | None,
    findings: Findings,
) -> dict[str, Any]:
    """The ``JobSpec`` fields of how the job is launched: sbatch directives and srun arguments
    (Slurm profiles), submitit's folder and log paths, the array, signal and requeue."""
    array = (array_size, profile.slurm.array_parallelism) if array_size else None
    folder, stdout, stderr = scheduler.submitit_log_paths(run_dir, array is not None)
    is_slurm = profile.scheduler == "slurm"
    directives = (
        scheduler.sbatch_directives(num_nodes, profile, job_name, (stdout, stderr), array, findings)
        if is_slurm
        else ()
    )
    return {
        "sbatch_directives": directives,
        "srun_args": scheduler.srun_args(profile, container, (stdout, stderr)) if is_slurm else (),
        "submitit_folder": folder,
        "stdout_path": stdout,
        "stderr_path": stderr,
        "array_size": array_size,
        "array_parallelism": profile.slurm.array_parallelism if array_size else None,
        "signal_delay_s": profile.slurm.signal_delay_s,
        "max_requeues": profile.slurm.max_requeues,
        "requeue": True,
    }


def _check_script_inputs(
    recipe: Recipe, profile: ClusterProfile, env: dict[str, str], findings: Findings
) -> None:
    """Checks of values that only matter once they are written into the script."""
    _check_pass_env(profile, env, findings)
    _check_ray_ports(profile, findings)
    ray_auth_checks.check_ray_auth(recipe, profile, findings)
    _check_no_nul(recipe, profile, findings)
    _warn_literal_dollars(profile, findings)


def render_argv(
    recipe_source: str, cluster: str, overrides: Sequence[str], run_dir: str | None = None
) -> tuple[str, ...]:
    """``hpcrl render RECIPE --cluster C OVERRIDES [-o RUN_DIR]``: what reproduces a run's
    script (``run_dir`` when it is not the default folder of those inputs)."""
    out = ("-o", run_dir) if run_dir is not None else ()
    return ("hpcrl", "render", recipe_source, "--cluster", cluster, *overrides, *out)


def _job_name_from(recipe_source: str) -> str:
    stem = posixpath.basename(recipe_source.rstrip("/"))
    for suffix in (".yaml", ".yml"):
        stem = stem.removesuffix(suffix)
    return stem or "hpcrl"


def _plan_layout(
    recipe: Recipe,
    profile: ClusterProfile,
    generation: GenerationPlacement | None,
    findings: Findings,
) -> ParallelLayout | None:
    allocated = layout_checks.check_allocation(recipe, profile, findings)
    if generation is not None:
        generation_checks.report_placement(generation, profile, findings)
    if not allocated:
        return None  # a layout for the wrong world size would only add noise
    # Against the allocated training GPUs, which colocated engines share.
    generation_checks.check_colocated_engines(recipe, profile, findings)
    layout = layout_checks.plan_layout(recipe, profile, findings)
    if layout is not None:
        layout_checks.check_batch_sizes(recipe, layout, findings)
    return layout


#: Linux's PATH_MAX (4096 bytes, the terminating NUL included) less room for what the job
#: writes below the run folder (logs/node<k>/attempt<r>/..., submitit's files, checkpoints).
MAX_RUN_DIR_BYTES = 4095 - 512
NAME_MAX_BYTES = 255  # one folder name


def _check_run_dir(run_dir: str, profile: ClusterProfile, findings: Findings) -> None:
    size = len(run_dir.encode("utf-8", "surrogateescape"))
    longest = max(len(part.encode("utf-8", "surrogateescape")) for part in run_dir.split("/"))
    if size > MAX_RUN_DIR_BYTES or longest > NAME_MAX_BYTES:
        what = (
            f"a folder name of {longest} bytes (at most {NAME_MAX_BYTES})"
            if longest > NAME_MAX_BYTES
            else f"{size:,} bytes long (at most {MAX_RUN_DIR_BYTES:,})"
        )
        findings.error(
            "run_dir",
            f"{what}: Linux refuses paths over 4,096 bytes and names over 255, and the job "
            "writes files a few hundred characters deep below its run folder",
            value=run_dir,
            fix="choose a shorter folder with -o/--out",
        )
        return
    bad_chars = "%" + (",:" if profile.container is not None else "")
    if (
        not run_dir.startswith("/")
        or not run_dir.isprintable()
        or any(ch in run_dir for ch in bad_chars)
    ):
        findings.error(
            "run_dir",
            "the run folder must be an absolute path of printable characters without '%' (Slurm "
            "expands '%' in log paths)"
            + (", ',' or ':' (container mount syntax)" if profile.container else ""),
            value=run_dir,
            fix="choose another folder with -o/--out",
        )


def _container_spec(
    profile: ClusterProfile, run_dir: str, mounts: list, more_mounts: tuple[str | None, ...]
) -> ContainerSpec | None:
    if profile.container is None:
        return None
    added = (mount_checks.run_dir_mount(run_dir, mounts), *more_mounts)
    return ContainerSpec(
        image=profile.container.image,
        mounts=tuple(profile.container.mounts) + tuple(mount for mount in added if mount),
        workdir=profile.container.workdir,
        mount_home=profile.container.mount_home,
    )


def _job_env(
    recipe: Recipe,
    profile: ClusterProfile,
    run_dir: str,
    compile_env: dict[str, str],
    findings: Findings,
) -> tuple[tuple[str, str], ...]:
    """hpcrl's defaults < the profile's env < the training backend's env_vars (Megatron's or
    Automodel's) < HybridEP's keys (``hpcrl.config.moe_dispatch``); sorted by name. vLLM's env_vars are checked here but set by each engine
    (``hpcrl.core.generation.vllm_engine.engine_env``), in its processes only. The compile
    caches' variables are hpcrl's alone (``compile_cache_dir`` sets them)."""
    env = dict(DEFAULT_ENV)
    sources = [(profile_path(profile, "env"), profile.env), training_env_vars(recipe)]
    for section, values in sources:
        for name, value in values.items():
            if _check_env_name(f"{section}.{name}", name, findings):
                env[name] = str(value)
    for name in recipe.policy.generation.vllm_cfg.env_vars:
        _check_env_name(f"{VLLM_ENV_VARS}.{name}", name, findings)
    if recipe.backend == "megatron":
        env.update(hybridep_env(FlexDispatch.of(recipe), env))
    env.update(compile_env)
    env["HPCRL_RUN_DIR"] = run_dir
    return tuple(sorted(env.items()))


def _check_env_name(path: str, name: str, findings: Findings) -> bool:
    if not _IDENTIFIER.fullmatch(name):
        findings.error(
            path,
            "an environment variable name must be a shell identifier ([A-Za-z_][A-Za-z0-9_]*)",
            value=name,
            fix="rename the variable",
        )
        return False
    if name in CACHE_VARIABLES:
        findings.error(
            path,
            "hpcrl sets torch.compile's cache variables from the profile's compile_cache_dir",
            value=name,
            fix="remove it and set compile_cache_dir in the cluster profile instead",
        )
        return False
    if name.startswith(RESERVED_ENV_PREFIXES):
        findings.error(
            path,
            f"names starting with {', '.join(RESERVED_ENV_PREFIXES)} are set by hpcrl, submitit or Slurm",
            value=name,
            fix="remove it or rename it",
        )
        return False
    return True


def _check_pass_env(profile: ClusterProfile, env: dict[str, str], findings: Findings) -> None:
    for index, name in enumerate(profile.pass_env):
        path = profile_path(profile, f"pass_env[{index}]")
        if not _check_env_name(path, name, findings):
            continue
        if name in env:
            findings.error(
                path,
                "this variable also has a value in env; a passed-through variable's value comes "
                "only from the submitting shell",
                value=name,
                fix=f"remove {name} from env or from pass_env",
            )


def _check_ray_ports(profile: ClusterProfile, findings: Findings) -> None:
    ports = profile.ray_ports
    named = ports.named  # unset ports come from the job's band (hpcrl.config.port_bands)
    for name, port in named.items():
        if not isinstance(port, int) or not 1024 <= port <= 65535:
            findings.error(
                profile_path(profile, f"ray_ports.{name}"),
                "not a port in 1024-65535",
                value=port,
                fix="choose a free port below 32768 (the Linux ephemeral range starts there)",
            )
    low, high = named.get("min_worker_port"), named.get("max_worker_port")
    if low is not None and high is not None and low > high:
        findings.error(
            profile_path(profile, "ray_ports.min_worker_port"),
            "above max_worker_port",
            value=ports.min_worker_port,
            fix="swap min_worker_port and max_worker_port",
        )
    singles = {
        name: port
        for name, port in named.items()
        if name not in ("min_worker_port", "max_worker_port")
    }
    seen: dict[int, str] = {}
    for name, port in singles.items():
        if port in seen:
            findings.error(
                profile_path(profile, f"ray_ports.{name}"),
                f"same port as {seen[port]}",
                value=port,
                fix="give every Ray port its own number",
            )
        elif low is not None and high is not None and low <= port <= high:
            findings.error(
                profile_path(profile, f"ray_ports.{name}"),
                "inside the worker port range",
                value=port,
                fix="move it outside min_worker_port..max_worker_port",
            )
        seen[port] = name


def _check_no_nul(recipe: Recipe, profile: ClusterProfile, findings: Findings) -> None:
    """bash cannot hold a NUL byte in a string; everything else is quoted by the renderer."""
    values = [
        (profile_path(profile, f"setup_lines[{i}]"), line)
        for i, line in enumerate(profile.setup_lines)
    ]
    values += [
        (profile_path(profile, f"env.{name}"), str(value)) for name, value in profile.env.items()
    ]
    values += [
        (profile_path(profile, f"slurm.srun_args[{i}]"), arg)
        for i, arg in enumerate(profile.slurm.srun_args)
    ]
    values += [(profile_path(profile, "python"), profile.python or "")]
    if profile.container is not None:
        values += [(profile_path(profile, "container.image"), profile.container.image)]
        values += [(profile_path(profile, "container.workdir"), profile.container.workdir or "")]
    for section, env_vars in (
        training_env_vars(recipe),
        (VLLM_ENV_VARS, recipe.policy.generation.vllm_cfg.env_vars),
    ):
        values += [(f"{section}.{name}", str(value)) for name, value in env_vars.items()]
    for path, value in values:
        if "\0" in value:
            findings.error(
                path, "contains a NUL byte, which a shell script cannot hold", fix="remove it"
            )


def _warn_literal_dollars(profile: ClusterProfile, findings: Findings) -> None:
    for name, value in sorted(profile.env.items()):
        if "$" in str(value):
            findings.warn(
                "env_literal",
                profile_path(profile, f"env.{name}"),
                "env values are written literally into the script; '$' is not expanded",
                value=value,
                fix=f'export it from setup_lines instead (e.g. "export {name}=..."), if expansion is meant',
            )

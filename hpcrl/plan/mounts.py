"""Container mounts and the paths the job needs to see through them.

pyxis mounts are ``host:container[:flags]`` (or one path, mounted at the same place). A path
the job uses inside the container (the run folder, ``HF_HOME``, the Megatron checkpoint dir)
is visible only if it lies under some mount's container-side path.
"""

from __future__ import annotations

import os
import posixpath

import attrs

from hpcrl.config.node_split import node_split
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.recipe import Recipe
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.plan.checkpoint_dir import resolve_megatron_checkpoint_dir
from hpcrl.plan.findings import Findings
from hpcrl.plan.layout import profile_path

#: Variables of the Megatron checkpoint-dir rule that users often export in their shell.
SHELL_CHECKPOINT_VARIABLES = ("NRL_MEGATRON_CHECKPOINT_DIR", "HF_HOME")


@attrs.frozen
class Mount(SharedMethods):
    host_path: str
    container_path: str
    flags: str | None


def parse_mount(text: str) -> Mount | None:
    """``/a:/b:ro`` → Mount; None when it is not 1–3 colon-separated parts with absolute paths."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(parts[:2]):
        return None
    host = parts[0]
    container = parts[1] if len(parts) > 1 else host
    if not (host.startswith("/") and container.startswith("/")):
        return None
    return Mount(host, container, parts[2] if len(parts) == 3 else None)


def is_under(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return root == "/" or path == root or path.startswith(root + "/")


def job_home(profile: ClusterProfile) -> str:
    """``$HOME`` as the job sees it: the profile's env, else the submitting user's home."""
    return profile.env.get("HOME") or os.path.expanduser("~")


def check_mount_syntax(profile: ClusterProfile, findings: Findings) -> list[Mount]:
    """Every mount must parse and must not contain the comma pyxis uses to join them."""
    if profile.container is None:
        return []
    mounts = []
    for index, text in enumerate(profile.container.mounts):
        mount = parse_mount(text)
        if mount is None or "," in text or any(ch.isspace() for ch in text):
            findings.error(
                profile_path(profile, f"container.mounts[{index}]"),
                "a mount is host:container[:flags] with absolute paths, no commas or spaces",
                value=text,
                fix='write it like "/lustre/fsw:/lustre/fsw" or "/scratch:/scratch:ro"',
            )
            continue
        mounts.append(mount)
    return mounts


def run_dir_mount(run_dir: str, mounts: list[Mount]) -> str | None:
    """The mount to add so the run folder is seen at the same path inside the container.

    submitit hands tasks absolute paths into the run folder, so it must appear 1:1; None
    when an existing mount already maps it there.
    """
    return same_path_mount(run_dir, mounts)


def same_path_mount(path: str, mounts: list[Mount], flags: str | None = None) -> str | None:
    """``path:path[:flags]`` unless a mount already shows ``path`` at the same place."""
    for mount in mounts:
        if is_under(path, mount.host_path) and mount.host_path == mount.container_path:
            return None
    return f"{path}:{path}" + (f":{flags}" if flags else "")


def check_visible_in_container(
    profile: ClusterProfile,
    mounts: list[Mount],
    what: str,
    path: str,
    source_path: str,
    findings: Findings,
) -> None:
    """Error when ``path`` (a container-side path) is under no mount; names the mount to add."""
    if profile.container is None:
        return
    covered = any(is_under(path, mount.container_path) for mount in mounts)
    if profile.container.mount_home and is_under(path, job_home(profile)):
        covered = True
    if covered:
        findings.passed("container_mounts", f"{what} {path} is inside a container mount")
        return
    top = "/" + path.strip("/").split("/")[0]
    findings.error(
        profile_path(profile, "container.mounts"),
        f"{what} {path} (from {source_path}) is not under any container mount, so the job "
        f"would write it inside the container and lose it",
        value=list(profile.container.mounts),
        fix=f'add the shared filesystem: container.mounts += ["{top}:{top}"]',
    )


def plan_megatron_checkpoint_dir(
    recipe: Recipe,
    profile: ClusterProfile,
    mounts: list[Mount],
    findings: Findings,
) -> tuple[str | None, str | None]:
    """Resolve the Megatron checkpoint dir as the job sees it: from the profile's env and the
    recipe's ``policy.megatron_cfg.env_vars`` (which win, as in the job's environment). The
    job converts into exactly this directory (``JobSpec.megatron_checkpoint_dir``)."""
    if recipe.backend != "megatron":
        return None, None
    recipe_env = recipe.policy.megatron_cfg.env_vars
    job_env = {**profile.env, **recipe_env}
    directory, source = resolve_megatron_checkpoint_dir(job_env, job_home(profile))
    if source in recipe_env:
        source_path = f"policy.megatron_cfg.env_vars.{source}"
    else:
        source_path = profile_path(profile, f"env.{source}") if source != "home" else "$HOME"
    if not directory.startswith("/"):
        findings.error(
            source_path,
            "the Megatron checkpoint dir must be an absolute path",
            value=directory,
            fix="set NRL_MEGATRON_CHECKPOINT_DIR in the profile's env to an absolute path on shared storage",
        )
        return directory, source
    findings.passed("megatron_checkpoint_dir", f"{directory} (from {source})")
    if source == "home":
        _warn_home_on_many_nodes(directory, recipe, profile, findings)
    _warn_shell_disagrees(directory, job_env, profile, findings)
    check_visible_in_container(
        profile, mounts, "the Megatron checkpoint dir", directory, source_path, findings
    )
    return directory, source


def _warn_home_on_many_nodes(
    directory: str,
    recipe: Recipe,
    profile: ClusterProfile,
    findings: Findings,
) -> None:
    # Only the training ranks read the conversion (vLLM engines load the HF model and take
    # refits in memory), so generation nodes of their own do not make it a multi-node read.
    training_nodes = node_split(recipe).training_nodes
    if training_nodes <= 1:
        return
    spans = f"on a {training_nodes}-node job every node"
    job_nodes = recipe.cluster.num_nodes
    if job_nodes > training_nodes:
        spans = (
            f"training spans {training_nodes} of the job's {job_nodes} nodes and every "
            "training node"
        )
    findings.warn(
        "megatron_checkpoint_dir",
        profile_path(profile, "env"),
        f"the Megatron checkpoint dir falls back to {directory} under $HOME; {spans} "
        f"must see the same conversion, and home is often not shared or too small",
        fix=f"set {profile_path(profile, 'env.NRL_MEGATRON_CHECKPOINT_DIR')} (or HF_HOME) "
        f"to a directory on shared storage",
    )


def _warn_shell_disagrees(
    directory: str, job_env: dict[str, str], profile: ClusterProfile, findings: Findings
) -> None:
    """The job inherits the submitting shell's environment (sbatch exports it, the local
    executor passes it on), and NeMo RL users often export these two variables there. The job
    converts into the planned directory whatever the shell says, so a shell value that would
    have resolved elsewhere is named here instead of being silently not followed."""
    shell = {name: os.environ[name] for name in SHELL_CHECKPOINT_VARIABLES if os.environ.get(name)}
    if not shell:
        return
    shell_directory, name = resolve_megatron_checkpoint_dir({**shell, **job_env}, "/")
    if shell_directory == directory:
        return
    findings.warn(
        "megatron_checkpoint_dir_shell",
        profile_path(profile, f"env.{name}"),
        f"this shell sets {name}={shell[name]}, but the job converts Megatron checkpoints "
        f"into {directory}: the directory is planned from the profile's env and "
        "policy.megatron_cfg.env_vars only",
        fix=f"to convert under it, set {profile_path(profile, f'env.{name}')} (or "
        f"policy.megatron_cfg.env_vars.{name}) to {shell[name]}",
    )


def check_hf_home(profile: ClusterProfile, mounts: list[Mount], findings: Findings) -> None:
    hf_home = profile.env.get("HF_HOME")
    if hf_home:
        check_visible_in_container(
            profile, mounts, "HF_HOME", hf_home, profile_path(profile, "env.HF_HOME"), findings
        )

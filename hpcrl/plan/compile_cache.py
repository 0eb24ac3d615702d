"""Where torch.compile keeps what it compiled, so that the next run of a recipe starts warm.

torch's caches (Inductor's FX graph cache: the generated kernels; the AOTAutograd cache: the
forward/backward split; Triton's cache: the compiled GPU binaries) are on by default in the
torch versions hpcrl supports, but in ``/tmp/torchinductor_<user>`` and ``~/.triton``: on a
cluster, the node's own disk (or the container's), so a job landing on another node, or in a
fresh container, compiles everything again (a first GRPO step many times as long as the
later ones: docs/performance.md, "Figures behind the code"). hpcrl points them at one folder every run shares
(``JobSpec.compile_cache_dir``), exported in the job's script before any process starts:

- the profile's ``compile_cache_dir`` when it sets one (shared storage the nodes see; with a
  container it must lie under a mount, checked here);
- else ``<runs>/.hpcrl-cache/torch-compile``: beside the run folders, like the code bundles
  (``<runs>/.hpcrl-bundles``). The runs folder is on storage every node of a job sees (the
  run folder must be), it is shared by every run written there, and hpcrl mounts it 1:1 into
  a container. A per-user cache under ``$HOME`` was the other choice: it would need the home
  mounted in containers and sits on the home filesystem's quota.

The caches key their entries by torch/Triton version, device and graph: one folder serves
every recipe, GPU model and torch version, and deleting it only costs the next run its
compilation. Their writes are atomic (temporary file + rename), so concurrent jobs share it.
"""

from __future__ import annotations

import posixpath

from hpcrl.config.profile import ClusterProfile
from hpcrl.plan import mounts as mount_checks
from hpcrl.plan.findings import Findings
from hpcrl.plan.layout import profile_path

CACHE_DIR_NAME = ".hpcrl-cache"  # beside the run folders (and .hpcrl-bundles)
COMPILE_SUBDIR = "torch-compile"
#: What torch reads (torch._inductor.config, torch._functorch.config, Triton), all set by hpcrl
#: from ``compile_cache_dir``: a profile or recipe setting one of them is refused.
INDUCTOR_DIR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
TRITON_DIR_VARIABLE = "TRITON_CACHE_DIR"
CACHE_VARIABLES = (
    INDUCTOR_DIR_VARIABLE,
    TRITON_DIR_VARIABLE,
    "TORCHINDUCTOR_FX_GRAPH_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_CACHE",
)


def default_compile_cache_dir(runs_dir: str) -> str:
    """``<runs>/.hpcrl-cache/torch-compile``."""
    return posixpath.join(runs_dir, CACHE_DIR_NAME, COMPILE_SUBDIR)


def plan_compile_cache(
    profile: ClusterProfile, runs_dir: str, mounts: list[mount_checks.Mount], findings: Findings
) -> tuple[str, str | None]:
    """(the folder as the job sees it, the container mount to add for it or None)."""
    if profile.compile_cache_dir is not None:
        directory = profile.compile_cache_dir
        if not _usable_path(directory, profile, findings):
            return directory, None
        findings.passed("compile_cache", f"torch.compile caches in {directory} (profile)")
        mount_checks.check_visible_in_container(
            profile, mounts, "the compile cache dir", directory,
            profile_path(profile, "compile_cache_dir"), findings,
        )  # fmt: skip
        return directory, None
    directory = default_compile_cache_dir(runs_dir)
    findings.passed(
        "compile_cache",
        f"torch.compile caches in {directory}, shared by the runs beside it (the profile's "
        "compile_cache_dir sets another folder)",
    )
    if profile.container is None:
        return directory, None
    return directory, mount_checks.same_path_mount(directory, mounts)


def _usable_path(path: str, profile: ClusterProfile, findings: Findings) -> bool:
    """An absolute path, written literally into the script (with a container, one that
    pyxis' mount syntax can carry)."""
    forbidden = "$" + (",:" if profile.container is not None else "")
    if path.startswith("/") and path.isprintable() and not any(ch in path for ch in forbidden):
        return True
    findings.error(
        profile_path(profile, "compile_cache_dir"),
        "must be an absolute path of printable characters without '$'"
        + (", ',' or ':' (container mount syntax)" if profile.container is not None else ""),
        value=path,
        fix="e.g. compile_cache_dir: /lustre/fsw/your_project/torch-compile-cache",
    )
    return False


def compile_cache_env(directory: str) -> dict[str, str]:
    """The job's variables for the caches in ``directory`` (both caches switched on
    explicitly: they are torch's defaults today, and this folder is pointless without them)."""
    return {
        INDUCTOR_DIR_VARIABLE: posixpath.join(directory, "inductor"),
        TRITON_DIR_VARIABLE: posixpath.join(directory, "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }

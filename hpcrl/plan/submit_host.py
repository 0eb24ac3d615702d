"""What the planner learns from the machine and the Python that plan the job.

The interpreter running hpcrl (the job's default Python without a container), the code
bundle of this environment, where bundles are kept, and this machine's GPUs (local GPU
profiles). Gathered once by ``describe_submit_host`` and handed to ``plan``, so a plan stays
a function of its inputs: tests and golden files pass fixed values.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs

import hpcrl
from hpcrl.config.profile import ClusterProfile
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.plan.bundle import BundleContents, collect_bundle, hpcrl_git_sha
from hpcrl.plan.gpus import LocalGpus, detect_local_gpus

#: Bundles live beside the run folders: ``<runs>/.hpcrl-bundles/hpcrl-<version>-<hash>/``.
BUNDLES_DIR_NAME = ".hpcrl-bundles"


@attrs.frozen(kw_only=True)
class SubmitHost(SharedMethods):
    """``python``: absolute path of the interpreter running hpcrl. ``bundle``: this
    environment's code bundle when the profile ships one. ``bundles_dir``: absolute folder
    holding bundles. ``local_gpus``: this machine's GPUs, for local GPU profiles only."""

    python: str
    hpcrl_version: str
    git_sha: str | None
    bundles_dir: str
    bundle: BundleContents | None = None
    local_gpus: LocalGpus | None = None


def bundles_dir_for(runs_dir: Path) -> Path:
    return Path(runs_dir).absolute() / BUNDLES_DIR_NAME


def describe_submit_host(
    profile: ClusterProfile,
    bundles_dir: Path,
    environ: Mapping[str, str] | None = None,
    *,
    git_commit: bool = True,
) -> SubmitHost:
    """This process's view, gathering only what ``profile`` needs (no bundle for installed
    code, no GPU probe unless the profile runs locally on GPUs). ``git_commit=False``: the
    checkout's commit is not asked (``git_sha`` None): only the written script and job spec
    name it, and a ``git status`` of a large checkout on a login node's shared file system
    takes long (``hpcrl validate`` writes neither)."""
    environ = os.environ if environ is None else environ
    local_gpu = profile.scheduler == "local" and profile.device == "gpu"
    return SubmitHost(
        python=os.path.abspath(sys.executable) if sys.executable else "",
        hpcrl_version=hpcrl.__version__,
        git_sha=hpcrl_git_sha() if git_commit else None,
        bundles_dir=str(Path(bundles_dir).absolute()),
        bundle=collect_bundle(tuple(profile.bundle_packages))
        if profile.code_mode == "bundle"
        else None,
        local_gpus=detect_local_gpus(environ) if local_gpu else None,
    )

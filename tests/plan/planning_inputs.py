"""Cluster profiles and the submitting host built directly from the schema classes, for
planner tests (their recipes: tests/recipe_builder.py), and the planner called on them
(``make_plan``, its errors and warnings).

Shared by tests/plan and tests/render.
"""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config.errors import ConfigError
from hpcrl.config.profile import ClusterProfile, ContainerCfg, SlurmCfg
from hpcrl.plan.bundle import BundleContents
from hpcrl.plan.gpus import LocalGpus
from hpcrl.plan.planner import plan
from hpcrl.plan.submit_host import SubmitHost

GOLDEN_RUN_DIR = "/runs/golden"
GOLDEN_HOME = "/home/golden"
GOLDEN_PYTHON = "/golden/venv/bin/python"
#: The submitting side as golden files see it: fixed interpreter, bundle and GPUs, so the
#: scripts do not change with the machine, the checkout or an installed package's version.
GOLDEN_HOST = SubmitHost(
    python=GOLDEN_PYTHON,
    hpcrl_version="0.1.0",
    git_sha=None,  # an installed wheel has none (tests/test_packaging.py renders from one)
    bundles_dir="/runs/.hpcrl-bundles",
    bundle=BundleContents(
        files=(),
        generated=(),
        digest="0123456789abcdef",
        packages=(
            ("antlr4-python3-runtime", "4.9.3"),
            ("attrs", "26.1.0"),
            ("cattrs", "26.2.1"),
            ("cloudpickle", "3.1.3"),
            ("omegaconf", "2.4.0"),
            ("PyYAML", "6.0.4"),
            ("submitit", "1.5.4"),
            ("typing_extensions", "4.16.0"),
        ),  # fmt: skip
        extra_packages=(),
        built_from="/golden/venv",
    ),
    local_gpus=LocalGpus(("0",), "the golden machine"),
)


def isolate_from_user_profiles(monkeypatch, tmp_path) -> None:
    """$HOME fixed (the job's home when a profile sets none); no user or site profiles, so
    ``--cluster NAME`` finds only the shipped ones whoever runs the tests."""
    monkeypatch.setenv("HOME", GOLDEN_HOME)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))
    monkeypatch.delenv("HPCRL_CLUSTER_PROFILES", raising=False)
    for name in ("HPCRL_CLUSTER", "HPCRL_RUNS_DIR"):  # the user's defaults (hpcrl.cli.user_config)
        monkeypatch.delenv(name, raising=False)
    clear_shell_checkpoint_dir(monkeypatch)


def clear_shell_checkpoint_dir(monkeypatch) -> None:
    """The planner warns when the submitting shell names another Megatron checkpoint dir
    (hpcrl.plan.mounts); a developer's own HF_HOME must not change the plans under test."""
    from hpcrl.plan.mounts import SHELL_CHECKPOINT_VARIABLES

    for name in SHELL_CHECKPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def pyxis_profile(**changes: object) -> ClusterProfile:
    """An eos-like site: pyxis containers, 8 GPUs per node, shared /lustre."""
    profile = ClusterProfile(
        name="site",
        gpus_per_node=8,
        cpus_per_node=112,
        slurm=SlurmCfg(account="acct", partition="batch", time_limit="04:00:00"),
        container=ContainerCfg(
            image="nvcr.io#nvidia/nemo-rl:v0.7.0",
            mounts=("/lustre:/lustre",),
            workdir="/lustre/hpcrl",
        ),
        env={"HF_HOME": "/lustre/cache/hf", "HOME": GOLDEN_HOME},
        pass_env=("HF_TOKEN", "WANDB_API_KEY"),
        setup_lines=("echo setting up",),
        python="/opt/venv/bin/python",
    )
    return attrs.evolve(profile, **changes)


def plain_slurm_profile(**changes: object) -> ClusterProfile:
    """A CPU Slurm cluster without containers (like the local test cluster)."""
    profile = ClusterProfile(
        name="plain",
        device="cpu",
        worker_slots_per_node=2,
        slurm=SlurmCfg(exclusive=False, gres_form="none"),
        env={"HOME": GOLDEN_HOME},
    )
    return attrs.evolve(profile, **changes)


def local_profile(**changes: object) -> ClusterProfile:
    profile = ClusterProfile(
        name="local",
        scheduler="local",
        device="cpu",
        worker_slots_per_node=2,
        env={"HOME": GOLDEN_HOME},
    )
    return attrs.evolve(profile, **changes)


def make_plan(recipe, profile, **kwargs):
    kwargs.setdefault("run_dir", GOLDEN_RUN_DIR)
    kwargs.setdefault("host", GOLDEN_HOST)
    kwargs.setdefault("recipe_source", "recipes/grpo-test-2n8g.yaml")
    return plan(recipe, profile, **kwargs)


def plan_errors(recipe, profile, **kwargs) -> dict[str, object]:
    """path -> Problem for every error the planner raised (fails when it raised none)."""
    with pytest.raises(ConfigError) as caught:
        make_plan(recipe, profile, **kwargs)
    return {problem.path: problem for problem in caught.value.errors}


def warnings_of(spec) -> dict[str, object]:
    return {check.path: check for check in spec.warnings}

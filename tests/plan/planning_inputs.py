"""Recipes and cluster profiles built directly from the schema classes, for planner tests.

Shared by tests/plan and tests/render.
"""

from __future__ import annotations

import attrs

from hpcrl.config.profile import ClusterProfile, ContainerCfg, SlurmCfg
from hpcrl.config.recipe import (
    AutomodelCfg,
    ClusterCfg,
    DataCfg,
    GrpoCfg,
    MegatronCfg,
    PolicyCfg,
    Recipe,
)

GOLDEN_RUN_DIR = "/runs/golden"
GOLDEN_HOME = "/home/golden"


def isolate_from_user_profiles(monkeypatch, tmp_path) -> None:
    """$HOME fixed (the job's home when a profile sets none); no user or site profiles, so
    ``--cluster NAME`` finds only the shipped ones whoever runs the tests."""
    monkeypatch.setenv("HOME", GOLDEN_HOME)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))
    monkeypatch.delenv("HPCRL_CLUSTER_PROFILES", raising=False)


def automodel_recipe(num_nodes: int = 1, gpus_per_node: int = 8, **automodel: object) -> Recipe:
    return Recipe(
        policy=PolicyCfg(
            model_name="Qwen/Qwen2-1.5B",
            train_global_batch_size=64,
            automodel_cfg=AutomodelCfg(enabled=True, **automodel),
        ),
        data=DataCfg(train_path="data/train.jsonl"),
        grpo=GrpoCfg(),
        cluster=ClusterCfg(num_nodes=num_nodes, gpus_per_node=gpus_per_node),
    )


def megatron_recipe(num_nodes: int = 2, gpus_per_node: int = 8, **megatron: object) -> Recipe:
    return Recipe(
        policy=PolicyCfg(
            model_name="Qwen/Qwen2-1.5B",
            train_global_batch_size=64,
            megatron_cfg=MegatronCfg(enabled=True, **megatron),
        ),
        data=DataCfg(train_path="data/train.jsonl"),
        grpo=GrpoCfg(),
        cluster=ClusterCfg(num_nodes=num_nodes, gpus_per_node=gpus_per_node),
    )


def with_policy(recipe: Recipe, **changes: object) -> Recipe:
    return attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, **changes))


def pyxis_profile(**changes: object) -> ClusterProfile:
    """An eos-like site: pyxis containers, 8 GPUs per node, shared /lustre."""
    profile = ClusterProfile(
        name="site",
        gpus_per_node=8,
        cpus_per_node=112,
        slurm=SlurmCfg(account="acct", partition="batch", time_limit="04:00:00"),
        container=ContainerCfg(
            image="nvcr.io/nvidia/nemo-rl:v0.4.0",
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

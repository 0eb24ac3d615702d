"""Real plans for the node-entrypoint tests: a recipe planned by ``hpcrl.plan.planner`` on a
CPU Slurm profile (or a GPU one), written to ``<run_dir>/jobspec.json`` by the one writer,
exactly as ``hpcrl render``/``submit`` leave it for the job."""

from __future__ import annotations

from pathlib import Path

from hpcrl.plan.planner import plan
from hpcrl.run.jobspec import JobSpec
from hpcrl.run.jobspec_file import write_jobspec
from tests.plan.planning_inputs import plain_slurm_profile, pyxis_profile
from tests.recipe_builder import automodel_recipe


def write_node_plan(
    run_dir: Path, num_nodes: int = 1, *, gpu: bool = False, **profile_changes: object
) -> JobSpec:
    """Plan an Automodel GRPO recipe of ``num_nodes`` nodes filling the profile's slots;
    ``gpu``: on an eos-like GPU profile (8 GPUs per node) instead of a 2-slot CPU one."""
    profile = pyxis_profile(**profile_changes) if gpu else plain_slurm_profile(**profile_changes)
    recipe = automodel_recipe(num_nodes=num_nodes, gpus_per_node=profile.slots_per_node)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = plan(recipe, profile, run_dir=str(run_dir.absolute()), recipe_source="grpo-node-test")
    write_jobspec(spec)
    return spec

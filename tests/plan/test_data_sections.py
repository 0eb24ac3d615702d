"""The plan hands the job NeMo RL's data sections resolved (issue 27): ``JobSpec.recipe``'s
data.train and data.validation hold what data.default and the older flat data.* keys give
them, those are unset, and jobspec.json carries the same; the job merges nothing again
(tests/test_stage_boundaries.py: the job side calls none of config's merging functions)."""

from __future__ import annotations

import attrs

from hpcrl.config.recipe import DataCfg, DatasetCfg
from hpcrl.run.jobspec_file import read_jobspec, write_jobspec
from tests.plan.planning_inputs import make_plan, pyxis_profile
from tests.recipe_builder import automodel_recipe

COT = "/prompts/cot.txt"
MATH = "math_hf_data_processor"


def test_each_section_reaches_the_job_with_data_defaults_merged_in(tmp_path):
    data = DataCfg(
        train=DatasetCfg(dataset_name="OpenMathInstruct-2", split_validation_size=0.1),
        validation=DatasetCfg(dataset_name="AIME2024", repeat=16),
        default=DatasetCfg(prompt_file=COT, processor=MATH, seed=7, split_validation_size=0.5),
        shuffle=False,
    )
    spec = make_plan(attrs.evolve(automodel_recipe(), data=data), pyxis_profile())
    planned = spec.recipe.data
    assert planned.train == DatasetCfg(
        dataset_name="OpenMathInstruct-2",
        split_validation_size=0.1,  # its own value wins over data.default's
        prompt_file=COT,
        processor=MATH,
        seed=7,
    )
    assert planned.validation == DatasetCfg(
        dataset_name="AIME2024",
        repeat=16,
        prompt_file=COT,
        processor=MATH,
        seed=7,
        split_validation_size=0.5,
    )
    assert planned.default is None
    assert planned.shuffle is False  # the rest of data as the recipe gave it
    # The job reads it back from jobspec.json, resolved.
    spec = attrs.evolve(spec, run_dir=str(tmp_path))
    write_jobspec(spec)
    assert read_jobspec(tmp_path).recipe.data == planned


def test_the_older_flat_form_reaches_the_job_as_data_train():
    data = DataCfg(
        dataset_name="openmathinstruct2",
        split="train_1M",
        prompt_file=COT,
        system_prompt_file="/prompts/system.txt",
        seed=3,
        output_key="generated_solution",
        default=DatasetCfg(processor=MATH),
    )
    spec = make_plan(attrs.evolve(automodel_recipe(), data=data), pyxis_profile())
    assert spec.recipe.data == DataCfg(
        train=DatasetCfg(
            dataset_name="openmathinstruct2",
            split="train_1M",
            prompt_file=COT,
            system_prompt_file="/prompts/system.txt",
            seed=3,
            output_key="generated_solution",
            processor=MATH,
        )
    )


def test_a_jsonl_recipe_is_planned_as_written():
    recipe = automodel_recipe()
    assert recipe.data.train_path is not None
    assert make_plan(recipe, pyxis_profile()).recipe == recipe

"""``policy.generation.backend: megatron`` (NeMo RL's generation from the Megatron policy
itself): NeMo RL's own recipe loads and plans, ``validate`` says how hpcrl samples for it,
the non-colocated form plans generation workers of their own, and what hpcrl cannot do the
same way is refused with its path, reason and fix. That it
samples from the policy's current weights under the sampling distribution and learns:
tests/megatron/test_generate.py and tests/megatron/test_learns.py."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError
from hpcrl.core.generation.engine import colocated_engine_spec, engine_spec
from hpcrl.plan.generation import IN_PROCESS, SEPARATE_MEGATRON
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl
from tests.plan.planning_inputs import GOLDEN_RUN_DIR, pyxis_profile

RECIPE = "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron_generation.yaml"
NON_COLOCATED = "recipes/llm/grpo-llama3.2-1b-instruct-2n8g-megatron_generation-noncolocated.yaml"


def errors_of(relative: str, overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        load_as_hpcrl(config_path(relative), overrides)
    return {problem.path: " ".join(problem.format().split()) for problem in caught.value.errors}


def test_nemo_rl_megatron_generation_recipe_plans_and_says_how_it_samples():
    loaded = load_as_hpcrl(config_path(RECIPE))
    recipe = loaded.recipe
    assert (recipe.backend, recipe.policy.generation.backend) == ("megatron", "megatron")
    spec = plan(recipe, pyxis_profile(), run_dir=GOLDEN_RUN_DIR, recipe_source="nemo-rl")
    said = [c.message for c in spec.checks if c.name == "generation" and c.status == "passed"]
    assert said == [IN_PROCESS["megatron"]]
    assert said[0].startswith("megatron: in process on each training rank from the Megatron")
    # The engine each rank builds: hpcrl's sampler, fed by the Megatron refit.
    assert engine_spec(recipe, "/m", "cpu").backend == "torch"
    # its mcore_generation_config (engine knobs at NeMo RL's defaults) is recorded as unused
    unused = {key.path for key in loaded.unused_nemo_rl_keys}
    assert "policy.generation.mcore_generation_config.buffer_size_gb" in unused
    assert "policy.generation.mcore_generation_config.num_speculative_tokens" in unused


def test_megatron_generation_with_the_automodel_policy_is_refused():
    errors = errors_of(
        "grpo_math_1B.yaml", ["policy.generation.backend=megatron", "~policy.generation.vllm_cfg"]
    )
    assert errors["policy.generation.backend"] == (
        "error: policy.generation.backend = 'megatron': Megatron generation samples from the "
        "Megatron policy model, and this recipe trains with the Automodel backend "
        "(policy.megatron_cfg.enabled is false) fix: set policy.megatron_cfg.enabled=true and "
        "policy.dtensor_cfg.enabled=false, or policy.generation.backend=vllm (or torch: "
        "hpcrl's in-process sampler)"
    )


def test_nemo_rl_non_colocated_megatron_generation_plans_on_workers_of_its_own():
    # NeMo RL builds a dedicated Megatron inference model on the generation node, synced
    # from the policy before every generation; hpcrl samples there with its torch sampler,
    # fed the same weights by the refit (one engine per GPU).
    loaded = load_as_hpcrl(config_path(NON_COLOCATED))
    recipe = loaded.recipe
    spec = plan(recipe, pyxis_profile(), run_dir=GOLDEN_RUN_DIR, recipe_source="nemo-rl")
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size) == (2, 8, 8)
    assert spec.generation is not None
    assert (spec.generation.backend, spec.generation.first_node) == ("megatron", 1)
    assert (spec.generation.num_engines, spec.generation.slots_per_engine) == (8, 1)
    said = [c.message for c in spec.checks if c.name == "generation" and c.status == "passed"]
    assert said == [
        "training on node 0 (8 GPUs each); Megatron generation (hpcrl's torch sampler, "
        "refitted from the policy) on node 1 (8 GPUs each; 8 engine(s) of 1)",
        SEPARATE_MEGATRON,
    ]
    assert (
        "# Split: training on node 0 (8 GPUs each); Megatron generation (hpcrl's torch "
        "sampler, refitted from the policy) on node 1 (8 GPUs each; 8 engine(s) of 1).\n"
        in render_sbatch(spec)
    )
    # training ranks hold no engine; the separate workers build hpcrl's sampler
    assert colocated_engine_spec(recipe, "/m", "cuda") is None
    assert engine_spec(recipe, "/m", "cuda").backend == "torch"
    # the refit transport of NeMo RL's dedicated model is accepted for what it is
    (entry,) = [
        key
        for key in loaded.unused_nemo_rl_keys
        if key.path == "policy.generation.mcore_generation_config.refit_backend"
    ]
    assert "Ray's object store" in entry.why


def test_stop_token_ids_nemo_rl_megatron_generation_ignores_are_refused():
    errors = errors_of(RECIPE, ["policy.generation.stop_token_ids=[7]"])
    assert errors == {
        "policy.generation.stop_token_ids": "error: policy.generation.stop_token_ids = [7]: "
        "NeMo RL's Megatron generation stops only at the EOS token and at stop_strings; it "
        "does not read stop_token_ids, so the samples would differ fix: remove "
        "policy.generation.stop_token_ids (or write them as policy.generation.stop_strings), "
        "or set policy.generation.backend=vllm"
    }


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_speculative_tokens", "2"), ("expose_http_server", "true"), ("max_model_len", "99")],
)
def test_mcore_generation_options_that_change_samples_are_refused(key, value):
    path = f"policy.generation.mcore_generation_config.{key}"
    errors = errors_of(RECIPE, [f"{path}={value}"])
    assert list(errors) == [path]
    assert "is not implemented by hpcrl" in errors[path]


def test_mcore_engine_knobs_are_accepted_as_speed_settings():
    path = "policy.generation.mcore_generation_config.buffer_size_gb"
    loaded = load_as_hpcrl(config_path(RECIPE), [f"{path}=40"])
    (entry,) = [key for key in loaded.unused_nemo_rl_keys if key.path == path]
    assert entry.value == 40 and "not what" in entry.why


def test_mcore_generation_config_is_unread_under_vllm():
    section = "policy.generation.mcore_generation_config"
    loaded = load_as_hpcrl(
        config_path("grpo_math_1B.yaml"), [f"{section}.num_speculative_tokens=2"]
    )
    (entry,) = [key for key in loaded.unused_nemo_rl_keys if key.path == section]
    assert entry.value["num_speculative_tokens"] == 2
    assert "read only when policy.generation.backend is megatron" in entry.why

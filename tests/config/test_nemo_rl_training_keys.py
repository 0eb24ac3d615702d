"""A recipe written in NeMo RL's shape (our own text, NeMo RL's layout: the config under
examples/configs/, its prompt under examples/prompts/) loads with the training keys hpcrl
implements: optimizer + scheduler list, packing, dynamic batching, data by name, env.math,
GRPO options, and null where NeMo RL writes it."""

import textwrap
from pathlib import Path

from hpcrl.config import load_recipe

BASE = """
grpo:
  num_prompts_per_step: 4
  num_generations_per_prompt: 4
  max_rollout_turns: 1
  normalize_rewards: true
  use_leave_one_out_baseline: true
  use_dynamic_sampling: false
  dynamic_sampling_max_gen_batches: 10
  batch_multiplier: 1
  max_val_samples: 16
  val_batch_size: 16
  reward_shaping: {enabled: false, overlong_buffer_length: 32, overlong_buffer_penalty: 1, max_response_length: 128}
  reward_scaling: {enabled: false, source_min: 0.0, source_max: 1.0, target_min: 0.0, target_max: 1.0}
policy:
  model_name: tiny:qwen2
  train_global_batch_size: 16
  train_micro_batch_size: 2
  logprob_batch_size: 2
  max_total_sequence_length: 256
  make_sequence_length_divisible_by: 1
  dtensor_cfg: {enabled: true, tensor_parallel_size: 1}
  megatron_cfg: {enabled: false, env_vars: null}
  dynamic_batching: {enabled: false, train_mb_tokens: 512, logprob_mb_tokens: 512, sequence_length_round: 64}
  sequence_packing:
    enabled: true
    train_mb_tokens: 512
    logprob_mb_tokens: 512
    algorithm: modified_first_fit_decreasing
    sequence_length_round: 64
  optimizer:
    name: torch.optim.AdamW
    kwargs: {lr: 5.0e-6, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1e-8, foreach: false, fused: false}
  scheduler:
    - name: torch.optim.lr_scheduler.LinearLR
      kwargs: {start_factor: 0.1, end_factor: 1.0, total_iters: 50}
    - name: torch.optim.lr_scheduler.ConstantLR
      kwargs: {factor: 1.0, total_iters: 10000000000}
    - milestones: [50]
  generation:
    backend: torch
    max_new_tokens: 128
    stop_token_ids: null
    stop_strings: null
data:
  max_input_seq_length: 128
  shuffle: true
  train:
    dataset_name: OpenMathInstruct-2
    split_validation_size: 0.05
  validation: null
  default:
    prompt_file: examples/prompts/cot.txt
    system_prompt_file: null
    processor: math_hf_data_processor
    env_name: math
env:
  math: {num_workers: 8, math_verify_impl: hf_math_verify}
cluster: {gpus_per_node: 2, num_nodes: 1}
"""


def nemo_rl_layout(root: Path, text: str, name: str = "grpo_math_tiny.yaml") -> Path:
    (root / "examples" / "prompts").mkdir(parents=True)
    (root / "examples" / "prompts" / "cot.txt").write_text("Solve: {}\n")
    config = root / "examples" / "configs" / name
    config.parent.mkdir(parents=True)
    config.write_text(textwrap.dedent(text))
    return config


def test_nemo_rl_shaped_recipe_loads_with_its_training_keys(tmp_path):
    recipe = load_recipe(nemo_rl_layout(tmp_path, BASE)).recipe
    policy = recipe.policy
    assert policy.sequence_packing.enabled and policy.sequence_packing.train_mb_tokens == 512
    assert [e.name for e in policy.scheduler][:2] == [
        "torch.optim.lr_scheduler.LinearLR",
        "torch.optim.lr_scheduler.ConstantLR",
    ]
    assert policy.generation.stop_token_ids == () and policy.megatron_cfg.env_vars == {}
    # The relative prompt file is NeMo RL's repository-root path, found above the config.
    expected = tmp_path / "examples" / "prompts" / "cot.txt"
    assert recipe.data.default.prompt_file == str(expected.resolve())
    assert recipe.env.math.math_verify_impl == "hf_math_verify"
    assert recipe.grpo.max_val_samples == 16


def test_a_child_config_can_drop_the_schedule_and_switch_to_dynamic_batching(tmp_path):
    nemo_rl_layout(tmp_path, BASE, "base.yaml")
    child = tmp_path / "examples" / "configs" / "child.yaml"
    child.write_text(
        textwrap.dedent(
            """
            defaults: base.yaml
            policy:
              scheduler: null
              sequence_packing: {enabled: false}
              dynamic_batching: {enabled: true}
            """
        )
    )
    policy = load_recipe(child).recipe.policy
    assert policy.scheduler is None
    assert policy.dynamic_batching.enabled and not policy.sequence_packing.enabled


def test_megatron_child_with_the_flat_data_form_and_no_fsdp_optimizer(tmp_path):
    nemo_rl_layout(tmp_path, BASE, "base.yaml")
    child = tmp_path / "examples" / "configs" / "megatron.yaml"
    child.write_text(
        textwrap.dedent(
            """
            defaults: base.yaml
            policy:
              dtensor_cfg: {enabled: false}
              megatron_cfg: {enabled: true}
              optimizer: null
            data:
              train: null
              default: null
              dataset_name: OpenMathInstruct-2
              prompt_file: examples/prompts/cot.txt
              system_prompt_file: null
              output_key: generated_solution
            """
        )
    )
    recipe = load_recipe(child).recipe
    assert recipe.policy.optimizer is None and recipe.backend == "megatron"
    from hpcrl.config.datasets import effective

    train = effective(recipe, "train")
    assert (train.dataset_name, train.output_key) == ("OpenMathInstruct-2", "generated_solution")
    assert train.prompt_file == str((tmp_path / "examples" / "prompts" / "cot.txt").resolve())

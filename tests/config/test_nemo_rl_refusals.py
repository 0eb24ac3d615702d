"""NeMo RL's own example files that hpcrl refused while NeMo RL runs them, each loaded from
the snapshot (tests/nemo_rl_snapshots.py) and held to what NeMo RL's code does with it:

- ``grpo.val_period: -1`` (grpo_smoke.yaml): NeMo RL validates only when val_period > 0;
- ``grpo.batch_multiplier: 1.5``: a float there, ``int(num_prompts_per_step × it)`` prompts
  per dynamic-sampling batch, and exactly 1 without dynamic sampling (NeMo RL asserts it);
- ``grpo.async_grpo: null`` (its single-controller configs): off; those configs' own
  ``async_rl`` is read onto hpcrl's async GRPO (tests/config/test_async_rl.py);
- one scheduler with ``milestones: []`` (as its dpo-mistral-nemo recipe writes it):
  SequentialLR over that one scheduler, i.e. the scheduler alone;
- ``OpenMathInstruct-2`` as an SFT data set (sft_openmathinstruct2.yaml): NeMo RL's one
  dataset class for both algorithms, the target column its ``output_key``;
- ``megatron_cfg.optimizer.clip_grad: ${policy.max_grad_norm}`` = null under a disabled
  megatron_cfg: never read; enabled, megatron-core cannot take null (refused, fix named);
- ``colocated.resources.num_nodes: null`` for a one-node split (NeMo RL's grpo_math_1B
  writes it): generation shares the one node (tests/config/test_node_split.py has the rest);
- ``dtensor_cfg.sequence_parallel: true`` with TP 8 (sft-qwen2.5-32b-4n8g-fsdp2tp8sp): the
  Automodel TP plan splits the sequence across TP ranks (tests/core/test_parallel_tp.py).
"""

from __future__ import annotations

import yaml

from hpcrl.config import ConfigError, load_profile
from hpcrl.config.datasets import effective
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl
from tests.plan.planning_inputs import isolate_from_user_profiles


def errors_of(relative: str, overrides: list[str]) -> dict[str, str]:
    try:
        load_as_hpcrl(config_path(relative), overrides)
    except ConfigError as error:
        return {problem.path: problem.format() for problem in error.errors}
    raise AssertionError("loaded without errors")


def test_val_period_minus_one_turns_validation_off():
    from hpcrl.core.algorithms.validation import validation_due

    grpo = load_as_hpcrl(config_path("grpo_smoke.yaml")).recipe.grpo
    assert (grpo.val_period, grpo.val_at_start) == (-1, False)
    assert not any(validation_due(step, grpo.val_period, grpo.val_at_start) for step in range(50))
    # NeMo RL validates before step 1 when val_at_start, whatever val_period says.
    assert validation_due(0, -1, True) and not validation_due(1, -1, True)


def test_batch_multiplier_is_a_float_as_in_nemo_rl():
    from hpcrl.config.grpo_option_rules import generation_batch_prompts

    dynamic = ["grpo.use_dynamic_sampling=true", "grpo.batch_multiplier=1.5"]
    grpo = load_as_hpcrl(config_path("grpo_math_1B.yaml"), dynamic).recipe.grpo
    assert (grpo.num_prompts_per_step, grpo.batch_multiplier) == (32, 1.5)
    assert generation_batch_prompts(grpo) == 48  # NeMo RL: int(32 * 1.5)
    # Without dynamic sampling NeMo RL asserts batch_multiplier == 1; so does hpcrl.
    error = errors_of("grpo_math_1B.yaml", ["grpo.batch_multiplier=1.5"])["grpo.batch_multiplier"]
    assert error == (
        "error: grpo.batch_multiplier = 1.5: generates extra prompts for dynamic sampling to "
        "choose from, so it must be 1 without use_dynamic_sampling; NeMo RL stops on it too "
        "(its GRPO setup asserts batch_multiplier == 1 unless use_dynamic_sampling is true)\n"
        "  fix: set grpo.batch_multiplier=1, or grpo.use_dynamic_sampling=true"
    )


def test_prorlv2_1_moe_batch_multiplier_without_dynamic_sampling_is_refused_as_in_nemo_rl():
    """prorlv2_1_moe.v2.yaml turns dynamic sampling off over prorlv2.v2.yaml and keeps its
    batch_multiplier 1.5: NeMo RL's grpo setup asserts on that pair, so the file does not run
    there either; hpcrl refuses it with the same reason and nothing else."""
    errors = errors_of("prorlv2_1_moe.v2.yaml", [])
    assert list(errors) == ["grpo.batch_multiplier"]
    assert "NeMo RL stops on it too" in errors["grpo.batch_multiplier"]
    loaded = load_as_hpcrl(config_path("prorlv2_1_moe.v2.yaml"), ["grpo.batch_multiplier=1"])
    assert loaded.recipe.grpo is not None and not loaded.recipe.grpo.use_dynamic_sampling


def test_async_grpo_null_is_off():
    # The single-controller configs write async_grpo: null over grpo_math_1B.yaml's block.
    loaded = load_as_hpcrl(config_path("grpo_math_1B.yaml"), ["grpo.async_grpo=null"])
    grpo = loaded.recipe.grpo
    assert loaded.resolved_dict["grpo"]["async_grpo"] is None
    assert grpo.async_grpo is None and not grpo.async_enabled


def test_one_scheduler_with_empty_milestones_is_that_scheduler():
    # The scheduler list exactly as NeMo RL's dpo-mistral-nemo recipe writes it, on its sft.yaml.
    dpo = yaml.safe_load(
        config_path(
            "recipes/llm/dpo-mistral-nemo-instruct-2407-1n8g-fsdp2tp8-actckpt-long.yaml"
        ).read_text()
    )
    schedulers = dpo["policy"]["scheduler"]
    assert schedulers[-1] == {"milestones": []}
    override = "policy.scheduler=" + yaml.safe_dump(schedulers, default_flow_style=True).strip()
    recipe = load_as_hpcrl(config_path("sft.yaml"), [override]).recipe
    assert [entry.name for entry in recipe.policy.scheduler] == [
        "torch.optim.lr_scheduler.ConstantLR",
        None,
    ]
    import torch

    from hpcrl.core.backends.automodel.optim import build_lr_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, recipe.policy.scheduler)
    assert isinstance(scheduler, torch.optim.lr_scheduler.ConstantLR)
    # A milestone beside one scheduler hands over to nothing: still refused, fix named.
    lonely = override.replace("milestones: []", "milestones: [5]")
    errors = errors_of("sft.yaml", [lonely])
    assert errors["policy.scheduler[1].milestones"] == (
        "error: policy.scheduler[1].milestones = [5]: milestones hand over from one scheduler "
        "to the next, and there is 1 scheduler\n"
        "  fix: write milestones: [] (one scheduler runs for the whole run) or add the "
        "scheduler that takes over"
    )


def test_openmathinstruct2_is_an_sft_data_set():
    from hpcrl.core.data.named import to_messages

    for relative in (
        "sft_openmathinstruct2.yaml",
        "recipes/llm/sft-llama3.1-8b-1n8g-megatron-seqpack.yaml",
    ):
        recipe = load_as_hpcrl(config_path(relative)).recipe
        train = effective(recipe, "train")
        assert recipe.algorithm == "sft"
        assert (train.dataset_name, train.output_key, train.split) == (
            "OpenMathInstruct-2",
            "generated_solution",
            "train_1M",
        )
        assert train.split_validation_size == 0.05 and recipe.data.validation is None
    # NeMo RL's rows: user = problem, assistant = the output_key column.
    row = {"problem": "1 + 1?", "generated_solution": "It is \\boxed{2}.", "expected_answer": "2"}
    assert to_messages("openmath_answer", row, train) == [
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": "It is \\boxed{2}."},
    ]
    grpo = effective(load_as_hpcrl(config_path("grpo_math_1B.yaml")).recipe, "train")
    assert grpo.dataset_name == "OpenMathInstruct-2"
    assert to_messages("openmath_answer", row, grpo)[-1]["content"] == "2"


def test_a_set_of_the_other_algorithm_names_the_right_ones():
    errors = errors_of("sft.yaml", ["data.train.dataset_name=DAPOMath17K"])
    assert errors["data.train.dataset_name"] == (
        "error: data.train.dataset_name = 'DAPOMath17K': a data set for GRPO, but this recipe "
        "trains SFT\n"
        "  fix: pick a data set hpcrl loads for SFT: OpenMathInstruct-2, openmathinstruct2, "
        "squad, tulu3_sft_mixture, Nemotron-Cascade-2-SFT-Math, "
        "ResponseDataset (docs/algorithms.md, data sets)"
    )


def test_null_clip_grad_under_a_disabled_megatron_cfg():
    loaded = load_as_hpcrl(config_path("sft_openmathinstruct2.yaml"))
    assert loaded.resolved_dict["policy"]["max_grad_norm"] is None
    assert loaded.recipe.policy.megatron_cfg.optimizer.clip_grad is None
    assert loaded.recipe.backend == "automodel"
    # NeMo RL's Megatron variant writes 0 (no clipping); null there is refused.
    megatron = load_as_hpcrl(config_path("sft_openmathinstruct2_megatron.yaml")).recipe
    assert megatron.policy.megatron_cfg.optimizer.clip_grad == 0.0
    errors = errors_of(
        "sft_openmathinstruct2_megatron.yaml", ["policy.megatron_cfg.optimizer.clip_grad=null"]
    )
    assert errors["policy.megatron_cfg.optimizer.clip_grad"] == (
        "error: policy.megatron_cfg.optimizer.clip_grad = None: megatron-core's optimizer "
        "needs a number here (it compares it with 0 at every step)\n"
        "  fix: set policy.megatron_cfg.optimizer.clip_grad=0.0 for no clipping, or a norm "
        "such as 1.0"
    )


def test_null_generation_num_nodes_on_one_node():
    split = [
        "policy.generation.colocated.enabled=false",
        "policy.generation.colocated.resources.gpus_per_node=4",
        "cluster.gpus_per_node=8",
    ]
    loaded = load_as_hpcrl(config_path("grpo_math_1B.yaml"), split)
    assert loaded.resolved_dict["policy"]["generation"]["colocated"]["resources"] == {
        "gpus_per_node": 4,
        "num_nodes": None,
    }
    from hpcrl.config.node_split import node_split

    assert node_split(loaded.recipe).training_world_size == 4


def test_other_generation_engines_are_refused_by_what_they_are():
    """NeMo RL's SGLang and TensorRT-LLM backends are other inference engines: refused in
    one error each, naming the engine and the backend to switch to; nothing else of those
    files is refused (use_async_rollouts: false is NeMo RL's off value)."""
    sglang = errors_of("grpo_math_1B_sglang.yaml", [])
    assert list(sglang) == ["policy.generation.backend"]
    assert "NeMo RL's SGLang backend" in sglang["policy.generation.backend"]
    assert "fix: set policy.generation.backend=vllm" in sglang["policy.generation.backend"]
    trtllm = errors_of("recipes/llm/grpo-qwen3-1.7b-2n4g-fsdp2-trtllm.yaml", [])
    assert list(trtllm) == ["policy.generation.backend"]
    assert "TensorRT-LLM" in trtllm["policy.generation.backend"]
    loaded = load_as_hpcrl(
        config_path("grpo_math_1B_sglang.yaml"), ["policy.generation.backend=vllm"]
    )
    assert loaded.recipe.policy.generation.backend == "vllm"


def test_sequence_parallel_with_tp8_loads_plans_and_renders(monkeypatch, tmp_path):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    path = config_path("recipes/llm/sft-qwen2.5-32b-4n8g-fsdp2tp8sp-actckpt.v3.yaml")
    loaded = load_as_hpcrl(path)
    automodel = loaded.recipe.policy.automodel_cfg
    assert (automodel.tensor_parallel_size, automodel.sequence_parallel) == (8, True)
    assert [p.path for p in loaded.warnings] == ["policy.dtensor_cfg"]  # its older name
    spec = plan(loaded.recipe, load_profile("eos"), run_dir="/runs/sp", recipe_source=str(path))
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size) == (4, 8, 32)
    assert "# 4 node(s) × 8 GPUs; layout dp_replicate=1 × dp_shard=4 × tp=8 × cp=1.\n" in (
        render_sbatch(spec)
    )


def test_max_samples_and_the_nemotron_cascade_math_set_load_from_nemo_rls_file():
    """sft-qwen3-0.6B-1n8g-megatron-yarn-128k: data.train.max_samples (a seeded subset,
    tests/core/test_named_data.py) and its data set are read; the file loads as NeMo RL
    wrote it (its YaRN override: tests/megatron/test_hf_config_overrides.py)."""
    relative = "recipes/llm/sft-qwen3-0.6B-1n8g-megatron-yarn-128k.yaml"
    loaded = load_as_hpcrl(config_path(relative))
    train = effective(loaded.recipe, "train")
    assert train is not None
    assert (train.dataset_name, train.max_samples) == ("Nemotron-Cascade-2-SFT-Math", 100000)


def test_skip_reference_logprobs_with_no_kl_penalty_skips_them():
    """grpo-llama3.1-8b-instruct-2n8g-ready-first-single-controller: skip the reference
    log-probs with the KL penalty at 0 (the file loads as it is: tests/config/test_async_rl.py).
    With a penalty NeMo RL asserts; hpcrl refuses."""
    import torch

    from hpcrl.core.algorithms.grpo import add_logprobs

    relative = "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-ready-first-single-controller.yaml"
    ready_first = load_as_hpcrl(config_path(relative)).recipe
    assert ready_first.grpo is not None
    assert ready_first.grpo.skip_reference_policy_logprobs_calculation
    recipe = load_as_hpcrl(
        config_path("grpo_math_1B.yaml"),
        ["grpo.skip_reference_policy_logprobs_calculation=true",
         "loss_fn.reference_policy_kl_penalty=0"],
    ).recipe  # fmt: skip
    assert recipe.grpo is not None and recipe.grpo.skip_reference_policy_logprobs_calculation

    class NoReference:
        """A policy whose reference model must not be asked for log-probs."""

        def get_logprobs(self, batch):
            return torch.zeros(1, 3)

        def get_reference_logprobs(self, batch):
            raise AssertionError("reference log-probs computed")

    batch: dict = {}
    add_logprobs(NoReference(), recipe, batch)  # type: ignore[arg-type]
    assert set(batch) == {"old_logprobs"}
    error = errors_of(
        "grpo_math_1B.yaml",
        ["grpo.skip_reference_policy_logprobs_calculation=true",
         "loss_fn.reference_policy_kl_penalty=0.01"],
    )["grpo.skip_reference_policy_logprobs_calculation"]  # fmt: skip
    assert error == (
        "error: grpo.skip_reference_policy_logprobs_calculation = True: the KL penalty "
        "(loss_fn.reference_policy_kl_penalty = 0.01) needs the reference policy's log-probs, "
        "so they cannot be skipped (NeMo RL asserts the penalty is 0 too)\n"
        "  fix: set loss_fn.reference_policy_kl_penalty=0, or "
        "grpo.skip_reference_policy_logprobs_calculation=false"
    )


def test_activation_checkpointing_enabled_is_read_by_no_one():
    """grpo-moonlight-16b-automodel-1n8g-ep8 writes policy.activation_checkpointing_enabled:
    false, a key NeMo RL's code never reads: the file loads, and the recipe is the same as
    without it; true is refused, naming the keys that do checkpoint activations."""
    relative = "recipes/llm/grpo-moonlight-16b-automodel-1n8g-ep8.yaml"
    with_key = load_as_hpcrl(config_path(relative)).recipe
    without = load_as_hpcrl(
        config_path(relative), ["~policy.activation_checkpointing_enabled"]
    ).recipe
    assert with_key == without
    error = errors_of(relative, ["policy.activation_checkpointing_enabled=true"])
    assert (
        "policy.dtensor_cfg.activation_checkpointing (Automodel)"
        in error["policy.activation_checkpointing_enabled"]
    )


def test_multiple_datasets_load_as_lists_each_with_data_default():
    """grpo_multiple_datasets.yaml: lists of training and validation sets, each filled by
    data.default (its prompt file and processor), kept as lists through the plan (the job's
    recipe, jobspec.json's structuring included); num_prompts_per_dataloader and
    custom_dataloader are read by NeMo RL only with use_multiple_dataloader: true (false in
    the file), which stays refused. The rows: tests/core/test_named_data.py."""
    from hpcrl.config import structure_recipe, unstructure
    from hpcrl.config.datasets import effective_all, resolve_data_sections

    recipe = load_as_hpcrl(config_path("grpo_multiple_datasets.yaml")).recipe
    train = effective_all(recipe, "train")
    assert [(path, s.dataset_name) for path, s in train] == [
        ("data.train[0]", "OpenMathInstruct-2"),
        ("data.train[1]", "DeepScaler"),
    ]
    assert train[0][1].split_validation_size == 0.05 and train[0][1].seed == 42
    planned = resolve_data_sections(recipe)
    assert isinstance(planned.data.train, tuple) and isinstance(planned.data.validation, tuple)
    for section in (*planned.data.train, *planned.data.validation):
        assert section.prompt_file is not None and section.prompt_file.endswith("cot.txt")
        assert section.processor == "math_hf_data_processor"
    assert [(v.dataset_name, v.repeat) for v in planned.data.validation] == [
        ("AIME2024", 16),
        ("DAPOMathAIME2024", None),
    ]
    assert structure_recipe(unstructure(planned)) == planned  # jobspec.json's round trip
    switched_on = errors_of("grpo_multiple_datasets.yaml", ["data.use_multiple_dataloader=true"])
    assert {"data.use_multiple_dataloader", "data.num_prompts_per_dataloader"} <= set(switched_on)


def test_sliding_puzzle_is_refused_by_its_environment_not_add_system_prompt():
    """grpo_sliding_puzzle.yaml runs through NeMo RL's own sliding-puzzle entry point, the
    only reader of data.add_system_prompt: the refusal names the game (and its multi-turn
    rollouts), and add_system_prompt alone on a math recipe changes nothing."""
    errors = errors_of("grpo_sliding_puzzle.yaml", [])
    assert sorted(errors) == ["env.sliding_puzzle_game", "grpo.max_rollout_turns"]
    assert "NeMo RL's sliding-puzzle game" in errors["env.sliding_puzzle_game"]
    plain = load_as_hpcrl(config_path("grpo_math_1B.yaml")).recipe
    with_key = load_as_hpcrl(config_path("grpo_math_1B.yaml"), ["+data.add_system_prompt=true"])
    assert with_key.recipe == plain


def test_ignore_router_for_ac_reaches_the_automodel_plan():
    """dapo-nanov3.5-30BA3B-4n8g-automodel: activation checkpointing with EP 8 and
    moe_parallelizer.ignore_router_for_ac: true, which NeMo RL hands to Automodel's MoE
    parallelizer (only under EP): the plan keeps the routers' projections
    (tests/core/test_expert_parallel.py: not recomputed, same gradients)."""
    from hpcrl.core.backends.automodel.parallelize import MeshShape, parallelize_steps

    relative = "recipes/llm/dapo-nanov3.5-30BA3B-4n8g-automodel.yaml"
    policy = load_as_hpcrl(config_path(relative)).recipe.policy
    cfg = policy.automodel_cfg
    assert cfg.moe_parallelizer.ignore_router_for_ac is True
    shape = MeshShape.for_world(32, cfg.dp_replicate_size, cfg.tensor_parallel_size)

    def steps(**changes):
        import attrs

        changed = attrs.evolve(cfg, **changes)
        return parallelize_steps(
            changed, policy.precision, shape, on_gpu=True, compiles=True, training=True
        )

    assert steps().save_router_outputs
    assert not steps(expert_parallel_size=1).save_router_outputs  # NeMo RL: EP only
    assert not steps(activation_checkpointing=False).save_router_outputs


def test_async_grpo_with_megatron_generation_names_what_nemo_rl_does():
    """grpo-nanov3-30BA3B-4n4g-megatron_async_colocated: NeMo RL runs async GRPO with its
    colocated Megatron inference engine (in-flight weight updates); hpcrl's async GRPO
    needs vLLM workers of their own, and says so as the one refusal of the file."""
    relative = "recipes/llm/grpo-nanov3-30BA3B-4n4g-megatron_async_colocated.yaml"
    errors = errors_of(relative, [])
    assert list(errors) == ["policy.generation.backend"]
    assert (
        "NeMo RL runs async GRPO with the Megatron policy generating"
        in errors["policy.generation.backend"]
    )
    assert "hpcrl does not support that yet" in errors["policy.generation.backend"]
    assert "grpo.async_grpo.enabled=false" in errors["policy.generation.backend"]


def test_fused_linear_logprobs_accepted_where_its_values_are_the_unfused_ones():
    """sft-qwen2.5-math7b-1n8g-megatron_fused_linear_logprobs and its GRPO sibling load: the
    fused path is NeMo RL's memory saving with the unfused values (hpcrl computes those).
    What NeMo RL asserts against is refused, and so is a GRPO temperature other than 1,
    where NeMo RL's fused path divides log-probs instead of logits by it."""
    sft = "recipes/llm/sft-qwen2.5-math7b-1n8g-megatron_fused_linear_logprobs.yaml"
    grpo = "recipes/llm/grpo-qwen3-30ba3b-2n8g-megatron_fused_linear_logprobs.yaml"
    for relative in (sft, grpo):
        assert load_as_hpcrl(
            config_path(relative)
        ).recipe.policy.megatron_cfg.use_fused_linear_logprobs
    overlap = "policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather"
    errors = errors_of(sft, [f"{overlap}=true"])
    assert list(errors) == [overlap] and "NeMo RL asserts" in errors[overlap]
    errors = errors_of(
        grpo,
        ["policy.generation.temperature=0.7", "policy.generation.top_p=0.9",
         "policy.sequence_packing.enabled=true"],
    )  # fmt: skip
    assert {
        "policy.generation.temperature",
        "policy.generation.top_p",
        "policy.sequence_packing.enabled",
    } <= set(errors)
    assert "divides the log-probs, not the logits" in errors["policy.generation.temperature"]
    assert (
        "policy.megatron_cfg.use_fused_linear_logprobs=false"
        in errors["policy.generation.temperature"]
    )


def test_engines_across_nodes_are_laid_out_and_planned(monkeypatch, tmp_path):
    """NeMo RL's DeepSeek-V3 and Qwen3-235B performance recipes: laid over whole nodes as NeMo
    RL lays them (hpcrl.plan.engine_nodes) and planned, colocated ones and those on generation
    nodes of their own alike (the job starts both across nodes:
    tests/vllm/test_grpo_cross_node.py)."""
    isolate_from_user_profiles(monkeypatch, tmp_path)
    expected = {
        "grpo-deepseek-v3-32n8g.yaml": "colocated: vLLM engines across nodes: 8 engine(s) of "
        "32 GPUs (GPUs shared with training), each on 4 whole nodes of 8 GPUs (engine 0: nodes "
        "0-3; engine 1: nodes 4-7; …; engine 7: nodes 28-31)",
        "grpo-qwen3-235b-16n4g.yaml": "colocated: vLLM engines across nodes: 8 engine(s) of 8 "
        "GPUs (GPUs shared with training), each on 2 whole nodes of 4 GPUs (engine 0: nodes "
        "0-1; engine 1: nodes 2-3; …; engine 7: nodes 14-15)",
        "grpo-deepseek-v3-64n8g-async-1off.yaml": "separate: vLLM engines across nodes: 8 "
        "engine(s) of 32 GPUs (GPUs of their own), each on 4 whole nodes of 8 GPUs (engine 0: "
        "nodes 32-35; engine 1: nodes 36-39; …; engine 7: nodes 60-63)",
    }
    for name, layout in expected.items():
        path = config_path(f"recipes/llm/performance/{name}")
        recipe = load_as_hpcrl(path).recipe
        spec = plan(recipe, load_profile("eos"), run_dir="/runs/x", recipe_source=str(path))
        checks = [c.message for c in spec.checks if c.name == "generation"]
        assert f"{layout}; each through" in checks[-1], (name, checks)
        if spec.generation is not None:
            assert (spec.generation.num_engines, spec.generation.nodes_per_engine) == (8, 4)


def test_fp8_rollouts_and_training_are_refused_with_their_reason():
    """NeMo RL's own FP8 recipe: every FP8 key names FP8 and why, including
    ``vllm_cfg.precision: fp8``, a value of a schema key (it once said only "'fp8' is not one
    of: float32, bfloat16, float16")."""
    errors = errors_of("grpo_math_8B_megatron_fp8.yaml", [])
    for path, what in (
        ("policy.generation.vllm_cfg.precision", "FP8 generation is not supported yet"),
        ("policy.generation.vllm_cfg.use_deep_gemm", "FP8 generation is not supported yet"),
        ("policy.megatron_cfg.fp8_cfg", "FP8 training is not supported yet"),
    ):
        assert what in errors[path], errors[path]
    assert "no FP8 kernels" in errors["policy.generation.vllm_cfg.precision"]
    assert "Transformer Engine" in errors["policy.megatron_cfg.fp8_cfg"]
    assert (
        "set policy.generation.vllm_cfg.precision to one of: float32, bfloat16, float16"
        in (errors["policy.generation.vllm_cfg.precision"])
    )

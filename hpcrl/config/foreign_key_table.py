"""The table of NeMo RL keys that hpcrl's schema does not hold (``FOREIGN_KEYS``), each
accepted as inert or accepted only at its "off" value, with the reason; and the NeMo RL
sections hpcrl refuses whole (``UNSUPPORTED_SECTIONS``). ``foreign_keys`` looks keys up in it.
"""

from __future__ import annotations

from hpcrl.config.foreign_key_entry import ForeignKey, inert, off_only
from hpcrl.config.refusal_reasons import (
    FP8_GENERATION,
    FP8_TRAINING,
    MEGATRON_INFERENCE_LAYOUT,
    MODELOPT_COMPANION,
    MODELOPT_QUANTIZATION,
    MTP_REFUSAL,
    NOT_YET,
    VLLM_EXPERT_PARALLEL,
)

#: Sections the schema holds (their keys are checked, as DESIGN.md's manual-GC contract asks)
#: but nothing trains with yet: a recipe that gives one is an error (rules.py).
UNSUPPORTED_SECTIONS: dict[str, str] = {
    "value": f"PPO value models are {NOT_YET}: hpcrl trains GRPO and SFT",
    "teacher": f"distillation teachers are {NOT_YET}: hpcrl trains GRPO and SFT",
}

FOREIGN_KEYS: tuple[ForeignKey, ...] = (
    # ---------------------------------------------------------------- other algorithms
    off_only("dpo", f"DPO is {NOT_YET}: hpcrl trains GRPO and SFT", None),
    off_only("distillation", f"distillation is {NOT_YET}: hpcrl trains GRPO and SFT", None),
    off_only("rm", f"reward-model training is {NOT_YET}: hpcrl trains GRPO and SFT", None),
    off_only("ppo", f"PPO is {NOT_YET}: hpcrl trains GRPO and SFT", None),
    # ---------------------------------------------------------------- async_rl's resiliency
    # (the schema holds its sampler and batch settings: hpcrl.config.recipe_async_rl)
    off_only(
        "async_rl.rollout_failure.max_skipped_prompts",
        "dropping a prompt whose rollouts keep failing and training the step without it is "
        f"{NOT_YET}: in hpcrl a rollout that fails ends the run, as NeMo RL does at 0",
        0,
    ),
    off_only(
        "async_rl.rollout_failure.max_consecutive_dropped_prompts",
        "dropping prompts while the generation fleet keeps failing and training the steps "
        f"without them is {NOT_YET}: in hpcrl a rollout that fails ends the run, as NeMo RL "
        "does at 0",
        0,
    ),
    inert(
        "async_rl.rollout_failure",
        "how often and after how long NeMo RL retries a failed rollout (a fresh sample of the "
        "same prompt) before it ends the run, and what replaces a dropped prompt, which only "
        "the drop budgets above allow: how a run meets faults, not what a step trains on",
    ),
    off_only(
        "async_rl.stall_watchdog.stall_action",
        f"ending a run whose rollouts stall is {NOT_YET} (NeMo RL's warn only reports it)",
        "warn",
    ),
    inert(
        "async_rl.stall_watchdog",
        "when NeMo RL's watchdog reports rollouts that made no progress: a warning in the "
        "log, not what is trained",
    ),
    off_only(
        "async_rl.generation_fleet_health",
        f"health probes and quarantine of NeMo RL's generation shards are {NOT_YET}",
        None,
    ),
    off_only(
        "async_rl.generation_router",
        f"NeMo RL's router in front of NeMo-Gym is {NOT_YET} (hpcrl has no NeMo-Gym)",
        None,
    ),
    # ---------------------------------------------------------------- policy, both backends
    inert(
        "policy.generation_batch_size",
        "batch size of NeMo RL's HF/Megatron generation backends; hpcrl's samplers batch all "
        "prompts of a step themselves (batching does not change what is sampled)",
    ),
    inert(
        "policy.logprob_chunk_size",
        "chunks the log-prob computation over the sequence to save memory; the values are the "
        "same, hpcrl computes them unchunked",
    ),
    inert(
        "policy.refit_buffer_size_gb",
        "GiB of weights NeMo RL packs into each bucket of a colocated refit (null: a share of "
        "free memory): in how many pieces the same weights reach the engine, not which",
    ),
    inert(
        "policy.offload_optimizer_for_logprob",
        "moves optimizer state to the CPU while log-probs are computed: where memory lives, "
        "not what is computed",
    ),
    off_only(
        "policy.activation_checkpointing_enabled",
        "NeMo RL's code never reads this key (two of its configs carry it, at false): true "
        "would turn nothing on there or here; activation checkpointing is "
        "policy.dtensor_cfg.activation_checkpointing (Automodel) or "
        "policy.megatron_cfg.activation_checkpointing",
        False,
        None,
    ),
    off_only(
        "policy.tokenizer.is_tokenizer_processor",
        f"multimodal processors are {NOT_YET}",
        False,
        None,
    ),
    # ---------------------------------------------------------------- automodel_cfg (dtensor_cfg)
    inert(
        "policy.automodel_cfg._v2",
        "picks one of NeMo RL's two DTensor worker implementations of the same training "
        "step; hpcrl has one Automodel backend",
    ),
    # moe_parallelizer: NeMo Automodel's MoE parallelizer options (expert_parallel_size)
    off_only(
        "policy.automodel_cfg.moe_parallelizer.lm_head_precision",
        f"an lm_head in its own precision is {NOT_YET} (it computes in policy.precision)",
        None,
    ),
    inert(
        "policy.automodel_cfg.moe_parallelizer.reshard_after_forward",
        "whether FSDP frees the gathered weights after each forward of NeMo Automodel's MoE "
        "models: memory against communication, not what is computed",
    ),
    inert(
        "policy.automodel_cfg.moe_parallelizer.wrap_outer_model",
        "which module NeMo Automodel's MoE parallelizer wraps with FSDP last: how weights "
        "are grouped for sharding, not what is computed",
    ),
    inert(
        "policy.automodel_cfg.clear_cache_every_n_steps",
        "empties the CUDA caching allocator every N micro-batches of NeMo RL's DTensor "
        "worker: memory fragmentation, not what is computed",
    ),
    off_only(
        "policy.automodel_cfg.custom_parallel_plan",
        f"custom tensor-parallel plans are {NOT_YET} (hpcrl applies its own plan)",
        None,
    ),
    # env.reward_model.dtensor_cfg: how NeMo RL shards its reward-model policy
    inert(
        "env.reward_model.dtensor_cfg._v2",
        "picks one of NeMo RL's two DTensor worker implementations for its reward-model "
        "policy; hpcrl's scorer runs the model's own forward",
    ),
    off_only(
        "env.reward_model.dtensor_cfg.custom_parallel_plan",
        "a tensor-parallel plan for the reward model: hpcrl's scorer holds the whole model "
        "on each of its GPUs",
        None,
    ),
    # automodel_kwargs: the named entries first (each takes its key out), then what is left
    inert(
        "policy.automodel_cfg.automodel_kwargs.force_hf",
        "makes NeMo Automodel load the Hugging Face implementation of the model: the one "
        "hpcrl's Automodel backend always trains",
    ),
    inert(
        "policy.automodel_cfg.automodel_kwargs.use_liger_kernel",
        "Liger's fused kernels for the same functions (RMSNorm, RoPE, SwiGLU, cross entropy); "
        "hpcrl runs PyTorch's",
    ),
    inert(
        "policy.automodel_cfg.automodel_kwargs.use_sdpa_patching",
        "whether NeMo Automodel patches the model's attention to PyTorch SDPA: which kernel "
        "computes attention, not what it computes",
    ),
    inert(
        "policy.automodel_cfg.automodel_kwargs.attn_implementation",
        "which Hugging Face kernel computes attention (eager, sdpa, flash_attention_2), not "
        "what it computes; hpcrl's Automodel backend loads the model with PyTorch SDPA",
    ),
    off_only(
        "policy.automodel_cfg.automodel_kwargs.backend.fake_balanced_gate",
        "a fake balanced MoE router (NeMo Automodel's test switch) is not supported",
        False,
        None,
    ),
    inert(
        "policy.automodel_cfg.automodel_kwargs.backend",
        "kernel choices (attention, linear, norm, MoE experts and dispatcher) of NeMo "
        "Automodel's own model implementations; hpcrl trains the Hugging Face implementation "
        "(as force_hf: true does)",
    ),
    off_only(
        "policy.automodel_cfg.automodel_kwargs.freeze_config.freeze_language_model",
        f"freezing the language model is {NOT_YET}",
        False,
        None,
    ),
    inert(
        "policy.automodel_cfg.automodel_kwargs.freeze_config",
        "freezes a multimodal model's vision and audio towers; hpcrl trains on text, which "
        "never passes through them",
    ),
    off_only(
        "policy.automodel_cfg.automodel_kwargs",
        f"extra from_pretrained arguments are {NOT_YET}",
        None,
        {},
    ),
    # ---------------------------------------------------------------- megatron_cfg
    inert(
        "policy.megatron_cfg.converter_type",
        "names the HF architecture for NeMo RL's older converters; megatron-bridge reads it "
        "from the checkpoint's config.json",
    ),
    off_only("policy.megatron_cfg.fp8_cfg", FP8_TRAINING, None),
    off_only("policy.megatron_cfg.mtp_num_layers", MTP_REFUSAL, 0, None),
    *(
        inert(
            f"policy.megatron_cfg.{name}",
            "read by NeMo RL's multi-token prediction only when policy.megatron_cfg."
            "mtp_num_layers is above 0, which hpcrl refuses; at 0 or null it changes nothing",
        )
        for name in ("mtp_loss_scaling_factor", "mtp_use_repeated_layer", "mtp_detach_heads")
    ),
    inert(
        "policy.megatron_cfg.defer_fp32_logits",
        "when megatron-core's bf16 logits are cast to fp32: at once (hpcrl) or in NeMo RL's "
        "log-prob code, which casts them before the log-softmax; the same values, less memory",
    ),
    inert(
        "policy.sequence_packing.fuse_loss",
        "NeMo RL's Megatron worker computes the loss of a packed micro-batch in one pass "
        "instead of one per sequence, numerically identical by its own account: kernel "
        "launches, not values",
    ),
    inert(
        "policy.megatron_cfg.fused_linear_logprobs_chunk_size",
        "sequence chunk of NeMo RL's fused log-probs (use_fused_linear_logprobs): how many "
        "positions are computed at once, not their values",
    ),
    # ---------------------------------------------------------------- placement, transport
    inert(
        "cluster.segment_size",
        "orders NeMo RL's Ray placement bundles by NVLink domain (multi-node NVLink systems "
        "such as GB200 NVL72): which GPU holds which rank, not what is computed",
    ),
    inert(
        "data_plane",
        "NeMo RL's TransferQueue data plane: how rollout batches move between its workers "
        "(a storage backend), not what they hold; hpcrl moves them through Ray",
    ),
    # ---------------------------------------------------------------- generation
    inert(
        "policy.generation.vllm_cfg.async_engine",
        "whether NeMo RL drives vLLM through its async engine API; the same engine samples "
        "the same way (hpcrl's asynchrony is grpo.async_grpo)",
    ),
    off_only(
        "policy.generation.use_async_rollouts",
        "NeMo RL's per-sample asynchronous rollouts (multi-turn environments, its async "
        "engine); hpcrl's asynchrony is grpo.async_grpo",
        False,
        None,
    ),
    inert(
        "policy.generation.vllm_cfg.use_tqdm",
        "vLLM's progress bar while NeMo RL generates: what the log shows, not what is sampled",
    ),
    inert(
        "policy.generation.vllm_cfg.enable_vllm_metrics_logger",
        "NeMo RL's periodic vLLM throughput/queue metrics: what is logged, not what is sampled",
    ),
    inert(
        "policy.generation.vllm_cfg.vllm_metrics_logger_interval",
        "seconds between NeMo RL's vLLM metrics samples: what is logged, not what is sampled",
    ),
    inert(
        "policy.generation.vllm_cfg.load_format",
        "how vLLM loads its first weights; hpcrl refits the trainer's weights into the engine "
        "before the first generation, so they are overwritten either way",
    ),
    off_only("policy.generation.vllm_cfg.expert_parallel_size", VLLM_EXPERT_PARALLEL, 1),
    inert(
        "policy.generation.vllm_cfg.enable_expert_parallel",
        "NeMo RL never reads it (v0.5.0 to main): it turns vLLM's expert parallelism on "
        "from vllm_cfg.expert_parallel_size > 1 alone, which hpcrl refuses by name",
    ),
    off_only("policy.generation.vllm_cfg.use_deep_gemm", FP8_GENERATION, False),
    inert(
        "policy.generation.vllm_cfg.quantization_ignored_layer_kws",
        "layers NeMo RL's FP8 generation keeps in bf16, read only with "
        "vllm_cfg.precision: fp8, which hpcrl refuses by name",
    ),
    off_only("policy.generation.vllm_cfg.num_last_layers_in_bf16", FP8_GENERATION, 0),
    off_only("policy.generation.vllm_cfg.num_first_layers_in_bf16", FP8_GENERATION, 0),
    inert(
        "policy.generation.refit_cfg",
        "tuning of NeMo RL's refit transports (buckets, compression, storage, workers, "
        "retries): how the same weights travel to vLLM, not which",
    ),
    *(
        inert(f"policy.generation.mcore_generation_config.{name}", why)
        for name, why in {
            **dict.fromkeys(
                (
                    "buffer_size_gb",
                    "buffer_guaranteed_fraction",
                    "block_size_tokens",
                    "max_tokens",
                    "max_requests",
                    "unified_memory_level",
                    "kv_cache_management_mode",
                ),
                "how much memory and how many tokens per step NeMo RL's Megatron inference "
                "engine holds (its KV cache blocks and buffers): how fast it samples, not what",
            ),
            **dict.fromkeys(
                (
                    "num_cuda_graphs",
                    "use_cuda_graphs_for_non_decode_steps",
                    "cuda_graph_impl",
                    "inference_cuda_graph_scope",
                    "enable_chunked_prefill",
                    "enable_prefix_caching",
                    "materialize_only_last_token_logits",
                ),
                "how NeMo RL's Megatron inference engine runs the same forward (CUDA graphs, "
                "chunked prefill, cached prefixes, last-token logits): speed, not the samples",
            ),
            "logging_step_interval": "how often NeMo RL's Megatron inference engine logs",
            "refit_backend": "the transport of NeMo RL's non-colocated Megatron refit "
            "(gloo, nccl, nvshmem); hpcrl moves the same weights through Ray's object store",
            "activation_checkpointing": "recomputation in backward; inference runs no backward",
        }.items()
    ),  # fmt: skip
    # ---------------------------------------------------------------- NeMo RL features
    # hpcrl does not have (each refused by what it is, its "off" value accepted)
    off_only(
        "policy.draft",
        "EAGLE-3 speculative decoding is " + NOT_YET + ": NeMo RL trains an EAGLE draft model "
        "beside the policy (a soft-target cross-entropy on the policy's hidden states, "
        "draft.loss_weight) and vLLM proposes tokens with it that the policy verifies; hpcrl "
        "has neither the draft model's training nor speculative decoding",
        None,
        {},
    ),
    off_only(
        "policy.router_replay",
        "MoE router replay is " + NOT_YET + ": NeMo RL has vLLM return the experts each "
        "token was routed to and makes the Megatron policy route its log-prob and training "
        "passes through the same experts; hpcrl's MoE training routes with its own router",
        None,
        {},
    ),
    off_only("policy.quant_cfg", MODELOPT_QUANTIZATION, None),
    off_only("policy.generation.quant_cfg", MODELOPT_QUANTIZATION, None),
    off_only("policy.generation.real_quant", MODELOPT_QUANTIZATION, None, False),
    *(
        inert(path, MODELOPT_COMPANION)
        for path in (
            "policy.quant_calib_data",
            "policy.quant_calib_size",
            "policy.quant_batch_size",
            "policy.quant_sequence_length",
            "policy.disable_modelopt_layer_spec",
            "policy.generation.real_quant_ignore",
        )
    ),
    off_only(
        "policy.generation.vllm_cfg.is_mx",
        "MXFP8 generation is " + NOT_YET + ": with vllm_cfg.precision fp8, NeMo RL quantizes "
        "vLLM's weights to ModelOpt's MXFP8 (micro-scaled FP8 blocks) instead of block-wise "
        "FP8; " + FP8_GENERATION.split("; ", 1)[1],
        None,
        False,
    ),
    off_only(
        "policy.generation.vllm_cfg.expose_http_server",
        "serving vLLM over HTTP is " + NOT_YET + ": NeMo RL exposes the engine as an "
        "OpenAI-style server for rollouts driven outside it (NeMo-Gym's multi-turn agents), "
        "still refitted by NeMo RL; hpcrl's engines take prompts from its own driver only",
        None,
        False,
    ),
    off_only(
        "policy.megatron_cfg.freeze_config",
        "freezing parts of a Megatron model is " + NOT_YET + ": NeMo RL passes these switches "
        "to the model's own freeze() before the optimizer is built (vision encoder, vision "
        "projection or language model of a vision-language model), so frozen weights take "
        "no optimizer step, weight decay included; hpcrl trains every weight",
        None,
        {},
    ),
    *(
        off_only(
            f"policy.generation.mcore_generation_config.{name}", MEGATRON_INFERENCE_LAYOUT, None
        )
        for name in (
            "transformer_impl",
            "tensor_model_parallel_size",
            "expert_model_parallel_size",
            "sequence_parallel",
            "moe_router_num_groups",
            "moe_router_group_topk",
            "moe_router_dtype",
            "inference_grouped_gemm_backend",
        )
    ),
    off_only(
        "policy.generation.mcore_generation_config.async_engine",
        MEGATRON_INFERENCE_LAYOUT,
        None,
        False,
    ),
    # ---------------------------------------------------------------- GRPO math
    off_only(
        "loss_fn.positive_example_nll_weight",
        "VAPO's NLL term on correct responses is not supported: NeMo RL applies it only where "
        "the loss gets the rewards (its PPO); its GRPO loop does not pass them, so this key "
        "changes nothing there either (v0.7.0, main 7ea279a)",
        0.0,
        0,
    ),
    # ---------------------------------------------------------------- environments, data
    off_only(
        "env.sliding_puzzle_game",
        "NeMo RL's sliding-puzzle game (its own entry point, examples/run_grpo_sliding_puzzle.py: "
        "puzzles generated as the data set and a multi-turn environment that answers each "
        f"move) is {NOT_YET}: hpcrl trains on data sets with the single-turn math "
        "environment",
        None,
    ),
    inert(
        "data.add_system_prompt",
        "read only by NeMo RL's sliding-puzzle entry point, for the puzzle prompts it "
        "generates (env.sliding_puzzle_game is refused by name); no data set or processor of "
        "NeMo RL reads it",
    ),
    # ---------------------------------------------------------------- checkpointing
    inert(
        "checkpointing.model_save_format",
        "file format of NeMo RL's HF weight export; hpcrl's checkpoints are DCP (Automodel) or "
        "torch_dist (Megatron) and resume the same way whatever this says",
    ),
    inert(
        "sft.val_micro_batch_size",
        "micro-batch of the validation pass: how the validation loss is batched, not its value",
    ),
    # ---------------------------------------------------------------- logger
    inert(
        "logger.num_val_samples_to_print",
        "how many validation samples NeMo RL prints to the terminal; printing changes nothing",
    ),
    off_only("logger.swanlab_enabled", f"SwanLab logging is {NOT_YET}", False),
    inert("logger.swanlab", "settings of the SwanLab logger, read only when swanlab_enabled"),
)

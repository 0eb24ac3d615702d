"""Gemma 4 checkpoints (gemma4: ``Gemma4ForConditionalGeneration``, transformers >= 5 only;
NeMo RL's gemma-4 DAPO recipes) train on text through the Automodel backend as the Gemma 3
and Mistral 3 wrappers do (tests/core/test_multimodal_text_models.py, whose helpers this
reuses): the whole wrapper loaded, the language model run (per-layer input embeddings
included), the vision tower frozen. Runs under .venv-vllm (transformers 5).
"""

from __future__ import annotations

import pytest
import torch

from tests.core.parallel_harness import make_batch, masked_nll_loss
from tests.core.test_multimodal_text_models import (  # noqa: F401 -- worker_on: a fixture
    saved_tensors,
    worker_on,
    wrapper_logprobs,
)

TEXT = dict(
    vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=8,
    max_position_embeddings=64, sliding_window=4,
    layer_types=["sliding_attention", "full_attention"], vocab_size_per_layer_input=128,
    hidden_size_per_layer_input=8, per_layer_config={}, final_logit_softcapping=30.0,
)  # fmt: skip
#: special tokens above the ids make_batch draws; no audio tower
CONFIGS = {
    "gemma4": dict(
        text_config=TEXT, audio_config=None,
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=8, num_key_value_heads=2),
        boi_token_id=120, eoi_token_id=121, image_token_id=122, video_token_id=123,
        boa_token_id=124, eoa_token_index=125, audio_token_id=126,
    )
}  # fmt: skip
#: gemma-4-26B-A4B's shape: a MoE block (routed experts) in every layer
CONFIGS["gemma4_moe"] = dict(
    CONFIGS["gemma4"],
    text_config=dict(TEXT, enable_moe_block=True, num_experts=4, top_k_experts=2,
                     moe_intermediate_size=16),
)  # fmt: skip


@pytest.mark.parametrize("variant", ["gemma4", "gemma4_moe"])
def test_the_worker_trains_gemma4s_text_decoder_and_refits_in_the_checkpoint_layout(
    worker_on,  # noqa: F811 -- the imported fixture
    tmp_path,
    variant,
):
    from hpcrl.core.workers.sharding import split_micro_batches

    worker, path = worker_on("gemma4", {"gemma4": CONFIGS[variant]})
    checkpoint = saved_tensors(path)
    assert type(worker.model.hf).__name__ == "Gemma4ForConditionalGeneration"
    batch = make_batch(seed=3, batch_size=4)
    mask = batch["attention_mask"].bool()
    got = worker.logprobs(batch)
    torch.testing.assert_close(got[mask], wrapper_logprobs(path, batch)[mask], atol=1e-5, rtol=0)

    tokens = float(batch["token_mask"].sum())
    losses = [
        worker.train_step(split_micro_batches(batch, 2), masked_nll_loss, tokens)["loss"]
        for _ in range(3)
    ]
    assert losses[-1] < losses[0]

    refit = dict(worker.export_hf_weights())
    assert set(refit) - {"lm_head.weight"} == set(checkpoint)  # lm_head: tied to embeddings
    vision = [name for name in checkpoint if "vision" in name]
    assert vision
    for name, saved in checkpoint.items():
        assert refit[name].shape == saved.shape, name
        if name in vision:
            torch.testing.assert_close(refit[name], saved, atol=0, rtol=0, msg=name)
    (embed,) = [n for n in checkpoint if n.endswith("language_model.embed_tokens.weight")]
    assert not torch.equal(refit[embed], checkpoint[embed])  # the decoder did train

    worker.export_hf(str(tmp_path / "export"))
    exported = saved_tensors(str(tmp_path / "export"))
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in checkpoint.items()}
    # a DCP checkpoint (the experts per expert, as they train) exported as hpcrl export does:
    # the checkpoint's layout again (gemma4_moe: the experts stacked back, fused)
    from hpcrl.core.backends.automodel.export import export_dcp_to_hf

    worker.save_checkpoint(str(tmp_path / "dcp"))
    export_dcp_to_hf(tmp_path / "dcp", tmp_path / "from_dcp", path, path)
    from_dcp = saved_tensors(str(tmp_path / "from_dcp"))
    assert set(from_dcp) == set(exported)
    for name, tensor in exported.items():
        torch.testing.assert_close(from_dcp[name], tensor, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("checkpointing", [False, True])  # True: NeMo RL's recipe sets it
def test_gemma4_moe_at_expert_parallel_2_equals_one_process(tmp_path, checkpointing):
    """gemma-4-26B-A4B's MoE layers (router and experts beside a dense MLP) with each of 2
    gloo ranks keeping 2 of the 4 experts: log-probs, one step's loss and gradient norm, and
    the weights refitted after it equal one process's; the refit stacks the experts back
    into the checkpoint's fused ``experts.gate_up_proj``/``down_proj``, which vLLM loads."""
    from tests.core.test_multimodal_text_models import build_tiny
    from tests.transformers5.ep_worker import assert_ep_matches_one_process

    path = build_tiny(tmp_path / "gemma4", "gemma4", {"gemma4": CONFIGS["gemma4_moe"]})
    checkpoint = saved_tensors(path)
    fused = "model.language_model.layers.1.experts.gate_up_proj"
    assert tuple(checkpoint[fused].shape) == (4, 32, 32)  # [E, 2·I, H]
    assert_ep_matches_one_process(path, str(tmp_path / "result"), checkpoint, checkpointing)

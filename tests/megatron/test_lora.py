"""LoRA on the Megatron backend (``policy.megatron_cfg.peft``, megatron-bridge's LoRA) at TP 2,
the real worker on 2 gloo ranks: adapters alone train (base weights bit-identical), the loss
falls, the refit export carries merged weights (an HF model with them gives the policy's
log-probs), the checkpoint holds adapters only and a resume continues bit for bit, and the
consolidated HF folder reloads with the trained policy's log-probs."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from tests.megatron import harness, lora_ranks
from tests.megatron.test_roundtrip import _hf_logprobs

# Spawns gloo ranks that build real megatron-core models twice: tens of seconds here.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lora_tp2(converted, tmp_path_factory):
    hf_path, root = converted
    base = tmp_path_factory.mktemp("megatron-lora")
    checkpoint, consolidated = base / "checkpoint", base / "hf"
    results = harness.run_ranks(
        2, lora_ranks.lora_run, hf_path, root, 2, str(checkpoint), str(consolidated)
    )
    return hf_path, checkpoint, consolidated, results


def test_only_adapters_train_and_the_loss_falls(lora_tp2):
    _, _, _, results = lora_tp2
    for result in results:
        assert result["adapters"] and result["trainable"] == result["adapters"]
        assert all(".adapter.linear_" in name for name in result["adapters"])
        # every linear of every layer adapted (qkv, proj, fc1, fc2; and the output layer)
        assert {n.split(".adapter.")[0].rsplit(".", 1)[-1] for n in result["adapters"]} == {
            "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "output_layer",
        }  # fmt: skip
        # base weights bit-identical; B (zero-initialised) moved, so the adapters learnt
        assert result["changed"] and set(result["changed"]) <= set(result["adapters"])
        losses = [step["loss"] for step in result["trained_steps"]]
        assert losses[-1] < losses[0] - 0.05, losses


def test_refit_gives_merged_weights_with_the_policys_logprobs(lora_tp2, tmp_path):
    """The engine gets HF-named merged tensors (no adapter names left); an HF model holding
    them scores the batch as the trained policy does; the reference is the base model."""
    from transformers import AutoModelForCausalLM

    hf_path, _, _, results = lora_tp2
    refit = results[0]["refit"]
    assert not [name for name in refit if "adapter" in name or "lora" in name]
    reporter = next(r for r in results if r["trained"] is not None)
    model = AutoModelForCausalLM.from_pretrained(hf_path, torch_dtype=torch.float32)
    base = _hf_logprobs(hf_path, harness.fixed_batch()["input_ids"])
    model.load_state_dict(refit, strict=True)
    model.save_pretrained(tmp_path)
    engine = _hf_logprobs(str(tmp_path), harness.fixed_batch()["input_ids"])
    assert (engine - reporter["trained"]).abs().max().item() < 1e-5
    assert (engine - reporter["initial"]).abs().max().item() > 1e-2  # trained, not initial
    assert (reporter["initial"] - base).abs().max().item() < 1e-5  # B = 0: starts as the base
    assert (reporter["reference"] - base).abs().max().item() < 1e-5


def test_checkpoint_holds_adapters_only_and_resume_is_exact(lora_tp2):
    _, checkpoint, _, results = lora_tp2
    keys = FileSystemReader(str(checkpoint / "megatron")).read_metadata().state_dict_metadata
    # megatron-core's keys: the model's tensors by name, the optimizer's under "optimizer."
    model_keys = [key for key in keys if not key.startswith("optimizer.")]
    assert model_keys and all(".adapter." in key for key in model_keys), sorted(keys)[:8]
    for result in results:
        assert result["resumed"] == result["continued"]  # bit for bit
        reporter = next(r for r in results if r["trained"] is not None)
        assert torch.equal(reporter["resumed_logprobs"], reporter["trained"])


def test_consolidated_export_reloads_with_the_trained_logprobs(lora_tp2):
    _, _, consolidated, results = lora_tp2
    reporter = next(r for r in results if r["trained"] is not None)
    exported = _hf_logprobs(str(consolidated), harness.fixed_batch()["input_ids"])
    assert (exported - reporter["trained"]).abs().max().item() < 1e-5

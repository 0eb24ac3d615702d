"""LoRA on the Automodel backend under FSDP2 on 2 gloo ranks (the real worker, spawned
processes): frozen base weights, adapters alone in the optimizer and sharded like the
blocks, the SFT loss falling, exact resume from an adapters-only checkpoint, merged weights
for the generation engine (its log-probs equal the merged model's) and for both exports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hpcrl.core.models.tiny import ensure_tiny_model
from tests.core import lora_ranks
from tests.megatron.harness import run_ranks

pytestmark = pytest.mark.slow  # two spawned ranks, two worker setups each: ~30 s


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[dict]]:
    models = tmp_path_factory.mktemp("models")
    model_path = ensure_tiny_model("tiny:qwen2", cache_dir=str(models))
    out = tmp_path_factory.mktemp("lora")
    results = run_ranks(
        2, lora_ranks.train_save_resume_export, model_path, str(out), megatron=False
    )
    return model_path, out, results


def test_base_frozen_adapters_alone_trained_and_sharded(run) -> None:
    _, _, results = run
    first = results[0]
    for name, tensor in first["initial"].items():
        assert torch.equal(first["trained"][name], tensor), f"{name} changed"
    adapters = sorted(name for name in first["trained"] if "lora_" in name)
    assert adapters and len(adapters) == 2 * (7 * 2 + 1)  # 7 linears x 2 layers + lm_head
    trained = [f"hf.{name}" for name in adapters]
    for rank_result in results:
        assert rank_result["held"] == trained
        assert rank_result["stateful"] == trained
        # FSDP shards each adapter over the 2 ranks along dim 0, like the base weights
        for name, (placements, local_shape) in rank_result["layout"].items():
            full = first["trained"][name.removeprefix("hf.")].shape
            assert placements == "(Shard(dim=0),)", name
            assert local_shape[0] == (full[0] + 1) // 2 or local_shape[0] == full[0] // 2
    b_weights = [first["trained"][n] for n in adapters if "lora_B" in n]
    assert all(float(b.abs().max()) > 0 for b in b_weights)  # B moved from zero


def test_sft_loss_falls_with_lora(run) -> None:
    fit = run[2][0]["fit"]
    assert fit[-1] < 0.6 * fit[0], fit
    assert all(later < earlier for earlier, later in zip(fit, fit[1:], strict=False)), fit


def test_resume_from_adapters_only_checkpoint_is_exact(run) -> None:
    _, out, results = run
    for rank_result in results:
        assert rank_result["resumed"] == rank_result["after"]
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(out / "ckpt" / "dcp")).read_metadata().state_dict_metadata
    model_keys = [key for key in keys if key.startswith("model.")]
    # the adapters (and their optimizer state) only: the base weights come from the model
    assert len(model_keys) == 30 and all(".lora_" in key for key in model_keys)
    assert not [key for key in keys if key.startswith("optim.") and ".lora_" not in key
                and key.startswith("optim.state.")]  # fmt: skip


def _expected_merged(trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    scale = lora_ranks.ALPHA / lora_ranks.RANK
    merged = {}
    for name, tensor in trained.items():
        if "lora_" in name:
            continue
        module = name.removesuffix(".weight")
        if f"{module}.lora_A.weight" in trained:
            a, b = trained[f"{module}.lora_A.weight"], trained[f"{module}.lora_B.weight"]
            tensor = tensor + scale * (b @ a)
        merged[name] = tensor
    return merged


def test_refit_and_in_job_export_hold_the_merged_weights(run) -> None:
    _, out, results = run
    expected = _expected_merged(results[0]["trained"])
    merged = results[0]["merged"]
    assert sorted(merged) == sorted(expected)
    exported = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32).state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(exported[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_hpcrl_export_of_a_lora_checkpoint_merges_onto_the_base(run, tmp_path) -> None:
    from hpcrl.core.backends.automodel.export import export_dcp_to_hf

    model_path, out, results = run
    scale = lora_ranks.ALPHA / lora_ranks.RANK
    export_dcp_to_hf(out / "ckpt", tmp_path / "hf", model_path, model_path, lora_scale=scale)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    from hpcrl.core.backends.automodel.export import read_model_tensors

    saved = read_model_tensors(out / "ckpt")
    assert saved and all("lora_" in name for name in saved)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    expected = _expected_merged({**base, **saved})
    state = exported.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name], tensor, atol=1e-6, rtol=0, msg=name)
    assert not torch.equal(state["lm_head.weight"], base["lm_head.weight"])


def test_generation_engine_after_refit_matches_the_merged_model(run) -> None:
    from hpcrl.config.recipe import GenerationCfg
    from hpcrl.core.generation.torch_engine import TorchEngine
    from tests.core.parallel_harness import reference_logprobs

    model_path, out, results = run
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    engine = TorchEngine.from_hf_model(base)
    engine.update_weights(results[0]["merged"].items())
    prompts = [[5, 9, 14, 3], [7, 7, 21], [30, 2, 11, 19, 40]]
    out_ids = engine.generate(prompts, GenerationCfg(temperature=0.0, max_new_tokens=6), 0)
    merged_model = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32).eval()
    batch = {"input_ids": out_ids["input_ids"], "attention_mask": out_ids["attention_mask"]}
    with torch.no_grad():
        want = reference_logprobs(merged_model, batch)
        plain = reference_logprobs(base, batch)
    got = out_ids["generation_logprobs"]
    response = out_ids["response_mask"].bool()
    assert int(response.sum()) >= 3
    torch.testing.assert_close(got[response], want[response], atol=1e-4, rtol=0)
    assert float((got[response] - plain[response]).abs().max()) > 1e-3

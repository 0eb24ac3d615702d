"""``policy.hf_config_overrides`` on the Megatron backend (tiny random Qwen3 saved as an HF
checkpoint): the provider carries a YaRN rope_scaling and max_position_embeddings (which
megatron-bridge 0.3 alone drops to plain RoPE), the Megatron model built with them scores
tokens as the HF model with the same overrides does (and not as either model without them),
an export writes the overridden config, a rope_theta the model would ignore is refused, and
the real worker converts apart and scores as HF with the overrides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.megatron import harness, hf_overrides_ranks
from tests.megatron.tiny_hf import build_tiny_hf_model

#: NeMo RL's YaRN block (sft-qwen3-0.6B-1n8g-megatron-yarn-128k.yaml), scaled to the tiny
#: model: every field set, truncate on, mscale 1 / mscale_all_dim 0
NEMO_RL_YARN = {
    "max_position_embeddings": 128,
    "rope_scaling": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "truncate": True,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1,
        "mscale_all_dim": 0,
    },
}
#: only what HF requires: HF's defaults fill the rest (original length = max_position_embeddings)
YARN_DEFAULTS = {"max_position_embeddings": 64, "rope_scaling": {"type": "yarn", "factor": 2.0}}
#: mscale without mscale_all_dim: HF then ignores mscale (factor alone sets the attention
#: factor), megatron-core would not
MSCALE_ALONE = {
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "mscale": 2,
        "mscale_all_dim": 0,
    }
}
SEQ_LEN = 96  # past the YaRN block's original 32 positions
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_hf_model(tmp_path_factory.mktemp("qwen3") / "hf", "qwen3"))


def test_provider_carries_yarn_and_max_position_embeddings(megatron_cpu, qwen3):
    from hpcrl.core.backends.megatron.bridge_compat import import_bridge
    from hpcrl.core.backends.megatron.hf_import import build_provider

    plain = build_provider(qwen3, load_weights=False)
    assert plain.position_embedding_type == "rope" and plain.seq_length == 256
    unscaled = build_provider(qwen3, load_weights=False, hf_config_overrides={"rope_scaling": None})
    assert unscaled.position_embedding_type == "rope"

    provider = build_provider(qwen3, load_weights=False, hf_config_overrides=NEMO_RL_YARN)
    assert provider.position_embedding_type == "yarn"
    assert provider.seq_length == 128  # max_position_embeddings, before the recipe's length
    assert (
        provider.yarn_rotary_scaling_factor,
        provider.yarn_original_max_position_embeddings,
        provider.yarn_beta_fast,
        provider.yarn_beta_slow,
        provider.yarn_mscale,
        provider.yarn_mscale_all_dim,
        provider.yarn_correction_range_round_to_int,
    ) == (4.0, 32, 32.0, 1.0, 1.0, 0.0, True)

    defaults = build_provider(qwen3, load_weights=False, hf_config_overrides=YARN_DEFAULTS)
    assert defaults.position_embedding_type == "yarn"
    assert defaults.yarn_original_max_position_embeddings == 64  # HF: max_position_embeddings
    assert (defaults.yarn_beta_fast, defaults.yarn_beta_slow) == (32.0, 1.0)
    assert defaults.yarn_correction_range_round_to_int is True

    # why hpcrl completes it: the bridge alone maps the yarn fields, then Qwen3's bridge
    # sets plain RoPE, so the model would silently ignore them
    bridge = import_bridge().AutoBridge.from_hf_pretrained(qwen3, **NEMO_RL_YARN)
    assert bridge.to_megatron_provider(load_weights=False).position_embedding_type == "rope"


def test_a_rope_theta_the_model_ignores_is_refused(megatron_cpu, qwen3):
    from hpcrl.core.backends.megatron.hf_import import build_provider

    other_theta = {"rope_scaling": {**NEMO_RL_YARN["rope_scaling"], "rope_theta": 1e6}}
    with pytest.raises(
        ValueError, match=r"hf_config_overrides\.rope_scaling\.rope_theta = 1000000"
    ):
        build_provider(qwen3, load_weights=False, hf_config_overrides=other_theta)


def test_conversions_are_kept_apart_per_overrides():
    from hpcrl.core.backends.megatron.conversion import conversion_key

    assert conversion_key("Qwen/Qwen3-0.6B", {}) == "Qwen--Qwen3-0.6B"
    yarn = conversion_key("Qwen/Qwen3-0.6B", NEMO_RL_YARN)
    assert yarn.startswith("Qwen--Qwen3-0.6B__hfovr_")
    assert yarn == conversion_key("Qwen/Qwen3-0.6B", dict(reversed(NEMO_RL_YARN.items())))
    assert yarn != conversion_key("Qwen/Qwen3-0.6B", YARN_DEFAULTS)


def _hf_logprobs(hf_path: str, overrides: dict, input_ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    from hpcrl.core.models.hf_config import load_hf_config

    model = AutoModelForCausalLM.from_pretrained(
        hf_path, config=load_hf_config(hf_path, overrides), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    return hf_overrides_ranks.token_logprobs(logits, input_ids)


def test_megatron_logprobs_equal_hf_with_the_same_overrides(qwen3, tmp_path):
    variants = {
        "none": {},
        "nemo_rl_yarn": NEMO_RL_YARN,
        "yarn_defaults": YARN_DEFAULTS,
        "mscale_alone": MSCALE_ALONE,
    }
    input_ids = torch.randint(4, 100, (2, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    export_dir = tmp_path / "export"
    (result,) = harness.run_ranks(
        1, hf_overrides_ranks.megatron_logprobs, qwen3, variants, input_ids, str(export_dir)
    )
    assert result["rope"] == {
        "none": "RotaryEmbedding",
        "nemo_rl_yarn": "YarnRotaryEmbedding",
        "yarn_defaults": "YarnRotaryEmbedding",
        "mscale_alone": "YarnRotaryEmbedding",
    }
    hf = {name: _hf_logprobs(qwen3, overrides, input_ids) for name, overrides in variants.items()}
    megatron = result["logprobs"]
    gaps = {name: (megatron[name] - hf[name]).abs().max().item() for name in variants}
    print("max |Megatron - HF| log-prob gaps:", gaps)  # shown with -s
    assert all(gap < TOLERANCE for gap in gaps.values()), gaps
    # the overrides matter at this length: without them both models score otherwise
    for name in ("nemo_rl_yarn", "yarn_defaults", "mscale_alone"):
        assert (hf[name] - hf["none"]).abs().max().item() > 100 * TOLERANCE
        assert (megatron[name] - megatron["none"]).abs().max().item() > 100 * TOLERANCE
    exported = json.loads(Path(export_dir, "config.json").read_text())
    assert exported["rope_scaling"]["factor"] == 4.0
    assert exported["max_position_embeddings"] == 128


#: YaRN scaled to the worker tests' 16-token rows
WORKER_YARN = {
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}
}


def test_the_worker_converts_apart_and_scores_as_hf_with_the_overrides(qwen3, tmp_path):
    root = str(tmp_path / "conversions")
    (result,) = harness.run_ranks(1, hf_overrides_ranks.worker_run, qwen3, root, WORKER_YARN)
    (conversion,) = [name for name in result["conversions"] if not name.endswith(".lock")]
    assert "__hfovr_" in conversion
    assert result["rope"] == "YarnRotaryEmbedding"
    input_ids = result["input_ids"]
    want = _hf_logprobs(qwen3, WORKER_YARN, input_ids)
    got = result["logprobs"][:, 1:].double()  # column 0: no previous token
    assert (got - want).abs().max().item() < TOLERANCE
    assert (got - _hf_logprobs(qwen3, {}, input_ids)).abs().max().item() > 100 * TOLERANCE
    assert "model.layers.0.self_attn.q_norm.weight" in result["exported"]

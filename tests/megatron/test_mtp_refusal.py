"""Multi-token prediction (policy.megatron_cfg.mtp_*) stays refused: the facts of the
installed megatron-core that its refusal (hpcrl.config.foreign_key_table.MTP_REFUSAL) names,
pinned so that an upgrade which lifts them fails here; and an HF config that asks for MTP
layers (num_nextn_predict_layers) builds none, as NeMo RL's mtp_num_layers 0 does."""

from __future__ import annotations

import inspect
import json

from tests.megatron.tiny_hf import build_tiny_hf_model


def test_megatron_core_lacks_what_nemo_rl_mtp_needs(megatron_cpu):
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.models.mamba.mamba_model import MambaModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from hpcrl.config.refusal_reasons import MTP_REFUSAL

    fields = TransformerConfig.__dataclass_fields__
    assert "mtp_num_layers" in fields
    assert "mtp_use_repeated_layer" not in fields and "mtp_detach_heads" not in fields
    # NemotronH (Nemotron 3 Super, every NeMo RL recipe that turns MTP on) is a MambaModel
    assert "mtp_block_spec" not in inspect.signature(MambaModel.__init__).parameters
    # the MTP loss needs labels, and with labels GPTModel returns a loss, not logits
    postprocess = inspect.getsource(GPTModel._postprocess)
    assert "mtp_labels = labels.clone()" in postprocess
    assert "if labels is None:" in postprocess
    assert "MambaModel" in MTP_REFUSAL and "mtp_detach_heads" in MTP_REFUSAL


def test_an_hf_config_with_mtp_layers_builds_none(megatron_cpu, tmp_path):
    from hpcrl.core.backends.megatron.hf_import import build_provider
    from hpcrl.core.backends.megatron.hf_overrides import bridge_with_overrides

    hf_path = build_tiny_hf_model(tmp_path / "hf", "llama")
    # as GLM-4.5's config.json says it (transformers keeps a field its class lacks)
    config = json.loads((hf_path / "config.json").read_text())
    (hf_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    bridged = bridge_with_overrides(str(hf_path), {}).to_megatron_provider(load_weights=False)
    assert bridged.mtp_num_layers == 1  # what megatron-bridge alone would build
    assert build_provider(str(hf_path), load_weights=False).mtp_num_layers is None

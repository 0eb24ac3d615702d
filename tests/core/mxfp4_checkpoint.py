"""A tiny gpt-oss checkpoint with MXFP4 experts, written here from an unquantized one, in
the layout of openai/gpt-oss-20b that transformers' mxfp4 integration reads:

- ``experts.gate_up_proj`` [E, H, 2I] and ``experts.down_proj`` [E, I, H] are stored as
  ``<name>_blocks`` uint8 [E, out, in/32, 16] and ``<name>_scales`` uint8 [E, out, in/32]
  (the weight transposed: rows are output features, 32-value blocks run along the inputs);
- each byte packs two e2m1 codes, the even element in the low nibble; each block's scale is
  an e8m0 exponent biased by 127: value = E2M1[code] · 2^(scale − 127);
- biases, router, attention and embeddings stay unquantized; config.json gets
  ``quantization_config`` ``{"quant_method": "mxfp4", ...}``.

The expected dequantized weights are computed here from the codes (not by transformers), so
a test can hold transformers' dequantization to them. Codes and exponents are random; every
value is exact in bf16.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

#: the 16 e2m1 values in code order (sign bit 3, then exponent 2 bits, mantissa 1 bit)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # fmt: skip
BLOCK = 32
QUANTIZED = ("experts.gate_up_proj", "experts.down_proj")
QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
    ],
}  # fmt: skip


def quantized_tensor(
    shape: torch.Size, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(blocks, scales, expected [E, in, out] fp32) of a random MXFP4 weight of ``shape``."""
    experts, inputs, outputs = shape
    codes = torch.randint(0, 16, (experts, outputs, inputs), generator=gen)
    exponents = torch.randint(-3, 2, (experts, outputs, inputs // BLOCK), generator=gen)
    scale = torch.pow(2.0, exponents.repeat_interleave(BLOCK, dim=-1).float())
    expected = torch.tensor(E2M1_VALUES)[codes] * scale
    pairs = codes.reshape(experts, outputs, inputs // BLOCK, BLOCK // 2, 2)
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    return blocks, (exponents + 127).to(torch.uint8), expected.transpose(1, 2).contiguous()


def write_mxfp4_checkpoint(source: str, target: Path) -> dict[str, torch.Tensor]:
    """``source``'s gpt-oss checkpoint with new random MXFP4 experts at ``target``; returns
    the expected dequantized expert weights by their unquantized names."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(Path(source) / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    stored, expected = {}, {}
    for name, tensor in tensors.items():
        if not name.endswith(QUANTIZED):
            stored[name] = tensor
            continue
        blocks, scales, expected[name] = quantized_tensor(tensor.shape, gen)
        stored[f"{name}_blocks"], stored[f"{name}_scales"] = blocks, scales
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(stored, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = QUANTIZATION_CONFIG
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return expected

"""What the ``config.json`` of the Hugging Face models NeMo RL's example configs train says:
``model_type``, ``architectures`` and, for a MoE, the key holding its expert count. The data
is ``hf_model_table.json`` beside this module (shipped with the package), one entry per
``policy.model_name`` the covered NeMo RL snapshots use, each with its ``source`` and, where
it is not certain, why (``uncertain``). ``validate`` reads it when the model's own config.json
is not on this machine (a hub name without a local Hugging Face cache), so that an
architecture hpcrl cannot build is refused before the job waits in the queue; the file
itself, when readable, always wins (``hpcrl.plan.architecture``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TABLE_FILE = "hf_model_table.json"


def read_table() -> dict[str, Any]:
    """The whole table: ``models``, ``placeholders``, the NeMo RL snapshots it covers and the
    transformers / megatron-bridge versions it was checked against."""
    # beside this module (hpcrl is installed as files: hpcrl.config.locate); not through
    # importlib.resources, whose import costs every validate ~1.5 ms here
    text = Path(__file__).with_name(TABLE_FILE).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def known_hf_config(model_name: str) -> dict[str, Any] | None:
    """The fields of ``model_name``'s config.json the table knows, shaped as config.json
    holds them (``model_type``, ``architectures``, the expert-count key with its count, a
    quantized checkpoint's ``quantization_config.quant_method``);
    None when the table does not list the name."""
    entry = read_table()["models"].get(model_name)
    if entry is None:
        return None
    config: dict[str, Any] = {
        "model_type": entry["model_type"],
        "architectures": list(entry["architectures"]),
    }
    experts = entry.get("experts")
    if experts is not None and experts.get("count") is not None:
        config[experts["key"]] = experts["count"]
    if "quant_method" in entry:  # a quantized checkpoint (gpt-oss: MXFP4 experts)
        config["quantization_config"] = {"quant_method": entry["quant_method"]}
    return config

"""hpcrl's table of the models NeMo RL's example configs train (hpcrl/config/hf_model_table.json)
covers every ``policy.model_name`` of every supported snapshot (a new snapshot naming a new
model fails here until the table has it), and agrees with the registries it was filled from:
transformers' own config and model classes, and megatron-bridge's bridges (read from its
source, not imported)."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from hpcrl.config.hf_model_table import known_hf_config, read_table
from hpcrl.config.nemo_rl_keys_build import merged_raw
from tests.nemo_rl_snapshots import RELEASES, release_root


def policy_model_names(release: str) -> set[str]:
    """Every ``policy.model_name`` set by a config of ``release`` (its defaults merged)."""
    cache: dict = {}
    names = set()
    for path in sorted((release_root(release) / "examples" / "configs").rglob("*.yaml")):
        policy = merged_raw(path, cache).get("policy") or {}
        name = policy.get("model_name") if isinstance(policy, dict) else None
        if isinstance(name, str) and not name.startswith("${"):
            names.add(name)
    return names


def test_the_table_covers_every_model_of_every_supported_snapshot():
    table = read_table()
    assert table["nemo_rl_snapshots"] == list(RELEASES)
    listed = table["models"].keys() | table["placeholders"].keys()
    missing = {r: sorted(policy_model_names(r) - listed) for r in RELEASES}
    assert missing == {r: [] for r in RELEASES}


def test_every_entry_names_its_source_and_transformers_agrees():
    table = read_table()
    assert table["checked_against"]["transformers"] == transformers.__version__
    for name, entry in table["models"].items():
        assert entry["source"], name
        model_type, (architecture,) = entry["model_type"], entry["architectures"]
        if model_type not in CONFIG_MAPPING:
            # the entry must say where it comes from instead: NeMo RL, remote code, memory
            said = entry["source"] + entry.get("uncertain", "")
            assert "transformers" in said or "remote code" in said or "NeMo RL" in said, name
            continue
        assert hasattr(transformers, architecture), (name, architecture)
        experts = entry.get("experts")
        if experts is not None:
            assert hasattr(CONFIG_MAPPING[model_type](), experts["key"]), (name, experts)


def test_an_entry_reads_as_its_config_json_would():
    assert known_hf_config("Qwen/Qwen3-30B-A3B") == {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_experts": 128,
    }
    assert known_hf_config("nvidia/NVIDIA-Nemotron-Nano-12B-v2") == {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
    }
    assert known_hf_config("someone/unknown-model") is None


def bridge_sources(models_dir: Path) -> list[str]:
    """``register_bridge(source=...)`` of megatron-bridge's model files, by name."""
    found = set()
    for path in models_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "register_bridge":
                for keyword in node.keywords:
                    if keyword.arg == "source":
                        value = keyword.value
                        found.add(value.value if isinstance(value, ast.Constant) else value.id)
    return sorted(found)


def test_the_recorded_megatron_bridge_registry_is_the_installed_ones():
    spec = importlib.util.find_spec("megatron.bridge")
    assert spec is not None and spec.submodule_search_locations
    models_dir = Path(next(iter(spec.submodule_search_locations))) / "models"
    recorded = read_table()["megatron_bridge_architectures"]["architectures"]
    assert bridge_sources(models_dir) == recorded
    checked = read_table()["checked_against"]["megatron_bridge"]
    assert importlib.metadata.version("megatron-bridge") == checked

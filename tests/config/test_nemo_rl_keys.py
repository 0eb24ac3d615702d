"""The NeMo RL key registry (issue 24, item 1): built from NeMo RL's own configs, current
against the snapshot each shipped file names, and what the loader does with its keys: at
NeMo RL's default a key is accepted unused (counted in one line of ``hpcrl validate``),
at another value it is refused with path, value, reason and fix, and a key nobody knows is
an error with "did you mean"."""

from __future__ import annotations

import contextlib
import io
import json
import textwrap
from pathlib import Path

import pytest

from hpcrl.config import ConfigError, load_recipe
from hpcrl.config.nemo_rl_keys import SUPPORTED_RELEASES, registry, registry_file
from hpcrl.config.nemo_rl_keys_build import examples_part
from hpcrl.config.nemo_rl_source import NO_DEFAULT, source_keys
from tests.nemo_rl_snapshots import release_root

BASE = "examples/configs/grpo_math_1B.yaml"


@pytest.mark.parametrize("release", SUPPORTED_RELEASES)
def test_a_shipped_registry_is_current_against_its_snapshot(release):
    """Rebuild the examples part from the snapshot the file names: a NeMo RL release that
    changed its example configs makes this fail until `python -m
    hpcrl.config.nemo_rl_keys_build <snapshot> --release <release>` is run again."""
    shipped = json.loads(registry_file(release).read_text(encoding="utf-8"))
    assert shipped["release"] == release
    assert shipped["examples"] == examples_part(release_root(release)), (
        f"{registry_file(release)} is stale: run python -m hpcrl.config.nemo_rl_keys_build "
        f"../shared/nemo-rl/{release} --release {release}"
    )
    # the source part came from NeMo RL's config classes of the same release
    assert shipped["source"]["keys"]["grpo.num_generations_per_prompt"]["defined_in"] == (
        "nemo_rl/algorithms/grpo.py:GRPOConfig"
    )


def test_the_source_reader_follows_typeddicts_pydantic_models_and_subclasses(tmp_path):
    """NeMo RL's config classes, as its source writes them, read without importing it."""
    package = tmp_path / "nemo_rl" / "algorithms"
    package.mkdir(parents=True)
    (tmp_path / "nemo_rl" / "gen.py").write_text(
        textwrap.dedent(
            """
            from typing import NotRequired, TypedDict
            class GenerationConfig(TypedDict):
                backend: str
                top_k: NotRequired[int | None]
            class VllmConfig(GenerationConfig):
                vllm_cfg: "VllmSpecific"
            class VllmSpecific(TypedDict, total=False):
                kv_cache_dtype: str
            """
        )
    )
    (package / "grpo.py").write_text(
        textwrap.dedent(
            """
            from typing import Any
            from pydantic import BaseModel, Field
            from nemo_rl.gen import GenerationConfig
            class Shaping(BaseModel):
                enabled: bool = False
            class GRPOConfig(BaseModel):
                seed: int = 42
                shaping: Shaping = Field(default_factory=Shaping)
            class MasterConfig(BaseModel):
                grpo: GRPOConfig
                generation: GenerationConfig
                env: dict[str, Any]
            """
        )
    )
    (package / "sft.py").write_text("")
    keys = {key.path: key for key in source_keys(tmp_path)}
    assert sorted(keys) == [
        "env",
        "generation",
        "generation.backend",
        "generation.top_k",
        "generation.vllm_cfg",
        "generation.vllm_cfg.kv_cache_dtype",
        "grpo",
        "grpo.seed",
        "grpo.shaping",
        "grpo.shaping.enabled",
    ]
    assert (keys["grpo.seed"].default, keys["grpo.seed"].default_from) == (42, "pydantic default")
    assert keys["generation.top_k"].not_required and keys["generation.top_k"].nullable
    assert keys["generation.vllm_cfg.kv_cache_dtype"].not_required  # total=False
    assert keys["env"].free_form and keys["generation.backend"].default is NO_DEFAULT


def test_a_base_config_loads_with_its_unused_keys_counted(tmp_path):
    loaded = load_recipe(release_root("main-7ea279a") / BASE)
    unused = {key.path: key for key in loaded.unused_nemo_rl_keys}
    kv = unused["policy.generation.vllm_cfg.kv_cache_dtype"]
    assert kv.value == "auto" and kv.at_default
    assert kv.why.startswith("NeMo RL's default, as in examples/configs/grpo_math_1B.yaml")
    # hpcrl's own reason where it decides itself
    assert unused["policy.dtensor_cfg._v2"].why.startswith("picks one of NeMo RL's two DTensor")
    assert not unused["policy.dtensor_cfg._v2"].at_default


def test_a_nemo_rl_key_at_another_value_is_refused_with_its_default():
    config = release_root("main-7ea279a") / BASE
    with pytest.raises(ConfigError) as caught:
        load_recipe(config, ["policy.generation.vllm_cfg.kv_cache_dtype=fp8"])
    (problem,) = [p for p in caught.value.errors]
    assert (problem.path, problem.value) == ("policy.generation.vllm_cfg.kv_cache_dtype", "fp8")
    assert "not implemented by hpcrl; NeMo RL's default is 'auto'" in problem.message
    assert problem.fix == (
        "remove policy.generation.vllm_cfg.kv_cache_dtype or set it to 'auto' (NeMo RL's default)"
    )


def test_a_key_nobody_knows_is_an_error_with_did_you_mean_over_both_key_sets(tmp_path):
    base = release_root("main-7ea279a") / BASE
    config = tmp_path / "typo.yaml"
    config.write_text(
        f"defaults: {base}\npolicy:\n  generation:\n    vllm_cfg:\n      kv_cache_dtyp: auto\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_recipe(config)
    (problem,) = caught.value.errors
    assert problem.path == "policy.generation.vllm_cfg.kv_cache_dtyp"
    assert problem.message == "unknown key 'kv_cache_dtyp'"
    assert problem.fix == "did you mean policy.generation.vllm_cfg.kv_cache_dtype?"


def test_hpcrl_recipes_never_read_the_registry():
    """Start-up cost: the registry is read only for a key the schema does not hold."""
    registry.cache_clear()
    load_recipe("grpo-tiny-1n-cpu")
    assert registry.cache_info().currsize == 0


def test_validate_prints_one_line_and_verbose_lists_the_keys(monkeypatch, tmp_path):
    from hpcrl.cli.main import main

    monkeypatch.chdir(tmp_path)
    config = str(release_root("main-7ea279a") / BASE)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["validate", config, "--cluster", "eos"]) == 0
    text = " ".join(out.getvalue().split())
    loaded = load_recipe(config)
    count = sum(key.at_default for key in loaded.unused_nemo_rl_keys)
    assert f"{count} NeMo RL keys at their defaults are not used by hpcrl" in text
    assert "(--verbose lists them)" in text and "kv_cache_dtype" not in text
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["validate", config, "--cluster", "eos", "--verbose"]) == 0
    text = " ".join(out.getvalue().split())
    assert "policy.generation.vllm_cfg.kv_cache_dtype = 'auto': NeMo RL's default" in text


def test_every_release_knows_the_keys_of_its_own_base_configs():
    known = registry()
    for release in SUPPORTED_RELEASES:
        data = json.loads(registry_file(release).read_text(encoding="utf-8"))
        base = [path for path, key in data["examples"]["keys"].items() if "defaults" in key]
        assert len(base) > 200, release
        assert all(known.lookup(tuple(path.split("."))) is not None for path in base)


def test_the_registry_files_ship_in_the_package():
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    assert "nemo_rl_releases/*.json" in config["options.package_data"]["hpcrl.config"]


def test_an_override_with_a_typo_of_a_nemo_rl_key_gets_did_you_mean():
    base = release_root("main-7ea279a") / BASE
    with pytest.raises(ConfigError) as caught:
        load_recipe(base, ["policy.generation.vllm_cfg.kv_cache_dtyp=auto"])
    (problem,) = caught.value.errors
    assert problem.path == "policy.generation.vllm_cfg.kv_cache_dtyp"
    assert problem.fix == "did you mean policy.generation.vllm_cfg.kv_cache_dtype?"


def test_a_display_only_vllm_key_is_accepted_at_any_value():
    loaded = load_recipe(
        release_root("main-7ea279a") / BASE, ["policy.generation.vllm_cfg.use_tqdm=false"]
    )
    unused = {key.path: key for key in loaded.unused_nemo_rl_keys}
    tqdm = unused["policy.generation.vllm_cfg.use_tqdm"]
    assert tqdm.value is False and not tqdm.at_default
    assert tqdm.why.startswith("vLLM's progress bar")

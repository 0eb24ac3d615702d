"""A second run finds what the first compiled: the compile cache folder that ``hpcrl render``
plans (hpcrl.plan.compile_cache) is exported by the job script, and torch.compile in a fresh
process with that environment answers from it.

Each run is a fresh interpreter, as each job's worker is: the real ``AutomodelWorker``
compiling its decoder blocks with Inductor (on CPU through ``compile_on_cpu``; jobs compile
on GPUs only), one log-prob pass, then the cache figures every worker reports into
metrics.jsonl (``hpcrl.core.compile_stats``). Counters are asserted, not times.
"""

from __future__ import annotations

import re
import shlex

import pytest

from hpcrl.cli.main import main
from tests.core.compiling_worker import run_child
from tests.plan.planning_inputs import isolate_from_user_profiles
from tests.require import require_module

#: One compiling worker's run, in a process of its own (argv: the model's folder).
ONE_RUN = """
import sys
import hpcrl.core.backends.automodel.aot_block as aot_block
from hpcrl.core.compile_stats import compile_cache_counts
from tests.core.compiling_worker import compiling_worker, report_and_exit
from tests.core.parallel_harness import make_batch

# Inductor's caches as the blocks that are not compiled ahead of time use them (FSDP, activation
# checkpointing, TP: parallelize.apply_compile); the ahead-of-time path: test_aot_block.py
aot_block.precompiled_blocks = lambda backend: None
worker = compiling_worker(sys.argv[1])
logprobs = worker.logprobs(make_batch(0, batch_size=2, seq_len=24))
report_and_exit({**compile_cache_counts(), "logprob_sum": float(logprobs.sum())})
"""
CACHE_EXPORT = re.compile(r"^export (TORCHINDUCTOR_\w+|TRITON_CACHE_DIR)=(.*)$", re.MULTILINE)


def job_script_cache_env(script: str) -> dict[str, str]:
    """The compile cache variables the job script exports, as its shell would set them."""
    return {name: shlex.split(value)[0] for name, value in CACHE_EXPORT.findall(script)}


def one_run(model: str, env: dict[str, str]) -> dict[str, float]:
    return run_child(ONE_RUN, model, env, timeout_s=600)


@pytest.mark.slow  # Inductor's C++ kernels compile for ~30-70 s on the 2-core CI box
def test_the_second_run_compiles_nothing_the_first_compiled(tmp_path, monkeypatch):
    require_module("torch")
    from hpcrl.core.models.tiny import ensure_tiny_model

    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    assert main(["render", "grpo-tiny-1n-cpu", "--cluster", "local", "-o", str(runs / "a")]) == 0
    env = job_script_cache_env((runs / "a" / "job.sbatch").read_text())
    cache = runs / ".hpcrl-cache" / "torch-compile"
    assert env == {
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    model = ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path / "models"))

    first = one_run(model, env)
    assert first["compile_cache_misses"] > 0 and first["compile_cache_hits"] == 0, first
    assert first["compile_cache_bypasses"] == 0, first
    assert any((cache / "inductor").rglob("*")), "the first run wrote into the planned folder"
    second = one_run(model, env)
    # The same lookups, all answered from the folder (torch 2.13 on this model: 2 misses, then
    # 2 hits). Before floats were specialised (parallelize.apply_compile) dynamo restarted
    # every first compilation when Inductor specialised the norms' epsilon: one lookup more,
    # a miss in every run, and the block traced twice.
    assert second["compile_cache_hits"] == first["compile_cache_misses"], (first, second)
    assert second["compile_cache_misses"] == 0, (first, second)
    assert 0 < second["compile_time_s"] < first["compile_time_s"], (first, second)
    assert second["logprob_sum"] == pytest.approx(first["logprob_sum"], rel=1e-6)

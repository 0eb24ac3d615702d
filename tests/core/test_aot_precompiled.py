"""The torch engine's compiled pieces kept compiled ahead of time in the compile cache folder
(``hpcrl.core.generation.aot_precompiled``): the next process loads them and dynamo traces
nothing; a damaged file costs a compilation, never the call.

Each run is a fresh interpreter, as each job's worker is, with ``TORCHINDUCTOR_CACHE_DIR`` set
as hpcrl's job script sets it; real torch.compile with Inductor's CPU backend (the GPU's
figures: docs/performance.md, item 3). Counters are asserted, not times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.core.generation.aot_precompiled import (  # noqa: E402
    AOT_SUBDIR,
    PrecompiledPieces,
    _arguments_signature,
)
from hpcrl.core.generation.decoder import add_rms_norm  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
#: One process's first calls of the engine's compiled add_rms_norm, two shapes.
ONE_RUN = """
import json, warnings
import torch
from torch._dynamo.utils import compilation_time_metrics, counters
from hpcrl.core.generation.decoder import Pointwise, add_rms_norm

torch.set_num_threads(1)
piece = Pointwise.fused().add_rms_norm
preloaded = piece.precompiled.loads  # before the first call
generator = torch.Generator().manual_seed(0)
weight = torch.randn(64, generator=generator)
differences = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for rows, columns in ((3, 7), (5, 11)):
        residual, delta = (torch.randn(rows, columns, 64, generator=generator) for _ in range(2))
        got = piece(residual, delta, weight, 1e-6)
        want = add_rms_norm(residual, delta, weight, 1e-6)
        differences.append(max((a - b).abs().max().item() for a, b in zip(got, want)))
kept = piece.precompiled
print(json.dumps({
    "preloaded": preloaded, "loads": kept.loads, "builds": kept.builds, "failures": kept.failures,
    "frames_traced": len(compilation_time_metrics.get("_compile.compile_inner", ())),
    "graphs": counters["stats"]["unique_graphs"],
    "max_difference": max(differences),
    "warnings": [str(w.message) for w in caught],
}))
"""


def one_run(cache: Path, program: str = ONE_RUN) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures: dict = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


@pytest.mark.slow  # three processes, two of them compile with Inductor's C++ backend (~1 min)
def test_a_second_process_loads_the_piece_and_traces_nothing(tmp_path: Path) -> None:
    first = one_run(tmp_path)
    assert (first["builds"], first["loads"], first["failures"]) == (1, 0, [])
    assert first["max_difference"] <= 1e-5
    (saved,) = (tmp_path / AOT_SUBDIR).glob("*.bin")
    assert saved.name.startswith("add_rms_norm-")
    (index,) = (tmp_path / AOT_SUBDIR).glob("*.index")
    # the file, then its building call's grad mode and first tensor's shape (no autocast)
    assert index.read_text() == saved.name + " grad:1 shape:3x7x64\n"

    second = one_run(tmp_path)
    # loaded when the engine's pieces were made, before the first call; both shapes answered
    # by it: dynamo traced no frame, built no graph, nothing was read at a call
    assert (second["preloaded"], second["loads"], second["builds"]) == (1, 1, 0)
    assert second["failures"] == []
    assert (second["frames_traced"], second["graphs"]) == (0, 0)
    assert second["max_difference"] <= 1e-5
    assert second["warnings"] == []

    saved.write_bytes(saved.read_bytes()[:100])  # a damaged file (a crashed writer, say)
    third = one_run(tmp_path)
    assert (third["preloaded"], third["loads"], third["builds"]) == (0, 0, 0)
    assert len(third["failures"]) == 1
    assert third["frames_traced"] >= 1  # compiled as usual instead
    assert third["max_difference"] <= 1e-5
    assert any("no ahead-of-time compilation" in w for w in third["warnings"])


def test_nothing_is_kept_without_a_cache_folder_or_with_another_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    assert PrecompiledPieces.for_piece(add_rms_norm, "inductor") is None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert PrecompiledPieces.for_piece(add_rms_norm, "eager") is None
    monkeypatch.delenv("TORCHINDUCTOR_FX_GRAPH_CACHE")  # torch's own export of the folder
    assert PrecompiledPieces.for_piece(add_rms_norm, "inductor") is None
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    kept = PrecompiledPieces.for_piece(add_rms_norm, "inductor")
    assert kept is not None and kept.folder == tmp_path / AOT_SUBDIR


def test_arguments_of_another_kind_get_a_file_of_their_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    kept = PrecompiledPieces.for_piece(add_rms_norm, "inductor")
    assert kept is not None
    x = torch.zeros(2, 3)
    base = _arguments_signature((x, x, torch.zeros(3), 1e-6))
    assert base == _arguments_signature((torch.ones(5, 4), x, torch.ones(4), 1e-6))  # sizes: no
    others = [
        _arguments_signature((x.double(), x, torch.zeros(3), 1e-6)),  # dtype
        _arguments_signature((x[None], x, torch.zeros(3), 1e-6)),  # rank
        _arguments_signature((x, x, torch.zeros(3), 1e-5)),  # a plain value
    ]
    paths = {kept.path_for(s) for s in [base, *others]}
    assert len(paths) == 4


def breaks_the_graph(x: torch.Tensor) -> torch.Tensor:
    torch._dynamo.graph_break()  # aot_compile needs one full graph: its build fails
    return x + 1


def test_a_failed_build_is_not_tried_again_in_the_next_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A build that failed once (a graph break, found by dynamo before Inductor runs) would
    fail in every run, each paying the trace before the ordinary compilation."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    x = torch.ones(3)
    first = PrecompiledPieces.for_piece(breaks_the_graph, "inductor")
    assert first is not None
    with pytest.warns(UserWarning, match="no ahead-of-time compilation"):
        assert first.matching((x,)) is None
    assert first.builds == 0 and len(first.failures) == 1
    assert list((tmp_path / AOT_SUBDIR).glob("breaks_the_graph-*.failed"))
    counters.clear()
    second = PrecompiledPieces.for_piece(breaks_the_graph, "inductor")  # the next run's
    assert second is not None
    assert second.matching((x,)) is None
    assert "an earlier build failed" in second.failures[0]
    assert counters["frames"]["total"] == 0  # nothing traced


#: One process's sampling through the engine's fused sampler: a kept ``pick_tokens`` whose
#: batch dimension a build marks unbacked (tokens and log-probs against the eager sampler).
SAMPLER_RUN = """
import json, warnings
import torch
from torch._dynamo.utils import compilation_time_metrics, counters
from hpcrl.core.generation.aot_precompiled import TALLY
from hpcrl.core.generation.sampling import fused_sampler, sample_tokens
from hpcrl.core.token_distribution import TokenDistribution

torch.set_num_threads(1)
sample = fused_sampler()
distribution = TokenDistribution(temperature=0.7, top_p=0.9)
same_tokens, differences = [], []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for batch in (7, 1, 5):  # 1: the last live row after compaction
        generator = torch.Generator().manual_seed(batch)
        logits = torch.randn(batch, 48, generator=generator) * 3
        uniforms = torch.rand(batch, generator=generator)
        got = sample(logits, distribution, uniforms, greedy=False)
        want = sample_tokens(logits, distribution, uniforms, greedy=False)
        same_tokens.append(bool(torch.equal(got[0], want[0])))
        differences.append(float((got[1] - want[1]).abs().max()))
print(json.dumps({
    **TALLY, "frames_traced": len(compilation_time_metrics.get("_compile.compile_inner", ())),
    "graphs": counters["stats"]["unique_graphs"], "same_tokens": same_tokens,
    "max_difference": max(differences),
    "warnings": [str(w.message) for w in caught if "pick_tokens" in str(w.message)],
}))
"""


@pytest.mark.slow  # two processes, the first compiles with Inductor's C++ backend (~30 s)
def test_the_kept_sampler_takes_the_next_process_calls_of_every_batch_size(
    tmp_path: Path,
) -> None:
    """torch 2.13 refused the kept sampler in every warm process (2.1 s of tracing in a warm
    CPU generate): its calls marked the batch dimension unbacked, and the saved guards lose
    the mark ("_has_dynamo_dim_marking is present on runtime tensor but was absent at
    compile time"). The mark is now made for a compilation only."""
    first = one_run(tmp_path, SAMPLER_RUN)
    assert (first["aot_builds"], first["aot_loads"]) == (1, 0)
    assert first["graphs"] == 1  # every batch size, batch 1 included, from one compilation
    second = one_run(tmp_path, SAMPLER_RUN)
    assert (second["aot_loads"], second["aot_builds"], second["aot_guard_rejections"]) == (1, 0, 0)
    assert (second["frames_traced"], second["graphs"]) == (0, 0)
    assert second["warnings"] == []
    for run in (first, second):
        assert run["same_tokens"] == [True, True, True]
        assert run["max_difference"] <= 1e-5

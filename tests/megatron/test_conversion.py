"""Conversion into the resolved Megatron checkpoint dir: reuse, force, race, crash, ranks.

The orchestration is tested with converters that count their calls (the real bridge
conversion is exercised by test_roundtrip.py); processes and the file lock are real.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from hpcrl.core.backends.megatron.conversion import (
    COMPLETE_MARKER,
    TMP_INFIX,
    ensure_megatron_checkpoint,
    model_key,
)
from tests.megatron import harness


def _calls(count_file: Path) -> int:
    return len(count_file.read_text().splitlines()) if count_file.exists() else 0


def _ensure(root: Path, count_file: Path, payload: str, force: bool = False) -> Path:
    convert = functools.partial(
        harness.counting_converter, count_file=str(count_file), payload=payload
    )
    return ensure_megatron_checkpoint(
        "org/tiny",
        "/hf/tiny",
        str(root),
        force=force,
        convert=convert,
        rank=0,
        progress=lambda m: None,
    )


def test_model_key_is_a_safe_unique_directory_name():
    assert model_key("Qwen/Qwen2-1.5B") == "Qwen--Qwen2-1.5B"
    assert model_key("/models/qwen2/") == "models--qwen2"
    assert model_key("/a b/c:d") == "a_b--c_d"
    assert model_key("/models/a") != model_key("/other/a")
    with pytest.raises(ValueError, match="policy.model_name"):
        model_key("/")


def test_existing_conversion_is_reused(tmp_path):
    count_file = tmp_path / "calls"
    first = _ensure(tmp_path / "root", count_file, "v1")
    second = _ensure(tmp_path / "root", count_file, "v2")
    assert first == second == tmp_path / "root" / "org--tiny"
    assert _calls(count_file) == 1
    assert (second / "weights.txt").read_text() == "v1"
    assert (second / COMPLETE_MARKER).is_file()


def test_force_reconvert_replaces_the_conversion(tmp_path):
    count_file = tmp_path / "calls"
    _ensure(tmp_path / "root", count_file, "v1")
    final = _ensure(tmp_path / "root", count_file, "v2", force=True)
    assert _calls(count_file) == 2
    assert (final / "weights.txt").read_text() == "v2"
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["org--tiny", "org--tiny.lock"]


def test_two_racing_jobs_convert_once(tmp_path):
    count_file = tmp_path / "calls"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        paths = pool.starmap(
            harness.ensure_in_process,
            [(str(tmp_path / "root"), (str(count_file), f"job{i}", 2.0)) for i in range(2)],
        )
    assert paths[0] == paths[1]
    assert _calls(count_file) == 1
    assert (Path(paths[0]) / "weights.txt").read_text() in ("job0", "job1")


def test_crash_mid_conversion_leaves_nothing_that_is_used(tmp_path):
    root = tmp_path / "root"
    started = tmp_path / "started"
    ctx = multiprocessing.get_context("spawn")
    converter = ctx.Process(target=harness.ensure_hanging, args=(str(root), str(started)))
    converter.start()
    deadline = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < deadline and converter.is_alive(), "converter never started"
        time.sleep(0.1)
    os.kill(converter.pid, signal.SIGKILL)
    converter.join()
    leftovers = [p.name for p in root.iterdir() if TMP_INFIX in p.name]
    assert leftovers and not (root / "org--tiny").exists()

    count_file = tmp_path / "calls"
    final = _ensure(root, count_file, "v1")
    assert _calls(count_file) == 1
    assert (final / "weights.txt").read_text() == "v1"
    assert not [p.name for p in root.iterdir() if TMP_INFIX in p.name]


def test_only_global_rank_0_converts_the_others_wait(tmp_path):
    count_file = tmp_path / "calls"
    paths = harness.run_ranks(
        2, harness.ensure_on_rank, str(tmp_path / "root"), str(count_file), megatron=False
    )
    assert paths[0] == paths[1]
    assert _calls(count_file) == 1
    assert (Path(paths[1]) / COMPLETE_MARKER).is_file()

"""Conversion into the resolved Megatron checkpoint dir: reuse, force, race, crash, ranks.

The orchestration is tested with converters that count their calls (the real bridge
conversion is exercised by test_roundtrip.py); processes and the file lock are real.
"""

from __future__ import annotations

import functools
import json
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

RACE_TIMEOUT_S = 120.0


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


def _events(log_file: Path) -> dict[str, list[dict]]:
    by_job: dict[str, list[dict]] = {"A": [], "B": []}
    for line in log_file.read_text().splitlines():
        event = json.loads(line)
        by_job[event["who"]].append(event)
    return by_job


def _time_of(events: list[dict], prefix: str) -> float:
    (match,) = [e["t"] for e in events if e["what"].startswith(prefix)]
    return match


def test_second_job_blocks_on_the_lock_while_the_first_converts(tmp_path):
    """Job B starts while job A converts: B must report waiting for A (the lock held), reuse
    A's result only after A finished, and never convert. A's converter does not finish until
    B has reported that it waits, so the two really overlap; without the lock B would convert
    too (and A's converter would time out waiting)."""
    root, log_file, release = tmp_path / "root", tmp_path / "events.jsonl", tmp_path / "release"
    ctx = multiprocessing.get_context("spawn")
    jobs = {
        who: ctx.Process(
            target=harness.racing_job,
            args=(str(root), str(log_file), who, str(release), RACE_TIMEOUT_S),
        )
        for who in ("A", "B")
    }
    jobs["A"].start()
    deadline = time.monotonic() + RACE_TIMEOUT_S
    while not (log_file.exists() and "convert_start" in log_file.read_text()):
        assert time.monotonic() < deadline and jobs["A"].is_alive(), (
            "job A never started converting"
        )
        time.sleep(0.05)
    jobs["B"].start()
    for job in jobs.values():
        job.join(RACE_TIMEOUT_S * 2)
    assert [job.exitcode for job in jobs.values()] == [0, 0], log_file.read_text()

    events = _events(log_file)
    a, b = events["A"], events["B"]
    a_start, a_end = _time_of(a, "convert_start"), _time_of(a, "convert_end")
    b_waiting = [e for e in b if e["what"].startswith("waiting for")]
    assert [e["what"] for e in b if e["what"].startswith("convert")] == []  # B never converted
    assert b_waiting, f"job B never blocked on the lock: {b}"
    assert f"pid {a[0]['pid']}" in b_waiting[0]["what"]  # B names the holder: A
    # B blocked while A held the lock, and went on only after A's conversion was complete.
    assert a_start < _time_of(b, "enter") < b_waiting[0]["t"] < a_end
    assert _time_of(b, "reusing") > a_end
    assert (root / "org--tiny" / "weights.txt").read_text() == "A"
    assert (root / "org--tiny" / COMPLETE_MARKER).is_file()


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

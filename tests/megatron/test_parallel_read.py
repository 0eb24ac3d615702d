"""Parallel checkpoint reads: bit-identical to PyTorch's reader; the version guard fires."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpcrl.core.backends.megatron import parallel_read


def _state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        f"layer{i}.weight": torch.randn(64 + i * 7, 33, generator=generator) for i in range(12)
    } | {"step": torch.tensor(5), "bf16": torch.randn(10, 10, generator=generator).bfloat16()}


def _load(path, threads: int) -> dict:
    target = {k: torch.zeros_like(v) for k, v in _state(1).items()}
    with parallel_read.parallel_reads(threads):
        dcp.load(target, checkpoint_id=str(path), no_dist=True)
    return target


@pytest.mark.parametrize("threads", [2, 4, 7])
def test_parallel_reads_are_bit_identical_to_pytorch_reader(tmp_path, threads):
    dcp.save(_state(0), checkpoint_id=str(tmp_path), no_dist=True)
    stock = _load(tmp_path, 1)
    parallel = _load(tmp_path, threads)
    for key, value in _state(0).items():
        assert torch.equal(stock[key], value)
        assert torch.equal(parallel[key], value) and parallel[key].dtype == value.dtype


def test_replacement_is_removed_after_the_block(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    original = FileSystemReader.read_data
    with parallel_read.parallel_reads(4):
        assert FileSystemReader.read_data is not original
    assert FileSystemReader.read_data is original


def test_guard_fires_on_an_unknown_torch_version(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    with pytest.raises(parallel_read.ParallelReadUnsupported) as error:
        parallel_read.check_supported(4)
    message = str(error.value)
    assert "policy.megatron_cfg.checkpoint.parallel_read_threads=1" in message
    assert "hpcrl/core/backends/megatron/parallel_read.py" in message and "2.99.0" in message
    parallel_read.check_supported(1)  # the stock reader needs no guard


def test_guard_fires_when_the_reader_source_changed(monkeypatch):
    monkeypatch.setitem(parallel_read.SUPPORTED_READ_DATA_SHA256, "2.13", "0" * 64)
    with pytest.raises(parallel_read.ParallelReadUnsupported):
        parallel_read.check_supported(2)


def test_split_ranges_cover_every_byte_once():
    assert parallel_read.split_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert parallel_read.split_ranges(8, 4) == [(0, 4), (4, 8)]
    assert parallel_read.split_ranges(0, 4) == []


@pytest.mark.parametrize("max_inflight_bytes", [1 << 30, 1])
def test_items_larger_than_the_range_size_are_read_as_concurrent_ranges(
    tmp_path, monkeypatch, max_inflight_bytes
):
    """Range size 4 KiB (not a divisor of the items' sizes), items ~9–100 KiB: every large
    item goes out as several positioned reads, and the result is still bit-identical.
    max_inflight_bytes=1: one item at a time (each larger than the budget starts alone)."""
    range_bytes = 4096
    dcp.save(_state(0), checkpoint_id=str(tmp_path), no_dist=True)
    reads: list[int] = []
    original = parallel_read._pread_into

    def counting(fd, view, offset):
        reads.append(len(view))
        return original(fd, view, offset)

    monkeypatch.setattr(parallel_read, "_pread_into", counting)
    target = {k: torch.zeros_like(v) for k, v in _state(1).items()}
    with parallel_read.parallel_reads(
        3, range_bytes=range_bytes, max_inflight_bytes=max_inflight_bytes
    ):
        dcp.load(target, checkpoint_id=str(tmp_path), no_dist=True)
    for key, value in _state(0).items():
        assert torch.equal(target[key], value) and target[key].dtype == value.dtype, key
    assert max(reads) <= range_bytes
    largest_item = (64 + 11 * 7) * 33 * 4
    assert sum(1 for n in reads if n == range_bytes) >= largest_item // range_bytes


def test_byte_budget_never_exceeds_its_limit_but_admits_an_oversize_item_alone():
    import threading
    import time

    budget = parallel_read._ByteBudget(limit_bytes=10)
    in_flight: list[int] = []
    peaks: list[int] = []
    lock = threading.Lock()

    def hold(size: int) -> None:
        with budget.hold(size):
            with lock:
                in_flight.append(size)
                peaks.append(sum(in_flight))
            time.sleep(0.01)
            with lock:
                in_flight.remove(size)

    threads = [threading.Thread(target=hold, args=(size,)) for size in [4, 4, 4, 25, 3, 6, 4]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(peaks) == 7
    assert all(peak <= 10 or peak == 25 for peak in peaks)

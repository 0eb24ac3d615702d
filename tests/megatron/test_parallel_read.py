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


def test_byte_balanced_chunks_cover_every_item_once():
    sizes = [100, 1, 1, 1, 100, 50, 50, 1]
    chunks = parallel_read.byte_balanced_chunks(sizes, 3)
    assert [i for chunk in chunks for i in chunk] == list(range(len(sizes)))
    totals = [sum(sizes[i] for i in chunk) for chunk in chunks]
    assert max(totals) <= 2 * sum(sizes) / 3

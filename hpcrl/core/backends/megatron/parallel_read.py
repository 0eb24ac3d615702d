"""Parallel reads for torch_dist checkpoint loads (``checkpoint.parallel_read_threads``).

PyTorch's ``FileSystemReader.read_data`` opens one stream per file and reads its items one
after another; a rank loading a multi-GB shard is then bound by one thread doing
``torch.load`` + ``copy_``. ``parallel_read_data`` below sorts the plan's items by (file,
offset), cuts them into ``threads`` byte-balanced contiguous chunks and reads each chunk on
its own thread with its own file handles (``_slice_file`` seeks on the stream it is given, so
threads must never share one). Planner calls (resolve/commit/load_bytes) are serialised by a
lock; reading, deserialising and copying run in parallel.

Peak extra host memory: each thread holds at most one deserialised item at a time, so at
most ``threads × (largest item in the checkpoint)`` beyond what PyTorch's reader holds (one
item).

The replacement mirrors the body of torch's ``read_data``; it is enabled only when the
installed torch's ``read_data`` source hashes to one it was written against
(``SUPPORTED_READ_DATA_SHA256``), else setup fails with what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import textwrap
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MODULE_PATH = "hpcrl/core/backends/megatron/parallel_read.py"
SETTING = "policy.megatron_cfg.checkpoint.parallel_read_threads"

# torch version (major.minor) → sha256 of the dedented source of FileSystemReader.read_data.
SUPPORTED_READ_DATA_SHA256 = {
    "2.13": "ae6cd4ef21fa688cc16401091adbc2ea3a7e112905de52f4f46933f770b95168",
    # 2.11 (the H200 machine's torch): same source, checked there on 2026-11-29.
    "2.11": "ae6cd4ef21fa688cc16401091adbc2ea3a7e112905de52f4f46933f770b95168",
}


class ParallelReadUnsupported(RuntimeError):
    """The installed torch's reader differs from the one the replacement mirrors."""


def read_data_source_sha256() -> str:
    from torch.distributed.checkpoint import FileSystemReader

    source = textwrap.dedent(inspect.getsource(FileSystemReader.read_data))
    return hashlib.sha256(source.encode()).hexdigest()


def check_supported(threads: int) -> None:
    """Raise ``ParallelReadUnsupported`` (setup-time) if threads > 1 on an unknown torch."""
    if threads <= 1:
        return
    import torch

    version = torch.__version__.split("+")[0]
    major_minor = ".".join(version.split(".")[:2])
    expected = SUPPORTED_READ_DATA_SHA256.get(major_minor)
    if expected is None or read_data_source_sha256() != expected:
        known = ", ".join(f"{v}.x" for v in sorted(SUPPORTED_READ_DATA_SHA256))
        raise ParallelReadUnsupported(
            f"{SETTING}={threads}: the parallel checkpoint reader replaces torch's "
            f"FileSystemReader.read_data and was written for torch {known}; this is torch "
            f"{torch.__version__}, whose reader differs. Set {SETTING}=1 (PyTorch's own reader), "
            f"or update {MODULE_PATH} for this torch version."
        )


def byte_balanced_chunks(sizes: Sequence[int], parts: int) -> list[range]:
    """Split indices 0..len(sizes) into ≤ ``parts`` contiguous ranges of similar byte totals."""
    total = sum(sizes)
    chunks: list[range] = []
    start, running = 0, 0
    for index, size in enumerate(sizes):
        running += size
        boundary = total * (len(chunks) + 1) / parts
        if running >= boundary and len(chunks) < parts - 1:
            chunks.append(range(start, index + 1))
            start = index + 1
    if start < len(sizes):
        chunks.append(range(start, len(sizes)))
    return chunks


def _read_items(
    reader: Any, items: Sequence[Any], planner: Any, planner_lock: threading.Lock
) -> None:
    import torch
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint.planner import LoadItemType

    with contextlib.ExitStack() as streams:
        open_streams: dict[str, Any] = {}
        for req in items:
            item_md = reader.storage_data[req.storage_index]
            path = item_md.relative_path
            if path not in open_streams:
                full_path = reader.fs.concat_path(reader.path, path)
                open_streams[path] = streams.enter_context(reader.fs.create_stream(full_path, "rb"))
            file_slice = reader._slice_file(open_streams[path], item_md)
            transform_from = reader.transforms.transform_load_stream(
                req, item_md.transform_descriptors or (), file_slice
            )
            if req.type == LoadItemType.BYTE_IO:
                read_bytes = io.BytesIO(transform_from.read(-1))
                read_bytes.seek(0)
                with planner_lock:
                    planner.load_bytes(req, read_bytes)
                continue
            seekable = transform_from
            if not transform_from.seekable():
                seekable = io.BytesIO(transform_from.read(-1))
                seekable.seek(0)
            tensor = torch.load(seekable, map_location="cpu", weights_only=True)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            with planner_lock:
                target_tensor = planner.resolve_tensor(req).detach()
            if target_tensor.size() != tensor.size():
                raise AssertionError(
                    f"req {req.storage_index} mismatch sizes {target_tensor.size()} vs {tensor.size()}"
                )
            target_tensor.copy_(tensor)
            with planner_lock:
                planner.commit_tensor(req, target_tensor)


def make_parallel_read_data(threads: int):
    """A ``read_data`` method reading with ``threads`` threads."""

    def parallel_read_data(self, plan, planner):
        from torch.futures import Future

        items = sorted(
            plan.items,
            key=lambda r: (
                self.storage_data[r.storage_index].relative_path,
                self.storage_data[r.storage_index].offset,
            ),
        )
        sizes = [max(self.storage_data[r.storage_index].length, 1) for r in items]
        chunks = byte_balanced_chunks(sizes, threads)
        planner_lock = threading.Lock()
        with ThreadPoolExecutor(
            max_workers=len(chunks) or 1, thread_name_prefix="ckpt-read"
        ) as pool:
            futures = [
                pool.submit(_read_items, self, [items[i] for i in chunk], planner, planner_lock)
                for chunk in chunks
            ]
            for future in futures:
                future.result()  # re-raise a thread's error here
        done = Future()
        done.set_result(None)
        return done

    return parallel_read_data


@contextlib.contextmanager
def parallel_reads(threads: int) -> Iterator[None]:
    """Within the block, filesystem torch_dist loads read with ``threads`` threads (1: stock)."""
    if threads <= 1:
        yield
        return
    check_supported(threads)
    from torch.distributed.checkpoint import FileSystemReader

    original = FileSystemReader.read_data
    FileSystemReader.read_data = make_parallel_read_data(threads)
    try:
        yield
    finally:
        FileSystemReader.read_data = original

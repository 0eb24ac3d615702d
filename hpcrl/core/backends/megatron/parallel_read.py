"""Parallel reads for torch_dist checkpoint loads (``checkpoint.parallel_read_threads``).

PyTorch's ``FileSystemReader.read_data`` opens one stream per file and reads its items one
after another on one thread. One rank's torch_dist checkpoint is a few files holding many
items, some of them large (embeddings, MLP weights: hundreds of MiB), so neither per-file
threads nor per-item threads alone keep a disk busy. ``parallel_read_data`` works on two
levels, with ``threads`` threads each:

* items: taken in (file, offset) order from a shared queue by ``threads`` item workers, each
  deserialising (``torch.load``) and copying its item into the target tensor;
* byte ranges: ``torch.load`` reads a tensor's storage with one ``readinto`` into the storage
  it just allocated; the file view handed to it (``_ItemView``) cuts a read larger than
  ``range_bytes`` into ranges that a pool of ``threads`` range workers ``os.preadv``s
  concurrently, straight into that buffer (no intermediate copies: the same single copy from
  the page cache as PyTorch's reader, then the same ``copy_`` into the target).

Positioned reads on one descriptor per file share no stream position, so workers never
contend for a seek. Planner calls (resolve/commit/load_bytes) are serialised by a lock.

**Peak host memory** beyond the caller's target tensors: the deserialised items in flight.
An item starts only while the in-flight items' bytes stay within ``max_inflight_bytes``
(default 1 GiB); an item larger than that starts alone. So at most
``max(max_inflight_bytes, largest item)``, whatever ``threads`` is — PyTorch's reader holds
one item (``largest item``).

The replacement mirrors the body of torch's ``read_data`` (same ``torch.load`` of each item,
same narrowing, same copy), so results are bit-identical; it is enabled only when the
installed torch's ``read_data`` source hashes to one it was written against
(``SUPPORTED_READ_DATA_SHA256``), else setup fails with what to do. Readers over a
non-local filesystem (e.g. fsspec) keep torch's own ``read_data``.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import os
import textwrap
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

MODULE_PATH = "hpcrl/core/backends/megatron/parallel_read.py"
SETTING = "policy.megatron_cfg.checkpoint.parallel_read_threads"
# A read larger than this is split into concurrent ranges of at most this size.
DEFAULT_RANGE_BYTES = 16 << 20
DEFAULT_MAX_INFLIGHT_BYTES = 1 << 30

# torch version (major.minor) → sha256 of the dedented source of FileSystemReader.read_data.
SUPPORTED_READ_DATA_SHA256 = {
    "2.13": "ae6cd4ef21fa688cc16401091adbc2ea3a7e112905de52f4f46933f770b95168",
    # 2.11 (the GPU test machine's torch): same source, checked there on 2026-11-29.
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


def split_ranges(length: int, range_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) byte ranges of at most ``range_bytes`` covering ``0..length``."""
    return [(start, min(start + range_bytes, length)) for start in range(0, length, range_bytes)]


def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` from ``fd`` at ``offset`` (positioned: no shared stream state)."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise EOFError(f"checkpoint file ended {len(view) - done} bytes early")
        done += got


class _ItemView(io.RawIOBase):
    """Seekable read-only view of one item's bytes; large reads go out as concurrent ranges."""

    def __init__(
        self, fd: int, offset: int, length: int, ranges: Executor, range_bytes: int
    ) -> None:
        super().__init__()
        self._fd, self._offset, self._length = fd, offset, length
        self._ranges, self._range_bytes = ranges, range_bytes
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._length}[whence]
        self._pos = base + pos
        return self._pos

    def readinto(self, buffer) -> int:
        count = max(0, min(len(buffer), self._length - self._pos))
        view = memoryview(buffer).cast("B")[:count]
        start = self._offset + self._pos
        if count <= self._range_bytes:
            _pread_into(self._fd, view, start)
        else:
            futures = [
                self._ranges.submit(_pread_into, self._fd, view[a:b], start + a)
                for a, b in split_ranges(count, self._range_bytes)
            ]
            for future in futures:
                future.result()  # re-raise a range's error here
        self._pos += count
        return count

    def readall(self) -> bytes:
        data = bytearray(max(0, self._length - self._pos))
        self.readinto(data)
        return bytes(data)


class _ByteBudget:
    """Admits work while the bytes in flight stay within a limit (one oversize item alone)."""

    def __init__(self, limit_bytes: int) -> None:
        self._limit = limit_bytes
        self._in_use = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self._in_use == 0 or self._in_use + size <= self._limit)
            self._in_use += size
        try:
            yield
        finally:
            with self._changed:
                self._in_use -= size
                self._changed.notify_all()


class _ReadJob:
    """One ``read_data`` call: shared descriptors, item queue, range pool, planner lock."""

    def __init__(self, reader: Any, planner: Any, ranges: Executor, range_bytes: int, budget):
        self.reader, self.planner = reader, planner
        self.ranges, self.range_bytes, self.budget = ranges, range_bytes, budget
        self.planner_lock = threading.Lock()
        self.fds: dict[str, int] = {}

    def open_files(self, items: Sequence[Any], stack: contextlib.ExitStack) -> None:
        for req in items:
            path = self.reader.storage_data[req.storage_index].relative_path
            if path not in self.fds:
                full_path = self.reader.fs.concat_path(self.reader.path, path)
                self.fds[path] = os.open(full_path, os.O_RDONLY)
                stack.callback(os.close, self.fds[path])

    def read_item(self, req: Any) -> None:
        """Torch's per-item body of ``read_data`` over an ``_ItemView``."""
        item_md = self.reader.storage_data[req.storage_index]
        with self.budget.hold(item_md.length):
            view = _ItemView(
                self.fds[item_md.relative_path],
                item_md.offset,
                item_md.length,
                self.ranges,
                self.range_bytes,
            )
            transform_from = self.reader.transforms.transform_load_stream(
                req, item_md.transform_descriptors or (), view
            )
            self._load(req, transform_from)

    def _load(self, req: Any, transform_from: Any) -> None:
        import torch
        from torch.distributed._shard._utils import narrow_tensor_by_index
        from torch.distributed.checkpoint.planner import LoadItemType

        if req.type == LoadItemType.BYTE_IO:
            read_bytes = io.BytesIO(transform_from.read(-1))
            read_bytes.seek(0)
            with self.planner_lock:
                self.planner.load_bytes(req, read_bytes)
            return
        seekable = transform_from
        if not transform_from.seekable():
            seekable = io.BytesIO(transform_from.read(-1))
            seekable.seek(0)
        tensor = torch.load(seekable, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        with self.planner_lock:
            target_tensor = self.planner.resolve_tensor(req).detach()
        if target_tensor.size() != tensor.size():
            raise AssertionError(
                f"req {req.storage_index} mismatch sizes {target_tensor.size()} vs {tensor.size()}"
            )
        target_tensor.copy_(tensor)
        with self.planner_lock:
            self.planner.commit_tensor(req, target_tensor)


def _is_local(reader: Any) -> bool:
    from torch.distributed.checkpoint.filesystem import FileSystem

    return isinstance(reader.fs, FileSystem)


def _run_items(job: _ReadJob, items: Sequence[Any], threads: int) -> None:
    """``threads`` workers take items in order from one queue until it is empty."""
    queue = iter(items)
    queue_lock = threading.Lock()

    def worker() -> None:
        while True:
            with queue_lock:
                req = next(queue, None)
            if req is None:
                return
            job.read_item(req)

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-item") as pool:
        futures = [pool.submit(worker) for _ in range(min(threads, len(items)))]
        for future in futures:
            future.result()  # re-raise a worker's error here


def make_parallel_read_data(
    threads: int,
    range_bytes: int = DEFAULT_RANGE_BYTES,
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
):
    """A ``read_data`` method reading with ``threads`` item and ``threads`` range workers."""
    from torch.distributed.checkpoint import FileSystemReader

    stock_read_data = FileSystemReader.read_data

    def parallel_read_data(self, plan, planner):
        from torch.futures import Future

        if not _is_local(self):
            return stock_read_data(self, plan, planner)
        items = sorted(
            plan.items,
            key=lambda r: (
                self.storage_data[r.storage_index].relative_path,
                self.storage_data[r.storage_index].offset,
            ),
        )
        with contextlib.ExitStack() as stack:
            ranges = stack.enter_context(
                ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckpt-range")
            )
            job = _ReadJob(self, planner, ranges, range_bytes, _ByteBudget(max_inflight_bytes))
            job.open_files(items, stack)
            _run_items(job, items, threads)
        done = Future()
        done.set_result(None)
        return done

    return parallel_read_data


@contextlib.contextmanager
def parallel_reads(
    threads: int,
    range_bytes: int = DEFAULT_RANGE_BYTES,
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
) -> Iterator[None]:
    """Within the block, filesystem torch_dist loads read with ``threads`` threads (1: stock)."""
    if threads <= 1:
        yield
        return
    check_supported(threads)
    from torch.distributed.checkpoint import FileSystemReader

    original = FileSystemReader.read_data
    FileSystemReader.read_data = make_parallel_read_data(threads, range_bytes, max_inflight_bytes)
    try:
        yield
    finally:
        FileSystemReader.read_data = original

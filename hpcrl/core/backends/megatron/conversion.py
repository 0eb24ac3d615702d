"""One-time HF → Megatron conversion into the resolved Megatron checkpoint directory.

Layout under the planned directory (``JobSpec.megatron_checkpoint_dir``, resolved by the planner
from the job's environment: ``NRL_MEGATRON_CHECKPOINT_DIR`` > ``$HF_HOME/nemo_rl`` >
``~/.cache/huggingface/nemo_rl``; the worker gets it in ``RankInfo``)::

    <root>/<model key>/            a finished conversion (has COMPLETE_MARKER); with
                                   ``policy.hf_config_overrides`` the key ends in
                                   ``__hfovr_<hash of the overrides>`` (another model)
    <root>/<model key>.lock        flock: one converter at a time, across jobs and nodes
    <root>/.<model key>.tmp-<pid>  a conversion being written (or left by a crash)

Guarantees: a finished conversion is reused; ``force_reconvert_from_hf`` replaces it; a
conversion becomes visible only by ``rename`` of a complete directory, so a crash never leaves
a directory that is later used (its tmp directory is removed by the next converter, which holds
the lock and so knows the tmp's writer is gone). Within a job only global rank 0 converts;
the others wait for it at a barrier. Across jobs, the lock serialises converters and the
later ones find the marker and reuse.

Locking uses ``fcntl.flock``: on Lustre mount with ``-o flock`` (the default on most
SuperPODs); the lock is released by the kernel when its holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "hpcrl_conversion_complete.json"
TMP_INFIX = ".tmp-"

# (hf_path, out_dir) -> None; writes a full conversion into out_dir (which exists, empty).
Converter = Callable[[str, str], None]
Progress = Callable[[str], None]


def model_key(model_name: str) -> str:
    """A directory name for ``model_name`` (hub id or local path), unique per name.

    ``Qwen/Qwen2-1.5B`` → ``Qwen--Qwen2-1.5B``; ``/models/qwen2`` → ``models--qwen2``.
    """
    parts = [part for part in model_name.strip().split("/") if part not in ("", ".")]
    if not parts:
        raise ValueError(f"policy.model_name: {model_name!r} names no model")
    key = "--".join(re.sub(r"[^A-Za-z0-9._-]", "_", part) for part in parts)
    return key.lstrip(".") or "_"


def conversion_key(model_name: str, hf_config_overrides: Mapping[str, Any]) -> str:
    """``model_key``, told apart per ``policy.hf_config_overrides``: a conversion made from
    a changed config (its run config, the HF model the bridge read) is not reused for
    another change, nor for none."""
    key = model_key(model_name)
    if not hf_config_overrides:
        return key
    canonical = json.dumps(hf_config_overrides, sort_keys=True, separators=(",", ":"))
    return f"{key}__hfovr_{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def is_complete(conversion_dir: Path) -> bool:
    return (conversion_dir / COMPLETE_MARKER).is_file()


def print_progress(message: str) -> None:
    print(f"[hpcrl megatron conversion] {message}", flush=True)


@contextlib.contextmanager
def conversion_lock(
    lock_path: Path, timeout_s: float, poll_s: float, progress: Progress
) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path``; report who holds it while waiting."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock_file:
        started = time.monotonic()
        next_report = started
        while True:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited_s = time.monotonic() - started
                if waited_s > timeout_s:
                    raise TimeoutError(
                        f"waited {waited_s:.0f} s for the conversion lock {lock_path} (held by "
                        f"{_read_holder(lock_path)}); if that converter is gone, delete the lock file"
                    ) from None
                if time.monotonic() >= next_report:
                    progress(
                        f"waiting for {_read_holder(lock_path)} to finish converting ({waited_s:.0f} s)"
                    )
                    next_report += max(poll_s, 30.0)
                time.sleep(poll_s)
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(f"host {socket.gethostname()} pid {os.getpid()}\n")
        lock_file.flush()
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _read_holder(lock_path: Path) -> str:
    try:
        return lock_path.read_text().strip() or "another process"
    except OSError:
        return "another process"


def _remove_abandoned_tmp_dirs(root: Path, key: str, progress: Progress) -> None:
    # Called with the lock held: any tmp directory's writer is dead.
    for stale in root.glob(f".{key}{TMP_INFIX}*"):
        progress(f"removing {stale.name}, left by an interrupted conversion")
        shutil.rmtree(stale, ignore_errors=True)


def convert_locked(
    hf_path: str, final_dir: Path, force: bool, convert: Converter, progress: Progress
) -> bool:
    """With the lock held: reuse or (re)convert. Returns whether it converted."""
    root, key = final_dir.parent, final_dir.name
    _remove_abandoned_tmp_dirs(root, key, progress)
    if is_complete(final_dir) and not force:
        progress(f"reusing {final_dir}")
        return False
    tmp_dir = root / f".{key}{TMP_INFIX}{os.getpid()}"
    tmp_dir.mkdir(parents=True)
    started = time.monotonic()
    progress(f"converting {hf_path} → {final_dir} (writing {tmp_dir.name})")
    convert(hf_path, str(tmp_dir))
    marker = {
        "hf_path": hf_path,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "seconds": round(time.monotonic() - started, 1),
        "finished_at": time.time(),
    }
    (tmp_dir / COMPLETE_MARKER).write_text(json.dumps(marker, indent=1))
    _replace_dir(tmp_dir, final_dir)
    progress(f"done in {time.monotonic() - started:.1f} s: {final_dir}")
    return True


def _replace_dir(new_dir: Path, final_dir: Path) -> None:
    # Two renames: the old conversion (force) moves aside as a tmp dir, so a crash between
    # them leaves no final dir, and the next converter removes the aside one.
    if final_dir.exists():
        aside = final_dir.parent / f".{final_dir.name}{TMP_INFIX}old-{os.getpid()}"
        os.rename(final_dir, aside)
        os.rename(new_dir, final_dir)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(new_dir, final_dir)


def ensure_megatron_checkpoint(
    model_name: str,
    hf_path: str,
    root_dir: str,
    *,
    force: bool,
    convert: Converter,
    rank: int,
    progress: Progress = print_progress,
    lock_timeout_s: float = 4 * 3600.0,
    poll_s: float = 2.0,
    hf_config_overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Return the directory of a complete conversion of ``hf_path``, converting if needed.

    Call on every rank of the job: rank 0 converts (under the lock), the others wait for it
    at a barrier of the default process group (if one exists).
    """
    final_dir = Path(root_dir) / conversion_key(model_name, hf_config_overrides or {})
    if rank == 0:
        lock_path = final_dir.parent / f"{final_dir.name}.lock"
        with conversion_lock(lock_path, lock_timeout_s, poll_s, progress):
            convert_locked(hf_path, final_dir, force, convert, progress)
    _wait_for_rank0(rank, final_dir, progress)
    if not is_complete(final_dir):
        raise RuntimeError(
            f"rank {rank}: no complete Megatron conversion at {final_dir} after rank 0 finished"
        )
    return final_dir


def _wait_for_rank0(rank: int, final_dir: Path, progress: Progress) -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if rank == 1:  # one message per job is enough
        progress(
            f"rank 1..{dist.get_world_size() - 1} waiting for rank 0's conversion {final_dir.name}"
        )
    dist.barrier()

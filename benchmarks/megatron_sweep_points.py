"""``megatron_offload.py --sweep-dir DIR``: run the points of an unsubmitted ``hpcrl sweep``.

``hpcrl sweep RECIPE --cluster P --zip ... --no-submit -o DIR`` writes ``DIR/sweep.json`` and
``DIR/point-<i>/recipe.resolved.yaml``. On a GPU machine without Slurm each point runs here
directly: its resolved recipe sets the benchmark's flags (offload switch, fraction and overlap,
learning rate, TP size and rank count, sequence length, global and micro batch, and the
model's shape from its ``tiny:`` spec), and rank 0 appends one record per step to
``DIR/point-<i>/metrics.jsonl`` through the training core's MetricsWriter, with the training
core's keys. ``hpcrl report DIR`` then prints the table and writes the plots.

Reads the resolved YAML with PyYAML only (no cattrs/omegaconf needed on the GPU machine).
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESOLVED_RECIPE = "recipe.resolved.yaml"


class PointError(ValueError):
    """A sweep point whose recipe this benchmark cannot reproduce (the message says why)."""


def _model_flags(model_name: str) -> list[str]:
    from hpcrl.core.models.tiny import TINY_PREFIX, TINY_SPECS

    spec = TINY_SPECS.get(model_name.removeprefix(TINY_PREFIX))
    if not model_name.startswith(TINY_PREFIX) or spec is None:
        raise PointError(
            f"policy.model_name={model_name!r}: the benchmark builds the model from a "
            f"tiny: spec ({', '.join(TINY_PREFIX + n for n in TINY_SPECS)})"
        )
    if spec.num_key_value_heads != spec.num_attention_heads or spec.vocab_size is None:
        raise PointError(f"{model_name}: needs full multi-head attention and a fixed vocab")
    return ["--layers", str(spec.num_hidden_layers), "--hidden", str(spec.hidden_size),
            "--heads", str(spec.num_attention_heads), "--ffn", str(spec.intermediate_size),
            "--vocab", str(spec.vocab_size)]  # fmt: skip


def point_flags(resolved: dict[str, Any]) -> tuple[int, list[str]]:
    """(number of ranks, benchmark flags) that reproduce one resolved recipe."""
    policy, cluster = resolved["policy"], resolved["cluster"]
    megatron = policy["megatron_cfg"]
    optimizer = megatron["optimizer"]
    if not megatron.get("enabled"):
        raise PointError("policy.megatron_cfg.enabled is false: this benchmark is Megatron's")
    if cluster["num_nodes"] != 1:
        raise PointError(f"cluster.num_nodes={cluster['num_nodes']}: one machine only")
    ranks = int(cluster["gpus_per_node"])
    tp = int(megatron["tensor_model_parallel_size"])
    offload = bool(optimizer["optimizer_cpu_offload"])
    flags = [
        "--tp", str(tp), "--dp", str(ranks // tp),
        "--fraction", str(float(optimizer["optimizer_offload_fraction"]) if offload else 0.0),
        "--lr", str(optimizer["lr"]),
        "--seq-len", str(policy["max_total_sequence_length"]),
        "--batch-size", str(policy["train_global_batch_size"]),
        "--micro-batch-size", str(policy["train_micro_batch_size"]),
        *_model_flags(policy["model_name"]),
    ]  # fmt: skip
    if offload and optimizer["overlap_cpu_optimizer_d2h_h2d"]:
        flags.append("--overlap-d2h-h2d")
    return ranks, flags


def read_resolved(point_dir: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((point_dir / RESOLVED_RECIPE).read_text())


def run_sweep_dir(args: argparse.Namespace, run_child: Callable[..., dict]) -> None:
    """Every point in order (a failed point is reported and the next one runs)."""
    from hpcrl.run.sweep_record import read_sweep_record

    sweep_dir = Path(args.sweep_dir)
    record = read_sweep_record(sweep_dir)
    failed = []
    for point, point_dir in zip(record.points, record.point_run_dirs(sweep_dir), strict=True):
        ranks, flags = point_flags(read_resolved(point_dir))
        metrics = point_dir / "metrics.jsonl"
        metrics.unlink(missing_ok=True)  # a rerun replaces the point's records
        print(f"== {point.run_dir_name}: {point.describe()}", flush=True)
        try:
            run_child(args, ranks, [*flags, "--metrics-out", str(metrics)])
        except subprocess.CalledProcessError as error:
            failed.append(f"{point.run_dir_name} (exit {error.returncode})")
    print(f"table and plots: hpcrl report {sweep_dir}")
    if failed:
        raise SystemExit(f"failed points: {', '.join(failed)}")

"""A run's training checkpoint as a Hugging Face folder, outside the training job.

    python -m hpcrl.core.export RUN_DIR CHECKPOINT_DIR OUT_DIR

What ``hpcrl export`` runs with the job's own Python and code (a subprocess here for a local
run, a one-node job for a Slurm run): one process, no Ray, on the CPU. Automodel reads the
model tensors of the DCP checkpoint (``backends/automodel/export.py``); Megatron rebuilds the
model at TP=PP=1 and loads the torch_dist checkpoint into it (``backends/megatron/export.py``).

The folder appears complete or not at all: it is written as ``OUT_DIR.partial`` and renamed;
``hpcrl_export.json`` in it says which run, step and checkpoint it holds.

Exit codes: 0 written; 2 it cannot be written (this Python lacks a package, the run folder
or checkpoint is not what it should be): one line on stderr says which and the fix.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

from hpcrl.config.recipe import Recipe
from hpcrl.run.checkpoints import EXPORT_RECORD, step_of_checkpoint
from hpcrl.run.export_progress import ExportProgress, gib
from hpcrl.run.jobspec_file import JobSpecError, read_jobspec

USAGE_EXIT_CODE = 2

#: What the export imports, per backend (the package a user installs, the module).
NEEDED = {
    "automodel": (
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("safetensors", "safetensors"),
    ),
    "megatron": (
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("megatron-core", "megatron.core"),
        ("megatron-bridge", "megatron.bridge"),
    ),
}


class ExportError(RuntimeError):
    """The export cannot run as asked; the message says why and what to do."""


def missing_packages(backend: str) -> list[str]:
    """Packages of ``NEEDED[backend]`` this Python cannot import."""
    return [name for name, module in NEEDED[backend] if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def export_checkpoint(
    recipe: Recipe,
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    run_dir: str | Path,
    say: ExportProgress | None = None,
) -> Path:
    """Write ``checkpoint_dir`` (a step folder of ``recipe``'s run) as a HF folder at
    ``out_dir``, atomically; returns ``out_dir``. ``say``: each phase as it starts."""
    from hpcrl.core.models.tiny import resolve_model_path

    checkpoint, out = Path(checkpoint_dir), Path(out_dir)
    step = step_of_checkpoint(checkpoint)
    model_path = resolve_model_path(recipe.policy.model_name)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if recipe.backend == "megatron":
        from hpcrl.core.backends.megatron.export import export_in_subprocess

        export_in_subprocess(recipe, checkpoint, partial, model_path, say)
    else:
        from hpcrl.core.backends.automodel.export import export_dcp_to_hf

        tokenizer_path = recipe.policy.tokenizer.name or model_path
        lora = recipe.policy.automodel_cfg.lora_cfg
        scale = lora.scale if lora.enabled else None
        export_dcp_to_hf(checkpoint, partial, model_path, tokenizer_path, say, lora_scale=scale)
    write_record(partial, run_dir, checkpoint, step, recipe.backend, "hpcrl export")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def write_record(
    folder: Path, run_dir: str | Path, checkpoint: Path, step: int | None, backend: str, by: str
) -> None:
    """``hpcrl_export.json``: what the folder holds, for ``hpcrl status`` and for people."""
    record = {
        "run_dir": str(Path(run_dir).absolute()),
        "checkpoint": str(checkpoint.absolute()),
        "step": step,
        "backend": backend,
        "written_by": by,
    }
    (folder / EXPORT_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m hpcrl.core.export RUN_DIR CHECKPOINT_DIR OUT_DIR", file=sys.stderr)
        return USAGE_EXIT_CODE
    run_dir, checkpoint_dir, out_dir = (Path(arg) for arg in args)
    try:
        recipe = _run_recipe(run_dir)
        _check_can_export(recipe, checkpoint_dir)
    except ExportError as error:
        print(f"hpcrl export: {error}", file=sys.stderr, flush=True)
        return USAGE_EXIT_CODE
    say = ExportProgress()
    say(f"exporting {checkpoint_dir} ({recipe.backend}) to {out_dir}")
    written = export_checkpoint(recipe, checkpoint_dir, out_dir, run_dir, say)
    size = sum(path.stat().st_size for path in written.glob("*.safetensors"))
    say(f"wrote {written} ({gib(size)} of safetensors)")
    return 0


def _run_recipe(run_dir: Path) -> Recipe:
    """The recipe the run trained with: its plan's (``jobspec.json``), as the driver reads
    it; ``recipe.resolved.yaml`` is for people and would need config loading here."""
    try:
        return read_jobspec(run_dir).recipe
    except JobSpecError as error:
        raise ExportError(str(error)) from error


def _check_can_export(recipe: Recipe, checkpoint_dir: Path) -> None:
    missing = missing_packages(recipe.backend)
    if missing:
        raise ExportError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}, which exporting a "
            f"checkpoint of the {recipe.backend} backend needs. Run the export with the job's "
            "Python (hpcrl export does: the image's on a container run), or install them here"
        )
    if step_of_checkpoint(checkpoint_dir) is None or not checkpoint_dir.is_dir():
        raise ExportError(
            f"{checkpoint_dir} is not a complete checkpoint folder (step_NNNNNN); name one "
            "that hpcrl status RUN lists"
        )


if __name__ == "__main__":
    sys.exit(main())

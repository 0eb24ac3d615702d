"""``hpcrl export RUN [--step N | --best] [-o DIR] [--here] [--wait]``: a run's trained
weights as a Hugging Face folder (safetensors, config, tokenizer).

The conversion needs torch, transformers and (Megatron) megatron-bridge, and an 8B model's
weights in memory: never the login node's business. So it runs with the run's own Python,
code and environment: here, in a subprocess, for a run on a local profile (or with
``--here``, e.g. inside an allocation, when the run has no container); for a Slurm run as a
one-node export job with the run's image, mounts, account and partition
(``hpcrl.plan.export_job``). Stages are imported inside the command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hpcrl.cli.prepare import folder_path


def register(subparsers: Any) -> None:
    export = subparsers.add_parser(
        "export", help="write a run's trained weights as a Hugging Face folder",
        description="Convert a checkpoint of RUN (the newest unless --step/--best) into a "
        "Hugging Face folder (safetensors, config.json, tokenizer) that transformers' "
        "from_pretrained and vLLM load. It runs with the run's own Python and code: here, in a "
        "subprocess, for a local run; as a one-node job with the run's image, mounts and "
        "account for a Slurm run. Nothing is converted on the login node.",
        epilog="Examples: hpcrl export runs/grpo-1b (newest checkpoint, to "
        "runs/grpo-1b/exports/step_<N>); hpcrl export runs/grpo-1b --step 40 -o /models/grpo-40 "
        "--wait. A checkpoint the job already wrote as <checkpoint>/hf "
        "(checkpointing.save_consolidated) is named, not converted again. hpcrl status RUN "
        "lists a run's exports. Exit codes: 0 written (or submitted without --wait), 1 the "
        "export failed, 2 refused (no such step, no checkpoint, an occupied -o folder).",
    )  # fmt: skip
    export.add_argument("run", metavar="RUN", help="run folder (a sweep's point-<i> folder)")
    which = export.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, metavar="N", help="the checkpoint of step N")
    which.add_argument(
        "--best", action="store_true",
        help="the best checkpoint by the run's checkpointing.metric_name",
    )  # fmt: skip
    export.add_argument(
        "-o", "--out", metavar="DIR",
        help="folder to write (default RUN/exports/step_<N>); it must not exist or be empty",
    )  # fmt: skip
    export.add_argument(
        "--here", action="store_true",
        help="a Slurm run without container: convert in this shell (e.g. inside an "
        "allocation), not in an export job",
    )  # fmt: skip
    export.add_argument(
        "--wait", action="store_true",
        help="a Slurm run: wait until the export job has ended, showing its progress",
    )  # fmt: skip
    export.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from hpcrl.cli.again import _refuse_sweep
    from hpcrl.cli.jobs import _console
    from hpcrl.plan.export_job import default_out_dir
    from hpcrl.run.checkpoints import CONSOLIDATED_SUBDIR
    from hpcrl.run.sweep_record import is_sweep_dir
    from hpcrl.submit.exports import is_complete_export, pick_checkpoint, run_plan
    from hpcrl.submit.hints import shown_path

    run_dir = folder_path(args.run)
    _refuse_sweep(run_dir, is_sweep_dir(run_dir), "export")
    spec = run_plan(run_dir)
    step, checkpoint = pick_checkpoint(run_dir, args.step, args.best)
    console = _console()

    def say(text: str) -> None:
        console.print(text, markup=False, soft_wrap=True)

    written_by_job = checkpoint / CONSOLIDATED_SUBDIR
    if args.out is None and is_complete_export(written_by_job):
        say(f"The job already wrote step {step}'s weights as a Hugging Face folder "
            f"(checkpointing.save_consolidated): {shown_path(written_by_job)}")  # fmt: skip
        return 0
    out = folder_path(args.out) if args.out else Path(default_out_dir(str(run_dir), step))
    if _already_exported(out, checkpoint):
        say(f"Step {step} is already exported: {shown_path(out)}")
        return 0
    here = spec.scheduler == "local" or args.here
    if here:
        from hpcrl.submit.export_submission import check_runnable_here

        check_runnable_here(spec)  # before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    if here:
        return _export_here(spec, run_dir, step, checkpoint, out, say)
    return _export_in_job(spec, run_dir, step, checkpoint, out, args.wait, say)


def _already_exported(out: Path, checkpoint: Path) -> bool:
    """True when ``out`` holds the export of ``checkpoint``; refused when it holds anything
    else (an export is never written over a folder hpcrl did not write for it)."""
    from hpcrl.run.checkpoints import EXPORT_RECORD
    from hpcrl.submit.exports import ExportRefused

    record_path = out / EXPORT_RECORD
    if record_path.is_file():
        try:
            record = json.loads(record_path.read_text())
        except ValueError:
            record = {}
        if record.get("checkpoint") == str(checkpoint):
            return True
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportRefused(
            f"{out} already exists and holds something else than the export of {checkpoint}",
            "name a new folder with -o DIR, or remove that one",
        )
    return False


def _export_here(spec: Any, run_dir: Path, step: int, checkpoint: Path, out: Path, say: Any) -> int:
    from hpcrl.submit.export_submission import export_here
    from hpcrl.submit.exports import record_export
    from hpcrl.submit.hints import shown_path

    say(f"Exporting step {step} of {shown_path(run_dir)} ({shown_path(checkpoint)}) with the "
        f"run's Python ({' '.join(spec.code.python)}), here")  # fmt: skip
    record_export(run_dir, step, out, None)
    code = export_here(spec, checkpoint, out)
    if code == 0:
        _say_written(out, say)
    return code


def _export_in_job(
    spec: Any, run_dir: Path, step: int, checkpoint: Path, out: Path, wait: bool, say: Any
) -> int:
    from hpcrl.plan.export_job import plan_export_job
    from hpcrl.render.script import render_export_script
    from hpcrl.submit.export_submission import submit_export_job, wait_for_export
    from hpcrl.submit.exports import exports_dir, record_export
    from hpcrl.submit.hints import command, shown_path

    job = plan_export_job(spec, step, str(checkpoint), str(out))
    script = exports_dir(run_dir) / f"export-step_{step:06d}.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(render_export_script(job))
    submitted = submit_export_job(job, script)
    record_export(run_dir, step, out, str(submitted.job_id))
    say(f"Submitted export job {submitted.job_id} ({shown_path(script)}): step {step} of "
        f"{shown_path(run_dir)} → {shown_path(out)}")  # fmt: skip
    say(f"Its log: {shown_path(str(submitted.paths.stdout))}; where exports are: "
        f"{command('status', run_dir)}")  # fmt: skip
    if not wait:
        return 0
    code = wait_for_export(submitted, out, say)
    if code == 0:
        _say_written(out, say)
    return code


def _say_written(out: Path, say: Any) -> None:
    from hpcrl.submit.hints import shown_path

    say(f"Wrote {shown_path(out)}: transformers.AutoModelForCausalLM.from_pretrained"
        f"({str(out)!r}) loads it (vLLM too)")  # fmt: skip

"""The training driver: ``run_training(run_dir)`` runs a run folder's planned recipe to the end.

Called on node 0 by ``hpcrl.job.driver_process`` with Ray already connected (a local Ray is
started when none is, e.g. ``python -m hpcrl.core.driver RUN_DIR``). It reads the plan and
nothing else (``<run_dir>/jobspec.json``, the typed ``JobSpec`` with the typed recipe in it: a
folder without one is refused, since the job side never plans; ``hpcrl render`` writes one),
builds the policy's worker group as planned (device, nodes, Megatron checkpoint dir,
generation placement), resumes from the newest checkpoint in
the checkpoint folder if there is one, and runs GRPO or SFT, writing one line per step to
``<run_dir>/metrics.jsonl`` and one progress line to stdout.

Exit codes: 0 done; 2 the plan cannot be used (a missing or bad jobspec.json, or, started by
hand, a machine that cannot run it: ``hpcrl.core.machine_checks``; one line on stderr per
problem with the fix); 3
preempted (``<run_dir>/PREEMPT`` appeared or SIGUSR2 arrived: a checkpoint was saved at the
step boundary and the job should be requeued).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcrl.config.async_settings import async_grpo_settings
from hpcrl.config.checkpoint_metrics import record_key
from hpcrl.config.data_steps import num_steps_in_epochs, rows_per_step
from hpcrl.config.recipe import Recipe
from hpcrl.core.algorithms.loop import CheckpointStore, PreemptionWatch
from hpcrl.core.collection_clock import CollectionClock, frozen_during_steps
from hpcrl.core.data.jsonl import DataPosition, EpochSampler
from hpcrl.core.data.run_rows import training_rows, validation_rows
from hpcrl.core.environments.job_environment import recipe_environment, start_reward_model
from hpcrl.core.loggers import MetricLoggers, build_loggers
from hpcrl.core.metrics import HostMemoryTracker, format_progress, step_memory_metrics
from hpcrl.core.phase import ATTEMPT_ID_VARIABLE, report_phase
from hpcrl.core.policy import Policy
from hpcrl.core.save_deadline import SaveDeadline
from hpcrl.core.workers.group import GroupLayout
from hpcrl.run.checkpoints import checkpoint_folder, complete_checkpoints
from hpcrl.run.jobspec import JobSpec
from hpcrl.run.jobspec_file import JobSpecError, read_jobspec
from hpcrl.run.markers import PREEMPTED_EXIT_CODE, SAVE_DEADLINE, write_marker
from hpcrl.run.metrics_file import METRICS_FILE, MetricsWriter

PLAN_ERROR_EXIT_CODE = 2
# In the run folder (every node sees it): refit files of engines across nodes.
ENGINE_REFIT_DIR = "engine-refits"


def run_training(run_dir: str) -> int:
    """Train the run folder's planned recipe; returns the exit code (0, or 3 when preempted).

    Everything comes from jobspec.json (the recipe too): the job loads no YAML and checks
    nothing the plan decided. The machine (CUDA for a GPU plan, Transformer Engine for the
    settings that need it) was checked by the job's preflight before Ray started
    (``hpcrl.job.preflight``; ``main`` runs the same check for a driver started by hand)."""
    run_path = Path(run_dir)
    try:
        jobspec = read_jobspec(run_path)
    except JobSpecError as error:
        print(f"hpcrl: {error}", file=sys.stderr, flush=True)
        return PLAN_ERROR_EXIT_CODE
    started_ray = _ensure_ray()
    try:
        return train_recipe(jobspec, run_path)
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def _ensure_ray() -> bool:
    """Connect to a local Ray when the caller has not; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    from hpcrl.core.ray_startup import local_ray_system_config

    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        _system_config=local_ray_system_config(),
    )
    return True


def train_recipe(jobspec: JobSpec, run_dir: Path) -> int:
    """Build everything the planned recipe needs, run its algorithm, always shut the workers
    down."""
    recipe = jobspec.recipe
    from hpcrl.core.data.prompts import load_tokenizer
    from hpcrl.core.models.buildable import unbuildable_model
    from hpcrl.core.models.tiny import resolve_model_path

    report_phase(run_dir, f"loading {recipe.policy.model_name} and the data")
    model_path = resolve_model_path(recipe.policy.model_name)
    unbuildable = unbuildable_model(recipe, model_path)
    if unbuildable is not None:  # validate could not read the model's config.json
        print(f"hpcrl: {unbuildable.one_line()}", file=sys.stderr, flush=True)
        return PLAN_ERROR_EXIT_CODE
    tokenizer = load_tokenizer(model_path, recipe.policy.tokenizer)
    rows = training_rows(recipe, tokenizer)
    settings = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert settings is not None  # the config rules require one algorithm section
    sampler = training_sampler(recipe, rows)
    num_steps = planned_num_steps(recipe, len(rows))
    if num_steps < settings.max_num_steps:
        print(f"{recipe.algorithm}.max_num_steps is {settings.max_num_steps}, but {len(rows)} data "
              f"rows at {rows_per_step(recipe)} per step give {num_steps} step(s) in "
              f"{settings.max_num_epochs} epoch(s) ({recipe.algorithm}.max_num_epochs): the run "
              f"stops after step {num_steps}", flush=True)  # fmt: skip
    val_rows = validation_rows(recipe, tokenizer)
    env = recipe_environment(recipe)  # before the workers: a bad env.kwargs fails fast
    print(
        f"{recipe.algorithm} on {recipe.policy.model_name} ({recipe.backend}): {num_steps} steps, "
        f"{len(rows)} data rows, {jobspec.world_size} workers; starting workers",
        flush=True,
    )
    started = time.monotonic()
    report_phase(run_dir, f"starting {jobspec.world_size} workers")
    with contextlib.ExitStack() as cleanup:  # stops the policy first, then the scorers
        scorers = start_reward_model(jobspec, run_dir, job_device(jobspec))
        if scorers is not None:
            cleanup.callback(scorers.shutdown)
            env = scorers
        policy = build_policy(recipe, jobspec, model_path, pad_token_id=tokenizer.pad_token_id or 0)
        cleanup.callback(policy.shutdown)
        print(f"workers ready in {time.monotonic() - started:.1f}s", flush=True)
        step_fn = _make_step_fn(policy, recipe, tokenizer, env, sampler, num_steps)
        validate = _make_validate_fn(policy, jobspec, tokenizer, env, val_rows)
        return run_steps(policy, recipe, step_fn, sampler, run_dir, num_steps, validate)


def training_sampler(recipe: Recipe, rows: list[dict]) -> EpochSampler:
    """The training rows in the algorithm seed's order (``data.shuffle``), epoch by epoch."""
    settings = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert settings is not None  # the config rules require one algorithm section
    return EpochSampler(rows, seed=settings.seed, shuffle=recipe.data.shuffle)


def planned_num_steps(recipe: Recipe, num_rows: int) -> int:
    """``max_num_steps``, or fewer when ``max_num_epochs`` over ``num_rows`` ends first."""
    settings = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert settings is not None  # the config rules require one algorithm section
    return min(
        settings.max_num_steps,
        num_steps_in_epochs(num_rows, rows_per_step(recipe), settings.max_num_epochs),
    )


def _make_validate_fn(
    policy: Policy, jobspec: JobSpec, tokenizer: Any, env: Any, rows: list[dict] | None
) -> Callable[[], dict[str, float]] | None:
    if rows is None:
        return None
    from hpcrl.core.algorithms import validation

    recipe = jobspec.recipe
    if recipe.algorithm == "grpo":
        return functools.partial(validation.grpo_validation, policy, recipe, tokenizer, env, rows)
    return functools.partial(
        validation.sft_validation, policy, recipe, tokenizer, rows, jobspec.world_size
    )


def _make_step_fn(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, sampler: EpochSampler, num_steps: int
) -> Callable[[int], dict]:
    if async_grpo_settings(recipe) is not None:
        # The config rules guarantee vLLM on generation workers of their own.
        from hpcrl.core.algorithms.async_grpo import make_async_grpo_step_fn

        return make_async_grpo_step_fn(policy, recipe, tokenizer, env, sampler, num_steps)
    if recipe.algorithm == "grpo":
        from hpcrl.core.algorithms.grpo import make_grpo_step_fn

        return make_grpo_step_fn(policy, recipe, tokenizer, env, sampler)
    from hpcrl.core.algorithms.sft import make_sft_step_fn

    return make_sft_step_fn(policy, recipe, tokenizer, sampler)


def job_device(jobspec: JobSpec) -> str:
    """``"cuda"`` or ``"cpu"``: the planned device (``JobSpec.device``), whatever this node
    has; the preflight refused a GPU plan on a node without usable CUDA."""
    return "cuda" if jobspec.device == "gpu" else "cpu"


def training_layout(jobspec: JobSpec) -> GroupLayout:
    """The training group as planned: its nodes and ranks per node (fewer than the node's
    slots when separate generation workers share the node), device, and the Megatron
    checkpoint dir every rank converts into."""
    if jobspec.generation is not None:
        num_nodes = jobspec.generation.training_nodes
        workers_per_node = jobspec.generation.training_slots_per_node
    elif jobspec.reward_model is not None:  # the reward model's GPUs are carved out
        from hpcrl.config.node_split import node_split

        split = node_split(jobspec.recipe)
        num_nodes, workers_per_node = split.training_nodes, split.training_gpus_per_node
    else:
        num_nodes, workers_per_node = jobspec.num_nodes, jobspec.slots_per_node
    return GroupLayout(
        num_nodes=num_nodes,
        workers_per_node=workers_per_node,
        device=job_device(jobspec),
        master_port=_job_master_port(),
        megatron_checkpoint_dir=jobspec.megatron_checkpoint_dir,
        engine_ranks=jobspec.colocated_engine_ranks,
        engine_refit_dir=str(Path(jobspec.run_dir) / ENGINE_REFIT_DIR),
    )


def build_policy(recipe: Recipe, jobspec: JobSpec, model_path: str, pad_token_id: int) -> Policy:
    """The Ray worker group of the recipe's backend, one worker per GPU / CPU slot, as the
    plan lays it out; GRPO with ``policy.generation.colocated.enabled: false`` (vLLM, or
    Megatron generation) samples through engines of its own (on the planned nodes)."""
    from hpcrl.core.backends import worker_class_path
    from hpcrl.core.workers.ray_policy import RayPolicy

    layout = training_layout(jobspec)
    training = RayPolicy(
        recipe, model_path, layout, worker_class_path(recipe.backend), pad_token_id=pad_token_id
    )
    generation = recipe.policy.generation
    if recipe.algorithm != "grpo" or generation.colocated.enabled:
        return training
    from hpcrl.core.workers.vllm_policy import wrap_policy

    refit_dir = str(Path(jobspec.run_dir) / ENGINE_REFIT_DIR)
    return wrap_policy(training, recipe, model_path, layout.device, jobspec.generation, refit_dir)


def _job_master_port() -> int | None:
    """The job's torch master port (hpcrl.job.node sets it from the job's port band); None
    outside a job: a free port on rank 0's node."""
    text = os.environ.get("HPCRL_RAY_TORCH_MASTER_PORT")
    return int(text) if text else None


def checkpoint_store(policy: Policy, recipe: Recipe, run_dir: Path) -> CheckpointStore:
    cfg = recipe.checkpointing
    folder = checkpoint_folder(cfg.checkpoint_dir, run_dir)
    return CheckpointStore(
        policy,
        folder,
        cfg.save_period if cfg.enabled else None,
        cfg.keep_top_k,
        metric=record_key(recipe.algorithm, cfg.metric_name) if cfg.metric_name else None,
        higher_is_better=cfg.higher_is_better,
        consolidated=(
            {"run_dir": str(run_dir), "backend": recipe.backend} if cfg.save_consolidated else None
        ),
    )


def run_steps(
    policy: Policy,
    recipe: Recipe,
    step_fn: Callable[[int], dict[str, Any]],
    sampler: EpochSampler,
    run_dir: Path,
    num_steps: int,
    validate: Callable[[], dict[str, float]] | None = None,
) -> int:
    """Resume, then steps until num_steps or a preemption request; returns the exit code.

    The loggers of ``logger.*`` start before the first step (a missing package fails here,
    before any training) and get every record metrics.jsonl gets."""
    writer = MetricsWriter(run_dir / METRICS_FILE)
    loggers = build_loggers(recipe.logger, run_dir)
    try:
        return _run_logged_steps(
            policy, recipe, step_fn, sampler, run_dir, num_steps, validate, writer, loggers
        )
    finally:
        loggers.close()


def _run_logged_steps(
    policy: Policy,
    recipe: Recipe,
    step_fn: Callable[[int], dict[str, Any]],
    sampler: EpochSampler,
    run_dir: Path,
    num_steps: int,
    validate: Callable[[], dict[str, float]] | None,
    writer: MetricsWriter,
    loggers: MetricLoggers,
) -> int:
    """The step loop of run_steps; every record goes to metrics.jsonl and the loggers."""
    from hpcrl.core.algorithms.validation import validation_due

    settings = recipe.grpo if recipe.grpo is not None else recipe.sft
    assert settings is not None
    store = checkpoint_store(policy, recipe, run_dir)
    first_step = _resume_metrics(store, sampler, run_dir, writer)
    memory = HostMemoryTracker()
    if (
        validate
        and first_step == 1
        and validation_due(0, settings.val_period, settings.val_at_start)
    ):
        report_phase(run_dir, "validating before step 1")
        loggers.log(_validate_at_start(validate, writer))
    report_phase(run_dir, f"training from step {first_step}", first_step=first_step)
    deadline = SaveDeadline.from_text(recipe.checkpointing.checkpoint_must_save_by)
    with (
        PreemptionWatch(run_dir).installed() as watch,
        frozen_during_steps(),
        CollectionClock().installed() as collections,
    ):
        for step in range(first_step, num_steps + 1):
            record = step_fn(step)
            due = validation_due(
                step,
                settings.val_period,
                False,
                val_at_end=settings.val_at_end,
                last_step=num_steps,
            )
            if validate and due:
                record.update(validate())
            record.update(step_memory_metrics(policy.collect_state(), memory))
            record.update(collections.take("driver"))
            writer.write(record)
            loggers.log(record)
            print(format_progress(step, num_steps, record), flush=True)
            extra = {"data_position": sampler.position.to_dict()}
            if watch.requested():
                saved = store.save(step, extra, record, in_a_hurry=True)
                print(f"preemption requested: saved {saved} after step {step}; exiting with "
                      f"code {PREEMPTED_EXIT_CODE} to be requeued", flush=True)  # fmt: skip
                return PREEMPTED_EXIT_CODE
            if deadline is not None and deadline.step_done() and step < num_steps:
                return _stop_at_save_deadline(store, step, extra, record, run_dir)
            if store.due(step) or (step == num_steps and store.save_period):
                store.save(step, extra, record)
    return 0


def _stop_at_save_deadline(
    store: CheckpointStore,
    step: int,
    extra: dict[str, Any],
    record: dict[str, Any],
    run_dir: Path,
) -> int:
    """checkpointing.checkpoint_must_save_by reached: as NeMo RL, save (when checkpointing
    is on) and stop. With a checkpoint the driver exits with the preempted code, so the run
    ends unfinished and ``hpcrl resume`` continues it from that checkpoint (the node
    entrypoint requeues by itself only after Slurm's signal); without one, training ends
    here, as NeMo RL's does."""
    key = "checkpointing.checkpoint_must_save_by"
    if not store.save_period:
        print(f"{key} reached after step {step}: stopping training early without a "
              "checkpoint (checkpointing.enabled is false), as NeMo RL does", flush=True)  # fmt: skip
        return 0
    saved = store.save(step, extra, record)
    # the node entrypoint reads it: the attempt's end is this stop, not a failure
    attempt = os.environ.get(ATTEMPT_ID_VARIABLE)
    if attempt:
        write_marker(run_dir, SAVE_DEADLINE, attempt, step=step, checkpoint=str(saved))
    print(f"{key} reached after step {step}: saved {saved}; stopping unfinished (exit code "
          f"{PREEMPTED_EXIT_CODE}): hpcrl resume RUN continues from it", flush=True)  # fmt: skip
    return PREEMPTED_EXIT_CODE


def _validate_at_start(
    validate: Callable[[], dict[str, float]], writer: MetricsWriter
) -> dict[str, Any]:
    values = validate()
    record = {"step": 0, **values}
    writer.write(record)
    shown = "  ".join(f"{key} {value:.4f}" for key, value in values.items())
    print(f"validation before step 1  {shown}", flush=True)
    return record


def _resume_metrics(
    store: CheckpointStore, sampler: EpochSampler, run_dir: Path, writer: MetricsWriter
) -> int:
    """``_resume``, then metrics.jsonl cut back to the steps before the first one to run;
    returns that first step."""
    first_step = _resume(store, sampler, run_dir)
    # A step 0 line (validation before step 1) runs again only when the run starts over.
    dropped = writer.drop_steps_from(first_step if first_step > 1 else 0)
    if dropped:
        print(f"{writer.path.name}: dropped {dropped} line(s) of steps from {first_step} on "
              "(an earlier attempt ran them after the checkpoint; they run again)", flush=True)  # fmt: skip
    if first_step > 1:
        # Said only once metrics.jsonl holds no step this attempt runs again: whoever reads
        # this line and then the file's last step sees this attempt's progress.
        print(f"resumed from {store.checkpoint_dir} at step {first_step - 1}", flush=True)
    return first_step


def _resume(store: CheckpointStore, sampler: EpochSampler, run_dir: Path) -> int:
    """Restore the newest checkpoint if any; the first step still to run."""
    found = complete_checkpoints(store.checkpoint_dir)
    if found:
        report_phase(run_dir, f"loading the checkpoint of step {found[-1][0]}")
    extra = store.restore_latest()
    if extra is None:
        return 1
    sampler.restore(DataPosition.from_dict(extra["data_position"]))
    return int(extra["step"]) + 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpcrl.core.driver RUN_DIR", file=sys.stderr)
        return 2
    # Started by hand no preflight ran before: check this machine first, as a job's does.
    from hpcrl.core.machine_checks import machine_problems

    try:
        problems = [problem.one_line() for problem in machine_problems(read_jobspec(args[0]))]
    except JobSpecError as error:
        problems = [str(error)]
    if problems:
        print("\n".join(f"hpcrl: {problem}" for problem in problems), file=sys.stderr, flush=True)
        return PLAN_ERROR_EXIT_CODE
    return run_training(args[0])


if __name__ == "__main__":
    sys.exit(main())

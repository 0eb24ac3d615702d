"""What each consumer site of ``hpcrl.config.consumers`` builds from a recipe, as plain data,
for ``test_consumers_downstream.py``: a probe per site runs the site (or, where noted, the one
call its caller makes) on CPU and returns what it produced. Two recipes that differ in one
key must give different probe results wherever that key takes effect.

Stand-ins (``recording_policy``'s ``RecordingPolicy`` and ``ScriptedEnv``, the provider namespaces):
the real policy needs Ray workers and a model, the real environment a verifier; the stand-ins
record what the algorithm hands them (the generation settings, the batches, the loss it
computes on fixed log-probs) so the algorithm's own code runs unchanged around them.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from hpcrl.config.recipe import Recipe
from tests.core.recording_policy import (
    NUM_ROWS,
    RecordingAsyncPolicy,
    RecordingPolicy,
    ScriptedEnv,
    StaggeredAsyncPolicy,
    environment_for,
    plain,
    rows,
    tokenizer,
)

Probe = Callable[[Recipe, Path], Any]


def plan_probe(recipe: Recipe, tmp: Path) -> Any:
    """The JobSpec and job.sbatch planned on the shipped eos profile (no overrides)."""
    from hpcrl.config import load_profile
    from hpcrl.plan.planner import plan
    from hpcrl.render.script import render_sbatch

    spec = plan(recipe, load_profile("eos"), run_dir="/runs/probe", recipe_source="probe.yaml")
    return {"spec": plain(attrs.asdict(spec)), "script": render_sbatch(spec)}


def engine_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.generation.engine import engine_spec
    from hpcrl.core.generation.vllm_engine import engine_env

    spec = engine_spec(recipe, "/models/m", "cuda")
    kwargs = None
    if spec.vllm_cfg is not None:
        kwargs = spec.llm_kwargs()
    env = engine_env("cuda", True, spec.vllm_cfg.env_vars) if spec.vllm_cfg is not None else None
    return {"spec": plain(spec), "vllm_kwargs": plain(kwargs), "vllm_env": env}


def hf_model_probe(recipe: Recipe, tmp: Path) -> Any:
    """The config of the model the Automodel backend builds for ``recipe`` (tiny:qwen2)."""
    from hpcrl.core.backends.automodel.model import load_hf_model
    from hpcrl.core.models.tiny import ensure_tiny_model

    path = ensure_tiny_model("tiny:qwen2")
    model = load_hf_model(path, "cpu", recipe.policy.hf_config_overrides)
    return model.config.to_dict()


def dequantize_probe(recipe: Recipe, tmp: Path) -> Any:
    """How the Automodel backend loads an MXFP4 gpt-oss checkpoint under ``recipe``: the
    arguments it hands transformers' from_pretrained, or its refusal (the config alone)."""
    from transformers import GptOssConfig

    from hpcrl.core.backends.automodel.model import dequantized_loading

    config = GptOssConfig(quantization_config={"quant_method": "mxfp4"})
    try:
        loading = dequantized_loading(config, recipe.policy.dequantize_base_checkpoint)
    except ValueError as refusal:
        return f"refused: {refusal}"
    return {name: value.to_dict() for name, value in loading.items()}


def distribution_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.token_distribution import TokenDistribution

    return plain(TokenDistribution.of_generation(recipe.policy.generation))


def batching_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.workers.micro_batches import BatchingSettings

    return [plain(BatchingSettings.from_recipe(recipe, kind)) for kind in ("train", "logprobs")]


def grpo_step_probe(recipe: Recipe, tmp: Path) -> Any:
    """One GRPO step (hpcrl.core.algorithms.grpo.grpo_step) around the stand-ins: what the
    policy was asked to generate and train on, and the step's metrics."""
    from hpcrl.core.algorithms.grpo import grpo_step
    from hpcrl.core.data.jsonl import EpochSampler

    tok = tokenizer(recipe)
    policy = RecordingPolicy(tok.eos_token_id, tok.convert_tokens_to_ids("a"))
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    try:
        record = grpo_step(policy, recipe, tok, environment_for(recipe), sampler, step=1)
    except (RuntimeError, ValueError) as error:  # e.g. dynamic sampling running out of batches
        return {"calls": policy.calls, "raised": str(error)}
    volatile = ("time", "per_s", "tokens_per_s")
    kept = {k: v for k, v in record.items() if not any(word in k for word in volatile)}
    return {"calls": policy.calls, "record": plain(kept)}


def step_fn_probe(recipe: Recipe, tmp: Path) -> Any:
    """Which step function the driver builds (hpcrl.core.driver._make_step_fn)."""
    from hpcrl.core.data.jsonl import EpochSampler
    from hpcrl.core.driver import _make_step_fn

    tok = tokenizer(recipe)
    policy = RecordingAsyncPolicy(tok.eos_token_id, 0)
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    step_fn = _make_step_fn(policy, recipe, tok, ScriptedEnv(), sampler, 6)
    return getattr(getattr(step_fn, "func", None), "__name__", None) or type(step_fn).__name__


def async_step_probe(recipe: Recipe, tmp: Path) -> Any:
    """The first step of async GRPO: what it submits ahead and how it refits the engines."""
    from hpcrl.core.algorithms.async_grpo import AsyncGrpoStep
    from hpcrl.core.data.jsonl import EpochSampler

    tok = tokenizer(recipe)
    policy = RecordingAsyncPolicy(tok.eos_token_id, tok.convert_tokens_to_ids("a"))
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    step = AsyncGrpoStep(policy, recipe, tok, ScriptedEnv(), sampler, last_step=6)
    step(1)
    return [call for call in policy.calls if call[0] in ("submit", "refit_in_flight")]


def grouped_step_probe(recipe: Recipe, tmp: Path) -> Any:
    """Two steps of the grouped async GRPO (windowed / ready_first): the groups each
    dispatched and took (index, start version), its chunks and evictions."""
    from hpcrl.config.async_settings import GROUP_SAMPLERS
    from hpcrl.core.algorithms.async_grpo_groups import GroupedAsyncGrpoStep
    from hpcrl.core.data.jsonl import EpochSampler

    if recipe.async_rl is None or recipe.async_rl.sampler.name not in GROUP_SAMPLERS:
        return None  # the driver builds AsyncGrpoStep (step_fn_probe)
    tok = tokenizer(recipe)
    policy = StaggeredAsyncPolicy(tok.eos_token_id, tok.convert_tokens_to_ids("a"))
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    step = GroupedAsyncGrpoStep(policy, recipe, tok, ScriptedEnv(), sampler)
    result = []
    for index in (1, 2):
        record = step(index)
        result.append(
            {
                "dispatched": step.dispatched,
                "taken": [(g.index, g.start_version) for g in step.last_taken],
                "chunks": record["streaming_chunks"],
                "evicted": record["evicted_stale_prompt_groups"],
            }
        )
    return result


def sft_step_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.algorithms.sft import sft_step
    from hpcrl.core.data.jsonl import EpochSampler

    tok = tokenizer(recipe)
    policy = RecordingPolicy(tok.eos_token_id, 0)
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    record = sft_step(policy, recipe, tok, sampler, step=1)
    return {"calls": policy.calls, "loss": round(record["loss"], 6)}


def steps_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.driver import planned_num_steps

    return planned_num_steps(recipe, NUM_ROWS)


def sampler_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.driver import training_sampler

    sampler = training_sampler(recipe, rows())
    return [row["answer"] for row in sampler.next_batch(NUM_ROWS)]


def validation_sampling_probe(recipe: Recipe, tmp: Path) -> Any:
    """The sampling settings validation generates with."""
    from hpcrl.core.algorithms.validation import validation_sampling

    return plain(validation_sampling(recipe.policy.generation))


def validation_rows_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.data.run_rows import limit_validation

    return len(limit_validation(recipe, rows(100)))


def run_steps_probe(recipe: Recipe, tmp: Path) -> Any:
    """The driver's step loop (hpcrl.core.driver.run_steps) over 6 scripted steps: when it
    validated, what it saved and kept, what it logged where."""
    from hpcrl.core.data.jsonl import EpochSampler
    from hpcrl.core.driver import run_steps

    run_dir = tmp / "run"
    run_dir.mkdir()
    validated: list[int] = []
    steps: list[int] = []

    def step_fn(step: int) -> dict[str, Any]:
        steps.append(step)
        return {
            "step": step,
            "loss": 1.0 / step,
            "grad_norm": 1.0,
            "reward_mean": float(step % 3),
            "reward_std": 0.0,
            "tokens_per_s": 1.0,
        }

    def validate() -> dict[str, float]:
        validated.append(steps[-1] if steps else 0)
        return {"val_reward_mean": float(len(validated) % 2), "val_loss": 1.0 / len(validated)}

    tok = tokenizer(recipe)
    sampler = EpochSampler(rows(), seed=0, shuffle=False)
    run_steps(RecordingPolicy(tok.eos_token_id, 0), recipe, step_fn, sampler, run_dir, 6, validate)
    files = sorted(str(path.relative_to(tmp)) for path in tmp.rglob("*") if path.is_dir())
    return {"validated": validated, "folders": files}


FIXED_MESSAGES = [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]


FIXED_ROW = {
    "problem": "p",
    "expected_answer": "1",
    "generated_solution": "s",
    "input": "i",
    "output": "o",
    "alt_in": "ai",
    "alt_out": "ao",
    "answer": "a",
    "question": "q",
    "prompt": [{"content": "c"}],
    "reward_model": {"ground_truth": "g"},
}


def named_data_probe(recipe: Recipe, tmp: Path) -> Any:
    """NeMo RL's data sections: the named set chosen, its split, seed and held-out share,
    a fixed row and fixed messages through the set's field reader and the prompt
    processor, and the rows a local file gives (hpcrl.core.data.named.load_named_rows);
    hub sets are not read (jobs find them in their HF cache; here there is none)."""
    from hpcrl.config.datasets import resolve_data_sections
    from hpcrl.core.data import named

    result: dict[str, Any] = {}
    tok = tokenizer(recipe)
    recipe = resolve_data_sections(recipe)  # as JobSpec.recipe reaches the job
    for which in ("train", "validation"):
        section = getattr(recipe.data, which)
        if section is None:
            continue
        name, spec = named._named(section)
        fields = None
        if spec.fields not in ("messages", "squad"):
            fields = named._problem_and_target(spec.fields, FIXED_ROW, section)
        result[which] = {
            "named": [name, plain(spec)],
            "split": named._split_of(section, which),
            "seed": named._seed(recipe, section),
            "carve": named._carve(section),
            "fields": fields,
            "prompt": plain(named.math_prompt(tok, section, FIXED_MESSAGES)),
        }
        if section.data_path is not None:
            loaded = named.load_named_rows(recipe, tok, which)
            result[which]["rows"] = plain(loaded[:4]) if loaded else loaded
            result[which]["num_rows"] = len(loaded) if loaded else 0
    return result


def env_probe(recipe: Recipe, tmp: Path) -> Any:
    """The environment built, or why it cannot be here (math-verify is not installed in
    .venv: the job's Python must bring it for hf_math_verify)."""
    from hpcrl.core.environments.build import build_environment

    try:
        env = build_environment(recipe.env)
    except ValueError as error:
        return f"refused: {error}"
    return {"type": type(env).__name__, "rewards": env.score(["q"], ["\\boxed{2}"], ["2"])}


def reward_model_probe(recipe: Recipe, tmp: Path) -> Any:
    """The reward-model scorers' arguments (model_name as the node resolves it)."""
    from hpcrl.core.workers.reward_model_actor import scorer_kwargs

    section = recipe.env.reward_model
    return None if section is None else scorer_kwargs(section, section.model_name)


def hf_cache_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.plan.hf_cache import model_names

    return model_names(recipe)


def loggers_probe(recipe: Recipe, tmp: Path) -> Any:
    """The loggers build_loggers starts and what each was configured with: TensorBoard and
    MLflow on files for real; W&B through a recorder of ``wandb.init`` (its service process
    costs seconds per start) and the GPU monitor through a recorder of its start (it needs
    Ray and NVML)."""
    from unittest import mock

    from hpcrl.core.loggers import gpu_monitor, sinks

    run_dir = tmp / "run"
    run_dir.mkdir(exist_ok=True)
    monitors: list[Any] = []
    wandb_runs: list[Any] = []

    def start_monitor(cfg: Any, loggers: Any, log_dir: Path) -> None:
        monitors.append({"cfg": plain(cfg), "log_dir": str(log_dir.relative_to(tmp))})

    def wandb_init(**kwargs: Any) -> Any:
        wandb_runs.append({k: kwargs[k] for k in ("project", "entity", "name")})
        settings = types.SimpleNamespace(mode=kwargs["mode"], sync_dir=kwargs["dir"])
        return types.SimpleNamespace(settings=settings, finish=lambda: None)

    with (
        mock.patch("wandb.init", wandb_init),
        mock.patch.object(gpu_monitor, "start_gpu_monitor", start_monitor),
    ):
        built = sinks.build_loggers(recipe.logger, run_dir)
    described = [_describe_logger(logger) for logger in built.loggers]
    for logger in built.loggers:
        if type(logger).__name__ != "WandbLogger":
            logger.close()
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_dir())
    return {"loggers": described, "wandb": wandb_runs, "gpu": monitors, "folders": files[:8]}


def _describe_logger(logger: Any) -> Any:
    fields: dict[str, Any] = {"type": type(logger).__name__}
    client = getattr(logger, "client", None)
    if client is not None:
        run_info = client.get_run(logger.run_id).info
        experiment = client.get_experiment(run_info.experiment_id)
        fields.update(experiment=experiment.name, run_name=run_info.run_name)
    return fields

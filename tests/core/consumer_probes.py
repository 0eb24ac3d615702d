"""What each consumer site of ``hpcrl.config.consumers`` builds from a recipe, as plain data,
for ``test_consumers_downstream.py``: a probe per site runs the site (or, where noted, the one
call its caller makes) on CPU and returns what it produced. Two recipes that differ in one
key must give different probe results wherever that key takes effect.

Stand-ins (this module's ``RecordingPolicy``, ``ScriptedEnv`` and the provider namespaces):
the real policy needs Ray workers and a model, the real environment a verifier; the stand-ins
record what the algorithm hands them (the generation settings, the batches, the loss it
computes on fixed log-probs) so the algorithm's own code runs unchanged around them.
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from hpcrl.config.recipe import Recipe

Probe = Callable[[Recipe, Path], Any]
NUM_ROWS = 40


def plain(value: Any) -> Any:
    """Tensors, attrs objects, namespaces and dtypes as comparable plain data."""
    if isinstance(value, torch.Tensor):
        return [float(f"{x:.9g}") for x in value.detach().flatten().tolist()]
    if attrs.has(type(value)):
        return plain(attrs.asdict(value, recurse=False))
    if isinstance(value, types.SimpleNamespace):
        return plain(vars(value))
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, int | str | bool) or value is None:
        return value
    return repr(value)


# --------------------------------------------------------------------------- stand-ins
@attrs.frozen
class Generated:
    """A ``GenerationOutput``: right-padded prompt + response rows."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor
    metrics: Mapping[str, float] = attrs.field(factory=dict)
    engine_generated_tokens: Any = None


class RecordingPolicy:
    """A policy stand-in: generates a fixed pattern (every third response runs to
    max_new_tokens without a stop; the rest stop early with EOS), returns fixed log-probs,
    and trains by computing the loss it is given on fixed log-probs. Records every call."""

    def __init__(self, eos_token_id: int, token_id: int) -> None:
        self.eos, self.token = eos_token_id, token_id
        self.calls: list[Any] = []

    def prepare_for_generation(self) -> None: ...

    def prepare_for_training(self) -> None: ...

    def generate(self, prompt_ids: list[list[int]], cfg: Any, seed: int) -> Generated:
        self.calls.append(("generate", plain(cfg), seed, [len(ids) for ids in prompt_ids]))
        rows = []
        for index, ids in enumerate(prompt_ids):
            full = index % 3 == 0
            length = cfg.max_new_tokens if full else max(1, index % cfg.max_new_tokens)
            response = [self.token] * length if full else [self.token] * (length - 1) + [self.eos]
            rows.append((list(ids), response))
        return _assemble(rows)

    def get_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return _fixed_logprobs(batch["input_ids"].shape, shift=0.1)

    def get_reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return _fixed_logprobs(batch["input_ids"].shape, shift=0.3)

    def train(self, batch: Mapping[str, torch.Tensor], loss_fn: Any) -> dict[str, float]:
        # Old log-probs are shift 0.1: ratios exp(0.7) and exp(-0.5), both outside the clips.
        rows, cols = batch["input_ids"].shape
        alternating = torch.arange(cols, dtype=torch.float32).remainder(2) * 1.2 - 0.6
        base = _fixed_logprobs(batch["input_ids"].shape, shift=0.1)
        logprobs = (base + alternating.expand(rows, cols)).requires_grad_()
        tokens = float(batch["token_mask"].sum())
        full = dict(batch)
        full.setdefault("num_global_sequences", torch.tensor(float(batch["input_ids"].shape[0])))
        loss, metrics = loss_fn(logprobs, full, max(tokens, 1.0))
        loss.backward()
        grad = float(logprobs.grad.abs().sum())
        self.calls.append(("train", int(batch["input_ids"].shape[0]), round(float(loss), 6)))
        values = {key: float(value) for key, value in metrics.items()}
        return {"loss": float(loss), "grad_norm": grad, **values}

    def save_checkpoint(self, checkpoint_dir: str, extra_state: Mapping[str, Any]) -> None:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        (Path(checkpoint_dir) / "extra_state.json").write_text(json.dumps(dict(extra_state)))
        (Path(checkpoint_dir) / "COMPLETE").write_text("")

    def load_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return json.loads((Path(checkpoint_dir) / "extra_state.json").read_text())

    def export_hf(self, out_dir: str) -> None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "model.safetensors").write_text("")

    def collect_state(self) -> list[Mapping[str, Any]]:
        return []

    def shutdown(self) -> None: ...


def _fixed_logprobs(shape: torch.Size, shift: float) -> torch.Tensor:
    rows, cols = shape
    grid = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    return -0.5 - shift - 0.01 * (grid % 7)


def _assemble(rows: list[tuple[list[int], list[int]]]) -> Generated:
    width = max(len(prompt) + len(response) for prompt, response in rows)
    count = len(rows)
    input_ids = torch.zeros((count, width), dtype=torch.long)
    attention = torch.zeros((count, width), dtype=torch.long)
    response_mask = torch.zeros((count, width), dtype=torch.float32)
    for row, (prompt, response) in enumerate(rows):
        ids = prompt + response
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        response_mask[row, len(prompt) : len(ids)] = 1.0
    return Generated(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=response_mask,
        generation_logprobs=-0.45 * response_mask,
        prompt_lengths=torch.tensor([len(p) for p, _ in rows]),
        response_lengths=torch.tensor([len(r) for _, r in rows]),
    )


class ScriptedEnv:
    """Rewards by prompt and position: 0 for every response to an even-numbered prompt (no
    signal in its group), else 0, 1/3, 2/3, 1 by position."""

    def score(self, prompts: list[str], responses: list[str], answers: list[str]) -> list[float]:
        return [
            0.0 if int(answer) % 4 == 0 else (index % 4) / 3 for index, answer in enumerate(answers)
        ]


class ScriptedMultiRewardEnv(ScriptedEnv):
    """The three named components of NeMo RL's multi-reward environment (env.name:
    math_multi_reward): ScriptedEnv's rewards, the same in reverse order within each group
    of 4, and 1 minus them."""

    def score_components(self, prompts, responses, answers) -> dict[str, list[float]]:
        first = ScriptedEnv.score(self, prompts, responses, answers)
        second = [first[i - 2 * (i % 4) + 3] for i in range(len(first))]
        third = [1.0 - value for value in first]
        return {"reward/correctness": first, "reward/format": second, "reward/integer": third}

    def score(self, prompts, responses, answers) -> list[float]:
        parts = self.score_components(prompts, responses, answers).values()
        return [sum(values) for values in zip(*parts, strict=True)]


def environment_for(recipe: Recipe) -> Any:
    return ScriptedMultiRewardEnv() if recipe.env.name == "math_multi_reward" else ScriptedEnv()


def tokenizer(recipe: Recipe | None = None) -> Any:
    """The tiny model's tokenizer, with the recipe's chat template (as the driver loads it)."""
    template = recipe.policy.tokenizer.chat_template if recipe is not None else None
    return _tokenizer(template)


@functools.cache
def _tokenizer(chat_template: str | None) -> Any:
    from hpcrl.config.recipe import TokenizerCfg
    from hpcrl.core.data.prompts import load_tokenizer
    from hpcrl.core.models.tiny import resolve_model_path

    cfg = TokenizerCfg(chat_template=chat_template)
    return load_tokenizer(resolve_model_path("tiny:qwen2"), cfg)


def rows(count: int = NUM_ROWS) -> list[dict]:
    return [
        {"prompt": f"What is {i} + {i}? " * (1 + i % 5), "answer": str(2 * i), "response": "x" * i}
        for i in range(count)
    ]


# --------------------------------------------------------------------------- probes
def plan_probe(recipe: Recipe, tmp: Path) -> Any:
    """The JobSpec and job.sbatch planned on the shipped eos profile (no overrides)."""
    from hpcrl.config import load_profile
    from hpcrl.plan.planner import plan
    from hpcrl.render.script import render_sbatch

    spec = plan(recipe, load_profile("eos"), run_dir="/runs/probe", recipe_source="probe.yaml")
    return {"spec": plain(attrs.asdict(spec)), "script": render_sbatch(spec)}


def engine_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.generation.engine import engine_spec
    from hpcrl.core.generation.vllm_engine import engine_env, engine_kwargs

    spec = engine_spec(recipe, "/models/m", "cuda")
    kwargs = None
    if spec.vllm_cfg is not None:
        kwargs = engine_kwargs(
            spec.model_path,
            spec.vllm_cfg,
            device="cuda",
            seed=spec.seed,
            max_model_len=spec.max_model_len,
            extra_kwargs=spec.vllm_kwargs,
            hf_overrides=spec.hf_config_overrides,
        )
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


class RecordingAsyncPolicy(RecordingPolicy):
    """RecordingPolicy with the submit/collect pair of separate generation workers."""

    def submit_generation(self, prompt_ids: list[list[int]], cfg: Any, seed: int) -> Any:
        self.calls.append(("submit", seed, len(prompt_ids)))
        return (prompt_ids, cfg, seed)

    def collect_generation(self, pending: Any) -> Generated:
        return self.generate(*pending)

    def refit_in_flight(self, recompute_kv_cache: bool) -> None:
        self.calls.append(("refit_in_flight", recompute_kv_cache))

    def generation_ready(self, pending: Any) -> bool:
        return True


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


class StaggeredAsyncPolicy(RecordingAsyncPolicy):
    """Groups finish one at a time, in submission order: the n-th after n+1 polls."""

    def submit_generation(self, prompt_ids: list[list[int]], cfg: Any, seed: int) -> Any:
        polls = sum(call[0] == "submit" for call in self.calls)
        return [*super().submit_generation(prompt_ids, cfg, seed), polls]

    def collect_generation(self, pending: Any) -> Generated:
        return self.generate(*pending[:3])

    def generation_ready(self, pending: Any) -> bool:
        pending[3] -= 1
        return pending[3] < 0


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


def automodel_optimizer_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.automodel.optim import build_lr_scheduler, build_optimizer

    assert recipe.policy.optimizer is not None
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.ones(4))
    optimizer = build_optimizer([param], recipe.policy.optimizer)
    scheduler = build_lr_scheduler(optimizer, recipe.policy.scheduler)
    trace = []
    for _ in range(6):
        optimizer.zero_grad()
        (param * torch.arange(4.0)).sum().backward()
        optimizer.step()
        scheduler.step()
        trace.append((optimizer.param_groups[0]["lr"], param.detach().clone()))
    hypers = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return {"type": type(optimizer).__name__, "hypers": plain(hypers), "trace": plain(trace)}


def automodel_training_optimizer_probe(recipe: Recipe, tmp: Path) -> Any:
    """The optimizer the Automodel worker builds (``build_training_optimizer`` with the
    worker's arguments) from the recipe the job reads: planned on the eos profile, its
    JobSpec written to a run folder and read back, as the node entrypoint does."""
    from hpcrl.config import load_profile
    from hpcrl.core.backends.automodel.optim import build_training_optimizer
    from hpcrl.plan.planner import plan
    from hpcrl.run.jobspec_file import read_jobspec, write_jobspec

    spec = plan(recipe, load_profile("eos"), run_dir=str(tmp / "run"), recipe_source="p.yaml")
    (tmp / "run").mkdir(exist_ok=True)
    write_jobspec(spec)
    job_recipe = read_jobspec(tmp / "run").recipe
    cfg = job_recipe.policy.automodel_cfg
    assert job_recipe.policy.optimizer is not None
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.ones(n)) for n in (4, 4)]
    optimizer = build_training_optimizer(
        params,
        job_recipe.policy.optimizer,
        on_gpu=False,
        cpu_offload=cfg.cpu_offload,
        offload_fraction=cfg.optimizer_offload_fraction,
    )
    on_host = [getattr(optimizer, "is_on_host", lambda p: False)(p) for p in params]
    return {"type": type(optimizer).__name__, "on_host": on_host}


def clip_probe(recipe: Recipe, tmp: Path) -> Any:
    """AutomodelWorker.train_step clips with ``clip_gradients(params, max_grad_norm)``; this
    replays that call on one parameter with a known gradient."""
    from hpcrl.core.backends.automodel.optim import clip_gradients

    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.full((4,), 3.0)
    clip_gradients([param], recipe.policy.max_grad_norm)
    return plain(param.grad)


def parallelize_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.automodel.parallelize import MeshShape, parallelize_steps

    cfg = recipe.policy.automodel_cfg
    shape = MeshShape.for_world(
        8, cfg.dp_replicate_size, cfg.tensor_parallel_size, cfg.context_parallel_size
    )
    return plain(
        parallelize_steps(
            cfg, recipe.policy.precision, shape, on_gpu=True, compiles=False, training=True
        )
    )


def megatron_provider_probe(recipe: Recipe, tmp: Path) -> Any:
    """The provider fields hpcrl sets (apply_megatron_cfg and model_overrides through
    prepare_provider) on a namespace standing in for megatron-bridge's provider, as on a
    machine with Transformer Engine (the TE-only flags are switched off without it)."""
    from unittest import mock

    from hpcrl.core.backends.megatron import provider as module

    target = types.SimpleNamespace(hidden_dropout=0.0, attention_dropout=0.0)
    with mock.patch.object(module, "transformer_engine_available", return_value=True):
        module.prepare_provider(
            target, recipe.policy.megatron_cfg, recipe.policy.precision, seq_length=128
        )
    return plain(target)


def megatron_optimizer_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.megatron.model import optimizer_config

    built = optimizer_config(recipe.policy.megatron_cfg, recipe.policy.precision)
    return plain(vars(built))


def precision_aware_probe(recipe: Recipe, tmp: Path) -> Any:
    """Whether megatron-core is asked for the precision-aware optimizer on a machine with
    Transformer Engine (megatron-core's OptimizerConfig refuses it without TE, as here)."""
    from hpcrl.core.backends.megatron.offload import precision_aware_optimizer_on

    optimizer = recipe.policy.megatron_cfg.optimizer
    requested = optimizer.use_precision_aware_optimizer
    return precision_aware_optimizer_on(requested, optimizer.optimizer_cpu_offload, True)


def megatron_scheduler_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.megatron.model import scheduler_settings

    return plain(scheduler_settings(recipe.policy.megatron_cfg, total_steps=100))


def megatron_ddp_probe(recipe: Recipe, tmp: Path) -> Any:
    from hpcrl.core.backends.megatron.model import ddp_config

    return plain(vars(ddp_config(recipe.policy.megatron_cfg)))


def conversion_probe(recipe: Recipe, tmp: Path) -> Any:
    """MegatronWorker._ensure_conversion calls ensure_megatron_checkpoint with
    ``force=megatron_cfg.force_reconvert_from_hf`` and ``policy.hf_config_overrides`` (a
    changed config is converted apart); this replays that call over a complete earlier
    conversion of the unchanged config and reports whether it converted again."""
    from hpcrl.core.backends.megatron.conversion import (
        COMPLETE_MARKER,
        ensure_megatron_checkpoint,
        model_key,
    )

    root = tmp / "conversions"
    done = root / model_key("m")
    done.mkdir(parents=True)
    (done / COMPLETE_MARKER).write_text("")
    converted: list[str] = []

    def convert(hf_path: str, out_dir: str) -> None:
        converted.append(hf_path)
        Path(out_dir).mkdir(parents=True, exist_ok=True)

    ensure_megatron_checkpoint(
        "m",
        "/hf/m",
        str(root),
        force=recipe.policy.megatron_cfg.force_reconvert_from_hf,
        convert=convert,
        rank=0,
        progress=lambda message: None,
        hf_config_overrides=recipe.policy.hf_config_overrides,
    )
    return converted


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


def lora_probe(recipe: Recipe, tmp: Path) -> Any:
    """``apply_lora`` with the recipe's ``lora_cfg`` on the tiny model (seeded): which
    linears got adapters, their shapes, scale, dropout and initial A; {} without LoRA."""
    from hpcrl.core.backends.automodel.lora import LoraLinear, apply_lora
    from hpcrl.core.backends.automodel.model import load_hf_model
    from hpcrl.core.models.tiny import ensure_tiny_model

    cfg = recipe.policy.automodel_cfg.lora_cfg
    if not cfg.enabled:
        return {}
    torch.manual_seed(0)
    model = load_hf_model(ensure_tiny_model("tiny:qwen2"), "cpu")
    apply_lora(model, cfg)
    return {
        name: {
            "a": list(module.lora_A.weight.shape),
            "b": list(module.lora_B.weight.shape),
            "scale": module.scale,
            "dropout": [module.dropout_p, module.dropout_position],
            "a_sum": round(float(module.lora_A.weight.detach().sum()), 4),
        }
        for name, module in model.named_modules()
        if isinstance(module, LoraLinear)
    }


def megatron_lora_probe(recipe: Recipe, tmp: Path) -> Any:
    """The megatron-bridge ``LoRA`` that ``lora_for`` builds from ``megatron_cfg.peft`` (the
    object that adapts the model): its settings; None without LoRA."""
    import dataclasses

    from hpcrl.core.backends.megatron.lora import lora_for

    lora = lora_for(recipe.policy.megatron_cfg.peft)
    if lora is None:
        return None
    names = ("target_modules", "exclude_modules", "dim", "alpha", "dropout", "dropout_position",
             "lora_A_init_method", "lora_B_init_method")  # fmt: skip
    fields = {f.name for f in dataclasses.fields(lora)}
    assert set(names) <= fields, sorted(fields)
    return {name: getattr(lora, name) for name in names}

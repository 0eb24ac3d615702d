"""Stand-ins the algorithms run against without Ray workers, a model or a verifier (the
consumer probes, and the tests of async GRPO, validation, save deadlines and group selection):
``RecordingPolicy`` (and its async forms) generates a fixed pattern, returns fixed log-probs
and computes the loss it is given on them, recording every call; ``ScriptedEnv`` rewards by
prompt and position. Also the tiny model's tokenizer, prompt rows, and ``plain`` (what a
stand-in or probe recorded, as comparable plain data).
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from hpcrl.config.recipe import Recipe

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

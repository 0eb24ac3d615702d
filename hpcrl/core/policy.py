"""The one interface algorithms use to talk to a training backend.

The controller (the driver on the Ray head) holds a ``Policy``; behind it a worker group of
Ray actors runs one backend (Automodel or Megatron) in one torch.distributed group.
Algorithms (GRPO, SFT) only call the methods below and never see a backend.

Tensors cross this interface on CPU, batch-first. Token axis conventions:
``input_ids[b, t]`` is the full sequence (prompt + response, right-padded);
``logprobs[b, t]`` is log p(input_ids[b, t] | input_ids[b, :t]) with ``logprobs[b, 0] = 0``;
``token_mask[b, t]`` is 1 where token t is a response token that counts in the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg

# A batch is a mapping of equally-long (dim 0) CPU tensors. Keys the backends rely on:
#   input_ids [B, T] long, attention_mask [B, T] long (1 = real token), token_mask [B, T] float.
# Algorithms add their own keys (advantages [B], old_logprobs [B, T], ref_logprobs [B, T], ...);
# backends slice every key along dim 0 into micro-batches and pass them through untouched.
Batch = Mapping[str, "torch.Tensor"]

# With top-k/top-p sampling the train step hands the loss the log-probs of the filtered
# distribution (hpcrl.core.token_distribution) and adds the unfiltered ones to the
# micro-batch under this key (NeMo RL's name): the KL term compares those to the reference.
UNFILTERED_LOGPROBS_KEY = "curr_logprobs_unfiltered"

# Computed on the workers: (logprobs [b, T] with grad, micro-batch, global normaliser) →
# (scalar loss, metrics). Must be a picklable top-level function or functools.partial of one.
# ``num_global_tokens`` is the loss-mask token count of the whole global batch, so that
# micro-batch and data-parallel splits sum to the same loss as one big batch. Metric values
# are floats or (preferably) detached 0-dim tensors: backends sum tensors on the device and
# read them once per step instead of waiting for the device after every micro-batch.
LossFn = Callable[
    ["torch.Tensor", Batch, float], tuple["torch.Tensor", Mapping[str, "float | torch.Tensor"]]
]


class GenerationOutput(Protocol):
    """What ``Policy.generate`` returns (all CPU tensors, batch-first, right-padded)."""

    @property
    def input_ids(self) -> torch.Tensor:
        """[B, T] prompt followed by response."""

    @property
    def attention_mask(self) -> torch.Tensor:
        """[B, T]."""

    @property
    def response_mask(self) -> torch.Tensor:
        """[B, T] 1 on generated tokens (excluding padding after a stop)."""

    @property
    def generation_logprobs(self) -> torch.Tensor:
        """[B, T] the sampler's log-probs of generated tokens, else 0."""

    @property
    def prompt_lengths(self) -> torch.Tensor:
        """[B]."""

    @property
    def response_lengths(self) -> torch.Tensor:
        """[B]."""

    @property
    def metrics(self) -> Mapping[str, float]:
        """Figures of the engines' work (time_refit_s, time_sample_s, time_prefill_s, ...):
        times of the slowest shard, counts summed over shards."""

    @property
    def engine_generated_tokens(self) -> torch.Tensor | None:
        """[B] generated tokens per row as the generation engine itself counted them (vLLM's
        request stats); None for the torch engine. The step reports their sum."""


class Policy(Protocol):
    """Controller-side handle on a backend's worker group."""

    def train(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over the global batch (split into data-parallel shards and
        micro-batches by the backend). Returns at least loss, grad_norm, lr."""

    def get_logprobs(self, batch: Batch) -> torch.Tensor:
        """Token log-probs [B, T] of ``batch['input_ids']`` under the current weights."""

    def get_reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """Token log-probs under the frozen initial (reference) weights."""

    def generate(
        self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int
    ) -> GenerationOutput:
        """Sample one response per prompt (repeat prompts for n per prompt) with the latest
        weights (engines are refitted first when training changed them)."""

    def prepare_for_generation(self) -> None:
        """Move what training needs out of the way (e.g. optimizer state off GPU)."""

    def prepare_for_training(self) -> None:
        """Undo ``prepare_for_generation``."""

    def save_checkpoint(self, checkpoint_dir: str, extra_state: Mapping[str, Any]) -> None:
        """Distributed checkpoint of model, optimizer, scheduler, RNG and ``extra_state``."""

    def load_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        """Restore everything ``save_checkpoint`` wrote; returns its ``extra_state``."""

    def export_hf(self, out_dir: str) -> None:
        """Write a consolidated Hugging Face checkpoint of the current weights."""

    def collect_state(self) -> list[Mapping[str, Any]]:
        """Per-rank facts in rank order (``BackendWorker.collect_state``): step, peak memory."""

    def shutdown(self) -> None:
        """Stop workers cleanly (no gloo exit abort, no processes left behind)."""


@runtime_checkable
class AsyncGenerationPolicy(Policy, Protocol):
    """A policy whose generation runs on engines of their own, so it can overlap training:
    ``submit_generation`` refits the engines if needed, starts sampling and returns at once;
    ``collect_generation`` waits for that submission's output. Submissions are sampled in
    order, each with the weights the policy had when it was submitted, unless
    ``refit_in_flight`` moves the engines to newer weights while they sample."""

    def submit_generation(self, prompt_ids: list[list[int]], cfg: GenerationCfg, seed: int) -> Any:
        """Start sampling; returns a handle for ``collect_generation``."""

    def collect_generation(self, pending: Any) -> GenerationOutput:
        """The output of one ``submit_generation`` (waits for it)."""

    def generation_ready(self, pending: Any) -> bool:
        """Whether ``collect_generation(pending)`` would return at once (does not wait)."""

    def refit_in_flight(self, recompute_kv_cache: bool) -> None:
        """Load the latest weights into the engines at the next step of the generations
        they are running, not behind them (``hpcrl.core.generation.in_flight``); those
        generations go on with the new weights. Returns without waiting."""

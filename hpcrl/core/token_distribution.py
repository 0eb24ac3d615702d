"""The distribution responses are sampled from, and the one every log-prob is measured in.

NeMo RL's contract (its vLLM engines run with ``logprobs_mode="processed_logprobs"``, its
policy workers divide training logits by the temperature and apply the same top-k/top-p):
a token's log-prob is ``log_softmax(filter(logits / T))`` at that token, where ``filter``
keeps the top-k tokens, then the smallest most-likely set reaching mass top-p, and sets
every other logit to −inf. So the sampler's ``generation_logprobs``, the trainer's old and
current log-probs all describe the distribution the samples really came from.

Two exceptions, both NeMo RL's: the reference policy is scored with the temperature but
without top-k/top-p (its own top set differs, so filtered values would not be comparable),
and the KL term uses the current policy's *unfiltered* log-probs for the same reason.
With filtering on, a token the trainer's filter drops has log-prob −inf; the loss leaves
such tokens out of the policy-gradient term.

Every caller (the torch sampler, the Automodel and Megatron log-prob paths) goes through
``scale_logits`` / ``filter_logits`` here, so the three cannot drift apart. ``logits`` are
what the HF model's forward returns, i.e. after the model's own processing
(``LogitTransform``: Gemma soft-capping, Granite/Cohere/Falcon-H1 scaling), which a backend
that computes logits from hidden states itself must apply first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

# what HF causal LMs do to lm_head's output, by config attribute (read from transformers'
# modeling code); the Megatron backend refuses such models by the same keys
from hpcrl.config.architectures import LOGIT_MULTIPLIER_KEYS, LOGIT_SOFTCAP_KEY

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GenerationCfg, Recipe


@attrs.frozen(kw_only=True)
class TokenDistribution:
    """Temperature and filters applied to logits; the defaults leave them unchanged."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0

    @classmethod
    def of_generation(cls, cfg: GenerationCfg) -> TokenDistribution:
        """What ``cfg`` samples from. Greedy (temperature 0) is scored at temperature 1."""
        return cls(
            temperature=cfg.temperature if cfg.temperature > 0 else 1.0,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
        )

    @property
    def filters(self) -> bool:
        """True when top-k or top-p removes tokens (the -inf / masking paths are needed)."""
        return (self.top_k is not None and self.top_k > 0) or self.top_p < 1.0

    def without_filters(self) -> TokenDistribution:
        return attrs.evolve(self, top_k=None, top_p=1.0)


@attrs.frozen(kw_only=True)
class LogitTransform:
    """``softcap · tanh(multiplier · z / softcap)`` (no tanh without a softcap)."""

    multiplier: float = 1.0
    softcap: float | None = None

    @classmethod
    def of_config(cls, config: Any) -> LogitTransform:
        """The processing the HF model's forward applies, read from its config."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        multiplier = 1.0
        for name, divides in LOGIT_MULTIPLIER_KEYS:
            value = getattr(text, name, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                multiplier = multiplier / value if divides else multiplier * value
        softcap = getattr(text, LOGIT_SOFTCAP_KEY, None)
        return cls(multiplier=float(multiplier), softcap=float(softcap) if softcap else None)

    @property
    def is_identity(self) -> bool:
        return self.multiplier == 1.0 and self.softcap is None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        import torch

        if self.multiplier != 1.0:
            logits = logits * self.multiplier
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def training_distribution(recipe: Recipe) -> TokenDistribution:
    """What the trainer's log-prob passes score: GRPO's sampling distribution; SFT's is the
    model's own (no temperature: SFT samples nothing)."""
    if recipe.grpo is None:
        return TokenDistribution()
    return TokenDistribution.of_generation(recipe.policy.generation)


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / T`` (a new tensor; T = 1 returns the input)."""
    if temperature == 1.0:
        return logits
    return logits / temperature


def filter_logits(scaled: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Top-k, then top-p on what is left, over the last dim; dropped logits become −inf.

    Ties at the k-th value are all kept; top-p keeps a token when the mass of the tokens
    more likely than it is below top_p (so the most likely token always stays). The masked
    fill gives dropped logits no gradient.
    """
    import torch

    vocab = scaled.shape[-1]
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if top_k is not None and 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        keep = scaled >= kth
    if top_p < 1.0:
        kept_logits = scaled.detach().masked_fill(~keep, float("-inf"))
        sorted_logits, order = torch.sort(kept_logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep_sorted = mass_before < top_p
        keep_sorted[..., 0] = True
        keep = keep & torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return scaled.masked_fill(~keep, float("-inf"))


def processed_logits(logits: torch.Tensor, dist: TokenDistribution) -> torch.Tensor:
    """The logits ``dist`` samples from: scaled, then filtered."""
    scaled = scale_logits(logits, dist.temperature)
    if not dist.filters:
        return scaled
    return filter_logits(scaled, dist.top_k, dist.top_p)


def token_logprobs_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, dist: TokenDistribution
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) log-probs of ``targets`` under full-vocab ``logits`` [..., V].

    processed: ``dist``'s own (−inf where the filter drops the target); unfiltered: the same
    temperature, no top-k/top-p (the KL term's). Without filters both are one tensor.
    """
    import torch

    scaled = scale_logits(logits.float(), dist.temperature)
    index = targets.unsqueeze(-1)
    unfiltered = _target_log_softmax(scaled, targets)
    if not dist.filters:
        return unfiltered, unfiltered
    kept = filter_logits(scaled, dist.top_k, dist.top_p)
    processed = kept.gather(-1, index).squeeze(-1) - torch.logsumexp(kept, dim=-1)
    return processed, unfiltered


def _target_log_softmax(scaled: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(scaled)`` at ``targets``, as the negated cross-entropy: one fused
    log-softmax kernel forward and one backward, where ``gather - logsumexp`` ran several
    passes over the float32 logits each way (measured: docs/performance.md, "Figures behind the code"). Same
    value to float32 rounding."""
    import torch.nn.functional as F

    flat = scaled.reshape(-1, scaled.shape[-1])
    losses = F.cross_entropy(flat, targets.reshape(-1), reduction="none")
    return -losses.view(targets.shape)

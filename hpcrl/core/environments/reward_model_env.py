"""NeMo RL's reward-model environment, job side: a Bradley-Terry sequence classifier scores
each (prompt, response) conversation.

The conversation is formatted with the reward model's own tokenizer the way NeMo RL's
``get_formatted_message_log`` does it (add_bos, add_eos, no generation prompt): the chat
template is applied to each growing prefix of the messages, each message contributes the text
its prefix adds, the first chunk starts with BOS and the last ends with EOS (when the tokenizer
has them and the template did not put them there), and each chunk is tokenized on its own
without special tokens. The score is the classifier's single logit from its own forward
(the HF sequence-classification head pools the last non-pad token; batches are right padded
with the tokenizer's pad id, as NeMo RL pads them).

Recipes reach it through ``data.*.env_name: reward_model`` and ``env.reward_model``
(hpcrl.config.recipe_reward_model); the driver runs one per GPU of its planned placement in
Ray actors of their own (hpcrl.core.workers.reward_model_actor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PRECISIONS = ("bfloat16", "float16", "float32")
METRIC_PREFIX = "reward_model_env"


def _first_difference(before: str, after: str) -> int:
    """The index of the first character where the two texts differ (NeMo RL's prefix cut)."""
    for index, (a, b) in enumerate(zip(before, after, strict=False)):
        if a != b:
            return index
    return min(len(before), len(after))


def format_conversation(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of the conversation as NeMo RL's reward-model environment builds them."""
    token_ids: list[int] = []
    previous = ""
    for index in range(len(messages)):
        formatted = tokenizer.apply_chat_template(
            [dict(m) for m in messages[: index + 1]],
            add_generation_prompt=False,
            tokenize=False,
            add_special_tokens=False,
        )
        chunk = formatted[_first_difference(previous, formatted) :]
        previous = formatted
        bos, eos = tokenizer.bos_token, tokenizer.eos_token
        if index == 0 and bos is not None and not chunk.startswith(bos):
            chunk = bos + chunk
        last = index == len(messages) - 1
        if last and eos is not None and not chunk.rstrip("\n").endswith(eos):
            chunk += eos
        token_ids += tokenizer(chunk, add_special_tokens=False)["input_ids"]
    return token_ids


def reward_metrics(rewards: Sequence[float]) -> dict[str, float]:
    """NeMo RL's reward_model_env/* metrics of one batch (std: unbiased, as torch's)."""
    import torch

    values = torch.tensor(list(rewards), dtype=torch.float64)
    metrics = {f"{METRIC_PREFIX}/num_samples": float(len(values))}
    if len(values):
        metrics |= {
            f"{METRIC_PREFIX}/mean_reward": float(values.mean()),
            f"{METRIC_PREFIX}/std_reward": float(values.std()),
            f"{METRIC_PREFIX}/min_reward": float(values.min()),
            f"{METRIC_PREFIX}/max_reward": float(values.max()),
        }
    return metrics


class RewardModelEnvironment:
    """Scores conversations with a local HF AutoModelForSequenceClassification (num_labels 1).

    ``model_path`` and ``tokenizer_path`` are local folders or hub names found in the job's
    Hugging Face cache (as the policy's model is loaded). ``batch_size`` conversations go through one forward;
    conversations longer than ``max_model_len`` tokens keep their first ``max_model_len``.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None = None,
        precision: str = "bfloat16",
        batch_size: int = 8,
        max_model_len: int = 2048,
        device: str = "cpu",
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(
                f"env.reward_model.precision: {precision!r} is not one of {', '.join(PRECISIONS)}"
            )
        if batch_size < 1 or max_model_len < 1:
            raise ValueError(
                f"env.reward_model: batch_size {batch_size} and max_model_len {max_model_len} "
                "must be >= 1"
            )
        self.batch_size = batch_size
        self.max_model_len = max_model_len
        self.device = device
        self.tokenizer = _load_local_tokenizer(tokenizer_path or model_path)
        self.model = _load_classifier(model_path, precision, device)

    def token_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The formatted conversation, cut to max_model_len tokens."""
        return format_conversation(self.tokenizer, messages)[: self.max_model_len]

    def score_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, str]]]
    ) -> list[float]:
        """One reward per conversation (same order), batch_size conversations per forward."""
        sequences = [self.token_ids(messages) for messages in conversations]
        rewards: list[float] = []
        for start in range(0, len(sequences), self.batch_size):
            rewards += self._score_batch(sequences[start : start + self.batch_size])
        return rewards

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        """hpcrl's environment interface: the prompt as the user turn, the response as the
        assistant turn (the ground truth plays no part in a reward model's score)."""
        del answers
        return self.score_conversations(
            [
                [{"role": "user", "content": p}, {"role": "assistant", "content": r}]
                for p, r in zip(prompts, responses, strict=True)
            ]
        )

    def _score_batch(self, sequences: Sequence[list[int]]) -> list[float]:
        import torch

        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.model.config.pad_token_id
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            mask[row, : len(sequence)] = 1
        with torch.no_grad():
            # the model's own head pools the last non-pad token, as in NeMo RL's score()
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        return [float(v) for v in logits.logits[:, 0].float().cpu()]


def _load_local_tokenizer(path: str) -> Any:
    from pathlib import Path

    from hpcrl.core.models.tokenizer import load_tokenizer

    if path.startswith(("/", ".", "~")) and not Path(path).expanduser().is_dir():
        raise ValueError(
            f"env.reward_model.tokenizer.name: {path!r} is not a local folder (a path must "
            "name the folder of a Hugging Face tokenizer; a hub name is read from the cache)"
        )
    return load_tokenizer(path)


def _load_classifier(path: str, precision: str, device: str) -> Any:
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=getattr(torch, precision)
    )
    if model.config.num_labels != 1:
        raise ValueError(
            f"env.reward_model.model_name: {path!r} is not a Bradley-Terry reward model "
            f"(num_labels {model.config.num_labels}, needs 1)"
        )
    return model.to(device).eval()

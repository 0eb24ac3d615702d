"""NeMo RL's data sets by name (``hpcrl.config.datasets``), loaded through Hugging Face
``datasets`` from a local path or the HF cache, and turned into token ids the way NeMo RL's
processors do.

Rows come out as dicts the algorithms read: GRPO rows hold ``prompt`` (the text after the
prompt template), ``answer`` (ground truth) and ``prompt_ids`` (the processor's tokens);
SFT rows hold ``input_ids`` and ``token_mask`` (1 on assistant tokens).

Processors, as NeMo RL's behave:
- math (``math_hf_data_processor``, ``default``): the user message is the prompt file's
  template filled with the problem (``template.format(problem)``), rendered alone with the
  tokenizer's chat template and the generation prompt; ``math_data_processor`` first renders
  the system prompt file as its own system message;
- ``sft_processor``: the conversation rendered message by message with the chat template;
  assistant messages count in the loss; BOS/EOS added per ``data.add_bos``/``add_eos``.
A tokenizer without a chat template gets the plain text of the messages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcrl.config.datasets import NAMED_DATASETS, NamedDataset
from hpcrl.config.recipe import DatasetCfg, Recipe


class DatasetUnavailable(RuntimeError):
    """A named set is neither at its data_path nor in the HF cache (jobs are offline)."""


def load_named_rows(recipe: Recipe, tokenizer: Any, which: str) -> list[dict] | None:
    """Rows of ``data.train`` or ``data.validation`` (None: the recipe names no such set).

    ``recipe`` is the plan's (``JobSpec.recipe``): each section already holds what
    ``data.default`` and the older flat keys give it (``resolve_data_sections``)."""
    data = recipe.data
    assert data.default is None and data.dataset_name is None, (
        "an unplanned recipe: the plan resolves data.default and the flat data.* keys into "
        "data.train/validation (hpcrl.config.datasets.resolve_data_sections)"
    )
    if isinstance(data.train, tuple) or isinstance(data.validation, tuple):
        return _listed_rows(recipe, tokenizer, which)
    train = data.train
    if train is None:
        return None
    seed = _seed(recipe, train)
    section = data.validation if which == "validation" else train
    if which == "validation" and section is None:
        messages = _paired_validation(train, seed)
    else:
        assert isinstance(section, DatasetCfg)
        carve = "train" if which == "train" else None  # a named validation set is used whole
        messages = _messages(section, _split_of(section, which), seed, carve_part=carve)
    if messages is None:
        return None
    if section is not None and section.repeat is not None:
        messages = messages * section.repeat
    cfg = section or train
    return [_process(recipe, tokenizer, cfg, m) for m in messages]


def _listed_rows(recipe: Recipe, tokenizer: Any, which: str) -> list[dict] | None:
    """NeMo RL's lists of data sets, concatenated in order, each row processed with its own
    set's keys: training takes each set's training part; validation takes each training
    set's held-out part (split_validation_size), then each listed validation set whole."""
    rows: list[dict] = []
    for train in _as_list(recipe.data.train):
        seed = _seed(recipe, train)
        if which == "train":
            part = _messages(train, _split_of(train, "train"), seed, carve_part="train")
            rows += _processed(recipe, tokenizer, train, part)
        elif _carve(train) > 0:
            held_out = _messages(train, _split_of(train, "train"), seed, carve_part="validation")
            rows += _processed(recipe, tokenizer, train, held_out)
    if which == "validation":
        for section in _as_list(recipe.data.validation):
            seed = _seed(recipe, section)
            whole = _messages(section, _split_of(section, "validation"), seed, carve_part=None)
            rows += _processed(recipe, tokenizer, section, whole)
    return rows or None


def _as_list(sections: DatasetCfg | tuple[DatasetCfg, ...] | None) -> tuple[DatasetCfg, ...]:
    if sections is None:
        return ()
    return sections if isinstance(sections, tuple) else (sections,)


def _processed(
    recipe: Recipe, tokenizer: Any, section: DatasetCfg, messages: list[list[dict]]
) -> list[dict]:
    messages = messages * (section.repeat or 1)
    return [_process(recipe, tokenizer, section, m) for m in messages]


def _seed(recipe: Recipe, section: DatasetCfg) -> int:
    if section.seed is not None:
        return section.seed
    algorithm = recipe.grpo if recipe.grpo is not None else recipe.sft
    return algorithm.seed if algorithm is not None else 42


def _named(section: DatasetCfg) -> tuple[str, NamedDataset]:
    name = section.dataset_name or "ResponseDataset"
    return name, NAMED_DATASETS[name]


def _split_of(section: DatasetCfg, which: str) -> str:
    _, named = _named(section)
    if section.split is not None:
        return section.split
    return named.train_split if which == "train" else (named.validation_split or "train")


def _carve(section: DatasetCfg) -> float:
    _, named = _named(section)
    fraction = section.split_validation_size
    return named.carve_validation if fraction is None else fraction


def _paired_validation(train: DatasetCfg, seed: int) -> list[list[dict]] | None:
    """NeMo RL's validation when none is named: held out of train, the set's validation
    split, or its paired set (DAPOMath17K → AIME 2024)."""
    _, named = _named(train)
    if _carve(train) > 0:
        return _messages(train, _split_of(train, "train"), seed, carve_part="validation")
    if named.validation_split is not None:
        return _messages(train, named.validation_split, seed, carve_part=None)
    if named.validation_set is not None:
        other = DatasetCfg(dataset_name=named.validation_set)
        rows = _messages(other, _split_of(other, "train"), seed, carve_part=None)
        return rows * NAMED_DATASETS[named.validation_set].repeat_validation
    return None


def _messages(
    section: DatasetCfg, split: str, seed: int, carve_part: str | None
) -> list[list[dict]]:
    name, named = _named(section)
    table = _cap(section, _load_table(section, named, split), seed)
    fraction = _carve(section)
    if carve_part is not None and fraction > 0:
        table = table.train_test_split(test_size=fraction, seed=seed)[
            "train" if carve_part == "train" else "test"
        ]
    return [to_messages(named.fields, row, section) for row in table]


def _cap(section: DatasetCfg, table: Any, seed: int) -> Any:
    """NeMo RL's ``max_samples``: a seeded shuffle, then its first rows, before validation is
    carved out (the rule allows it only on sets whose NeMo RL loader reads it)."""
    limit = section.max_samples
    if limit is None or limit <= 0 or not _named(section)[1].reads_max_samples:
        return table
    return table.shuffle(seed=seed).select(range(min(limit, len(table))))


def _load_table(section: DatasetCfg, named: NamedDataset, split: str) -> Any:
    import datasets

    path = section.data_path
    try:
        if path is not None:
            return _load_local(Path(path), split)
        return datasets.load_dataset(named.hub_id, named.config_name, split=split)
    except (FileNotFoundError, ConnectionError, ValueError) as error:
        where = f"at {path}" if path else f"{named.hub_id} in the HF cache ({_hf_cache()})"
        raise DatasetUnavailable(
            f"data set {section.dataset_name or 'ResponseDataset'} (split {split}) could not "
            f"be read {where}: {error}. Jobs run offline: download it once where the hub is "
            "reachable (datasets.load_dataset) into the HF_HOME the job uses, or give "
            "data.train.data_path (a local copy in the hub's format)"
        ) from error


def _load_local(path: Path, split: str) -> Any:
    import datasets

    if path.is_dir():
        return datasets.load_dataset(str(path), split=split)
    builder = {".parquet": "parquet", ".csv": "csv"}.get(path.suffix, "json")
    return datasets.load_dataset(builder, data_files=str(path), split="train")


def _hf_cache() -> str:
    return (
        os.environ.get("HF_DATASETS_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface"
    )


# --------------------------------------------------------------------------- row formats
def to_messages(fields: str, row: dict, section: DatasetCfg) -> list[dict]:
    """One hub row as chat messages, the last one the target."""
    if fields == "messages":
        return [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    if fields == "squad":
        return [
            {"role": "system", "content": row["context"]},
            {"role": "user", "content": row["question"]},
            {"role": "assistant", "content": row["answers"]["text"][0]},
        ]
    problem, target = _problem_and_target(fields, row, section)
    return [{"role": "user", "content": problem}, {"role": "assistant", "content": target}]


def _problem_and_target(fields: str, row: dict, section: DatasetCfg) -> tuple[str, str]:
    if fields == "openmath_answer":
        return row["problem"], str(row[section.output_key or "expected_answer"])
    if fields == "openmath_solution":
        return row["problem"], str(row[section.output_key or "generated_solution"])
    if fields == "dapo":
        return row["prompt"][0]["content"], str(row["reward_model"]["ground_truth"])
    if fields == "gsm8k":
        answer = row["answer"]
        return row["question"], answer.split("####")[1].strip() if "####" in answer else answer
    if fields == "input_output":
        return str(row[section.input_key or "input"]), str(row[section.output_key or "output"])
    assert fields == "problem_answer", f"unknown row format {fields}"
    return row["problem"], str(row["answer"])


# --------------------------------------------------------------------------- processors
def _read(path: str | None) -> str | None:
    return Path(path).read_text(encoding="utf-8") if path else None


def _render(
    tokenizer: Any,
    messages: Sequence[dict],
    generation_prompt: bool,
    template_kwargs: Mapping[str, Any],
) -> str:
    """``template_kwargs``: ``policy.tokenizer.chat_template_kwargs``."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            list(messages),
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **template_kwargs,
        )
    return "".join(str(m["content"]) for m in messages)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _process(recipe: Recipe, tokenizer: Any, section: DatasetCfg, messages: list[dict]) -> dict:
    if recipe.algorithm == "sft":
        return sft_example(recipe, tokenizer, messages)
    return math_prompt(tokenizer, section, messages, recipe.policy.tokenizer.chat_template_kwargs)


def math_prompt(
    tokenizer: Any,
    section: DatasetCfg,
    messages: list[dict],
    template_kwargs: Mapping[str, Any] | None = None,
) -> dict:
    """GRPO row: the templated problem as one user turn (+ a system turn for
    math_data_processor), its tokens and the ground truth."""
    problem, answer = str(messages[0]["content"]), str(messages[-1]["content"])
    template = _read(section.prompt_file)
    text = template.format(problem) if template else problem
    ids: list[int] = []
    system = _read(section.system_prompt_file)
    if system and section.processor == "math_data_processor":
        system_turn = [{"role": "system", "content": system}]
        ids += _ids(tokenizer, _render(tokenizer, system_turn, False, template_kwargs or {}))
    user_turn = [{"role": "user", "content": text}]
    ids += _ids(tokenizer, _render(tokenizer, user_turn, True, template_kwargs or {}))
    return {"prompt": text, "answer": answer, "prompt_ids": ids}


def sft_example(recipe: Recipe, tokenizer: Any, messages: list[dict]) -> dict:
    """SFT row: the conversation's tokens, message by message; assistant tokens count."""
    data = recipe.data
    ids: list[int] = []
    mask: list[float] = []
    rendered = ""
    for index, message in enumerate(messages):
        last = index == len(messages) - 1
        text = _render(
            tokenizer,
            messages[: index + 1],
            data.add_generation_prompt and last,
            recipe.policy.tokenizer.chat_template_kwargs,
        )
        piece = (
            _ids(tokenizer, text[len(rendered) :])
            if text.startswith(rendered)
            else _ids(tokenizer, text)
        )
        rendered = text
        ids += piece
        mask += [1.0 if message["role"] == "assistant" else 0.0] * len(piece)
    if data.add_bos and tokenizer.bos_token_id is not None and ids[:1] != [tokenizer.bos_token_id]:
        ids, mask = [tokenizer.bos_token_id, *ids], [0.0, *mask]
    if data.add_eos and tokenizer.eos_token_id is not None and ids[-1:] != [tokenizer.eos_token_id]:
        ids, mask = [*ids, tokenizer.eos_token_id], [*mask, 1.0]
    limit = recipe.policy.max_total_sequence_length
    return {"input_ids": ids[:limit], "token_mask": mask[:limit]}

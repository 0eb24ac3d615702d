"""NeMo RL's data sets by name: where each lives on the Hugging Face hub, how its rows become
hpcrl rows, and the load-time rules of ``data``.

The table is plain data (the login node imports no ``datasets``); the in-job loader is
``hpcrl.core.data.named``. Every set becomes NeMo RL's row form, a list of chat
``messages`` whose last message is the target (the ground truth for GRPO, the response for
SFT); ``fields`` says which columns make them.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import attrs

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import DatasetCfg, Recipe
from hpcrl.config.shared_methods import SharedMethods


@attrs.frozen(kw_only=True)
class NamedDataset(SharedMethods):
    hub_id: str
    config_name: str | None = None
    train_split: str = "train"
    validation_split: str | None = None  # a split of the same set
    validation_set: str | None = None  # another named set (NeMo RL's pairing)
    carve_validation: float = 0.0  # or a fraction of train held out (seeded)
    fields: str = "problem_answer"  # how rows become messages (hpcrl.core.data.named)
    repeat_validation: int = 1
    algorithm: str = "grpo"  # what the set is made for
    # NeMo RL's loader of the set reads data.*.max_samples (the others ignore it)
    reads_max_samples: bool = False


NAMED_DATASETS: dict[str, NamedDataset] = {
    # NeMo RL's name for both algorithms: GRPO's target is the answer (output_key's default,
    # expected_answer), SFT recipes set output_key: generated_solution.
    "OpenMathInstruct-2": NamedDataset(
        hub_id="nvidia/OpenMathInstruct-2",
        train_split="train_1M",
        carve_validation=0.05,
        fields="openmath_answer",
        algorithm="any",
    ),
    # NeMo RL v0.5's SFT-only name of the same set (output_key: generated_solution).
    "openmathinstruct2": NamedDataset(
        hub_id="nvidia/OpenMathInstruct-2",
        train_split="train_1M",
        carve_validation=0.05,
        fields="openmath_solution",
        algorithm="sft",
    ),
    "DeepScaler": NamedDataset(
        hub_id="agentica-org/DeepScaleR-Preview-Dataset", validation_set="AIME2024"
    ),
    "DAPOMath17K": NamedDataset(
        hub_id="BytedTsinghua-SIA/DAPO-Math-17k",
        validation_set="DAPOMathAIME2024",
        fields="dapo",
    ),
    "DAPOMathAIME2024": NamedDataset(hub_id="BytedTsinghua-SIA/AIME-2024", fields="dapo"),
    "AIME2024": NamedDataset(hub_id="HuggingFaceH4/aime_2024", repeat_validation=16),
    "gsm8k": NamedDataset(
        hub_id="openai/gsm8k", config_name="main", validation_split="test", fields="gsm8k"
    ),
    "squad": NamedDataset(
        hub_id="rajpurkar/squad", validation_split="validation", fields="squad", algorithm="sft"
    ),
    "tulu3_sft_mixture": NamedDataset(
        hub_id="allenai/tulu-3-sft-mixture",
        carve_validation=0.05,
        fields="messages",
        algorithm="sft",
        reads_max_samples=True,
    ),
    "Nemotron-Cascade-2-SFT-Math": NamedDataset(
        hub_id="nvidia/Nemotron-Cascade-2-SFT-Data",
        config_name="math",
        carve_validation=0.05,
        fields="messages",
        algorithm="sft",
        reads_max_samples=True,
    ),
    # A local JSONL/JSON/parquet file or folder with input_key/output_key columns.
    "ResponseDataset": NamedDataset(hub_id="", fields="input_output", algorithm="any"),
}

PROCESSORS = {
    "default": "grpo",
    "math_hf_data_processor": "grpo",
    "math_data_processor": "grpo",
    "sft_processor": "sft",
}


def names_for(algorithm: str) -> list[str]:
    """The named sets a recipe of ``algorithm`` ('grpo' or 'sft') may use."""
    return [name for name, named in NAMED_DATASETS.items() if named.algorithm in ("any", algorithm)]


def effective(recipe: Recipe, which: str) -> DatasetCfg | None:
    """The first of ``effective_all``'s sections (None: none)."""
    sections = effective_all(recipe, which)
    return sections[0][1] if sections else None


def effective_all(recipe: Recipe, which: str) -> list[tuple[str, DatasetCfg]]:
    """``data.train`` / ``data.validation``, each of its sets (one, or the list NeMo RL
    concatenates) with ``data.default`` filling unset keys, beside its key path; the older
    flat form (``data.dataset_name``) as one train section."""
    data = recipe.data
    section = getattr(data, which)
    path = f"data.{which}"
    if section is None and which == "train" and data.dataset_name is not None:
        section = DatasetCfg(
            dataset_name=data.dataset_name,
            split=data.split,
            prompt_file=data.prompt_file,
            system_prompt_file=data.system_prompt_file,
            seed=data.seed,
            output_key=data.output_key,
            env_name=data.env_name,
        )
        path = "data"
    if section is None:
        return []
    if isinstance(section, DatasetCfg):
        return [(path, _with_default(section, data.default))]
    return [(f"{path}[{i}]", _with_default(one, data.default)) for i, one in enumerate(section)]


def _with_default(section: DatasetCfg, default: DatasetCfg | None) -> DatasetCfg:
    default = default or DatasetCfg()
    merged = {
        field.name: getattr(section, field.name)
        if getattr(section, field.name) is not None
        else getattr(default, field.name)
        for field in attrs.fields(DatasetCfg)
    }
    return DatasetCfg(**merged)


def _resolved(recipe: Recipe, which: str) -> DatasetCfg | tuple[DatasetCfg, ...] | None:
    sections = [section for _, section in effective_all(recipe, which)]
    if isinstance(getattr(recipe.data, which), tuple):
        return tuple(sections)
    return sections[0] if sections else None


def resolve_data_sections(recipe: Recipe) -> Recipe:
    """``recipe`` as the plan hands it to the job: ``data.train`` and ``data.validation`` hold
    their ``effective_all`` sections (a list stays a list), and ``data.default`` and the
    older flat keys, merged into them, are unset, so the job reads each section as it is and
    never merges again."""
    data = attrs.evolve(
        recipe.data,
        train=_resolved(recipe, "train"),
        validation=_resolved(recipe, "validation"),
        default=None,
        dataset_name=None,
        split=None,
        prompt_file=None,
        system_prompt_file=None,
        seed=None,
        output_key=None,
    )
    return attrs.evolve(recipe, data=data)


def rule_data_source(recipe: Recipe) -> list[Problem]:
    """Exactly one training source: ``data.train_path`` or a named/local NeMo RL set."""
    train = effective_all(recipe, "train")
    if (recipe.data.train_path is None) != (not train):
        return []
    both = recipe.data.train_path is not None
    return [
        Problem(
            path="data.train_path" if both else "data",
            message="both data.train_path and a NeMo RL data set (data.train / "
            "data.dataset_name) are given"
            if both
            else "no training data is given",
            fix="keep one: data.train_path: <file.jsonl>, or data.train.dataset_name: <name> "
            f"(one of {', '.join(NAMED_DATASETS)})",
        )
    ]


def rule_named_sets(recipe: Recipe) -> list[Problem]:
    problems = []
    for which in ("train", "validation"):
        for path, section in effective_all(recipe, which):
            problems += _section_problems(recipe, section, path)
    return problems


def _section_problems(recipe: Recipe, section: DatasetCfg, path: str) -> list[Problem]:
    name = section.dataset_name or ("ResponseDataset" if section.data_path else None)
    if name not in NAMED_DATASETS:
        close = difflib.get_close_matches(str(name), list(NAMED_DATASETS), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return [
            Problem(
                path=f"{path}.dataset_name",
                value=name,
                message="not a data set hpcrl loads",
                fix=f"{hint}use one of: {', '.join(NAMED_DATASETS)} (ResponseDataset: a local "
                "file given as data_path)",
            )
        ]
    problems = []
    if name == "ResponseDataset" and section.data_path is None:
        problems.append(
            Problem(
                path=f"{path}.data_path",
                message="ResponseDataset reads a local file",
                fix=f"set {path}.data_path to a .jsonl/.json/.parquet file or folder",
            )
        )
    problems += _processor_problems(recipe, section, path, NAMED_DATASETS[name])
    if section.repeat is not None and section.repeat < 1:
        problems.append(
            Problem(
                path=f"{path}.repeat",
                value=section.repeat,
                message="must be at least 1 (how many times the set's rows are used)",
                fix=f"set {path}.repeat=1, or remove it",
            )
        )
    problems += _max_samples_problems(section, path, name)
    for key in ("prompt_file", "system_prompt_file", "data_path"):
        value = getattr(section, key)
        if value is not None and not Path(value).exists():
            problems.append(
                Problem(
                    path=f"{path}.{key}",
                    value=value,
                    message="no such file (looked beside the recipe, in the folders above it "
                    "and in the current directory)",
                    fix="give an absolute path, or one relative to the recipe's folder",
                )
            )
    return problems


def _max_samples_problems(section: DatasetCfg, path: str, name: str) -> list[Problem]:
    """NeMo RL cuts rows only in the loaders that read max_samples; the others take it as a
    spare keyword and load every row, so a cap there would not be what NeMo RL does."""
    if section.max_samples is None or NAMED_DATASETS[name].reads_max_samples:
        return []
    readers = [n for n, named in NAMED_DATASETS.items() if named.reads_max_samples]
    return [
        Problem(
            path=f"{path}.max_samples",
            value=section.max_samples,
            message=f"NeMo RL's loader of {name} does not read max_samples (it loads every "
            f"row); of the sets hpcrl loads, only {', '.join(readers)} take a subset",
            fix=f"remove {path}.max_samples",
        )
    ]


def _processor_problems(
    recipe: Recipe, section: DatasetCfg, path: str, named: NamedDataset
) -> list[Problem]:
    problems = []
    processor = section.processor
    if processor is not None and processor not in PROCESSORS:
        problems.append(
            Problem(
                path=f"{path}.processor",
                value=processor,
                message="not a processor hpcrl implements",
                fix=f"use one of: {', '.join(PROCESSORS)}",
            )
        )
    if named.algorithm not in ("any", recipe.algorithm):
        problems.append(
            Problem(
                path=f"{path}.dataset_name",
                value=section.dataset_name,
                message=f"a data set for {named.algorithm.upper()}, but this recipe trains "
                f"{recipe.algorithm.upper()}",
                fix=f"pick a data set hpcrl loads for {recipe.algorithm.upper()}: "
                f"{', '.join(names_for(recipe.algorithm))} (docs/algorithms.md, data sets)",
            )
        )
    if section.env_name not in (None, *ENV_NAMES):
        problems.append(
            Problem(
                path=f"{path}.env_name",
                value=section.env_name,
                message=f"hpcrl has NeMo RL's {', '.join(ENV_NAMES)} environments only",
                fix=f"set {path}.env_name: math (math_multi_reward for GDPO's rewards, "
                "reward_model to score with env.reward_model's model)",
            )
        )
    return problems


#: NeMo RL's environments hpcrl runs (hpcrl.core.environments.build).
ENV_NAMES = ("math", "math_multi_reward", "reward_model")


def _env_names(recipe: Recipe) -> dict[str, str]:
    """The environment each data section names (unset: math), by key path."""
    return {
        path: section.env_name or "math"
        for which in ("train", "validation")
        for path, section in effective_all(recipe, which)
    }


def data_env_name(recipe: Recipe) -> str:
    """The run's environment: the one the data sets name other than math
    (``rule_one_env_name`` refuses a mix), else ``env.name``."""
    names = sorted(set(_env_names(recipe).values()) - {"math"})
    return names[0] if names else recipe.env.name


def rule_one_env_name(recipe: Recipe) -> list[Problem]:
    """One environment scores every rollout: NeMo RL routes each data set to its own, hpcrl
    builds one per run, so the data sets must agree (``math_multi_reward`` or
    ``reward_model`` beside ``math`` is a mix)."""
    names = _env_names(recipe)
    known = set(names.values()) & set(ENV_NAMES)
    if len(known) < 2:
        return []
    chosen = sorted(known - {"math"})[0]
    path, name = next((p, n) for p, n in names.items() if n != chosen and n in ENV_NAMES)
    return [
        Problem(
            path=f"{path}.env_name",
            value=name,
            message=f"other data sets of this recipe name {chosen}; hpcrl scores all of a "
            "run's rollouts with one environment",
            fix=f"set {path}.env_name: {chosen}, or every env_name to {name}",
        )
    ]


DATA_RULES = (rule_data_source, rule_named_sets, rule_one_env_name)

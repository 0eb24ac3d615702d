"""NeMo RL's data sets by name load from local copies in the hub's own format (built here:
nothing comes from a hub), with NeMo RL's prompt template, validation pairing and chat
rendering. The loader reads the recipe as the plan hands it over (``planned``: data.default
and the flat data.* keys merged into data.train/validation by ``resolve_data_sections``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.config import structure_recipe
from hpcrl.config.datasets import resolve_data_sections
from hpcrl.config.recipe import Recipe
from hpcrl.config.rules import check_recipe
from hpcrl.core.data.named import load_named_rows
from tests.recipe_builder import base_dict, with_keys

COT = "Think step by step and put the answer in \\boxed{{}}.\n{}\n"
CHAT = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def write_parquet(folder: Path, split: str, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "data" / f"{split}-00000-of-00001.parquet")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from hpcrl.core.models.tiny import ensure_tiny_model
    from hpcrl.core.models.tokenizer import load_tokenizer

    path = ensure_tiny_model("tiny:qwen2", cache_dir=str(tmp_path_factory.mktemp("models")))
    tok = load_tokenizer(path)
    tok.chat_template = CHAT
    return tok


@pytest.fixture
def openmath(tmp_path) -> Path:
    rows = [
        {"problem": f"What is {i} + {i}?", "generated_solution": f"It is \\boxed{{{2 * i}}}.",
         "expected_answer": str(2 * i), "problem_source": "synthetic"}
        for i in range(40)
    ]  # fmt: skip
    write_parquet(tmp_path / "OpenMathInstruct-2", "train_1M", rows)
    (tmp_path / "cot.txt").write_text(COT)
    return tmp_path


def grpo_recipe(**dotted):
    data = base_dict("automodel")
    del data["data"]
    return structure_recipe(with_keys(data, **dotted))


def planned(recipe: Recipe) -> Recipe:
    """The recipe as JobSpec.recipe carries it (the planner's own step)."""
    return resolve_data_sections(recipe)


def test_openmathinstruct2_with_prompt_file_and_carved_validation(openmath, tokenizer):
    recipe = grpo_recipe(
        data__train={
            "dataset_name": "OpenMathInstruct-2",
            "data_path": str(openmath / "OpenMathInstruct-2"),
            "split_validation_size": 0.25,
        },
        data__default={
            "prompt_file": str(openmath / "cot.txt"),
            "processor": "math_hf_data_processor",
        },
    )
    assert check_recipe(recipe) == []
    train = load_named_rows(planned(recipe), tokenizer, "train")
    val = load_named_rows(planned(recipe), tokenizer, "validation")
    assert (len(train), len(val)) == (30, 10)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    row = train[0]
    problem = row["prompt"].split("\n")[1]
    assert row["prompt"] == COT.format(problem)
    assert row["answer"] == str(2 * int(problem.split()[2]))
    rendered = f"<user>{row['prompt']}</user><assistant>"
    assert row["prompt_ids"] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    # Same seed, same split: a resumed or repeated run sees the same rows.
    assert [r["prompt"] for r in load_named_rows(planned(recipe), tokenizer, "train")] == [
        r["prompt"] for r in train
    ]


def test_flat_output_key_picks_the_sft_target_column():
    from hpcrl.core.data.named import to_messages

    recipe = grpo_recipe(data__dataset_name="OpenMathInstruct-2", data__output_key="alt")
    section = planned(recipe).data.train
    assert section is not None
    row = {"problem": "1 + 1?", "generated_solution": "two", "alt": "2"}
    assert to_messages("openmath_solution", row, section)[-1]["content"] == "2"


def test_an_unplanned_recipe_is_refused_not_read_without_its_defaults(openmath, tokenizer):
    """data.default's prompt template reaches the rows through the plan; a recipe that did
    not go through it would silently lose it, so the loader refuses one."""
    recipe = grpo_recipe(
        data__train={
            "dataset_name": "OpenMathInstruct-2",
            "data_path": str(openmath / "OpenMathInstruct-2"),
        },
        data__default={"prompt_file": str(openmath / "cot.txt")},
    )
    with pytest.raises(AssertionError, match="resolve_data_sections"):
        load_named_rows(recipe, tokenizer, "train")
    (first, *_) = load_named_rows(planned(recipe), tokenizer, "train")
    assert first["prompt"].startswith("Think step by step")


def test_dapo_and_gsm8k_row_formats(tmp_path, tokenizer):
    dapo = [{"prompt": [{"role": "user", "content": "Find x."}],
             "reward_model": {"ground_truth": "42", "style": "rule"}}]  # fmt: skip
    write_parquet(tmp_path / "dapo", "train", dapo)
    recipe = grpo_recipe(
        data__train={"dataset_name": "DAPOMath17K", "data_path": str(tmp_path / "dapo")}
    )
    (row,) = load_named_rows(planned(recipe), tokenizer, "train")
    assert (row["prompt"], row["answer"]) == ("Find x.", "42")
    gsm = [{"question": "Two apples and one more?", "answer": "2 + 1 = 3\n#### 3"}]
    write_parquet(tmp_path / "gsm", "train", gsm)
    write_parquet(tmp_path / "gsm", "test", gsm)
    recipe = grpo_recipe(data__train={"dataset_name": "gsm8k", "data_path": str(tmp_path / "gsm")})
    (row,) = load_named_rows(planned(recipe), tokenizer, "validation")  # gsm8k's test split
    assert row["answer"] == "3"


def test_response_dataset_from_a_local_jsonl(tmp_path, tokenizer):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"q{i}", "final": f"{i}"}) for i in range(3)))
    recipe = grpo_recipe(
        data__train={
            "dataset_name": "ResponseDataset",
            "data_path": str(path),
            "input_key": "question",
            "output_key": "final",
        }  # fmt: skip
    )
    assert [(r["prompt"], r["answer"]) for r in load_named_rows(planned(recipe), tokenizer, "train")] == [
        ("q0", "0"), ("q1", "1"), ("q2", "2")
    ]  # fmt: skip


def test_squad_sft_masks_only_the_answer(tmp_path, tokenizer):
    squad = [{"id": "1", "title": "t", "context": "Paris is in France.", "question": "Where?",
              "answers": {"text": ["France"], "answer_start": [12]}}]  # fmt: skip
    write_parquet(tmp_path / "squad", "train", squad)
    data = base_dict("automodel", "sft")
    del data["data"]
    recipe = structure_recipe(
        with_keys(data, data__train={"dataset_name": "squad", "data_path": str(tmp_path / "squad")})
    )
    assert check_recipe(recipe) == []
    (row,) = load_named_rows(planned(recipe), tokenizer, "train")
    ids, mask = row["input_ids"], row["token_mask"]
    answer = [t for t, m in zip(ids, mask, strict=True) if m == 1.0]
    text = tokenizer.decode(answer)
    # The assistant turn as the template renders it (header included, as NeMo RL's message
    # log does), then EOS; nothing of the context or question.
    assert text == "<assistant>France</assistant>" + tokenizer.eos_token
    assert "Paris" in tokenizer.decode(ids)


def test_unknown_names_and_missing_files_are_load_errors(tmp_path):
    recipe = grpo_recipe(
        data__train={"dataset_name": "OpenMathInstruct2"},
        data__default={"prompt_file": str(tmp_path / "nope.txt"), "processor": "my_processor"},
    )
    problems = {p.path: p for p in check_recipe(recipe)}
    assert "did you mean OpenMathInstruct-2?" in problems["data.train.dataset_name"].fix
    recipe = grpo_recipe(
        data__train={"dataset_name": "gsm8k"},
        data__default={"prompt_file": str(tmp_path / "nope.txt"), "processor": "my_processor"},
    )
    assert {p.path for p in check_recipe(recipe)} == {
        "data.train.prompt_file",
        "data.train.processor",
    }


def test_exactly_one_training_source():
    recipe = grpo_recipe()
    (problem,) = check_recipe(recipe)
    assert problem.path == "data" and "no training data" in problem.message
    both = grpo_recipe(data__train_path="/x.jsonl", data__dataset_name="gsm8k")
    assert [p.path for p in check_recipe(both)] == ["data.train_path"]


def test_dataset_missing_offline_names_the_cache(tokenizer, monkeypatch, tmp_path):
    from hpcrl.core.data.named import DatasetUnavailable

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    recipe = grpo_recipe(data__train={"dataset_name": "DeepScaler"})
    with pytest.raises(DatasetUnavailable, match="agentica-org/DeepScaleR-Preview-Dataset"):
        load_named_rows(planned(recipe), tokenizer, "train")


def test_max_samples_takes_a_seeded_subset_before_validation_is_carved(tmp_path, tokenizer):
    """NeMo RL's tulu3 / Nemotron-Cascade loaders: shuffle with the seed, keep the first
    max_samples rows, then hold out split_validation_size of those."""
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(40)
    ]  # fmt: skip
    path = tmp_path / "tulu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = base_dict("automodel", "sft")
    del data["data"]

    def loaded(**section) -> tuple[list, list]:
        train = {"dataset_name": "tulu3_sft_mixture", "data_path": str(path), **section}
        recipe = structure_recipe(with_keys(data, data__train=train))
        assert check_recipe(recipe) == []
        return (
            load_named_rows(planned(recipe), tokenizer, "train"),
            load_named_rows(planned(recipe), tokenizer, "validation"),
        )

    def users(rows: list) -> set[str]:
        return {
            tokenizer.decode(r["input_ids"]).split("<user>")[1].split("</user>")[0] for r in rows
        }

    train, val = loaded(max_samples=10, split_validation_size=0.2, seed=42)
    assert (len(train), len(val)) == (8, 2)
    kept = users(train) | users(val)
    assert len(kept) == 10 and kept != {f"q{i}" for i in range(10)}  # a random subset
    again, _ = loaded(max_samples=10, split_validation_size=0.2, seed=42)
    assert users(again) == users(train)
    other_train, other_val = loaded(max_samples=10, split_validation_size=0.2, seed=7)
    assert users(other_train) | users(other_val) != kept
    whole_train, whole_val = loaded(max_samples=0, split_validation_size=0.2)  # NeMo RL: no cap
    assert (len(whole_train), len(whole_val)) == (32, 8)


def test_max_samples_on_a_set_whose_nemo_rl_loader_ignores_it_is_refused():
    recipe = grpo_recipe(data__train={"dataset_name": "DeepScaler", "max_samples": 100})
    (problem,) = check_recipe(recipe)
    assert problem.path == "data.train.max_samples"
    assert "NeMo RL's loader of DeepScaler does not read max_samples" in problem.message
    assert "tulu3_sft_mixture, Nemotron-Cascade-2-SFT-Math" in problem.message


def test_lists_of_sets_concatenate_as_nemo_rl_does(openmath, tokenizer, tmp_path):
    """NeMo RL's data.train / data.validation lists: training rows are each set's training
    part in order, each templated by its own section (data.default filling the rest);
    validation rows are each training set's held-out part, then each listed validation set
    (its repeat applied)."""
    for name, count in (("extra", 3), ("val_a", 2), ("val_b", 1)):
        lines = [json.dumps({"input": f"{name} {i}", "output": str(i)}) for i in range(count)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines))
    (tmp_path / "plain.txt").write_text("Plainly: {}")
    recipe = grpo_recipe(
        data__train=[
            {"dataset_name": "OpenMathInstruct-2", "data_path": str(openmath / "OpenMathInstruct-2"),
             "split_validation_size": 0.25},
            {"dataset_name": "ResponseDataset", "data_path": str(tmp_path / "extra.jsonl"),
             "prompt_file": str(tmp_path / "plain.txt")},
        ],
        data__validation=[
            {"dataset_name": "ResponseDataset", "data_path": str(tmp_path / "val_a.jsonl"), "repeat": 2},
            {"dataset_name": "ResponseDataset", "data_path": str(tmp_path / "val_b.jsonl")},
        ],
        data__default={"prompt_file": str(openmath / "cot.txt")},
    )  # fmt: skip
    assert check_recipe(recipe) == []
    train = load_named_rows(planned(recipe), tokenizer, "train")
    val = load_named_rows(planned(recipe), tokenizer, "validation")
    assert len(train) == 30 + 3
    assert all(r["prompt"].startswith("Think step by step") for r in train[:30])
    assert [r["prompt"] for r in train[30:]] == [f"Plainly: extra {i}" for i in range(3)]
    assert len(val) == 10 + 2 * 2 + 1
    held_out = {r["prompt"] for r in val[:10]}
    assert not held_out & {r["prompt"] for r in train[:30]}  # the first set's held-out part
    assert [r["prompt"].split("\n")[1] for r in val[10:]] == [
        "val_a 0", "val_a 1", "val_a 0", "val_a 1", "val_b 0"
    ]  # fmt: skip
    assert [r["answer"] for r in val[10:]] == ["0", "1", "0", "1", "0"]

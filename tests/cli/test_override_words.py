"""Overrides on the command line: every form in any position, and the mistakes argparse
answered with its usage line (issue 26 item 9, issue 24 item 2): ``key`` without ``=``,
``key = value``, ``--key=value``; "did you mean" over leaf names; a misspelled key in a sweep
is one problem, not one per point."""

from __future__ import annotations

import pytest

from hpcrl.cli.main import main
from tests.plan.planning_inputs import isolate_from_user_profiles

RECIPE = "grpo-tiny-1n-cpu"  # sets grpo.max_num_steps itself; grpo.seed only by its base


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")


def _validate(capsys, *words: str) -> tuple[int, str]:
    code = main(["validate", *words])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


@pytest.mark.parametrize(
    "override",
    ["~grpo.max_num_steps", "~grpo.max_num_steps=20", "grpo.seed=3", "+grpo.new_key=1",
     "++grpo.seed=4"],
)  # fmt: skip
@pytest.mark.parametrize("position", ["before --cluster", "after --cluster"])
def test_every_override_form_reaches_the_override_parser_in_any_position(
    capsys, override, position
):
    words = (
        [RECIPE, override, "--cluster", "local"]
        if position == "before --cluster"
        else [RECIPE, "--cluster", "local", override]
    )
    code, text = _validate(capsys, *words)
    if override.startswith("+grpo.new_key"):  # parsed, applied, refused by the schema
        assert (
            code == 2 and "override names a key that does not exist ('new_key' under grpo)" in text
        )
    else:
        assert code == 0, text
        assert "OK: grpo-tiny-1n-cpu plans on local" in text


def test_a_deletion_after_the_options_is_applied_not_an_argparse_error(capsys):
    code, text = _validate(capsys, RECIPE, "--cluster", "local", "~grpo.no_such_key")
    assert code == 2
    assert "~ deletes a key, but the config does not set it" in text
    assert "usage:" not in text


@pytest.mark.parametrize(
    "words, shown, fix",
    [
        (["grpo.seed", "5"], "'grpo.seed 5'", "fix: write grpo.seed=5 (no spaces around '=')"),
        (["grpo.seed", "=", "5"], "'grpo.seed = 5'", "fix: write grpo.seed=5 (no spaces around '=')"),
        (["grpo.seed", "=5"], "'grpo.seed =5'", "fix: write grpo.seed=5 (no spaces around '=')"),
        (["grpo.seed"], "'grpo.seed'", "fix: write grpo.seed=VALUE (or ~grpo.seed to delete the key)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("position", ["before --cluster", "after --cluster"])
def test_a_key_without_equals_says_what_is_wrong_and_the_form_to_use(
    capsys, words, shown, fix, position
):
    argv = (
        [RECIPE, *words, "--cluster", "local"]
        if position == "before --cluster"
        else [RECIPE, "--cluster", "local", *words]
    )
    code, text = _validate(capsys, *argv)
    assert code == 2
    assert text == (
        f"error <override> = {shown} 'grpo.seed' has no '=': an override is KEY=VALUE, one word "
        f"{fix} 1 error, 0 warnings"
    )


@pytest.mark.parametrize("word, fix", [("--grpo.seed=3", "grpo.seed=3"),
                                       ("--grpo.seed", "grpo.seed=VALUE")])  # fmt: skip
def test_an_override_written_as_an_option_says_to_drop_the_dashes(capsys, word, fix):
    code, text = _validate(capsys, RECIPE, "--cluster", "local", word)
    assert code == 2
    assert text == (
        f"error <override> = '{word}' {word} is not an option of hpcrl validate: overrides have "
        f"no dashes fix: write {fix} 1 error, 0 warnings"
    )


def test_a_real_stray_option_is_still_argparses_error(capsys):
    with pytest.raises(SystemExit):
        main(["validate", RECIPE, "--cluster", "local", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, fix",
    [
        ("policy.lr=1e-5", "did you mean policy.optimizer.kwargs.lr or policy.megatron_cfg.optimizer.lr?"),
        ("policy.weight_decay=0.1", "did you mean policy.optimizer.kwargs.weight_decay or "
         "policy.megatron_cfg.optimizer.weight_decay?"),
        ("policy.megatron_cfg.lr=1e-5", "did you mean policy.megatron_cfg.optimizer.lr?"),
        ("grpo.max_steps=3", "did you mean grpo.max_num_steps?"),  # a sibling's name first
    ],
)  # fmt: skip
def test_did_you_mean_looks_at_leaf_names_below_the_parent(capsys, override, fix):
    code, text = _validate(capsys, RECIPE, "--cluster", "local", override)
    assert code == 2
    assert f"fix: {fix} 1 error" in text


def test_a_leaf_name_in_a_recipe_file_gets_the_same_suggestion(capsys, tmp_path):
    (tmp_path / "mine.yaml").write_text(f"defaults: {RECIPE}\npolicy:\n  lr: 1.0e-5\n")
    code, text = _validate(capsys, str(tmp_path / "mine.yaml"), "--cluster", "local")
    assert code == 2
    assert (
        "error policy.lr = 1e-05 unknown key 'lr' fix: did you mean policy.optimizer.kwargs.lr or "
        "policy.megatron_cfg.optimizer.lr?" in text
    )


def test_a_misspelled_key_in_a_sweep_is_reported_once(capsys):
    code = main(["sweep", RECIPE, "--cluster", "local", "--grid", "grpo.seed=1,2,3",
                 "policy.lr=1e-5", "--no-submit"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert err == (
        "error policy.lr = 'policy.lr=1e-5' override names a key that does not exist ('lr' under "
        "policy) fix: did you mean policy.optimizer.kwargs.lr or "
        "policy.megatron_cfg.optimizer.lr? 1 error, 0 warnings"
    )

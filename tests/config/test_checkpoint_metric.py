"""checkpointing.metric_name: the names NeMo RL's own configs use in every supported release
are ones hpcrl records; a name nothing records is refused when the recipe loads (NeMo RL
stops at its first save), with the names that work."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError
from hpcrl.config.checkpoint_metrics import record_key
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl, nemo_rl_resolved
from tests.recipe_builder import problems_for

PATH = "checkpointing.metric_name"
GRPO_NAMES = ", ".join(
    [
        "val:accuracy",
        "val:avg_length",
        *(
            f"train:{name}"
            for name in (
                "loss reward grad_norm lr token_mult_prob_error gen_kl_error policy_kl_error "
                "js_divergence_error approx_entropy probs_ratio probs_ratio_clamped "
                "probs_ratio_min probs_ratio_max probs_ratio_clamped_min probs_ratio_clamped_max"
            ).split()
        ),
    ]
)


@pytest.mark.parametrize("release", ["v0.5.0", "v0.7.0", "main-7ea279a"])
@pytest.mark.parametrize(
    "relative, algorithm, key",
    [("grpo_math_1B.yaml", "grpo", "val_reward_mean"), ("sft.yaml", "sft", "val_loss")],
)
def test_nemo_rl_default_metric_names_are_recorded(release, relative, algorithm, key):
    checkpointing = nemo_rl_resolved(config_path(relative, release), release)["checkpointing"]
    name = checkpointing["metric_name"]
    assert record_key(algorithm, name) == key
    rules = problems_for(
        "automodel",
        algorithm,
        checkpointing={"enabled": True, "metric_name": name, "keep_top_k": 3, "save_period": 10},
        **{f"{algorithm}__val_period": 10},
    )
    assert rules == []


def test_grpo_math_1b_keeps_by_validation_accuracy():
    checkpointing = load_as_hpcrl(config_path("grpo_math_1B.yaml")).recipe.checkpointing
    assert (checkpointing.metric_name, checkpointing.higher_is_better) == ("val:accuracy", True)
    assert record_key("grpo", checkpointing.metric_name) == "val_reward_mean"


def refusal(relative: str, name: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_as_hpcrl(config_path(relative), [f"{PATH}={name}"])
    (problem,) = [p for p in caught.value.errors if p.path == PATH]
    return problem.format()


def test_a_name_hpcrl_does_not_record_is_refused():
    # val:reward: NeMo RL's disabled helpsteer3 recipe (its reward-model environment).
    assert refusal("grpo_math_1B.yaml", "val:reward") == (
        f"error: {PATH} = 'val:reward': hpcrl's GRPO records no val metric 'reward', so no "
        "checkpoint could be ranked by it\n"
        f"  fix: use one it records: {GRPO_NAMES}"
    )
    assert refusal("sft.yaml", "val:accuracy").endswith(
        "  fix: use one it records: val:val_loss, train:loss, train:grad_norm, train:lr"
    )


def test_the_old_unprefixed_form_is_refused_with_the_new_name():
    assert refusal("grpo_math_1B.yaml", "val_reward") == (
        f"error: {PATH} = 'val_reward': NeMo RL's metric names start with val: (a validation "
        "metric) or train: (a training metric); NeMo RL stops at its first save without one\n"
        f"  fix: write {PATH}: 'val:accuracy' ({GRPO_NAMES})"
    )


def test_a_metric_no_step_records_warns_that_the_newest_are_kept():
    loaded = load_as_hpcrl(
        config_path("grpo_smoke.yaml"),
        ["checkpointing.enabled=true", "checkpointing.keep_top_k=2"],
    )
    (warning,) = [w for w in loaded.warnings if w.path == PATH]
    assert warning.format() == (
        f"warning: {PATH} = 'val:accuracy': grpo.val_period is -1: no step validates, so no "
        "checkpoint has val:accuracy and keep_top_k keeps the newest, as NeMo RL does\n"
        "  fix: set grpo.val_period to a divisor of checkpointing.save_period (10)"
    )


def test_not_read_while_checkpointing_is_off():
    assert problems_for(checkpointing={"enabled": False, "metric_name": "bogus"}) == []

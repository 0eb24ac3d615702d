"""Recipe rules about GRPO's reference model (``hpcrl.config.grpo_option_rules``)."""

from __future__ import annotations

from tests.recipe_builder import only, problems_for


def test_a_host_reference_without_a_reference_model_is_a_warning():
    """``reference_on_host`` places a model only GRPO's KL term builds: under SFT or a zero
    penalty it is flagged (a warning naming why), and with the penalty it is silent."""
    on = {"policy__automodel_cfg__reference_on_host": True}
    assert problems_for("automodel", "grpo", **on) == []
    for algorithm, penalty, why in (
        ("sft", 0.01, "SFT builds"),
        ("grpo", 0.0, "loss_fn.reference_policy_kl_penalty = 0 builds"),
    ):
        found = problems_for(
            "automodel", algorithm, loss_fn__reference_policy_kl_penalty=penalty, **on
        )
        warning = only(found, "warning")
        assert warning.format() == (
            "warning: policy.automodel_cfg.reference_on_host = True: has no effect: "
            f"{why} no reference model\n"
            "  fix: remove policy.automodel_cfg.reference_on_host, or give GRPO a KL penalty "
            "(e.g. loss_fn.reference_policy_kl_penalty=0.01)"
        )

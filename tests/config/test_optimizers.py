"""NeMo RL's ``policy.optimizer`` (class path + kwargs) and ``policy.scheduler`` (a list of
torch schedulers with milestones) load as NeMo RL writes them; mistakes name their key."""

from hpcrl.config import structure_recipe
from tests.recipe_builder import TE_FUSED_ADAM, base_dict, paths, problems_for, with_keys

NEMO_RL_OPTIMIZER = {
    "name": "torch.optim.AdamW",
    "kwargs": {
        "lr": 5.0e-6,
        "weight_decay": 0.01,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "foreach": False,
        "fused": False,
    },
}
NEMO_RL_SCHEDULER = [
    {
        "name": "torch.optim.lr_scheduler.LinearLR",
        "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 50},
    },
    {
        "name": "torch.optim.lr_scheduler.ConstantLR",
        "kwargs": {"factor": 1.0, "total_iters": 10000000000},
    },
    {"milestones": [50]},
]


def automodel(**dotted):
    return problems_for("automodel", **dotted)


def test_nemo_rl_optimizer_and_scheduler_load_unchanged():
    data = with_keys(
        base_dict("automodel"),
        policy__optimizer=NEMO_RL_OPTIMIZER,
        policy__scheduler=NEMO_RL_SCHEDULER,
    )
    recipe = structure_recipe(data)
    assert automodel(policy__optimizer=NEMO_RL_OPTIMIZER, policy__scheduler=NEMO_RL_SCHEDULER) == []
    assert recipe.policy.optimizer.lr == 5.0e-6
    assert recipe.policy.optimizer.betas == (0.9, 0.999)
    assert [e.name for e in recipe.policy.scheduler] == [
        "torch.optim.lr_scheduler.LinearLR",
        "torch.optim.lr_scheduler.ConstantLR",
        None,
    ]
    assert recipe.policy.scheduler[2].milestones == (50,)


def test_single_scheduler_mapping_is_a_list_of_one():
    one = {"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 100}}
    recipe = structure_recipe(with_keys(base_dict("automodel"), policy__scheduler=one))
    assert len(recipe.policy.scheduler) == 1
    assert automodel(policy__scheduler=one) == []


def test_scheduler_null_is_a_constant_rate():
    recipe = structure_recipe(with_keys(base_dict("automodel"), policy__scheduler=None))
    assert recipe.policy.scheduler is None


def test_unknown_optimizer_class_lists_the_choices():
    (problem,) = automodel(policy__optimizer={"name": "torch.optim.AdamWW", "kwargs": {}})
    assert problem.path == "policy.optimizer.name"
    assert "did you mean torch.optim.AdamW?" in problem.fix


def test_misspelt_or_mistyped_kwargs_name_their_key():
    problems = automodel(
        policy__optimizer={
            "name": "torch.optim.AdamW",
            "kwargs": {"lr": -1.0, "weight_decy": 0.1, "betas": [0.9], "fused": "yes"},
        }
    )
    assert sorted(paths(problems)) == [
        "policy.optimizer.kwargs.betas",
        "policy.optimizer.kwargs.fused",
        "policy.optimizer.kwargs.lr",
        "policy.optimizer.kwargs.weight_decy",
    ]
    typo = next(p for p in problems if p.path.endswith("weight_decy"))
    assert "did you mean policy.optimizer.kwargs.weight_decay?" in typo.fix


def test_sgd_takes_momentum_adam_does_not():
    sgd = {"name": "torch.optim.SGD", "kwargs": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}
    assert automodel(policy__optimizer=sgd) == []
    adam = {"name": "torch.optim.Adam", "kwargs": {"lr": 0.1, "momentum": 0.9}}
    assert paths(automodel(policy__optimizer=adam)) == ["policy.optimizer.kwargs.momentum"]


def test_milestones_must_match_the_handovers():
    two = NEMO_RL_SCHEDULER[:2]
    (missing,) = automodel(policy__scheduler=two)
    assert missing.path == "policy.scheduler" and "exactly one milestones entry" in missing.message
    (count,) = automodel(policy__scheduler=[*two, {"milestones": [10, 20]}])
    assert count.path == "policy.scheduler[2].milestones"
    (order,) = automodel(policy__scheduler=[*two, NEMO_RL_SCHEDULER[0], {"milestones": [20, 10]}])
    assert "increasing" in order.message
    (lonely,) = automodel(policy__scheduler=[NEMO_RL_SCHEDULER[0], {"milestones": [5]}])
    assert lonely.path == "policy.scheduler[1].milestones"


def test_scheduler_entry_problems_name_their_index():
    problems = automodel(
        policy__scheduler=[
            {"name": "torch.optim.lr_scheduler.LambdaLR", "kwargs": {}},
            {"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"eta_min": 0}},
            {"milestones": [5]},
        ]
    )
    assert sorted(paths(problems)) == [
        "policy.scheduler[0].name",
        "policy.scheduler[1].kwargs.T_max",
    ]


def test_kwarg_ranges_name_their_key_and_skip_values_of_the_wrong_kind():
    optimizer = {
        "name": "torch.optim.AdamW",
        "kwargs": {"lr": 1e-5, "eps": 0.0, "weight_decay": -0.1, "betas": [0.9, 1.0]},
    }
    scheduler = [
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0, "total_iters": -1}},
        {"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 0, "eta_min": "x"}},
        {"milestones": [5]},
    ]  # fmt: skip
    problems = automodel(policy__optimizer=optimizer, policy__scheduler=scheduler)
    assert sorted(paths(problems)) == [
        "policy.optimizer.kwargs.betas[1]",
        "policy.optimizer.kwargs.eps",
        "policy.optimizer.kwargs.weight_decay",
        "policy.scheduler[0].kwargs.start_factor",
        "policy.scheduler[0].kwargs.total_iters",
        "policy.scheduler[1].kwargs.T_max",
        "policy.scheduler[1].kwargs.eta_min",  # reported once, as the wrong kind
    ]
    eta_min = next(p for p in problems if p.path.endswith("eta_min"))
    assert "finite number" in eta_min.message


def test_megatron_recipes_do_not_read_policy_optimizer():
    bad = {"name": "torch.optim.Lamb", "kwargs": {}}
    assert problems_for("megatron", policy__optimizer=bad) == []


def test_optimizer_null_is_for_megatron_recipes():
    assert problems_for("megatron", policy__optimizer=None) == []
    (problem,) = automodel(policy__optimizer=None)
    assert problem.path == "policy.optimizer" and "null" in problem.message


OFFLOAD = "policy.automodel_cfg.optimizer_offload_fraction"


def test_optimizer_offload_fraction_is_bounded_to_zero_one():
    assert automodel(policy__automodel_cfg__optimizer_offload_fraction=0.5) == []
    assert automodel(policy__automodel_cfg__optimizer_offload_fraction=1.0) == []
    for bad in (-0.1, 1.5):
        (problem,) = automodel(policy__automodel_cfg__optimizer_offload_fraction=bad)
        assert (problem.path, problem.value) == (OFFLOAD, bad)
        assert problem.message.startswith("must be in [0, 1]")
    # a Megatron recipe does not read it (its own key is megatron_cfg.optimizer's)
    assert problems_for("megatron", policy__automodel_cfg__optimizer_offload_fraction=2.0) == []


def test_optimizer_offload_needs_adam_without_fsdp_cpu_offload():
    sgd = {"name": "torch.optim.SGD", "kwargs": {"lr": 0.1}}
    problems = automodel(
        policy__automodel_cfg__optimizer_offload_fraction=0.5,
        policy__automodel_cfg__cpu_offload=True,
        policy__optimizer=sgd,
    )
    assert paths(problems) == [OFFLOAD, OFFLOAD]
    assert "torch.optim.SGD" in problems[0].message
    assert "cpu_offload=true" in problems[1].message
    capturable = {"name": "torch.optim.Adam", "kwargs": {"lr": 0.1, "capturable": True}}
    assert paths(
        automodel(
            policy__automodel_cfg__optimizer_offload_fraction=1.0, policy__optimizer=capturable
        )
    ) == ["policy.optimizer.kwargs.capturable"]
    # at 0 nothing is offloaded: nothing to refuse
    assert automodel(policy__automodel_cfg__cpu_offload=True, policy__optimizer=sgd) == []


def test_te_fused_adam_loads_as_nemo_rl_writes_it():
    assert automodel(policy__optimizer=TE_FUSED_ADAM) == []


def test_te_fused_adam_dtype_and_offload_mistakes_name_their_key():
    bad = {**TE_FUSED_ADAM, "kwargs": {"lr": 1e-6, "exp_avg_dtype": "bfloat16"}}
    (problem,) = automodel(policy__optimizer=bad)
    assert problem.path == "policy.optimizer.kwargs.exp_avg_dtype"
    assert "torch.bfloat16" in problem.fix
    problems = automodel(policy__optimizer=TE_FUSED_ADAM, policy__automodel_cfg__cpu_offload=True)
    assert [p.fix for p in problems if p.path == "policy.optimizer.name"] == [
        "set policy.optimizer.name=torch.optim.AdamW, or policy.automodel_cfg.cpu_offload=false"
    ]

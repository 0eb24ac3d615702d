"""NeMo RL's ``policy.optimizer`` and ``policy.scheduler`` (Automodel backend): which torch
classes hpcrl builds, which keyword arguments each takes, and the load-time rules.

NeMo RL imports any class path it is given; hpcrl builds only the classes below, whose
arguments it can check on the login node (no torch import here), so a typo in a kwarg is a
load error naming the key instead of a TypeError minutes into the job. The in-job builder
(``hpcrl.core.backends.automodel.optim``) reads the same tables.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import LrSchedulerCfg, Recipe

OPT = "policy.optimizer"
SCHED = "policy.scheduler"

# kwarg -> kind: "number" (int or float), "bool", "bool_or_null", "betas", "int", "ints"
_ADAM_KWARGS = {
    "lr": "number",
    "betas": "betas",
    "eps": "number",
    "weight_decay": "number",
    "amsgrad": "bool",
    "maximize": "bool",
    "foreach": "bool_or_null",
    "fused": "bool_or_null",
    "capturable": "bool",
    "differentiable": "bool",
}
OPTIMIZER_KWARGS: dict[str, dict[str, str]] = {
    "torch.optim.AdamW": _ADAM_KWARGS,
    "torch.optim.Adam": _ADAM_KWARGS,
    "torch.optim.SGD": {
        "lr": "number",
        "momentum": "number",
        "dampening": "number",
        "weight_decay": "number",
        "nesterov": "bool",
        "maximize": "bool",
        "foreach": "bool_or_null",
        "fused": "bool_or_null",
        "differentiable": "bool",
    },
}

#: Transformer Engine's fused Adam (NeMo RL's large Automodel recipes): built from the job
#: image's transformer_engine (CUDA only; NeMo RL's images carry it). Its state can be kept
#: in lower precision (exp_avg_dtype, ...: "torch.bfloat16" as NeMo RL writes it) and its
#: fp32 master weights kept by the optimizer (master_weights).
TE_FUSED_ADAM = "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam"
OPTIMIZER_KWARGS[TE_FUSED_ADAM] = {
    "lr": "number",
    "bias_correction": "bool",
    "betas": "betas",
    "eps": "number",
    "adam_w_mode": "bool",
    "weight_decay": "number",
    "set_grad_none": "bool_or_null",
    "capturable": "bool",
    "master_weights": "bool",
    "master_weight_dtype": "dtype",
    "exp_avg_dtype": "dtype",
    "exp_avg_sq_dtype": "dtype",
    "use_decoupled_grad": "bool",
    "store_param_remainders": "bool",
}
#: The dtypes a "dtype" kwarg may name (TE FusedAdam's state: fp32, fp16, bf16, fp8 as uint8).
DTYPE_NAMES = ("torch.float32", "torch.float16", "torch.bfloat16", "torch.uint8")

SCHEDULER_KWARGS: dict[str, dict[str, str]] = {
    "torch.optim.lr_scheduler.LinearLR": {
        "start_factor": "number",
        "end_factor": "number",
        "total_iters": "int",
    },
    "torch.optim.lr_scheduler.ConstantLR": {"factor": "number", "total_iters": "int"},
    "torch.optim.lr_scheduler.CosineAnnealingLR": {"T_max": "int", "eta_min": "number"},
    "torch.optim.lr_scheduler.StepLR": {"step_size": "int", "gamma": "number"},
    "torch.optim.lr_scheduler.MultiStepLR": {"milestones": "ints", "gamma": "number"},
    "torch.optim.lr_scheduler.ExponentialLR": {"gamma": "number"},
    "torch.optim.lr_scheduler.PolynomialLR": {"total_iters": "int", "power": "number"},
}
# Arguments a scheduler class requires (torch has no default for them).
SCHEDULER_REQUIRED = {
    "torch.optim.lr_scheduler.CosineAnnealingLR": ("T_max",),
    "torch.optim.lr_scheduler.StepLR": ("step_size",),
    "torch.optim.lr_scheduler.MultiStepLR": ("milestones",),
    "torch.optim.lr_scheduler.ExponentialLR": ("gamma",),
}


def class_name(path: str) -> str:
    """``torch.optim.AdamW`` -> ``AdamW`` (the attribute of its module)."""
    return path.rsplit(".", 1)[-1]


def _finite_number(value: Any) -> bool:
    # kwargs are free-form (dict[str, Any]), so the converter's NaN/inf check does not reach them
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _kind_problem(path: str, value: Any, kind: str) -> Problem | None:
    is_number = _finite_number(value)
    ok = {
        "number": is_number,
        "int": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "bool_or_null": value is None or isinstance(value, bool),
        "betas": isinstance(value, list | tuple)
        and len(value) == 2
        and all(_finite_number(b) for b in value),
        "ints": isinstance(value, list | tuple)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value),
        "dtype": value in DTYPE_NAMES,
    }[kind]
    if ok:
        return None
    wanted = {
        "number": "a finite number",
        "int": "a whole number",
        "bool": "true or false",
        "bool_or_null": "true, false or null",
        "betas": "a list of two finite numbers, e.g. [0.9, 0.999]",
        "ints": "a list of whole numbers",
        "dtype": f"one of {', '.join(DTYPE_NAMES)}",
    }[kind]
    return Problem(
        path=path, value=value, message=f"expected {wanted}", fix=f"set {path} to {wanted}"
    )


def kwargs_problems(
    path: str, kwargs: Mapping[str, Any], allowed: Mapping[str, str]
) -> list[Problem]:
    """Unknown keyword arguments and values of the wrong kind, each with its key path."""
    problems = []
    for key, value in kwargs.items():
        key_path = f"{path}.{key}"
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f"did you mean {path}.{close[0]}? " if close else ""
            problems.append(
                Problem(
                    path=key_path,
                    value=value,
                    message="not an argument hpcrl passes to this class",
                    fix=f"{hint}arguments accepted: {', '.join(sorted(allowed))}",
                )
            )
            continue
        problem = _kind_problem(key_path, value, allowed[key])
        if problem is not None:
            problems.append(problem)
    return problems


def _choice_problem(path: str, value: str, choices: list[str], what: str) -> Problem:
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]}? " if close else ""
    return Problem(
        path=path,
        value=value,
        message=f"{what} hpcrl does not build",
        fix=f"{hint}use one of: {', '.join(choices)}",
    )


def rule_optimizer(recipe: Recipe) -> list[Problem]:
    """``policy.optimizer.name`` is a class hpcrl builds; its kwargs exist and have the right
    kind; lr is positive. (Megatron reads ``policy.megatron_cfg.optimizer`` instead.)"""
    if recipe.policy.megatron_cfg.enabled:
        return []
    opt = recipe.policy.optimizer
    if opt is None:
        return [
            Problem(
                path=OPT,
                value=None,
                message="the Automodel backend trains with policy.optimizer, which is null",
                fix=f"give {OPT}: {{name: torch.optim.AdamW, kwargs: {{lr: 5.0e-6}}}} (null is "
                "for Megatron recipes, which use policy.megatron_cfg.optimizer)",
            )
        ]
    allowed = OPTIMIZER_KWARGS.get(opt.name)
    if allowed is None:
        return [_choice_problem(f"{OPT}.name", opt.name, list(OPTIMIZER_KWARGS), "an optimizer")]
    problems = kwargs_problems(f"{OPT}.kwargs", opt.kwargs, allowed)
    lr = opt.kwargs.get("lr")
    if isinstance(lr, int | float) and not isinstance(lr, bool) and lr <= 0:
        problems.append(
            Problem(
                path=f"{OPT}.kwargs.lr",
                value=lr,
                message="must be positive",
                fix=f"set {OPT}.kwargs.lr to a positive rate, e.g. 5.0e-6",
            )
        )
    return problems


def rule_scheduler(recipe: Recipe) -> list[Problem]:
    """NeMo RL's scheduler list: named entries with known kwargs, and exactly one
    ``milestones`` entry (n − 1 increasing positive steps) when there are n ≥ 2 of them; an
    empty one beside a single scheduler, as NeMo RL's recipes write it."""
    entries = recipe.policy.scheduler or ()
    if recipe.policy.megatron_cfg.enabled or not entries:
        return []
    problems: list[Problem] = []
    named = [(i, e) for i, e in enumerate(entries) if e.name is not None]
    marks = [(i, e) for i, e in enumerate(entries) if e.name is None]
    for index, entry in named:
        problems += _named_entry_problems(f"{SCHED}[{index}]", entry)
    for index, entry in marks:
        if entry.milestones is None or entry.kwargs:
            problems.append(
                Problem(
                    path=f"{SCHED}[{index}]",
                    message="an entry needs either name (+ kwargs) or milestones alone",
                    fix=f"write {SCHED}[{index}] as {{name: torch.optim.lr_scheduler.LinearLR, "
                    "kwargs: {...}} or {milestones: [50]}",
                )
            )
    problems += _milestone_problems(len(named), marks)
    return problems


def _named_entry_problems(path: str, entry: LrSchedulerCfg) -> list[Problem]:
    assert entry.name is not None
    allowed = SCHEDULER_KWARGS.get(entry.name)
    if allowed is None:
        choices = list(SCHEDULER_KWARGS)
        return [_choice_problem(f"{path}.name", entry.name, choices, "a scheduler")]
    problems = kwargs_problems(f"{path}.kwargs", entry.kwargs, allowed)
    if entry.milestones is not None:
        problems.append(
            Problem(
                path=f"{path}.milestones",
                value=list(entry.milestones),
                message="milestones belong in an entry of their own",
                fix=f"move them to a separate list item: - milestones: {list(entry.milestones)}",
            )
        )
    for required in SCHEDULER_REQUIRED.get(entry.name, ()):
        if required not in entry.kwargs:
            problems.append(
                Problem(
                    path=f"{path}.kwargs.{required}",
                    message=f"{class_name(entry.name)} needs {required}",
                    fix=f"add {path}.kwargs.{required}",
                )
            )
    return problems


def _milestone_problems(num_named: int, marks: list[tuple[int, LrSchedulerCfg]]) -> list[Problem]:
    with_steps = [(i, e) for i, e in marks if e.milestones is not None]
    if num_named <= 1:
        # NeMo RL builds SequentialLR over the list: one scheduler with `milestones: []` is
        # that scheduler alone (hpcrl.core.backends.automodel.optim.build_lr_scheduler).
        return [
            Problem(
                path=f"{SCHED}[{i}].milestones",
                value=list(e.milestones or ()),
                message="milestones hand over from one scheduler to the next, and there is "
                f"{num_named} scheduler",
                fix="write milestones: [] (one scheduler runs for the whole run) or add the "
                "scheduler that takes over",
            )
            for i, e in with_steps
            if e.milestones
        ]
    if len(with_steps) != 1:
        return [
            Problem(
                path=SCHED,
                message=f"{num_named} schedulers need exactly one milestones entry "
                f"(found {len(with_steps)})",
                fix=f"add one list item - milestones: [...] with {num_named - 1} step(s)",
            )
        ]
    index, entry = with_steps[0]
    steps = list(entry.milestones or ())
    path = f"{SCHED}[{index}].milestones"
    if len(steps) != num_named - 1:
        return [
            Problem(
                path=path,
                value=steps,
                message=f"{num_named} schedulers hand over {num_named - 1} time(s), "
                f"but {len(steps)} milestone(s) are given",
                fix=f"give {num_named - 1} optimizer step(s) at which the next scheduler starts",
            )
        ]
    if steps[0] < 1 or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        return [
            Problem(
                path=path,
                value=steps,
                message="milestones must be positive and increasing",
                fix="e.g. milestones: [50] (warm-up for 50 optimizer steps, then the next)",
            )
        ]
    return []


OFFLOAD = "policy.automodel_cfg.optimizer_offload_fraction"
#: what the host-side step (hpcrl.core.backends.automodel.host_offload) cannot do
_OFFLOAD_REFUSED_KWARGS = ("capturable", "differentiable")


def rule_optimizer_offload(recipe: Recipe) -> list[Problem]:
    """``optimizer_offload_fraction`` > 0 steps part of Adam/AdamW on the host: another
    optimizer, FSDP's ``cpu_offload`` (which puts all of it on the host already) or a
    capturable/differentiable Adam cannot go with it."""
    cfg = recipe.policy.automodel_cfg
    fraction = cfg.optimizer_offload_fraction
    opt = recipe.policy.optimizer
    if not cfg.enabled or fraction <= 0 or opt is None:
        return []
    problems = []
    if class_name(opt.name) not in ("Adam", "AdamW"):
        problems.append(
            Problem(
                path=OFFLOAD,
                value=fraction,
                message=f"offloads Adam's state; {OPT}.name is {opt.name}",
                fix=f"set {OPT}.name=torch.optim.AdamW (or Adam), or {OFFLOAD}=0",
            )
        )
    if cfg.cpu_offload:
        problems.append(
            Problem(
                path=OFFLOAD,
                value=fraction,
                message="policy.automodel_cfg.cpu_offload=true keeps all optimizer state "
                "(and the parameters) in host memory already",
                fix=f"choose one: {OFFLOAD}=0, or policy.automodel_cfg.cpu_offload=false",
            )
        )
    for key in _OFFLOAD_REFUSED_KWARGS:
        if opt.kwargs.get(key) is True:
            problems.append(
                Problem(
                    path=f"{OPT}.kwargs.{key}",
                    value=True,
                    message=f"the host-side step of {OFFLOAD}={fraction:g} is not {key}",
                    fix=f"set {OPT}.kwargs.{key}=false, or {OFFLOAD}=0",
                )
            )
    return problems


def rule_te_fused_adam_on_gpu(recipe: Recipe) -> list[Problem]:
    """Transformer Engine's FusedAdam steps CUDA tensors only: FSDP's ``cpu_offload``, which
    keeps the parameters and their state in host memory, cannot go with it."""
    opt = recipe.policy.optimizer
    cfg = recipe.policy.automodel_cfg
    if opt is None or opt.name != TE_FUSED_ADAM or not cfg.enabled or not cfg.cpu_offload:
        return []
    return [
        Problem(
            path=f"{OPT}.name",
            value=opt.name,
            message="Transformer Engine's FusedAdam steps GPU tensors only, and "
            "policy.automodel_cfg.cpu_offload keeps the parameters in host memory",
            fix=f"set {OPT}.name=torch.optim.AdamW, or policy.automodel_cfg.cpu_offload=false",
        )
    ]


OPTIMIZER_RULES = (
    rule_optimizer,
    rule_scheduler,
    rule_optimizer_offload,
    rule_te_fused_adam_on_gpu,
)

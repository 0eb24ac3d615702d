"""Rules for ``policy.megatron_cfg`` (and the manual-GC keys of ``value.megatron_cfg``).

They run only when the Megatron backend is enabled (settings under a disabled backend are
ignored), except manual GC, which the workers of both backends read: it is checked whenever
``manual_gc`` is on, and under ``value.megatron_cfg`` whenever a ``value`` section is given. Each rule returns Problems naming the full path, the bad value
and the fix.
"""

from __future__ import annotations

from typing import Any, get_args

from hpcrl.config.errors import Problem
from hpcrl.config.megatron_hf_overrides import megatron_hf_override_problems
from hpcrl.config.moe_dispatch import rule_flex_dispatcher
from hpcrl.config.recipe import MegatronCfg, OffloadModule, Recipe
from hpcrl.config.suggestions import did_you_mean

MEGATRON = "policy.megatron_cfg"
OFFLOAD_MODULE_NAMES: tuple[str, ...] = get_args(OffloadModule)
MOE_OFFLOAD_MODULES = ("expert_fc1", "moe_act", "fused_group_mlp")
OFFLOAD_OPTIMIZERS = ("adam", "sgd")
TE_NOTE = "fine-grained activation offloading uses Transformer Engine's implementation: the job's environment needs transformer_engine"


def megatron_enabled(recipe: Recipe) -> bool:
    return recipe.policy.megatron_cfg.enabled


def rule_sequence_parallel(recipe: Recipe) -> list[Problem]:
    """megatron-core refuses SP without TP, and EP with TP without SP (ModelParallelConfig)."""
    if not megatron_enabled(recipe):
        return []
    cfg = recipe.policy.megatron_cfg
    tp_path = f"{MEGATRON}.tensor_model_parallel_size"
    if cfg.sequence_parallel and cfg.tensor_model_parallel_size == 1:
        return [
            Problem(
                path=f"{MEGATRON}.sequence_parallel",
                value=True,
                message=f"sequence parallelism splits activations over the tensor-parallel group; {tp_path} is 1",
                fix=f"set {MEGATRON}.sequence_parallel=false or {tp_path} > 1",
            )
        ]
    if (
        cfg.expert_model_parallel_size > 1
        and cfg.tensor_model_parallel_size > 1
        and not cfg.sequence_parallel
    ):
        return [
            Problem(
                path=f"{MEGATRON}.sequence_parallel",
                value=False,
                message="megatron-core needs sequence parallelism when expert and tensor parallelism are combined",
                fix=f"set {MEGATRON}.sequence_parallel=true",
            )
        ]
    return []


RECOMPUTE_FIELDS = ("recompute_granularity", "recompute_method", "recompute_num_layers")


def megatron_recompute(cfg: MegatronCfg) -> dict[str, Any]:
    """The provider's recompute settings, as NeMo RL derives them: nothing unless
    ``activation_checkpointing``; then granularity ``full`` unless set, and for full
    recompute the method ``uniform`` and 1 layer per group unless set."""
    if not cfg.activation_checkpointing:
        return {}
    granularity = cfg.recompute_granularity or "full"
    if granularity == "selective":
        return {"recompute_granularity": "selective"}
    return {
        "recompute_granularity": "full",
        "recompute_method": cfg.recompute_method or "uniform",
        "recompute_num_layers": 1 if cfg.recompute_num_layers is None else cfg.recompute_num_layers,
    }


def rule_recompute(recipe: Recipe) -> list[Problem]:
    """Recompute is keyed on activation_checkpointing (NeMo RL's meaning): the granularity,
    method and layer count only matter when it is true."""
    if not megatron_enabled(recipe):
        return []
    cfg = recipe.policy.megatron_cfg
    switch = f"{MEGATRON}.activation_checkpointing"
    if not cfg.activation_checkpointing:
        return [
            _ignored(f"{MEGATRON}.{name}", getattr(cfg, name), switch)
            for name in RECOMPUTE_FIELDS
            if getattr(cfg, name) is not None
        ]
    problems = []  # a layer count below 1: the field's own bound (recipe_megatron)
    if cfg.recompute_granularity == "selective":
        for name in ("recompute_method", "recompute_num_layers"):
            if getattr(cfg, name) is not None:
                problems.append(
                    Problem(
                        path=f"{MEGATRON}.{name}",
                        value=getattr(cfg, name),
                        message=f"only used with {MEGATRON}.recompute_granularity=full (it is selective)",
                        fix=f"set {MEGATRON}.recompute_granularity=full or remove {MEGATRON}.{name}",
                    )
                )
    return problems


# --------------------------------------------------------------------------- optimizer offload
def rule_optimizer_offload(recipe: Recipe) -> list[Problem]:
    if not megatron_enabled(recipe):
        return []
    optimizer = recipe.policy.megatron_cfg.optimizer
    path = f"{MEGATRON}.optimizer"
    problems = []
    if optimizer.optimizer not in OFFLOAD_OPTIMIZERS:
        guess = did_you_mean(optimizer.optimizer, OFFLOAD_OPTIMIZERS)
        problems.append(
            Problem(
                path=f"{path}.optimizer",
                value=optimizer.optimizer,
                message="megatron-core's optimizer (and its CPU offload) supports adam or sgd only",
                fix=(f"did you mean {guess}? " if guess else "")
                + f"set {path}.optimizer=adam or {path}.optimizer=sgd",
            )
        )
    if not optimizer.optimizer_cpu_offload:
        return problems + _offload_options_without_offload(optimizer, path)
    # the fraction's bounds, (0, 1] while offloading, are beside it (recipe_megatron)
    if not optimizer.use_distributed_optimizer:
        problems.append(
            Problem(
                path=f"{path}.use_distributed_optimizer",
                value=False,
                message=f"{path}.optimizer_cpu_offload needs the distributed optimizer",
                fix=f"set {path}.use_distributed_optimizer=true or {path}.optimizer_cpu_offload=false",
            )
        )
    return problems


def rule_megatron_min_lr(recipe: Recipe) -> list[Problem]:
    """``min_lr`` is where the learning rate decays to: not above ``lr`` (checked under a
    disabled megatron_cfg too, as it always was)."""
    opt = recipe.policy.megatron_cfg.optimizer
    path = f"{MEGATRON}.optimizer"
    if not opt.min_lr > opt.lr >= 0.0:
        return []
    return [
        Problem(path=f"{path}.min_lr", value=opt.min_lr, message=f"above {path}.lr ({opt.lr})",
                fix=f"set {path}.min_lr <= {path}.lr")
    ]  # fmt: skip


def _offload_options_without_offload(optimizer: Any, path: str) -> list[Problem]:
    problems = []
    if 0.0 < optimizer.optimizer_offload_fraction <= 1.0:  # outside [0, 1]: the field's bound
        problems.append(
            _ignored(
                f"{path}.optimizer_offload_fraction",
                optimizer.optimizer_offload_fraction,
                f"{path}.optimizer_cpu_offload",
            )
        )
    if optimizer.overlap_cpu_optimizer_d2h_h2d:
        problems.append(
            _ignored(f"{path}.overlap_cpu_optimizer_d2h_h2d", True, f"{path}.optimizer_cpu_offload")
        )
    return problems


def _ignored(path: str, value: Any, switch: str) -> Problem:
    return Problem(
        path=path,
        value=value,
        message=f"has no effect while {switch} is false",
        fix=f"set {switch}=true to use it, or remove {path}",
        severity="warning",
    )


# --------------------------------------------------------------------------- manual GC
def rule_manual_gc(recipe: Recipe) -> list[Problem]:
    """Also checked under a disabled megatron_cfg when manual_gc is on: the training workers
    of both backends read these keys (hpcrl.core.workers.manual_gc)."""
    problems = []
    if megatron_enabled(recipe) or recipe.policy.megatron_cfg.manual_gc:
        problems += manual_gc_problems(recipe.policy.megatron_cfg, MEGATRON)
    if recipe.value is not None:
        problems += manual_gc_problems(recipe.value.megatron_cfg, "value.megatron_cfg")
    return problems


def manual_gc_problems(cfg: MegatronCfg, path: str) -> list[Problem]:
    interval = cfg.manual_gc_interval
    is_int = isinstance(interval, int) and not isinstance(interval, bool)
    if is_int and (interval > 0 or not cfg.manual_gc):
        return []
    needed = f" when {path}.manual_gc is true" if cfg.manual_gc else ""
    if isinstance(interval, bool):
        got = "a boolean (true/false is not a number of steps)"
    elif is_int:
        got = str(interval)
    else:
        got = f"{type(interval).__name__} {interval!r}"
    switch_off = f", or {path}.manual_gc=false" if cfg.manual_gc else ""
    return [
        Problem(
            path=f"{path}.manual_gc_interval",
            value=interval,
            message=f"must be a positive integer (optimizer steps between full collections){needed}; got {got}",
            fix=f"set {path}.manual_gc_interval=10 (for example){switch_off}",
        )
    ]


# --------------------------------------------------------------------------- fine-grained offload
def rule_fine_grained_offload(recipe: Recipe) -> list[Problem]:
    if not megatron_enabled(recipe):
        return []
    cfg = recipe.policy.megatron_cfg
    problems = _unknown_offload_modules(cfg.offload_modules)
    if not cfg.fine_grained_activation_offloading:
        if cfg.offload_modules:
            problems.append(
                _ignored(
                    f"{MEGATRON}.offload_modules",
                    list(cfg.offload_modules),
                    f"{MEGATRON}.fine_grained_activation_offloading",
                )
            )
        return problems
    modules = set(cfg.offload_modules)
    problems += _offload_combinations(cfg, modules)
    problems.append(
        Problem(
            path=f"{MEGATRON}.fine_grained_activation_offloading",
            value=True,
            message=TE_NOTE,
            fix="use a container with Transformer Engine (NeMo RL / NeMo images have it)",
            severity="warning",
        )
    )
    return problems


def _unknown_offload_modules(modules: tuple[str, ...]) -> list[Problem]:
    problems = []
    for index, name in enumerate(modules):
        if name in OFFLOAD_MODULE_NAMES:
            continue
        guess = did_you_mean(name, OFFLOAD_MODULE_NAMES)
        problems.append(
            Problem(
                path=f"{MEGATRON}.offload_modules[{index}]",
                value=name,
                message="not a module that can be offloaded",
                fix=(f"did you mean {guess}? " if guess else "")
                + "choose from: "
                + ", ".join(OFFLOAD_MODULE_NAMES),
            )
        )
    return problems


def _offload_combinations(cfg: MegatronCfg, modules: set[str]) -> list[Problem]:
    path = f"{MEGATRON}.offload_modules"
    listed = sorted(modules)
    problems = []

    def add(message: str, fix: str, where: str = path, value: Any = listed) -> None:
        problems.append(Problem(path=where, value=value, message=message, fix=f"{fix} ({TE_NOTE})"))

    if not modules:
        add(
            f"is empty while {MEGATRON}.fine_grained_activation_offloading is true",
            f"name modules, e.g. {path}=[core_attn,attn_proj], or turn it off",
        )
    if "attn_proj" in modules and "core_attn" not in modules:
        add(
            "attn_proj needs core_attn (the projection's input is core attention's output)",
            f"add core_attn to {path}",
        )
    if "fused_group_mlp" in modules and modules & {"expert_fc1", "moe_act"}:
        add(
            "fused_group_mlp already covers expert_fc1 and moe_act; list either fused_group_mlp or those",
            f"remove expert_fc1/moe_act from {path}, or remove fused_group_mlp",
        )
    moe_offloaded = sorted(modules & set(MOE_OFFLOAD_MODULES))
    if "moe" in cfg.recompute_modules and moe_offloaded:
        add(
            f"{MEGATRON}.recompute_modules has 'moe', which recomputes what {moe_offloaded} would offload",
            f"remove 'moe' from {MEGATRON}.recompute_modules or {moe_offloaded} from {path}",
            f"{MEGATRON}.recompute_modules",
            list(cfg.recompute_modules),
        )
    if cfg.cpu_offloading:
        add(
            "layer-level cpu_offloading conflicts with fine-grained activation offloading",
            f"set {MEGATRON}.cpu_offloading=false or {MEGATRON}.fine_grained_activation_offloading=false",
            f"{MEGATRON}.cpu_offloading",
            True,
        )
    outside_graph = sorted(modules - set(MOE_OFFLOAD_MODULES))
    if cfg.cuda_graph_impl == "local" and outside_graph:
        add(
            f"with {MEGATRON}.cuda_graph_impl=local only {', '.join(MOE_OFFLOAD_MODULES)} can be offloaded; not {outside_graph}",
            f"remove {outside_graph} from {path} or use another cuda_graph_impl",
        )
    return problems


def rule_clip_grad(recipe: Recipe) -> list[Problem]:
    """megatron-core compares clip_grad with 0 at every step, so null fails there; NeMo RL
    writes 0 for no clipping (its sft_openmathinstruct2_megatron.yaml)."""
    if not megatron_enabled(recipe) or recipe.policy.megatron_cfg.optimizer.clip_grad is not None:
        return []
    return [
        Problem(
            path=f"{MEGATRON}.optimizer.clip_grad",
            value=None,
            message="megatron-core's optimizer needs a number here (it compares it with 0 at "
            "every step)",
            fix=f"set {MEGATRON}.optimizer.clip_grad=0.0 for no clipping, or a norm such as 1.0",
        )
    ]


def rule_hf_config_overrides(recipe: Recipe) -> list[Problem]:
    """The Megatron backend builds its provider, conversion and export from the HF config
    with the overrides applied; keys it cannot carry into the Megatron model with Hugging
    Face's meaning are refused by key (``megatron_hf_overrides``)."""
    if not megatron_enabled(recipe):
        return []
    return megatron_hf_override_problems(recipe.policy.hf_config_overrides)


def rule_dequantize_base_checkpoint(recipe: Recipe) -> list[Problem]:
    """NeMo RL reads ``policy.dequantize_base_checkpoint`` in its DTensor (Automodel) workers
    only; on the Megatron backend megatron-bridge converts the checkpoint itself."""
    if not (megatron_enabled(recipe) and recipe.policy.dequantize_base_checkpoint):
        return []
    return [
        Problem(
            path="policy.dequantize_base_checkpoint", value=True,
            message="is read by the Automodel backend only (as NeMo RL reads it): the Megatron "
            "backend converts the Hugging Face checkpoint with megatron-bridge, which this "
            "setting does not change",
            fix="remove policy.dequantize_base_checkpoint (or set it to false)",
        )
    ]  # fmt: skip


MEGATRON_RULES = (
    rule_dequantize_base_checkpoint,
    rule_flex_dispatcher,
    rule_hf_config_overrides,
    rule_clip_grad,
    rule_sequence_parallel,
    rule_recompute,
    rule_optimizer_offload,
    rule_megatron_min_lr,
    rule_manual_gc,
    rule_fine_grained_offload,
)

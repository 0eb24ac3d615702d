"""Values that used to be accepted silently are errors naming the key, the value and a fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from hpcrl.config import ConfigError, load_profile, load_recipe
from hpcrl.config.profile_rules import time_limit_s

RECIPE = "grpo-tiny-1n-cpu"


def problems_of(call) -> dict[str, object]:
    with pytest.raises(ConfigError) as caught:
        call()
    return {problem.path: problem for problem in caught.value.errors}


@pytest.mark.parametrize(
    "override, path, words",
    [
        ("policy.optimizer.kwargs.lr=.nan", "policy.optimizer.kwargs.lr", "finite"),
        ("policy.optimizer.kwargs.lr=.inf", "policy.optimizer.kwargs.lr", "finite"),
        ("policy.optimizer.kwargs.lr=-1e-5", "policy.optimizer.kwargs.lr", "must be positive"),
        ("policy.max_grad_norm=.nan", "policy.max_grad_norm", "finite"),
        ("policy.max_grad_norm=-.inf", "policy.max_grad_norm", "finite"),
        ("policy.max_grad_norm=-1.0", "policy.max_grad_norm", "must be positive"),
        ("policy.max_grad_norm=0", "policy.max_grad_norm", "must be positive"),
        ("policy.generation.temperature=.nan", "policy.generation.temperature", "finite"),
        ("policy.generation.temperature=.inf", "policy.generation.temperature", "finite"),
        ("policy.generation.temperature=-0.5", "policy.generation.temperature", "negative"),
        ("policy.optimizer.kwargs.betas=[0.9,1.5]", "policy.optimizer.kwargs.betas[1]", "[0, 1)"),
        ("policy.optimizer.kwargs.eps=0", "policy.optimizer.kwargs.eps", "positive"),
        ("policy.megatron_cfg.optimizer.lr=-1", "policy.megatron_cfg.optimizer.lr", "at least"),
        ("policy.megatron_cfg.optimizer.adam_beta2=1.0", "policy.megatron_cfg.optimizer.adam_beta2", "[0, 1)"),
        ("checkpointing.save_period=0", "checkpointing.save_period", "at least 1"),
        ("checkpointing.save_period=-5", "checkpointing.save_period", "at least 1"),
        ("checkpointing.keep_top_k=-1", "checkpointing.keep_top_k", "at least 1"),
        ("cluster.num_nodes=1e20", "cluster.num_nodes", "a float"),
        ("cluster.num_nodes=100000000000000000000", "cluster.num_nodes", "more than any cluster"),
        ("cluster.num_nodes=2.0", "cluster.num_nodes", "a float"),
        ("grpo.max_num_epochs=0", "grpo.max_num_epochs", "at least 1"),
        ("data.num_workers=-1", "data.num_workers", "at least 0"),
        ("policy.megatron_cfg.env_vars.NCCL_DEBUG=INFO", "policy.megatron_cfg.env_vars.NCCL_DEBUG", "Automodel"),
        ("loss_fn.ratio_clip_min=-1", "loss_fn.ratio_clip_min", "must be at least 0"),
        ("loss_fn.ratio_clip_max=-0.1", "loss_fn.ratio_clip_max", "must be at least 0"),
        ("grpo.num_prompts_per_step=100000000000000000000", "grpo.num_prompts_per_step",
         "more than any training step takes"),
        ("grpo.num_generations_per_prompt=10000000", "grpo.num_generations_per_prompt",
         "more than any training step takes"),
        ("policy.train_global_batch_size=100000000000000000000", "policy.train_global_batch_size",
         "more than any training step takes"),
    ],
)  # fmt: skip
def test_recipe_values_that_used_to_pass(override, path, words):
    problems = problems_of(lambda: load_recipe(RECIPE, [override]))
    assert path in problems, problems
    assert words in problems[path].message
    assert problems[path].fix


def test_a_float_for_an_integer_says_how_to_write_it():
    problem = problems_of(lambda: load_recipe(RECIPE, ["cluster.num_nodes=2.0"]))[
        "cluster.num_nodes"
    ]
    assert problem.fix == "write it without a decimal point or exponent, e.g. cluster.num_nodes: 2"


def write_profile(tmp_path: Path, text: str) -> Path:
    """A small CPU Slurm profile with ``text`` (YAML) merged over it."""
    profile = {"name": "site", "scheduler": "slurm", "device": "cpu", "gpus_per_node": 0}
    extra = yaml.safe_load(textwrap.dedent(text))
    profile["slurm"] = {"gres_form": "none", **extra.pop("slurm", {})}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({**profile, **extra}))
    return path


@pytest.mark.parametrize(
    "text, path, words",
    [
        ("slurm: {array_parallelism: 0}", "slurm.array_parallelism", "at least 1"),
        ("slurm: {max_requeues: -1}", "slurm.max_requeues", "in 0..65,535"),
        ("slurm: {signal_delay_s: -10}", "slurm.signal_delay_s", "at least 0"),
        ('slurm: {time_limit: "99:99:99"}', "slurm.time_limit", "out of range"),
        ('slurm: {time_limit: "1-24:00:00"}', "slurm.time_limit", "out of range"),
        ('slurm: {time_limit: "00:00:00"}', "slurm.time_limit", "zero"),
        ('slurm: {time_limit: "00:01:00", signal_delay_s: 90}',
         "slurm.signal_delay_s", "not shorter than"),
        ('name: ""', "name", "a profile name"),
        ('name: "a b"', "name", "a profile name"),
        ('container: {image: ""}', "container.image", "empty"),
        ('container: {image: "   "}', "container.image", "empty"),
        ('python: "python3; rm -rf /"', "python", "not an absolute path or a command name"),
        ('python: "./venv/bin/python"', "python", "not an absolute path or a command name"),
        ('python: ""', "python", "not an absolute path or a command name"),
        ("worker_slots_per_node: 100000", "worker_slots_per_node", "more than any node"),
        ("cpus_per_node: 100000000000000000000", "cpus_per_node", "more than any node"),
        ("slurm: {mem_gb: 100000000000000000000}", "slurm.mem_gb", "more than any node"),
    ],
)  # fmt: skip
def test_profile_values_that_used_to_pass(tmp_path, text, path, words):
    problems = problems_of(lambda: load_profile(write_profile(tmp_path, text)))
    assert path in problems, problems
    assert words in problems[path].message
    assert problems[path].fix


@pytest.mark.parametrize(
    "text, seconds",
    [("04:00:00", 14400), ("90", 5400), ("90:30", 5430), ("48:00:00", 172800),
     ("1-00", 86400), ("1-23:59:59", 172799), ("2-3:04", 183840),
     ("99:99:99", None), ("10:60", None), ("1-24", None), ("4:00:00:00", None), ("x", None)],
)  # fmt: skip
def test_slurm_time_limits(text, seconds):
    assert time_limit_s(text) == seconds


def test_bad_values_are_reported_together_with_their_fixes(tmp_path):
    problems = problems_of(
        lambda: load_profile(
            write_profile(tmp_path, "cpus_per_node: 100000\nslurm: {mem_gb: 10000000}")
        )
    )
    assert problems["cpus_per_node"].value == 100000
    assert problems["cpus_per_node"].message == "more than any node has (at most 4096 CPUs)"
    assert problems["slurm.mem_gb"].message == "more than any node has (at most 65536 GB)"
    assert problems["slurm.mem_gb"].fix == (
        "set slurm.mem_gb to what one node of the site has, or remove it for Slurm's default"
    )
    overrides = ["loss_fn.ratio_clip_min=-1", "grpo.num_prompts_per_step=2000000"]
    problems = problems_of(lambda: load_recipe(RECIPE, overrides))
    assert problems["loss_fn.ratio_clip_min"].value == -1
    assert problems["loss_fn.ratio_clip_min"].fix == "set loss_fn.ratio_clip_min=0.2"
    assert problems["grpo.num_prompts_per_step"].value == 2_000_000
    assert problems["grpo.num_prompts_per_step"].fix == (
        "set grpo.num_prompts_per_step to what one step trains on, e.g. 32"
    )


def test_good_values_still_load(tmp_path):
    load_profile(
        write_profile(
            tmp_path,
            "python: /opt/venv/bin/python3.11\ncpus_per_node: 4096\n"
            'slurm: {time_limit: "2-00:00:00", max_requeues: 0, mem_gb: 2048}',
        )
    )
    load_recipe(
        RECIPE,
        [
            "checkpointing.keep_top_k=null",
            "policy.max_grad_norm=null",
            "cluster.num_nodes=2",
            "loss_fn.ratio_clip_min=0",
            "loss_fn.ratio_clip_max=0.28",
        ],
    )


@pytest.mark.parametrize(
    "override, feature",
    [("logger.wandb.name=&a x", "anchor (&)"), ("logger.wandb.name=*a", "alias (*)"),
     ("logger.wandb.name=!!str x", "tag (!)"), ("policy.optimizer.betas=[&a 0.9, *a]", "anchor (&)")],
)  # fmt: skip
def test_yaml_anchors_aliases_and_tags_in_override_values_are_refused(override, feature):
    key = override.split("=")[0]
    problem = problems_of(lambda: load_recipe(RECIPE, [override]))[key]
    assert feature in problem.message and "quote the value" in problem.fix
    # quoted, the same characters are plain text
    assert load_recipe(RECIPE, ['logger.wandb.name="&a x"']).recipe.logger.wandb.name == "&a x"


def test_a_missing_environment_variable_says_set_the_variable(monkeypatch):
    monkeypatch.delenv("HPCRL_TEST_NOPE", raising=False)
    problem = problems_of(
        lambda: load_recipe(RECIPE, ["logger.wandb.name=${oc.env:HPCRL_TEST_NOPE}"])
    )["logger.wandb.name"]
    assert problem.fix.startswith("set the variable in this shell (export HPCRL_TEST_NOPE=...)")


def test_a_folder_given_as_recipe_or_profile_is_not_no_such_file(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "a.yaml").write_text("x: 1\n")
    problem = problems_of(lambda: load_recipe(tmp_path / "recipes"))["recipe"]
    assert problem.message == "a folder, not a file"
    assert problem.fix == f"give one file: {tmp_path / 'recipes' / 'a.yaml'}"
    problem = problems_of(lambda: load_profile(tmp_path))["--cluster"]
    assert problem.message == "a folder, not a file"


#: Issue 26: accepted, then failing in the job (or wrapped around by Slurm). Each bound comes
#: from what the job or the scheduler can do; the message says which.
RECIPE_BOUND_ERRORS = {
    "grpo.seed=18446744073709551616": (
        "error: grpo.seed = 18446744073709551616: must be in 0..4,294,967,295: vLLM seeds numpy "
        "with it, and numpy takes 32-bit seeds (torch would take 64)\n"
        "  fix: set grpo.seed to a number in that range, e.g. 42"
    ),
    "grpo.seed=-1": (
        "error: grpo.seed = -1: must be in 0..4,294,967,295: vLLM seeds numpy with it, and numpy "
        "takes 32-bit seeds (torch would take 64)\n"
        "  fix: set grpo.seed to a number in that range, e.g. 42"
    ),
    "grpo.max_num_steps=9223372036854775808": (
        "error: grpo.max_num_steps = 9223372036854775808: must be at most "
        "9,223,372,036,854,775,807: the job counts steps in 64-bit integers; to train until "
        "grpo.max_num_epochs ends, any large count such as 1000000 does\n"
        "  fix: set grpo.max_num_steps to the steps to train, e.g. 1000"
    ),
    "policy.max_total_sequence_length=100000000000000": (
        "error: policy.max_total_sequence_length = 100000000000000: must be at most 16,777,216: "
        "longer than any model's context window (the longest hold about 10 million tokens), and "
        "the job sizes its buffers by it\n"
        "  fix: set policy.max_total_sequence_length to the model's context length or less, e.g. 4096"
    ),
    "policy.generation.top_k=-5": (
        "error: policy.generation.top_k = -5: must be null, 0 or -1 (off), or a count of tokens "
        "of at least 1: sampling keeps the top_k most likely tokens; vLLM refuses anything below -1\n"
        "  fix: set policy.generation.top_k to null to sample from every token, or a count such as 50"
    ),
    "policy.generation.max_new_tokens=10000000000": (
        "error: policy.generation.max_new_tokens = 10000000000: longer than any response can "
        "be: a prompt and its response share 128 tokens (the generation context), and each "
        "response stops at what its prompt leaves\n"
        "  fix: set policy.generation.max_new_tokens to at most 128 (or "
        "${policy.max_total_sequence_length}: as long as fits), or raise "
        "policy.max_total_sequence_length"
    ),
}


@pytest.mark.parametrize("override", RECIPE_BOUND_ERRORS, ids=list(RECIPE_BOUND_ERRORS))
def test_recipe_bounds_say_what_the_job_can_do(override):
    with pytest.raises(ConfigError) as caught:
        load_recipe(RECIPE, [override])
    assert [problem.format() for problem in caught.value.errors] == [RECIPE_BOUND_ERRORS[override]]


def test_recipe_bounds_are_reported_together_and_the_edges_load():
    with pytest.raises(ConfigError) as caught:
        load_recipe(RECIPE, [o for o in RECIPE_BOUND_ERRORS if "max_new_tokens" not in o])
    assert sorted(p.path for p in caught.value.errors) == [
        "grpo.max_num_steps", "grpo.seed", "policy.generation.top_k",
        "policy.max_total_sequence_length",
    ]  # fmt: skip
    edges = ["grpo.seed=4294967295", "grpo.max_num_steps=9223372036854775807",
             "policy.generation.top_k=-1", "policy.generation.max_new_tokens=128"]  # fmt: skip
    recipe = load_recipe(RECIPE, edges).recipe
    assert (recipe.grpo.seed, recipe.policy.generation.top_k) == (2**32 - 1, -1)


PROFILE_BOUND_ERRORS = {
    "gpus_per_node: -2": (
        "error: gpus_per_node = -2: must be at least 0: a count of GPUs per node (a CPU profile "
        "requests none: 0)\n"
        "  fix: set gpus_per_node to the GPUs of one node, e.g. 8 (a CPU profile: 0)"
    ),
    'slurm: {time_limit: "99999999-00:00:00"}': (
        "error: slurm.time_limit = '99999999-00:00:00': longer than Slurm can hold: it counts a "
        "time limit in 32-bit seconds (at most 24855-03:14:07), and a longer one wraps around to "
        "another limit (Slurm 22.05 turns 99999999-00:00:00 into 2965552-16:25:00)\n"
        "  fix: write the time the run needs, at most the partition's MaxTime (scontrol show "
        'partition), e.g. slurm.time_limit: "04:00:00"'
    ),
    "slurm: {max_requeues: 100000000000000000000}": (
        "error: slurm.max_requeues = 100000000000000000000: must be in 0..65,535: Slurm counts a "
        "job's restarts in 16 bits, and the job numbers its attempts by that count "
        "(SLURM_RESTART_COUNT wraps around past 65,535)\n"
        "  fix: set slurm.max_requeues to the requeues a run may need, e.g. 2 (0: never)"
    ),
}


@pytest.mark.parametrize("text", PROFILE_BOUND_ERRORS, ids=list(PROFILE_BOUND_ERRORS))
def test_profile_bounds_say_what_slurm_can_hold(tmp_path, text):
    with pytest.raises(ConfigError) as caught:
        load_profile(write_profile(tmp_path, text))
    assert [problem.format() for problem in caught.value.errors] == [PROFILE_BOUND_ERRORS[text]]


def test_the_longest_slurm_time_limit_loads(tmp_path):
    text = 'slurm: {time_limit: "24855-03:14:07", max_requeues: 65535}'
    assert load_profile(write_profile(tmp_path, text)).slurm.max_requeues == 65535

"""Whatever a user writes, loading ends in a Recipe or a ConfigError naming real paths.

Property tests: junk values at any key path, and arbitrary override strings, never escape as
another exception (a traceback instead of a list of problems).
"""

import copy
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from hpcrl.config import ConfigError, Recipe, load_recipe, validate_recipe_dict
from hpcrl.config.overrides import apply_overrides

BASE = load_recipe("grpo-qwen2-1.5b-2n8g-megatron").effective_dict()
BASE["value"] = {"megatron_cfg": {"manual_gc": True, "manual_gc_interval": 3}}
BASE["teacher"] = {"megatron_cfg_overrides": {"tensor_model_parallel_size": 2}}


def key_paths(node, parts=()):
    yield parts
    if isinstance(node, dict):
        for key, child in node.items():
            yield from key_paths(child, parts + (key,))


PATHS = [path for path in key_paths(BASE) if path] + [("policy", "bogus"), ("bogus",)]
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def set_at(data, path, value):
    for part in path[:-1]:
        if not isinstance(data.get(part), dict):
            data[part] = {}
        data = data[part]
    data[path[-1]] = value


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PATHS), JUNK), min_size=1, max_size=4))
def test_junk_anywhere_gives_a_recipe_or_config_error(mutations):
    data = copy.deepcopy(BASE)
    for path, junk in mutations:
        set_at(data, path, junk)
    try:
        recipe, _ = validate_recipe_dict(data)
    except ConfigError as error:
        assert error.errors
        for problem in error.problems:
            assert problem.path.split(".")[0].split("[")[0] in {*BASE, "bogus", "<top>"}, problem
            assert problem.message
    else:
        assert isinstance(recipe, Recipe)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(max_size=30), st.from_regex(r"[a-z_.]{1,30}=.{0,10}", fullmatch=True)),
        min_size=1,
        max_size=3,
    )
)
def test_arbitrary_overrides_give_problems_not_exceptions(texts):
    cfg = OmegaConf.create({"policy": {"model_name": "m", "megatron_cfg": {"env_vars": {}}}})
    _, problems, _ = apply_overrides(cfg, texts, Recipe)
    assert all(problem.path and problem.message for problem in problems)


def test_loading_imports_no_training_stack():
    code = (
        "import sys, hpcrl.config as c; c.load_recipe('grpo-qwen2-1.5b-2n8g-megatron');"
        "c.load_profile('eos'); heavy = {'torch', 'ray', 'transformers', 'megatron', 'numpy'};"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


PROFILE_BASE = {
    "name": "site",
    "container": {"image": "img", "mounts": ["/a:/b"]},
    "env": {"A": "1"},
}
PROFILE_PATHS = [
    ("scheduler",),
    ("device",),
    ("gpus_per_node",),
    ("slurm",),
    ("slurm", "time_limit"),
    ("slurm", "gres_form"),
    ("container",),
    ("container", "mounts"),
    ("env",),
    ("env", "B"),
    ("pass_env",),
    ("ray_ports", "gcs_port"),
    ("bogus",),
]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PROFILE_PATHS), JUNK), min_size=1, max_size=3))
def test_junk_in_a_profile_gives_a_profile_or_config_error(mutations):
    from hpcrl.config.load_and_check import MergedConfig, _structure_and_check
    from hpcrl.config.profile import ClusterProfile
    from hpcrl.config.profile_rules import check_profile

    data = copy.deepcopy(PROFILE_BASE)
    for path, junk in mutations:
        set_at(data, path, junk)
    merged = MergedConfig(resolved=data, raw=data, problems=[])
    profile, problems = _structure_and_check(merged, ClusterProfile, check_profile)
    assert profile is not None or any(problem.is_error for problem in problems)

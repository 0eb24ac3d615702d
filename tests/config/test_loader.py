"""YAML loading: defaults, interpolation, overrides, aliases, data paths, search paths."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpcrl.config import ConfigError, load_profile, load_recipe
from hpcrl.config.locate import find_profile, list_profiles

MINIMAL = """
policy:
  model_name: tiny:qwen2
  train_global_batch_size: 8
  train_micro_batch_size: 2
  automodel_cfg: {enabled: true}
grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 2}
data: {train_path: data/train.jsonl}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def error_paths(call) -> dict:
    with pytest.raises(ConfigError) as caught:
        call()
    return {problem.path: problem for problem in caught.value.problems}


def test_defaults_merge_deeply_and_later_files_win(tmp_path):
    write(tmp_path, "base/a.yaml", MINIMAL + "cluster: {num_nodes: 4, gpus_per_node: 8}\n")
    write(
        tmp_path,
        "base/b.yaml",
        "cluster: {num_nodes: 2}\npolicy: {max_total_sequence_length: 256}\n",
    )
    recipe_path = write(
        tmp_path,
        "r.yaml",
        "defaults: [base/a.yaml, base/b.yaml]\npolicy: {max_total_sequence_length: 300}\n",
    )
    loaded = load_recipe(recipe_path)
    assert (loaded.recipe.cluster.num_nodes, loaded.recipe.cluster.gpus_per_node) == (2, 8)
    assert loaded.recipe.policy.max_total_sequence_length == 300
    assert loaded.recipe.policy.model_name == "tiny:qwen2"
    assert "defaults" not in loaded.resolved_dict


def test_data_paths_resolve_against_the_file_that_sets_them(tmp_path):
    write(tmp_path, "shipped/base.yaml", MINIMAL)
    recipe_path = write(
        tmp_path, "mine/r.yaml", "defaults: ../shipped/base.yaml\ndata: {val_path: v.jsonl}\n"
    )
    recipe = load_recipe(recipe_path).recipe
    assert recipe.data.train_path == str(tmp_path / "shipped" / "data" / "train.jsonl")
    assert recipe.data.val_path == str(tmp_path / "mine" / "v.jsonl")


def test_interpolation_is_resolved(tmp_path):
    path = write(
        tmp_path,
        "r.yaml",
        MINIMAL + "cluster: {num_nodes: 1, gpus_per_node: '${policy.train_micro_batch_size}'}\n",
    )
    loaded = load_recipe(path)
    assert loaded.recipe.cluster.gpus_per_node == 2
    assert loaded.resolved_dict["cluster"]["gpus_per_node"] == 2


def test_broken_interpolations_are_all_reported(tmp_path):
    extra = "cluster: {num_nodes: '${policy.nope}', gpus_per_node: '${cluster.nada}'}\n"
    problems = error_paths(lambda: load_recipe(write(tmp_path, "r.yaml", MINIMAL + extra)))
    assert set(problems) == {"cluster.num_nodes", "cluster.gpus_per_node"}
    assert problems["cluster.num_nodes"].value == "${policy.nope}"


def test_overrides_are_typed_like_yaml_and_later_wins(tmp_path):
    path = write(tmp_path, "r.yaml", MINIMAL)
    overrides = [
        "policy.megatron_cfg.manual_gc=true",
        "policy.megatron_cfg.manual_gc_interval=5",
        "policy.megatron_cfg.offload_modules=[core_attn,attn_proj]",
        "cluster.num_nodes=3",
        "cluster.num_nodes=2",
        "policy.megatron_cfg.optimizer.lr=1e-4",
    ]
    loaded = load_recipe(path, overrides)
    megatron = loaded.recipe.policy.megatron_cfg
    assert megatron.manual_gc is True and megatron.offload_modules == ("core_attn", "attn_proj")
    assert loaded.recipe.cluster.num_nodes == 2 and megatron.optimizer.lr == 1e-4
    assert loaded.overrides == tuple(overrides)
    assert loaded.resolved_dict["cluster"]["num_nodes"] == 2


def test_override_of_unknown_key_is_an_error_with_did_you_mean(tmp_path):
    path = write(tmp_path, "r.yaml", MINIMAL)
    problems = error_paths(
        lambda: load_recipe(path, ["policy.megatron_cfg.manul_gc=true", "clutser.num_nodes=2"])
    )
    problem = problems["policy.megatron_cfg.manul_gc"]
    assert problem.value == "policy.megatron_cfg.manul_gc=true"
    assert problem.fix == "did you mean policy.megatron_cfg.manual_gc?"
    assert problems["clutser.num_nodes"].fix == "did you mean cluster.num_nodes?"


def test_override_may_add_keys_inside_free_form_mappings(tmp_path):
    path = write(tmp_path, "r.yaml", MINIMAL)
    loaded = load_recipe(
        path,
        [
            "policy.automodel_cfg.enabled=false",  # env_vars reach only a Megatron job
            "policy.megatron_cfg.enabled=true",
            "policy.megatron_cfg.env_vars.NCCL_DEBUG=INFO",
            "policy.megatron_cfg.model_overrides.hidden_dropout=0.0",
        ],
    )
    assert loaded.recipe.policy.megatron_cfg.env_vars == {"NCCL_DEBUG": "INFO"}
    assert loaded.recipe.policy.megatron_cfg.model_overrides == {"hidden_dropout": 0.0}
    # a teacher section is parsed (its keys are checked) but rejected: nothing trains with it
    problems = error_paths(
        lambda: load_recipe(path, ["teacher.megatron_cfg_overrides.tensor_model_parallel_size=2"])
    )
    assert list(problems) == ["teacher"]


def test_override_syntax_and_below_a_value(tmp_path):
    path = write(tmp_path, "r.yaml", MINIMAL)
    problems = error_paths(
        lambda: load_recipe(path, ["cluster.num_nodes", "cluster.num_nodes.x=1"])
    )
    assert problems["<override>"].value == "cluster.num_nodes"
    assert "holds a value, not keys" in problems["cluster.num_nodes.x"].message


def test_relative_data_path_in_override_means_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "sub/r.yaml", MINIMAL)
    recipe = load_recipe(path, ["data.train_path=here.jsonl"]).recipe
    assert recipe.data.train_path == str(tmp_path / "here.jsonl")


def test_dtensor_cfg_is_read_as_automodel_cfg_with_a_warning(tmp_path):
    text = MINIMAL.replace(
        "automodel_cfg: {enabled: true}", "dtensor_cfg: {enabled: true, tensor_parallel_size: 2}"
    )
    loaded = load_recipe(write(tmp_path, "r.yaml", text))
    assert loaded.recipe.policy.automodel_cfg.tensor_parallel_size == 2
    (warning,) = loaded.warnings
    assert (warning.path, warning.severity) == ("policy.dtensor_cfg", "warning")
    assert "policy.automodel_cfg" in warning.fix
    loaded = load_recipe(
        write(tmp_path, "r.yaml", MINIMAL), ["policy.dtensor_cfg.tensor_parallel_size=2"]
    )
    assert loaded.recipe.policy.automodel_cfg.tensor_parallel_size == 2
    assert [warning.path for warning in loaded.warnings] == [
        "policy.dtensor_cfg.tensor_parallel_size"
    ]


def test_dtensor_cfg_and_automodel_cfg_together_is_an_error(tmp_path):
    text = MINIMAL.replace(
        "automodel_cfg: {enabled: true}",
        "automodel_cfg: {enabled: true}\n  dtensor_cfg: {enabled: true}",
    )
    problems = error_paths(lambda: load_recipe(write(tmp_path, "r.yaml", text)))
    assert (
        "both policy.dtensor_cfg and policy.automodel_cfg" in problems["policy.dtensor_cfg"].message
    )


def test_structure_and_rule_problems_come_together(tmp_path):
    text = MINIMAL + "cluster: {num_nodes: 1, gpus_per_nodes: 8}\n"
    text = text.replace(
        "automodel_cfg: {enabled: true}",
        "automodel_cfg: {enabled: true, dp_replicate_size: 0}\n  precision: fp8",
    )
    problems = error_paths(
        lambda: load_recipe(write(tmp_path, "r.yaml", text), ["policy.train_micro_batch_size=3"])
    )
    assert set(problems) == {
        "cluster.gpus_per_nodes",  # unknown key
        "policy.precision",  # bad choice
        "policy.automodel_cfg.dp_replicate_size",  # rule
        "policy.train_global_batch_size",  # rule: 8 % 3
    }


def test_missing_required_section_does_not_hide_rule_problems(tmp_path):
    text = MINIMAL.replace("data: {train_path: data/train.jsonl}\n", "").replace(
        "automodel_cfg: {enabled: true}", "automodel_cfg: {enabled: false}"
    )
    problems = error_paths(lambda: load_recipe(write(tmp_path, "r.yaml", text)))
    assert set(problems) == {"data", "policy.megatron_cfg.enabled"}


@pytest.mark.parametrize(
    "text, words",
    [
        ("defaults: nothere.yaml\n" + MINIMAL, "base file not found"),
        ("defaults: r.yaml\n" + MINIMAL, "cycle"),
        ("policy: [unclosed\n", "not valid YAML"),
        ("- a list\n", "must hold keys"),
    ],
)
def test_file_problems(tmp_path, text, words):
    with pytest.raises(ConfigError) as caught:
        load_recipe(write(tmp_path, "r.yaml", text))
    assert words in str(caught.value)


def test_recipe_by_shipped_name_and_unknown_name():
    assert load_recipe("grpo-tiny-1n-cpu.yaml").source_path.name == "grpo-tiny-1n-cpu.yaml"
    with pytest.raises(ConfigError) as caught:
        load_recipe("grpo-tiny-1n-gpu")
    (problem,) = caught.value.problems
    assert "did you mean grpo-tiny-1n-cpu?" in problem.fix and "sft-tiny-1n-cpu" in problem.fix


def test_site_profile_on_the_env_search_path_wins(tmp_path):
    site, user = tmp_path / "site", tmp_path / "xdg"
    write(
        site,
        "eos.yaml",
        "partition_is: ignored\n".replace("partition_is: ignored", "slurm: {account: site_acct}"),
    )
    write(
        user / "hpcrl" / "cluster_profiles", "mine.yaml", "device: cpu\nslurm: {gres_form: none}\n"
    )
    environ = {
        "HPCRL_CLUSTER_PROFILES": f"{tmp_path / 'empty'}:{site}",
        "XDG_CONFIG_HOME": str(user),
    }
    assert find_profile("eos", environ) == site / "eos.yaml"
    assert load_profile("eos", environ=environ).slurm.account == "site_acct"
    mine = load_profile("mine", environ=environ)
    assert (mine.name, mine.device) == ("mine", "cpu")
    assert {"eos", "local", "mine", "slurm-test"} <= set(list_profiles(environ))
    assert (
        load_profile("eos", environ={"XDG_CONFIG_HOME": str(user)}).slurm.account == "your_account"
    )


def test_profile_not_found_lists_folders_and_names(tmp_path):
    environ = {"HPCRL_CLUSTER_PROFILES": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "x")}
    with pytest.raises(ConfigError) as caught:
        load_profile("eso", environ=environ)
    (problem,) = caught.value.problems
    assert str(tmp_path) in problem.message and "cluster_profiles" in problem.message
    assert problem.fix.startswith("did you mean eos?") and "slurm-test" in problem.fix
    assert "HPCRL_CLUSTER_PROFILES" in problem.fix


def test_profile_by_path_with_problems(tmp_path):
    path = write(
        tmp_path,
        "p.yaml",
        "device: cpu\nslurm: {gres_form: gres, time_limit: soon}\nenv: {HF_TOKEN: abc}\n",
    )
    problems = error_paths(lambda: load_profile(str(path)))
    assert set(problems) == {"slurm.gres_form", "slurm.time_limit", "env.HF_TOKEN"}
    assert problems["env.HF_TOKEN"].value == "<hidden>"
    assert "pass_env" in problems["env.HF_TOKEN"].fix


def test_profile_overrides(tmp_path):
    profile = load_profile("slurm-test", ["slurm.time_limit=00:20:00"], environ={})
    assert profile.slurm.time_limit == "00:20:00"


def test_bad_interpolated_value_names_its_source(tmp_path):
    path = write(tmp_path, "r.yaml", MINIMAL + "cluster: {num_nodes: '${policy.model_name}'}\n")
    problems = error_paths(lambda: load_recipe(path))
    assert "(the value comes from ${policy.model_name})" in problems["cluster.num_nodes"].message


def test_mandatory_values_left_as_question_marks_are_named(tmp_path):
    path = write(
        tmp_path, "r.yaml", MINIMAL.replace("tiny:qwen2", "???") + "cluster:\n  num_nodes: ???\n"
    )
    problems = error_paths(lambda: load_recipe(path))
    assert set(problems) == {"policy.model_name", "cluster.num_nodes"}
    assert (
        problems["policy.model_name"].fix
        == "set it, e.g. with the override policy.model_name=VALUE"
    )
    assert (
        load_recipe(path, ["policy.model_name=m", "cluster.num_nodes=1"]).recipe.policy.model_name
        == "m"
    )


def test_child_removes_a_base_section_with_null(tmp_path):
    write(tmp_path, "base.yaml", MINIMAL)
    path = write(tmp_path, "r.yaml", "defaults: base.yaml\ngrpo: null\nsft: {max_num_steps: 3}\n")
    assert load_recipe(path).recipe.algorithm == "sft"


def test_section_given_as_a_value_is_explained(tmp_path):
    problems = error_paths(lambda: load_recipe(write(tmp_path, "r.yaml", MINIMAL + "cluster: 2\n")))
    assert (
        problems["cluster"].message == "expected a section of keys (key: value), got an integer (2)"
    )


def test_profile_name_may_carry_the_yaml_suffix():
    assert load_profile("local.yaml", environ={}).name == "local"


def test_missing_recipe_path_suggests_a_nearby_file(tmp_path):
    write(tmp_path, "grpo-mine-1n-cpu.yaml", MINIMAL)
    with pytest.raises(ConfigError) as caught:
        load_recipe(str(tmp_path / "grpo-mien-1n-cpu.yaml"))
    (problem,) = caught.value.problems
    assert (problem.path, problem.message) == ("recipe", "no such file")
    assert problem.fix == f"did you mean {tmp_path / 'grpo-mine-1n-cpu.yaml'}?"


def test_a_bare_checkout_on_sys_path_finds_its_shipped_folders(tmp_path: Path) -> None:
    """``PYTHONPATH=checkout`` (or ``python`` run from the checkout's root, as the benchmarks
    do on the GPU machine) imports hpcrl without the install's package mapping: recipes,
    profiles and templates are then the checkout's own folders. ``-S`` keeps the editable
    install's finder out (its .pth file is not processed); the site-packages folder is added
    by hand for the dependencies."""
    import sysconfig

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys; sys.path += [sys.argv[1], sys.argv[2]]\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('hpcrl.cluster_profiles') is None, 'mapping present'\n"
        "from hpcrl.config.load_and_check import load_profile\n"
        "from hpcrl.config.locate import shipped_recipes_dir, shipped_templates_dir\n"
        "from hpcrl.render.environment import environment\n"
        "print(load_profile('local').name, shipped_recipes_dir(), shipped_templates_dir())\n"
        "print(sorted(environment().list_templates())[-1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", code, str(repo), sysconfig.get_paths()["purelib"]],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [
        f"local {repo / 'recipes'} {repo / 'templates'}",
        "job.sbatch.sh.j2",
    ]


# --------------------------------------------------------------------------- bases by name
def site_environ(tmp_path: Path, site: Path) -> dict[str, str]:
    return {"HPCRL_CLUSTER_PROFILES": str(site), "XDG_CONFIG_HOME": str(tmp_path / "no-user")}


def test_a_site_profile_extends_a_shipped_one_by_name_and_keeps_its_own_name(tmp_path):
    site = tmp_path / "site"
    write(site, "mysite.yaml", "defaults: slurm-test.yaml\nslurm: {partition: batch}\n")
    profile = load_profile("mysite", environ=site_environ(tmp_path, site))
    # slurm-test.yaml (shipped) says `name: slurm-test`; a base's name is not inherited.
    assert (profile.name, profile.slurm.partition, profile.scheduler) == (
        "mysite",
        "batch",
        "slurm",
    )
    assert profile.slurm.time_limit == "00:10:00"  # from the shipped base


def test_a_profile_given_by_absolute_path_is_named_after_its_file(tmp_path):
    path = write(tmp_path / "elsewhere", "gpu-box.yaml", "defaults: local.yaml\n")
    profile = load_profile(str(path), environ=site_environ(tmp_path, tmp_path / "none"))
    assert (profile.name, profile.scheduler, profile.slots_per_node) == ("gpu-box", "local", 2)
    named = write(tmp_path / "elsewhere", "named.yaml", "defaults: local.yaml\nname: box7\n")
    assert load_profile(str(named), environ={}).name == "box7"  # its own name: wins


def test_a_site_profile_of_a_shipped_name_extends_the_shipped_one(tmp_path):
    site = tmp_path / "site"
    write(site, "eos.yaml", "defaults: eos.yaml\nslurm: {account: site_acct}\n")
    profile = load_profile("eos", environ=site_environ(tmp_path, site))
    assert (profile.name, profile.slurm.account) == ("eos", "site_acct")
    assert profile.gpus_per_node == 8  # the shipped eos below it


def test_a_base_beside_the_profile_wins_over_the_search_path(tmp_path):
    site, mine = tmp_path / "site", tmp_path / "mine"
    write(site, "base.yaml", "device: gpu\n")
    write(mine, "base.yaml", "defaults: local.yaml\nworker_slots_per_node: 1\n")
    path = write(mine, "p.yaml", "defaults: base.yaml\n")
    profile = load_profile(str(path), environ=site_environ(tmp_path, site))
    assert (profile.name, profile.device, profile.slots_per_node) == ("p", "cpu", 1)


def test_a_missing_base_says_where_it_was_looked_for(tmp_path):
    site = tmp_path / "site"
    path = write(site, "p.yaml", "defaults: nothere.yaml\ndevice: cpu\n")
    environ = site_environ(tmp_path, site)
    problems = error_paths(lambda: load_profile(str(path), environ=environ))
    problem = problems[f"defaults (in {path})"]
    assert problem.message.startswith(f"base file not found (looked for {site / 'nothere.yaml'}, ")
    assert str(tmp_path / "no-user" / "hpcrl" / "cluster_profiles" / "nothere.yaml") in (
        problem.message
    )
    assert "then on the profile search path" in problem.fix


def test_a_user_recipe_extends_a_shipped_recipe_by_name(tmp_path):
    path = write(
        tmp_path, "mine.yaml", "defaults: grpo-tiny-1n-cpu.yaml\ngrpo: {max_num_steps: 3}\n"
    )
    loaded = load_recipe(path)
    assert loaded.recipe.grpo.max_num_steps == 3
    assert loaded.recipe.data.train_path.endswith("recipes/data/toy_count.jsonl")  # shipped data
    assert Path(loaded.recipe.data.train_path).is_file()

"""Secrets never reach a run file or the terminal (hpcrl.config.secrets and its users)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from hpcrl.cli.main import main
from hpcrl.config import ConfigError, load_recipe
from hpcrl.config.secrets import (
    find_secrets,
    is_secret_name,
    literal_secret_assignments,
    redact,
)
from tests.plan.planning_inputs import isolate_from_user_profiles

TOKEN = "hf_" + "S3cr3t" * 6  # token-shaped: found even without the variable
PAT = "ghp_" + "PatPat" * 6
PLAIN_SECRET = "correct-horse-battery"  # no known shape: found as the variable's value
WANDB_KEY = "staple-wandb-secret"
SECRETS = (TOKEN, PAT, PLAIN_SECRET, WANDB_KEY)
RECIPE = "grpo-tiny-2n-cpu"
PROFILE = "slurm-test"  # pass_env: HF_TOKEN, WANDB_API_KEY


@pytest.mark.parametrize(
    "name, secret",
    [
        ("HF_TOKEN", True), ("GITHUB_PAT", True), ("AWS_ACCESS_KEY_ID", True),
        ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True), ("CLIENT_SECRET", True),
        ("WANDB_API_KEY", True), ("OPENAI_APIKEY", True), ("MYSECRET", True), ("hf_token", True),
        ("HF_TOKEN_PATH", False), ("SSH_KEY_FILE", False), ("TOKENIZERS_PARALLELISM", False),
        ("HF_HOME", False), ("NCCL_DEBUG", False), ("RAY_AUTH_MODE", False), ("MAX_TOKENS", False),
    ],
)  # fmt: skip
def test_one_rule_says_which_names_hold_secrets(name, secret):
    assert is_secret_name(name) is secret


def test_literal_assignments_and_token_shapes_are_found():
    assert literal_secret_assignments(f"export HF_TOKEN={TOKEN}; export X=1") == ["HF_TOKEN"]
    assert literal_secret_assignments("--export=ALL,GITHUB_PAT=abc") == ["GITHUB_PAT"]
    assert literal_secret_assignments("--export=HF_TOKEN") == []  # passes it on: fine
    assert literal_secret_assignments("--export=ALL,NONE,NIL") == []
    assert literal_secret_assignments('export HF_TOKEN="$HF_TOKEN"') == []  # read at run time
    assert literal_secret_assignments("export HF_TOKEN_PATH=/secrets/hf") == []
    assert find_secrets(f"x {PAT} https://user:pw@host/x", environ={}) == [
        "a GitHub token",
        "a password in a URL",
    ]
    env = {"DB_PASSWORD": PLAIN_SECRET, "SSH_KEY": "/home/u/.ssh/id", "API_KEY": "short"}
    assert find_secrets(f"a {PLAIN_SECRET} /home/u/.ssh/id short", env) == ["$DB_PASSWORD"]
    assert redact(f"a {PLAIN_SECRET}", env) == "a <value of $DB_PASSWORD hidden>"


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    isolate_from_user_profiles(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_PAT", PAT)
    monkeypatch.setenv("DB_PASSWORD", PLAIN_SECRET)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)

    def run(*argv: str) -> tuple[int, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


def leaks(tmp_path: Path, output: str) -> list[str]:
    """Where a secret value shows: the output, or any file hpcrl wrote under tmp_path."""
    found = [f"output: {secret}" for secret in SECRETS if secret in output]
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != "site.yaml":  # the input itself
            text = path.read_text(errors="replace")
            found += [f"{path}: {s}" for s in SECRETS if s in text]
    return found


def profile_file(tmp_path: Path, extra: str) -> str:
    """The test cluster's profile with ``extra`` merged over it (through ``defaults:``)."""
    base = Path(__file__).parents[2] / "cluster_profiles" / f"{PROFILE}.yaml"
    path = tmp_path / "site.yaml"
    path.write_text(f"defaults: {base}\nname: site\n" + textwrap.dedent(extra))
    return str(path)


SHORT = "Sh0rt7"  # too short to search text for: only knowing what was read keeps it out


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (["logger.wandb.name=${oc.env:HF_TOKEN}"], ["logger.wandb.name"]),
        (["checkpointing.checkpoint_dir=/ckpt/${oc.env:WANDB_API_KEY}"], ["checkpointing.checkpoint_dir"]),
        (["logger.wandb.name=${oc.env:SHORT_TOKEN}"], ["logger.wandb.name"]),
        (["logger.wandb.name=${oc.env:PATHLIKE_SECRET}"], ["logger.wandb.name"]),
        (['logger.wandb.name=${oc.env:"HF_TOKEN"}'], ["logger.wandb.name"]),
        (["logger.wandb.name=${oc.env:HARMLESS_NAME_OF,x}", "logger.wandb.entity=${oc.env:${logger.wandb.name}}"],
         ["logger.wandb.entity"]),  # the variable's name built from another key
        (["logger.wandb.name=${oc.env:NOT_SET_HERE,${oc.env:SHORT_TOKEN}}"], ["logger.wandb.name"]),
        (["logger.wandb.project=${oc.env:SHORT_TOKEN}", "logger.wandb.name=run-${logger.wandb.project}"],
         ["logger.wandb.project", "logger.wandb.name"]),  # a key pointing at one is named too
        (["cluster.num_nodes=${oc.env:SHORT_TOKEN}"], ["cluster.num_nodes"]),  # a bad value too
        (["grpo.max_num_steps=${div:${oc.env:SHORT_TOKEN},2}"], ["grpo.max_num_steps"]),
        (["logger.wandb.name=${oc.env:GITHUB_PAT}"], ["logger.wandb.name"]),  # not in pass_env
        (["logger.wandb.entity=oc.env", "logger.wandb.name=${${logger.wandb.entity}:SHORT_TOKEN}"],
         ["logger.wandb.name"]),  # the resolver's name built by interpolation
        (["logger.wandb.name=${oc.env:SHORT_TOKEN}", "+logger.wandb.name=x"],
         ["logger.wandb.name"]),  # "+ adds a key, but ... already sets it (to ...)"
    ],
)  # fmt: skip
def test_a_recipe_value_read_from_a_secret_is_refused(cli, tmp_path, monkeypatch, overrides, keys):
    """Whatever shape the value has and however the read is written: nothing in a recipe
    needs a secret (the job's libraries read theirs from its environment, via pass_env)."""
    monkeypatch.setenv("SHORT_TOKEN", SHORT)
    monkeypatch.setenv("PATHLIKE_SECRET", "./weird-secret-value")
    monkeypatch.setenv("HARMLESS_NAME_OF", "SHORT_TOKEN")
    code, out = cli("render", RECIPE, "-c", PROFILE, "-o", "run", *overrides)
    assert code == 2, out
    flat = " ".join(out.split())
    for key in keys:
        assert f"{key} = " in flat
    assert "secret-named variable" in flat and "pass_env" in flat
    assert SHORT not in out and "weird-secret-value" not in out
    assert leaks(tmp_path, out) == []
    assert not (tmp_path / "run").exists()


def test_a_secret_path_or_an_ordinary_variable_is_read_as_before(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RUN_LABEL", "lbl")
    code, out = cli("render", RECIPE, "-c", PROFILE, "-o", "run",
                    "logger.wandb.name=${oc.env:RUN_LABEL}-${oc.env:HF_TOKEN_PATH,none}")  # fmt: skip
    assert code == 0, out
    resolved = yaml.safe_load((tmp_path / "run" / "recipe.resolved.yaml").read_text())
    assert resolved["logger"]["wandb"]["name"] == "lbl-none"


def test_a_run_folder_from_before_the_rule_is_refused_on_resume(cli, tmp_path):
    """A recipe.resolved.yaml that kept ``${oc.env:HF_TOKEN}`` (hpcrl allowed it once) is
    read again by resume, rerun and the driver: refused, naming the key."""
    path = tmp_path / "old.yaml"
    data = load_recipe(RECIPE).resolved_dict
    data["logger"].setdefault("wandb", {})["name"] = "${oc.env:HF_TOKEN}"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="logger.wandb.name"):
        load_recipe(path)


@pytest.mark.parametrize(
    "option, name",
    [
        ("--export=DB_PASSWORD=hunter22xyz", "DB_PASSWORD"),  # the name first, no ALL,
        ("--export=GITHUB_PAT=abc,ALL", "GITHUB_PAT"),
        ("--export GITHUB_PAT=abc,ALL", "GITHUB_PAT"),
        ("--export=NONE,APP_SECRET=hunter22xyz", "APP_SECRET"),
        ('--export="DB_PASSWORD=hunter22xyz"', "DB_PASSWORD"),
        ("--comment=HF_TOKEN=hunter22xyz", "HF_TOKEN"),  # any --opt=NAME=value
        ("--export=ALL,AWS_SECRET_ACCESS_KEY='hunter22xyz'", "AWS_SECRET_ACCESS_KEY"),
    ],
)
def test_secret_assignments_in_scheduler_options_are_found(option, name):
    assert literal_secret_assignments(option) == [name]


@pytest.mark.parametrize(
    "override, key",
    [
        (f"policy.megatron_cfg.env_vars.HF_TOKEN={TOKEN}", "env_vars.HF_TOKEN"),
        ("policy.megatron_cfg.env_vars.GITHUB_PAT=literal-pat-value", "env_vars.GITHUB_PAT"),
        (
            "policy.megatron_cfg.env_vars.AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP",
            "AWS_ACCESS_KEY_ID",
        ),
        ("policy.megatron_cfg.env_vars.APP_SECRET=x", "env_vars.APP_SECRET"),
        ("policy.megatron_cfg.env_vars.DB_PASSWORD=x", "env_vars.DB_PASSWORD"),
        ("policy.megatron_cfg.env_vars.HARMLESS=${oc.env:HF_TOKEN}", "env_vars.HARMLESS"),
        (f"policy.megatron_cfg.env_vars.HARMLESS={PAT}", "env_vars.HARMLESS"),
    ],
)
def test_secrets_in_env_vars_are_errors_that_hide_the_value(cli, tmp_path, override, key):
    code, out = cli("render", "grpo-tiny-1n-cpu-megatron", "-c", "local", override)
    assert code == 2, out
    assert key in out and "pass_env" in out
    assert "literal-pat-value" not in out
    assert leaks(tmp_path, out) == []
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "extra, key",
    [
        ("env:\n  HARMLESS: ${oc.env:HF_TOKEN}\n", "env.HARMLESS"),
        ("env:\n  HF_TOKEN: plain\n", "env.HF_TOKEN"),
        ("env:\n  GITHUB_PAT: plain\n", "env.GITHUB_PAT"),
        (f"setup_lines:\n  - export HF_TOKEN={TOKEN}\n", "setup_lines[0]"),
        ("setup_lines:\n  - export APP_PASSWORD=hunter22\n", "setup_lines[0]"),
        ("setup_lines:\n  - echo ${oc.env:DB_PASSWORD}\n", "setup_lines[0]"),
        (f"slurm:\n  srun_args: ['--export=ALL,GITHUB_PAT={PAT}']\n", "slurm.srun_args[0]"),
        (f"slurm:\n  sbatch_args: ['--comment={TOKEN}']\n", "slurm.sbatch_args[0]"),
        ("slurm:\n  account: ${oc.env:DB_PASSWORD}\n", "slurm.account"),
        ("slurm:\n  account: ${oc.env:'DB_PASSWORD'}\n", "slurm.account"),
        ("env:\n  A: x\n  HARMLESS: pre-${oc.env:${env.A}_PASSWORD,none}\n", "env.HARMLESS"),
        ("env:\n  A: ${oc.env:DB_PASSWORD}\n  HARMLESS: x${env.A}\n", "env.HARMLESS"),
        ("slurm:\n  sbatch_args: ['--export=DB_PASSWORD=hunter22xyz']\n", "slurm.sbatch_args[0]"),
        ("slurm:\n  srun_args: ['--export=GITHUB_PAT=hunter22,ALL']\n", "slurm.srun_args[0]"),
        ("slurm:\n  srun_args: ['--export', 'ALL,DB_PASSWORD=hunter22']\n", "slurm.srun_args[1]"),
    ],
)
def test_secrets_in_profiles_are_errors_that_hide_the_value(cli, tmp_path, extra, key):
    code, out = cli("render", RECIPE, "-c", profile_file(tmp_path, extra))
    assert code == 2, out
    assert key in out and "pass_env" in out
    assert "hunter22" not in out
    assert leaks(tmp_path, out) == []


def test_a_path_to_a_secret_is_not_a_secret(cli, tmp_path):
    extra = 'env:\n  HF_TOKEN_PATH: /lustre/secrets/hf\nsetup_lines:\n  - export HF_TOKEN="$(cat $HF_TOKEN_PATH)"\n'
    code, out = cli("render", RECIPE, "-c", profile_file(tmp_path, extra), "-o", "run")
    assert code == 0, out
    assert (
        "export HF_TOKEN_PATH=/lustre/secrets/hf" in (tmp_path / "run" / "job.sbatch").read_text()
    )


def test_a_literal_token_pasted_into_any_value_never_reaches_a_file(cli, tmp_path):
    code, out = cli("render", RECIPE, "-c", PROFILE, "-o", "run", f"logger.wandb.name={TOKEN}")
    assert code == 1
    assert "refusing to write" in out and "$HF_TOKEN" in out and "pass_env" in out
    assert leaks(tmp_path, out) == []


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("https://alice:Url7Pw9x@example.com/d.jsonl",
         "'https://alice:<password hidden>@example.com/d.jsonl'"),
        # any scheme: hidden by the URL shape, not by the scheme
        ("s3://alice:Url7Pw9x@bucket/d.jsonl", "'s3://alice:<password hidden>@bucket/d.jsonl'"),
    ],
    ids=["https", "s3"],
)  # fmt: skip
def test_a_password_in_a_url_is_never_echoed_in_an_error(cli, value, shown):
    """Issue 26: a user:pass@ URL given as data was echoed whole in the error. The password is
    no variable's value here, so only its shape can hide it."""
    code, out = cli("validate", RECIPE, "-c", PROFILE, f"data.train_path={value}")
    flat = " ".join(out.split())
    assert code == 2 and "Url7Pw9x" not in out, out
    assert f"error data.train_path = {shown} a URL: a data file is read from the job's " in flat

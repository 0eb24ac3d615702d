"""The bad-input corpus: parametrized families of login-node inputs, generated here.

Families: recipes (every key of a shipped recipe set to junk, broken files), profiles (the
same over the test cluster's profile), overrides, run folders, metrics files, job records
(``job.json``/``sweep.json``), and CLI arguments. ``build_corpus()`` returns every case;
the selection is fixed (a seeded sample where a family is a cross product), so a failure
names the same case on every run.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.robust.harness import SECRET_ENV, Case

REPO = Path(__file__).resolve().parents[2]
RECIPE = "grpo-tiny-1n-cpu"
SLURM_RECIPE = "grpo-tiny-2n-cpu"
SLURM_PROFILE = REPO / "cluster_profiles" / "slurm-test.yaml"
SEED = 13
TOKEN = SECRET_ENV["HF_TOKEN"]

#: Values no key of a recipe or profile should take without a clear answer.
JUNK: dict[str, Any] = {
    "null": None,
    "true": True,
    "minus-one": -1,
    "zero": 0,
    "half": 2.5,
    "float-huge": 1e20,
    "int-huge": 10**20,
    "nan": math.nan,
    "inf": math.inf,
    "empty-string": "",
    "word": "junk",
    "list": [1, 2],
    "mapping": {"a": 1},
    "env-missing": "${oc.env:HPCRL_CORPUS_NOPE}",
    "env-secret": "${oc.env:HF_TOKEN}",
    "token-literal": TOKEN,
    "bad-reference": "${no.such.key}",
    "mandatory": "???",
    "nul": "a\x00b",
    "newline": "a\nb",
}
#: Junk that no key accepts: the command must refuse it.
ALWAYS_BAD = {"nan", "inf", "env-missing", "bad-reference", "mandatory"}


def _leaves(node: Any, parts: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*parts, key))
    else:
        yield parts, node


def _set(data: dict, parts: tuple, value: Any) -> None:
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value


def _dotted(parts: tuple) -> str:
    return ".".join(str(part) for part in parts)


def _write_yaml(name: str, data: Any) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        (folder / name).write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))

    return setup


def _write_bytes(name: str, data: bytes) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        (folder / name).write_bytes(data)

    return setup


def _named_keys(parts: tuple, new_paths: list[tuple]) -> tuple[str, ...]:
    """What a rejection of ``parts`` must name: the key, or for a key the base did not have,
    its section (the section may be what is wrong: a container without an image)."""
    if parts in new_paths and len(parts) > 1:
        return (_dotted(parts), _dotted(parts[:-1]))
    return (_dotted(parts),)


def _sample(pairs: list, count: int, rng: random.Random) -> list:
    return pairs if len(pairs) <= count else rng.sample(pairs, count)


# --------------------------------------------------------------------------- recipes
def recipe_cases(resolved_recipe: dict) -> list[Case]:
    """Every key of the shipped tiny recipe set to junk (a fixed sample), and broken files."""
    rng = random.Random(SEED)
    paths = [parts for parts, _ in _leaves(resolved_recipe)]
    new_paths = [("policy", "megatron_cfg", "env_vars", "EXTRA"), ("bogus",), ("policy", "bogus")]
    paths += new_paths
    pairs = [(parts, junk) for parts in paths for junk in JUNK]
    cases = []
    for parts, junk in sorted(_sample(pairs, 260, rng)):
        data = json.loads(json.dumps(resolved_recipe))
        _set(data, parts, JUNK[junk])
        key = _dotted(parts)
        cases.append(
            Case(
                family="recipes",
                name=f"{key}={junk}",
                argv=("render", "{case}/recipe.yaml", "--cluster", "local", "-o", "{case}/run"),
                setup=_write_yaml("recipe.yaml", data),
                expect="reject" if junk in ALWAYS_BAD else "any",
                keys=_named_keys(parts, new_paths),
            )
        )
    return cases + broken_file_cases(
        "recipes", "recipe.yaml", ("render", "{case}/recipe.yaml", "--cluster", "local")
    )


def broken_file_cases(family: str, name: str, argv: tuple[str, ...]) -> list[Case]:
    """Files that are not YAML mappings at all, for recipes and profiles alike."""
    files: dict[str, bytes] = {
        "empty": b"",
        "blank": b"\n\n   \n",
        "non-utf8": b"policy:\n  model_name: \xff\xfe\xfa\n",
        "binary": bytes(range(256)),
        "truncated": b"policy:\n  model_name: tiny:qwen2\n  optimizer: {lr: 1e-3,",
        "top-level-list": b"- a\n- b\n",
        "top-level-scalar": b"42\n",
        "tabs": b"policy:\n\tmodel_name: x\n",
        "duplicate-keys": b"policy: {model_name: a}\npolicy: {model_name: b}\n",
        "anchor-alias": b"a: &x {model_name: m}\npolicy: *x\n",
        "merge-key": b"base: &b {lr: 1}\npolicy: {<<: *b}\n",
        "python-tag": b"policy: !!python/object/apply:os.system ['true']\n",
        "defaults-missing": b"defaults: nowhere/base.yaml\n",
        "defaults-self": f"defaults: {name}\n".encode(),
        "defaults-number": b"defaults: 3\n",
        "defaults-list-junk": b"defaults: [1, {a: b}]\n",
        "unterminated-string": b'policy: {model_name: "abc}\n',
        "deep-nesting": b"a: " + b"[" * 200 + b"]" * 200 + b"\n",
        "huge-key": b"x" * 5000 + b": 1\n",
        "bom": "\ufeffpolicy: {model_name: m}\n".encode(),
    }
    cases = [
        Case(family=family, name=f"file-{kind}", argv=argv, setup=_write_bytes(name, data),
             expect="reject")
        for kind, data in files.items()
    ]  # fmt: skip
    path_argv = tuple(arg.replace(f"{{case}}/{name}", "{case}/FILE") for arg in argv)

    def directory(folder: Path) -> None:
        (folder / "FILE").mkdir()

    def fifo(folder: Path) -> None:
        import os

        os.mkfifo(folder / "FILE")

    def unreadable(folder: Path) -> None:
        (folder / "FILE").symlink_to(folder / "FILE")  # a symlink loop

    for kind, setup in (("a-directory", directory), ("a-fifo", fifo), ("symlink-loop", unreadable)):
        cases.append(Case(family=family, name=f"path-{kind}", argv=path_argv, setup=setup,
                          expect="reject"))  # fmt: skip
    cases.append(Case(family=family, name="path-missing", argv=path_argv, expect="reject"))
    return cases


# --------------------------------------------------------------------------- profiles
def profile_cases() -> list[Case]:
    rng = random.Random(SEED + 1)
    base = yaml.safe_load(SLURM_PROFILE.read_text())
    base["name"] = "corpus"
    extra_paths = [
        ("container", "image"), ("container", "mounts"), ("container", "workdir"),
        ("ray_ports", "gcs_port"), ("ray_ports", "min_worker_port"), ("env", "EXTRA"),
        ("setup_lines",), ("slurm", "sbatch_args"), ("slurm", "srun_args"), ("cpus_per_node",),
        ("slurm", "mem_gb"), ("slurm", "qos"), ("scheduler",), ("device",), ("bogus",),
    ]  # fmt: skip
    paths = list(dict.fromkeys([parts for parts, _ in _leaves(base)] + extra_paths))
    pairs = [(parts, junk) for parts in paths for junk in JUNK]
    cases = []
    for parts, junk in sorted(_sample(pairs, 150, rng)):
        data = json.loads(json.dumps(base))
        _set(data, parts, JUNK[junk])
        key = _dotted(parts)
        cases.append(
            Case(
                family="profiles",
                name=f"{key}={junk}",
                argv=(
                    "render",
                    SLURM_RECIPE,
                    "--cluster",
                    "{case}/profile.yaml",
                    "-o",
                    "{case}/run",
                ),
                setup=_write_yaml("profile.yaml", data),
                expect="reject" if junk in ALWAYS_BAD else "any",
                keys=_named_keys(parts, extra_paths),
            )
        )
    cases += _profile_secret_cases(base)
    argv = ("render", SLURM_RECIPE, "--cluster", "{case}/profile.yaml")
    return cases + broken_file_cases("profiles", "profile.yaml", argv)


def _profile_secret_cases(base: dict) -> list[Case]:
    secrets = {
        "env.HF_TOKEN": ("env", {"HF_TOKEN": "literal"}),
        "env.AWS_ACCESS_KEY_ID": ("env", {"AWS_ACCESS_KEY_ID": "AKIAABCDEFGHIJKLMNOP"}),
        "env.HARMLESS": ("env", {"HARMLESS": "${oc.env:GITHUB_PAT}"}),
        "setup_lines[0]": ("setup_lines", [f"export HF_TOKEN={TOKEN}"]),
        "slurm.srun_args[0]": ("slurm", {**base["slurm"], "srun_args": ["--export=ALL,DB_PASSWORD=x1"]}),
        "slurm.sbatch_args[0]": ("slurm", {**base["slurm"], "sbatch_args": ["--comment=${oc.env:DB_PASSWORD}"]}),
    }  # fmt: skip
    cases = []
    for key, (section, value) in secrets.items():
        data = {**base, section: value}
        cases.append(
            Case(
                family="profiles",
                name=f"secret-{key}",
                argv=("render", SLURM_RECIPE, "--cluster", "{case}/profile.yaml"),
                setup=_write_yaml("profile.yaml", data),
                expect="reject",
                keys=(key,),
            )
        )
    return cases


# --------------------------------------------------------------------------- overrides
OVERRIDES: dict[str, tuple[str, str]] = {
    # name: (override, key a rejection must name; "" when any clear line will do)
    "no-equals": ("grpo.max_num_steps", "grpo.max_num_steps"),
    "empty-key": ("=3", "=3"),
    "empty": ("", ""),
    "only-equals": ("=", ""),
    "double-dot": ("grpo..max_num_steps=1", "grpo..max_num_steps"),
    "leading-dot": (".grpo=1", ".grpo"),
    "space-in-key": ("grpo.max num=1", "grpo.max num"),
    "unknown-key": ("grpo.max_num_stpes=1", "grpo.max_num_stpes"),
    "unknown-top": ("bogus=1", "bogus"),
    "below-a-value": ("grpo.max_num_steps.x=1", "grpo.max_num_steps.x"),
    "section-to-scalar": ("policy=3", "policy"),
    "section-to-list": ("grpo=[1,2]", "grpo"),
    "anchor": ("logger.wandb.name=&a x", "logger.wandb.name"),
    "alias": ("logger.wandb.name=*a", "logger.wandb.name"),
    "tag": ("logger.wandb.name=!!python/name:os.system", "logger.wandb.name"),
    "anchor-in-list": ("policy.optimizer.betas=[&a 0.9, *a]", "policy.optimizer.betas"),
    "unclosed-list": ("policy.optimizer.betas=[0.9,", "policy.optimizer.betas"),
    "unclosed-map": ("policy.optimizer={lr: 1", "policy.optimizer"),
    "unclosed-quote": ('logger.wandb.name="abc', "logger.wandb.name"),
    "env-missing": ("logger.wandb.name=${oc.env:HPCRL_CORPUS_NOPE}", "logger.wandb.name"),
    "env-secret-not-passed": ("logger.wandb.name=${oc.env:GITHUB_PAT}", "logger.wandb.name"),
    "env-secret-in-env-vars": ("policy.megatron_cfg.env_vars.X=${oc.env:HF_TOKEN}", "policy.megatron_cfg.env_vars"),
    "secret-name-literal": ("policy.megatron_cfg.env_vars.HF_TOKEN=abc", "policy.megatron_cfg.env_vars"),
    "token-literal": (f"logger.wandb.name={TOKEN}", ""),
    "bad-reference": ("logger.wandb.name=${nope.nope}", "logger.wandb.name"),
    "self-reference": ("logger.wandb.name=${logger.wandb.name}", "logger.wandb.name"),
    "unknown-resolver": ("logger.wandb.name=${nope:x}", "logger.wandb.name"),
    "mandatory": ("logger.wandb.name=???", "logger.wandb.name"),
    "nan-lr": ("policy.optimizer.lr=nan", "policy.optimizer.lr"),
    "yaml-nan-lr": ("policy.optimizer.lr=.nan", "policy.optimizer.lr"),
    "inf-grad-norm": ("policy.max_grad_norm=.inf", "policy.max_grad_norm"),
    "negative-grad-norm": ("policy.max_grad_norm=-1", "policy.max_grad_norm"),
    "negative-lr": ("policy.optimizer.lr=-0.1", "policy.optimizer.lr"),
    "nan-temperature": ("policy.generation.temperature=.nan", "policy.generation.temperature"),
    "negative-temperature": ("policy.generation.temperature=-1", "policy.generation.temperature"),
    "save-period-zero": ("checkpointing.save_period=0", "checkpointing.save_period"),
    "keep-top-k-negative": ("checkpointing.keep_top_k=-1", "checkpointing.keep_top_k"),
    "nodes-1e20": ("cluster.num_nodes=1e20", "cluster.num_nodes"),
    "nodes-huge-int": ("cluster.num_nodes=100000000000000000000", "cluster.num_nodes"),
    "nodes-float": ("cluster.num_nodes=2.0", "cluster.num_nodes"),
    "nodes-negative": ("cluster.num_nodes=-2", "cluster.num_nodes"),
    "nodes-string": ("cluster.num_nodes=two", "cluster.num_nodes"),
    "nodes-bool": ("cluster.num_nodes=true", "cluster.num_nodes"),
    "nodes-list": ("cluster.num_nodes=[1]", "cluster.num_nodes"),
    "nodes-null": ("cluster.num_nodes=null", "cluster.num_nodes"),
    "batch-zero": ("policy.train_global_batch_size=0", "policy.train_global_batch_size"),
    "steps-negative": ("grpo.max_num_steps=-5", "grpo.max_num_steps"),
    "megatron-env-on-automodel": ("policy.megatron_cfg.env_vars.NCCL_DEBUG=INFO", "policy.megatron_cfg.env_vars"),
    "both-backends": ("policy.megatron_cfg.enabled=true", "policy.megatron_cfg.enabled"),
    "no-backend": ("policy.automodel_cfg.enabled=false", "policy.megatron_cfg.enabled"),
    "literal-choice": ("policy.precision=fp64", "policy.precision"),
    "data-missing": ("data.train_path=/nonexistent/hpcrl/train.jsonl", "data.train_path"),
    "data-directory": ("data.train_path=/", "data.train_path"),
    "data-relative-missing": ("data.train_path=missing.jsonl", "data.train_path"),
    "nul-value": ("logger.wandb.name=a\x00b", ""),
    "newline-value": ("logger.wandb.name=a\nb", ""),
    "huge-value": ("logger.wandb.name=" + "x" * 100_000, ""),
    "unicode-key": ("grpö.max_num_steps=1", "grpö.max_num_steps"),
    "dtensor-alias-unknown": ("policy.dtensor_cfg.bogus=1", "policy.dtensor_cfg.bogus"),
    "plus-plus": ("++grpo.bogus=1", "grpo.bogus"),
    "tilde-delete": ("~grpo.max_num_steps", "~grpo.max_num_steps"),
    "env-vars-bad-name": ("policy.megatron_cfg.env_vars.1BAD=x", "policy.megatron_cfg.env_vars"),
    "model-overrides-junk": ("policy.megatron_cfg.model_overrides=3", "policy.megatron_cfg.model_overrides"),
    "betas-length": ("policy.optimizer.betas=[0.9]", "policy.optimizer.betas"),
    "top-p-zero": ("policy.generation.top_p=0", "policy.generation.top_p"),
    "generation-resources-missing": ("policy.generation.colocated.enabled=false", "policy.generation.colocated.resources"),
}  # fmt: skip
#: Overrides that are fine on their own (the command may accept them).
OVERRIDES_MAY_PASS = {"empty", "nul-value", "newline-value", "huge-value", "self-reference",
                      "validate-token-literal"}  # fmt: skip


def override_cases() -> list[Case]:
    cases = []
    for name, (override, key) in OVERRIDES.items():
        for command in ("validate", "render"):
            argv = (command, RECIPE, "--cluster", "local", override)
            if command == "render":
                argv += ("-o", "{case}/run")
            cases.append(
                Case(
                    family="overrides",
                    name=f"{command}-{name}",
                    argv=argv,
                    expect="any" if {name, f"{command}-{name}"} & OVERRIDES_MAY_PASS else "reject",
                    keys=(key,) if key else (),
                )
            )
    return cases


# --------------------------------------------------------------------------- run folders
def run_folder_cases() -> list[Case]:
    def make_file(folder: Path) -> None:
        (folder / "a-file").write_text("x")

    def a_home(folder: Path) -> None:
        (folder / "home" / ".ssh").mkdir(parents=True)
        (folder / "home" / ".bashrc").write_text("# mine\n")

    def rendered_run(folder: Path) -> None:
        (folder / "rendered").mkdir()
        (folder / "rendered" / "job.sbatch").write_text("#!/bin/bash\n")
        (folder / "rendered" / "manifest.json").write_text(
            json.dumps({"recipe_source": RECIPE, "profile": "local", "overrides": []})
        )

    def submitted_run(folder: Path) -> None:
        (folder / "run" / "submitit").mkdir(parents=True)
        (folder / "run" / "submitit" / "1_submitted.pkl").write_text("x")

    def planted_temp_link(folder: Path) -> None:
        (folder / "run").mkdir()
        (folder / "run" / "manifest.json").write_text("{}")  # an earlier run folder
        (folder / "victim").write_text("precious")
        for name in ("job.sbatch", "manifest.json", "recipe.resolved.yaml"):
            (folder / "run" / f"{name}.tmp").symlink_to(folder / "victim")
            (folder / "run" / f".{name}.tmp").symlink_to(folder / "victim")

    def planted_target_link(folder: Path) -> None:
        (folder / "run").mkdir()
        (folder / "run" / "manifest.json").write_text("{}")
        (folder / "victim").write_text("precious")
        (folder / "run" / "job.sbatch").symlink_to(folder / "victim")

    # submit cases use the test cluster's profile: a wrong accept meets the sbatch stand-in
    # (which refuses), never a real job
    plans = {
        "render": (RECIPE, "--cluster", "local"),
        "submit": (SLURM_RECIPE, "--cluster", "slurm-test"),
    }
    outs: dict[str, tuple[str, Callable[[Path], None] | None, str]] = {
        "onto-a-file": ("{case}/a-file", make_file, "reject"),
        "under-a-file": ("{case}/a-file/run", make_file, "reject"),
        "onto-proc": ("/proc/hpcrl-corpus", None, "reject"),
        "under-proc-self": ("/proc/self/hpcrl", None, "reject"),
        "onto-a-folder-of-other-files": ("{case}/home", a_home, "reject"),  # `-o ~`, `-o /`
        "onto-dev-null": ("/dev/null", None, "reject"),
        "percent": ("{case}/run%j", None, "reject"),
        "newline": ("{case}/run\nx", None, "reject"),
        "too-long-name": ("{case}/" + "x" * 300, None, "reject"),
        "too-long-path": ("{case}/" + "/".join(["y" * 200] * 25), None, "reject"),
        "dot-dot": ("{case}/a/../dotdot", None, "accept"),
        "submitted-folder": ("{case}/run", submitted_run, "reject"),
        "planted-temp-symlinks": ("{case}/run", planted_temp_link, "accept"),
        "planted-target-symlink": ("{case}/run", planted_target_link, "accept"),
        "empty-string": ("", None, "any"),
        "trailing-slash": ("{case}/run/", None, "accept"),
        "rendered-then-render": ("{case}/rendered", rendered_run, "accept"),
    }  # fmt: skip
    cases = []
    for name, (out, setup, expect) in outs.items():
        for command in ("render", "submit"):
            if command == "submit" and expect == "accept":
                continue  # a good folder would really submit a job
            argv = (command, *plans[command], "-o", out)
            cases.append(Case(family="run-folders", name=f"{command}-{name}", argv=argv,
                              setup=setup, expect=expect, verify=victim_untouched))  # fmt: skip
    paths: dict[str, tuple[str, Callable[[Path], None] | None]] = {
        "nope": ("/nope/hpcrl", None),
        "a-file": ("{case}/a-file", make_file),
        "empty-folder": ("{case}", None),
        "rendered-never-submitted": ("{case}/rendered", rendered_run),
        "proc": ("/proc/self", None),
        "dev-null": ("/dev/null", None),
        "dot-dot": ("{case}/../../nope", None),
    }
    for name, (path, setup) in paths.items():
        for argv in (("logs", path), ("logs", "-f", path), ("cancel", path), ("report", path),
                     ("status", path), ("logs", "--node", "0", path)):  # fmt: skip
            cases.append(
                Case(family="run-folders", name=f"{'-'.join(argv[:-1])}-{name}", argv=argv,
                     setup=setup, expect=_expect_for(argv[0], name))
            )  # fmt: skip
    return cases


def _expect_for(command: str, folder: str) -> str:
    if command == "status" or (command == "report" and folder == "rendered-never-submitted"):
        return "any"  # a listing; a rendered run has no metrics yet, which report says
    return "reject"


def victim_untouched(folder: Path) -> str | None:
    """A file outside the run folder that planted symlinks point at must keep its text."""
    victim = folder / "victim"
    if victim.exists() and victim.read_text() != "precious":
        return "symlink followed: a file outside the run folder was overwritten"
    return None


# --------------------------------------------------------------------------- metrics
def _metrics_lines() -> dict[str, tuple[bytes, tuple[str, ...]]]:
    good = [{"step": i, "time_step_s": 1.0 + i, "loss": 2.0 - i / 10, "reward_mean": i / 10,
             "peak_host_rss_gb": 1.5, "tokens_per_s": 100.0 * i} for i in range(1, 6)]  # fmt: skip

    def lines(records: list) -> bytes:
        return "".join(json.dumps(r) + "\n" for r in records).encode()

    nan_middle = [dict(r) for r in good]
    nan_middle[2]["peak_host_rss_gb"] = math.nan
    nan_middle[2]["time_step_s"] = math.nan
    strings = [dict(r) for r in good]
    strings[1]["loss"] = "abc"
    strings[3]["time_step_s"] = "slow"
    return {
        "empty": (b"", ()),
        "blank-lines": (b"\n\n\n", ()),
        "good": (lines(good), ()),
        "bad-line-middle": (lines(good[:2]) + b"{not json\n" + lines(good[2:]), ("skipped",)),
        "bad-line-last": (lines(good) + b'{"step": 6, "lo', ()),
        "non-utf8-middle": (lines(good[:2]) + b'{"step": 3, "x": "\xff\xfe"}\n' + lines(good[3:]), ("skipped",)),
        "binary": (bytes(range(256)) * 4, ()),
        "nan-values": (lines(nan_middle), ("NaN",)),
        "infinity": (lines(good).replace(b'"loss": 1.8', b'"loss": Infinity'), ("NaN",)),
        "strings-for-numbers": (lines(strings), ("not a number",)),
        "list-line": (lines(good[:2]) + b"[1, 2, 3]\n" + lines(good[2:]), ("skipped",)),
        "scalar-line": (lines(good[:2]) + b"42\n" + lines(good[2:]), ("skipped",)),
        "null-line": (lines(good[:2]) + b"null\n" + lines(good[2:]), ("skipped",)),
        "no-step": (b'{"loss": 1.0}\n{"loss": 0.5}\n', ()),
        "step-string": (b'{"step": "one", "loss": 1.0}\n', ()),
        "step-float": (b'{"step": 1.5, "loss": 1.0}\n', ()),
        "step-negative": (b'{"step": -1, "loss": 1.0}\n', ()),
        "reversed": (lines(list(reversed(good))), ()),
        "duplicate-steps": (lines(good + good[-2:]), ()),
        "huge-number": (b'{"step": 1, "loss": 1e400}\n', ()),
        "huge-int": (b'{"step": ' + b"9" * 5000 + b', "loss": 1.0}\n', ()),
        "deep-nesting": (b'{"step": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n", ()),
        "nested-values": (b'{"step": 1, "loss": {"a": 1}, "reward_mean": [1]}\n', ()),
        "bool-values": (b'{"step": 1, "loss": true, "time_step_s": false}\n', ()),
        "crlf": (lines(good).replace(b"\n", b"\r\n"), ()),
        "nul-bytes": (lines(good[:2]) + b"\x00\x00\x00\n" + lines(good[2:]), ("skipped",)),
        "bom": (b"\xef\xbb\xbf" + lines(good), ()),
        "many-lines": (lines(good * 2000), ()),
    }  # fmt: skip


def metrics_cases() -> list[Case]:
    cases = []
    for name, (content, says) in _metrics_lines().items():

        def setup(folder: Path, content: bytes = content) -> None:
            run = folder / "run"
            run.mkdir()
            (run / "metrics.jsonl").write_bytes(content)
            _write_job_json(run, _local_record(run))

        for command in ("report", "status"):
            argv = (command, "{case}/run") + (
                ("--out", "{case}/plots") if command == "report" else ()
            )
            cases.append(
                Case(family="metrics", name=f"{command}-{name}", argv=argv, setup=setup,
                     says=says if command == "report" else ())
            )  # fmt: skip

    def metrics_directory(folder: Path) -> None:
        (folder / "run" / "metrics.jsonl").mkdir(parents=True)
        _write_job_json(folder / "run", _local_record(folder / "run"))

    def metrics_fifo(folder: Path) -> None:
        import os

        (folder / "run").mkdir()
        os.mkfifo(folder / "run" / "metrics.jsonl")
        _write_job_json(folder / "run", _local_record(folder / "run"))

    for name, setup in (("a-directory", metrics_directory), ("a-fifo", metrics_fifo)):
        for command in ("report", "status"):
            cases.append(Case(family="metrics", name=f"{command}-{name}", argv=(command, "{case}/run"),
                              setup=setup))  # fmt: skip
    return cases


# --------------------------------------------------------------------------- job records
def _local_record(run: Path, **changes: Any) -> dict[str, Any]:
    record = {
        "executor": "local", "job_id": "999999999", "job_name": "corpus", "cluster": "local",
        "submitit_folder": str(run / "submitit"), "num_tasks": 1,
        "submitted_at": "2026-11-29T10:00:00+00:00", "max_requeues": 0, "array_index": None,
        "sweep_dir": None, "schema": 1,
    }  # fmt: skip
    record.update(changes)
    return record


def _slurm_record(run: Path, **changes: Any) -> dict[str, Any]:
    return _local_record(run, **{"executor": "slurm", "job_id": "4242", "num_tasks": 2, **changes})


def _write_job_json(run: Path, record: Any) -> None:
    (run / "job.json").write_text(json.dumps(record))


JOB_RECORDS: dict[str, Callable[[Path], Any]] = {
    "empty": lambda run: b"",
    "truncated": lambda run: json.dumps(_slurm_record(run))[:40].encode(),
    "non-utf8": lambda run: b'{"executor": "\xff\xfe"}',
    "binary": lambda run: bytes(range(256)),
    "list": lambda run: [1, 2],
    "string": lambda run: "job",
    "null": lambda run: None,
    "no-schema": lambda run: {k: v for k, v in _slurm_record(run).items() if k != "schema"},
    "schema-2": lambda run: _slurm_record(run, schema=2),
    "schema-string": lambda run: _slurm_record(run, schema="1"),
    "unknown-key": lambda run: _slurm_record(run, extra=1),
    "missing-job-id": lambda run: {k: v for k, v in _slurm_record(run).items() if k != "job_id"},
    "job-id-int": lambda run: _slurm_record(run, job_id=4242),
    "job-id-empty": lambda run: _slurm_record(run, job_id=""),
    "job-id-shell": lambda run: _slurm_record(run, job_id="1; rm -rf /"),
    "job-id-option": lambda run: _slurm_record(run, job_id="--me"),
    "local-job-id-word": lambda run: _local_record(run, job_id="abc"),
    "local-job-id-negative": lambda run: _local_record(run, job_id="-1"),
    "executor-pbs": lambda run: _slurm_record(run, executor="pbs"),
    "executor-null": lambda run: _slurm_record(run, executor=None),
    "num-tasks-zero": lambda run: _slurm_record(run, num_tasks=0),
    "num-tasks-negative": lambda run: _slurm_record(run, num_tasks=-3),
    "num-tasks-string": lambda run: _slurm_record(run, num_tasks="2"),
    "num-tasks-huge": lambda run: _slurm_record(run, num_tasks=10**9),
    "num-tasks-bool": lambda run: _slurm_record(run, num_tasks=True),
    "submitted-at-junk": lambda run: _local_record(run, submitted_at="yesterday"),
    "submitted-at-int": lambda run: _local_record(run, submitted_at=5),
    "folder-missing": lambda run: _slurm_record(run, submitit_folder="/nope/submitit"),
    "folder-int": lambda run: _slurm_record(run, submitit_folder=3),
    "max-requeues-string": lambda run: _slurm_record(run, max_requeues="x"),
    "array-index-string": lambda run: _slurm_record(run, array_index="x"),
    "nested": lambda run: {"job": _slurm_record(run)},
    "good-slurm": lambda run: _slurm_record(run),
    "good-local": lambda run: _local_record(run),
}


#: Records that are readable: commands work on them (a missing submitit folder only means
#: no logs yet).
GOOD_RECORDS = {"good-slurm", "good-local", "folder-missing"}


def _job_record_setup(
    content: Callable[[Path], Any], *, with_good_run: bool
) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        runs = folder / "runs"
        run = runs / "bad-run"
        run.mkdir(parents=True)
        value = content(run)
        if isinstance(value, bytes):
            (run / "job.json").write_bytes(value)
        else:
            _write_job_json(run, value)
        if with_good_run:
            good = runs / "good-run"
            good.mkdir()
            _write_job_json(good, _local_record(good))

    return setup


def job_record_cases() -> list[Case]:
    cases = []
    for name, content in JOB_RECORDS.items():
        bad = name not in GOOD_RECORDS
        commands = {
            "status-all": (("status", "--runs-dir", "{case}/runs"), ("good-run",)),
            "status": (("status", "{case}/runs/bad-run"), ()),
            "logs": (("logs", "{case}/runs/bad-run"), ()),
            "logs-follow": (("logs", "-f", "{case}/runs/bad-run"), ()),
            "cancel": (("cancel", "{case}/runs/bad-run"), ()),
        }
        for command, (argv, says) in commands.items():
            for sacct in ("empty", "fail") if name in ("good-slurm",) else ("empty",):
                cases.append(
                    Case(
                        family="job-records",
                        name=f"{command}-{name}" + (f"-sacct-{sacct}" if sacct != "empty" else ""),
                        argv=argv,
                        setup=_job_record_setup(content, with_good_run=command == "status-all"),
                        expect="reject" if bad and command in ("logs", "cancel") else "any",
                        says=says + (("job.json",) if bad and command == "status-all" else ()),
                        sacct=sacct,
                    )
                )
    for sacct in ("missing", "fail", "garbage", "running", "completed"):
        for command, argv in (("status", ("status", "{case}/runs/bad-run")),
                              ("cancel", ("cancel", "{case}/runs/bad-run")),
                              ("logs-follow", ("logs", "-f", "{case}/runs/bad-run"))):  # fmt: skip
            if (command, sacct) == ("logs-follow", "running"):
                continue  # following a running job goes on until it ends: not a hang
            cases.append(Case(family="job-records", name=f"{command}-sacct-{sacct}", argv=argv,
                              setup=_job_record_setup(JOB_RECORDS["good-slurm"], with_good_run=False),
                              sacct=sacct))  # fmt: skip
    return cases + sweep_record_cases()


def sweep_record_cases() -> list[Case]:
    records: dict[str, bytes] = {
        "empty": b"",
        "non-utf8": b"\xff\xfe",
        "list": b"[]",
        "no-points": json.dumps({"schema": 1, "name": "s"}).encode(),
        "points-junk": json.dumps({"schema": 1, "name": "s", "recipe_source": "r", "cluster": "c",
                                   "overrides": [], "swept_keys": [], "points": [1, 2]}).encode(),
        "schema-9": json.dumps({"schema": 9}).encode(),
        "point-escapes": json.dumps({"schema": 1, "name": "s", "recipe_source": "r", "cluster": "c",
                                     "overrides": [], "swept_keys": ["x"],
                                     "points": [{"index": "../../etc", "values": {"x": "1"}}]}).encode(),
    }  # fmt: skip
    cases = []
    for name, content in records.items():

        def setup(folder: Path, content: bytes = content) -> None:
            (folder / "runs" / "s-sweep").mkdir(parents=True)
            (folder / "runs" / "s-sweep" / "sweep.json").write_bytes(content)
            (folder / "runs" / "good-run").mkdir()
            _write_job_json(
                folder / "runs" / "good-run", _local_record(folder / "runs" / "good-run")
            )

        for command, argv in (("status-all", ("status", "--runs-dir", "{case}/runs")),
                              ("status", ("status", "{case}/runs/s-sweep")),
                              ("report", ("report", "{case}/runs/s-sweep")),
                              ("cancel", ("cancel", "{case}/runs/s-sweep")),
                              ("logs", ("logs", "{case}/runs/s-sweep"))):  # fmt: skip
            cases.append(Case(family="job-records", name=f"sweep-{command}-{name}", argv=argv,
                              setup=setup, expect="any" if command.startswith("status") else "reject",
                              says=("good-run",) if command == "status-all" else ()))  # fmt: skip
    return cases


# --------------------------------------------------------------------------- CLI arguments
CLI_ARGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "no-command": ((), ()),
    "unknown-command": (("frobnicate",), ()),
    "render-no-recipe": (("render",), ()),
    "render-no-cluster": (("render", RECIPE), ()),
    "cluster-missing": (("render", RECIPE, "--cluster", "nope"), ("--cluster",)),
    "cluster-empty": (("render", RECIPE, "--cluster", ""), ("--cluster",)),
    "cluster-directory": (("render", RECIPE, "--cluster", "{case}"), ("--cluster",)),
    "cluster-dev-null": (("render", RECIPE, "--cluster", "/dev/null"), ()),
    "recipe-missing": (("render", "nope-recipe", "--cluster", "local"), ("recipe",)),
    "recipe-empty": (("render", "", "--cluster", "local"), ("recipe",)),
    "recipe-directory": (("render", "{case}", "--cluster", "local"), ("folder",)),
    "recipe-dev-null": (("render", "/dev/null", "--cluster", "local"), ()),
    "recipe-path-missing": (("render", "{case}/nope.yaml", "--cluster", "local"), ("recipe",)),
    "recipe-is-profile": (("render", str(SLURM_PROFILE), "--cluster", "local"), ()),
    "profile-is-recipe": (("render", RECIPE, "--cluster", str(REPO / "recipes" / f"{RECIPE}.yaml")), ()),
    "unknown-option": (("render", RECIPE, "--cluster", "local", "--frob"), ()),
    "stray-word": (("render", RECIPE, "--cluster", "local", "word"), ()),
    "logs-node-negative": (("logs", "--node", "-1", "{case}"), ()),
    "logs-node-word": (("logs", "--node", "x", "{case}"), ()),
    "logs-attempt-zero": (("logs", "--attempt", "0", "{case}"), ()),
    "status-runs-dir-missing": (("status", "--runs-dir", "/nope/runs"), ()),
    "status-runs-dir-file": (("status", "--runs-dir", "/dev/null"), ()),
    "status-runs-dir-proc": (("status", "--runs-dir", "/proc/self/fd"), ()),
    "report-out-proc": (("report", "{case}", "--out", "/proc/hpcrl"), ()),
    "sweep-no-grid": (("sweep", SLURM_RECIPE, "--cluster", "slurm-test", "--no-submit"), ("--grid",)),
    "sweep-grid-no-equals": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed", "--no-submit"), ("--grid",)),
    "sweep-grid-empty-key": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "=1,2", "--no-submit"), ("--grid",)),
    "sweep-grid-empty-value": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,,2", "--no-submit"), ("--grid",)),
    "sweep-grid-duplicate-points": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,1", "--no-submit", "-o", "{case}/sw"), ("grpo.seed",)),
    "sweep-grid-same-key-twice": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "--grid", "grpo.seed=3", "--no-submit"), ("grpo.seed",)),
    "sweep-zip-lengths": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--zip", "grpo.seed=1,2", "--zip", "grpo.max_num_steps=1", "--no-submit"), ("--zip",)),
    "sweep-bad-point": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,x", "--no-submit", "-o", "{case}/sw"), ("grpo.seed",)),
    "sweep-unknown-key": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.sead=1,2", "--no-submit", "-o", "{case}/sw"), ("grpo.sead",)),
    "sweep-local-profile": (("sweep", RECIPE, "-c", "local", "--grid", "grpo.seed=1,2", "--no-submit", "-o", "{case}/sw"), ("scheduler",)),
    "sweep-wait-no-submit": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "--no-submit", "--wait"), ("--no-submit",)),
    "sweep-out-file": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "--no-submit", "-o", "/dev/null"), ()),
    "sweep-huge-grid": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=" + ",".join(map(str, range(3000))), "--no-submit", "-o", "{case}/sw"), ()),
    "submit-sbatch-refuses": (("submit", SLURM_RECIPE, "-c", "slurm-test", "-o", "{case}/run"), ("sbatch",)),
    "sweep-sbatch-refuses": (("sweep", SLURM_RECIPE, "-c", "slurm-test", "--grid", "grpo.seed=1,2", "-o", "{case}/sw"), ("sbatch",)),
    "submit-no-sbatch": (("submit", SLURM_RECIPE, "-c", "slurm-test", "-o", "{case}/run"), ("Slurm",)),
    "show-bad-override": (("show", RECIPE, "-c", "local", "grpo.bogus=1"), ("grpo.bogus",)),
    "validate-secret-override": (("validate", RECIPE, "-c", "local", f"logger.wandb.name={TOKEN}"), ()),
    "show-secret-override": (("show", RECIPE, "-c", "local", f"logger.wandb.name={TOKEN}"), ()),
    "help": (("--help",), ()),
    "render-help": (("render", "--help"), ()),
    "version": (("--version",), ()),
}  # fmt: skip
CLI_MAY_PASS = {"help", "render-help", "version", "status-runs-dir-missing", "status-runs-dir-file",
                "status-runs-dir-proc", "validate-secret-override", "show-secret-override",
                "sweep-huge-grid", "report-out-proc"}  # fmt: skip


def cli_cases() -> list[Case]:
    return [
        Case(
            family="cli-arguments",
            name=name,
            argv=argv,
            expect="any" if name in CLI_MAY_PASS else "reject",
            keys=keys,
            sacct="missing" if name == "submit-no-sbatch" else "empty",
            deadline_s=60.0 if name == "sweep-huge-grid" else 30.0,
        )
        for name, (argv, keys) in CLI_ARGS.items()
    ]


def build_corpus(resolved_recipe: dict) -> list[Case]:
    cases = (
        recipe_cases(resolved_recipe) + profile_cases() + override_cases() + run_folder_cases()
        + metrics_cases() + job_record_cases() + cli_cases()
    )  # fmt: skip
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), "case names must be unique"
    return cases

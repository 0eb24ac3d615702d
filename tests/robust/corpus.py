"""The bad-input corpus: parametrized families of login-node inputs, generated here and in
corpus_runs.py (what commands find on disk) and corpus_commands.py (what the user types).

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

from tests.robust.corpus_commands import cli_cases, override_cases
from tests.robust.corpus_runs import (
    SLURM_PROFILE,
    SLURM_RECIPE,
    TOKEN,
    job_record_cases,
    metrics_cases,
    run_folder_cases,
)
from tests.robust.harness import Case

SEED = 13

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
#: Junk that no key accepts: the command must refuse it (no value may come from a secret).
ALWAYS_BAD = {"nan", "inf", "env-missing", "bad-reference", "mandatory", "env-secret"}


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
        # issue 26: the login node's time and memory
        "over-a-megabyte": b"x: [" + b"1," * 600_000 + b"1]\n",
        "over-10000-nodes": b"x:\n" + b"".join(b"  k%d: %d\n" % (i, i) for i in range(12_000)),
        "alias-expansion": b"a: &a [1,1,1,1,1,1,1,1,1,1]\n"
        + b"".join(
            b"l%d: &l%d [%s]\n" % (i, i, b",".join([b"*a" if i == 1 else b"*l%d" % (i - 1)] * 10))
            for i in range(1, 9)
        ),
        "interpolation-doubling": b"logger:\n  wandb:\n    name: ${s39}\ns0: ab\n"
        + b"".join(b"s%d: ${s%d}${s%d}\n" % (i, i - 1, i - 1) for i in range(1, 40)),
        "interpolation-chain": b"logger:\n  wandb:\n    name: ${x2999}\nx0: ab\n"
        + b"".join(b"x%d: ${x%d}\n" % (i, i - 1) for i in range(2999, 0, -1)),
        "defaults-a-device": b"defaults: /dev/zero\n",
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
    cases += _profile_secret_cases(base) + _profile_bound_cases(base) + _image_cases(base)
    argv = ("render", SLURM_RECIPE, "--cluster", "{case}/profile.yaml")
    return cases + broken_file_cases("profiles", "profile.yaml", argv)


def _profile_secret_cases(base: dict) -> list[Case]:
    slurm = base["slurm"]
    secrets = {
        # case name: (key the rejection names, section, its value)
        "env.HF_TOKEN": ("env.HF_TOKEN", "env", {"HF_TOKEN": "literal"}),
        "env.AWS_ACCESS_KEY_ID": ("env.AWS_ACCESS_KEY_ID", "env", {"AWS_ACCESS_KEY_ID": "AKIAABCDEFGHIJKLMNOP"}),
        "env.HARMLESS": ("env.HARMLESS", "env", {"HARMLESS": "${oc.env:GITHUB_PAT}"}),
        "env.HARMLESS-quoted-name": ("env.HARMLESS", "env", {"HARMLESS": '${oc.env:"DB_PASSWORD"}'}),
        "env.HARMLESS-indirect": ("env.HARMLESS", "env", {"A": "${oc.env:WANDB_API_KEY}", "HARMLESS": "x${env.A}"}),
        "setup_lines[0]": ("setup_lines[0]", "setup_lines", [f"export HF_TOKEN={TOKEN}"]),
        "slurm.srun_args[0]": ("slurm.srun_args[0]", "slurm", {**slurm, "srun_args": ["--export=ALL,DB_PASSWORD=x1"]}),
        "slurm.srun_args-name-first": ("slurm.srun_args[0]", "slurm", {**slurm, "srun_args": ["--export=GITHUB_PAT=abc,ALL"]}),
        "slurm.srun_args-split": ("slurm.srun_args[1]", "slurm", {**slurm, "srun_args": ["--export", "NONE,APP_SECRET=abc"]}),
        "slurm.sbatch_args[0]": ("slurm.sbatch_args[0]", "slurm", {**slurm, "sbatch_args": ["--comment=${oc.env:DB_PASSWORD}"]}),
        "slurm.sbatch_args-name-first": ("slurm.sbatch_args[0]", "slurm", {**slurm, "sbatch_args": ["--export=DB_PASSWORD=hunter22xyz"]}),
        "slurm.sbatch_args-quoted": ("slurm.sbatch_args[0]", "slurm", {**slurm, "sbatch_args": ['--export="HF_TOKEN=abc"']}),
    }  # fmt: skip
    cases = []
    for name, (key, section, value) in secrets.items():
        data = {**base, section: value}
        cases.append(
            Case(
                family="profiles",
                name=f"secret-{name}",
                argv=("render", SLURM_RECIPE, "--cluster", "{case}/profile.yaml"),
                setup=_write_yaml("profile.yaml", data),
                expect="reject",
                keys=(key,),
            )
        )
    return cases


def _profile_bound_cases(base: dict) -> list[Case]:
    """Per-node sizes no node has (rendered as ``--cpus-per-task``/``--mem`` until refused)."""
    bounds = {
        "gpus_per_node": {"gpus_per_node": -2},
        "slurm.time_limit": {"slurm": {**base["slurm"], "time_limit": "99999999-00:00:00"}},
        "slurm.max_requeues": {"slurm": {**base["slurm"], "max_requeues": 10**20}},
        "cpus_per_node": {"cpus_per_node": 10**20},
        "slurm.mem_gb": {"slurm": {**base["slurm"], "mem_gb": 10**20}},
        "cpus_per_node+slurm.mem_gb": {"cpus_per_node": 5000, "slurm": {**base["slurm"], "mem_gb": 10**6}},
    }  # fmt: skip
    return [
        Case(
            family="profiles",
            name=f"bound-{name}",
            argv=("render", SLURM_RECIPE, "--cluster", "{case}/profile.yaml", "-o", "{case}/run"),
            setup=_write_yaml("profile.yaml", {**base, **changes}),
            expect="reject",
            keys=tuple(name.split("+")),
            says=tuple(f"error {key} = " for key in name.split("+")),
        )
        for name, changes in bounds.items()
    ]


def _image_cases(base: dict) -> list[Case]:
    """Images pyxis cannot pull as written, or whose Ray contradicts the profile (issue 26)."""
    container = {"mounts": ["/tmp:/tmp"], "workdir": "/tmp"}
    images = {
        # name: (profile changes, key a rejection names)
        "image-docker-form": ({"image": "nvcr.io/nvidia/nemo-rl:v0.7.0"}, {}, "container.image"),
        "image-url": ({"image": "https://nvcr.io/nvidia/nemo-rl:v0.7.0"}, {}, "container.image"),
        "image-ray-too-old": ({"image": "nvcr.io#nvidia/nemo-rl:v0.4.0"}, {}, "container.image"),
        "image-ray-without-token-auth": ({"image": "nvcr.io#nvidia/nemo-rl:v0.5.0"}, {}, "ray_auth"),
        "ray-version-without-token-auth": ({"image": "/images/mine.sqsh"}, {"ray_version": "2.49.2"}, "ray_auth"),
        "ray-version-junk": ({"image": "/images/mine.sqsh"}, {"ray_version": "latest"}, "ray_version"),
        "ray-version-number": ({"image": "/images/mine.sqsh"}, {"ray_version": 2.5}, "ray_version"),
    }  # fmt: skip
    return [
        Case(
            family="profiles",
            name=name,
            argv=("render", SLURM_RECIPE, "--cluster", "{case}/profile.yaml", "-o", "{case}/run"),
            setup=_write_yaml("profile.yaml", {**base, **top, "container": {**container, **image}}),
            expect="reject",
            keys=(key,),
        )
        for name, (image, top, key) in images.items()
    ]


def build_corpus(resolved_recipe: dict) -> list[Case]:
    cases = (
        recipe_cases(resolved_recipe) + profile_cases() + override_cases() + run_folder_cases()
        + metrics_cases() + job_record_cases() + cli_cases()
    )  # fmt: skip
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), "case names must be unique"
    return cases

"""Injection: hostile strings in every field that reaches a script never execute.

Each field that reaches the script gets arbitrary text mixed with shell payloads (quotes,
``$()``, backticks, newlines, ``;``, ``&&``, globs, redirections) that would create
``$MARKER`` if they ever ran. The rendered script must parse (``bash -n``) and, run under a
harness whose ``srun`` / ``python3`` are stand-ins recording their arguments and environment
(real Slurm is not needed to see what the shell passes on), must pass every value through
byte for byte and never create the marker or any other file.

Not covered by design: ``setup_lines`` (raw shell written by the site, see the profile
schema). Names (env keys, pass_env) are not quoted but validated as identifiers: a test
below checks that anything else is rejected by the planner.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hpcrl.config.errors import ConfigError
from hpcrl.config.profile import ContainerCfg, SlurmCfg
from hpcrl.plan.images import enroot_form_of
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.plan.planning_inputs import GOLDEN_HOME, local_profile, pyxis_profile
from tests.recipe_builder import megatron_recipe
from tests.render.fuzz_injection import count_example, injection_examples
from tests.render.sbatch_parser import parse_sbatch_argument
from tests.render.shell import assert_bash_parses

PAYLOADS = [
    "$(touch $MARKER)",
    "`touch $MARKER`",
    "; touch $MARKER;",
    "\ntouch $MARKER\n",
    "&& touch $MARKER",
    "' ; touch \"$MARKER\" ; '",
    '" ; touch $MARKER ; "',
    "$(touch${IFS}$MARKER)",
    "> $MARKER",
    "| tee $MARKER",
    "${MARKER:?}",
    "*",
    "?",
    "[a-z]",
    "{a,b}",
    "~",
    "\\",
    "#",
    "!",
    "%j",
    "\r",
    "\t",
    " ",
]
# No shrinking: every example runs bash three times, and the hostile strings are already short.
SETTINGS = settings(
    max_examples=injection_examples(),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)

no_nul = st.text(
    alphabet=st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=12
)
hostile = st.lists(st.one_of(st.sampled_from(PAYLOADS), no_nul), min_size=1, max_size=5).map(
    "".join
)
# container images: hostile, but not in Docker's registry/path form (e.g. "a.b/c"), which the
# planner refuses and names the enroot form of (tests/plan cover that refusal)
image_like = hostile.filter(lambda text: enroot_form_of(text.strip()) in (None, text.strip()))
# #SBATCH values: the planner refuses non-printable characters there
one_line = hostile.map(lambda text: "".join(ch for ch in text if ch.isprintable()))
# mounts and the run folder: no separator characters (the planner rejects those), absolute
path_like = one_line.map(lambda text: "/" + re.sub(r"[\s,:%]", "", text))


@attrs.frozen
class Harness:
    """A temp folder with stand-in ``srun``/``python3`` that record argv (NUL-separated) and env."""

    root: Path

    @classmethod
    def create(cls, root: Path) -> Harness:
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name in ("srun", "python3"):
            stand_in = bin_dir / name
            stand_in.write_text(
                '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$RECORD"\nenv -0 > "$RECORD.env"\n'
            )
            stand_in.chmod(0o755)
        return cls(root)

    def run(self, text: str) -> tuple[list[str], dict[str, str]]:
        work = self.root / "work"
        work.mkdir()
        script, marker, record = self.root / "job.sh", self.root / "marker", self.root / "record"
        script.write_text(text)
        environ = {
            "PATH": f"{self.root / 'bin'}:/usr/bin:/bin",
            "MARKER": str(marker),
            "RECORD": str(record),
        }
        result = subprocess.run(
            ["bash", str(script)], cwd=work, env=environ, capture_output=True, timeout=30
        )
        try:
            assert result.returncode == 0, result.stderr.decode(errors="replace")
            assert not marker.exists(), "an injected payload ran"
            assert list(work.iterdir()) == [], "the script created files"
            argv = record.read_bytes().decode().split("\0")[:-1]
            env = dict(
                item.split("=", 1)
                for item in Path(f"{record}.env").read_bytes().decode().split("\0")
                if item
            )
            return argv, env
        finally:
            for path in (script, marker, record, Path(f"{record}.env")):
                path.unlink(missing_ok=True)
            for path in work.iterdir():
                path.unlink()
            work.rmdir()


def assert_sbatch_lines_round_trip(text: str, directives) -> None:
    """Each #SBATCH line is one line and sbatch reads back exactly its key and value."""
    lines = [line for line in text.split("\n") if line.startswith("#SBATCH")]
    assert len(lines) == len(directives)
    for line, (key, value) in zip(lines, directives, strict=True):
        expected = f"--{key}" if value is None else f"--{key}={value}"
        assert parse_sbatch_argument(line.removeprefix("#SBATCH ")) == expected


def assert_env_passed(spec, env: dict[str, str]) -> None:
    for name, value in spec.env:
        assert env[name] == value, name


@SETTINGS
@given(
    job_name=one_line,
    account=one_line,
    partition=one_line,
    qos=one_line,
    sbatch_value=one_line,
    image=image_like,
    mount=path_like,
    workdir=hostile,
    srun_arg=hostile,
    python=st.lists(hostile, min_size=1, max_size=2),
    env_value=hostile,
    megatron_env_value=hostile,
    run_dir=path_like,
    override=hostile,
    recipe_source=hostile,
)
def test_pyxis_script_never_runs_injected_text(
    tmp_path_factory,
    job_name,
    account,
    partition,
    qos,
    sbatch_value,
    image,
    mount,
    workdir,
    srun_arg,
    python,
    env_value,
    megatron_env_value,
    run_dir,
    override,
    recipe_source,
):
    count_example("pyxis")
    profile = pyxis_profile(
        slurm=SlurmCfg(
            account=account,
            partition=partition,
            qos=qos,
            sbatch_args=(f"--comment={sbatch_value}",) if sbatch_value else (),
            srun_args=(srun_arg,),
        ),
        container=ContainerCfg(image=image, mounts=("/lustre:/lustre", mount), workdir=workdir),
        env={
            "INJECTED": env_value,
            "NRL_MEGATRON_CHECKPOINT_DIR": "/lustre/ckpt",
            "HOME": GOLDEN_HOME,
        },
        python=shlex.join(python),
        setup_lines=(),
    )
    recipe = megatron_recipe(env_vars={"MEGATRON_INJECTED": megatron_env_value})
    spec = plan(
        recipe,
        profile,
        run_dir=run_dir,
        recipe_source=recipe_source,
        job_name=job_name or "j",
        overrides=[override],
    )
    text = render_sbatch(spec)
    assert_bash_parses(text)
    assert_sbatch_lines_round_trip(text, spec.sbatch_directives)
    argv, env = Harness.create(tmp_path_factory.mktemp("harness")).run(text)
    assert argv == [*spec.srun_args, *spec.task_argv]
    assert spec.container.image == image and f"--container-image={image}" in argv
    assert env["INJECTED"] == env_value and env["MEGATRON_INJECTED"] == megatron_env_value
    assert_env_passed(spec, env)


@SETTINGS
@given(
    env_value=hostile, run_dir=path_like, override=hostile, recipe_source=hostile, job_name=one_line
)
def test_local_script_never_runs_injected_text(
    tmp_path_factory, env_value, run_dir, override, recipe_source, job_name
):
    count_example("local")
    profile = local_profile(  # python3: the harness's recording stand-in
        env={"INJECTED": env_value, "HOME": GOLDEN_HOME}, pass_env=("HF_TOKEN",), python="python3"
    )
    recipe = megatron_recipe(num_nodes=1, gpus_per_node=2)
    spec = plan(
        recipe,
        profile,
        run_dir=run_dir,
        recipe_source=recipe_source,
        job_name=job_name or "j",
        overrides=[override],
    )
    text = render_sbatch(spec)
    assert_bash_parses(text)
    argv, env = Harness.create(tmp_path_factory.mktemp("harness")).run(text)
    assert argv == list(spec.task_argv[1:])
    assert env["INJECTED"] == env_value
    assert_env_passed(spec, env)


@SETTINGS
@given(name=hostile)
def test_names_that_are_not_identifiers_are_rejected(name):
    count_example("names")
    is_identifier = re.fullmatch(
        r"[A-Za-z_][A-Za-z0-9_]*", name
    ) is not None and not name.startswith(("HPCRL_", "SUBMITIT_", "SLURM_"))
    profile = local_profile(
        env={name: "v", "HOME": GOLDEN_HOME},
        pass_env=(name + "_PASSED",) if is_identifier else (name,),
    )
    recipe = megatron_recipe(num_nodes=1, gpus_per_node=2, env_vars={name: "v"})
    try:
        plan(recipe, profile, run_dir="/runs/x", recipe_source="r")
    except ConfigError as error:
        assert not is_identifier
        paths = {problem.path for problem in error.errors}
        assert {
            f"profile[local].env.{name}",
            "profile[local].pass_env[0]",
            f"policy.megatron_cfg.env_vars.{name}",
        } <= paths
    else:
        assert is_identifier


def test_newlines_cannot_reach_sbatch_lines():
    profile = pyxis_profile(slurm=SlurmCfg(account="a\ntouch /tmp/x", partition="p\r"))
    with pytest.raises(ConfigError) as caught:
        plan(megatron_recipe(), profile, run_dir="/runs/x", recipe_source="r", job_name="n\nx")
    paths = {problem.path for problem in caught.value.errors}
    assert {"profile[site].slurm.account", "profile[site].slurm.partition", "job-name"} <= paths

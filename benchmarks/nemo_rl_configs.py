"""NeMo RL's own example configs through ``hpcrl validate`` and ``hpcrl render``, unmodified.

    .venv/bin/python benchmarks/nemo_rl_configs.py ../shared/nemo-rl/main-7ea279a [--cluster eos]
        [--all] [--bar 0.95] [--quiet] [--unlocks]

FOLDER is laid out like NeMo RL's repository (``examples/configs/...``). Every GRPO and SFT
config (``family``: not DPO, distillation, PPO, RM, VLM/audio, eval; ``--all`` lists the others
too, outside the total; so does a config whose ``defaults:`` names a file the folder lacks:
"incomplete") goes through the CLI in this process, exactly as a user types it:
``hpcrl validate CONFIG --cluster eos`` and ``hpcrl render CONFIG --cluster eos -o TMP``. One
line per config: validate rc, render rc, the config, the first error. Then the totals: how
many validate and render, the share that passes both, and the tracebacks (any exception
other than a ConfigError/UserError the CLI reports: always a bug). Exit 1 when the share is
below ``--bar`` or any traceback occurred. ``--unlocks``: every error of each refused config
counted per feature, to find which features unlock the most configs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

CONFIGS = Path("examples") / "configs"
OTHER_ALGORITHMS = (
    "dpo",
    "distillation",
    "ppo",
    "rm",
    "teacher",
    "value",
    "on_policy_distillation",
)
MULTIMODAL_WORDS = ("vlm", "avlm", "audio", "omni", "video")
TRACEBACK = "TRACEBACK"
#: The families the total counts: what hpcrl trains.
COUNTED = ("grpo", "sft")
#: Free-form mappings: a refusal of any entry of one is a refusal of the mapping.
FREE_FORM = ("env_vars", "hf_config_overrides", "chat_template_kwargs")


@attrs.frozen
class Outcome:
    """One config: its family, the two exit codes (None: not run) and the first error."""

    config: str
    family: str
    validate_rc: int | None = None
    render_rc: int | None = None
    first_error: str = ""
    #: the paths of every error of the step that failed (not only the first)
    refused: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.validate_rc == 0 and self.render_rc == 0

    @property
    def traceback(self) -> bool:
        return self.first_error.startswith(TRACEBACK)


def family(path: Path, root: Path, cache: dict[Path, Any] | None = None) -> str:
    """'grpo' or 'sft' (in the total), else what excludes it (NeMo RL's own sections and
    names say it: a ``dpo:`` section, ``vlm`` in the name, a config under evals/), or
    'incomplete' when a ``defaults:`` file it names is not in the folder (NeMo RL itself
    cannot read it from there either)."""
    from hpcrl.config.nemo_rl_keys_build import merged_raw

    relative = path.relative_to(root / CONFIGS)
    if relative.parts[0] == "evals":
        return "eval"
    words = relative.as_posix().lower()
    if any(word in words for word in MULTIMODAL_WORDS):
        return "vlm"
    if missing_bases(path):
        return "incomplete"
    data = merged_raw(path, cache)
    for section in OTHER_ALGORITHMS:
        value = data.get(section)
        if value is not None and not (isinstance(value, dict) and value.get("enabled") is False):
            return section
    for name in ("grpo", "sft"):
        if data.get(name) is not None:
            return name
    return "other"


def missing_bases(path: Path) -> list[Path]:
    """The ``defaults:`` files of ``path`` and of its bases that do not exist."""
    from hpcrl.config.yaml_text import load_yaml

    bases = load_yaml(path).get("defaults") or []
    missing = []
    for base in [bases] if isinstance(bases, str) else bases:
        target = path.parent / base
        missing += missing_bases(target) if target.is_file() else [target]
    return missing


@attrs.frozen
class CliResult:
    """One ``hpcrl`` command: exit code, first error, the paths of all its errors."""

    rc: int
    first_error: str = ""
    refused: tuple[str, ...] = ()


def run_cli(argv: Sequence[str]) -> CliResult:
    """One ``hpcrl`` command run in this process."""
    from hpcrl.cli.main import main
    from hpcrl.config.errors import ConfigError, UserError

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return CliResult(main(["--debug", *argv]))
    except ConfigError as error:
        errors = error.errors or error.problems
        paths = tuple(dict.fromkeys(feature_of(problem.path) for problem in errors))
        return CliResult(2, " ".join(errors[0].format().split()), paths)
    except UserError as error:
        return CliResult(2, " ".join(str(error).split()), ("(user error)",))
    except SystemExit as exit_:  # argparse
        code = exit_.code if isinstance(exit_.code, int) else 2
        return CliResult(code, " ".join(err.getvalue().split())[-300:], ("(argparse)",))
    except Exception as error:
        text = f"{TRACEBACK} {type(error).__name__}: {' '.join(str(error).split())[:300]}"
        return CliResult(1, text, (TRACEBACK,))


def feature_of(path: str) -> str:
    """A refused path as the feature it names: list indices and the names inside free-form
    mappings (env_vars.X, hf_config_overrides.X) dropped."""
    path = re.sub(r"\[\d+\]", "", path)
    for mapping in FREE_FORM:
        head, found, _ = path.partition(f".{mapping}.")
        if found:
            return f"{head}.{mapping}"
    return path


def check(
    path: Path, root: Path, cluster: str, runs: Path, cache: dict, validate: bool = True
) -> Outcome:
    """One config through validate and render. ``validate=False`` (the CI bar's test):
    render alone, which validates first with the same code, so its rc and first error stand
    for both."""
    name = path.relative_to(root / CONFIGS).as_posix()
    kind = family(path, root, cache)
    if kind not in COUNTED:
        return Outcome(config=name, family=kind)
    validated = run_cli(["validate", str(path), "--cluster", cluster]) if validate else None
    out = runs / name.replace("/", "__").removesuffix(".yaml")
    rendered = run_cli(["render", str(path), "--cluster", cluster, "-o", str(out)])
    failed = validated if validated is not None and validated.rc != 0 else rendered
    return Outcome(
        config=name,
        family=kind,
        validate_rc=rendered.rc if validated is None else validated.rc,
        render_rc=rendered.rc,
        first_error=failed.first_error,
        refused=failed.refused,
    )


def run_all(root: Path, cluster: str = "eos", validate: bool = True) -> list[Outcome]:
    paths = sorted((root / CONFIGS).rglob("*.yaml"))
    if not paths:
        raise SystemExit(f"no configs under {root / CONFIGS}: give a NeMo RL folder")
    cache: dict[Path, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hpcrl-nemo-rl-configs-") as runs:
        return [check(path, root, cluster, Path(runs), cache, validate) for path in paths]


def share_passed(outcomes: Iterable[Outcome]) -> tuple[int, int]:
    """(passed, counted) over the GRPO and SFT configs."""
    counted = [outcome for outcome in outcomes if outcome.validate_rc is not None]
    return sum(outcome.passed for outcome in counted), len(counted)


def report(outcomes: list[Outcome], show_all: bool, quiet: bool) -> str:
    lines = []
    if not quiet:
        lines.append(f"{'val':>3} {'ren':>3}  config  first error")
        for outcome in outcomes:
            if outcome.validate_rc is None:
                if show_all:
                    lines.append(f"  -   -  {outcome.config}  (not counted: {outcome.family})")
                continue
            lines.append(
                f"{outcome.validate_rc:>3} {outcome.render_rc:>3}  {outcome.config}"
                + (f"  {outcome.first_error}" if outcome.first_error else "")
            )
    passed, counted = share_passed(outcomes)
    by_family = Counter(outcome.family for outcome in outcomes)
    validated = sum(outcome.validate_rc == 0 for outcome in outcomes)
    rendered = sum(outcome.render_rc == 0 for outcome in outcomes)
    tracebacks = sum(outcome.traceback for outcome in outcomes)
    lines += [
        "",
        "configs: " + ", ".join(f"{name} {count}" for name, count in sorted(by_family.items())),
        f"GRPO+SFT: {counted}; validate rc 0: {validated}; render rc 0: {rendered}; "
        f"both: {passed}/{counted} = {passed / max(counted, 1):.1%}; tracebacks: {tracebacks}",
    ]
    return "\n".join(lines)


def unlocks(outcomes: list[Outcome]) -> str:
    """Which refused features unlock the most configs: per feature, the configs it is the
    only blocker of ("alone") and the configs it blocks at all ("in"). A config's features
    are those of the step that failed: render's own refusals show only once validate passes,
    so "alone" is an upper bound for a config that validates after the fix."""
    failed = [o for o in outcomes if o.validate_rc is not None and not o.passed]
    alone = Counter(o.refused[0] for o in failed if len(o.refused) == 1)
    within = Counter(feature for o in failed for feature in o.refused)
    lines = ["", f"{'alone':>5} {'in':>4}  refused feature (every error of the failing step)"]
    for feature, count in within.most_common():
        lines.append(f"{alone[feature]:>5} {count:>4}  {feature}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="NeMo RL folder (examples/configs inside)")
    parser.add_argument("--cluster", default="eos", help="cluster profile (default: eos)")
    parser.add_argument("--all", action="store_true", help="list the configs not counted too")
    parser.add_argument("--quiet", action="store_true", help="totals only")
    parser.add_argument(
        "--unlocks", action="store_true", help="count every refusal per feature, not the first"
    )
    parser.add_argument("--bar", type=float, default=0.95, help="exit 1 below this share")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    outcomes = run_all(args.folder, args.cluster)
    print(report(outcomes, args.all, args.quiet))
    if args.unlocks:
        print(unlocks(outcomes))
    print(f"({time.perf_counter() - started:.1f} s)")
    passed, counted = share_passed(outcomes)
    below = passed < args.bar * counted
    return 1 if below or any(outcome.traceback for outcome in outcomes) else 0


def _run() -> Any:
    sys.exit(main())


if __name__ == "__main__":
    _run()

"""Which hpcrl files ``optimizer_offload_fraction`` runs through, crosses and enters on its
way from a recipe to Megatron's optimizer (issue 27's "Done when" measure).

The path, as a job takes it: the login side loads
``recipes/grpo-qwen2-1.5b-2n8g-megatron.yaml`` (``optimizer_cpu_offload: true``,
``optimizer_offload_fraction: 0.5``) and the ``eos`` profile as ``hpcrl validate`` does,
plans it and writes jobspec.json (and recipe.resolved.yaml, which older trees' jobs read);
then, with every hpcrl module dropped as a fresh job process would start, the job side reads
its input, runs the machine checks once (the preflight's; older trees ran them in the driver
and in each rank's worker) and builds megatron-core's ``OptimizerConfig`` as the Megatron
worker does (``hpcrl.core.backends.megatron.model.optimizer_config``; no torch.distributed).

Three counts, of files under ``<tree>/hpcrl/``, traced with ``sys.settrace``:

- **runs**: files with at least one function call while the path runs;
- **enters** (strict): files with a function frame (module and class bodies, which run at
  import, are not the value travelling) that, at some executed line, has among its local
  variables the value or its section: the float equal to the fraction (0.5; the recipe and
  profile hold no other 0.5), the typed section (a ``MegatronOptimizerCfg``), or the section
  as plain data (a mapping whose ``optimizer_offload_fraction`` is the value: the YAML
  mapping, its merged copies, the unstructured JSON dict; not the schema's own tables, such
  as a type-hints dict, which name the key without the value). A frame holding only an
  enclosing object (the whole ``Recipe``, the recipe's whole mapping) does not count;
- **crosses** (calibrated to the issue's figure): as "enters", and also frames holding the
  Megatron section that carries the value's section (a ``MegatronCfg``, or a mapping whose
  ``optimizer`` is the section as plain data). ``crossings`` counts each side's files
  (login + job): a file the value crosses on both sides, as 167264e's job re-loading the
  YAML crossed the loader, the converter and the rules again, is crossed twice.

Why "crosses" reads so: issue 27 says that at 167264e the value "is validated 3 times and
crosses ~16 files"; it gives no method. Each plain reading, at 167264e (files, login / job /
distinct / crossings = login + job):

| a frame counts when it holds | login | job | distinct | crossings |
|---|---|---|---|---|
| the value or its section ("enters") | 5 | 6 | 6 | 11 |
| ... or the Megatron section around it ("crosses") | 7 | 8 | 9 | 15 |
| ... or ``policy`` around that | 9 | 10 | 11 | 19 |
| ... or the whole Recipe / recipe mapping / JobSpec | 25 | 20 | 28 | 45 |
| (not traced) hpcrl files naming ``optimizer_offload_fraction`` | | | 4 | |

Only "crosses" counted in crossings comes to ~16 (15), and only there is the value
"validated 3 times": ``megatron_rules`` on the login side, ``megatron_rules`` again in the
job's re-load, and ``megatron/offload.py`` (``optimizer_cpu_offload`` "requires CUDA", in
each rank), which holds the Megatron section, not the value's own, so "enters" misses it.
This script makes the Megatron worker's two calls (the machine check, ``optimizer_config``)
itself; a real job also crosses the worker's own files that hold the Megatron section
(``megatron/worker.py``, ``megatron/provider.py``, ...), on both trees alike, untraced here.

Today's tree (docs/architecture.md has the table): enters 5 / 2 / 6, crosses 5 / 2 / 6, 7
crossings (half of 167264e's 15 or fewer); the job side enters and crosses only the
converter and ``megatron/model.py``, since the preflight reads the machine needs the plan
wrote (``JobSpec.machine_needs``) instead of the Megatron section; the login side's NeMo RL
filter judges only the keys structuring finds outside the schema, and ``plan/layout`` is
given the parallel sizes.

Usage (any tree, e.g. a ``git worktree add --detach`` of an older commit; run it with a venv
that has hpcrl's dependencies, megatron-core included)::

    .venv/bin/python benchmarks/offload_fraction_path.py [TREE] [--files]

It prints one JSON object: the counts per side and in all, and the crossings (``--files``:
the files too). tests/test_stage_boundaries.py runs it on this tree and holds "enters" and
"crosses" to a ceiling.
"""

from __future__ import annotations

import inspect
import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECIPE = "recipes/grpo-qwen2-1.5b-2n8g-megatron.yaml"
PROFILE = "eos"
KEY = "optimizer_offload_fraction"
FRACTION = 0.5
SECTION_TYPE = "MegatronOptimizerCfg"
#: The section that holds the value's section (``policy.megatron_cfg``), and its key for it.
CARRIER_TYPE = "MegatronCfg"
SECTION_KEY = "optimizer"
SIDES = ("login", "job")


class PathTrace:
    """Files of ``tree``/hpcrl that run, and that the value enters, per side."""

    def __init__(self, tree: Path) -> None:
        self.package = str(tree / "hpcrl") + "/"
        self.side: str | None = None
        self.runs: dict[str, set[str]] = {side: set() for side in SIDES}
        self.enters: dict[str, set[str]] = {side: set() for side in SIDES}
        self.crosses: dict[str, set[str]] = {side: set() for side in SIDES}

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event != "call" or self.side is None:
            return None
        filename = frame.f_code.co_filename
        if not filename.startswith(self.package):
            return None
        name = filename[len(self.package) - len("hpcrl/") :]
        self.runs[self.side].add(name)
        if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:  # a module or class body
            return None
        return self._local_tracer(name)

    def _local_tracer(self, name: str) -> Any:
        entered = self.enters[self.side]  # type: ignore[index]
        crossed = self.crosses[self.side]  # type: ignore[index]

        def trace_lines(frame: Any, event: str, arg: Any) -> Any:
            if name not in crossed and any(map(carries_value, frame.f_locals.values())):
                crossed.add(name)
            if name not in entered and any(map(holds_value, frame.f_locals.values())):
                entered.add(name)
            return trace_lines if name not in entered else None  # entered: crossed too

        return trace_lines


def holds_value(value: Any) -> bool:
    """The fraction, or its section typed or as a mapping (see the module docstring)."""
    if type(value) is float:
        return value == FRACTION
    if type(value).__name__ == SECTION_TYPE:
        return True
    if isinstance(value, Mapping):
        try:
            found = value.get(KEY)
        except Exception:  # a mapping that cannot answer (a half-built OmegaConf node)
            return False
        return type(found) is float and found == FRACTION
    return False


def carries_value(value: Any) -> bool:
    """The value, its section, or the Megatron section that holds them, typed or as a
    mapping whose ``optimizer`` is the section (see the module docstring)."""
    if holds_value(value) or type(value).__name__ == CARRIER_TYPE:
        return True
    if isinstance(value, Mapping):
        try:
            return holds_value(value.get(SECTION_KEY))
        except Exception:  # a mapping that cannot answer (a half-built OmegaConf node)
            return False
    return False


def login_side(tree: Path, run_dir: Path) -> None:
    """Load and plan as ``hpcrl validate`` does, then write what the job reads."""
    import yaml

    from hpcrl.config import load_profile, load_recipe
    from hpcrl.plan.planner import plan

    loaded = load_recipe(str(tree / RECIPE))
    assert loaded.recipe.policy.megatron_cfg.optimizer.optimizer_offload_fraction == FRACTION
    spec = plan(loaded.recipe, load_profile(PROFILE), run_dir=str(run_dir), recipe_source=RECIPE)
    try:
        from hpcrl.run.jobspec_file import write_jobspec
    except ImportError:  # before hpcrl/run (167264e)
        from hpcrl.plan.jobspec_file import write_jobspec  # type: ignore[no-redef]
    write_jobspec(spec)
    resolved = run_dir / "recipe.resolved.yaml"
    resolved.write_text(yaml.safe_dump(loaded.resolved_dict, sort_keys=False))


def job_side(tree: Path, run_dir: Path) -> float:
    """Read the job's input, check the machine, build megatron-core's OptimizerConfig."""
    if (tree / "hpcrl/core/machine_checks.py").exists():
        from hpcrl.core.machine_checks import machine_problems
        from hpcrl.run.jobspec_file import read_jobspec

        jobspec = read_jobspec(run_dir)
        machine_problems(jobspec, cuda_available=lambda: True)  # the preflight, once per node
        recipe = jobspec.recipe
    else:  # 167264e: the driver reloads the resolved recipe; each rank checks the settings
        from hpcrl.config import load_recipe
        from hpcrl.core import driver
        from hpcrl.core.backends.megatron import offload

        recipe = load_recipe(run_dir / "recipe.resolved.yaml").recipe
        jobspec = driver.job_plan(run_dir, recipe)
        driver.job_device(jobspec, cuda_available=lambda: True)
        offload._cuda_available = lambda: True  # type: ignore[attr-defined]
        try:
            offload.check_transformer_engine_settings(recipe.policy.megatron_cfg)  # type: ignore[attr-defined]
        except offload.UnsupportedOnThisMachine:  # type: ignore[attr-defined]
            pass  # no Transformer Engine here; the check ran in full
    from hpcrl.core.backends.megatron.model import optimizer_config

    built = optimizer_config(recipe.policy.megatron_cfg, recipe.policy.precision)
    return float(built.optimizer_offload_fraction)


def measure(tree: Path) -> dict[str, Any]:
    """Trace the path at ``tree`` (put first on ``sys.path``); the counts and the files."""
    sys.path.insert(0, str(tree))
    import megatron.core.optimizer.optimizer_config as mcore_optimizer_config
    import torch  # noqa: F401  (libraries imported untraced: they are not the path)

    # With optimizer_cpu_offload the recipe's precision-aware optimizer asks megatron-core for
    # Transformer Engine's version (2.1+ on eos's images); this machine may have none.
    mcore_optimizer_config.is_te_min_version = lambda *args, **kwargs: True

    trace = PathTrace(tree)
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        run_dir.mkdir()
        sys.settrace(trace)
        try:
            trace.side = "login"
            login_side(tree, run_dir)
            trace.side = None
            for module in [name for name in sys.modules if name.split(".")[0] == "hpcrl"]:
                del sys.modules[module]  # the job is another process
            trace.side = "job"
            fraction = job_side(tree, run_dir)
        finally:
            sys.settrace(None)
    assert fraction == FRACTION, fraction
    result = {
        kind: {
            "login": len(found["login"]),
            "job": len(found["job"]),
            "all": len(found["login"] | found["job"]),
            "files": {side: sorted(files) for side, files in found.items()},
        }
        for kind, found in (
            ("runs", trace.runs), ("enters", trace.enters), ("crosses", trace.crosses)
        )
    }  # fmt: skip
    # a file the value crosses on both sides is crossed twice (167264e's job re-loaded it)
    result["crosses"]["crossings"] = result["crosses"]["login"] + result["crosses"]["job"]
    return result


def main(argv: list[str]) -> int:
    args = [arg for arg in argv if arg != "--files"]
    tree = Path(args[0]).resolve() if args else Path(__file__).resolve().parents[1]
    result = measure(tree)
    if "--files" not in argv:
        for counts in result.values():
            del counts["files"]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

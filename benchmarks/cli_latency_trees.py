"""``hpcrl validate`` of two source trees in one run, alternating: a base checkout against
this one (``benchmarks/cli_latency.py --baseline-tree PATH``).

    git worktree add --detach /tmp/latency-base main      # or: git archive main | tar -x -C ...
    .venv/bin/python benchmarks/cli_latency.py --baseline-tree /tmp/latency-base --repeats 9

Each command runs in a fresh process with ``PYTHONPATH=<tree>`` first (checked: each tree's
hpcrl is the one imported), base and branch alternating in every round (the order flips each
round), with ``python -c pass`` timed in the same rounds; one unmeasured run of each first
(bytecode). Per tree and command: best and median wall and CPU time (user + sys of the
child: what barely moves when other jobs share the cores), the best's ratio to ``python -c
pass``, and branch / base. The GPU recipe runs on ``local-gpu`` where that profile validates
(a GPU machine), else on ``slurm-test`` (it plans the same recipe; this CPU box has no GPU).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

from cli_latency import time_command

BRANCH_TREE = Path(__file__).resolve().parents[1]
GPU_RECIPE, GPU_PROFILES = "grpo-llama-1b-1n1g-automodel", ("local-gpu", "slurm-test")
Times = tuple[list[float], list[float]]


def tree_env(env: dict[str, str], tree: Path) -> dict[str, str]:
    """``env`` with ``tree`` first on the import path."""
    rest = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{tree}{os.pathsep}{rest}" if rest else str(tree)}


def _imported_from(env: dict[str, str], cwd: Path) -> Path:
    code = "import hpcrl, pathlib; print(pathlib.Path(hpcrl.__file__).resolve().parents[1])"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return Path(out.stdout.strip())


def _gpu_profile(env: dict[str, str], cwd: Path) -> str:
    """``local-gpu`` where it validates here, else the next profile that plans the recipe."""
    for profile in GPU_PROFILES:
        argv = [
            sys.executable,
            "-m",
            "hpcrl.cli.main",
            "validate",
            GPU_RECIPE,
            "--cluster",
            profile,
        ]
        if subprocess.run(argv, env=env, cwd=cwd, capture_output=True).returncode == 0:
            return profile
    raise SystemExit(f"{GPU_RECIPE} validates on none of {', '.join(GPU_PROFILES)}")


def compare_trees(
    base: Path, commands: list[tuple[str, str]], repeats: int, env: dict[str, str], cwd: Path
) -> None:
    """Time ``hpcrl validate RECIPE --cluster PROFILE`` of each command under both trees."""
    trees = {"base": base.resolve(), "branch": BRANCH_TREE}
    envs = {name: tree_env(env, tree) for name, tree in trees.items()}
    for name, tree in trees.items():
        found = _imported_from(envs[name], cwd)
        if found != tree:
            raise SystemExit(f"{name}: hpcrl came from {found}, not {tree}")
    commands = [
        (recipe, _gpu_profile(envs["branch"], cwd) if recipe == GPU_RECIPE else profile)
        for recipe, profile in commands
    ]
    argvs = {
        command: [sys.executable, "-m", "hpcrl.cli.main", "validate", command[0], "--cluster", command[1]]
        for command in commands
    }  # fmt: skip
    for command in commands:  # unmeasured: writes the bytecode where it can
        for name in trees:
            time_command(argvs[command], 1, cwd, envs[name])
    bare: Times = ([], [])
    times: dict[tuple[str, tuple[str, str]], Times] = {
        (name, command): ([], []) for name in trees for command in commands
    }
    for index in range(repeats):
        _add(bare, time_command([sys.executable, "-c", "pass"], 1, cwd, env))
        order = ("base", "branch") if index % 2 == 0 else ("branch", "base")
        for command in commands:
            for name in order:
                _add(times[name, command], time_command(argvs[command], 1, cwd, envs[name]))
    _print_table(trees, commands, times, bare, repeats)


def _add(into: Times, measured: Times) -> None:
    into[0].extend(measured[0])
    into[1].extend(measured[1])


def _print_table(
    trees: dict[str, Path],
    commands: list[tuple[str, str]],
    times: dict[tuple[str, tuple[str, str]], Times],
    bare: Times,
    repeats: int,
) -> None:
    best_pass = min(bare[0])
    print(
        f"CPU cores: {os.cpu_count()}, python {sys.version.split()[0]}, {repeats} rounds, "
        f"load average {os.getloadavg()[0]:.1f}; base {trees['base']}, branch {trees['branch']}"
    )
    print(f"python -c pass: best {best_pass * 1000:.0f} ms wall, median "
          f"{statistics.median(bare[0]) * 1000:.0f} ms, CPU best {min(bare[1]) * 1000:.0f} ms")  # fmt: skip
    print("| hpcrl validate | tree | wall best ms | wall median ms | CPU best ms | CPU median ms | best / pass |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for command in commands:
        for name in trees:
            wall, cpu = times[name, command]
            print(
                f"| {command[0]} --cluster {command[1]} | {name} | {min(wall) * 1000:.0f} "
                f"| {statistics.median(wall) * 1000:.0f} | {min(cpu) * 1000:.0f} "
                f"| {statistics.median(cpu) * 1000:.0f} | {min(wall) / best_pass:.1f}× |"
            )
    for command in commands:
        (base_wall, base_cpu), (wall, cpu) = times["base", command], times["branch", command]
        print(
            f"branch / base, validate {command[0]} --cluster {command[1]}: wall best "
            f"{min(wall) / min(base_wall):.2f}, median {statistics.median(wall) / statistics.median(base_wall):.2f}; "
            f"CPU best {min(cpu) / min(base_cpu):.2f}, median {statistics.median(cpu) / statistics.median(base_cpu):.2f}"
        )  # fmt: skip

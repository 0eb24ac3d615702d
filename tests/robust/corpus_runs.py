"""Corpus families over what commands find on disk: run folders, metrics files, job records
(``job.json``, ``sweep.json``). See ``tests/robust/corpus.py``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.robust.harness import SECRET_ENV, Case

RECIPE = "grpo-tiny-1n-cpu"
SLURM_RECIPE = "grpo-tiny-2n-cpu"
REPO = Path(__file__).resolve().parents[2]
SLURM_PROFILE = REPO / "cluster_profiles" / "slurm-test.yaml"
TOKEN = SECRET_ENV["HF_TOKEN"]


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
                     ("status", path), ("logs", "--node", "0", path), ("export", path),
                     ("export", "--step", "99999999999999999999", path)):  # fmt: skip
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
        # issue 26: metrics.jsonl deleted mid-run: the job's later lines alone
        "deleted-mid-run": (lines([dict(r, step=r["step"] + 50) for r in good]), ("lines are missing",)),
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
    cases.append(Case(family="job-records", name="logs-follow-sacct-fail-says-why-at-once",
                      argv=("logs", "-f", "{case}/runs/bad-run"), sacct="fail",
                      setup=_job_record_setup(JOB_RECORDS["good-slurm"], with_good_run=False),
                      says=("the scheduler is not answering (sacct exited 1: sacct: error: Slurm "
                            "accounting storage is disabled)",)))  # fmt: skip
    return cases + sweep_record_cases() + status_file_cases() + job_log_cases()


#: What a job leaves under ``status/`` (markers, driver error, cause records), damaged:
#: hpcrl status/logs/--wait read them to name a failure.
STATUS_FILES = ("node0.failed", "node1.failed", "driver.error", "done", "cause.0.json")
STATUS_CONTENTS: dict[str, bytes] = {
    "empty": b"",
    "list": b"[1, 2]",
    "non-utf8": b"\xff\xfe{",
    "wrong-types": json.dumps({"attempt": 3, "time": "x", "message": 5, "what": [],
                               "kind": None, "exit_code": "1"}).encode(),
    "huge-step": json.dumps({"attempt": 0, "kind": "node_lost", "what": "node 1 lost",
                             "after_step": 10**30, "requeued": True}).encode(),
    "secret": json.dumps({"attempt": 0, "kind": "driver_raised", "what": "driver raised KeyError",
                          "detail": SECRET_ENV["HF_TOKEN"], "time": 1.0, "attempt_id": "4242.0",
                          "message": f"token {SECRET_ENV['DB_PASSWORD']}"}).encode(),
}  # fmt: skip


def status_file_cases() -> list[Case]:
    cases = []
    for file_name in STATUS_FILES:
        for content_name, content in STATUS_CONTENTS.items():

            def setup(folder: Path, file_name: str = file_name, content: bytes = content) -> None:
                _job_record_setup(JOB_RECORDS["good-slurm"], with_good_run=False)(folder)
                status = folder / "runs" / "bad-run" / "status"
                status.mkdir()
                (status / file_name).write_bytes(content)

            for command, argv, sacct in (
                ("status", ("status", "{case}/runs/bad-run"), "failed"),
                ("status-completed", ("status", "{case}/runs/bad-run"), "completed"),
                ("logs", ("logs", "{case}/runs/bad-run"), "failed"),
                ("logs-follow", ("logs", "-f", "{case}/runs/bad-run"), "failed"),
            ):  # fmt: skip
                cases.append(Case(family="job-records", argv=argv, setup=setup, sacct=sacct,
                                  name=f"status-file-{command}-{file_name}-{content_name}"))  # fmt: skip
    return cases


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


def job_log_cases() -> list[Case]:
    """A job that printed its environment's secrets (a token, a plain password) into its
    submitit logs and driver log: every log view hides them (values long enough to search
    for: a short one shows in a log as the job printed it)."""
    printed = "".join(f"{name}={value}\n" for name, value in SECRET_ENV.items() if len(value) >= 8)

    def setup(folder: Path) -> None:
        _job_record_setup(JOB_RECORDS["good-slurm"], with_good_run=False)(folder)
        run = folder / "runs" / "bad-run"
        (run / "submitit").mkdir()
        for suffix in ("out", "err"):
            (run / "submitit" / f"4242_0_log.{suffix}").write_text(f"env:\n{printed}")
        driver_log = run / "logs" / "node0" / "attempt0" / "driver.log"
        driver_log.parent.mkdir(parents=True)
        driver_log.write_text(f"step 1\n{printed}")

    views = {
        "logs": ("logs", "{case}/runs/bad-run"),
        "logs-follow": ("logs", "-f", "{case}/runs/bad-run"),
        "logs-driver": ("logs", "--driver", "{case}/runs/bad-run"),
        "logs-node": ("logs", "--node", "0", "--attempt", "1", "{case}/runs/bad-run"),
    }
    return [
        Case(family="job-records", name=f"secret-in-log-{view}", argv=argv, setup=setup,
             sacct="failed", expect="accept", says=("hidden>",))
        for view, argv in views.items()
    ]  # fmt: skip

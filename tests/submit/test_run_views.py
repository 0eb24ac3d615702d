"""Log following and run discovery, on real files (no cluster)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from hpcrl.run.job_record import JobRecord, write_job_record
from hpcrl.run.sweep_record import SweepRecord, write_sweep_record
from hpcrl.submit.logs import LogFile, follow, list_log_files
from hpcrl.submit.status_view import ListedRun, collect_run_dirs, format_elapsed
from hpcrl.submit.sweep import build_points


def _record(run_dir: Path, num_tasks: int = 2) -> JobRecord:
    return JobRecord(
        executor="slurm", job_id="41", job_name="j", cluster="c",
        submitit_folder=str(run_dir / "submitit"), num_tasks=num_tasks,
        submitted_at="2026-11-29T10:00:00+00:00", max_requeues=1,
    )  # fmt: skip


def test_follow_yields_text_as_files_grow_and_stops_after_the_end(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("one\n")
    later = tmp_path / "b.log"
    over = threading.Event()

    def files() -> list[LogFile]:
        return [LogFile(0, p.name, p) for p in (log, later) if p.exists()]

    def writer() -> None:
        time.sleep(0.1)
        with log.open("a") as stream:
            stream.write("two\n")
        later.write_text("worker up\n")
        time.sleep(0.1)
        with log.open("a") as stream:
            stream.write("last words\n")
        over.set()

    thread = threading.Thread(target=writer)
    thread.start()
    chunks = list(follow(files, over.is_set, poll_s=0.02))
    thread.join()
    by_file: dict[str, str] = {}
    for file, text in chunks:
        by_file[file.label] = by_file.get(file.label, "") + text
    assert by_file == {"a.log": "one\ntwo\nlast words\n", "b.log": "worker up\n"}


def test_follow_yields_whole_lines_while_the_job_runs(tmp_path: Path) -> None:
    """A line still being written waits for its end (a secret cut in two would escape the
    view's redaction); at the end, what is left is yielded as it is."""
    log = tmp_path / "a.log"
    log.write_bytes(b"one\nsec")
    polls = iter([False, False, True])
    written = iter([b"", b"ret-value\nand", b" a tail without newline"])  # before each read

    def files() -> list[LogFile]:
        return [LogFile(0, log.name, log)]

    def is_over() -> bool:
        over = next(polls)
        with log.open("ab") as stream:
            stream.write(next(written, b""))
        return over

    chunks = [text for _, text in follow(files, is_over, poll_s=0.0)]
    assert chunks == ["one\n", "secret-value\n", "and a tail without newline"]


def test_log_files_are_submitit_per_task_files_then_node_logs(tmp_path: Path) -> None:
    record = _record(tmp_path)
    (tmp_path / "submitit").mkdir()
    for task in (0, 1):
        (tmp_path / "submitit" / f"41_{task}_log.out").write_text("out")
        (tmp_path / "submitit" / f"41_{task}_log.err").write_text("err")
    node_dir = tmp_path / "logs" / "node1" / "attempt0"
    (node_dir / "ray-session-logs").mkdir(parents=True)
    (node_dir / "node.log").write_text("x")
    (node_dir / "ray-session-logs" / "gcs_server.out").write_text("long")
    logs = list_log_files(tmp_path, record, node=1)
    assert [(log.node, log.label) for log in logs] == [
        (1, "stdout"),
        (1, "stderr"),
        (1, "attempt0/node.log"),
    ]


def test_runs_under_the_runs_dir_and_sweep_points_are_found(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "a-run"
    run.mkdir(parents=True)
    write_job_record(run, _record(run))
    (tmp_path / "runs" / "rendered-only").mkdir()
    sweep = tmp_path / "runs" / "s-sweep-1234"
    sweep.mkdir()
    points = tuple(build_points(["x=1,2"]))
    write_sweep_record(sweep, SweepRecord(name=sweep.name, recipe_source="r", cluster="c",
                                          overrides=(), swept_keys=("x",), points=points))  # fmt: skip
    found = collect_run_dirs([], tmp_path / "runs")
    assert found == [
        ListedRun(name="a-run", path=run),
        ListedRun(name="s-sweep-1234/point-0", path=sweep / "point-0", swept={"x": "1"}),
        ListedRun(name="s-sweep-1234/point-1", path=sweep / "point-1", swept={"x": "2"}),
    ]
    assert collect_run_dirs([], tmp_path / "missing") == []
    assert format_elapsed(3725.9) == "1:02:05" and format_elapsed(None) == ""

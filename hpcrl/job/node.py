"""The node entrypoint: one call per node of the job (one srun task per node).

Node 0 starts the Ray head and the driver process (``hpcrl.job.driver_process``), which
announces the head once it is up (``status/head``), waits until every node has joined and runs
the training driver; the job's exit code is the driver's. Other nodes import Ray meanwhile,
join once the head is announced and its GCS port answers, and stay until node 0 marks the run
done or the head goes away. Every node stops its own Ray, and waits for it, before returning.

``main(run_dir) -> int`` is for direct use (``srun python -c "...sys.exit(main(d))"``);
``NodeMain`` is what ``hpcrl submit`` pickles through submitit: same run, but failures raise
(so submitit records them) and it is ``Checkpointable`` for preemption/timeout requeues.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

import attrs
from submitit.helpers import Checkpointable, DelayedSubmission

from hpcrl.job.diagnosis import diagnose, head_lost
from hpcrl.job.errors import (
    BootstrapError,
    DriverFailed,
    HeadUnreachable,
    OtherNodeFailed,
    RayExited,
    RequeueRequested,
    SlurmRequeues,
)
from hpcrl.job.head_driver import start_driver, watch_driver
from hpcrl.job.network import port_accepts
from hpcrl.job.processes import stop_session
from hpcrl.job.ray_auth import prepare_job_token
from hpcrl.job.ray_cluster import RayNode, tail
from hpcrl.job.requeues import (
    name_slurm_ended_attempt,
    stop_slurm_requeues_when_used_up,
    task0_err_log,
)
from hpcrl.job.settings import NodeSettings, read_node_settings
from hpcrl.run.causes import (
    NODE_FAIL,
    PREEMPTED,
    SAVE_DEADLINE_REACHED,
    AttemptCause,
    exit_code_of,
    last_step,
    read_cause,
    slurm_node_failure,
    write_cause,
)
from hpcrl.run.markers import (
    DONE,
    HEAD,
    PREEMPT_FILE,
    PREEMPTED_EXIT_CODE,
    SAVE_DEADLINE,
    failed_marker_name,
    node_log_dir,
    read_marker,
    write_marker,
)
from hpcrl.run.polling import wait_until

LOGGER_NAME = "hpcrl.job"
WORKER_POLL_INTERVAL_S = 0.5
HEAD_GONE_AFTER_FAILED_CONNECTS = 2  # one refused connect on a loaded node is not "gone"
#: How long a failing node 0 looks for srun's "Node failure" line (Slurm's KillWait, 30 s by
#: default, is the time it has before SIGKILL).
SRUN_NODE_FAILURE_WAIT_S = 2.0


class NodeMain(Checkpointable):
    """The node entrypoint as a submitit-checkpointable callable: ``NodeMain()(run_dir)``.

    On USR2 submitit calls ``checkpoint(run_dir)`` on node 0: it writes ``PREEMPT``, gives the
    driver up to ``preempt_grace_s`` to save a checkpoint and exit, and returns a resubmission of
    itself (submitit requeues the job) until ``max_requeues`` is used up.

    When the attempt failed because a node was lost and requeues are left (its cause record
    says ``requeued``), it raises ``RequeueRequested`` with that resubmission instead of
    ``DriverFailed``; ``hpcrl.job.node_task.NodeTask`` requeues the job, and the next
    attempt's driver resumes from the last checkpoint.
    """

    def __init__(self) -> None:
        self.num_requeues = 0
        self._driver: subprocess.Popen[bytes] | None = None
        self._settings: NodeSettings | None = None

    def __call__(self, run_dir: str) -> int:
        settings = read_node_settings(run_dir, os.environ, self.num_requeues)
        self._settings = settings
        code = run_node(settings, os.environ, on_driver_start=self._remember_driver)
        if code == 0 or not settings.is_head:
            return code
        cause = read_cause(settings.run_dir, settings.task.run_attempt)
        if cause is not None and cause.requeued and cause.kind == NODE_FAIL:
            raise SlurmRequeues(cause.line())
        if cause is not None and cause.requeued:
            raise RequeueRequested(self._resubmission(), cause.line())
        log_path = node_log_dir(settings.run_dir, 0, settings.task.run_attempt) / "driver.log"
        raise DriverFailed(code, settings.driver, tail(log_path), log_path=str(log_path),
                           cause=cause.line() if cause else "")  # fmt: skip

    def _resubmission(self) -> NodeMain:
        resubmitted = NodeMain()
        resubmitted.num_requeues = self.num_requeues + 1
        return resubmitted

    def _remember_driver(self, driver: subprocess.Popen[bytes]) -> None:
        self._driver = driver

    # submitit calls checkpoint with __call__'s arguments and takes None as "do not requeue"
    # (submitit/core/utils.py); Checkpointable annotates it (*args, **kwargs) -> DelayedSubmission.
    def checkpoint(self, run_dir: str) -> DelayedSubmission | None:  # type: ignore[override]
        settings = self._settings or read_node_settings(run_dir, os.environ, self.num_requeues)
        logger = logging.getLogger(LOGGER_NAME)
        preempt_path = settings.run_dir / PREEMPT_FILE
        preempt_path.write_text(settings.task.attempt_id)
        logger.warning("preemption/timeout signal: wrote %s, waiting for the driver", preempt_path)
        saved = False
        if self._driver is not None:
            try:
                code = self._driver.wait(timeout=settings.preempt_grace_s)
                logger.warning("driver exited with code %s after the preemption signal", code)
                saved = code == PREEMPTED_EXIT_CODE
            except subprocess.TimeoutExpired:
                logger.warning(
                    "driver still running after %.0fs; requeueing anyway", settings.preempt_grace_s
                )
        # Slurm's own requeues (after a node failure) count: SLURM_RESTART_COUNT has them
        used = max(self.num_requeues, settings.task.attempt)
        requeue = used < settings.max_requeues
        if not requeue:
            logger.warning("not requeueing: %d of %d requeues used", used, settings.max_requeues)
        _record_preemption(settings, saved, requeue)
        return DelayedSubmission(self._resubmission(), run_dir) if requeue else None

    def __getstate__(self) -> dict[str, int]:
        return {"num_requeues": self.num_requeues}  # processes and settings are per attempt

    def __setstate__(self, state: dict[str, int]) -> None:
        NodeMain.__init__(self)
        self.num_requeues = state["num_requeues"]


def main(run_dir: str) -> int:
    """Run this node's part of the job; the exit code (the driver's on node 0, 1 on failure)."""
    try:
        settings = read_node_settings(run_dir, os.environ)
        return run_node(settings, os.environ)
    except BootstrapError as error:
        print(f"hpcrl: {error}", file=sys.stderr, flush=True)
        return 1


def run_node(settings: NodeSettings, environ: Mapping[str, str], on_driver_start=None) -> int:
    """Node 0: head + driver, returns the driver's code. Others: join, wait, return 0."""
    logger, handlers = _open_node_log(settings)
    restore_sigterm = _exit_on_sigterm()
    _make_interruptible()
    ray_node: RayNode | None = None
    failed = True
    try:
        logger.info("node %d of %d (%s, %s), job %s attempt %d, Ray temp dir %s",
                    settings.node_rank, settings.num_nodes, settings.task.node_name, settings.node_ip,
                    settings.task.job_id, settings.task.attempt, settings.ray_temp_dir)  # fmt: skip
        if settings.is_head:
            _clear_stale_preempt(settings)
            if settings.task.in_slurm:
                name_slurm_ended_attempt(settings, task0_err_log())
                stop_slurm_requeues_when_used_up(settings, logger)
            prepare_job_token(settings)  # created here only when the run folder has none
            ray_node = RayNode.start(settings, environ, hold=False)
            code = _run_head(settings, ray_node, environ, logger, on_driver_start)
        else:
            ray_node = RayNode.start(settings, environ, hold=True)  # imports Ray meanwhile
            _wait_for_head(settings, ray_node, logger)
            prepare_job_token(settings)  # node 0 made sure it exists before its head started
            ray_node.release()
            code = _run_worker(settings, ray_node, logger)
        failed = code != 0
        return code
    except BootstrapError as error:
        logger.error("%s", error)
        report_failure(settings, error)
        raise
    finally:
        if ray_node is not None:
            killed = ray_node.stop(keep_ray_logs=failed or ray_node.failed)
            logger.info("Ray stopped%s", f" (had to kill {', '.join(killed)})" if killed else "")
        restore_sigterm()
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()


def _run_head(settings, ray_node, environ, logger, on_driver_start) -> int:
    log_dir = node_log_dir(settings.run_dir, 0, settings.task.run_attempt)
    own_failure: RayExited | None = None
    head_started_again = True
    while head_started_again:  # at most once more: RayNode allows one start-up retry
        driver = start_driver(settings, environ)
        logger.info(
            "started Ray head and driver %s (log: %s)", settings.driver, log_dir / "driver.log"
        )
        if on_driver_start is not None:
            on_driver_start(driver)
        try:
            head_started_again = watch_driver(settings, driver, ray_node, logger)
        except RayExited as error:  # this node's Ray: the attempt cannot go on
            logger.error("%s", error)
            ray_node.failed, own_failure, head_started_again = True, error, False
        finally:
            stop_session(driver, settings.stop_timeout_s)  # whatever the driver left running
    code = 1 if own_failure else exit_code_of(driver.returncode)
    failure = read_marker(settings.run_dir, failed_marker_name(0), settings.task.attempt_id)
    if failure is not None:  # the driver's bootstrap failed (it wrote why)
        write_marker(settings.run_dir, DONE, settings.task.attempt_id, exit_code=code)
        raise BootstrapError(failure["message"])
    if code != 0 and not _stopped_for_preemption(settings, code):
        if not _record_save_deadline(settings, code, logger):
            _record_failure(settings, driver.returncode, own_failure, logger)
    write_marker(settings.run_dir, DONE, settings.task.attempt_id, exit_code=code)
    logger.info("driver exited with code %d", code)
    return code


def _stopped_for_preemption(settings: NodeSettings, code: int) -> bool:
    return code == PREEMPTED_EXIT_CODE and (settings.run_dir / PREEMPT_FILE).exists()


def _record_save_deadline(settings: NodeSettings, code: int, logger: logging.Logger) -> bool:
    """The driver stopped at checkpointing.checkpoint_must_save_by after saving (its marker):
    the attempt's cause says so and how to go on, instead of a failure; True if it did."""
    stop = read_marker(settings.run_dir, SAVE_DEADLINE, settings.task.attempt_id)
    if code != PREEMPTED_EXIT_CODE or stop is None:
        return False
    cause = AttemptCause(
        attempt=settings.task.run_attempt, kind=SAVE_DEADLINE_REACHED,
        what="stopped at checkpointing.checkpoint_must_save_by", after_step=stop.get("step"),
        detail=f"checkpoint saved ({stop.get('checkpoint')}); "
        f"{shlex.join(['hpcrl', 'resume', str(settings.run_dir)])} continues the run from it",
        exit_code=code,
    )  # fmt: skip
    write_cause(settings.run_dir, cause)
    logger.warning("attempt %d ended: %s", settings.task.run_attempt + 1, cause.line())
    return True


def _record_failure(settings, returncode: int, own_failure: RayExited | None, logger) -> None:
    """Name the attempt's cause (status/cause.<r>.json) and whether the job is requeued."""
    # Slurm kills a NODE_FAIL step with signals: this node's Ray or the driver goes first
    signalled = own_failure is not None or returncode < 0
    cause = _slurm_node_failure(settings, SRUN_NODE_FAILURE_WAIT_S if signalled else 0.0)
    if cause is not None:
        write_cause(settings.run_dir, cause)
        logger.error("attempt %d failed: %s", settings.task.run_attempt + 1, cause.line())
        return
    if own_failure is not None:
        cause = head_lost(settings, own_failure, returncode)
    else:
        cause = diagnose(settings, returncode)
    requeue = (
        cause.retryable
        and settings.task.in_slurm
        and (settings.task.attempt < settings.max_requeues)
    )
    cause = attrs.evolve(cause, requeued=requeue)
    write_cause(settings.run_dir, cause)
    logger.error("attempt %d failed: %s", settings.task.run_attempt + 1, cause.line())


def _slurm_node_failure(settings: NodeSettings, wait_s: float) -> AttemptCause | None:
    """srun's ``Node failure on <node>`` in this task's stderr: Slurm declared a node of the
    job DOWN and kills the step (srun says so a moment before the signals arrive). Slurm
    requeues the job itself unless no requeues are left (then the job is not requeueable:
    ``hpcrl.job.requeues``)."""
    err_log = task0_err_log() if settings.task.in_slurm else None
    if err_log is None:
        return None
    found: list[AttemptCause] = []

    def said() -> bool:
        requeued = settings.task.attempt < settings.max_requeues
        cause = slurm_node_failure(settings.run_dir, settings.task.run_attempt, err_log, requeued)
        found[:] = [cause] if cause is not None else []
        return bool(found)

    if not said() and wait_s > 0:
        wait_until(said, wait_s, interval_s=0.2)
    return found[0] if found else None


def _record_preemption(settings: NodeSettings, saved: bool, requeued: bool) -> None:
    log_dir = node_log_dir(settings.run_dir, 0, settings.task.run_attempt)
    cause = AttemptCause(
        attempt=settings.task.run_attempt,
        kind=PREEMPTED,
        what="preempted (USR2: time limit or preemption)",
        detail="the driver saved a checkpoint" if saved else "no checkpoint confirmed",
        after_step=last_step(settings.run_dir),
        exit_code=PREEMPTED_EXIT_CODE,
        requeued=requeued,
        log=str((log_dir / "node.log").relative_to(settings.run_dir)),
    )
    write_cause(settings.run_dir, cause)


def report_failure(settings: NodeSettings, error: BootstrapError) -> None:
    """``status/node<k>.failed`` for this node (the other nodes and node 0's diagnosis read it)."""
    write_marker(settings.run_dir, failed_marker_name(settings.node_rank), settings.task.attempt_id,
                 message=str(error), detail=error.detail, log=error.log)  # fmt: skip


def _wait_for_head(settings: NodeSettings, ray_node: RayNode, logger: logging.Logger) -> None:
    ip, port, attempt_id = settings.head_ip, settings.gcs_port, settings.task.attempt_id

    def head_ready() -> bool:
        # The marker proves the port belongs to this attempt's head, not to another job's.
        return read_marker(settings.run_dir, HEAD, attempt_id) is not None and port_accepts(
            ip, port
        )

    start = time.monotonic()

    def abort() -> None:
        _raise_if_head_failed(settings)
        ray_node.check_alive()

    if not wait_until(head_ready, settings.head_wait_s, abort=abort):
        raise HeadUnreachable(ip, port, time.monotonic() - start, port_accepts(ip, port))
    logger.info("head reachable at %s:%d after %.1fs; joining", ip, port, time.monotonic() - start)


def _raise_if_head_failed(settings: NodeSettings) -> None:
    failure = read_marker(settings.run_dir, failed_marker_name(0), settings.task.attempt_id)
    if failure is not None:
        raise OtherNodeFailed(f"node 0 ({settings.task.head_name}) failed: {failure['message']}")


def _run_is_ending(settings: NodeSettings) -> bool:
    """Node 0 marked the attempt done, a preemption/timeout requeue is under way, or the
    head's GCS port is closed: a worker's Ray that exits now went down with the head, which
    is no failure of this node (and leaves no ``node<k>.failed`` quoting Ray's last line)."""
    done = read_marker(settings.run_dir, DONE, settings.task.attempt_id) is not None
    if done or (settings.run_dir / PREEMPT_FILE).exists():
        return True
    return not port_accepts(settings.head_ip, settings.gcs_port)


def _run_worker(settings: NodeSettings, ray_node: RayNode, logger: logging.Logger) -> int:
    failed_connects = 0
    while True:
        if read_marker(settings.run_dir, DONE, settings.task.attempt_id) is not None:
            logger.info("node 0 marked the run done; stopping")
            return 0
        _raise_if_head_failed(settings)
        try:
            ray_node.check_alive()
        except RayExited as error:
            if _run_is_ending(settings):
                logger.info("Ray stopped with the head (the run ended or is being requeued)")
                return 0
            return _report_and_wait_for_head(settings, ray_node, error, logger)
        if port_accepts(settings.head_ip, settings.gcs_port):
            failed_connects = 0
        else:
            failed_connects += 1
            if failed_connects >= HEAD_GONE_AFTER_FAILED_CONNECTS:
                logger.info("head's GCS port %s closed; stopping", settings.gcs_address)
                return 0
        time.sleep(WORKER_POLL_INTERVAL_S)


def _report_and_wait_for_head(
    settings: NodeSettings, ray_node: RayNode, error: RayExited, logger: logging.Logger
) -> int:
    """This node's Ray died mid-run: report it, then leave the attempt's end to node 0.

    Exiting nonzero now would make srun (``--kill-on-bad-exit``) end node 0's task too,
    before it could name the cause and requeue; node 0 stops its driver once it sees the
    report. If node 0 does not end the attempt within ``head_wait_s``, fail after all.
    """
    logger.error("%s", error)
    ray_node.failed = True
    report_failure(settings, error)

    def attempt_over() -> bool:
        done = read_marker(settings.run_dir, DONE, settings.task.attempt_id) is not None
        return done or not port_accepts(settings.head_ip, settings.gcs_port)

    if not wait_until(attempt_over, settings.head_wait_s, interval_s=WORKER_POLL_INTERVAL_S):
        raise error
    logger.info("node 0 ended the attempt (it reports this node's failure)")
    return 0


def _clear_stale_preempt(settings: NodeSettings) -> None:
    # Written by an earlier attempt's checkpoint(): this attempt's cannot have run yet.
    (settings.run_dir / PREEMPT_FILE).unlink(missing_ok=True)


def _open_node_log(settings: NodeSettings) -> tuple[logging.Logger, list[logging.Handler]]:
    """Timestamped lines into logs/node<k>/attempt<r>/node.log and the task's stderr."""
    log_dir = node_log_dir(settings.run_dir, settings.node_rank, settings.task.run_attempt)
    log_dir.mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(
        f"%(asctime)s.%(msecs)03d node{settings.node_rank} %(levelname)s %(message)s",
        "%Y-%m-%d %H:%M:%S",
    )
    handlers: list[logging.Handler] = [
        logging.FileHandler(log_dir / "node.log"),
        logging.StreamHandler(sys.stderr),
    ]
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    return logger, handlers


def _exit_on_sigterm():
    """Turn SIGTERM into SystemExit so Ray is still stopped (unless submitit handles it)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    if not in_main_thread or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def exit_now(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_now)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _make_interruptible() -> None:
    """Let SIGINT raise KeyboardInterrupt again when it arrives ignored.

    A job submitted from a background shell (``nohup hpcrl submit ... &``, a CI script)
    inherits SIGINT ignored, and Python then never installs its handler. A local cancel
    interrupts the tasks with SIGINT: ignored, the node would keep Ray and the driver running
    forever. The ``finally`` in ``run_node`` stops Ray on the interrupt.
    """
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""``ray start`` with its imports done ahead of time, released by a "go" file.

    python -m hpcrl.job.ray_launcher GO_FILE MAX_WAIT_S NODE_DIR -- <ray start arguments>

Importing Ray's command line takes a few seconds of CPU. A worker node starts this process at
once, while it still waits for the head; once the head is there, the node entrypoint creates
GO_FILE and ``ray start`` runs right away. ``-`` as GO_FILE starts without waiting. The process
gives up (exit 3) when its parent is gone or MAX_WAIT_S passes without a go. When the parent dies
(even by SIGKILL) Ray gets SIGTERM and stops, and NODE_DIR (the node's private folder holding
Ray's temp dir) is removed.
"""

from __future__ import annotations

import os
import shutil
import sys

from hpcrl.job.processes import die_with_parent
from hpcrl.run.polling import wait_until

GO_POLL_INTERVAL_S = 0.05
NO_GO_EXIT_CODE = 3


class _ParentGone(Exception):
    pass


def wait_for_go(go_file: str, max_wait_s: float) -> bool:
    """True once ``go_file`` exists; False when the parent died or the wait timed out."""
    parent = os.getppid()

    def parent_alive() -> None:
        if os.getppid() != parent:
            raise _ParentGone

    try:
        return wait_until(lambda: os.path.exists(go_file), max_wait_s, abort=parent_alive,
                          interval_s=GO_POLL_INTERVAL_S)  # fmt: skip
    except _ParentGone:
        return False


def main(argv: list[str]) -> int:
    go_file, max_wait_s, node_dir, separator, *ray_args = argv
    assert separator == "--", f"usage: {__doc__}"
    die_with_parent()  # SIGTERM makes `ray start --block` stop all of this node's Ray
    from ray.scripts.scripts import main as ray_cli  # the slow part, done before the wait

    if go_file != "-" and not wait_for_go(go_file, float(max_wait_s)):
        return NO_GO_EXIT_CODE
    sys.argv = ["ray", *ray_args]
    parent = os.getppid()
    try:
        return ray_cli()
    finally:
        if os.getppid() != parent:  # orphaned: the entrypoint that would clean up is gone
            shutil.rmtree(node_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

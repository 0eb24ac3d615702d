"""``python -m pytest``, then leave with pytest's exit status without the interpreter's teardown.

On CI's machine (2026-12-05) the main suite's process died of a segmentation fault after its
summary had been printed (2085 passed, exit 139): the native libraries a whole suite leaves
loaded (torch, Ray, triton) crashed while the interpreter freed them in no fixed order. By the
time pytest returns, every result, log and session fixture is finished; nothing the teardown
does could change one, so it is skipped. A crash during the tests still fails the run (pytest's
faulthandler prints its stack). Usage: PYTHON .ci/pytest_without_teardown.py PYTEST_ARGS...
"""

import os
import sys


def main() -> None:
    # As `python -m pytest` does: the working directory (the repository) first on the path, so
    # `tests` imports as a package.
    sys.path[0] = os.getcwd()
    import pytest

    exit_status = int(pytest.console_main())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_status)


# The guard matters: a "spawn" child process (tests that start ranks or a multiprocessing
# Manager) imports the main module again, and without it would run the whole suite again.
if __name__ == "__main__":
    main()

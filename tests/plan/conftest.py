"""Plans under test do not depend on the developer's shell (see ``clear_shell_checkpoint_dir``)."""

import pytest

from tests.plan.planning_inputs import clear_shell_checkpoint_dir


@pytest.fixture(autouse=True)
def shell_without_checkpoint_dir(monkeypatch):
    clear_shell_checkpoint_dir(monkeypatch)

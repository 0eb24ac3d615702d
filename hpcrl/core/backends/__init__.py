"""Training backends behind one worker interface (``hpcrl.core.backends.base``).

A backend is chosen once per run from ``Recipe.backend``; the worker group imports its
class by path inside each actor, so the controller never imports torch-heavy backend code.
"""

from __future__ import annotations

import importlib
from typing import Any

# recipe.backend -> "module:Class" of its BackendWorker. A new backend adds one line here.
WORKER_CLASS_PATHS = {
    "automodel": "hpcrl.core.backends.automodel.worker:AutomodelWorker",
    "megatron": "hpcrl.core.backends.megatron.worker:MegatronWorker",
}


def worker_class_path(backend: str) -> str:
    """The class path of ``backend``'s worker; a clear error for an unknown name."""
    if backend not in WORKER_CLASS_PATHS:
        valid = ", ".join(sorted(WORKER_CLASS_PATHS))
        raise ValueError(f"unknown training backend {backend!r}; valid backends are: {valid}")
    return WORKER_CLASS_PATHS[backend]


def load_worker_class(class_path: str) -> Any:
    """Import ``"module:Class"`` (done inside the worker actor)."""
    module_name, _, class_name = class_path.partition(":")
    assert class_name, f"class path must look like 'module:Class', got {class_path!r}"
    return getattr(importlib.import_module(module_name), class_name)

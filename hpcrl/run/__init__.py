"""The run-folder contract: what the login side writes into a run folder and the job side
reads (and back), in one place both sides import.

The plan (``jobspec.py``, read and written by ``jobspec_file.py``), atomic writes and the
folder lock, the attempt's cause records, status markers, job and sweep records, the
metrics file, checkpoint listing, the Ray token, version ranges and polling. It imports
only config schema types (never YAML loading) and nothing of plan, render, submit,
report, cli, job or core: all of them import it (tests/test_stage_boundaries.py).
"""

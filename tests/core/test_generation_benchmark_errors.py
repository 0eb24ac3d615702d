"""``benchmarks/generation_throughput.py``: a failed row keeps a short error in its record
and leaves its whole traceback in the log (a CUDA fault's text does not say where it was)."""

from benchmarks.generation_throughput import row_failed


def failing_call():
    raise RuntimeError("CUDA error: an illegal memory access was encountered " + "x" * 400)


def test_a_failed_row_logs_where_it_failed(capsys):
    try:
        failing_call()
    except RuntimeError as error:
        record = row_failed("hpcrl", error)
    assert record == {"error": ("RuntimeError: CUDA error: an illegal memory access was "
                                "encountered " + "x" * 400)[:300]}  # fmt: skip
    log = capsys.readouterr().err
    assert log.startswith("row hpcrl failed:\nTraceback (most recent call last):\n")
    assert "in failing_call" in log

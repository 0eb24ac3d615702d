"""The torch engine's Triton decode attention (``hpcrl.core.generation.triton_attention``)
against the eager path, on CPU through Triton's interpreter (``TRITON_INTERPRET=1``: the
same kernel source, run program by program with NumPy).

The kernel writes the new token's k/v into the cache, marks its column visible and attends
over the first ``width`` columns; the eager path does the same in five kernels. Same
inputs, same outputs (float32 to 1e-5; bf16 to bf16 rounding), same cache and mask writes,
and whole greedy generations equal Hugging Face's (tests/core/test_torch_engine.py's check).

Triton decides at import whether its own library functions (``tl.sum``, ``tl.max``) run
interpreted, and other tests of a session may import it first: each check runs in a fresh
interpreter process with ``TRITON_INTERPRET=1`` set before any import.
"""

from __future__ import annotations

import pytest

from tests.require import require_module
from tests.triton_interpreter import run_interpreted

torch = require_module("torch")
require_module("triton")


def _case(seed: int, rows: int, heads: int, kv_heads: int, dtype: torch.dtype) -> dict:
    """A cache of ``capacity`` columns with left-padded rows (prompts of different lengths
    end at one column), garbage where nothing is valid, the new token at ``column``."""
    gen = torch.Generator().manual_seed(seed)
    head_dim, capacity, column = 16, 150, 131
    width = 160 if capacity >= 160 else capacity  # the bucket reads past the column
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    starts = torch.randint(0, 100, (rows,), generator=gen)
    valid = torch.arange(capacity)[None, :] >= starts[:, None]
    valid[:, column:] = False  # not written yet
    return {
        "q": randn(rows, heads, head_dim),
        "k": randn(rows, kv_heads, head_dim),
        "v": randn(rows, kv_heads, head_dim),
        "keys": randn(rows, kv_heads, capacity, head_dim),
        "values": randn(rows, kv_heads, capacity, head_dim),
        "valid": valid,
        "column": torch.tensor([column]),
        "width": min(width, capacity),
        "scale": head_dim**-0.5,
    }


def _eager(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``DecodeState.decode_forward`` does around ``decode_attention``."""
    from hpcrl.core.generation.kv_cache import decode_attention

    keys, values, valid = case["keys"].clone(), case["values"].clone(), case["valid"].clone()
    column, width = case["column"], case["width"]
    valid.index_fill_(1, column, True)
    keys.index_copy_(2, column, case["k"].unsqueeze(2))
    values.index_copy_(2, column, case["v"].unsqueeze(2))
    rows = valid.shape[0]
    bias = torch.where(valid[:, :width].view(rows, 1, 1, width), 0.0, -3.0e38)
    out = decode_attention(case["q"], keys[:, :, :width], values[:, :, :width], bias, case["scale"])
    return out, keys, values, valid


def _launches() -> list:
    """The default launch (one program per query group, 16 columns: many splits to combine),
    the per-head kernel over 64 columns, and the tensor-core kernel both as one program per
    (row, kv head) looping over every column and writing the output itself, and split so
    that several programs loop over several blocks each and the combine runs: each must give
    the eager path's results."""
    from hpcrl.core.generation.triton_attention import KernelLaunch

    return [
        KernelLaunch(),
        KernelLaunch(block_n=64, num_warps=4, kind="per_head"),
        KernelLaunch(block_n=16, num_warps=4, kind="dot", target_programs=1),
        KernelLaunch(block_n=16, num_warps=4, kind="dot", target_programs=40),
    ]


def _triton(
    case: dict, launch: object = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from hpcrl.core.generation import triton_attention

    keys, values, valid = case["keys"].clone(), case["values"].clone(), case["valid"].clone()
    out = triton_attention.decode_attention_triton(
        case["q"], case["k"], case["v"], keys, values, valid, case["column"],
        case["width"], case["scale"], launch=launch or triton_attention.KernelLaunch(),
    )  # fmt: skip
    return out, keys, values, valid


def check_equals_eager(heads: str, kv_heads: str) -> None:
    """(child) float32: the eager path's output to 1e-5, its cache and mask writes exactly."""
    heads_n, kv_n = int(heads), int(kv_heads)
    case = _case(seed=heads_n * 10 + kv_n, rows=5, heads=heads_n, kv_heads=kv_n,
                 dtype=torch.float32)  # fmt: skip
    want, want_keys, want_values, want_valid = _eager(case)
    from hpcrl.core.generation.triton_attention import KernelLaunch

    baselines = [KernelLaunch(read_unseen=True), KernelLaunch(kind="dot", read_unseen=True)]
    for launch in _launches() + baselines:
        got, got_keys, got_values, got_valid = _triton(case, launch)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=str(launch))
        assert torch.equal(got_keys, want_keys) and torch.equal(got_values, want_values)
        assert torch.equal(got_valid, want_valid)


def check_unseen_columns_not_read() -> None:
    """(child) The cache holds NaN wherever a row sees nothing (its left padding, the
    current column's old content, the bucket's columns past it): every launch gives the
    eager path's output on the clean cache, so none of those columns was read (a read one
    would turn its zero weight times NaN into NaN). The engine's bandwidth depends on it:
    a wave's short prompts leave many such columns (docs/performance.md, item 4)."""
    case = _case(seed=5, rows=5, heads=8, kv_heads=2, dtype=torch.float32)
    want, *_ = _eager(case)
    unseen = ~case["valid"][:, None, :, None].expand_as(case["keys"])
    poisoned = {
        name: case[name].masked_fill(unseen, float("nan")) for name in ("keys", "values")
    }  # fmt: skip
    assert poisoned["keys"].isnan().any(dim=-1).sum() > case["keys"].shape[1] * 5 * 20
    for launch in _launches():
        got, *_ = _triton({**case, **poisoned}, launch)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=str(launch))


def check_rotary_in_kernel(dtype_name: str) -> None:
    """(child) q and k given unrotated with the rows' cos/sin: the same output and cache
    writes as ``decoder.rotate`` first, then the kernel (float32: to 1e-5; bf16: to bf16
    rounding, the rotation computed in float32 and rounded once both ways)."""
    from hpcrl.core.generation import triton_attention
    from hpcrl.core.generation.decoder import rotate

    dtype = getattr(torch, dtype_name)
    case = _case(seed=11, rows=5, heads=8, kv_heads=2, dtype=dtype)
    gen = torch.Generator().manual_seed(3)
    angles = torch.rand(5, 8, generator=gen) * 6.0
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(dtype)
    wide = lambda x: x.float()  # noqa: E731
    rotated = {
        "q": rotate(wide(case["q"]), wide(cos)[:, None], wide(sin)[:, None]).to(dtype),
        "k": rotate(wide(case["k"]), wide(cos)[:, None], wide(sin)[:, None]).to(dtype),
    }
    want, want_keys, want_values, want_valid = _triton({**case, **rotated})
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for launch in _launches():
        keys, values, valid = (case[name].clone() for name in ("keys", "values", "valid"))
        got = triton_attention.decode_attention_triton(
            case["q"], case["k"], case["v"], keys, values, valid, case["column"],
            case["width"], case["scale"], rotary=(cos, sin), launch=launch,
        )  # fmt: skip
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance, msg=str(launch))
        torch.testing.assert_close(keys, want_keys, atol=tolerance, rtol=tolerance)
        assert torch.equal(values, want_values) and torch.equal(valid, want_valid)


def check_bf16_rounding() -> None:
    """(child) bf16: the kernel keeps scores and probabilities in float32 where the eager
    path rounds them to bf16 (Hugging Face's eager numerics); both stay within bf16
    rounding of a float64 reference, the kernel no further than the eager path."""
    case = _case(seed=7, rows=6, heads=4, kv_heads=2, dtype=torch.bfloat16)
    got, *_ = _triton(case)
    eager, *_ = _eager(case)
    wide = {k: case[k].double() for k in ("q", "k", "v", "keys", "values")}
    reference, *_ = _eager({**case, **wide})
    error = lambda out: ((out.double() - reference).norm() / reference.norm()).item()  # noqa: E731
    assert error(got) < 1e-2 and error(eager) < 1e-2, (error(got), error(eager))
    assert error(got) <= error(eager) + 1e-3, (error(got), error(eager))


def check_engine_greedy() -> None:
    """(child) whole generations through the Triton decode attention, its default launch
    and the tensor-core one (``kind="dot"``, split so that the combine runs too)."""
    torch.set_num_threads(1)
    from hpcrl.core.generation.engine_options import EngineOptions
    from hpcrl.core.generation.triton_attention import KernelLaunch
    from tests.core import test_torch_engine as engine_tests

    dot = KernelLaunch(block_n=16, num_warps=4, kind="dot", target_programs=16)
    for launch in (KernelLaunch(), dot):
        options = EngineOptions(decode_attention="triton", decode_launch=launch)
        for name in ("tiny:llama", "tiny:qwen2"):
            engine_tests.check_greedy_equals_hf_generate(name, options)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 1)], ids=["mha", "gqa2", "mqa"])
def test_triton_decode_attention_equals_the_eager_path(heads: int, kv_heads: int) -> None:
    run_interpreted(__name__, "check_equals_eager", str(heads), str(kv_heads))


def test_triton_decode_attention_reads_no_column_a_row_does_not_see() -> None:
    run_interpreted(__name__, "check_unseen_columns_not_read")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_decode_attention_rotates_q_and_k_in_the_kernel(dtype: str) -> None:
    run_interpreted(__name__, "check_rotary_in_kernel", dtype)


def test_triton_decode_attention_in_bf16_within_rounding() -> None:
    run_interpreted(__name__, "check_bf16_rounding")


@pytest.mark.slow
def test_triton_engine_greedy_equals_hf() -> None:
    """On two architectures with grouped-query attention: the tokens Hugging Face's greedy
    ``generate`` picks, and the teacher-forced log-probs (test_torch_engine.py's check)."""
    run_interpreted(__name__, "check_engine_greedy")


def test_auto_decode_attention_is_the_batched_matmuls_off_cuda() -> None:
    """``EngineOptions``' default, ``"auto"``, picks the Triton kernel only on CUDA (on CPU
    Triton has its interpreter alone); an explicit choice is kept."""
    from transformers import LlamaConfig

    from hpcrl.core.generation.decoder import Decoder
    from hpcrl.core.generation.engine_options import EngineOptions
    from hpcrl.core.generation.kv_cache import resolve_decode_attention

    config = LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
        intermediate_size=128, vocab_size=32,
    )  # fmt: skip
    decoder = Decoder(config, torch.device("cpu"), torch.float32)
    assert EngineOptions().decode_attention == "auto"
    assert resolve_decode_attention("auto", decoder) == "bmm"
    assert resolve_decode_attention("triton", decoder) == "triton"

"""hpcrl's decode engine on CPU: greedy parity with Hugging Face on every supported
architecture, the sampled distribution, finished rows leaving the batch, waves, refits.

The CUDA-only parts (graph capture, fused pointwise kernels) are exercised by
``benchmarks/generation_throughput.py`` on a GPU; here the same step functions run eagerly.
The fused sampler, compiled with Inductor's CPU backend, also draws the statistical test's
samples (and tests/core/test_fused_sampler.py checks it against the eager one).
"""

from __future__ import annotations

import math

import pytest

from tests.require import require_module

torch = require_module("torch")
transformers = require_module("transformers")

from hpcrl.config.recipe import GenerationCfg  # noqa: E402
from hpcrl.core.generation.decoder import UnsupportedModelError  # noqa: E402
from hpcrl.core.generation.sampling import fused_sampler, row_uniforms  # noqa: E402
from hpcrl.core.generation.torch_engine import EngineOptions, TorchEngine, row_bucket  # noqa: E402
from hpcrl.core.models.tiny import ensure_tiny_model  # noqa: E402

PROMPTS = ["Count: ", "What is 2+3? ", "a", "The quick brown fox jumps", "7*6=", "xyz"]
ARCHITECTURES = ["tiny:qwen2", "tiny:llama", "tiny:qwen3", "tiny:mistral"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _load(name: str) -> tuple:
    path = ensure_tiny_model(name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def qwen2() -> tuple:
    return _load("tiny:qwen2")


def _responses(out: dict) -> list[list[int]]:
    return [
        out["input_ids"][row][out["response_mask"][row].bool()].tolist()
        for row in range(out["input_ids"].shape[0])
    ]


def _hf_greedy(model, tokenizer, prompts: list[str], max_new: int, eos: int | None) -> list:
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=max_new,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
        )
    rows = out[:, batch["input_ids"].shape[1] :].tolist()
    cut = []
    for row in rows:
        cut.append(row[: row.index(eos) + 1] if eos is not None and eos in row else row)
    return cut


@pytest.mark.parametrize("attention", ["bmm", "sdpa"])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_greedy_equals_hf_generate_on_each_architecture(name: str, attention: str) -> None:
    """Both decode attentions (two batched matmuls; scaled_dot_product_attention)."""
    check_greedy_equals_hf_generate(name, EngineOptions(decode_attention=attention))


def check_greedy_equals_hf_generate(name: str, options: EngineOptions) -> None:
    """The engine's greedy tokens are Hugging Face's, its log-probs the teacher-forced ones."""
    model, tokenizer = _load(name)
    engine = TorchEngine.from_hf_model(model, options=options)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    out = engine.generate(ids, GenerationCfg(temperature=0.0, max_new_tokens=16), seed=0)
    eos = tokenizer.eos_token_id
    assert _responses(out) == _hf_greedy(model, tokenizer, PROMPTS, 16, eos)
    # logprobs: the teacher-forced log-softmax of the same weights at the same tokens
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"]).logits
    taken = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, out["input_ids"][:, 1:, None])
    mask = out["response_mask"][:, 1:].bool()
    got = out["generation_logprobs"][:, 1:]
    assert (taken[..., 0][mask] - got[mask]).abs().max() < 1e-4


def _chi_square_upper(degrees: int, z: float) -> float:
    """Wilson–Hilferty approximation of the chi-square quantile at standard-normal ``z``."""
    k = float(degrees)
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


@pytest.mark.parametrize(
    "cfg",
    [
        GenerationCfg(temperature=1.0, max_new_tokens=1),
        GenerationCfg(temperature=0.7, top_k=8, max_new_tokens=1),
        GenerationCfg(temperature=1.3, top_p=0.6, max_new_tokens=1),
    ],
    ids=["t1", "t0.7-topk8", "t1.3-topp0.6"],
)
@pytest.mark.parametrize("sampler", ["eager", pytest.param("fused", marks=pytest.mark.slow)])
@pytest.mark.filterwarnings("error:.*torch.compile failed")  # the fused sampler ran eagerly
def test_sampled_first_tokens_follow_the_processed_softmax(
    qwen2, cfg: GenerationCfg, sampler: str
) -> None:
    """Chi-square goodness of fit of 20,000 draws against softmax(filter(logits / T)), with
    the eager sampler (CPU's) and the fused one (CUDA's, here compiled for the CPU).

    The bound is the 1 - 1e-4 quantile: with a random seed this test would fail wrongly once
    in 10,000 runs; the seed is fixed, so it is deterministic."""
    model, tokenizer = qwen2
    prompt = tokenizer("x = ")["input_ids"]
    num_draws = 20_000
    engine = TorchEngine.from_hf_model(model, options=EngineOptions(max_rows=2048))
    if sampler == "fused":
        engine.sample_tokens = fused_sampler()
    out = engine.generate([prompt] * num_draws, cfg, seed=123)
    drawn = out["input_ids"][:, len(prompt)]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].float() / cfg.temperature
    if cfg.top_k:
        logits = logits.masked_fill(logits < logits.topk(cfg.top_k).values[-1], -math.inf)
    if cfg.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        probs_sorted = sorted_logits.softmax(-1)
        drop = (probs_sorted.cumsum(-1) - probs_sorted) >= cfg.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), -math.inf)
    probs = logits.softmax(-1)
    counts = torch.bincount(drawn, minlength=probs.shape[0]).double()
    assert counts[probs == 0].sum() == 0, "a filtered token was sampled"
    expected = probs.double() * num_draws
    big = expected >= 5  # pool the rare tokens into one bin (chi-square needs >= 5 per bin)
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = wanted > 0
    statistic = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    degrees = int(keep.sum()) - 1
    assert degrees >= 4
    assert statistic < _chi_square_upper(degrees, z=3.719), (statistic, degrees)
    # returned log-probs are those of the distribution sampled from
    logprobs = out["generation_logprobs"][:, len(prompt)]
    torch.testing.assert_close(logprobs, probs.log()[drawn], atol=1e-5, rtol=0)


def test_row_uniforms_are_uniform_and_independent_of_batch_layout() -> None:
    rows = torch.arange(50_000)
    u = row_uniforms(7, rows, 3)
    assert 0 <= float(u.min()) and float(u.max()) < 1
    deciles = torch.histc(u, bins=10, min=0, max=1) / len(u)
    assert (deciles - 0.1).abs().max() < 0.01  # 5 sigma of a binomial at n=50k
    assert torch.equal(row_uniforms(7, rows.flip(0), 3), u.flip(0))
    assert torch.equal(row_uniforms(7, rows[10:20], 3), u[10:20])
    assert not torch.equal(row_uniforms(7, rows, 4), u)
    assert not torch.equal(row_uniforms(8, rows, 3), u)


def test_rows_that_finish_early_leave_the_batch(qwen2) -> None:
    """Six of eight rows stop at their first token: after the next check the batch shrinks to
    two slots, and the output is the same as without compaction (and as HF's)."""
    model, tokenizer = qwen2
    prompts = ["a"] * 6 + ["What is 2+3? ", "Count: "]
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    max_new = 12
    free = TorchEngine.from_hf_model(model).generate(
        ids, GenerationCfg(temperature=0.0, max_new_tokens=max_new), seed=0, stop_token_ids=()
    )
    stop = _responses(free)[0][0]
    assert all(stop not in row for row in _responses(free)[6:]), "precondition"
    cfg = GenerationCfg(temperature=0.0, max_new_tokens=max_new, stop_token_ids=(stop,))

    compacting = TorchEngine.from_hf_model(model, options=EngineOptions(check_every_tokens=2))
    got = compacting.generate(ids, cfg, seed=0, stop_token_ids=())
    stats = compacting.last_stats
    plain = TorchEngine.from_hf_model(
        model, options=EngineOptions(check_every_tokens=2, compact=False)
    )
    same = plain.generate(ids, cfg, seed=0, stop_token_ids=())

    assert _responses(got) == _responses(same) == [[stop]] * 6 + _responses(free)[6:]
    assert stats.compactions == 1
    # token 1 decoded for 8 slots, then tokens 2..11 for the 2 live rows only
    assert stats.decode_steps == max_new - 1
    assert stats.row_steps == 8 + 2 * (max_new - 2)
    assert plain.last_stats.row_steps == 8 * (max_new - 1)


def test_decoding_stops_when_every_row_has_finished(qwen2) -> None:
    model, tokenizer = qwen2
    ids = [tokenizer("a")["input_ids"]] * 3
    greedy = GenerationCfg(temperature=0.0, max_new_tokens=40)
    first = _responses(TorchEngine.from_hf_model(model).generate(ids, greedy, 0, stop_token_ids=()))
    stop = first[0][2]
    engine = TorchEngine.from_hf_model(model, options=EngineOptions(check_every_tokens=4))
    out = engine.generate(ids, greedy, 0, stop_token_ids=(stop,))
    assert _responses(out) == [first[0][: first[0].index(stop) + 1]] * 3
    assert engine.last_stats.decode_steps == 4 * math.ceil((first[0].index(stop) + 1) / 4) - 1


def test_waves_checks_and_compaction_leave_samples_unchanged(qwen2) -> None:
    """Counter-based randomness: a row's sample depends on (seed, row, token) only; masked
    cache columns beyond a row's context change nothing either."""
    model, tokenizer = qwen2
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS * 2]
    cfg = GenerationCfg(temperature=1.0, max_new_tokens=20, stop_token_ids=(5, 17))
    outputs = []
    for options in (
        EngineOptions(),
        EngineOptions(max_rows=4, check_every_tokens=1),
        EngineOptions(check_every_tokens=3, compact=False),
        EngineOptions(column_bucket=8),  # attention over other column buckets
        EngineOptions(column_bucket=64),
    ):
        engine = TorchEngine.from_hf_model(model, options=options)
        outputs.append(engine.generate(ids, cfg, seed=9))
    assert engine.last_stats.waves == 1
    for other in outputs[1:]:
        for key in outputs[0]:
            torch.testing.assert_close(other[key], outputs[0][key], atol=1e-5, rtol=0)
    lengths = outputs[0]["response_lengths"]
    assert 0 < int(lengths.min()) < 20, "precondition: some rows stop early"


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg",
    [
        GenerationCfg(temperature=1.0, max_new_tokens=12, stop_token_ids=(15, 62, 66, 94, 97, 99)),
        GenerationCfg(temperature=0.7, top_k=8, max_new_tokens=12),
        GenerationCfg(temperature=0.0, max_new_tokens=12),
    ],
    ids=["t1-stops", "t0.7-topk8", "greedy"],
)
@pytest.mark.filterwarnings("error:.*torch.compile failed")  # the fused sampler ran eagerly
def test_fused_sampler_generates_what_the_eager_one_does(qwen2, cfg: GenerationCfg) -> None:
    """Whole generations, compaction down to one row included: the CUDA path's sampler
    (compiled for the CPU here) gives the CPU path's tokens and log-probs."""
    model, tokenizer = qwen2
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS * 2]
    options = EngineOptions(check_every_tokens=2)
    eager = TorchEngine.from_hf_model(model, options=options).generate(ids, cfg, seed=4)
    engine = TorchEngine.from_hf_model(model, options=options)
    engine.sample_tokens = fused_sampler()
    fused = engine.generate(ids, cfg, seed=4)
    assert torch.equal(fused["input_ids"], eager["input_ids"])
    assert torch.equal(fused["response_lengths"], eager["response_lengths"])
    torch.testing.assert_close(
        fused["generation_logprobs"], eager["generation_logprobs"], atol=1e-5, rtol=0
    )
    if cfg.stop_token_ids:
        assert engine.last_stats.compactions > 0, "precondition: rows left the batch"


def test_refit_follows_new_weights_in_place(qwen2) -> None:
    model, tokenizer = qwen2
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    greedy = GenerationCfg(temperature=0.0, max_new_tokens=10)
    engine = TorchEngine.from_hf_model(model)
    before = _responses(engine.generate(ids, greedy, 0))
    cache_before = engine._state.cache.data_ptr()
    gen = torch.Generator().manual_seed(3)
    perturbed = {
        name: t * 1.3 + 0.05 * torch.randn(t.shape, generator=gen)
        for name, t in model.state_dict().items()
    }
    engine.update_weights(perturbed.items())
    after = _responses(engine.generate(ids, greedy, 0))
    fresh = transformers.AutoModelForCausalLM.from_config(model.config).eval()
    fresh.load_state_dict(perturbed)
    assert after == _responses(TorchEngine.from_hf_model(fresh).generate(ids, greedy, 0))
    assert after != before
    assert engine._state.cache.data_ptr() == cache_before  # buffers reused, not reallocated
    with pytest.raises(ValueError, match=r"unknown \['model.layers.0.extra.weight'\]"):
        engine.update_weights([*perturbed.items(), ("model.layers.0.extra.weight", torch.ones(1))])


def test_unsupported_architectures_and_lengths_fail_clearly(qwen2) -> None:
    config = transformers.AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2)
    with pytest.raises(UnsupportedModelError, match="model_type 'gpt2'.*backend=vllm"):
        TorchEngine(config, device="cpu", dtype=torch.float32)
    model, _ = qwen2
    engine = TorchEngine.from_hf_model(model, max_model_len=20)
    with pytest.raises(ValueError, match="leaves no room to generate within the engine's max"):
        engine.generate([[5] * 20, [5] * 3], GenerationCfg(max_new_tokens=8), 0)


def test_each_row_generates_at_most_what_its_prompt_leaves_of_the_context(qwen2) -> None:
    """max_model_len 20, max_new_tokens 30 (NeMo RL's configs set max_new_tokens to the whole
    context): a 15-token prompt gets 5 tokens, a 3-token one 17, as NeMo RL's vLLM workers cap
    each request; rows that are not capped sample exactly what an uncapped engine samples."""
    model, tokenizer = qwen2
    cfg = GenerationCfg(max_new_tokens=30, temperature=1.0)
    ids = [[5] * 15, [7] * 3]
    capped = TorchEngine.from_hf_model(model, max_model_len=20).generate(
        ids, cfg, 3, stop_token_ids=[]
    )
    assert capped["response_lengths"].tolist() == [5, 17]
    free = TorchEngine.from_hf_model(model).generate(ids, cfg, 3, stop_token_ids=[])
    assert free["response_lengths"].tolist() == [30, 30]
    assert _responses(capped)[0] == _responses(free)[0][:5]
    assert _responses(capped)[1] == _responses(free)[1][:17]
    lengths = capped["prompt_lengths"] + capped["response_lengths"]
    assert lengths.tolist() == [20, 20]


def test_row_buckets_are_powers_of_two_and_their_halves_between() -> None:
    assert [row_bucket(n) for n in (1, 2, 3, 4, 5, 6, 7, 9, 13, 17, 25, 33, 64, 65, 100)] == [
        1,
        2,
        3,
        4,
        6,
        6,
        8,
        12,
        16,
        24,
        32,
        48,
        64,
        96,
        128,
    ]


def test_prefill_pads_its_packed_tokens_to_one_multiple(qwen2) -> None:
    """The per-token pieces of a prefill see a packed count rounded up to
    PREFILL_TOKEN_MULTIPLE (one Triton specialisation for every GRPO length), while the
    samples stay those of the unpadded prefill (greedy: the model's own continuation)."""
    from hpcrl.core.generation import kv_cache

    model, tokenizer = qwen2
    ids = [tokenizer(p)["input_ids"] for p in ("What is 2+3? ", "Count: a b", "x")]
    greedy = GenerationCfg(temperature=0.0, max_new_tokens=6)
    engine = TorchEngine.from_hf_model(model)
    seen: list[int] = []
    pointwise = engine.decoder.pointwise
    norm = pointwise.add_rms_norm
    pointwise.add_rms_norm = lambda x, *rest: seen.append(x.shape[0]) or norm(x, *rest)
    padded = _responses(engine.generate(ids, greedy, 0, stop_token_ids=()))
    prefill_counts = [count for count in seen if count > 4]  # decode steps: 4 slots at most
    assert prefill_counts and {c % kv_cache.PREFILL_TOKEN_MULTIPLE for c in prefill_counts} == {0}
    assert sum(map(len, ids)) % kv_cache.PREFILL_TOKEN_MULTIPLE != 0, "the case pads"

    original = kv_cache.PREFILL_TOKEN_MULTIPLE
    try:
        kv_cache.PREFILL_TOKEN_MULTIPLE = 1
        unpadded = _responses(
            TorchEngine.from_hf_model(model).generate(ids, greedy, 0, stop_token_ids=())
        )
    finally:
        kv_cache.PREFILL_TOKEN_MULTIPLE = original
    assert padded == unpadded


@pytest.mark.parametrize("name", ["tiny:qwen2", "tiny:qwen3"])
def test_the_first_norm_shares_the_blocks_compiled_norm(name: str) -> None:
    """The decoder's first norm goes through ``add_rms_norm`` (plus exact zeros), the piece
    every block compiles anyway: a model without q/k norms never compiles ``rms_norm`` (one
    compiled piece fewer in a run's first step), Qwen3's q/k norms keep it for one rank of
    input. Greedy tokens and log-probs stay the eager engine's."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from hpcrl.core.generation import decoder

    class CountingBackend:
        def __init__(self) -> None:
            self.graphs = 0

        def __call__(self, graph_module, example_inputs):
            self.graphs += 1
            return graph_module.forward

    model, tokenizer = _load(name)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    cfg = GenerationCfg(temperature=0.0, max_new_tokens=8)
    eager = TorchEngine.from_hf_model(model).generate(ids, cfg, seed=0)
    engine = TorchEngine.from_hf_model(model)
    backend = CountingBackend()
    torch._dynamo.reset()
    try:
        engine.decoder.pointwise = decoder.Pointwise.fused(backend=backend)
        fused = engine.generate(ids, cfg, seed=0)
        entries = {
            piece: len(_debug_get_cache_entry_list(getattr(decoder, piece).__code__))
            for piece in ("rms_norm", "add_rms_norm")
        }
    finally:
        torch._dynamo.reset()
    assert torch.equal(fused["input_ids"], eager["input_ids"])
    torch.testing.assert_close(
        fused["generation_logprobs"], eager["generation_logprobs"], atol=1e-5, rtol=0
    )
    want_rms_norm = 1 if name == "tiny:qwen3" else 0
    assert entries == {"rms_norm": want_rms_norm, "add_rms_norm": 1}
    assert backend.graphs > 0


def test_an_engine_dropped_without_shutdown_is_freed_at_once(qwen2) -> None:
    """No reference cycle holds an engine: on a GPU its CUDA graphs and their pool go when
    the last reference does, not whenever the cyclic GC happens to run (maybe mid-capture
    of another engine's graphs)."""
    import gc
    import weakref

    model, _ = qwen2
    engine = TorchEngine.from_hf_model(model)
    engine.generate([[1, 2, 3], [4, 5]], GenerationCfg(max_new_tokens=3), seed=0)
    dropped = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert dropped() is None
    finally:
        gc.enable()

"""``first_calls.run_first_calls``: the warm-up calls an Automodel worker makes in setup leave
no trace a job could see - the random streams continue as without them (a model with dropout
draws from them in its train-mode forward), no gradient is left on the weights, and the
weights are the ones loaded. (tests/core/test_aot_block.py checks the whole warm worker;
its tiny model has no dropout, so it cannot see the random streams.)"""

from __future__ import annotations

from tests.require import require_module

torch = require_module("torch")


def _model_with_dropout():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcrl.core.backends.automodel.model import TokenLogprobModel

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=128,
        attention_dropout=0.5, attn_implementation="eager",
    )  # fmt: skip
    return TokenLogprobModel(Qwen2ForCausalLM(config))


def test_first_calls_leave_the_random_streams_the_gradients_and_the_weights_alone() -> None:
    from hpcrl.core.backends.automodel.first_calls import run_first_calls
    from hpcrl.core.token_distribution import TokenDistribution

    model = _model_with_dropout()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    seconds = run_first_calls(
        model,
        TokenDistribution(),
        eval_shape=(2, 16),
        train_shape=(2, 16),
        device=torch.device("cpu"),
    )
    assert seconds > 0
    assert torch.equal(torch.rand(4), expected)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())


def test_the_train_mode_forward_of_that_model_draws_random_numbers() -> None:
    """What makes the test above able to fail: the same forward outside ``run_first_calls``
    moves the random streams on."""
    from hpcrl.core.backends.automodel.logprobs import forward_logprobs
    from hpcrl.core.token_distribution import TokenDistribution

    model = _model_with_dropout().train()
    batch = {
        "input_ids": torch.zeros(2, 16, dtype=torch.long),
        "attention_mask": torch.ones(2, 16, dtype=torch.long),
    }
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    forward_logprobs(model, batch, TokenDistribution(), causal_only=True)
    assert not torch.equal(torch.rand(4), expected)


def test_first_calls_take_the_shapes_of_the_kept_calls() -> None:
    """Each call has its kind's shape: the kept compilation's guards may hold only for it."""
    from hpcrl.core.backends.automodel.first_calls import run_first_calls
    from hpcrl.core.backends.automodel.parallelize import decoder_layers
    from hpcrl.core.token_distribution import TokenDistribution

    model = _model_with_dropout()
    seen = []
    decoder_layers(model.hf)[0].register_forward_pre_hook(
        lambda _, args: seen.append((torch.is_grad_enabled(), tuple(args[0].shape[:2])))
    )
    run_first_calls(
        model,
        TokenDistribution(),
        eval_shape=(3, 8),
        train_shape=(2, 32),
        device=torch.device("cpu"),
    )
    assert seen == [(False, (3, 8)), (True, (2, 32))]

"""Rank function of tests/megatron/test_direct_export.py (spawned children import it by path)."""

from __future__ import annotations

from tests.megatron import harness
from tests.recipe_builder import tiny_megatron_recipe


def export_and_reference_run(rank: int, world_size: int, hf_path: str, ckpt_root: str) -> dict:
    """One rank: the direct export against megatron-bridge's, before and after two training
    steps; the reference log-probs after training against the initial log-probs; the current
    log-probs before and after the reference pass (the swap must put everything back)."""
    import torch

    from hpcrl.core.backends.megatron import direct_export
    from hpcrl.core.backends.megatron.generation import export_hf_weights

    worker, place = harness.setup_worker(
        rank, world_size, tiny_megatron_recipe(hf_path), hf_path, ckpt_root
    )
    batch = harness.fixed_batch()
    num_tokens = float(batch["token_mask"].sum())

    def both_exports() -> tuple[dict, dict]:
        direct = direct_export.direct_hf_weights(worker.model_chunks, worker.provider)
        assert direct is not None, "the direct export did not map every parameter"
        bridged = export_hf_weights(worker._hf_bridge(), worker.model_chunks)
        return (
            {name: t.detach().clone() for name, t in direct},
            {name: t.detach().clone() for name, t in bridged},
        )

    assert direct_export.applies()
    initial = worker.logprobs(batch)
    exports = [both_exports()]
    for _ in range(2):
        worker.train_step(harness.micro_batches(batch, 2), harness.masked_nll, num_tokens)
    exports.append(both_exports())
    trained = worker.logprobs(batch)
    reference = worker.reference_logprobs(batch)
    trained_again = worker.logprobs(batch)
    worker_export = dict(worker.export_hf_weights())
    worker.close()
    return {
        "exports": exports,
        "worker_export_is_direct": all(
            torch.equal(worker_export[name], tensor) for name, tensor in exports[1][0].items()
        ),
        "initial": initial,
        "trained": trained,
        "reference": reference,
        "trained_again": trained_again,
    }

"""``PinnedStaging`` on a GPU: what arrives equals each tensor's own copy, across uploads that
reuse the pinned buffer, one that grows it, and a refill while the device is still busy
with work queued before the copy (the event wait keeps the last copy's bytes intact)."""

from __future__ import annotations

import pytest

from tests.require import require_module

pytestmark = pytest.mark.gpu

torch = require_module("torch")


def micro_batches(rows: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, 50_000, (rows, 33), generator=gen),
            "token_mask": torch.rand(rows, 33, generator=gen),
            "valid": torch.rand(rows, 33, generator=gen) > 0.5,
            "advantages": torch.rand(rows, generator=gen).to(torch.bfloat16),
        }
        for _ in range(3)
    ]


def test_uploads_equal_per_tensor_copies_across_reuse_and_growth() -> None:
    from hpcrl.core.workers.device_upload import PinnedStaging

    device = torch.device("cuda")
    staging = PinnedStaging()
    kept = []
    for rows, seed in ((4, 0), (2, 1), (16, 2), (4, 3)):  # the third grows the buffer
        busy = torch.randn(4096, 4096, device=device)
        for _ in range(20):  # queued before the copy: the refill must not overtake it
            busy = busy @ busy.T / 4096
        batches = micro_batches(rows, seed)
        uploaded = staging.upload(batches, device)
        kept.append((batches, uploaded))
    torch.cuda.synchronize()
    assert staging.buffer is not None and staging.buffer.is_pinned()
    for batches, uploaded in kept:  # earlier uploads are untouched by later refills
        for original, on_device in zip(batches, uploaded, strict=True):
            for key, tensor in original.items():
                assert on_device[key].device.type == "cuda"
                assert torch.equal(on_device[key].cpu(), tensor), key

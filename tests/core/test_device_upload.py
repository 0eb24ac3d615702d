"""hpcrl.core.workers.device_upload: the staging buffer's layout and the views that come back.

The pinned buffer and its copy need a GPU (the train benchmark's losses on the device check
them end to end); here the same packing and viewing run with a plain host buffer standing in
for the device's copy of it."""

from __future__ import annotations

import itertools

import torch

from hpcrl.core.workers.device_upload import (
    ALIGNMENT_BYTES,
    PinnedStaging,
    staged_bytes,
    views_of,
)


def mixed_micro_batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(0, 1000, (2, 7), generator=gen),
            "attention_mask": torch.ones(2, 7, dtype=torch.long),
            "token_mask": torch.rand(2, 7, generator=gen),
            "valid": torch.rand(2, 7, generator=gen) > 0.5,  # bool, 14 bytes: padded after
        },
        {
            "input_ids": torch.randint(0, 1000, (3, 5), generator=gen).t(),  # not contiguous
            "advantages": torch.rand(5, generator=gen).to(torch.bfloat16),
            "scale": torch.tensor(0.5),  # 0-d
            "empty": torch.zeros(0, 4),
        },
    ]


def test_views_hold_every_tensor_exactly() -> None:
    micro_batches = mixed_micro_batches()
    staged, staging = staged_bytes(micro_batches)
    copied = staging.clone()  # what the device receives
    back = views_of(micro_batches, staged, copied)
    assert len(back) == len(micro_batches)
    for original, returned in zip(micro_batches, back, strict=True):
        assert list(returned) == list(original)
        for key, tensor in original.items():
            assert returned[key].dtype == tensor.dtype, key
            assert returned[key].shape == tensor.shape, key
            assert torch.equal(returned[key], tensor), key
            assert returned[key].untyped_storage().data_ptr() == copied.data_ptr()


def test_each_tensor_starts_aligned_and_none_overlap() -> None:
    staged, staging = staged_bytes(mixed_micro_batches())
    spans = sorted((offset, offset + t.numel() * t.element_size()) for t, offset in staged.values())
    assert all(start % ALIGNMENT_BYTES == 0 for start, _ in spans)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))
    assert staging.numel() >= spans[-1][1]


def test_writing_one_view_leaves_the_others() -> None:
    micro_batches = mixed_micro_batches()
    staged, staging = staged_bytes(micro_batches)
    back = views_of(micro_batches, staged, staging.clone())
    back[0]["valid"].fill_(True)
    back[0]["token_mask"].mul_(0)
    assert torch.equal(back[0]["input_ids"], micro_batches[0]["input_ids"])
    assert torch.equal(back[0]["attention_mask"], micro_batches[0]["attention_mask"])
    assert torch.equal(back[1]["input_ids"], micro_batches[1]["input_ids"])


def test_on_the_host_the_tensors_pass_through() -> None:
    micro_batches = mixed_micro_batches()
    back = PinnedStaging().upload(micro_batches, torch.device("cpu"))
    for original, returned in zip(micro_batches, back, strict=True):
        assert all(returned[k] is original[k] for k in original)

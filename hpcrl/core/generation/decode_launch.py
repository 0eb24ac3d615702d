"""How the torch engine's Triton decode attention is launched (``KernelLaunch``): kept apart
from ``triton_attention`` so that the engine's options name a launch without importing Triton.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class KernelLaunch:
    """How the partial kernel is launched: which program (``kind``), its column block, warps
    and pipeline stages.

    ``kind``: ``"per_head"``, one program per (row, query head, block) re-reading the block for
    each head; ``"grouped"``, one per (row, kv head, block) serving the whole query group from
    one read with elementwise products (the fastest of 32 launches on one H200 at 16 columns, 1
    warp: ``benchmarks/decode_attention_kernels.py``); ``"dot"``, one per (row, kv head, split)
    looping over its split's columns ``block_n`` at a time with two tensor-core products, as
    many splits as bring the programs to ``target_programs`` (one split: no combine kernel).
    """

    block_n: int = 16
    num_warps: int = 1
    num_stages: int = 3
    kind: str = attrs.field(
        default="grouped", validator=attrs.validators.in_(("per_head", "grouped", "dot"))
    )
    target_programs: int = 512  # "dot" only
    # True: the loads read every column up to the bucket's width, the ones the row does not
    # see included (the kernels before 2026-12-06; kept as benchmarks' baseline)
    read_unseen: bool = False

    def splits(self, rows: int, kv_heads: int, width: int) -> tuple[int, int]:
        """(splits, columns per split) for ``width`` columns."""
        blocks = -(-width // self.block_n)
        if self.kind != "dot":
            return blocks, self.block_n
        wanted = max(1, min(blocks, -(-self.target_programs // (rows * kv_heads))))
        columns = -(-blocks // wanted) * self.block_n
        return -(-width // columns), columns

    def as_text(self) -> str:
        """``kind,block_n,num_warps,num_stages,target_programs[,read-unseen]`` (what
        ``parse`` reads)."""
        fields = (self.block_n, self.num_warps, self.num_stages, self.target_programs)
        unseen = ("read-unseen",) if self.read_unseen else ()
        return ",".join((self.kind, *map(str, fields), *unseen))

    @classmethod
    def parse(cls, text: str) -> KernelLaunch:
        kind, block_n, num_warps, num_stages, target, *rest = text.split(",")
        if rest not in ([], ["read-unseen"]):
            raise ValueError(f"launch {text!r}: a sixth field can only be 'read-unseen'")
        numbers = (int(block_n), int(num_warps), int(num_stages))
        return cls(*numbers, kind, int(target), read_unseen=bool(rest))

"""How the torch engine's Triton decode attention is launched (``KernelLaunch``, and
``launch_for_rows`` when the engine's options name none): kept apart from ``triton_attention``
so that the engine's options name a launch without importing Triton.
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


#: Decode steps of at least this many rows take ``TENSOR_CORE_LAUNCH`` unless the engine's
#: options name a launch; fewer rows take the grouped launch (``KernelLaunch()``).
TENSOR_CORE_MIN_ROWS = 128
TENSOR_CORE_LAUNCH = KernelLaunch(
    block_n=32, num_warps=2, num_stages=3, kind="dot", target_programs=256
)


def launch_for_rows(rows: int) -> KernelLaunch:
    """The launch of a decode step of ``rows`` rows when none is chosen. Measured on one H100
    in the engine's whole decode step (benchmarks/decode_step_launches.py, 16 heads of 128,
    docs/performance.md, issue 25 item 4): at 256 rows the tensor-core launch is 9% faster
    per step than the grouped one (2.676 against 2.945 ms), at 64 rows 3% slower (1.541
    against 1.496 ms); 128 is between the two, not measured."""
    return TENSOR_CORE_LAUNCH if rows >= TENSOR_CORE_MIN_ROWS else KernelLaunch()

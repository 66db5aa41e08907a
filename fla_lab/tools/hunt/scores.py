"""The score-block census: where the non-finite entries of a chunked kernel's [B, T, H, chunk] score matrix sit, by
(query sub-chunk, key sub-chunk) block (`score_blocks`, `ScoreBlocks`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ScoreBlocks:
    """Where the non-finite entries of a [B, T, H, chunk] score matrix sit: query row t (of the sequence), key column
    s (of t's chunk), grouped into sub-chunk blocks (i, j) = (query sub-chunk, key sub-chunk) of the first chunk
    that has any. Diagonal blocks (i = j) hold the causal mask; off-diagonal ones the exponents that need a
    reference row between the two sub-chunks."""
    chunk: int
    sub: int
    chunk_index: int
    blocks: dict[tuple[int, int], int]
    first_pair: tuple[int, int]  # (t, s), rows of the sequence

    @property
    def diagonal(self) -> bool:
        return any(i == j for i, j in self.blocks)

    @property
    def off_diagonal(self) -> bool:
        return any(i != j for i, j in self.blocks)

    def __str__(self) -> str:
        kind = " and ".join(k for k, on in (("diagonal", self.diagonal), ("off-diagonal", self.off_diagonal)) if on)
        blocks = ", ".join(f"({i},{j}) x{n}" for (i, j), n in sorted(self.blocks.items())[:6])
        more = " ..." if len(self.blocks) > 6 else ""
        return (f"chunk {self.chunk_index} ({self.chunk} rows, sub-chunks of {self.sub}): {kind} block(s) "
                f"(query sub-chunk, key sub-chunk) {blocks}{more}; first pair (t, s) = {self.first_pair}")


def score_blocks(mask: torch.Tensor, T: int, chunk: int, sub: int = 16) -> ScoreBlocks | None:
    """The bad pairs of a [B, T', H, chunk] score matrix (T' >= T), or None when `mask` is not shaped like one."""
    if mask.dim() != 4 or mask.shape[-1] != chunk or mask.shape[1] < T or not mask.any():
        return None
    rows = mask[:, :T].any(0).any(1)  # [T, chunk]: (query row, key column within its chunk)
    t_bad, s_bad = rows.nonzero(as_tuple=True)
    if t_bad.numel() == 0:
        return None
    c = int(t_bad[0]) // chunk
    in_chunk = t_bad // chunk == c
    t_in, s_in = t_bad[in_chunk] % chunk, s_bad[in_chunk]
    sub = min(sub, chunk)
    blocks: dict[tuple[int, int], int] = {}
    for i, j in zip((t_in // sub).tolist(), (s_in // sub).tolist()):
        blocks[(i, j)] = blocks.get((i, j), 0) + 1
    return ScoreBlocks(chunk, sub, c, blocks, (int(t_bad[0]), c * chunk + int(s_bad[0])))

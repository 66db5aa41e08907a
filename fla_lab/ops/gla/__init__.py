"""GLA (gated linear attention): `chunk_gla` (see `chunk.py`) and `fused_recurrent_gla` (see `fused_recurrent.py`).

Reference: `fla_lab.spec.reference.recurrent_gla`. Same signatures as flash-linear-attention 0.6.0.
"""
from fla_lab.ops.gla.chunk import chunk_gla
from fla_lab.ops.gla.fused_recurrent import fused_recurrent_gla

__all__ = ["chunk_gla", "fused_recurrent_gla"]

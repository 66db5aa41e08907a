"""Gated Slot Attention: `chunk_gsa` (see `chunk.py`) and `fused_recurrent_gsa` (`fused_recurrent.py`)."""
from fla_lab.ops.gsa.chunk import chunk_gsa
from fla_lab.ops.gsa.fused_recurrent import fused_recurrent_gsa

__all__ = ["chunk_gsa", "fused_recurrent_gsa"]

"""Gated Slot Attention: `chunk_gsa` (see `chunk.py`)."""
from fla_lab.ops.gsa.chunk import chunk_gsa

__all__ = ["chunk_gsa"]

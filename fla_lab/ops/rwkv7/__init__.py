"""RWKV-7 (DPLR): `chunk_rwkv7` (see `chunk.py`) and `fused_recurrent_rwkv7` (see `fused_recurrent.py`)."""
from fla_lab.ops.rwkv7.chunk import chunk_rwkv7
from fla_lab.ops.rwkv7.fused_recurrent import fused_recurrent_rwkv7

__all__ = ["chunk_rwkv7", "fused_recurrent_rwkv7"]

"""RWKV6: `chunk_rwkv6` (see `chunk.py`) and `fused_recurrent_rwkv6` (see `fused_recurrent.py`).

Reference: `fla_lab.spec.reference.recurrent_rwkv6`. Same signatures as flash-linear-attention 0.6.0, plus `bug=`
(see `fla_lab.teaching.bugs`): `bug=None` is the fixed kernel.
"""
from fla_lab.ops.rwkv6.chunk import chunk_rwkv6
from fla_lab.ops.rwkv6.fused_recurrent import fused_recurrent_rwkv6

__all__ = ["chunk_rwkv6", "fused_recurrent_rwkv6"]

"""RWKV-7 (DPLR): `fused_recurrent_rwkv7` (see `fused_recurrent.py`)."""
from fla_lab.ops.rwkv7.fused_recurrent import fused_recurrent_rwkv7

__all__ = ["fused_recurrent_rwkv7"]

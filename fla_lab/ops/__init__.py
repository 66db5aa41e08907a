"""Triton kernels, flash-linear-attention 0.6.0 signatures, `[B, T, H, D]` layout, natural-log decays."""
from fla_lab.ops.contract import LayoutWarning, set_value_checks
from fla_lab.ops.gla import chunk_gla, fused_recurrent_gla
from fla_lab.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
from fla_lab.ops.rwkv7 import fused_recurrent_rwkv7

__all__ = ["chunk_gla", "chunk_rwkv6", "fused_recurrent_gla", "fused_recurrent_rwkv6", "fused_recurrent_rwkv7",
           "LayoutWarning", "set_value_checks"]

"""Triton kernels, flash-linear-attention 0.6.0 signatures, `[B, T, H, D]` layout, natural-log decays."""
from fla_lab.ops.contract import LayoutWarning, set_value_checks
from fla_lab.ops.gla import fused_recurrent_gla
from fla_lab.ops.rwkv6 import fused_recurrent_rwkv6

__all__ = ["fused_recurrent_gla", "fused_recurrent_rwkv6", "LayoutWarning", "set_value_checks"]

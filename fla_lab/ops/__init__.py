"""Triton kernels, flash-linear-attention 0.6.0 signatures, `[B, T, H, D]` layout, natural-log decays.

One sub-package per family (`gla/`, `rwkv6/`, `rwkv7/`, `gsa/`: the public ops and their `bug=` switches), the
stages they share in `common/` (the fused recurrent kernels of GLA, RWKV6 and GSA, the chunk stages, the launch
settings), the input contract in `contract/`.
"""
from fla_lab.ops.common.launch import (ChunkLaunch, Precision, RecurrentLaunch, RWKV7ChunkLaunch,
                                       RWKV7RecurrentLaunch, default_launch)
from fla_lab.ops.contract import LayoutWarning, flush_value_checks, set_value_checks, value_check_mode
from fla_lab.ops.gla import chunk_gla, fused_recurrent_gla
from fla_lab.ops.gsa import chunk_gsa, fused_recurrent_gsa
from fla_lab.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
from fla_lab.ops.rwkv7 import chunk_rwkv7, fused_recurrent_rwkv7
from fla_lab.ops.gsa.chunk import SWITCHES as _GSA
from fla_lab.ops.rwkv6.chunk import SWITCHES as _RWKV6_CHUNK
from fla_lab.ops.rwkv6.fused_recurrent import SWITCHES as _RWKV6_RECURRENT
from fla_lab.ops.rwkv7.chunk import UNLISTED

SWITCHES = _RWKV6_CHUNK + _RWKV6_RECURRENT + _GSA  # each op's `bug=` switches (`common/switches.py`)

__all__ = ["chunk_gla", "chunk_gsa", "chunk_rwkv6", "chunk_rwkv7", "fused_recurrent_gla", "fused_recurrent_gsa",
           "fused_recurrent_rwkv6", "fused_recurrent_rwkv7", "ChunkLaunch", "Precision", "RecurrentLaunch",
           "RWKV7ChunkLaunch", "RWKV7RecurrentLaunch", "default_launch", "LayoutWarning", "set_value_checks",
           "flush_value_checks", "value_check_mode", "SWITCHES", "UNLISTED"]

"""Attention layers on fla_lab's kernels, with `bug=` switches: RWKV-6 and RWKV-7 (initialised as the official RWKV
code) and Gated Slot Attention (as flash-linear-attention 0.6.0).

Kernels are imported inside `forward`, so the layers import (and can be inspected) before every op exists.
"""
from fla_lab.layers.gsa import GatedSlotAttention
from fla_lab.layers.rwkv6 import LoRA, RWKV6Attention
from fla_lab.layers.rwkv7 import RWKV7Attention, real_torch_empty, uninitialized

__all__ = ["GatedSlotAttention", "LoRA", "RWKV6Attention", "RWKV7Attention", "real_torch_empty", "uninitialized"]

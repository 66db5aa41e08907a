"""Attention layers on fla_lab's kernels, with `bug=` switches: RWKV-6 and RWKV-7 (initialised as the official RWKV
code) and Gated Slot Attention (as flash-linear-attention 0.6.0).

"""
from fla_lab.layers.gsa import GatedSlotAttention
from fla_lab.layers.rwkv6 import LoRA, RWKV6Attention
from fla_lab.layers.rwkv7 import RWKV7Attention, real_torch_empty, uninitialized
from fla_lab.layers import rwkv6 as _rwkv6, rwkv7 as _rwkv7
from fla_lab.ops import SWITCHES as _KERNEL_SWITCHES

SWITCHES = _KERNEL_SWITCHES + _rwkv6.SWITCHES + _rwkv7.SWITCHES  # every `bug=` a user can pass, kernels' and layers'

__all__ = ["GatedSlotAttention", "LoRA", "RWKV6Attention", "RWKV7Attention", "real_torch_empty", "uninitialized", "SWITCHES"]

"""RWKV attention layers on fla_lab's kernels, initialised as the official RWKV code, with `bug=` switches.

Kernels are imported inside `forward`, so the layers import (and can be inspected) before every op exists.
"""
from fla_lab.layers.rwkv6 import LoRA, RWKV6Attention
from fla_lab.layers.rwkv7 import RWKV7Attention, real_torch_empty, uninitialized

__all__ = ["LoRA", "RWKV6Attention", "RWKV7Attention", "real_torch_empty", "uninitialized"]

"""Pieces every kernel family shares: kernel registration, dtype policy, launch helpers, gradient glue."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fla_lab import runtime

_KERNELS: dict[str, object] = {}


def kernel(fn):
    """`triton.jit`, plus a registry so `fla_lab.doctor()` can tell whether kernels were decorated in the right mode."""
    jitted = triton.jit(fn)
    _KERNELS[f"{fn.__module__}.{fn.__name__}"] = jitted
    return jitted


def registered_kernels() -> dict[str, object]:
    return dict(_KERNELS)


@kernel
def state_tile(i_k, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets and masks of tile (i_k, i_v) of a key-major [K, V] state: o_k, o_v, m_k, m_v, m_kv, p_kv."""
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    return o_k, o_v, m_k, m_v, m_k[:, None] & m_v[None, :], o_k[:, None] * V + o_v[None, :]


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(n)


def dot_dtype(dtype: torch.dtype):
    """Operand dtype for `tl.dot`: the input dtype on a GPU (tensor cores), fp32 under the interpreter.

    The interpreter runs bf16 arithmetic and bf16 `tl.dot` on raw bit patterns, silently wrong, so it only
    ever sees fp32 operands.
    """
    if runtime.interpreting() or dtype == torch.float32:
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


# fp32 dots in IEEE precision: a workbook about numerical error should not hide TF32's 1e-3 in "fp32".
DOT_PRECISION = "ieee"


def grid_size(n: int, block: int) -> int:
    return triton.cdiv(n, block)


def check_bug(bug: str | None, op: str) -> None:
    """`bug=None` is the fixed kernel; anything else must be a catalogue entry for this op."""
    if bug is None:
        return
    from fla_lab import bugs

    names = [b.name for b in bugs.for_op(op)]
    if bug not in names:
        raise ValueError(f"{op}: unknown bug={bug!r}; this op has {names or 'no switchable bugs'} "
                         "(see fla_lab.bugs.show()).")


def reverse_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).cumsum(dim).flip(dim)


def as_contiguous(*xs):
    return [None if x is None else x.contiguous() for x in xs]


def custom_fwd(fn):
    """Kernels see the real input dtypes under autocast (like FLA's autocast_custom_fwd)."""
    return torch.amp.custom_fwd(device_type="cuda")(fn)


def custom_bwd(fn):
    return torch.amp.custom_bwd(device_type="cuda")(fn)


@functools.cache
def device_name() -> str:
    return runtime.device()

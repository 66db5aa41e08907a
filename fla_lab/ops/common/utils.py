"""Pieces every kernel family shares: kernel registration, slot helpers, the dot helpers, launch helpers, gradient
glue. Which dtype and precision the dots take is `launch.Precision`'s, per call."""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Heuristics

from fla_lab import runtime

_KERNELS: dict[str, object] = {}


# Integer arguments that count rows, chunks or batch rows: Triton would otherwise compile one kernel per value class
# (== 1, divisible by 16), so every new sequence length could compile again; FLA passes them the same way
# (`do_not_specialize=['T']`). They are loop bounds and strides only: the generated algorithm is the same.
UNSPECIALIZED = ("B", "T", "NT")


def kernel(fn):
    """`triton.jit`, plus a registry so `fla_lab.doctor()` can tell whether kernels were decorated in the right mode.
    The lengths of UNSPECIALIZED are not specialized on."""
    params = inspect.signature(fn).parameters
    lengths = [n for n in UNSPECIALIZED if n in params and params[n].annotation in (inspect.Parameter.empty, "")]
    jitted = triton.jit(fn, do_not_specialize=lengths)
    runtime.announce_first_launch(jitted)
    _KERNELS[f"{fn.__module__}.{fn.__name__}"] = jitted
    return jitted


class PackedSwitch(Heuristics):
    """`triton.heuristics` for the packed-batch switch (FLA's IS_VARLEN): VARLEN is on when the call passes offsets,
    off when it passes `cu_seqlens=None`. `.fn` stays the Python function, as on a jitted kernel (its source and
    signature, which the lessons print)."""

    def __init__(self, jitted):
        super().__init__(jitted, jitted.arg_names, {"VARLEN": lambda args: args["cu_seqlens"] is not None})
        self.jitted, self.fn = jitted, jitted.fn

    def run(self, *args, **kwargs):
        for name, rule in self.values.items():
            kwargs[name] = rule({**dict(zip(self.arg_names, args)), **kwargs})
        return self.jitted.run(*args, **kwargs)

    def __getattr__(self, name):  # the jitted kernel's own attributes (its compiled kernels: `device_caches`)
        if name == "jitted":
            raise AttributeError(name)
        return getattr(self.jitted, name)


def packed_switch(jitted) -> PackedSwitch:
    """Declares a kernel's VARLEN once, from its `cu_seqlens` argument: `@packed_switch` above `@kernel`."""
    return PackedSwitch(jitted)


def registered_kernels() -> dict[str, object]:
    return dict(_KERNELS)


@kernel
def state_tile(i_k, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets and masks of tile (i_k, i_v) of a key-major [K, V] state: o_k, o_v, m_k, m_v, m_kv, p_kv."""
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    return o_k, o_v, m_k, m_v, m_k[:, None] & m_v[None, :], o_k[:, None] * V + o_v[None, :]


@kernel
def batch_head(i_bh, H: tl.constexpr):
    """A program's (batch * head, batch, head) as 64-bit integers, so every offset built from them is 64-bit:
    at training sizes `((i_b * NT + i_t) * H + i_h) * K * V` (per-chunk states) passes 2**31 elements."""
    i_bh = i_bh.to(tl.int64)
    return i_bh, i_bh // H, i_bh % H


@kernel
def sequence_rows(i_n, T, cu_seqlens, VARLEN: tl.constexpr):
    """Sequence i_n's first row on the time axis (64-bit) and its length: `i_n * T` and T in a dense batch, read
    from `cu_seqlens` in a packed one (FLA's varlen: B = 1, sequence n is rows cu_seqlens[n]:cu_seqlens[n + 1])."""
    if VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n.to(tl.int64) * T
    return bos, T


@kernel
def sequence_chunks(i_n, T, BT: tl.constexpr, cu_seqlens, chunk_offsets, VARLEN: tl.constexpr):
    """A per-sequence program's (bos, T, NT, boc): first row, length, chunks, and the index of its first chunk in
    per-chunk buffers (`[B, NT, ...]` dense, `[1, NT of the whole batch, ...]` packed)."""
    bos, T = sequence_rows(i_n, T, cu_seqlens, VARLEN)
    NT = tl.cdiv(T, BT)
    if VARLEN:
        boc = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        boc = i_n.to(tl.int64) * NT
    return bos, T, NT, boc


@kernel
def chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN: tl.constexpr):
    """A per-chunk program's (bos, T, i_t, boc): its sequence's first row and length, its chunk within the sequence,
    and that sequence's first chunk in per-chunk buffers (so chunk i_t is `boc + i_t`). Dense: chunk i_t of batch
    row i_b. Packed: i_t runs over every chunk of the batch and `chunk_indices [NT, 2]` names its (sequence, chunk)."""
    if VARLEN:
        i_n = tl.load(chunk_indices + 2 * i_t).to(tl.int64)
        i_c = tl.load(chunk_indices + 2 * i_t + 1)
        bos, T = sequence_rows(i_n, T, cu_seqlens, VARLEN)
        boc = (i_t - i_c).to(tl.int64)
    else:
        i_c = i_t
        bos = i_b * T
        boc = i_b * NT
    return bos, T, i_c, boc


@dataclass(frozen=True)
class Slot:
    """A kernel's `tl.constexpr` slot for a `@triton.jit` helper (REFERENCE_ROW, EXPONENT, H0_MASK, END_DECAY): the
    one way both a bug switch and a caller's code (a notebook exercise) enter a kernel. Each op that has one declares
    it beside its code, and takes `bug=` and `helper=`.

    `switch`: the `bug=` value that puts `historical` there; None for an op whose only switch is unlisted
    (`switches.digest`), so any `bug` that passes `check_switch` is it."""
    op: str
    name: str
    shipped: object
    historical: object
    switch: str | None = None

    def pick(self, bug: str | None = None, helper=None):
        """The helper a call runs: `historical` under the switch, else the caller's `helper`, else `shipped`. Both
        a switch and a helper is ambiguous: refused."""
        switched = bug is not None and (self.switch is None or bug == self.switch)
        if switched and helper is not None:
            raise ValueError(f"{self.op}: the bug switch is its own {self.name} helper; pass bug= or helper=, "
                             "not both")
        return self.historical if switched else (helper if helper is not None else self.shipped)


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(n)


@kernel
def mma(a, b, DOT):
    """`a @ b` on the tensor cores: operands in the dot dtype DOT (`launch.Precision.dot`), fp32 accumulation; fp32
    operands in IEEE fp32, never TF32 (a workbook about numerical error should not hide TF32's 1e-3 in "fp32")."""
    return tl.dot(a.to(DOT), b.to(DOT), input_precision="ieee")  # safeguard: dot_precision_ieee


@kernel
def mma_split(a, b, DOT, SPLIT_STATES: tl.constexpr):
    """`a @ b` for an fp32 state `b` split as hi + lo, two 16-bit parts: about 16 significant bits, not 8.
    SPLIT_STATES False (`launch.Precision.split_states`) rounds `b` once, as `mma` does.

    dq and dk take the state path through h and dh. One bf16 rounding of them (2**-9) breaks the exact
    cancellation in q * dq - k * dk (e.g. against rowsum(ht * dht)), and dg's cumulative sum spreads that
    over the whole sequence (docs/performance.md, 'split state products').
    """
    a = a.to(DOT)
    b_hi = b.to(DOT)
    if DOT == tl.float32 or not SPLIT_STATES:
        return tl.dot(a, b_hi, input_precision="ieee")
    b_lo = (b - b_hi.to(tl.float32)).to(DOT)
    # safeguard: state_products_split
    return tl.dot(a, b_hi, input_precision="ieee") + tl.dot(a, b_lo, input_precision="ieee")


def grid_size(n: int, block: int) -> int:
    return triton.cdiv(n, block)


def as_contiguous(*xs):
    return [None if x is None else x.contiguous() for x in xs]


def cast_grad(grad, like):
    """A backward's gradient in its input's dtype: None where the gradient or the input is None."""
    return None if grad is None or like is None else grad.to(like.dtype)


def custom_fwd(fn):
    """Kernels see the real input dtypes under autocast (like FLA's autocast_custom_fwd)."""
    return torch.amp.custom_fwd(device_type="cuda")(fn)


def custom_bwd(fn):
    return torch.amp.custom_bwd(device_type="cuda")(fn)


@functools.cache
def device_name() -> str:
    return runtime.device()

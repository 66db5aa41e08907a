"""Every value check of an op call in one pass: a Triton kernel that sets bits in one int32 flag, no host sync.

An op's tensors are read as rows (a row = the last dimension: one (b, t, h) of a [B, T, H, D] input, one
(b, h, k) of a state), and the flag's bits say what was found:

    bit i (i < MAX_SLOTS)   slot i holds a NaN or an inf
    POSITIVE_DECAY_BIT      slot 0 is a log-decay and holds a value > 0
    TRANSITION_BIT          slots 0, 1, 2 are RWKV-7's w, a, b and some row's transition diag(exp w) + b a^T has a
                            real eigenvalue beyond +-LAMBDA0 (see `growing_rows`): the state can grow

`value_flags` launches the kernel on a GPU and runs `reference_value_flags` (torch ops, the same definition)
elsewhere: the Triton interpreter would be slow, and on the CPU there is no queue to keep busy.

`bits` gives each tensor its slot when some slots are left out: an op's own kernels can set those bits as they
read the tensor anyway (`nonfinite_probe`, `or_nonfinite_bit`, `or_positive_decay_bit`; the chunked GLA,
RWKV6 and RWKV-7 forward do), which saves the flag pass a read of each.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_lab import runtime
from fla_lab.ops.common.utils import kernel, next_pow2

MAX_SLOTS = 8
POSITIVE_DECAY_BIT = 8
TRANSITION_BIT = 9
TRANSITION_TOL = 0.02  # bf16 rounding of a unit-norm kk moves a contract transition's radius by ~4e-3 above 1
LAMBDA0 = 1.0 + TRANSITION_TOL
FP32_MAX = 3.4028234663852886e38

_DECAY_BIT = tl.constexpr(POSITIVE_DECAY_BIT)
_TRANSITION_BIT = tl.constexpr(TRANSITION_BIT)
_FP32_MAX = tl.constexpr(FP32_MAX)


def nonfinite_bit(slot: int) -> int:
    return 1 << slot


def growing_rows(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows (all dims but the last) whose transition M = diag(d) + b a^T, d = exp(w), can grow the state.

    A real lambda outside the d_i is an eigenvalue of M iff f(lambda) = 1 + sum_i a_i b_i / (d_i - lambda) = 0.
    f -> 1 as |lambda| -> inf, so f(LAMBDA0) < 0 (f(-LAMBDA0) < 0) puts an eigenvalue above LAMBDA0 (below
    -LAMBDA0). d is taken at min(w, 0) (a positive decay has its own bit), so LAMBDA0 - d >= TRANSITION_TOL.
    When the a_i b_i share a sign (RWKV-7's, #150's) every eigenvalue is real, f is monotone beyond the d_i,
    and the test is exact: flagged iff the spectral radius passes LAMBDA0. With mixed signs a flag is never
    wrong, but a complex pair (or two real roots beyond LAMBDA0) can escape. The a, b of RWKV-7's layer have
    every a_i b_i <= 0 and sum_i |a_i b_i| <= 1: never flagged.
    """
    d = torch.where(w < 0, w.float(), 0.0).exp()
    c = a.float() * b.float()
    return ((c / (LAMBDA0 - d)).sum(-1) > 1) | ((c / (LAMBDA0 + d)).sum(-1) < -1)


@torch.no_grad()
def reference_value_flags(slots: list[torch.Tensor], decay: bool = False, transition: bool = False,
                          bits: tuple[int, ...] | None = None) -> torch.Tensor:
    """The flag (int32, shape [1], on the slots' device) with torch ops: the definition the kernel follows.
    `bits[i]`: the slot of `slots[i]` (default i)."""
    bits = [(~torch.isfinite(x)).any().int() << i for i, x in zip(_slot_ids(slots, bits), slots)]
    if decay:
        bits.append((slots[0] > 0).any().int() << POSITIVE_DECAY_BIT)
    if transition:
        bits.append(growing_rows(*slots[:3]).any().int() << TRANSITION_BIT)
    return torch.stack(bits).sum().reshape(1).to(torch.int32)


def _slot_ids(slots, bits) -> tuple[int, ...]:
    bits = tuple(range(len(slots))) if bits is None else tuple(bits)
    if len(bits) != len(slots) or not all(0 <= b < MAX_SLOTS for b in bits):
        raise ValueError(f"value_flags: one slot in [0, {MAX_SLOTS}) per tensor, got {bits} for {len(slots)}")
    return bits


# ------------------------------------------------------------------------------------------------ the kernel

@kernel
def _load_rows(x, n_rows, stride, pid, W: tl.constexpr, BW: tl.constexpr, BLOCK_R: tl.constexpr):
    """Program `pid`'s [BLOCK_R, BW] tile of a row-major [n_rows, W] view, in fp32, and its mask."""
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # 64-bit: B*T*H*K can pass 2**31
    cols = tl.arange(0, BW)
    mask = (rows < n_rows)[:, None] & (cols < W)[None, :]
    tile = tl.load(x + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return tile, mask


@kernel
def _any_in_row(cond):
    """1 for the rows where `cond` holds somewhere, else 0: a reduction along the row, inside a warp."""
    return tl.max(cond.to(tl.int32), axis=1)


@kernel
def _slot_bits(tile, mask, SLOT: tl.constexpr, DECAY: tl.constexpr):
    """Per row: bit SLOT if it holds a NaN/inf (NaN fails every comparison), the decay bit if DECAY and a value > 0."""
    bits = _any_in_row(mask & ~(tl.abs(tile) <= _FP32_MAX)) << SLOT
    if DECAY:
        bits |= _any_in_row(mask & (tile > 0)) << _DECAY_BIT
    return bits


@kernel
def _transition_grows(w, a, b, LAMBDA: tl.constexpr):
    """`growing_rows` per row of a tile (padding has a = b = 0, so it adds nothing)."""
    d = tl.exp(tl.where(w < 0, w, 0.0))
    c = a * b
    up = tl.sum(c / (LAMBDA - d), axis=1)
    down = tl.sum(c / (LAMBDA + d), axis=1)
    return ((up > 1) | (down < -1)).to(tl.int32)


@kernel
def value_flags_kernel(flags, xs, ns, strides, WS: tl.constexpr, BWS: tl.constexpr, N: tl.constexpr,
                       SLOTS: tl.constexpr, DECAY: tl.constexpr, TRANSITION: tl.constexpr, LAMBDA: tl.constexpr,
                       BLOCK_R: tl.constexpr):
    """Rows [pid * BLOCK_R, (pid + 1) * BLOCK_R) of each of the N slots (xs[i]: ns[i] rows of WS[i] values,
    `strides[i]` apart; its bit SLOTS[i]). Bits are gathered per row (no reduction across warps) and OR-ed into the flag by the
    rows that found something: a valid input issues no atomic at all."""
    pid = tl.program_id(0)
    bits = tl.zeros([BLOCK_R], dtype=tl.int32)
    if TRANSITION:  # w, a, b stay loaded for the secular sums
        w, mw = _load_rows(xs[0], ns[0], strides[0], pid, WS[0], BWS[0], BLOCK_R)
        a, ma = _load_rows(xs[1], ns[1], strides[1], pid, WS[1], BWS[1], BLOCK_R)
        b, mb = _load_rows(xs[2], ns[2], strides[2], pid, WS[2], BWS[2], BLOCK_R)
        bits |= _slot_bits(w, mw, SLOTS[0], DECAY) | _slot_bits(a, ma, SLOTS[1], False)
        bits |= _slot_bits(b, mb, SLOTS[2], False)
        bits |= _transition_grows(w, a, b, LAMBDA) << _TRANSITION_BIT
    for i in tl.static_range(3 if TRANSITION else 0, N):
        tile, mask = _load_rows(xs[i], ns[i], strides[i], pid, WS[i], BWS[i], BLOCK_R)
        bits |= _slot_bits(tile, mask, SLOTS[i], DECAY and i == 0)
    tl.atomic_or(flags + tl.zeros([BLOCK_R], dtype=tl.int32), bits, mask=bits != 0)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """`x` as [rows, last dim] with unit column stride: a view for the ops' inputs, a copy only for odd strides."""
    if x.dim() == 0 or (x.stride(-1) != 1 and x.shape[-1] > 1):
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1] if x.dim() else 1)


def launch_value_flags(slots: list[torch.Tensor], decay: bool = False, transition: bool = False,
                       bits: tuple[int, ...] | None = None) -> torch.Tensor:
    """The flag (int32, shape [1], on the slots' device) from one launch of `value_flags_kernel`.

    `slots` are non-empty tensors (at most MAX_SLOTS); `decay`: slots[0] is a log-decay; `transition`: slots[0:3]
    are w, a, b of the same shape; `bits[i]`: the slot (bit) of slots[i], default i.
    """
    if not 0 < len(slots) <= MAX_SLOTS:
        raise ValueError(f"value_flags: 1 to {MAX_SLOTS} tensors, got {len(slots)}")
    ids = _slot_ids(slots, bits)
    rows = [_rows(x) for x in slots]
    widths = tuple(r.shape[1] for r in rows)
    padded = tuple(next_pow2(w) for w in widths)
    # elements of the widest slot's tile: docs/performance.md, 'value checks: tile'
    tile = 16384 if runtime.interpreting() else 1024
    block_r = max(1, tile // max(padded))
    n_rows = tuple(r.shape[0] for r in rows)
    flags = torch.zeros(1, dtype=torch.int32, device=slots[0].device)
    value_flags_kernel[(triton.cdiv(max(n_rows), block_r),)](
        flags, tuple(rows), n_rows, tuple(r.stride(0) for r in rows), widths, padded, len(rows), ids,
        decay, transition, LAMBDA0, block_r)
    return flags


def value_flags(slots: list[torch.Tensor], decay: bool = False, transition: bool = False,
                bits: tuple[int, ...] | None = None) -> torch.Tensor:
    """The flag of `slots`, left on their device (no sync): the kernel on a GPU, torch ops elsewhere."""
    if slots[0].device.type == "cuda":
        return launch_value_flags(slots, decay, transition, bits)
    return reference_value_flags(slots, decay, transition, bits)


# ------------------------------------------------------------------------------- bits set inside an op's kernels

@kernel
def nonfinite_probe(x):
    """0 where x is finite, NaN where it is NaN or inf: summed over everything a kernel read, NaN iff any was."""
    return x * 0.0


@kernel
def or_nonfinite_bit(flags, probe, SLOT: tl.constexpr):
    """OR slot SLOT's bit into the flag when `probe` (a sum of `nonfinite_probe`s) is NaN; no atomic otherwise."""
    bad = probe != probe
    tl.atomic_or(flags, bad.to(tl.int32) << SLOT, mask=bad)


@kernel
def or_positive_decay_bit(flags, top):
    """OR the positive-decay bit into the flag when `top` (the largest log-decay a kernel read) is > 0."""
    tl.atomic_or(flags, (top > 0).to(tl.int32) << _DECAY_BIT, mask=top > 0)

"""Gated Slot Attention (GSA): two gated chunk passes with a softmax over M slots between them.

    pass 1, keys -> slots:   Hk_t = Hk_{t-1} diag(exp g_t) + k_t s_t^T     [K, M], gate on the slot (value) side
                             p_t  = softmax(scale * Hk_t^T q_t)              over the M slots, fp32
    pass 2, slots -> values: Hv_t = diag(exp g_t) Hv_{t-1} + s_t v_t^T     [M, V], gate on the slot (key) side
                             o_t  = Hv_t^T p_t

Pass 1 is `chunk_pass.value_side_*`, pass 2 the GLA pass `chunk_pass.key_side_*` with the slots as keys; both
share one cumulative decay. Reference: `fla_lab.reference.recurrent_gsa`. flash-linear-attention 0.6.0's
`chunk_gsa` signature, plus `bug=`; `bug="unmasked_padding"` turns on upstream #77's padded rows in pass 1's dv
kernel: it passes `chunk_stages.later_rows_exponent_unmasked` into the EXPONENT slot of `slot_rows_kernel`
(`cols_from_later_subchunks`), where `later_rows_exponent` ships (fixed upstream in 737550ff).
"""
from __future__ import annotations

import torch
import triton.language as tl

from fla_lab.bugs import check_bug
from fla_lab.ops import contract
from fla_lab.ops.common import chunk_pass as cp
from fla_lab.ops.common import chunk_stages as st
from fla_lab.ops.common.launch import check_chunk_size, resolve
from fla_lab.ops.common.utils import (as_contiguous, cast_grad, custom_bwd, custom_fwd, grid_size, kernel, next_pow2,
                                      slot_helper)

ROWS = 16  # rows of [B * T * H, M] per softmax program


@kernel
def slot_softmax_fwd_kernel(x, p, N, M: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr):
    """p = softmax(x) over the M slots of each row, computed in fp32, stored in p's dtype."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_m = tl.arange(0, BM)
    m = (o_r < N)[:, None] & (o_m < M)[None, :]
    b_x = tl.load(x + o_r[:, None] * M + o_m[None, :], mask=m, other=float("-inf")).to(tl.float32)
    b_x = tl.where(m, b_x - tl.max(b_x, axis=1)[:, None], float("-inf"))  # max first: exp(x - max) <= 1
    b_e = tl.where(m, tl.exp(b_x), 0)
    b_p = b_e / tl.maximum(tl.sum(b_e, axis=1), 1e-30)[:, None]  # padded rows: 0 / 1e-30, not 0 / 0
    tl.store(p + o_r[:, None] * M + o_m[None, :], b_p.to(p.dtype.element_ty), mask=m)


@kernel
def slot_softmax_bwd_kernel(x, dp, dx, N, M: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr):
    """dx = p * (dp - sum(p * dp)), with p recomputed in fp32 from the saved scores x."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_m = tl.arange(0, BM)
    m = (o_r < N)[:, None] & (o_m < M)[None, :]
    p_rm = o_r[:, None] * M + o_m[None, :]
    b_x = tl.load(x + p_rm, mask=m, other=float("-inf")).to(tl.float32)
    b_x = tl.where(m, b_x - tl.max(b_x, axis=1)[:, None], float("-inf"))
    b_e = tl.where(m, tl.exp(b_x), 0)
    b_p = b_e / tl.maximum(tl.sum(b_e, axis=1), 1e-30)[:, None]
    b_dp = tl.load(dp + p_rm, mask=m, other=0).to(tl.float32)
    tl.store(dx + p_rm, b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None]), mask=m)


def _softmax_launch(x):
    N, M = x.numel() // x.shape[-1], x.shape[-1]
    return (grid_size(N, ROWS),), dict(N=N, M=M, BM=next_pow2(M), BR=ROWS)


def slot_softmax(x, dtype):
    p = torch.empty(x.shape, dtype=dtype, device=x.device)
    grid, kw = _softmax_launch(x)
    slot_softmax_fwd_kernel[grid](x, p, **kw)
    return p


def slot_softmax_backward(x, dp, out=None):
    """`out=dp` computes in place (each row is read and written by one program)."""
    dx = torch.empty(x.shape, dtype=torch.float32, device=x.device) if out is None else out
    grid, kw = _softmax_launch(x)
    slot_softmax_bwd_kernel[grid](x, dp, dx, **kw)
    return dx


class ChunkGSAFunction(torch.autograd.Function):
    """Saves the inputs, the pre-softmax slot scores (fp32), the slot weights and pass 2's gated score matrix
    `[B, T, H, BT]` fp32 (the op's most expensive kernel; with dq, dk, dv stored in bf16 by their kernels, keeping it
    took forward+backward from 7.02 to 6.28 ms on an H200, peak 1346 -> 1474 MiB); the cumulative decay, the states
    and pass 1's plain scores are recomputed in the backward (upstream's checkpoint_level=2 recomputes all of them),
    which keeps the peak memory of a training step below upstream's (1856 MiB)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, s, g, scale, hk0, hv0, output_final_state, chunk_size, launch, exponent):
        q, k, v, s, g, hk0, hv0 = as_contiguous(q, k, v, s, g, hk0, hv0)
        gi = cp.chunk_cumsum(g, chunk_size)
        scores, hkt, _, _ = cp.value_side_forward(q, k, s, gi, scale, hk0, output_final_state, chunk_size, launch)
        p = slot_softmax(scores, s.dtype)  # pass 2 reads the slot weights in the input dtype, like its keys
        o, hvt, _, A = cp.key_side_forward(p, s, v, gi, None, 1.0, hv0, output_final_state, chunk_size, launch,
                                           v.dtype)
        ctx.save_for_backward(q, k, v, s, g, hk0, hv0, hkt, hvt, scores, p, A)
        ctx.scale, ctx.chunk_size, ctx.launch, ctx.exponent = scale, chunk_size, launch, exponent
        return o, hkt, hvt

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dhkt, dhvt):
        q, k, v, s, g, hk0, hv0, hkt, hvt, scores, p, A = ctx.saved_tensors
        do, dhkt, dhvt = as_contiguous(do, dhkt, dhvt)
        BT, launch = ctx.chunk_size, ctx.launch
        gi = cp.chunk_cumsum(g, BT)
        # pass 2's dg leaves out its slot term: s * (ds of both passes) enters once, in pass 1's dg
        # dv in v's dtype from its kernel; dp, ds, dg stay fp32 for the softmax backward and pass 1's sums
        dp, ds, dv, dg, _, dhv0 = cp.key_side_backward(p, s, v, gi, None, 1.0, hv0, hvt, None, A, do, dhvt, BT,
                                                       launch, torch.float32, key_term_in_dg=False,
                                                       grad_dtype=v.dtype)
        dhv0 = cast_grad(dhv0, hv0)  # drop the fp32 copy before the second pass
        dscores = slot_softmax_backward(scores, dp, out=dp)
        dq, dk, ds, dg, dhk0 = cp.value_side_backward(q, k, s, gi, ctx.scale, hk0, hkt, None, None, scores, dscores,
                                                      dhkt, BT, launch, ctx.exponent, dv_add=ds, dg_add=dg,
                                                      qk_dtype=q.dtype if q.dtype == k.dtype else torch.float32)
        return (cast_grad(dq, q), cast_grad(dk, k), dv, cast_grad(ds, s), cast_grad(dg, g), None, cast_grad(dhk0, hk0),
                dhv0, None, None, None, None)


def additive_gates(s):
    """Without a forget gate GSA is vanilla ABC: slot writes normalised by a running logsumexp over time, and the
    matching log-decay `z_{t-1} - z_t` (as upstream's `fused_additive_gate`; torch ops, differentiable)."""
    z = s.float().logcumsumexp(1)
    g = torch.cat((z[:, :1], z[:, :-1]), 1) - z
    return (s.float() - z).exp().to(s.dtype), g


def padded_rows_exponent(bug=None, helper=None):
    """The EXPONENT helper of pass 1's dv kernel (`utils.slot_helper`): the historical one under
    `bug="unmasked_padding"`, else `helper` or the shipped `chunk_stages.later_rows_exponent`."""
    return slot_helper("chunk_gsa", "EXPONENT", bug == "unmasked_padding", st.later_rows_exponent_unmasked,
                       st.later_rows_exponent, helper)


def chunk_gsa(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
              bug=None, launch=None, later_rows_exponent=None, **kwargs):
    """Chunked Gated Slot Attention, forward and backward in Triton.

    q, k `[B, T, H, K]`, v `[B, T, H, V]`, s (slot writes) and g (natural-log forget gate <= 0) `[B, T, H, M]`;
    `g=None` is vanilla ABC. `initial_state` is the pair `(Hk0 [B, H, K, M], Hv0 [B, H, M, V])`. Returns
    `(o [B, T, H, V], (HkT, HvT) in fp32 or None)`. `chunk_size` a power of two >= 16; `launch` a
    `fla_lab.ops.ChunkLaunch`. `bug="unmasked_padding"`: upstream #77's NaN gradients of s and g when the last
    chunk is partial and the slot decay is strong. `later_rows_exponent`: a `@triton.jit` helper for the EXPONENT
    slot of pass 1's dv kernel instead of `chunk_stages.later_rows_exponent` (notebook 03b's exercise).
    """
    check_bug(bug, "chunk_gsa")
    contract.check_gsa_inputs("chunk_gsa", q, k, v, s, g, initial_state=initial_state, kwargs=kwargs)
    if g is None:
        s, g = additive_gates(s)
    hk0, hv0 = initial_state if initial_state is not None else (None, None)
    contract.check_kernel_device("chunk_gsa", dict(q=q, k=k, v=v, s=s, g=g, hk0=hk0, hv0=hv0))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, hkt, hvt = ChunkGSAFunction.apply(q, k, v, s, g, scale, hk0, hv0, output_final_state,
                                         check_chunk_size(chunk_size, "chunk_gsa"), resolve(launch),
                                         padded_rows_exponent(bug, later_rows_exponent))
    return o, ((hkt, hvt) if output_final_state else None)

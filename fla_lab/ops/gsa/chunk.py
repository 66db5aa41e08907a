"""Gated Slot Attention (GSA): two gated chunk passes with a softmax over M slots between them.

    pass 1, keys -> slots:   Hk_t = Hk_{t-1} diag(exp g_t) + k_t s_t^T     [K, M], gate on the slot (value) side
                             p_t  = softmax(scale * Hk_t^T q_t)              over the M slots, fp32
    pass 2, slots -> values: Hv_t = diag(exp g_t) Hv_{t-1} + s_t v_t^T     [M, V], gate on the slot (key) side
                             o_t  = Hv_t^T p_t

Pass 1 is the value-side pass in this file (`slot_pass_fwd`, `slot_pass_bwd`, with `slot_rows_kernel`), pass 2 the
GLA pass (`fla_lab/ops/gla/chunk.py`) with the slots as keys; both share one cumulative decay and the stages in
`fla_lab/ops/common/chunk.py`. Reference: `fla_lab.spec.reference.recurrent_gsa`. flash-linear-attention 0.6.0's
`chunk_gsa` signature, plus `bug=`; `bug="unmasked_padding"` turns on upstream #77's padded rows in pass 1's dv
kernel: it passes `later_rows_exponent_unmasked` (`fla_lab/ops/common/chunk.py`) into the EXPONENT slot of
`slot_rows_kernel` (`cols_from_later_subchunks`), where `later_rows_exponent` ships (fixed upstream in 737550ff).
"""
from __future__ import annotations

import torch
import triton.language as tl

from fla_lab.ops import contract
from fla_lab.ops.common.chunk import (BC, channel_block, chunk_tables, chunks, cols_from_later_subchunks, chunk_cumsum,
                                      decay_grad,
                                      diagonal_tile, dot_of, empty_f32, forward_states, later_rows_exponent,
                                      later_rows_exponent_unmasked, plain_rows, plain_scores,
                                      rows_from_earlier_subchunks, state_adjoints, subchunk, tile_width)
from fla_lab.ops.common.launch import check_chunk_size, resolve
from fla_lab.ops.common.switches import Switch, check_switch
from fla_lab.ops.common.utils import (Slot, as_contiguous, batch_head, cast_grad, chunk_of_sequence, custom_bwd,
                                      custom_fwd, grid_size, kernel, mma_split, next_pow2, packed_switch)
from fla_lab.ops.gla.chunk import chunk_gla_bwd, chunk_gla_fwd, gated_scores
from fla_lab.ops.common.conventions import packed_batch

# ----------------------------------------------------------------------------------------------------------
# Pass 1: the value-side pass (keys -> slots)


@packed_switch
@kernel
def slot_rows_kernel(x, y, gi, h, A, out, scale, cu_seqlens, chunk_indices, T, NT, H: tl.constexpr, K: tl.constexpr,
                     V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     DOT: tl.constexpr, SPLIT_STATES: tl.constexpr, BACKWARD: tl.constexpr, ACC: tl.constexpr,
                     EXPONENT: tl.constexpr = later_rows_exponent, VARLEN: tl.constexpr = False):
    """Value side, one sub-chunk and value block per program; the decay stays on the value channel.

    - forward, the pass output (x = q, y = v, h = h_n):
      `out_t = scale * ((x_t @ h) * exp(gi_t) + sum_{s <= t} A[t, s] y_s exp(gi_t - gi_s))`;
    - BACKWARD, dv (x = k, y = do, h = dh_{n+1}; upstream's intra dv kernel, where the padded-row bug lived):
      `out_s = scale * sum_{t >= s} A[t, s] y_t exp(gi_t - gi_s) + (x_s @ h) * exp(gi_last - gi_s)`.
    ACC adds the result to what `out` holds (GSA's slots get gradients from both passes). EXPONENT: the helper
    `cols_from_later_subchunks` calls for the later rows' exponent (`later_rows_exponent` ships).
    """
    i_v, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    NC: tl.constexpr = BT // BC
    bos, T, i_t, boc = chunk_of_sequence(i_tc // NC, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    i_t, i_i, t_first, i_start, o_c, o_i, m_i = subchunk(i_t * NC + i_tc % NC, T, BT, BC)
    if i_start >= T:
        return
    o_v, m_v, m_iv, p_iv = channel_block(i_v, o_i, m_i, H, V, BV)
    bos = bos * H + i_h
    x, y, gi, A = x + bos * K, y + bos * V, gi + bos * V, A + bos * BT
    h += ((boc + i_t) * H + i_h) * K * V
    b_g = tl.load(gi + p_iv, mask=m_iv, other=0)
    b_xh = tl.zeros([BC, BV], dtype=tl.float32)  # the state path (split: both results feed the decay gradient)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_x = tl.load(x + o_i[:, None] * H * K + o_k[None, :], mask=m_i[:, None] & m_k[None, :], other=0)
        b_h = tl.load(h + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0)
        b_xh += mma_split(b_x.to(tl.float32), b_h, DOT, SPLIT_STATES)
    if BACKWARD:
        b_glast = tl.load(gi + (tl.minimum(t_first + BT, T) - 1) * H * V + o_v, mask=m_v, other=0)
        b_out = b_xh * tl.exp(tl.where(m_iv, b_glast[None, :] - b_g, 0))  # safeguard: gsa_dv_state_decay_to_chunk_end
        b_in = cols_from_later_subchunks(A, y, gi, b_g, i_start, t_first, i_i, T, o_c, o_v, m_v, m_i, H * V,
                                         H * BT, BC, BV, NC, DOT, False, EXPONENT)
        b_yi = tl.load(y + p_iv, mask=m_iv, other=0).to(tl.float32)
        b_Aii = tl.load(A + o_i[:, None] * H * BT + (i_i * BC + o_c)[None, :], mask=m_i[:, None], other=0)
        b_w = diagonal_tile(b_g, b_g, b_g, o_c, m_i, False)
        b_in += tl.sum(b_w * b_Aii[:, :, None] * b_yi[:, None, :], axis=0)
        b_out += scale * b_in
    else:
        b_out = b_xh * tl.exp(b_g)  # g <= 0, and 0 on rows past T
        b_out += rows_from_earlier_subchunks(A, y, gi, b_g, i_start, t_first, i_i, o_c, o_v, m_v, m_i, H * V,
                                             H * BT, BC, BV, DOT, False)
        for j in range(0, BC):  # the diagonal block, one key row at a time, not a [BC, BC, BV] tile reduced over its
            m_j = m_v & (i_start + j + 0 * o_v < T)  # middle axis (docs/performance.md, 'chunk_gsa: diagonal loop')
            b_yj = tl.load(y + (i_start + j) * H * V + o_v, mask=m_j, other=0).to(tl.float32)
            b_gj = tl.load(gi + (i_start + j) * H * V + o_v, mask=m_j, other=0)
            b_aj = tl.load(A + o_i * H * BT + i_i * BC + j, mask=m_i, other=0)  # column j of the block
            causal = ((o_c >= j) & m_i)[:, None]
            b_e = tl.exp(tl.where(causal, b_g - b_gj[None, :], 0))  # safeguard: gsa_slot_diagonal_decay
            b_out += tl.where(causal, b_aj[:, None] * b_yj[None, :] * b_e, 0)
        b_out *= scale
    if ACC:
        b_out += tl.load(out + bos * V + p_iv, mask=m_iv, other=0).to(tl.float32)
    tl.store(out + bos * V + p_iv, b_out.to(out.dtype.element_ty), mask=m_iv)


def slot_pass_fwd(q, k, v, gi, scale, h0, output_final_state, BT, launch, seqs=None):
    """Pass 1 (keys -> slots, the decay on the slot channel). Returns o (fp32: it feeds a softmax and the decay
    gradient), ht, h, A. `seqs`: a packed batch's tables (`conventions.Packed`), else dense."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    h, ht = forward_states(k, v, gi, h0, output_final_state, BT, launch, gate_v=True, seqs=seqs)
    A = plain_scores(q, k, 1.0, BT, launch, seqs)
    o = empty_f32(q, B, T, H, V)  # safeguard: gsa_slot_scores_fp32
    NT, BV = chunks(T, BT, seqs), min(tile_width(V), launch.slots_BV)
    slot_rows_kernel[(grid_size(V, BV), NT * (BT // BC), B * H)](
        q, v, gi, h, A, o, scale, *chunk_tables(seqs), T, NT, H=H, K=K, V=V, BT=BT, BC=BC, BK=tile_width(K), BV=BV,
        DOT=dot_of(launch, q), SPLIT_STATES=launch.precision.split_states, BACKWARD=False, ACC=False,
        num_warps=launch.slots_warps)
    return o, ht, h, A


def slot_pass_bwd(q, k, v, gi, scale, h0, ht, h, A, o, do, dht, BT, launch,
                  exponent=later_rows_exponent, dv_add=None, dg_add=None, qk_dtype=torch.float32, seqs=None):
    """Returns dq, dk (in qk_dtype, written so by their kernel), dv, dg (fp32) and dh0; `o` is the pass's fp32
    output, `do` its cotangent. `h=None`, `A=None`: recompute them here. `exponent`: the dv kernel's EXPONENT helper
    (`later_rows_exponent` ships). `dv_add`, `dg_add` (GSA's other pass) are added in place."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if h is None:
        h, _ = forward_states(k, v, gi, h0, False, BT, launch, gate_v=True, seqs=seqs)
    if A is None:
        A = plain_scores(q, k, 1.0, BT, launch, seqs)
    dh, dh0, bnd = state_adjoints(q, do, gi, h, ht, dht, h0 is not None, scale, BT, launch, gate_v=True, seqs=seqs)
    dA = gated_scores(do, v, gi, None, scale, BT, launch, seqs=seqs)
    dv = dv_add if dv_add is not None else empty_f32(q, B, T, H, V)
    NT, BV = chunks(T, BT, seqs), min(tile_width(V), launch.slots_BV)
    slot_rows_kernel[(grid_size(V, BV), NT * (BT // BC), B * H)](
        k, do, gi, dh, A, dv, scale, *chunk_tables(seqs), T, NT, H=H, K=K, V=V, BT=BT, BC=BC, BK=tile_width(K), BV=BV,
        DOT=dot_of(launch, q), SPLIT_STATES=launch.precision.split_states, BACKWARD=True, ACC=dv_add is not None,
        EXPONENT=exponent,
        num_warps=launch.slots_warps)
    del A
    dq = plain_rows(dA, k, do, gi, h, 1.0, scale, BT, launch, transpose_A=False, to_end=False, transpose_h=True,
                    dtype=qk_dtype, seqs=seqs)
    del h
    dk = plain_rows(dA, q, v, gi, dh, 1.0, 1.0, BT, launch, transpose_A=True, to_end=True, transpose_h=True,
                    dtype=qk_dtype, seqs=seqs)
    del dA, dh
    dg, _, _, _ = decay_grad(o, do, v, dv, bnd, BT, launch, torch.float32, add=dg_add,
                             seqs=seqs)  # dv, dg: fp32 sums
    return dq, dk, dv, dg, dh0


# ----------------------------------------------------------------------------------------------------------
# The slot softmax between the passes


@kernel
def slot_softmax_fwd_kernel(x, p, N, M: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr):
    """p = softmax(x) over the M slots of each row, computed in fp32, stored in p's dtype."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_m = tl.arange(0, BM)
    m = (o_r < N)[:, None] & (o_m < M)[None, :]
    # safeguard: gsa_softmax_pad_neg_inf
    b_x = tl.load(x + o_r[:, None] * M + o_m[None, :], mask=m, other=float("-inf")).to(tl.float32)
    # safeguard: gsa_softmax_max_first
    b_x = tl.where(m, b_x - tl.max(b_x, axis=1)[:, None], float("-inf"))  # max first: exp(x - max) <= 1
    b_e = tl.where(m, tl.exp(b_x), 0)
    # mutation: gsa_softmax_wrong_axis
    b_p = b_e / tl.maximum(tl.sum(b_e, axis=1), 1e-30)[:, None]  # padded rows: 0 / 1e-30, not 0 / 0
    tl.store(p + o_r[:, None] * M + o_m[None, :], b_p.to(p.dtype.element_ty), mask=m)


@kernel
def slot_softmax_bwd_kernel(x, dp, dx, N, M: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr):
    """dx = p * (dp - sum(p * dp)), with p recomputed in fp32 from the saved scores x."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_m = tl.arange(0, BM)
    m = (o_r < N)[:, None] & (o_m < M)[None, :]
    p_rm = o_r[:, None] * M + o_m[None, :]
    b_x = tl.load(x + p_rm, mask=m, other=float("-inf")).to(tl.float32)  # safeguard: gsa_softmax_bwd_pad_neg_inf
    b_x = tl.where(m, b_x - tl.max(b_x, axis=1)[:, None], float("-inf"))  # safeguard: gsa_softmax_bwd_max_first
    b_e = tl.where(m, tl.exp(b_x), 0)
    b_p = b_e / tl.maximum(tl.sum(b_e, axis=1), 1e-30)[:, None]
    b_dp = tl.load(dp + p_rm, mask=m, other=0).to(tl.float32)
    tl.store(dx + p_rm, b_p * (b_dp - tl.sum(b_p * b_dp, axis=1)[:, None]), mask=m)


def _softmax_launch(x, rows: int):
    """`rows` of [B * T * H, M] per program (the launch's `softmax_rows`)."""
    N, M = x.numel() // x.shape[-1], x.shape[-1]
    return (grid_size(N, rows),), dict(N=N, M=M, BM=next_pow2(M), BR=rows)


def slot_softmax(x, dtype, rows: int):
    p = torch.empty(x.shape, dtype=dtype, device=x.device)
    grid, kw = _softmax_launch(x, rows)
    slot_softmax_fwd_kernel[grid](x, p, **kw)
    return p


def slot_softmax_backward(x, dp, rows: int, out=None):
    """`out=dp` computes in place (each row is read and written by one program)."""
    dx = torch.empty(x.shape, dtype=torch.float32, device=x.device) if out is None else out
    grid, kw = _softmax_launch(x, rows)
    slot_softmax_bwd_kernel[grid](x, dp, dx, **kw)
    return dx



# ----------------------------------------------------------------------------------------------------------
# The op


class ChunkGSAFunction(torch.autograd.Function):
    """Saves the inputs, the pre-softmax slot scores (fp32), the slot weights and pass 2's gated score matrix
    `[B, T, H, BT]` fp32 (the op's most expensive kernel: keeping it trades peak memory for time, see
    docs/performance.md, 'chunk_gsa: saved gated scores'); the cumulative decay, the states and pass 1's plain
    scores are recomputed in the backward (upstream's checkpoint_level=2 recomputes all of them), which keeps the
    peak memory of a training step below upstream's."""

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, s, g, scale, hk0, hv0, output_final_state, chunk_size, launch, exponent, seqs=None):
        q, k, v, s, g, hk0, hv0 = as_contiguous(q, k, v, s, g, hk0, hv0)
        gi = chunk_cumsum(g, chunk_size, seqs=seqs)
        scores, hkt, _, _ = slot_pass_fwd(q, k, s, gi, scale, hk0, output_final_state, chunk_size, launch, seqs)
        # pass 2 reads the slot weights in the input dtype, like its keys
        p = slot_softmax(scores, s.dtype, launch.softmax_rows)
        o, hvt, _, A = chunk_gla_fwd(p, s, v, gi, None, 1.0, hv0, output_final_state, chunk_size, launch,
                                     v.dtype, seqs=seqs)
        ctx.save_for_backward(q, k, v, s, g, hk0, hv0, hkt, hvt, scores, p, A)
        ctx.scale, ctx.chunk_size, ctx.launch, ctx.exponent, ctx.seqs = scale, chunk_size, launch, exponent, seqs
        return o, hkt, hvt

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dhkt, dhvt):
        q, k, v, s, g, hk0, hv0, hkt, hvt, scores, p, A = ctx.saved_tensors
        do, dhkt, dhvt = as_contiguous(do, dhkt, dhvt)
        BT, launch, seqs = ctx.chunk_size, ctx.launch, ctx.seqs
        gi = chunk_cumsum(g, BT, seqs=seqs)
        # pass 2's dg leaves out its slot term: s * (ds of both passes) enters once, in pass 1's dg
        # dv in v's dtype from its kernel; dp, ds, dg stay fp32 for the softmax backward and pass 1's sums
        dp, ds, dv, dg, _, dhv0 = chunk_gla_bwd(p, s, v, gi, None, 1.0, hv0, hvt, None, A, do, dhvt, BT,
                                                launch, torch.float32, key_term_in_dg=False, grad_dtype=v.dtype,
                                                seqs=seqs)
        dhv0 = cast_grad(dhv0, hv0)  # drop the fp32 copy before the second pass
        dscores = slot_softmax_backward(scores, dp, launch.softmax_rows, out=dp)
        dq, dk, ds, dg, dhk0 = slot_pass_bwd(q, k, s, gi, ctx.scale, hk0, hkt, None, None, scores, dscores,
                                             dhkt, BT, launch, ctx.exponent, dv_add=ds, dg_add=dg,
                                             qk_dtype=q.dtype if q.dtype == k.dtype else torch.float32, seqs=seqs)
        return (cast_grad(dq, q), cast_grad(dk, k), dv, cast_grad(ds, s), cast_grad(dg, g), None, cast_grad(dhk0, hk0),
                dhv0, None, None, None, None, None)


def additive_gates(s, seqs=None):
    """Without a forget gate GSA is vanilla ABC: slot writes normalised by a running logsumexp over time, and the
    matching log-decay `z_{t-1} - z_t` (as upstream's `fused_additive_gate`; torch ops, differentiable).
    `seqs` (`conventions.Packed`): each packed sequence's logsumexp runs over its own rows only."""
    if seqs is not None:
        parts = [additive_gates(s[:, bos:eos]) for bos, eos in seqs.bounds if eos > bos]
        return torch.cat([w for w, _ in parts], 1), torch.cat([g for _, g in parts], 1)
    z = s.float().logcumsumexp(1)  # safeguard: abc_gates_logcumsumexp  # safeguard: abc_gates_fp32
    g = torch.cat((z[:, :1], z[:, :-1]), 1) - z
    return (s.float() - z).exp().to(s.dtype), g


def gsa_arguments(op, q, k, v, s, g, scale, initial_state, kwargs, BT, cu_seqlens=None, cu_seqlens_cpu=None):
    """Both GSA ops' checked arguments: `(s, g, hk0, hv0, scale, seqs)`, with ABC's gates for `g=None`, the default
    scale K^-0.5 and a packed batch's tables (`conventions.Packed` in chunks of BT rows, None when dense)."""
    contract.check_gsa_inputs(op, q, k, v, s, g, initial_state=initial_state, kwargs=kwargs,
                              packed=cu_seqlens is not None)
    seqs = None if cu_seqlens is None else packed_batch(op, cu_seqlens, cu_seqlens_cpu, q, initial_state, BT)
    if g is None:
        s, g = additive_gates(s, seqs)
    hk0, hv0 = initial_state if initial_state is not None else (None, None)
    contract.check_kernel_device(op, dict(q=q, k=k, v=v, s=s, g=g, hk0=hk0, hv0=hv0))
    return s, g, hk0, hv0, (q.shape[-1] ** -0.5 if scale is None else scale), seqs


SWITCHES = (Switch("unmasked_padding", "chunk_gsa", 77, located=("chunk_gsa", "slot_rows_kernel", "padded_rows")),)


# chunk_gsa's slot: the EXPONENT of pass 1's dv kernel (`slot_rows_kernel`, `cols_from_later_subchunks`)
EXPONENT_SLOT = Slot("chunk_gsa", "EXPONENT", later_rows_exponent, later_rows_exponent_unmasked, "unmasked_padding")


def chunk_gsa(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False, chunk_size=64, bug=None,
              launch=None, helper=None, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """Chunked Gated Slot Attention, forward and backward in Triton.

    q, k `[B, T, H, K]`, v `[B, T, H, V]`, s (slot writes) and g (natural-log forget gate <= 0) `[B, T, H, M]`;
    `g=None` is vanilla ABC. `initial_state` is the pair `(Hk0 [B, H, K, M], Hv0 [B, H, M, V])`. Returns
    `(o [B, T, H, V], (HkT, HvT) in fp32 or None)`. `chunk_size` a power of two >= 16; `launch` a
    `fla_lab.ops.ChunkLaunch`. `bug="unmasked_padding"`: upstream #77's NaN gradients of s and g when the last
    chunk is partial and the slot decay is strong. `helper`: a `@triton.jit` helper for the EXPONENT slot of pass
    1's dv kernel instead of the shipped `later_rows_exponent` (notebook 03b's exercise; `utils.Slot`).
    `cu_seqlens` (and its host copy `cu_seqlens_cpu`): FLA's packed batches, states `[N, ...]`, one launch per
    kernel for the whole batch (`fla_lab.ops.common.conventions`); each sequence's last chunk is partial unless its
    length is a multiple of chunk_size, which is where #77's padded rows live.
    """
    check_switch(bug, "chunk_gsa", SWITCHES)
    BT = check_chunk_size(chunk_size, "chunk_gsa")
    s, g, hk0, hv0, scale, seqs = gsa_arguments("chunk_gsa", q, k, v, s, g, scale, initial_state, kwargs, BT,
                                                cu_seqlens, cu_seqlens_cpu)
    exponent = EXPONENT_SLOT.pick(bug, helper)
    o, hkt, hvt = ChunkGSAFunction.apply(q, k, v, s, g, scale, hk0, hv0, output_final_state, BT,
                                         resolve(launch, "chunk", q), exponent, seqs)
    return o, ((hkt, hvt) if output_final_state else None)

"""Chunked GLA: the key-side gated chunk pass, read top to bottom (kernels, their launchers, the autograd
function, the op). `S_t = diag(exp g_t) S_{t-1} + k_t v_t^T`, `o_t = scale * S_t^T q_t`.

The same pass runs RWKV6 (`fla_lab/ops/rwkv6/chunk.py`: `RWKV6=True`, the bonus `u` and exclusive queries) and
GSA pass 2 (`fla_lab/ops/gsa/chunk.py`: the slots as keys). The stages both sides of a chunk pass share (cumulative
decay, states, plain scores, state adjoints, plain rows such as dv, decay gradient) and the algorithm's notes are in
`fla_lab/ops/common/chunk.py`; this file holds the key side's own three kernels (`gated_scores_kernel` also gives
GSA pass 1's score gradient dA):

| kernel | computes |
|---|---|
| `gated_scores_kernel` | the intra-chunk scores A (RWKV6's reference row, upstream #77, is its REFERENCE_ROW slot) |
| `chunk_fwd_o_kernel` | o = (q * exp(gq)) @ h + A @ v |
| `chunk_bwd_dqk_kernel` | dq, dk through the scores and the states |

Reference: `fla_lab.spec.reference.recurrent_gla`. Same signature as flash-linear-attention 0.6.0's `chunk_gla`.
"""
from __future__ import annotations

import torch
import triton.language as tl

from fla_lab.ops import contract
from fla_lab.ops.common.chunk import (BC, REFERENCE_ROW_SLOT, channel_block, check_flags, check_slot, chunk_cumsum,
                                      chunk_tables, chunks, cols_from_later_subchunks, decay_grad, diagonal_tile,
                                      dot_of, dot_operand_dtype, empty_f32, forward_states, later_rows_exponent,
                                      load_bonus, load_query_decay, load_reference_decay, plain_rows, plain_scores,
                                      reference_row, rows_from_earlier_subchunks, state_adjoints, subchunk,
                                      tile_width)
from fla_lab.ops.common.launch import check_chunk_size, resolve
from fla_lab.ops.common.utils import (as_contiguous, batch_head, cast_grad, chunk_of_sequence, custom_bwd, custom_fwd,
                                      grid_size, kernel, mma, mma_split, packed_switch)
from fla_lab.ops.common.value_flags import nonfinite_probe, or_nonfinite_bit
from fla_lab.ops.common.conventions import key_major, packed_batch, v_first


def score_pairs(BT: int) -> int:
    """Programs of `gated_scores_kernel` per chunk: the (i, j <= i) pairs of its BT / BC sub-chunks."""
    return (BT // BC) * (BT // BC + 1) // 2


# ----------------------------------------------------------------------------------------------------------
# Kernels


@kernel
def lower_pair(c, NC: tl.constexpr):
    """The c-th pair (i, j <= i) of an NC x NC lower triangle, row by row: (0, 0), (1, 0), (1, 1), (2, 0), ..."""
    i = (c * 0).to(tl.int32)
    for n in tl.static_range(1, NC):
        i += (c >= n * (n + 1) // 2).to(tl.int32)
    return i, c - i * (i + 1) // 2


@kernel
def folded_diagonal_block(q, k, gi, u, A, scale, T, i_h, i_start, t_first, col0, o_c, o_i, m_i, H: tl.constexpr,
                          K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                          RWKV6: tl.constexpr):
    """The [BC, BC] diagonal block of the query sub-chunk starting at i_start (columns col0..), one exp per strictly
    causal pair: a pair (t, s < t) is `sum_i q_t[i] k_s[i] exp(gq_t[i] - gi_s[i])`, the pair (t, t) carries no
    decay (GLA: exp(0) = 1; RWKV6: its bonus u instead), pairs s > t are 0.

    Folded: step p puts key row p (query rows p+1..BC-1) and key row BC-1-p (query rows BC-p..BC-1) in one [BC, BK]
    tile, BC/2 steps for the BC (BC - 1)/2 causal pairs. With the pair grid of `gated_scores_kernel`, chosen over one
    program per sub-chunk and one key row per step: docs/performance.md, 'chunk scores: folded diagonal'."""
    HK: tl.constexpr = H * K
    p_row = A + o_i * H * BT + col0
    b_d = tl.zeros([BC], dtype=tl.float32)  # the pairs (t, t)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_ik = m_i[:, None] & m_k[None, :]
        b_qk = tl.load(q + o_i[:, None] * HK + o_k[None, :], mask=m_ik, other=0).to(tl.float32)
        b_qk *= tl.load(k + o_i[:, None] * HK + o_k[None, :], mask=m_ik, other=0).to(tl.float32)
        if RWKV6:
            b_qk *= load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6)[None, :]
        b_d += tl.sum(b_qk, axis=1)
    tl.store(p_row + o_c, scale * b_d, mask=m_i)
    tl.store(p_row[:, None] + o_c[None, :], tl.zeros([BC, BC], dtype=tl.float32),
             mask=m_i[:, None] & (o_c[:, None] < o_c[None, :]))  # s > t
    for p in range(0, BC // 2):  # s < t, two key rows per step
        first = o_c < BC - 1 - p
        s = tl.where(first, p, BC - 1 - p)
        t = tl.where(first, p + 1 + o_c, o_c + 1)
        r_t, r_s = i_start + t, i_start + s
        valid = (t < BC) & (r_t < T)  # then r_s < r_t < T; slot BC - 1 of the tile is empty
        b_a = tl.zeros([BC], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m = valid[:, None] & (o_k < K)[None, :]
            b_q = tl.load(q + r_t[:, None] * HK + o_k[None, :], mask=m, other=0).to(tl.float32)
            b_gq = load_query_decay(gi, r_t[:, None], o_k[None, :], m, t_first, HK, RWKV6)
            b_k = tl.load(k + r_s[:, None] * HK + o_k[None, :], mask=m, other=0).to(tl.float32)
            b_gk = tl.load(gi + r_s[:, None] * HK + o_k[None, :], mask=m, other=0)
            # safeguard: folded_diagonal_decay
            b_a += tl.sum(b_q * b_k * tl.exp(tl.where(m, b_gq - b_gk, 0)), axis=1)  # masked before exp
        tl.store(A + r_t * H * BT + col0 + s, scale * b_a, mask=valid)


@packed_switch
@kernel
def gated_scores_kernel(q, k, gi, u, A, scale, cu_seqlens, chunk_indices, T, H: tl.constexpr, K: tl.constexpr,
                        BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr, RWKV6: tl.constexpr,
                        REFERENCE_ROW: tl.constexpr = reference_row, VARLEN: tl.constexpr = False):
    """`A[t, s] = scale * sum_i q_t[i] k_s[i] exp(gq_t[i] - gi_s[i])` (s <= t): the key side's scores, the value
    side's dA (q = do, k = v). One program per (query sub-chunk i, key sub-chunk j <= i) pair of a chunk,
    NC (NC + 1) / 2 of them: an earlier key sub-chunk is one dot around the reference row, the diagonal pair is
    `folded_diagonal_block` and also zeroes the blocks right of it.

    RWKV6's bonus sits on the diagonal, `A[t, t] = q_t . (u * k_t)`, so `A @ v` and `A^T @ do` include it.
    """
    i_p, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    NC: tl.constexpr = BT // BC
    NP: tl.constexpr = NC * (NC + 1) // 2
    i_i, i_j = lower_pair(i_p % NP, NC)
    bos, T, i_t, _ = chunk_of_sequence(i_p // NP, i_b, T, 0, cu_seqlens, chunk_indices, VARLEN)
    t_first = i_t * BT
    i_start = t_first + i_i * BC
    if i_start >= T:
        return
    o_c = tl.arange(0, BC)
    o_i = i_start + o_c
    m_i = o_i < T
    HK: tl.constexpr = H * K
    bos = bos * H + i_h
    q, k, gi, A = q + bos * K, k + bos * K, gi + bos * K, A + bos * BT
    p_A = A + o_i[:, None] * H * BT + o_c[None, :]
    if i_j < i_i:  # an earlier key sub-chunk: one dot, the decay split around the reference row gn
        o_j = t_first + i_j * BC + o_c  # all rows < i_start < T
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            m_ik = m_i[:, None] & m_k[None, :]
            b_q = tl.load(q + o_i[:, None] * HK + o_k[None, :], mask=m_ik, other=0).to(tl.float32)
            b_gq = load_query_decay(gi, o_i[:, None], o_k[None, :], m_ik, t_first, HK, RWKV6)
            b_gn = load_reference_decay(gi, i_start, o_k, m_k, HK, RWKV6, REFERENCE_ROW)
            b_kt = tl.load(k + o_j[None, :] * HK + o_k[:, None], mask=m_k[:, None], other=0).to(tl.float32)
            b_gkt = tl.load(gi + o_j[None, :] * HK + o_k[:, None], mask=m_k[:, None], other=0)
            b_qg = b_q * tl.exp(tl.where(m_ik, b_gq - b_gn[None, :], 0))  # safeguard: gated_scores_query_decay
            b_A += mma(b_qg, b_kt * tl.exp(b_gn[:, None] - b_gkt), DOT)  # safeguard: gated_scores_key_decay
        tl.store(p_A + i_j * BC, scale * b_A, mask=m_i[:, None])
    else:
        folded_diagonal_block(q, k, gi, u, A, scale, T, i_h, i_start, t_first, i_i * BC, o_c, o_i, m_i, H, K, BT,
                              BC, BK, RWKV6)
        for i_z in range(i_i + 1, NC):
            tl.store(p_A + i_z * BC, tl.zeros([BC, BC], dtype=tl.float32), mask=m_i[:, None])


@packed_switch
@kernel
def chunk_fwd_o_kernel(q, v, gi, h, A, o, flags, scale, cu_seqlens, chunk_indices, T, NT, H: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       DOT: tl.constexpr, RWKV6: tl.constexpr, Q_SLOT: tl.constexpr = -1, V_SLOT: tl.constexpr = -1,
                       VARLEN: tl.constexpr = False):
    """Key side: o = scale * ((q * exp(gq)) @ h_n + A @ v), one [BT, BV] tile per program (A holds RWKV6's bonus);
    the value checks of v and (first value tile) of q."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, boc = chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    HK: tl.constexpr = H * K
    t_first = i_t * BT
    o_c = tl.arange(0, BT)
    o_t = t_first + o_c
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < T, o_v < V
    m_tv = m_t[:, None] & m_v[None, :]
    bos = bos * H + i_h
    q, gi = q + bos * K, gi + bos * K
    h += ((boc + i_t) * H + i_h) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_probe = tl.zeros([BT, BK], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        if Q_SLOT >= 0:
            b_probe += nonfinite_probe(b_q)
        b_gq = load_query_decay(gi, o_t[:, None], o_k[None, :], m_tk, t_first, HK, RWKV6)
        b_h = tl.load(h + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0)
        b_o += mma(b_q * tl.exp(b_gq), b_h, DOT)  # gq <= 0 (and 0 on masked rows)
    b_A = tl.load(A + bos * BT + o_t[:, None] * H * BT + o_c[None, :], mask=m_t[:, None], other=0)
    b_v = tl.load(v + bos * V + o_t[:, None] * H * V + o_v[None, :], mask=m_tv, other=0).to(tl.float32)
    if Q_SLOT >= 0:
        if i_v == 0:
            or_nonfinite_bit(flags, tl.sum(b_probe), Q_SLOT)
    if V_SLOT >= 0:
        or_nonfinite_bit(flags, tl.sum(nonfinite_probe(b_v)), V_SLOT)
    b_o += mma(b_A, b_v, DOT)
    # mutation: rwkv6_chunk_o_missing_scale
    tl.store(o + bos * V + o_t[:, None] * H * V + o_v[None, :], (scale * b_o).to(o.dtype.element_ty), mask=m_tv)


@packed_switch
@kernel
def chunk_bwd_dqk_kernel(q, k, v, gi, u, h, dh, dA, do, dq, dk, scale, cu_seqlens, chunk_indices, T, NT,
                         H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr, RWKV6: tl.constexpr,
                         SPLIT_STATES: tl.constexpr, REFERENCE_ROW: tl.constexpr = reference_row,
                         VARLEN: tl.constexpr = False):
    """Key side: dq and dk of one sub-chunk, intra-chunk terms from dA (RWKV6's bonus from its diagonal),
    inter-chunk terms from h and dh."""
    i_k, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    NC: tl.constexpr = BT // BC
    HK: tl.constexpr = H * K
    bos, T, i_t, boc = chunk_of_sequence(i_tc // NC, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    i_t, i_i, t_first, i_start, o_c, o_i, m_i = subchunk(i_t * NC + i_tc % NC, T, BT, BC)
    if i_start >= T:
        return
    o_k, m_k, m_ik, p_ik = channel_block(i_k, o_i, m_i, H, K, BK)
    bos = bos * H + i_h
    q, k, gi, dA = q + bos * K, k + bos * K, gi + bos * K, dA + bos * BT
    b_gq = load_query_decay(gi, o_i[:, None], o_k[None, :], m_ik, t_first, HK, RWKV6)
    b_gk = tl.load(gi + p_ik, mask=m_ik, other=0)
    b_u = load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6)[None, :]
    # dq_t = sum_s dA[t, s] k_s exp(gq_t - gi_s), dk_s = sum_t dA[t, s] q_t exp(gq_t - gi_s): other sub-chunks
    b_dq = rows_from_earlier_subchunks(dA, k, gi, b_gq, i_start, t_first, i_i, o_c, o_k, m_k, m_i, HK, H * BT, BC,
                                       BK, DOT, RWKV6, REFERENCE_ROW)
    b_dk = cols_from_later_subchunks(dA, q, gi, b_gk, i_start, t_first, i_i, T, o_c, o_k, m_k, m_i, HK, H * BT,
                                     BC, BK, NC, DOT, RWKV6, later_rows_exponent)
    # the diagonal block: all (t, s) pairs at once, one [BC, BC, BK] weight tile serves dq and dk
    b_qi = tl.load(q + p_ik, mask=m_ik, other=0).to(tl.float32)
    b_ki = tl.load(k + p_ik, mask=m_ik, other=0).to(tl.float32)
    b_dAii = tl.load(dA + o_i[:, None] * H * BT + (i_i * BC + o_c)[None, :], mask=m_i[:, None], other=0)
    b_w = diagonal_tile(b_gq, b_gk, b_u, o_c, m_i, RWKV6) * b_dAii[:, :, None]
    b_dq += tl.sum(b_w * b_ki[None, :, :], axis=1)
    b_dk += tl.sum(b_w * b_qi[:, None, :], axis=0)

    # inter-chunk: dq += scale * (do @ h_n^T) * exp(gq), dk += (v @ dh_{n+1}^T) * exp(g_last - gi), with the
    # states split in two (see mma_split)
    p_h = ((boc + i_t) * H + i_h) * K * V
    b_dqh = tl.zeros([BC, BK], dtype=tl.float32)
    b_dkh = tl.zeros([BC, BK], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_iv = m_i[:, None] & m_v[None, :]
        p_iv = bos * V + o_i[:, None] * H * V + o_v[None, :]
        p_vk = p_h + o_k[None, :] * V + o_v[:, None]
        m_vk = m_v[:, None] & m_k[None, :]
        b_do = tl.load(do + p_iv, mask=m_iv, other=0).to(tl.float32)
        b_v = tl.load(v + p_iv, mask=m_iv, other=0).to(tl.float32)
        b_dqh += mma_split(b_do, tl.load(h + p_vk, mask=m_vk, other=0), DOT, SPLIT_STATES)
        b_dkh += mma_split(b_v, tl.load(dh + p_vk, mask=m_vk, other=0), DOT, SPLIT_STATES)
    t_last = tl.minimum(t_first + BT, T) - 1
    b_glast = tl.load(gi + t_last * HK + o_k, mask=m_k, other=0)
    b_dq += scale * b_dqh * tl.exp(b_gq)
    b_dk += b_dkh * tl.exp(tl.where(m_ik, b_glast[None, :] - b_gk, 0))  # safeguard: gla_dk_decay_to_chunk_end
    p_out = bos * K + p_ik
    tl.store(dq + p_out, b_dq, mask=m_ik)
    tl.store(dk + p_out, b_dk, mask=m_ik)


# ----------------------------------------------------------------------------------------------------------
# Launchers


def chunk_gla_fwd(q, k, v, gi, u, scale, h0, output_final_state, BT, launch, out_dtype, row=reference_row,
                  checks=None, names=("q", "k", "v"), seqs=None):
    """The forward after the cumulative decay `gi`: the states, the scores, the output. Returns o, ht, h, A.
    `u`: RWKV6's bonus (None for GLA); `row`: the scores' REFERENCE_ROW helper (RWKV6's, see `REFERENCE_ROW_SLOT`);
    `checks` (`contract.KernelChecks`): the value checks of q and v (argument names `names[0]`, `names[2]`) in the
    output kernel; k's is the cumulative decay's (`chunk_cumsum`). `seqs`: a packed batch's tables
    (`conventions.Packed`; every kernel of the pass runs once for the whole batch), else dense.
    h is stored in the dot dtype: the output kernel reads it only as a tensor-core operand, so a 16-bit h changes
    no bit of o and halves its traffic (the backward, which needs it in fp32, recomputes it, as upstream does)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT, nq, nv = chunks(T, BT, seqs), names[0], names[2]
    h, ht = forward_states(k, v, gi, h0, output_final_state, BT, launch, gate_v=False, seqs=seqs,
                           h_dtype=dot_operand_dtype(launch, q))
    A = empty_f32(q, B, T, H, BT)
    gated_scores_kernel[(NT * score_pairs(BT), B * H)](
        q, k, gi, u, A, 1.0, *chunk_tables(seqs), T, H=H, K=K, BT=BT, BC=BC, BK=min(tile_width(K), launch.scores_BK),
        DOT=dot_of(launch, q), RWKV6=u is not None, REFERENCE_ROW=row,
        num_warps=launch.scores_warps)
    o = torch.empty(B, T, H, V, dtype=out_dtype, device=q.device)
    BV = min(tile_width(V), launch.out_BV)
    chunk_fwd_o_kernel[(grid_size(V, BV), NT, B * H)](
        q, v, gi, h, A, o, check_flags(checks), scale, *chunk_tables(seqs), T, NT, H=H, K=K, V=V, BT=BT,
        BK=tile_width(K), BV=BV, DOT=dot_of(launch, q), RWKV6=u is not None, Q_SLOT=check_slot(checks, nq),
        V_SLOT=check_slot(checks, nv), num_warps=launch.out_warps)
    return o, ht, h, A


def chunk_gla_bwd(q, k, v, gi, u, scale, h0, ht, h, A, do, dht, BT, launch, dg_dtype, row=reference_row,
                  key_term_in_dg=True, grad_dtype=torch.float32, seqs=None):
    """Returns dq, dk, dv (in grad_dtype), dg (dg_dtype), du (RWKV6) and dh0, from the forward's scores `A`.
    `h=None`: recompute the states here (each intermediate is dropped after its last use, which bounds the peak
    memory of GSA's backward). `row`: the REFERENCE_ROW helper (see `REFERENCE_ROW_SLOT`).
    `key_term_in_dg=False` leaves `- k * dk` out of dg (GSA adds it once, for the summed slot gradient), and keeps
    dq and dk fp32 whatever grad_dtype (GSA's softmax backward and its other pass take them on)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT, rwkv6 = chunks(T, BT, seqs), u is not None
    if h is None:
        h, _ = forward_states(k, v, gi, h0, False, BT, launch, gate_v=False, seqs=seqs)
    dh, dh0, bnd = state_adjoints(q, do, gi, h, ht, dht, h0 is not None, scale, BT, launch, gate_v=False,
                                  rwkv6=rwkv6, seqs=seqs)
    dA = plain_scores(do, v, scale, BT, launch, seqs)
    dv = plain_rows(A, do, k, gi, dh, scale, 1.0, BT, launch, transpose_A=True, to_end=True, transpose_h=False,
                    dtype=grad_dtype, seqs=seqs)
    del A
    dq, dk = empty_f32(q, B, T, H, K), empty_f32(q, B, T, H, K)
    BKi = min(tile_width(K), launch.dqk_BK)  # the diagonal block is a [BC, BC, BKi] tile: keep it in registers
    chunk_bwd_dqk_kernel[(grid_size(K, BKi), NT * (BT // BC), B * H)](
        q, k, v, gi, u, h, dh, dA, do, dq, dk, scale, *chunk_tables(seqs), T, NT, H=H, K=K, V=V, BT=BT, BC=BC,
        BK=BKi, BV=tile_width(V), DOT=dot_of(launch, q), RWKV6=rwkv6,
        SPLIT_STATES=launch.precision.split_states, REFERENCE_ROW=row,
        num_warps=launch.dqk_warps)
    del h, dh
    if key_term_in_dg:
        dg, du, dq, dk = decay_grad(q, dq, k, dk, bnd, BT, launch, dg_dtype, u=u, dA=dA if rwkv6 else None,
                                    cast_dtype=grad_dtype, seqs=seqs)
    else:
        dg, du, _, _ = decay_grad(q, dq, k, None, bnd, BT, launch, dg_dtype, u=u, dA=dA if rwkv6 else None,
                                  seqs=seqs)
    return dq, dk, dv, dg, du, dh0


def gated_scores(q, k, gi, u, scale, BT, launch, row=reference_row, seqs=None):
    """`gated_scores_kernel` alone: GSA's score gradient (q = do, k = v) and `key_side_scores`."""
    B, T, H, K = q.shape
    A = empty_f32(q, B, T, H, BT)
    gated_scores_kernel[(chunks(T, BT, seqs) * score_pairs(BT), B * H)](
        q, k, gi, u, A, scale, *chunk_tables(seqs), T, H=H, K=K, BT=BT, BC=BC,
        BK=min(tile_width(K), launch.scores_BK), DOT=dot_of(launch, q), RWKV6=u is not None, REFERENCE_ROW=row,
        num_warps=launch.scores_warps)
    return A


def key_side_scores(q, k, g, u=None, chunk_size=64, launch=None, bug=None, helper=None):
    """The intra-chunk scores `A [B, T, H, chunk_size]` (fp32) the key-side forward builds, for inspection: row t
    holds t's scores against every row of its chunk (RWKV6's bonus on the diagonal, zeros right of it). `bug`,
    `helper`: as `chunk_rwkv6`'s, for the REFERENCE_ROW slot (`REFERENCE_ROW_SLOT`)."""
    BT = check_chunk_size(chunk_size)
    q, k, g, u = as_contiguous(q, k, g, u)
    return gated_scores(q, k, chunk_cumsum(g, BT), u, 1.0, BT, resolve(launch, "chunk", q),
                        REFERENCE_ROW_SLOT.pick(bug, helper))


# ----------------------------------------------------------------------------------------------------------
# The op


class ChunkGLAFunction(torch.autograd.Function):
    """GLA (`u=None`) and RWKV6 (`u` the bonus): saves the inputs, the cumulative decay and the scores; the backward
    recomputes the states in fp32 (the forward keeps them only in the dot dtype)."""
    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, g, u, scale, h0, output_final_state, chunk_size, launch, row, checks, names, seqs=None):
        q, k, v, g, u, h0 = as_contiguous(q, k, v, g, u, h0)
        gi = chunk_cumsum(g, chunk_size, checks, names[3], also=k, also_name=names[1], seqs=seqs)
        o, ht, h, A = chunk_gla_fwd(q, k, v, gi, u, scale, h0, output_final_state, chunk_size, launch, q.dtype, row,
                                    checks, names[:3], seqs)
        if checks is not None:
            checks.submit()
        ctx.save_for_backward(q, k, v, g, u, h0, ht, gi, A)
        ctx.scale, ctx.chunk_size, ctx.launch, ctx.row, ctx.seqs = scale, chunk_size, launch, row, seqs
        return o, ht

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dht):
        q, k, v, g, u, h0, ht, gi, A = ctx.saved_tensors
        do, dht = as_contiguous(do, dht)
        # dq, dk, dv in their inputs' dtype straight from the kernels when q, k, v, g share it (no cast pass)
        same = q.dtype == k.dtype == v.dtype == g.dtype
        dq, dk, dv, dg, du, dh0 = chunk_gla_bwd(q, k, v, gi, u, ctx.scale, h0, ht, None, A, do, dht, ctx.chunk_size,
                                                ctx.launch, g.dtype, ctx.row,
                                                grad_dtype=g.dtype if same else torch.float32, seqs=ctx.seqs)
        return (cast_grad(dq, q), cast_grad(dk, k), cast_grad(dv, v), dg, cast_grad(du, u), None,
                cast_grad(dh0, h0), None, None, None, None, None, None, None)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64, launch=None,
              cu_seqlens=None, state_v_first=False, cu_seqlens_cpu=None, **kwargs):
    """Chunked GLA, forward and backward in Triton: states between chunks, dense scores inside.

    `g` is the `[B, T, H, K]` natural-log decay (<= 0); `chunk_size` a power of two >= 16; `launch` a
    `fla_lab.ops.ChunkLaunch` (tile widths and warps, validated).
    Returns `(o [B, T, H, V], final_state [B, H, K, V] in fp32 or None)`. `cu_seqlens` (and its host copy
    `cu_seqlens_cpu`), `state_v_first`: FLA's packed batches and V-first states (`fla_lab.ops.common.conventions`).
    """
    if cu_seqlens_cpu is not None and cu_seqlens is None:
        raise ValueError("chunk_gla: `cu_seqlens_cpu` is the host copy of `cu_seqlens`; pass both or neither")
    if state_v_first:  # FLA's [N, H, V, K] states in and out; the kernels keep them key-major
        o, ht = chunk_gla(q, k, v, g, scale, key_major(initial_state), output_final_state, chunk_size, launch,
                          cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, **kwargs)
        return o, v_first(ht)
    checks = contract.check_gated_inputs("chunk_gla", q, k, v, g, initial_state=initial_state, kwargs=kwargs,
                                         in_kernel=True, packed=cu_seqlens is not None)
    BT = check_chunk_size(chunk_size)
    seqs = None if cu_seqlens is None else packed_batch("chunk_gla", cu_seqlens, cu_seqlens_cpu, q, initial_state, BT)
    contract.check_kernel_device("chunk_gla", dict(q=q, k=k, v=v, g=g, initial_state=initial_state))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, ht = ChunkGLAFunction.apply(q, k, v, g, None, scale, initial_state, output_final_state, BT,
                                   resolve(launch, "chunk", q), reference_row, checks, ("q", "k", "v", "g"), seqs)
    return o, (ht if output_final_state else None)

"""Chunked RWKV-7 / DPLR: `S_t = (diag(exp w_t) + b_t a_t^T) S_{t-1} + k_t v_t^T`, `o_t = scale * S_t^T r_t`.

Reference: `fla_lab.spec.reference.recurrent_rwkv7` (float64). The algorithm is the WY (UT) form of a chunk of BT = 16
steps; no step of it ever exponentiates a positive number, so it is exact over any decay a caller passes.

Inside a chunk with chunk-local inclusive cumulative log-decay `G_t` (fp32) and its exclusive shift
`Ge_t = G_{t-1}` (0 at the chunk's first row), write `u_t = a_t^T S_{t-1}` (the removed row, `[V]`). Unrolled:

    u_t = (a_t e^{Ge_t})^T S_0 + sum_{s<t} A_ab[t, s] u_s + A_ak[t, s] v_s          (strictly earlier s)
    o_t = scale * ((r_t e^{G_t})^T S_0 + sum_{s<=t} A_rb[t, s] u_s + A_rk[t, s] v_s)
    S_C = diag(e^{G_C}) S_0 + sum_s (b_s e^{G_C - G_s}) u_s^T + (k_s e^{G_C - G_s}) v_s^T

with `A_xy[t, s] = sum_i x_t[i] y_s[i] exp(Gx_t[i] - G_s[i])` (Gx = G for r, Ge for a). So
`U = T (Ã S_0 + A_ak V)`, `T = (I - A_ab)^-1` (unit lower triangular, forward substitution in fp32):
`U = W S_0 + U0` with `W = T Ã` and `U0 = T A_ak V` computed for every chunk in parallel, and one sequential pass
over chunks carries S (`dplr_fwd_h_kernel`).

Exactness. Every exponent is a difference `G_later - G_earlier <= 0`, evaluated pair by pair with the exponent
masked *before* exp (rows past T included: the lesson of #77), or a cumulative decay from the chunk start or to the
chunk end. Nothing is split as `exp(G_t) * exp(-G_s)`, so there is no bound on the decay to promise and no fast path
to fall back from (upstream's `safe_gate` path splits a 64-row chunk around its middle row and overflows past its
documented gate range; the README's atlas section shows where).

Backward (everything recomputed from the inputs; see `_backward`). With `do' = scale * do` and `dS_C` the adjoint of
the chunk's end state: `dX = T^T (A_rb^T do' + B̄ dS_C)` (the adjoint of `Ã S_0 + A_ak V`) is carried by the reverse
pass `dplr_bwd_dh_kernel` as `dX0 + Wb dS_C`; then per chunk the score gradients `dA_rb = do' U^T`,
`dA_rk = do' V^T`, `dA_ab = dX U^T`, `dA_ak = dX V^T`, their pairwise contractions, and the state terms give
dr, da, db, dk, dv. The decay gradient has a closed form (as for GLA): the loss depends on w only through
`exp(G_reader - G_writer)`, readers r (at G) and a (at Ge), writers b and k, so
`dw_t = revcumsum(r dr + a da - b db - k dk)_t - a_t da_t + rowsum(S_T * dS_T)`, evaluated per chunk: the sum
over the chunk's later rows plus `rowsum(S_{n+1} * dS_{n+1})`, the state after chunk n times its adjoint (the
whole future's share).

Speed. The forward's kernels: `dplr_scores_kernel` (the four A's; one weight `exp(G_t - G_s)` per pair and channel
serves all four, since a_{t+1} reads at `Ge_{t+1} = G_t`: A_ab[t + 1, s] and A_rb[t, s] share it; folded, two key
rows per step), `dplr_intra_kernel` (T, W, U0; one warp), `dplr_fwd_h_kernel`, `dplr_fwd_o_kernel`. The backward's
per-chunk work is two kernels: `dplr_bwd_dv_kernel` (dv and the score gradients, written over the spent scores) and
`dplr_bwd_kernel` (per 32 key channels: the state terms, then rank-1 updates per key row and per query row, the a
side one row ahead so it shares r's weight). The choices here, each timed against the previous form: the scores in
their own kernel, the solve at tf32x3 on one warp, the backward's per-chunk work split in two kernels so that neither
spills registers, and 16-row chunks (64-row chunks have four times fewer sequential steps in the state pass and are
exact, but slower; branch `experiment/rwkv7-64row`). Why: docs/performance.md, 'chunk_rwkv7: kernels'.

Packed batches (`cu_seqlens`, B = 1): every kernel runs once for the whole batch, as FLA's. The per-chunk kernels
take `chunk_indices` (each program's sequence and chunk within it), the two state passes one program per sequence
and head with `chunk_offsets` (where its chunks start in `h`, `dh`, `bnd`); no chunk spans two sequences, so the
values are those of the op called on each sequence alone, bit for bit (`tests/test_varlen.py`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_lab.ops import contract
from fla_lab.ops.common.chunk import (boundary_share, boundary_term, check_flags, check_slot, chunk_cumsum,
                                      chunk_tables, chunks, load_query_decay, sequence_tables, sequences)
from fla_lab.ops.common.launch import RWKV7ChunkLaunch, check_chunk_size, resolve
from fla_lab.ops.common.switches import check_switch
from fla_lab.ops.common.value_flags import nonfinite_probe, or_nonfinite_bit
from fla_lab.ops.common.utils import (Slot, as_contiguous, batch_head, cast_grad, chunk_of_sequence, custom_bwd,
                                      custom_fwd, grid_size, kernel, mma, mma_split, next_pow2, packed_switch,
                                      sequence_chunks, state_tile)
from fla_lab.ops.rwkv7.fused_recurrent import check_key_width
from fla_lab.ops.common.conventions import packed_batch

CHUNK = 16  # rows per chunk: the whole chunk is one pairwise tile and one 16x16 triangular solve
FLA_CHUNK_SIZES = (CHUNK, 32, 64)  # what FLA 0.6.0's chunk_rwkv7 takes; every one of them runs as CHUNK rows


# ----------------------------------------------------------------------------------------------------------
# Pieces


@kernel
def chunk_rows(i_t, T, BT: tl.constexpr):
    """Chunk i_t's first row, its rows (chunk-local o_c and absolute o_t), which lie before T, and its last row."""
    t_first = i_t * BT
    o_c = tl.arange(0, BT)
    o_t = t_first + o_c
    return t_first, o_c, o_t, o_t < T, tl.minimum(t_first + BT, T) - 1


@kernel
def load_rows(x, o_t, o_d, m, HD):
    """Rows o_t, channels o_d of a `[T, H, D]` tensor (base already at this batch-head), in fp32."""
    return tl.load(x + o_t[:, None] * HD + o_d[None, :], mask=m, other=0).to(tl.float32)


@kernel
def load_cols(x, o_t, o_d, m, HD):
    """The same block transposed: `[channels, rows]`."""
    return tl.load(x + o_t[None, :] * HD + o_d[:, None], mask=m, other=0).to(tl.float32)


@kernel
def chunk_decays(gi, o_t, o_k, m_tk, t_first, t_last, m_k, HK):
    """G (inclusive), Ge (exclusive), the decay from each row to the chunk end, and G at the chunk end."""
    b_g = tl.load(gi + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0)
    b_ge = load_query_decay(gi, o_t[:, None], o_k[None, :], m_tk, t_first, HK, True)
    b_glast = tl.load(gi + t_last * HK + o_k, mask=m_k, other=0)
    return b_g, b_ge, tl.where(m_tk, b_glast[None, :] - b_g, 0), b_glast


@kernel
def row(x, o_c, j):
    """Row j of a `[BT, BD]` tile, as a `[BD]` vector."""
    return tl.sum(tl.where(o_c[:, None] == j, x, 0), axis=0)


@kernel
def fdot(x, y, SOLVE_PRECISION: tl.constexpr):
    """`x @ y` of fp32 tiles at SOLVE_PRECISION (`launch.Precision.solve`): "tf32x3" on a GPU by default, three TF32
    products on the tensor cores with about fp32's accuracy; "ieee" runs on the CUDA cores (and under the
    interpreter, which has no TF32)."""
    return tl.dot(x, y, input_precision=SOLVE_PRECISION)  # safeguard: rwkv7_solve_tf32x3


@kernel
def state_or_zeros(x, i_bh, p_kv, m_kv, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   USE: tl.constexpr):
    """This program's `[BK, BV]` tile of a `[B, H, K, V]` state (h0, dht) in fp32, or zeros without one."""
    b = tl.zeros([BK, BV], dtype=tl.float32)
    if USE:
        b += tl.load(x + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    return b


@kernel
def unit_lower_inverse(b_A, o_c, BT: tl.constexpr):
    """`(I - A)^-1` for a strictly lower triangular `[BT, BT]` A, by forward substitution in fp32:
    row i of the inverse is `e_i + sum_{j<i} A[i, j] * (row j of the inverse)`."""
    eye = (o_c[:, None] == o_c[None, :]).to(tl.float32)
    b_T = eye
    for i in tl.static_range(1, BT):  # unrolled, as the scores' loop: docs/performance.md, 'chunk_rwkv7: loops'
        b_ai = row(b_A, o_c, i)  # zero at j >= i, where b_T still holds identity rows
        b_new = row(eye, o_c, i) + tl.sum(b_ai[:, None] * b_T, axis=0)
        b_T = tl.where(o_c[:, None] == i, b_new[None, :], b_T)
    return b_T


# ----------------------------------------------------------------------------------------------------------
# Forward


@kernel
def pair_scores(r, k, a, b, gi, Arb, Ark, Aab, Aak, t, s, rows_t, rows_s, valid, T, HK, HBT, BT: tl.constexpr,
                o_k, m_k, DIAGONAL: tl.constexpr):
    """The four scores of a tile of pairs (query row t >= key row s, chunk-local, one pair per tile row), from one
    weight `exp(G_t - G_s)` per channel (1 on the diagonal, no exp): A_rb[t, s] and A_rk[t, s] read r at G_t, and
    A_ab[t + 1, s] and A_ak[t + 1, s] read a_{t+1} at its exclusive `Ge_{t+1} = G_t`, the same weight."""
    m = valid[:, None] & m_k[None, :]
    b_b = tl.load(b + rows_s[:, None] * HK + o_k[None, :], mask=m, other=0).to(tl.float32)
    b_k = tl.load(k + rows_s[:, None] * HK + o_k[None, :], mask=m, other=0).to(tl.float32)
    b_r = tl.load(r + rows_t[:, None] * HK + o_k[None, :], mask=m, other=0).to(tl.float32)
    next_row = valid & (t + 1 < BT) & (rows_t + 1 < T)  # a_{t+1} in the chunk and before T
    m_a = next_row[:, None] & m_k[None, :]
    # mutation: rwkv7_exclusive_pair_inclusive
    b_a = tl.load(a + (rows_t + 1)[:, None] * HK + o_k[None, :], mask=m_a, other=0).to(tl.float32)
    if not DIAGONAL:
        # safeguard: rwkv7_pair_weight_decay
        b_w = tl.exp(tl.where(m, tl.load(gi + rows_t[:, None] * HK + o_k[None, :], mask=m, other=0)
                              - tl.load(gi + rows_s[:, None] * HK + o_k[None, :], mask=m, other=0), 0))
        b_b *= b_w  # masked before exp: a masked pair (a row past T loads G = 0) never overflows
        b_k *= b_w
    p_ts = rows_t * HBT + s  # element (t, s) of `[T, H, BT]` scores; (t + 1, s) is HBT further
    tl.store(Arb + p_ts, tl.sum(b_r * b_b, axis=1), mask=valid)
    tl.store(Ark + p_ts, tl.sum(b_r * b_k, axis=1), mask=valid)
    tl.store(Aab + p_ts + HBT, tl.sum(b_a * b_b, axis=1), mask=next_row)
    tl.store(Aak + p_ts + HBT, tl.sum(b_a * b_k, axis=1), mask=next_row)


@packed_switch
@kernel
def dplr_scores_kernel(r, k, a, b, gi, Arb, Ark, Aab, Aak, flags, cu_seqlens, chunk_indices, T, H: tl.constexpr,
                       K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, R_SLOT: tl.constexpr = -1,
                       K_SLOT: tl.constexpr = -1, VARLEN: tl.constexpr = False):
    """One chunk's four pairwise score matrices, `[BT, BT]` each (zeros right of the diagonal; A_ab and A_ak also on
    it), one exp per strictly causal pair; the deferred value checks of r and k (a slot >= 0: `flags` bit).

    Folded: step p puts key row p (query rows p+1..BT-1) and key row BT-1-p (query rows BT-p..BT-1) in one
    `[BT, BK]` tile, BT/2 steps for the BT (BT - 1)/2 causal pairs; the diagonal pairs (t, t) need no exp.
    """
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, _ = chunk_of_sequence(i_t, i_b, T, 0, cu_seqlens, chunk_indices, VARLEN)
    HK: tl.constexpr = H * K
    t_first, o_c, o_t, m_t, t_last = chunk_rows(i_t, T, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    bos = bos * H + i_h
    r, k, a, b, gi = r + bos * K, k + bos * K, a + bos * K, b + bos * K, gi + bos * K
    Arb, Ark, Aab, Aak = Arb + bos * BT, Ark + bos * BT, Aab + bos * BT, Aak + bos * BT
    p_tt = o_t[:, None] * H * BT + o_c[None, :]
    zeros = tl.zeros([BT, BT], dtype=tl.float32)
    tl.store(Arb + p_tt, zeros, mask=m_t[:, None] & (o_c[:, None] < o_c[None, :]))
    tl.store(Ark + p_tt, zeros, mask=m_t[:, None] & (o_c[:, None] < o_c[None, :]))
    tl.store(Aab + p_tt, zeros, mask=m_t[:, None] & (o_c[:, None] <= o_c[None, :]))
    tl.store(Aak + p_tt, zeros, mask=m_t[:, None] & (o_c[:, None] <= o_c[None, :]))
    pair_scores(r, k, a, b, gi, Arb, Ark, Aab, Aak, o_c, o_c, o_t, o_t, m_t, T, HK, H * BT, BT, o_k, m_k, True)
    m_tk = m_t[:, None] & m_k[None, :]
    if R_SLOT >= 0:  # rows the diagonal pairs just read: cached
        or_nonfinite_bit(flags, tl.sum(nonfinite_probe(load_rows(r, o_t, o_k, m_tk, HK))), R_SLOT)
    if K_SLOT >= 0:
        or_nonfinite_bit(flags, tl.sum(nonfinite_probe(load_rows(k, o_t, o_k, m_tk, HK))), K_SLOT)
    for p in tl.static_range(0, BT // 2):  # s < t, two key rows per step; unrolled
        first = o_c < BT - 1 - p
        s = tl.where(first, p, BT - 1 - p)
        t = tl.where(first, p + 1 + o_c, o_c + 1)
        valid = (t < BT) & (t_first + t < T)  # then s < t lies before T too; slot BT - 1 of the tile is empty
        pair_scores(r, k, a, b, gi, Arb, Ark, Aab, Aak, t, s, t_first + t, t_first + s, valid, T, HK, H * BT, BT,
                    o_k, m_k, False)


@packed_switch
@kernel
def dplr_intra_kernel(a, b, v, gi, do, Arb, Aab, Aak, W, U0, Wb, dX0, flags, scale, cu_seqlens, chunk_indices, T,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, BACKWARD: tl.constexpr, SOLVE_PRECISION: tl.constexpr,
                      V_SLOT: tl.constexpr = -1, VARLEN: tl.constexpr = False):
    """One chunk: `T = (I - A_ab)^-1`, `W = T Ã`, `U0 = T A_ak V`; BACKWARD also `Wb = T^T B̄` and
    `dX0 = T^T A_rb^T do'` (the pieces of the reverse pass). In fp32 (the products at SOLVE_PRECISION, `fdot`).
    V_SLOT >= 0: the deferred value check of v, as it is read."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, _ = chunk_of_sequence(i_t, i_b, T, 0, cu_seqlens, chunk_indices, VARLEN)
    HK: tl.constexpr = H * K
    t_first, o_c, o_t, m_t, t_last = chunk_rows(i_t, T, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    bos = bos * H + i_h
    p_tt = bos * BT + o_t[:, None] * H * BT + o_c[None, :]
    p_tk = bos * K + o_t[:, None] * HK + o_k[None, :]
    b_T = unit_lower_inverse(tl.load(Aab + p_tt, mask=m_t[:, None], other=0), o_c, BT)
    b_ge = load_query_decay(gi + bos * K, o_t[:, None], o_k[None, :], m_tk, t_first, HK, True)
    tl.store(W + p_tk, fdot(b_T, load_rows(a + bos * K, o_t, o_k, m_tk, HK) * tl.exp(b_ge), SOLVE_PRECISION),
             mask=m_tk)  # T Ã
    if BACKWARD:
        b_g, _, b_gend, _ = chunk_decays(gi + bos * K, o_t, o_k, m_tk, t_first, t_last, m_k, HK)
        b_bbar = load_rows(b + bos * K, o_t, o_k, m_tk, HK) * tl.exp(b_gend)
        tl.store(Wb + p_tk, fdot(tl.trans(b_T), b_bbar, SOLVE_PRECISION), mask=m_tk)  # Wb = T^T B̄
        # (A_rb T)^T = T^T A_rb^T
        b_P = tl.trans(fdot(tl.load(Arb + p_tt, mask=m_t[:, None], other=0), b_T, SOLVE_PRECISION))
    b_TA = fdot(b_T, tl.load(Aak + p_tt, mask=m_t[:, None], other=0), SOLVE_PRECISION)
    b_probe = tl.zeros([BT, BV], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_tv = bos * V + o_t[:, None] * H * V + o_v[None, :]
        b_v = tl.load(v + p_tv, mask=m_tv, other=0).to(tl.float32)
        if V_SLOT >= 0:
            b_probe += nonfinite_probe(b_v)
        tl.store(U0 + p_tv, fdot(b_TA, b_v, SOLVE_PRECISION), mask=m_tv)
        if BACKWARD:
            b_do = tl.load(do + p_tv, mask=m_tv, other=0).to(tl.float32)
            tl.store(dX0 + p_tv, scale * fdot(b_P, b_do, SOLVE_PRECISION), mask=m_tv)
    if V_SLOT >= 0:
        or_nonfinite_bit(flags, tl.sum(b_probe), V_SLOT)


# The END_DECAY slot of `dplr_fwd_h_kernel`: a helper (gi, t_last, t_first, o_k, m_k, HK) -> [BK], the cumulative
# log-decay row by which the state tile leaves the chunk (row t of gi at gi + t * HK). The op passes `end_decay`,
# or the other helper under its `bug=` switch (`END_DECAY_SLOT`).
@kernel
def end_decay(gi, t_last, t_first, o_k, m_k, HK):
    return tl.load(gi + t_last * HK + o_k, mask=m_k, other=0)


@kernel
def end_decay_alt(gi, t_last, t_first, o_k, m_k, HK):
    return load_query_decay(gi, t_last + 0 * o_k, o_k, m_k, t_first, HK, True)


# switches that are not catalogue entries: written down as digests only (`switches.digest`)
UNLISTED = frozenset({"91ed271c07411c4d"})


# chunk_rwkv7's slot, with no switch named: its only switch is unlisted, so any `bug` that `check_switch` accepts is it
END_DECAY_SLOT = Slot("chunk_rwkv7", "END_DECAY", end_decay, end_decay_alt)


@packed_switch
@kernel
def dplr_fwd_h_kernel(k, v, b, gi, W, U0, h, u, h0, ht, cu_seqlens, chunk_offsets, T, H: tl.constexpr,
                      K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      DOT: tl.constexpr, SPLIT_STATES: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                      END_DECAY: tl.constexpr = end_decay, VARLEN: tl.constexpr = False):
    """The only loop over chunks of the forward: `h[n]` (the state entering chunk n, fp32) and
    `u = W S_0 + U0` (the rows the transition removes, fp32), one `[K, BV]` state tile of one sequence per
    program; `END_DECAY` loads the decay row by which the state leaves a chunk."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_n, i_h = batch_head(i_bh, H)
    HK: tl.constexpr = H * K
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(0, i_v, K, V, BK, BV)
    bos, T, NT, boc = sequence_chunks(i_n, T, BT, cu_seqlens, chunk_offsets, VARLEN)
    bos = bos * H + i_h
    k, b, gi, W = k + bos * K, b + bos * K, gi + bos * K, W + bos * K
    v, U0, u = v + bos * V, U0 + bos * V, u + bos * V
    b_h = state_or_zeros(h0, i_bh, p_kv, m_kv, K, V, BK, BV, USE_H0)
    for i_t in range(0, NT):
        tl.store(h + ((boc + i_t) * H + i_h) * K * V + p_kv, b_h, mask=m_kv)
        t_first, o_c, o_t, m_t, t_last = chunk_rows(i_t, T, BT)
        m_tk, m_tv, m_kt = m_t[:, None] & m_k[None, :], m_t[:, None] & m_v[None, :], m_k[:, None] & m_t[None, :]
        b_u = (mma_split(load_rows(W, o_t, o_k, m_tk, HK), b_h, DOT, SPLIT_STATES)
               + load_rows(U0, o_t, o_v, m_tv, H * V))
        tl.store(u + o_t[:, None] * H * V + o_v[None, :], b_u, mask=m_tv)
        b_glast = END_DECAY(gi, t_last, t_first, o_k, m_k, HK)
        # safeguard: rwkv7_state_decay_to_chunk_end
        b_gend = tl.exp(tl.where(m_kt, b_glast[:, None] - load_cols(gi, o_t, o_k, m_kt, HK), 0))  # [BK, BT]
        b_bt = load_cols(b, o_t, o_k, m_kt, HK) * b_gend
        b_kt = load_cols(k, o_t, o_k, m_kt, HK) * b_gend
        b_v = load_rows(v, o_t, o_v, m_tv, H * V)
        b_h = b_h * tl.exp(b_glast)[:, None] + mma(b_bt, b_u, DOT) + mma(b_kt, b_v, DOT)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@packed_switch
@kernel
def dplr_fwd_o_kernel(r, v, gi, h, u, Arb, Ark, o, scale, cu_seqlens, chunk_indices, T, NT, H: tl.constexpr,
                      K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      DOT: tl.constexpr, VARLEN: tl.constexpr):
    """`o = scale * ((r e^G) h_n + A_rb U + A_rk V)`, one `[BT, BV]` tile per program."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, boc = chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    HK: tl.constexpr = H * K
    t_first, o_c, o_t, m_t, t_last = chunk_rows(i_t, T, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_tk, m_tv = m_t[:, None] & m_k[None, :], m_t[:, None] & m_v[None, :]
    bos = bos * H + i_h
    b_rg = load_rows(r + bos * K, o_t, o_k, m_tk, HK) * tl.exp(load_rows(gi + bos * K, o_t, o_k, m_tk, HK))
    b_h = tl.load(h + ((boc + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0)
    p_tt = bos * BT + o_t[:, None] * H * BT + o_c[None, :]
    b_Arb = tl.load(Arb + p_tt, mask=m_t[:, None], other=0)
    b_Ark = tl.load(Ark + p_tt, mask=m_t[:, None], other=0)
    b_o = mma(b_rg, b_h, DOT) + mma(b_Arb, load_rows(u + bos * V, o_t, o_v, m_tv, H * V), DOT)
    b_o += mma(b_Ark, load_rows(v + bos * V, o_t, o_v, m_tv, H * V), DOT)
    tl.store(o + bos * V + o_t[:, None] * H * V + o_v[None, :], (scale * b_o).to(o.dtype.element_ty), mask=m_tv)


# ----------------------------------------------------------------------------------------------------------
# Backward


@packed_switch
@kernel
def dplr_bwd_dh_kernel(r, a, gi, do, Wb, dX0, h, ht, dh, dX, dht, dh0, bnd, scale, cu_seqlens, chunk_offsets, T,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, DOT: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                       SPLIT_STATES: tl.constexpr, VARLEN: tl.constexpr):
    """The state adjoint in reverse: `dh[n]` = dL/dS at the end of chunk n, `dX = dX0 + Wb dh[n]` (the adjoint of
    `Ã S_0 + A_ak V`), and `dS_0 = e^{G_C} dS_C + (r e^G)^T do' + Ã^T dX` carried to the chunk before.
    Also each chunk's boundary term of dw, `bnd[n] = rowsum(S_{n+1} * dh[n])` (one partial per value block), the
    whole future's share (see `dplr_dw_kernel`). One program per (sequence, head, value block)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_n, i_h = batch_head(i_bh, H)
    HK: tl.constexpr = H * K
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(0, i_v, K, V, BK, BV)
    bos, T, NT, boc = sequence_chunks(i_n, T, BT, cu_seqlens, chunk_offsets, VARLEN)
    bos = bos * H + i_h
    r, a, gi, Wb = r + bos * K, a + bos * K, gi + bos * K, Wb + bos * K
    do, dX0, dX = do + bos * V, dX0 + bos * V, dX + bos * V
    b_dh = state_or_zeros(dht, i_bh, p_kv, m_kv, K, V, BK, BV, USE_DHT)
    b_hn = state_or_zeros(ht, i_bh, p_kv, m_kv, K, V, BK, BV, USE_DHT)  # after the last chunk (dh is 0 without dht)
    for i_r in range(0, NT):
        i_t = NT - 1 - i_r
        tl.store(dh + ((boc + i_t) * H + i_h) * K * V + p_kv, b_dh, mask=m_kv)
        if i_r > 0:
            b_hn = tl.load(h + ((boc + i_t + 1) * H + i_h) * K * V + p_kv, mask=m_kv, other=0)
        boundary_share(b_hn, b_dh, bnd, boc + i_t, i_h, 0, i_v, o_k, o_v, m_k, m_v, H, K, V, BK, BV, False)
        t_first, o_c, o_t, m_t, t_last = chunk_rows(i_t, T, BT)
        m_tk, m_tv, m_kt = m_t[:, None] & m_k[None, :], m_t[:, None] & m_v[None, :], m_k[:, None] & m_t[None, :]
        b_dx = (mma_split(load_rows(Wb, o_t, o_k, m_tk, HK), b_dh, DOT, SPLIT_STATES)
                + load_rows(dX0, o_t, o_v, m_tv, H * V))
        tl.store(dX + o_t[:, None] * H * V + o_v[None, :], b_dx, mask=m_tv)
        b_glast = tl.load(gi + t_last * HK + o_k, mask=m_k, other=0)
        b_gt = load_cols(gi, o_t, o_k, m_kt, HK)
        b_get = load_query_decay(gi, o_t[None, :], o_k[:, None], m_kt, t_first, HK, True)
        b_rt = load_cols(r, o_t, o_k, m_kt, HK) * tl.exp(b_gt)  # mutation: rwkv7_dh_decay_sign
        b_at = load_cols(a, o_t, o_k, m_kt, HK) * tl.exp(b_get)
        b_do = load_rows(do, o_t, o_v, m_tv, H * V)
        b_dh = b_dh * tl.exp(b_glast)[:, None] + scale * mma(b_rt, b_do, DOT) + mma(b_at, b_dx, DOT)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


@kernel
def reader_grads(k, b, gi, dArb, dArk, dAab, dAak, b_dr, b_da, b_g, t_first, o_t, o_c, o_k, m_t, m_k, T, HK,
                 HBT, BT: tl.constexpr):
    """The pair terms of dr and da, one key row j per step, rank-1 updates of the `[BT, BK]` tiles:
    `dr_t += exp(G_t - G_j) (dA_rb[t, j] b_j + dA_rk[t, j] k_j)` for t >= j, and the same weight for a_{t+1}
    (tile row t of `b_da`), which reads at `Ge_{t+1} = G_t`: `+= exp(G_t - G_j) (dA_ab[t+1, j] b_j + ...)`."""
    m_next = m_t & (o_c + 1 < BT) & (o_t + 1 < T)  # a_{t+1} in the chunk and before T
    for j in range(0, BT):  # rolled, as writer_grads' loop: docs/performance.md, 'chunk_rwkv7: loops'
        m_j = m_k & (t_first + j + 0 * o_k < T)
        b_bj = tl.load(b + (t_first + j) * HK + o_k, mask=m_j, other=0).to(tl.float32)
        b_kj = tl.load(k + (t_first + j) * HK + o_k, mask=m_j, other=0).to(tl.float32)
        b_gj = tl.load(gi + (t_first + j) * HK + o_k, mask=m_j, other=0)
        causal = ((o_c >= j) & m_t)[:, None]
        # safeguard: rwkv7_reader_weight_masked_before_exp
        b_w = tl.where(causal, tl.exp(tl.where(causal, b_g - b_gj[None, :], 0)), 0)  # masked before exp
        p_j = o_t * HBT + j  # column j of the score gradients
        c_rb = tl.load(dArb + p_j, mask=m_t, other=0)
        c_rk = tl.load(dArk + p_j, mask=m_t, other=0)
        c_ab = tl.load(dAab + p_j + HBT, mask=m_next, other=0)
        c_ak = tl.load(dAak + p_j + HBT, mask=m_next, other=0)
        b_dr += b_w * (c_rb[:, None] * b_bj[None, :] + c_rk[:, None] * b_kj[None, :])
        b_da += b_w * (c_ab[:, None] * b_bj[None, :] + c_ak[:, None] * b_kj[None, :])
    return b_dr, b_da


@kernel
def writer_grads(r, a, gi, dArb, dArk, dAab, dAak, b_db, b_dk, b_g, t_first, o_c, o_k, m_t, m_k, T, HK, HBT,
                 BT: tl.constexpr):
    """The pair terms of db and dk, one query row j per step, rank-1 updates of the `[BT, BK]` tiles:
    `db_s += exp(G_j - G_s) (dA_rb[j, s] r_j + dA_ab[j+1, s] a_{j+1})` for s <= j (a_{j+1} reads at G_j), and dk
    the same with dA_rk, dA_ak."""
    for j in range(0, BT):
        in_t = t_first + j < T
        next_in = (j + 1 < BT) & (t_first + j + 1 < T)
        m_j = m_k & (t_first + j + 0 * o_k < T)
        m_j1 = m_k & (t_first + j + 1 + 0 * o_k < T) & (j + 1 < BT)
        b_rj = tl.load(r + (t_first + j) * HK + o_k, mask=m_j, other=0).to(tl.float32)
        b_aj = tl.load(a + (t_first + j + 1) * HK + o_k, mask=m_j1, other=0).to(tl.float32)
        b_gj = tl.load(gi + (t_first + j) * HK + o_k, mask=m_j, other=0)
        causal = ((o_c <= j) & m_t & in_t)[:, None]
        # safeguard: rwkv7_writer_weight_masked_before_exp
        b_w = tl.where(causal, tl.exp(tl.where(causal, b_gj[None, :] - b_g, 0)), 0)  # masked before exp
        p_j = (t_first + j) * HBT + o_c  # row j of the score gradients
        r_rb = tl.load(dArb + p_j, mask=m_t & in_t, other=0)
        r_rk = tl.load(dArk + p_j, mask=m_t & in_t, other=0)
        r_ab = tl.load(dAab + p_j + HBT, mask=m_t & next_in, other=0)
        r_ak = tl.load(dAak + p_j + HBT, mask=m_t & next_in, other=0)
        b_db += b_w * (r_rb[:, None] * b_rj[None, :] + r_ab[:, None] * b_aj[None, :])
        b_dk += b_w * (r_rk[:, None] * b_rj[None, :] + r_ak[:, None] * b_aj[None, :])
    return b_db, b_dk


@packed_switch
@kernel
def dplr_bwd_dv_kernel(k, v, gi, dh, u, dX, do, Arb, Ark, Aab, Aak, dv, scale, cu_seqlens, chunk_indices, T, NT,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, DOT: tl.constexpr, SPLIT_STATES: tl.constexpr, VARLEN: tl.constexpr):
    """One chunk: `dv = A_rk^T do' + A_ak^T dX + K̄ dS_C^T` and the four score gradients `dA_rb = do' U^T`,
    `dA_rk = do' V^T`, `dA_ab = dX U^T`, `dA_ak = dX V^T`, which overwrite this chunk's rows of `Arb, Ark, Aab,
    Aak` once every thread has read A_rk and A_ak (A_rb and A_ab are spent by then)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, boc = chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    HK: tl.constexpr = H * K
    HBT: tl.constexpr = H * BT
    t_first, o_c, o_t, m_t, t_last = chunk_rows(i_t, T, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    bos = bos * H + i_h
    k, gi = k + bos * K, gi + bos * K
    v, u, dX, do, dv = v + bos * V, u + bos * V, dX + bos * V, do + bos * V, dv + bos * V
    Arb, Ark, Aab, Aak = Arb + bos * BT, Ark + bos * BT, Aab + bos * BT, Aak + bos * BT
    p_h = ((boc + i_t) * H + i_h) * K * V
    _, _, b_gend, _ = chunk_decays(gi, o_t, o_k, m_tk, t_first, t_last, m_k, HK)
    b_kbar = load_rows(k, o_t, o_k, m_tk, HK) * tl.exp(b_gend)
    p_tt = o_t[:, None] * HBT + o_c[None, :]
    b_Ark = tl.load(Ark + p_tt, mask=m_t[:, None], other=0)
    b_Aak = tl.load(Aak + p_tt, mask=m_t[:, None], other=0)
    dA_rb = tl.zeros([BT, BT], dtype=tl.float32)
    dA_rk = tl.zeros([BT, BT], dtype=tl.float32)
    dA_ab = tl.zeros([BT, BT], dtype=tl.float32)
    dA_ak = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        b_do = load_rows(do, o_t, o_v, m_tv, H * V) * scale
        b_u = load_rows(u, o_t, o_v, m_tv, H * V)
        b_dx = load_rows(dX, o_t, o_v, m_tv, H * V)
        b_v = load_rows(v, o_t, o_v, m_tv, H * V)
        b_dh = tl.load(dh + p_h + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & (o_v < V)[None, :], other=0)
        dA_rb += mma(b_do, tl.trans(b_u), DOT)
        dA_rk += mma(b_do, tl.trans(b_v), DOT)
        dA_ab += mma(b_dx, tl.trans(b_u), DOT)
        dA_ak += mma(b_dx, tl.trans(b_v), DOT)
        b_dv = (mma(tl.trans(b_Ark), b_do, DOT) + mma(tl.trans(b_Aak), b_dx, DOT)
                + mma_split(b_kbar, b_dh, DOT, SPLIT_STATES))
        tl.store(dv + o_t[:, None] * H * V + o_v[None, :], b_dv.to(dv.dtype.element_ty), mask=m_tv)
    tl.debug_barrier()  # every thread has read its scores before they are overwritten
    tl.store(Arb + p_tt, dA_rb, mask=m_t[:, None])
    tl.store(Ark + p_tt, dA_rk, mask=m_t[:, None])
    tl.store(Aab + p_tt, dA_ab, mask=m_t[:, None])
    tl.store(Aak + p_tt, dA_ak, mask=m_t[:, None])


@packed_switch
@kernel
def dplr_bwd_kernel(r, k, v, a, b, gi, h, dh, u, dX, do, dArb, dArk, dAab, dAak, dr, dk, da, db, x, scale,
                    cu_seqlens, chunk_indices, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
                    SPLIT_STATES: tl.constexpr, VARLEN: tl.constexpr):
    """One chunk and BK channels: dr, da, db, dk through the state and through the scores (`reader_grads`,
    `writer_grads`, from the score gradients of `dplr_bwd_dv_kernel`), and `x = r dr - b db - k dk` for the decay
    gradient.

    The a side runs one row ahead: tile row t holds a_{t+1}'s da (row BT - 1 holds the chunk's first a, which
    has no earlier key in the chunk), so a_{t+1} and r_t share one weight exp(G_t - G_j)."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, boc = chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    HK: tl.constexpr = H * K
    HBT: tl.constexpr = H * BT
    t_first, o_c, o_t, m_t, t_last = chunk_rows(i_t, T, BT)
    o_n = t_first + tl.where(o_c + 1 < BT, o_c + 1, 0)  # the a side's rows: t + 1, and the chunk's first last
    m_n = o_n < T
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    m_tk, m_nk = m_t[:, None] & m_k[None, :], m_n[:, None] & m_k[None, :]
    bos = bos * H + i_h
    r, k, a, b, gi = r + bos * K, k + bos * K, a + bos * K, b + bos * K, gi + bos * K
    v, u, dX, do = v + bos * V, u + bos * V, dX + bos * V, do + bos * V
    dArb, dArk, dAab, dAak = dArb + bos * BT, dArk + bos * BT, dAab + bos * BT, dAak + bos * BT
    p_h = ((boc + i_t) * H + i_h) * K * V
    b_g, _, b_gend, _ = chunk_decays(gi, o_t, o_k, m_tk, t_first, t_last, m_k, HK)
    b_dr = tl.zeros([BT, BK], dtype=tl.float32)  # the state terms: do' h^T, dX h^T (a side), U dh^T, V dh^T
    b_da = tl.zeros([BT, BK], dtype=tl.float32)
    b_db = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        m_vk = m_v[:, None] & m_k[None, :]
        b_ht = tl.load(h + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0)  # [BV, BK]
        b_dht = tl.load(dh + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0)
        b_dr += mma_split(load_rows(do, o_t, o_v, m_tv, H * V) * scale, b_ht, DOT, SPLIT_STATES)
        b_da += mma_split(load_rows(dX, o_n, o_v, m_n[:, None] & m_v[None, :], H * V), b_ht, DOT, SPLIT_STATES)
        b_db += mma_split(load_rows(u, o_t, o_v, m_tv, H * V), b_dht, DOT, SPLIT_STATES)
        b_dk += mma_split(load_rows(v, o_t, o_v, m_tv, H * V), b_dht, DOT, SPLIT_STATES)
    b_end = tl.exp(b_gend)
    b_dr *= tl.exp(b_g)
    b_da *= tl.exp(tl.where(o_c[:, None] + 1 < BT, b_g, 0))  # a_{t+1} at Ge_{t+1} = G_t; the first a at 0
    b_db *= b_end
    b_dk *= b_end
    b_dr, b_da = reader_grads(k, b, gi, dArb, dArk, dAab, dAak, b_dr, b_da, b_g, t_first, o_t, o_c, o_k, m_t, m_k,
                              T, HK, HBT, BT)
    b_db, b_dk = writer_grads(r, a, gi, dArb, dArk, dAab, dAak, b_db, b_dk, b_g, t_first, o_c, o_k, m_t, m_k, T,
                              HK, HBT, BT)
    p_tk = o_t[:, None] * HK + o_k[None, :]
    b_x = load_rows(r, o_t, o_k, m_tk, HK) * b_dr - load_rows(b, o_t, o_k, m_tk, HK) * b_db
    b_x -= load_rows(k, o_t, o_k, m_tk, HK) * b_dk
    tl.store(dr + bos * K + p_tk, b_dr.to(dr.dtype.element_ty), mask=m_tk)
    tl.store(da + bos * K + o_n[:, None] * HK + o_k[None, :], b_da, mask=m_nk)
    tl.store(db + bos * K + p_tk, b_db.to(db.dtype.element_ty), mask=m_tk)
    tl.store(dk + bos * K + p_tk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    tl.store(x + bos * K + p_tk, b_x, mask=m_tk)


@packed_switch
@kernel
def dplr_dw_kernel(x, a, da, bnd, dw, cu_seqlens, chunk_indices, T, NT, H: tl.constexpr, K: tl.constexpr,
                   NP: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, VARLEN: tl.constexpr):
    """dw of one chunk: `dw_t = sum_{t' >= t in the chunk} (x + a da)_t' - a_t da_t + bnd[n]` (x = r dr - b db -
    k dk), the boundary term the future's
    share (no sum longer than a chunk: a cumulative sum over the sequence keeps every rounding of x); `dw` may be
    `x` itself (each tile is read, then written by the same program)."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, boc = chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    bos = bos * H + i_h
    b_bnd = boundary_term(bnd, boc + i_t, i_h, o_k, m_k, H, K, NP, BK)
    o_t = i_t * BT + tl.arange(0, BT)
    m = (o_t < T)[:, None] & m_k[None, :]
    p = bos * K + o_t[:, None] * H * K + o_k[None, :]
    b_x = tl.load(x + p, mask=m, other=0)
    b_own = tl.load(a + p, mask=m, other=0).to(tl.float32) * tl.load(da + p, mask=m, other=0)
    b_dw = b_bnd[None, :] + tl.cumsum(b_x + b_own, axis=0, reverse=True) - b_own
    tl.store(dw + p, b_dw.to(dw.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------------------
# Launchers


def _shapes(r, v, launch: RWKV7ChunkLaunch, seqs=None):
    """B, T, H, K, V, the chunks per batch row (of every sequence together when packed), BK, BV."""
    B, T, H, K = r.shape
    V = v.shape[-1]
    return B, T, H, K, V, chunks(T, CHUNK, seqs), max(16, next_pow2(K)), launch.value_block(V)


def _f32(x, *shape):
    return torch.empty(*shape, dtype=torch.float32, device=x.device)


def _scores(r, k, a, b, gi, launch, seqs=None, checks=None):
    """The chunk's four pairwise score matrices `A_rb, A_rk, A_ab, A_ak`, `[B, T, H, CHUNK]` fp32; `checks`
    (`contract.KernelChecks`): the value checks of r and k as they are read."""
    B, T, H, K, V, NT, BK, _ = _shapes(r, r, launch, seqs)
    Arb, Ark, Aab, Aak = (_f32(r, B, T, H, CHUNK) for _ in range(4))
    dplr_scores_kernel[(NT, B * H)](r, k, a, b, gi, Arb, Ark, Aab, Aak, check_flags(checks), *chunk_tables(seqs), T,
                                    H=H, K=K, BT=CHUNK, BK=BK, R_SLOT=check_slot(checks, "r"),
                                    K_SLOT=check_slot(checks, "k"),
                                    num_warps=launch.scores_warps)
    return Arb, Ark, Aab, Aak


def _intra(a, b, v, gi, do, Arb, Aab, Aak, scale, backward, launch, seqs=None, checks=None):
    """W and U0 (the forward's `u = W S_0 + U0`); backward also Wb and dX0 (`dX = dX0 + Wb dS_C`); `checks`: v's
    value check."""
    B, T, H, K, V, NT, BK, BV = _shapes(a, v, launch, seqs)
    rows = (B, T, H)
    W, U0 = _f32(a, *rows, K), _f32(a, *rows, V)
    Wb, dX0 = (_f32(a, *rows, K), _f32(a, *rows, V)) if backward else (None, None)
    dplr_intra_kernel[(NT, B * H)](a, b, v, gi, do, Arb, Aab, Aak, W, U0, Wb, dX0, check_flags(checks), scale,
                                   *chunk_tables(seqs), T, H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV, BACKWARD=backward,
                                   SOLVE_PRECISION=launch.precision.solve_precision(), V_SLOT=check_slot(checks, "v"),
                                   num_warps=launch.intra_warps)
    return W, U0, Wb, dX0


def _states(k, v, b, gi, W, U0, h0, store_ht, dot, launch, end=end_decay, seqs=None):
    """`h [B, NT, H, K, V]`, `u [B, T, H, V]` and the final states `[N, H, K, V]` (one per batch row or sequence);
    `end`: the kernel's END_DECAY helper."""
    B, T, H, K, V, NT, BK, _ = _shapes(k, v, launch, seqs)
    BV, N = launch.state_width(k, V, seqs), sequences(B, seqs)
    h, u = _f32(k, B, NT, H, K, V), _f32(k, B, T, H, V)
    ht = _f32(k, N, H, K, V) if store_ht else None
    dplr_fwd_h_kernel[(grid_size(V, BV), N * H)](k, v, b, gi, W, U0, h, u, h0, ht, *sequence_tables(seqs), T, H=H,
                                                 K=K, V=V, BT=CHUNK, BK=BK, BV=BV, DOT=dot,
                                                 SPLIT_STATES=launch.precision.split_states, USE_H0=h0 is not None,
                                                 STORE_HT=store_ht, END_DECAY=end,
                                                 num_warps=launch.fwd_h_warps)
    return h, u, ht


def _forward(r, w, k, v, a, b, scale, h0, output_final_state, launch, keep=False, end=end_decay, seqs=None,
             checks=None):
    """o, the final state, and (keep=True) the intermediates by name; otherwise each is dropped after its use.
    `seqs`: a packed batch's tables (`conventions.Packed`, 16-row chunks), else dense; `checks`
    (`contract.KernelChecks`): r, k and v are checked by the kernels that read them."""
    B, T, H, K, V, NT, BK, BV = _shapes(r, v, launch, seqs)
    dot = launch.precision.dot(r)
    gi = chunk_cumsum(w, CHUNK, seqs=seqs)
    Arb, Ark, Aab, Aak = _scores(r, k, a, b, gi, launch, seqs, checks)
    W, U0, _, _ = _intra(a, b, v, gi, None, Arb, Aab, Aak, scale, False, launch, seqs=seqs, checks=checks)
    del Aab, Aak
    h, u, ht = _states(k, v, b, gi, W, U0, h0, output_final_state, dot, launch, end, seqs)
    kept = {"G": gi, "A_rb": Arb, "A_rk": Ark, "W": W, "U0": U0, "u": u, "h": h} if keep else {}
    del W, U0
    o = torch.empty(B, T, H, V, dtype=r.dtype, device=r.device)
    dplr_fwd_o_kernel[(grid_size(V, BV), NT, B * H)](r, v, gi, h, u, Arb, Ark, o, scale, *chunk_tables(seqs), T, NT,
                                                     H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=BV, DOT=dot,
                                                     num_warps=launch.fwd_o_warps)
    return o, ht, kept


def _backward(r, w, k, v, a, b, scale, h0, ht, do, dht, launch, end=end_decay, seqs=None):
    """Recomputes the forward's intermediates, drops each after its last use."""
    B, T, H, K, V, NT, BK, BV = _shapes(r, v, launch, seqs)
    dot, split, chunk_args = launch.precision.dot(r), launch.precision.split_states, chunk_tables(seqs)
    gi = chunk_cumsum(w, CHUNK, seqs=seqs)
    Arb, Ark, Aab, Aak = _scores(r, k, a, b, gi, launch, seqs)
    W, U0, Wb, dX0 = _intra(a, b, v, gi, do, Arb, Aab, Aak, scale, True, launch, seqs=seqs)
    h, u, _ = _states(k, v, b, gi, W, U0, h0, False, dot, launch, end, seqs)
    del W, U0
    N = sequences(B, seqs)
    dh, dX = _f32(r, B, NT, H, K, V), _f32(r, B, T, H, V)
    dh0 = _f32(r, N, H, K, V) if h0 is not None else None
    SBV = launch.state_width(r, V, seqs, backward=True)
    bnd = _f32(r, B, NT, H, grid_size(V, SBV), K)
    dplr_bwd_dh_kernel[(grid_size(V, SBV), N * H)](r, a, gi, do, Wb, dX0, h, ht, dh, dX, dht, dh0, bnd, scale,
                                                   *sequence_tables(seqs), T, H=H, K=K, V=V, BT=CHUNK, BK=BK, BV=SBV,
                                                   DOT=dot, USE_DHT=dht is not None, STORE_DH0=h0 is not None,
                                                   SPLIT_STATES=split, num_warps=launch.bwd_dh_warps)
    del Wb, dX0
    dv = torch.empty_like(v)  # dr, dk, db, dv leave their kernels in their inputs' dtypes: no cast passes
    dplr_bwd_dv_kernel[(NT, B * H)](k, v, gi, dh, u, dX, do, Arb, Ark, Aab, Aak, dv, scale, *chunk_args, T, NT, H=H,
                                    K=K, V=V, BT=CHUNK, BK=BK, BV=min(BV, launch.dv_BV), DOT=dot, SPLIT_STATES=split,
                                    num_warps=launch.bwd_dv_warps)
    dr, dk, db = torch.empty_like(r), torch.empty_like(k), torch.empty_like(b)
    da, x = _f32(r, B, T, H, K), _f32(r, B, T, H, K)  # read again by dplr_dw_kernel
    PBK = min(BK, launch.bwd_BK)
    dplr_bwd_kernel[(grid_size(K, PBK), NT, B * H)](r, k, v, a, b, gi, h, dh, u, dX, do, Arb, Ark, Aab, Aak, dr, dk,
                                                    da, db, x, scale, *chunk_args, T, NT, H=H, K=K, V=V, BT=CHUNK,
                                                    BK=PBK, BV=min(BV, launch.bwd_BV), DOT=dot, SPLIT_STATES=split,
                                                    num_warps=launch.bwd_warps)
    del h, dh, u, dX, Arb, Ark, Aab, Aak
    dw = x if w.dtype == torch.float32 else torch.empty_like(w)
    BKw = min(BK, launch.dw_BK)
    dplr_dw_kernel[(grid_size(K, BKw), NT, B * H)](x, a, da, bnd, dw, *chunk_args, T, NT, H=H, K=K, NP=bnd.shape[3],
                                                   BT=CHUNK, BK=BKw)
    return dr, dw, dk, dv, da, db, dh0


class ChunkRWKV7Function(torch.autograd.Function):
    @staticmethod
    @custom_fwd
    def forward(ctx, r, w, k, v, a, b, scale, h0, output_final_state, launch, end=end_decay, seqs=None,
                checks=None):
        r, w, k, v, a, b, h0 = as_contiguous(r, w, k, v, a, b, h0)
        o, ht, _ = _forward(r, w, k, v, a, b, scale, h0, output_final_state, launch, end=end, seqs=seqs,
                            checks=checks)
        if checks is not None:
            checks.submit()
        ctx.save_for_backward(r, w, k, v, a, b, h0, ht)
        ctx.scale, ctx.launch, ctx.end, ctx.seqs = scale, launch, end, seqs
        return o, ht

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dht):
        r, w, k, v, a, b, h0, ht = ctx.saved_tensors
        do, dht = as_contiguous(do, dht)
        dr, dw, dk, dv, da, db, dh0 = _backward(r, w, k, v, a, b, ctx.scale, h0, ht, do, dht, ctx.launch, ctx.end,
                                                ctx.seqs)
        return (cast_grad(dr, r), cast_grad(dw, w), cast_grad(dk, k), cast_grad(dv, v), cast_grad(da, a),
                cast_grad(db, b), None, cast_grad(dh0, h0), None, None, None, None, None)


@torch.no_grad()
def chunk_rwkv7_intermediates(r, w, k, v, a, b, scale=1.0, initial_state=None, bug=None, launch=None,
                              helper=None) -> dict[str, torch.Tensor]:
    """The forward's fp32 intermediates, for inspection (no value checks: pass anything you want to trace).

    `G` (chunk-local cumulative log-decay) and `W`, `U0` `[B, T, H, K or V]` (`u = W S_0 + U0` per chunk),
    `A_rb`, `A_rk` `[B, T, H, 16]` (each row's scores against its chunk, zeros right of the diagonal), `u`
    `[B, T, H, V]` (the removed rows `a_t^T S_{t-1}`), `h [B, NT, H, K, V]` (the state entering each chunk) and
    the output `o`. `bug`, `helper`: as `chunk_rwkv7`'s.
    """
    r, w, k, v, a, b, initial_state = as_contiguous(r, w, k, v, a, b, initial_state)
    check_switch(bug, "chunk_rwkv7", unlisted=UNLISTED)
    o, _, kept = _forward(r, w, k, v, a, b, scale, initial_state, False, resolve(launch, "rwkv7_chunk", r), keep=True,
                          end=END_DECAY_SLOT.pick(bug, helper))
    return {**kept, "o": o}


def chunk_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, chunk_size=None, bug=None,
                cu_seqlens=None, cu_seqlens_cpu=None, launch=None, helper=None, **kwargs):
    """Chunked RWKV-7 (DPLR), forward and backward in Triton, exact at any decay (see the module docstring).

    Same inputs as `fused_recurrent_rwkv7`: `[B, T, H, K]` r, w (natural-log decay <= 0, may be fp32 while the
    rest is bf16), k, a, b; v `[B, T, H, V]`; `initial_state [B, H, K, V]`. Returns `(o, final_state or None)`,
    the state in fp32. K <= 128. `chunk_size`: None, 16, 32 or 64, FLA's choices, all computed in 16-row chunks
    (one pairwise tile each: the same recurrence, exact at any decay; why not 64-row chunks: the module
    docstring). `cu_seqlens` (and its host copy `cu_seqlens_cpu`): FLA's packed batches (B = 1, states
    `[N, H, K, V]`), one launch per kernel for the whole batch (`fla_lab.ops.common.conventions`).
    flash-linear-attention 0.6.0's `chunk_rwkv7` has the same signature and `scale=1.0` default; its
    `safe_gate`/`lower_bound` fast path has no counterpart here (nothing to promise about the decay). `launch`: a
    `fla_lab.ops.RWKV7ChunkLaunch`, None for the device's default. `helper`: a `@triton.jit` helper for the END_DECAY
    slot of `dplr_fwd_h_kernel` instead of the shipped `end_decay` (`END_DECAY_SLOT`).
    """
    op = "chunk_rwkv7"
    check_switch(bug, op, unlisted=UNLISTED)
    checks = contract.check_rwkv7_inputs(op, r, w, k, v, a, b, initial_state, kwargs, packed=cu_seqlens is not None,
                                         in_kernel=("r", "k", "v"))
    check_key_width(op, r.shape[-1])
    check_chunk_size(chunk_size, op, allowed=FLA_CHUNK_SIZES, why="FLA's tilings; each runs as 16-row chunks")
    seqs = None if cu_seqlens is None else packed_batch(op, cu_seqlens, cu_seqlens_cpu, r, initial_state, CHUNK)
    contract.check_kernel_device(op, dict(r=r, w=w, k=k, v=v, a=a, b=b, initial_state=initial_state))
    scale = r.shape[-1] ** -0.5 if scale is None else scale
    o, ht = ChunkRWKV7Function.apply(r, w, k, v, a, b, scale, initial_state, output_final_state,
                                     resolve(launch, "rwkv7_chunk", r), END_DECAY_SLOT.pick(bug, helper), seqs,
                                     checks)
    return o, (ht if output_final_state else None)

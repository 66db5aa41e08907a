"""Chunked kernels shared by GLA and RWKV6: a state per chunk, dense scores inside it (FLA's chunk algorithm).

Notation (per batch element and head; `gi` is the chunk-local inclusive cumulative log-decay, fp32):
- GLA queries read the state after this step's decay: `gq = gi`. RWKV6 reads it before: the exclusive
  `gq = ge`, taken as `ge[t] = gi[t-1]` (0 on a chunk's first row), a bit-exact shift rather than `gi - g`,
  so the weight of the previous token, `exp(ge[t] - gi[t-1])`, is exactly 1 at any decay strength.
- `h_n` is the state before chunk n: `h_{n+1} = diag(exp g_last) h_n + (k * exp(g_last - gi))^T v`.
- Inside a chunk `A[t, s] = sum_i q_t[i] k_s[i] exp(gq_t[i] - gi_s[i])` for s <= t (GLA) / s < t (RWKV6)
  and `o = scale * ((q * exp(gq)) @ h_n + A @ v)`, plus RWKV6's bonus `(q_t . (u * k_t)) v_t`.

A chunk of BT rows is split into sub-chunks of BC = 16 rows. A block pairing query sub-chunk i with an earlier
key sub-chunk j is one `tl.dot` after factorising the decay around a reference row `gn`:
`exp(gq_t - gi_s) = exp(gq_t - gn) * exp(gn - gi_s)`. Both factors are <= 1 only if `gn` lies between them:
GLA uses gi[first row of i]; RWKV6 must use gi[first row of i - 1] = ge[first row] (upstream 0c1c0b65, the
fix of #77). `bug="exclusive_reference"` restores the inclusive gi[first row], whose query factor
`exp(ge[start] - gi[start]) = exp(|g[start]|)` overflows once the per-step log-decay is about -89 or
stronger, while the key factor underflows to 0: inf * 0 = NaN in the output and in dq.
Diagonal blocks are evaluated pair by pair (the forward one key row at a time, the backward as one
[BC, BC, BK] tile shared by dq and dk) with the exponent masked *before* exp, and every row past T is masked
in the exponent too (a decay loaded as 0 there would give exp(-gn) = inf, times a zero input = NaN).

RWKV6's bonus sits on A's diagonal (`A[t, t] = q_t . (u * k_t)`), so `A @ v`, `A^T @ do` and dA's diagonal
carry it with no extra pass.

Backward: the state adjoint runs in reverse over chunks; dA, dv and the intra dq/dk use the same
factorisation (dq with the same reference row and the same bug switch, dk with the last row of the key
sub-chunk); the decay gradient is the closed form of `recurrent.decay_and_bonus_grads`, as one Triton walk
over the chunks (torch's reverse cumsum over T alone took longer than all the kernels of the forward).
On a GPU every product runs on the tensor cores in the input dtype with fp32 accumulation, except that dq
and dk read the fp32 states h and dh as two 16-bit halves (`mma_split`): the decay gradient needs them.
"""
from __future__ import annotations

import torch
import triton.language as tl

from fla_lab.ops import contract
from fla_lab.ops.common import (DOT_PRECISION, as_contiguous, custom_bwd, custom_fwd, dot_dtype, grid_size, kernel,
                                next_pow2, state_tile)

BC = 16  # rows per sub-chunk: the smallest tile a GPU `tl.dot` takes
PRECISION = tl.constexpr(DOT_PRECISION)
# Launch settings, the fastest measured on an H200 (B=8, T=4096, H=16, K=V=64, bf16); module-level so a
# notebook can sweep them. "dot_dtype": None uses `common.dot_dtype(input dtype)`; torch.float32 forces fp32
# (IEEE) dots everywhere, for precision experiments.
LAUNCH = {"A_BK": 32, "A_warps": 2, "dqk_BK": 32, "dqk_warps": 2, "dg_BK": 16, "dot_dtype": None}


# ----------------------------------------------------------------------------------------------------------
# Small shared pieces


@kernel
def load_reference_decay(gi, i_start, o_k, m_k, HK, RWKV6, BUG_EXCLUSIVE_REFERENCE):
    """`gn`, the reference row that splits the decay between query sub-chunk `i_start..` and earlier keys."""
    if RWKV6:
        if BUG_EXCLUSIVE_REFERENCE:  # upstream #77 (de4235fd dropped the -1 of cf63ac28): inclusive gi[start]
            p_gn = gi + i_start * HK + o_k  # ge[start] - gn = -g[start] = |g|: exp overflows, the key side is 0
        else:
            p_gn = gi + (i_start - 1) * HK + o_k  # 0c1c0b65: gn = gi[start - 1] = ge[start], both factors <= 1
    else:
        p_gn = gi + i_start * HK + o_k  # GLA's queries are inclusive: gi[start] already lies between
    return tl.load(p_gn, mask=m_k, other=0)


@kernel
def load_query_decay(gi, rows, cols, mask, t_first, HK, RWKV6):
    """`gq` at the given rows: gi (GLA), or ge[t] = gi[t-1] inside the chunk starting at t_first (RWKV6)."""
    if RWKV6:
        return tl.load(gi + (rows - 1) * HK + cols, mask=mask & (rows > t_first), other=0)
    return tl.load(gi + rows * HK + cols, mask=mask, other=0)


@kernel
def diagonal_weight(b_gq, b_gk, b_u, diag, causal, RWKV6):
    """Pair weights of a diagonal block: exp(gq - gk) on causal pairs, the exponent masked *before* exp (a
    masked pair must not overflow: inf * 0 = NaN), 0 elsewhere; RWKV6's bonus `u` on the diagonal itself."""
    if RWKV6:
        below = causal & ~diag  # strictly earlier keys: the state path
        return tl.where(diag, b_u, tl.where(below, tl.exp(tl.where(below, b_gq - b_gk, 0)), 0))
    return tl.where(causal, tl.exp(tl.where(causal, b_gq - b_gk, 0)), 0)


@kernel
def load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6):
    """RWKV6's `u [H, K]` row of this head (zeros for GLA, which has none)."""
    if RWKV6:
        return tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    return tl.zeros([BK], dtype=tl.float32)


@kernel
def mma(a, b, DOT):
    """`a @ b` on the tensor cores: operands in the dot dtype, fp32 accumulation."""
    return tl.dot(a.to(DOT), b.to(DOT), input_precision=PRECISION)


@kernel
def mma_split(a, b, DOT):
    """`a @ b` for an fp32 state `b` split as hi + lo, two 16-bit parts: about 16 significant bits, not 8.

    dq and dk take the state path through h and dh. One bf16 rounding of them (2**-9) breaks the exact
    cancellation in q * dq - k * dk (e.g. against rowsum(ht * dht)), and dg's cumulative sum spreads that
    over the whole sequence: measured 2.8e-2 relative error in bf16 on an H200, 5e-6 with fp32 dots.
    """
    a = a.to(DOT)
    b_hi = b.to(DOT)
    if DOT == tl.float32:
        return tl.dot(a, b_hi, input_precision=PRECISION)
    b_lo = (b - b_hi.to(tl.float32)).to(DOT)
    return tl.dot(a, b_hi, input_precision=PRECISION) + tl.dot(a, b_lo, input_precision=PRECISION)


# ----------------------------------------------------------------------------------------------------------
# Forward


@kernel
def chunk_cumsum_kernel(g, gi, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """Chunk-local inclusive cumulative sum of the log-decay, in fp32."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m = (o_t < T)[:, None] & (o_k < K)[None, :]
    p = (i_b * T * H + i_h) * K + o_t[:, None] * H * K + o_k[None, :]
    b_g = tl.load(g + p, mask=m, other=0).to(tl.float32)
    tl.store(gi + p, tl.cumsum(b_g, axis=0), mask=m)


@kernel
def chunk_fwd_h_kernel(k, v, gi, h, h0, ht, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
                       USE_H0: tl.constexpr, STORE_HT: tl.constexpr):
    """The state before every chunk, `h [B, NT, H, K, V]` fp32: the only loop over chunks of the forward."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    k, gi, v = k + (i_b * T * H + i_h) * K, gi + (i_b * T * H + i_h) * K, v + (i_b * T * H + i_h) * V
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    for i_t in range(0, NT):
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_h, mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        b_glast = tl.load(gi + t_last * H * K + o_k, mask=m_k, other=0)
        m_kt = m_k[:, None] & m_t[None, :]
        b_kt = tl.load(k + o_t[None, :] * H * K + o_k[:, None], mask=m_kt, other=0).to(tl.float32)
        b_gt = tl.load(gi + o_t[None, :] * H * K + o_k[:, None], mask=m_kt, other=0)
        b_kt *= tl.exp(tl.where(m_kt, b_glast[:, None] - b_gt, 0))  # decay from each key to the chunk end
        b_v = tl.load(v + o_t[:, None] * H * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0)
        b_h = b_h * tl.exp(b_glast)[:, None] + mma(b_kt, b_v.to(tl.float32), DOT)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@kernel
def chunk_fwd_A_kernel(q, k, gi, u, A, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                       BK: tl.constexpr, DOT: tl.constexpr, RWKV6: tl.constexpr, BUG: tl.constexpr):
    """Scores of one query sub-chunk against its chunk: a row block `A[rows, 0:BT]` (zeros right of it).

    RWKV6's bonus sits on the diagonal, `A[t, t] = q_t . (u * k_t)`, so `A @ v` and `A^T @ do` include it.
    """
    i_tc, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    NC: tl.constexpr = BT // BC
    i_t, i_i = i_tc // NC, i_tc % NC
    t_first = i_t * BT
    i_start = t_first + i_i * BC
    if i_start >= T:
        return
    o_c = tl.arange(0, BC)
    o_i = i_start + o_c
    m_i = o_i < T
    HK: tl.constexpr = H * K
    q, k, gi = q + (i_b * T * H + i_h) * K, k + (i_b * T * H + i_h) * K, gi + (i_b * T * H + i_h) * K
    p_A = A + (i_b * T * H + i_h) * BT + o_i[:, None] * H * BT + o_c[None, :]
    for i_j in range(0, i_i):  # earlier key sub-chunks: one dot each around the reference row
        o_j = t_first + i_j * BC + o_c  # all rows < i_start < T
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            m_ik = m_i[:, None] & m_k[None, :]
            b_q = tl.load(q + o_i[:, None] * HK + o_k[None, :], mask=m_ik, other=0).to(tl.float32)
            b_gq = load_query_decay(gi, o_i[:, None], o_k[None, :], m_ik, t_first, HK, RWKV6)
            b_gn = load_reference_decay(gi, i_start, o_k, m_k, HK, RWKV6, BUG)
            b_kt = tl.load(k + o_j[None, :] * HK + o_k[:, None], mask=m_k[:, None], other=0).to(tl.float32)
            b_gkt = tl.load(gi + o_j[None, :] * HK + o_k[:, None], mask=m_k[:, None], other=0)
            b_qg = b_q * tl.exp(tl.where(m_ik, b_gq - b_gn[None, :], 0))
            b_A += mma(b_qg, b_kt * tl.exp(b_gn[:, None] - b_gkt), DOT)
        tl.store(p_A + i_j * BC, b_A, mask=m_i[:, None])
    # the diagonal block, one key row at a time (measured faster here than one [BC, BC, BK] tile)
    b_A = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_ik = m_i[:, None] & m_k[None, :]
        b_q = tl.load(q + o_i[:, None] * HK + o_k[None, :], mask=m_ik, other=0).to(tl.float32)
        b_gq = load_query_decay(gi, o_i[:, None], o_k[None, :], m_ik, t_first, HK, RWKV6)
        b_u = load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6)[None, :]
        for j in range(0, BC):
            m_j = m_k & (i_start + j + 0 * o_k < T)  # a vector test: triton 3.9 rejects vector & scalar masks
            b_kj = tl.load(k + (i_start + j) * HK + o_k, mask=m_j, other=0).to(tl.float32)
            b_gj = tl.load(gi + (i_start + j) * HK + o_k, mask=m_j, other=0)
            causal = ((o_c >= j) & m_i)[:, None]
            b_w = diagonal_weight(b_gq, b_gj[None, :], b_u, causal & (o_c == j)[:, None], causal, RWKV6)
            b_A += tl.where(o_c[None, :] == j, tl.sum(b_q * b_kj[None, :] * b_w, axis=1)[:, None], 0)
    tl.store(p_A + i_i * BC, b_A, mask=m_i[:, None])
    for i_j in range(i_i + 1, NC):
        tl.store(p_A + i_j * BC, tl.zeros([BC, BC], dtype=tl.float32), mask=m_i[:, None])


@kernel
def chunk_fwd_o_kernel(q, v, gi, h, A, o, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
                       RWKV6: tl.constexpr):
    """o = scale * ((q * exp(gq)) @ h_n + A @ v), one [BT, BV] tile per program (A holds RWKV6's bonus)."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    HK: tl.constexpr = H * K
    t_first = i_t * BT
    o_c = tl.arange(0, BT)
    o_t = t_first + o_c
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < T, o_v < V
    m_tv = m_t[:, None] & m_v[None, :]
    q, gi = q + (i_b * T * H + i_h) * K, gi + (i_b * T * H + i_h) * K
    h += ((i_b * NT + i_t) * H + i_h) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_gq = load_query_decay(gi, o_t[:, None], o_k[None, :], m_tk, t_first, HK, RWKV6)
        b_h = tl.load(h + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0)
        b_o += mma(b_q * tl.exp(b_gq), b_h, DOT)  # gq <= 0 (and 0 on masked rows)
    p_A = A + (i_b * T * H + i_h) * BT + o_t[:, None] * H * BT + o_c[None, :]
    b_A = tl.load(p_A, mask=m_t[:, None], other=0)
    b_v = tl.load(v + (i_b * T * H + i_h) * V + o_t[:, None] * H * V + o_v[None, :], mask=m_tv,
                  other=0).to(tl.float32)
    b_o += mma(b_A, b_v, DOT)
    p_o = o + (i_b * T * H + i_h) * V + o_t[:, None] * H * V + o_v[None, :]
    tl.store(p_o, (scale * b_o).to(o.dtype.element_ty), mask=m_tv)


# ----------------------------------------------------------------------------------------------------------
# Backward


@kernel
def chunk_bwd_dh_kernel(q, do, gi, dh, dht, dh0, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        DOT: tl.constexpr, RWKV6: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr):
    """State adjoint in reverse: `dh[n]` = dL/dh_{n+1} (the state after chunk n); dh0 = dL/dh_0."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    HK: tl.constexpr = H * K
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    q, gi, do = q + (i_b * T * H + i_h) * K, gi + (i_b * T * H + i_h) * K, do + (i_b * T * H + i_h) * V
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    for i_r in range(0, NT):
        i_t = NT - 1 - i_r
        tl.store(dh + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_dh, mask=m_kv)
        t_first = i_t * BT
        o_t = t_first + tl.arange(0, BT)
        m_t = o_t < T
        t_last = tl.minimum(t_first + BT, T) - 1
        b_glast = tl.load(gi + t_last * HK + o_k, mask=m_k, other=0)
        m_kt = m_k[:, None] & m_t[None, :]
        b_qt = tl.load(q + o_t[None, :] * HK + o_k[:, None], mask=m_kt, other=0).to(tl.float32)
        b_gqt = load_query_decay(gi, o_t[None, :], o_k[:, None], m_kt, t_first, HK, RWKV6)
        b_do = tl.load(do + o_t[:, None] * H * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0)
        b_dh = b_dh * tl.exp(b_glast)[:, None] + scale * mma(b_qt * tl.exp(b_gqt), b_do.to(tl.float32), DOT)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


@kernel
def chunk_bwd_dA_kernel(v, do, dA, scale, T, H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                        BV: tl.constexpr, DOT: tl.constexpr):
    """dA = scale * do @ v^T on the causal part of the chunk, diagonal included (RWKV6's bonus reads it)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    v, do = v + (i_b * T * H + i_h) * V, do + (i_b * T * H + i_h) * V
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_do = tl.load(do + o_t[:, None] * H * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0)
        b_vt = tl.load(v + o_t[None, :] * H * V + o_v[:, None], mask=m_v[:, None] & m_t[None, :], other=0)
        b_dA += mma(b_do.to(tl.float32), b_vt.to(tl.float32), DOT)
    causal = o_c[:, None] >= o_c[None, :]
    p_dA = dA + (i_b * T * H + i_h) * BT + o_t[:, None] * H * BT + o_c[None, :]
    tl.store(p_dA, tl.where(causal, scale * b_dA, 0), mask=m_t[:, None])


@kernel
def chunk_bwd_dv_kernel(k, gi, A, do, dh, dv, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        DOT: tl.constexpr):
    """dv = scale * A^T @ do + (k * exp(g_last - gi)) @ dh_{n+1} (A's diagonal brings RWKV6's bonus)."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    HK: tl.constexpr = H * K
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < T, o_v < V
    m_tv = m_t[:, None] & m_v[None, :]
    k, gi = k + (i_b * T * H + i_h) * K, gi + (i_b * T * H + i_h) * K
    dh += ((i_b * NT + i_t) * H + i_h) * K * V
    p_At = A + (i_b * T * H + i_h) * BT + o_t[None, :] * H * BT + o_c[:, None]  # [s, t]
    b_At = tl.load(p_At, mask=m_t[None, :], other=0)
    b_do = tl.load(do + (i_b * T * H + i_h) * V + o_t[:, None] * H * V + o_v[None, :], mask=m_tv, other=0)
    b_dv = scale * mma(b_At, b_do.to(tl.float32), DOT)
    t_last = tl.minimum(i_t * BT + BT, T) - 1
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_glast = tl.load(gi + t_last * HK + o_k, mask=m_k, other=0)
        b_k = tl.load(k + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
        b_g = tl.load(gi + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0)
        b_kg = b_k * tl.exp(tl.where(m_tk, b_glast[None, :] - b_g, 0))
        b_dh = tl.load(dh + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0)
        b_dv += mma(b_kg, b_dh, DOT)
    tl.store(dv + (i_b * T * H + i_h) * V + o_t[:, None] * H * V + o_v[None, :], b_dv, mask=m_tv)


@kernel
def chunk_bwd_dqk_kernel(q, k, v, gi, u, h, dh, dA, do, dq, dk, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                         V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr, DOT: tl.constexpr, RWKV6: tl.constexpr, BUG: tl.constexpr):
    """dq and dk of one sub-chunk: intra-chunk terms from dA (RWKV6's bonus from its diagonal), inter-chunk
    terms from h and dh."""
    i_k, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NC: tl.constexpr = BT // BC
    HK: tl.constexpr = H * K
    i_t, i_i = i_tc // NC, i_tc % NC
    t_first = i_t * BT
    i_start = t_first + i_i * BC
    if i_start >= T:
        return
    o_c = tl.arange(0, BC)
    o_i = i_start + o_c
    o_k = i_k * BK + tl.arange(0, BK)
    m_i, m_k = o_i < T, o_k < K
    m_ik = m_i[:, None] & m_k[None, :]
    bos = i_b * T * H + i_h
    q, k, gi, dA = q + bos * K, k + bos * K, gi + bos * K, dA + bos * BT
    p_ik = o_i[:, None] * HK + o_k[None, :]
    b_gq = load_query_decay(gi, o_i[:, None], o_k[None, :], m_ik, t_first, HK, RWKV6)
    b_gk = tl.load(gi + p_ik, mask=m_ik, other=0)
    b_u = load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6)[None, :]

    # dq_t = sum_s dA[t, s] k_s exp(gq_t - gi_s): earlier sub-chunks around the forward's reference row
    b_dq = tl.zeros([BC, BK], dtype=tl.float32)
    if i_i > 0:
        b_gn = load_reference_decay(gi, i_start, o_k, m_k, HK, RWKV6, BUG)
        for i_j in range(0, i_i):
            o_j = t_first + i_j * BC + o_c
            b_kj = tl.load(k + o_j[:, None] * HK + o_k[None, :], mask=m_k[None, :], other=0).to(tl.float32)
            b_gj = tl.load(gi + o_j[:, None] * HK + o_k[None, :], mask=m_k[None, :], other=0)
            b_dA = tl.load(dA + o_i[:, None] * H * BT + (i_j * BC + o_c)[None, :], mask=m_i[:, None], other=0)
            b_dq += mma(b_dA, b_kj * tl.exp(b_gn[None, :] - b_gj), DOT)
        b_dq *= tl.exp(tl.where(m_ik, b_gq - b_gn[None, :], 0))

    # dk_s = sum_t dA[t, s] q_t exp(gq_t - gi_s): later sub-chunks around the last valid row of this one
    b_dk = tl.zeros([BC, BK], dtype=tl.float32)
    n_sub = tl.minimum(NC, tl.cdiv(T - t_first, BC))
    if i_i + 1 < n_sub:  # then this sub-chunk is full
        b_gn = tl.load(gi + (i_start + BC - 1) * HK + o_k, mask=m_k, other=0)
        for i_j in range(i_i + 1, n_sub):
            o_j = t_first + i_j * BC + o_c
            m_jk = (o_j < T)[:, None] & m_k[None, :]
            b_qj = tl.load(q + o_j[:, None] * HK + o_k[None, :], mask=m_jk, other=0).to(tl.float32)
            b_gqj = load_query_decay(gi, o_j[:, None], o_k[None, :], m_jk, t_first, HK, RWKV6)
            b_dAt = tl.load(dA + o_j[None, :] * H * BT + (i_i * BC + o_c)[:, None], mask=(o_j < T)[None, :],
                            other=0)
            b_dk += mma(b_dAt, b_qj * tl.exp(tl.where(m_jk, b_gqj - b_gn[None, :], 0)), DOT)
        b_dk *= tl.exp(b_gn[None, :] - b_gk)

    # the diagonal block: all (t, s) pairs at once, one [BC, BC, BK] weight tile serves dq and dk
    b_qi = tl.load(q + p_ik, mask=m_ik, other=0).to(tl.float32)
    b_ki = tl.load(k + p_ik, mask=m_ik, other=0).to(tl.float32)
    b_dAii = tl.load(dA + o_i[:, None] * H * BT + (i_i * BC + o_c)[None, :], mask=m_i[:, None], other=0)
    causal = ((o_c[:, None] >= o_c[None, :]) & m_i[:, None])[:, :, None]
    diag = (o_c[:, None] == o_c[None, :])[:, :, None] & causal
    b_w = diagonal_weight(b_gq[:, None, :], b_gk[None, :, :], b_u[None, :, :], diag, causal, RWKV6)
    b_w *= b_dAii[:, :, None]
    b_dq += tl.sum(b_w * b_ki[None, :, :], axis=1)
    b_dk += tl.sum(b_w * b_qi[:, None, :], axis=0)

    # inter-chunk: dq += scale * (do @ h_n^T) * exp(gq), dk += (v @ dh_{n+1}^T) * exp(g_last - gi), with the
    # states split in two (see mma_split)
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
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
        b_dqh += mma_split(b_do, tl.load(h + p_vk, mask=m_vk, other=0), DOT)
        b_dkh += mma_split(b_v, tl.load(dh + p_vk, mask=m_vk, other=0), DOT)
    t_last = tl.minimum(t_first + BT, T) - 1
    b_glast = tl.load(gi + t_last * HK + o_k, mask=m_k, other=0)
    b_dq += scale * b_dqh * tl.exp(b_gq)
    b_dk += b_dkh * tl.exp(tl.where(m_ik, b_glast[None, :] - b_gk, 0))
    p_out = bos * K + p_ik
    tl.store(dq + p_out, b_dq, mask=m_ik)
    tl.store(dk + p_out, b_dk, mask=m_ik)


@kernel
def chunk_bwd_dg_kernel(q, k, dq, dk, u, dA, c, dg, du, T, NT, H: tl.constexpr, K: tl.constexpr,
                        BT: tl.constexpr, BK: tl.constexpr, RWKV6: tl.constexpr, USE_C: tl.constexpr):
    """dg = reverse cumsum over the whole sequence of q * dq - k * dk, plus c = rowsum(ht * dht); RWKV6's du.

    The output depends on the cumulative log-decay G through exp(Gq_t - Gk_s), so dL/dG_t = q_t dq_t - k_t dk_t
    and g_t moves every G from step t on (as in `recurrent.decay_and_bonus_grads`). RWKV6's bonus terms cancel
    in q * dq - k * dk; its queries read G_{t-1}, so a step's own query term (state path: dq minus the bonus
    u * k_t * dA[t, t]) leaves its dg. One program per key block walks the chunks backwards.
    """
    i_k, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HK: tl.constexpr = H * K
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    o_c = tl.arange(0, BT)
    bos = i_b * T * H + i_h
    b_acc = tl.zeros([BK], dtype=tl.float32)
    if USE_C:
        b_acc += tl.load(c + i_bh * K + o_k, mask=m_k, other=0)
    b_u = load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6)
    b_du = tl.zeros([BK], dtype=tl.float32)
    for i_r in range(0, NT):
        o_t = (NT - 1 - i_r) * BT + o_c
        m_t = o_t < T
        m = m_t[:, None] & m_k[None, :]
        p = bos * K + o_t[:, None] * HK + o_k[None, :]
        b_q = tl.load(q + p, mask=m, other=0).to(tl.float32)
        b_k = tl.load(k + p, mask=m, other=0).to(tl.float32)
        b_qdq = b_q * tl.load(dq + p, mask=m, other=0)
        b_x = b_qdq - b_k * tl.load(dk + p, mask=m, other=0)
        b_dg = b_acc[None, :] + tl.cumsum(b_x, axis=0, reverse=True)
        if RWKV6:
            b_dAd = tl.load(dA + bos * BT + o_t * H * BT + o_c, mask=m_t, other=0)  # scale * do_t . v_t
            b_qkd = b_q * b_k * b_dAd[:, None]
            b_dg -= b_qdq - b_u[None, :] * b_qkd
            b_du += tl.sum(b_qkd, axis=0)
        b_acc += tl.sum(b_x, axis=0)
        tl.store(dg + p, b_dg.to(dg.dtype.element_ty), mask=m)
    if RWKV6:
        tl.store(du + i_bh * K + o_k, b_du, mask=m_k)


# ----------------------------------------------------------------------------------------------------------
# Launchers and autograd


def _tiles(K, V, BT):
    if BT < BC or BT & (BT - 1):
        raise ValueError(f"chunk_size must be a power of two >= {BC}, got {BT}")
    BK, BV = max(16, min(next_pow2(K), 64)), max(16, min(next_pow2(V), 64))
    return BK, BV


def _forward(q, k, v, g, u, scale, h0, output_final_state, BT, bug):
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = _tiles(K, V, BT)
    NT, NK, NV = grid_size(T, BT), grid_size(K, BK), grid_size(V, BV)
    DOT, rwkv6 = dot_dtype(LAUNCH["dot_dtype"] or q.dtype), u is not None
    f32 = dict(dtype=torch.float32, device=q.device)
    gi = torch.empty(B, T, H, K, **f32)
    chunk_cumsum_kernel[(NK, NT, B * H)](g, gi, T, H=H, K=K, BT=BT, BK=BK)
    h = torch.empty(B, NT, H, K, V, **f32)
    ht = torch.empty(B, H, K, V, **f32) if output_final_state else None
    chunk_fwd_h_kernel[(NK, NV, B * H)](k, v, gi, h, h0, ht, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                                        DOT=DOT, USE_H0=h0 is not None, STORE_HT=output_final_state)
    A = torch.empty(B, T, H, BT, **f32)
    chunk_fwd_A_kernel[(NT * (BT // BC), B * H)](q, k, gi, u, A, T, H=H, K=K, BT=BT, BC=BC,
                                                  BK=min(BK, LAUNCH["A_BK"]), DOT=DOT, RWKV6=rwkv6,
                                                  BUG=bug, num_warps=LAUNCH["A_warps"])
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=q.device)
    chunk_fwd_o_kernel[(NV, NT, B * H)](q, v, gi, h, A, o, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK,
                                        BV=BV, DOT=DOT, RWKV6=rwkv6)
    return o, ht, gi, h, A


def _backward(q, k, v, g, u, scale, h0, ht, gi, h, A, do, dht, BT, bug):
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = _tiles(K, V, BT)
    NT, NK, NV = grid_size(T, BT), grid_size(K, BK), grid_size(V, BV)
    DOT, rwkv6 = dot_dtype(LAUNCH["dot_dtype"] or q.dtype), u is not None
    f32 = dict(dtype=torch.float32, device=q.device)
    dh = torch.empty(B, NT, H, K, V, **f32)
    dh0 = torch.empty(B, H, K, V, **f32) if h0 is not None else None
    chunk_bwd_dh_kernel[(NK, NV, B * H)](q, do, gi, dh, dht, dh0, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK,
                                         BV=BV, DOT=DOT, RWKV6=rwkv6, USE_DHT=dht is not None,
                                         STORE_DH0=h0 is not None)
    dA = torch.empty(B, T, H, BT, **f32)
    chunk_bwd_dA_kernel[(NT, B * H)](v, do, dA, scale, T, H=H, V=V, BT=BT, BV=BV, DOT=DOT)
    dv = torch.empty(B, T, H, V, **f32)
    chunk_bwd_dv_kernel[(NV, NT, B * H)](k, gi, A, do, dh, dv, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK,
                                         BV=BV, DOT=DOT)
    dq, dk = torch.empty(B, T, H, K, **f32), torch.empty(B, T, H, K, **f32)
    BKi = min(BK, LAUNCH["dqk_BK"])  # the diagonal block is a [BC, BC, BKi] tile: keep it in registers
    chunk_bwd_dqk_kernel[(grid_size(K, BKi), NT * (BT // BC), B * H)](
        q, k, v, gi, u, h, dh, dA, do, dq, dk, scale, T, NT, H=H, K=K, V=V, BT=BT, BC=BC, BK=BKi, BV=BV,
        DOT=DOT, RWKV6=rwkv6, BUG=bug, num_warps=LAUNCH["dqk_warps"])
    c = (ht * dht).sum(-1) if dht is not None and ht is not None else None  # the final state's share
    dg = torch.empty_like(g)
    du = torch.empty(B, H, K, **f32) if rwkv6 else None
    BKg = LAUNCH["dg_BK"]  # many short programs: the walk over chunks is sequential
    chunk_bwd_dg_kernel[(grid_size(K, BKg), B * H)](q, k, dq, dk, u, dA, c, dg, du, T, NT, H=H, K=K, BT=BT,
                                                    BK=BKg, RWKV6=rwkv6, USE_C=c is not None)
    return dq, dk, dv, dg, None if du is None else du.sum(0), dh0


class ChunkFunction(torch.autograd.Function):
    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, g, u, scale, h0, output_final_state, chunk_size, bug):
        q, k, v, g, u, h0 = as_contiguous(q, k, v, g, u, h0)
        o, ht, gi, h, A = _forward(q, k, v, g, u, scale, h0, output_final_state, chunk_size, bug)
        ctx.save_for_backward(q, k, v, g, u, h0, ht, gi, h, A)
        ctx.scale, ctx.chunk_size, ctx.bug = scale, chunk_size, bug
        return o, ht

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dht):
        q, k, v, g, u, h0, ht, gi, h, A = ctx.saved_tensors
        do, dht = as_contiguous(do, dht)
        dq, dk, dv, dg, du, dh0 = _backward(q, k, v, g, u, ctx.scale, h0, ht, gi, h, A, do, dht, ctx.chunk_size,
                                            ctx.bug)
        cast = lambda grad, like: None if grad is None or like is None else grad.to(like.dtype)  # noqa: E731
        return (cast(dq, q), cast(dk, k), cast(dv, v), dg, cast(du, u), None, cast(dh0, h0),
                None, None, None)


def chunk(q, k, v, g, u, scale, initial_state, output_final_state, chunk_size, bug_exclusive_reference):
    """Chunked GLA (`u=None`) or RWKV6 (`u` the bonus), forward and backward in Triton."""
    contract.check_kernel_device("chunk_rwkv6" if u is not None else "chunk_gla",
                                 dict(q=q, k=k, v=v, g=g, u=u, initial_state=initial_state))
    o, ht = ChunkFunction.apply(q, k, v, g, u, scale, initial_state, output_final_state, int(chunk_size),
                                bool(bug_exclusive_reference))
    return o, (ht if output_final_state else None)

"""The stages every gated chunk pass shares, with the gate on either side of the state (FLA's chunk algorithm).

Where each side lives: the key side (GLA, RWKV6, GSA pass 2) in `fla_lab/ops/gla/chunk.py`, the value side (GSA
pass 1, `slot_pass_*`) in `fla_lab/ops/gsa/chunk.py`; this file holds what both run (and RWKV-7 borrows), kernels
first, then their launchers.

A pass keeps a state `h [K, V]` per chunk and dense scores inside it. Its gate `g` (a natural-log decay <= 0) sits
on one side of the state:
- key side (GLA, RWKV6, GSA pass 2, slots -> values): `h_t = diag(exp g_t) h_{t-1} + k_t v_t^T`, `g` is `[B, T, H, K]`;
- value side (GSA pass 1, keys -> slots): `h_t = h_{t-1} diag(exp g_t) + k_t v_t^T`, `g` is `[B, T, H, V]`;
and `o_t = scale * h_t^T q_t` (RWKV6 reads h_{t-1} plus a bonus, see below).

With `gi` the chunk-local inclusive cumulative log-decay (fp32) every pair (t, s <= t) in a chunk carries
`exp(gi_t - gi_s)` on the gated channel. On the key side that factor is contracted away inside the scores
`A[t, s] = sum_i q_t[i] k_s[i] exp(gi_t[i] - gi_s[i])`, so the output is the plain `A @ v`. On the value side the
scores are plain (`A = q k^T`) and the factor stays on the output channel:
`o_t[m] = sum_s A[t, s] v_s[m] exp(gi_t[m] - gi_s[m])`. The two sides are the same few stages:

| stage (kernels of this file; gla/, gsa/: of ops/gla/chunk.py, ops/gsa/chunk.py) | key side | value side |
|---|---|---|
| cumulative decay | `chunk_cumsum_kernel` | same |
| state entering each chunk | `chunk_fwd_h_kernel(GATE_V=False)` | `GATE_V=True` |
| intra-chunk scores | gla/`gated_scores_kernel` (A) | `plain_scores_kernel` (A) |
| output | gla/`chunk_fwd_o_kernel` | gsa/`slot_rows_kernel` |
| state adjoint | `chunk_bwd_dh_kernel(GATE_V=False)` | `GATE_V=True` |
| score gradient | `plain_scores_kernel` (dA) | gla/`gated_scores_kernel` (dA) |
| gradients through the scores and the state | gla/`chunk_bwd_dqk_kernel` (dq, dk), `plain_rows_kernel` (dv) | `plain_rows_kernel` (dq, dk), gsa/`slot_rows_kernel(BACKWARD)` (dv) |
| decay gradient | `chunk_bwd_dg_kernel` on (q, dq, k, dk), `bnd` from `chunk_bwd_dh_kernel` | on (o, do, v, dv) |

The gated contraction `sum_s S[t, s] Y_s exp(gi_t - gi_s)` (dq on the key side, the output on the value side) and
its transpose `sum_t S[t, s] W_t exp(gi_t - gi_s)` (dk on the key side, dv on the value side) are two helpers,
`rows_from_earlier_subchunks` and `cols_from_later_subchunks`, plus a pairwise diagonal block.

Sub-chunks. A chunk of BT rows is split into sub-chunks of BC = 16 rows. A block pairing sub-chunk i with an earlier
sub-chunk j is one `tl.dot` after factorising the decay around a reference row `gn`:
`exp(gq_t - gi_s) = exp(gq_t - gn) * exp(gn - gi_s)`. Both factors are <= 1 only if `gn` lies between them.
- GLA, GSA: `gn = gi[first row of i]`. RWKV6 reads the state before its own decay, `gq = ge` (exclusive,
  `ge[t] = gi[t-1]`, a bit-exact shift), so it needs `gn = gi[first row of i - 1]` (upstream 0c1c0b65, the fix of
  #77); `bug="exclusive_reference"` restores the inclusive row, whose query factor `exp(|g[start]|)` overflows from a
  per-step log-decay of about -89 while the key factor underflows: inf * 0 = NaN. The kernels take the row as a
  `tl.constexpr` helper, REFERENCE_ROW, of `gated_scores_kernel` and `chunk_bwd_dqk_kernel` (ops/gla/chunk.py).
- Transposed, from later sub-chunks j: `gn = gi[last valid row of i]`; rows of j past the end of the sequence load
  as 0 and must be masked in the exponent, or `exp(0 - gn)` overflows and meets a zero-padded input: NaN
  (upstream #77 for GSA, fixed in 737550ff). `cols_from_later_subchunks` takes that exponent as a `tl.constexpr`
  helper, EXPONENT: the callers pass it (`slot_rows_kernel`, ops/gsa/chunk.py, `later_rows_exponent` by default).
Diagonal blocks are evaluated pair by pair with the exponent masked *before* exp.

RWKV6's bonus sits on A's diagonal (`A[t, t] = q_t . (u * k_t)`), so `A @ v`, `A^T @ do` and dA's diagonal carry it.

Precision. On a GPU every product runs on the tensor cores in the input dtype with fp32 accumulation, except where a
product feeds the decay gradient through an fp32 state (h, dh): there the state is split in two 16-bit halves
(`mma_split`). The value side's state pass splits its decayed operand too: GSA's slot scores feed a softmax, which
at weak decay (large scores) magnifies one bf16 rounding per term of h into dg's error at training length
(docs/performance.md, 'Accuracy at T = 4096').
Every offset is 64-bit (`batch_head`).

Value checks. A deferred check of the key-side forward's inputs runs inside the kernels that read them anyway
(`fla_lab.ops.contract.KernelChecks`): the cumulative decay checks g and k, the output q and v. A `*_SLOT`
constexpr is the input's bit in the call's flag, -1 for no check.
"""
from __future__ import annotations

import torch
import triton.language as tl

# `checks` come from the ops (`contract.KernelChecks`): the contract imports this package, never the reverse
from fla_lab.ops.common.conventions import Packed
from fla_lab.ops.common.launch import ChunkLaunch, tile_width
from fla_lab.ops.common.utils import (Slot, batch_head, chunk_of_sequence, grid_size, kernel, mma, mma_split,
                                      packed_switch, sequence_chunks, state_tile)
from fla_lab.ops.common.value_flags import nonfinite_probe, or_nonfinite_bit, or_positive_decay_bit

BC = 16  # rows per sub-chunk: the smallest tile a GPU `tl.dot` takes


# ----------------------------------------------------------------------------------------------------------
# Pieces both sides use inside their kernels


# RWKV6's reference row, the REFERENCE_ROW slot of `gated_scores_kernel` and `chunk_bwd_dqk_kernel` (ops/gla/chunk.py):
# a helper (gi, i_start, o_k, HK) -> the pointers of gn's row (row t of gi at gi + t * HK). `bug="exclusive_reference"`
# takes the first helper, the default is the second (kept one blank line apart so `python -m fla_lab bugs` prints both).
@kernel
def reference_row_inclusive(gi, i_start, o_k, HK):
    # bug: exclusive_reference
    return gi + i_start * HK + o_k  # upstream #77 (de4235fd dropped the -1 of cf63ac28): ge[start] - gn = |g[start]|

@kernel
def reference_row(gi, i_start, o_k, HK):
    # safeguard: reference_row_exclusive
    return gi + (i_start - 1) * HK + o_k  # 0c1c0b65: gn = gi[start - 1] = ge[start], both factors <= 1


@kernel
def load_reference_decay(gi, i_start, o_k, m_k, HK, RWKV6, REFERENCE_ROW):
    """`gn`, the reference row that splits the decay between query sub-chunk `i_start..` and earlier keys: RWKV6's
    from the REFERENCE_ROW helper (its queries are exclusive), GLA's the sub-chunk's first row."""
    if RWKV6:
        p_gn = REFERENCE_ROW(gi, i_start, o_k, HK)
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
        # safeguard: rwkv6_diagonal_masked_before_exp
        return tl.where(diag, b_u, tl.where(below, tl.exp(tl.where(below, b_gq - b_gk, 0)), 0))
    # safeguard: gla_diagonal_masked_before_exp
    # mutation: gla_diag_mask_after_exp
    return tl.where(causal, tl.exp(tl.where(causal, b_gq - b_gk, 0)), 0)


@kernel
def diagonal_tile(b_gq, b_gk, b_u, o_c, m_i, RWKV6):
    """[BC, BC, BD] weights of a diagonal sub-chunk block, (query row t, key row s, channel)."""
    causal = ((o_c[:, None] >= o_c[None, :]) & m_i[:, None])[:, :, None]
    diag = (o_c[:, None] == o_c[None, :])[:, :, None] & causal
    return diagonal_weight(b_gq[:, None, :], b_gk[None, :, :], b_u[None, :, :], diag, causal, RWKV6)


@kernel
def load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6):
    """RWKV6's `u [H, K]` row of this head (zeros for GLA, which has none)."""
    if RWKV6:
        return tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    return tl.zeros([BK], dtype=tl.float32)


@kernel
def subchunk(i_tc, T, BT: tl.constexpr, BC: tl.constexpr):
    """Where sub-chunk program `i_tc` sits: its chunk i_t, its index i_i in the chunk, the chunk's first row, its
    own first row, its rows o_i (o_c inside the sub-chunk) and which of them lie before T."""
    NC: tl.constexpr = BT // BC
    i_t, i_i = i_tc // NC, i_tc % NC
    t_first = i_t * BT
    i_start = t_first + i_i * BC
    o_c = tl.arange(0, BC)
    o_i = i_start + o_c
    return i_t, i_i, t_first, i_start, o_c, o_i, o_i < T


@kernel
def channel_block(i_d, o_i, m_i, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """Channel block i_d of rows o_i in a [T, H, D] tensor: channels, their mask, the [rows, channels] mask and
    offsets (relative to the batch-head base)."""
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    return o_d, m_d, m_i[:, None] & m_d[None, :], o_i[:, None] * H * D + o_d[None, :]


@kernel
def rows_from_earlier_subchunks(S, Y, gi, b_gq, i_start, t_first, i_i, o_c, o_d, m_d, m_i, HD: tl.constexpr,
                                SROW: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr, DOT: tl.constexpr,
                                RWKV6: tl.constexpr, REFERENCE_ROW: tl.constexpr = reference_row):
    """`sum_{s in earlier sub-chunks} S[t, s] Y_s exp(gq_t - gi_s)` for the rows t of sub-chunk i: [BC, BD].

    `S` is a `[T, SROW]` score row block (chunk-local columns), `Y` and `gi` rows of width HD, channels o_d.
    """
    b_acc = tl.zeros([BC, BD], dtype=tl.float32)
    if i_i > 0:
        b_gn = load_reference_decay(gi, i_start, o_d, m_d, HD, RWKV6, REFERENCE_ROW)
        for i_j in range(0, i_i):
            o_j = t_first + i_j * BC + o_c  # all rows < i_start < T
            b_y = tl.load(Y + o_j[:, None] * HD + o_d[None, :], mask=m_d[None, :], other=0).to(tl.float32)
            b_gj = tl.load(gi + o_j[:, None] * HD + o_d[None, :], mask=m_d[None, :], other=0)
            b_s = tl.load(S + (i_start + o_c)[:, None] * SROW + (i_j * BC + o_c)[None, :], mask=m_i[:, None],
                          other=0)
            b_acc += mma(b_s, b_y * tl.exp(b_gn[None, :] - b_gj), DOT)  # safeguard: earlier_rows_key_decay
        # safeguard: earlier_rows_query_decay
        b_acc *= tl.exp(tl.where(m_i[:, None] & m_d[None, :], b_gq - b_gn[None, :], 0))
    return b_acc


# The exponent of the later rows' factor exp(gq_t - gn) in `cols_from_later_subchunks` (GSA: `slot_rows_kernel`): a
# helper (b_gq [BC, BD]: gq of the later rows t as loaded, 0 on rows past T; b_gn [1, BD]: the reference; o_j [BC]:
# the rows t; m_d [BD]: the channels that exist; T) -> [BC, BD]. `bug="unmasked_padding"` takes the first helper,
# the default is the second (one blank line apart so `python -m fla_lab bugs` prints both).
@kernel
def later_rows_exponent_unmasked(b_gq, b_gn, o_j, m_d, T):
    # bug: unmasked_padding
    return b_gq - b_gn  # upstream #77, GSA (before 737550ff): rows past T load 0, exp(0 - gn) = inf, times W = 0

@kernel
def later_rows_exponent(b_gq, b_gn, o_j, m_d, T):
    # safeguard: gsa_later_rows_masked
    return tl.where((o_j < T)[:, None] & m_d[None, :], b_gq - b_gn, 0)  # 737550ff: rows past T, exp(0) * 0 = 0


@kernel
def cols_from_later_subchunks(S, W, gi, b_gk, i_start, t_first, i_i, T, o_c, o_d, m_d, m_i, HD: tl.constexpr,
                              SROW: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr, NC: tl.constexpr,
                              DOT: tl.constexpr, RWKV6: tl.constexpr, EXPONENT: tl.constexpr):
    """`sum_{t in later sub-chunks} S[t, s] W_t exp(gq_t - gi_s)` for the rows s of sub-chunk i: [BC, BD].

    The reference is this sub-chunk's last valid row. The loop visits every later sub-chunk of the chunk, so in a
    partial last chunk it meets rows past T, whose decay loads as 0; `EXPONENT` forms `gq_t - gn` for them.
    """
    b_acc = tl.zeros([BC, BD], dtype=tl.float32)
    if i_i + 1 < NC:
        # mutation: gla_dk_reference_row_past_subchunk
        b_gn = tl.load(gi + (tl.minimum(i_start + BC, T) - 1) * HD + o_d, mask=m_d, other=0)
        for i_j in range(i_i + 1, NC):
            o_j = t_first + i_j * BC + o_c
            m_jd = (o_j < T)[:, None] & m_d[None, :]
            b_w = tl.load(W + o_j[:, None] * HD + o_d[None, :], mask=m_jd, other=0).to(tl.float32)
            b_gq = load_query_decay(gi, o_j[:, None], o_d[None, :], m_jd, t_first, HD, RWKV6)
            b_st = tl.load(S + o_j[None, :] * SROW + (i_i * BC + o_c)[:, None], mask=(o_j < T)[None, :], other=0)
            # safeguard: later_rows_query_decay
            b_acc += mma(b_st, b_w * tl.exp(EXPONENT(b_gq, b_gn[None, :], o_j, m_d, T)), DOT)
        # safeguard: later_rows_key_decay
        b_acc *= tl.exp(tl.where(m_i[:, None] & m_d[None, :], b_gn[None, :] - b_gk, 0))
    return b_acc


# ----------------------------------------------------------------------------------------------------------
# Kernels both sides run: cumulative decay, states, plain scores, state adjoints, plain rows, decay gradient


@packed_switch
@kernel
def chunk_cumsum_kernel(g, gi, x, flags, cu_seqlens, chunk_indices, T, H: tl.constexpr, K: tl.constexpr,
                        BT: tl.constexpr, BK: tl.constexpr, VARLEN: tl.constexpr, G_SLOT: tl.constexpr = -1,
                        X_SLOT: tl.constexpr = -1):
    """Chunk-local inclusive cumulative sum of the log-decay, in fp32 (and g's value check: finite, <= 0), plus the
    finite check of `x`, a tensor shaped like g (the key side's keys): k is checked here rather than in the scores
    kernel (docs/performance.md, 'value checks: where k is checked')."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, _ = chunk_of_sequence(i_t, i_b, T, 0, cu_seqlens, chunk_indices, VARLEN)
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m = (o_t < T)[:, None] & (o_k < K)[None, :]
    p = (bos * H + i_h) * K + o_t[:, None] * H * K + o_k[None, :]
    b_g = tl.load(g + p, mask=m, other=0).to(tl.float32)  # safeguard: chunk_cumsum_fp32
    if G_SLOT >= 0:
        or_nonfinite_bit(flags, tl.sum(nonfinite_probe(b_g)), G_SLOT)
        or_positive_decay_bit(flags, tl.max(b_g))
    if X_SLOT >= 0:
        b_x = tl.load(x + p, mask=m, other=0).to(tl.float32)
        or_nonfinite_bit(flags, tl.sum(nonfinite_probe(b_x)), X_SLOT)
    tl.store(gi + p, tl.cumsum(b_g, axis=0), mask=m)


@packed_switch
@kernel
def chunk_fwd_h_kernel(k, v, gi, h, h0, ht, cu_seqlens, chunk_offsets, T, H: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
                       GATE_V: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                       SPLIT_STATES: tl.constexpr, VARLEN: tl.constexpr):
    """The state before every chunk, `h [B, NT, H, K, V]` (accumulated in fp32, stored in h's dtype): the only loop
    over chunks of the forward, one program per (sequence, head, state tile)."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_n, i_h = batch_head(i_bh, H)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    bos, T, NT, boc = sequence_chunks(i_n, T, BT, cu_seqlens, chunk_offsets, VARLEN)
    bos = bos * H + i_h
    k, v = k + bos * K, v + bos * V
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    for i_t in range(0, NT):
        tl.store(h + ((boc + i_t) * H + i_h) * K * V + p_kv, b_h.to(h.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        m_kt, m_tv = m_k[:, None] & m_t[None, :], m_t[:, None] & m_v[None, :]
        # mutation: rwkv6_chunk_key_load_no_other
        b_kt = tl.load(k + o_t[None, :] * H * K + o_k[:, None], mask=m_kt, other=0).to(tl.float32)
        b_v = tl.load(v + o_t[:, None] * H * V + o_v[None, :], mask=m_tv, other=0).to(tl.float32)
        if GATE_V:  # decay each value channel from its step to the chunk end
            b_glast = tl.load(gi + bos * V + t_last * H * V + o_v, mask=m_v, other=0)
            b_g = tl.load(gi + bos * V + o_t[:, None] * H * V + o_v[None, :], mask=m_tv, other=0)
            # safeguard: state_value_decay_to_chunk_end
            b_v *= tl.exp(tl.where(m_tv, b_glast[None, :] - b_g, 0))  # split: GSA's softmax magnifies h's error
            # safeguard: gsa_state_pass_split
            b_h = b_h * tl.exp(b_glast)[None, :] + mma_split(b_kt, b_v, DOT, SPLIT_STATES)
        else:  # decay each key channel from its step to the chunk end
            b_glast = tl.load(gi + bos * K + t_last * H * K + o_k, mask=m_k, other=0)
            b_gt = tl.load(gi + bos * K + o_t[None, :] * H * K + o_k[:, None], mask=m_kt, other=0)
            b_kt *= tl.exp(tl.where(m_kt, b_glast[:, None] - b_gt, 0))  # safeguard: state_key_decay_to_chunk_end
            b_h = b_h * tl.exp(b_glast)[:, None] + mma(b_kt, b_v, DOT)  # mutation: gla_ht_before_last_decay
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@packed_switch
@kernel
def plain_scores_kernel(x, y, A, scale, cu_seqlens, chunk_indices, T, H: tl.constexpr, D: tl.constexpr,
                        BT: tl.constexpr, BD: tl.constexpr, DOT: tl.constexpr, VARLEN: tl.constexpr):
    """`A = scale * x @ y^T` on the causal part of each chunk, diagonal included: the value side's scores
    (x = q, y = k) and the key side's dA (x = do, y = v; RWKV6's bonus reads its diagonal)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, _ = chunk_of_sequence(i_t, i_b, T, 0, cu_seqlens, chunk_indices, VARLEN)
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    bos = bos * H + i_h
    x, y = x + bos * D, y + bos * D
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_d in range(0, tl.cdiv(D, BD)):
        o_d = i_d * BD + tl.arange(0, BD)
        m_d = o_d < D
        b_x = tl.load(x + o_t[:, None] * H * D + o_d[None, :], mask=m_t[:, None] & m_d[None, :], other=0)
        b_yt = tl.load(y + o_t[None, :] * H * D + o_d[:, None], mask=m_d[:, None] & m_t[None, :], other=0)
        b_A += mma(b_x.to(tl.float32), b_yt.to(tl.float32), DOT)
    causal = o_c[:, None] >= o_c[None, :]  # mutation: gsa_value_scores_strict_causal
    p_A = A + bos * BT + o_t[:, None] * H * BT + o_c[None, :]
    tl.store(p_A, tl.where(causal, scale * b_A, 0), mask=m_t[:, None])


@kernel
def boundary_share(b_h, b_dh, bnd, i_c, i_h, i_k, i_v, o_k, o_v, m_k, m_v, H: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATE_V: tl.constexpr):
    """Store this tile's part of `sum(h_{n+1} * dh[n])` over the ungated axis (the boundary term of dg of chunk i_c
    of the batch): `bnd [B, NT, H, NP, D]`, one partial per tile of the ungated axis (NP of them), D the gated
    channels."""
    if GATE_V:
        NP: tl.constexpr = (K + BK - 1) // BK
        p = bnd + ((i_c * H + i_h) * NP + i_k) * V + o_v
        tl.store(p, tl.sum(b_h * b_dh, axis=0), mask=m_v)
    else:
        NP: tl.constexpr = (V + BV - 1) // BV
        p = bnd + ((i_c * H + i_h) * NP + i_v) * K + o_k
        tl.store(p, tl.sum(b_h * b_dh, axis=1), mask=m_k)


@kernel
def boundary_term(bnd, i_c, i_h, o_d, m_d, H: tl.constexpr, D: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr):
    """The boundary term of the decay gradient of chunk i_c of the batch, the NP partials of `boundary_share`
    summed: [BD]."""
    b_bnd = tl.zeros([BD], dtype=tl.float32)
    for i_p in range(0, NP):
        b_bnd += tl.load(bnd + ((i_c * H + i_h) * NP + i_p) * D + o_d, mask=m_d, other=0)
    return b_bnd


@packed_switch
@kernel
def chunk_bwd_dh_kernel(q, do, gi, h, ht, dh, dht, dh0, bnd, scale, cu_seqlens, chunk_offsets, T, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        DOT: tl.constexpr, GATE_V: tl.constexpr, RWKV6: tl.constexpr, USE_DHT: tl.constexpr,
                        STORE_DH0: tl.constexpr, SPLIT_STATES: tl.constexpr,
                        VARLEN: tl.constexpr):
    """State adjoint in reverse: `dh[n]` = dL/dh_{n+1} (the state after chunk n); dh0 = dL/dh_0.

    Also each chunk's boundary term of the decay gradient, `bnd[n] = sum(h_{n+1} * dh[n])` over the ungated axis
    (`boundary_share`): the whole future's share of dg, from the states themselves (see `chunk_bwd_dg_kernel`)."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_n, i_h = batch_head(i_bh, H)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    bos, T, NT, boc = sequence_chunks(i_n, T, BT, cu_seqlens, chunk_offsets, VARLEN)
    bos = bos * H + i_h
    q, do = q + bos * K, do + bos * V
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:  # mutation: gla_dht_dropped_without_h0
        b_dh += tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    b_hn = tl.zeros([BK, BV], dtype=tl.float32)  # the state after the last chunk: ht (dh is 0 there without dht)
    if USE_DHT:
        b_hn += tl.load(ht + i_bh * K * V + p_kv, mask=m_kv, other=0)
    for i_r in range(0, NT):
        i_t = NT - 1 - i_r
        tl.store(dh + ((boc + i_t) * H + i_h) * K * V + p_kv, b_dh, mask=m_kv)
        if i_r > 0:
            b_hn = tl.load(h + ((boc + i_t + 1) * H + i_h) * K * V + p_kv, mask=m_kv, other=0)
        boundary_share(b_hn, b_dh, bnd, boc + i_t, i_h, i_k, i_v, o_k, o_v, m_k, m_v, H, K, V, BK, BV, GATE_V)
        t_first = i_t * BT
        o_t = t_first + tl.arange(0, BT)
        m_t = o_t < T
        t_last = tl.minimum(t_first + BT, T) - 1
        m_kt, m_tv = m_k[:, None] & m_t[None, :], m_t[:, None] & m_v[None, :]
        b_qt = tl.load(q + o_t[None, :] * H * K + o_k[:, None], mask=m_kt, other=0).to(tl.float32)
        b_do = tl.load(do + o_t[:, None] * H * V + o_v[None, :], mask=m_tv, other=0).to(tl.float32)
        if GATE_V:
            b_glast = tl.load(gi + bos * V + t_last * H * V + o_v, mask=m_v, other=0)
            b_do *= tl.exp(tl.load(gi + bos * V + o_t[:, None] * H * V + o_v[None, :], mask=m_tv, other=0))
            b_dh = b_dh * tl.exp(b_glast)[None, :] + scale * mma_split(b_qt, b_do, DOT, SPLIT_STATES)
        else:
            b_glast = tl.load(gi + bos * K + t_last * H * K + o_k, mask=m_k, other=0)
            b_gqt = load_query_decay(gi + bos * K, o_t[None, :], o_k[:, None], m_kt, t_first, H * K, RWKV6)
            b_dh = b_dh * tl.exp(b_glast)[:, None] + scale * mma(b_qt * tl.exp(b_gqt), b_do, DOT)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


@packed_switch
@kernel
def plain_rows_kernel(A, x, y, gi, h, out, alpha, beta, cu_seqlens, chunk_indices, T, NT, H: tl.constexpr,
                      DX: tl.constexpr, DY: tl.constexpr, BT: tl.constexpr, BX: tl.constexpr, BY: tl.constexpr,
                      DOT: tl.constexpr, A_T: tl.constexpr, TO_END: tl.constexpr, H_T: tl.constexpr,
                      VARLEN: tl.constexpr):
    """`out = alpha * op(A) @ x + beta * (y * exp(G)) @ op(h_n)`, one [BT, BX] tile per program, where the decay
    `G` is on y's channels: `gi_t` (from the chunk start) or `gi_last - gi_t` (to the chunk end, TO_END).

    `op(A)` is A or A^T (A_T); the state h is `[DY, DX]`, or `[DX, DY]` read transposed (H_T). The key side's dv
    (A^T @ do + k-to-end @ dh) and the value side's dq (dA @ k + do-from-start @ h^T) and dk (dA^T @ q + v-to-end
    @ dh^T) are all this kernel.
    """
    i_x, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, boc = chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    o_x = i_x * BX + tl.arange(0, BX)
    m_t, m_x = o_t < T, o_x < DX
    m_tx = m_t[:, None] & m_x[None, :]
    bos = bos * H + i_h
    x, y, gi, A = x + bos * DX, y + bos * DY, gi + bos * DY, A + bos * BT
    h += ((boc + i_t) * H + i_h) * DX * DY
    if A_T:
        b_A = tl.load(A + o_t[None, :] * H * BT + o_c[:, None], mask=m_t[None, :], other=0)  # [s, t]
    else:
        b_A = tl.load(A + o_t[:, None] * H * BT + o_c[None, :], mask=m_t[:, None], other=0)
    b_x = tl.load(x + o_t[:, None] * H * DX + o_x[None, :], mask=m_tx, other=0).to(tl.float32)
    b_out = alpha * mma(b_A, b_x, DOT)
    t_last = tl.minimum(i_t * BT + BT, T) - 1
    for i_y in range(0, tl.cdiv(DY, BY)):
        o_y = i_y * BY + tl.arange(0, BY)
        m_y = o_y < DY
        m_ty = m_t[:, None] & m_y[None, :]
        b_y = tl.load(y + o_t[:, None] * H * DY + o_y[None, :], mask=m_ty, other=0).to(tl.float32)
        b_g = tl.load(gi + o_t[:, None] * H * DY + o_y[None, :], mask=m_ty, other=0)
        if TO_END:
            b_glast = tl.load(gi + t_last * H * DY + o_y, mask=m_y, other=0)
            b_y *= tl.exp(tl.where(m_ty, b_glast[None, :] - b_g, 0))  # safeguard: plain_rows_decay_to_chunk_end
        else:
            b_y *= tl.exp(b_g)  # g <= 0, and 0 on rows past T
        if H_T:
            b_h = tl.load(h + o_x[None, :] * DY + o_y[:, None], mask=m_y[:, None] & m_x[None, :], other=0)
        else:
            b_h = tl.load(h + o_y[:, None] * DX + o_x[None, :], mask=m_y[:, None] & m_x[None, :], other=0)
        b_out += beta * mma(b_y, b_h, DOT)
    tl.store(out + bos * DX + o_t[:, None] * H * DX + o_x[None, :], b_out.to(out.dtype.element_ty), mask=m_tx)


@packed_switch
@kernel
def chunk_bwd_dg_kernel(q, k, dq, dk, u, dA, bnd, dg_add, dg, du, dq_cast, dk_cast, cu_seqlens, chunk_indices, T, NT,
                        H: tl.constexpr, K: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        RWKV6: tl.constexpr, ADD: tl.constexpr, WRITERS: tl.constexpr, CAST: tl.constexpr = False,
                        VARLEN: tl.constexpr = False):
    """dg of one chunk: the reverse cumsum of q * dq - k * dk inside it, plus its boundary term; RWKV6's du part.

    The loss depends on the cumulative log-decay G through exp(G_reader - G_writer), so
    dL/dG_t = reader_t * d(reader_t) - writer_t * d(writer_t) on the gated channel, and g_t moves every G from step
    t on: dg_t = sum_{s >= t} of those terms, plus the final state's share. Everything past the chunk's end is
    what scaling the state h_{n+1} after it would change: `bnd[n] = sum(h_{n+1} * dh[n])` (from
    `chunk_bwd_dh_kernel`, NP partials). So no sum runs longer than a chunk: a cumulative sum over the whole sequence
    of q * dq - k * dk cancels to a small dg and keeps every rounding of dq and dk (docs/performance.md, 'decay
    gradient per chunk').
    Key side: readers q, writers k. Value side: readers are the outputs o (every term of o_t carries exp(G_t)),
    writers v. RWKV6's bonus terms cancel in q * dq - k * dk; its queries read G_{t-1}, so a step's own query term
    (state path: dq minus the bonus u * k_t * dA[t, t]) leaves its dg. `dg_add` (ADD) is another pass's dg to add.
    WRITERS=False leaves the writer term out (GSA: both passes write the slots s, whose gradient is summed first).
    CAST also stores dq (and dk with WRITERS) in dg's dtype to dq_cast, dk_cast: the op's 16-bit gradients.
    """
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, i_t, boc = chunk_of_sequence(i_t, i_b, T, NT, cu_seqlens, chunk_indices, VARLEN)
    HK: tl.constexpr = H * K
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    o_c = tl.arange(0, BT)
    bos = bos * H + i_h
    b_bnd = boundary_term(bnd, boc + i_t, i_h, o_k, m_k, H, K, NP, BK)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    m = m_t[:, None] & m_k[None, :]
    p = bos * K + o_t[:, None] * HK + o_k[None, :]
    b_q = tl.load(q + p, mask=m, other=0).to(tl.float32)
    b_dq = tl.load(dq + p, mask=m, other=0).to(tl.float32)
    b_qdq = b_q * b_dq
    b_x = b_qdq
    if CAST:
        tl.store(dq_cast + p, b_dq.to(dq_cast.dtype.element_ty), mask=m)
    if WRITERS:
        b_dk = tl.load(dk + p, mask=m, other=0).to(tl.float32)
        b_x -= tl.load(k + p, mask=m, other=0).to(tl.float32) * b_dk
        if CAST:
            tl.store(dk_cast + p, b_dk.to(dk_cast.dtype.element_ty), mask=m)
    b_dg = b_bnd[None, :] + tl.cumsum(b_x, axis=0, reverse=True)
    if RWKV6:
        b_k = tl.load(k + p, mask=m, other=0).to(tl.float32)
        b_dAd = tl.load(dA + bos * BT + o_t * H * BT + o_c, mask=m_t, other=0)  # scale * do_t . v_t
        b_qkd = b_q * b_k * b_dAd[:, None]
        b_dg -= b_qdq - load_bonus(u, i_h, o_k, m_k, K, BK, RWKV6)[None, :] * b_qkd
        tl.store(du + ((boc + i_t) * H + i_h) * K + o_k, tl.sum(b_qkd, axis=0), mask=m_k)
    if ADD:
        b_dg += tl.load(dg_add + p, mask=m, other=0).to(tl.float32)
    tl.store(dg + p, b_dg.to(dg.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------------------
# Their launchers (fp32 intermediates; tiles and warps from a validated `ChunkLaunch`)


def empty_f32(x, *shape):
    return torch.empty(*shape, dtype=torch.float32, device=x.device)


def dot_of(launch: ChunkLaunch, x: torch.Tensor):
    """The kernels' DOT for a call on x (`launch.Precision.dot`)."""
    return launch.precision.dot(x)


def dot_operand_dtype(launch: ChunkLaunch, x: torch.Tensor) -> torch.dtype:
    """`dot_of` as a torch dtype: a tensor read only as a `tl.dot` operand loses nothing stored in it."""
    return {tl.float32: torch.float32, tl.bfloat16: torch.bfloat16, tl.float16: torch.float16}[dot_of(launch, x)]


def check_slot(checks, name: str) -> int:
    """A check's slot in `checks` (a `contract.KernelChecks` or None): -1 without."""
    return -1 if checks is None else checks.slot(name)


def check_flags(checks):
    return None if checks is None else checks.flags


def chunks(T: int, BT: int, seqs: Packed | None) -> int:
    """Chunks per batch row: T's in a dense batch, every sequence's together in a packed one (`seqs`)."""
    return grid_size(T, BT) if seqs is None else seqs.NT


def sequences(B: int, seqs: Packed | None) -> int:
    return B if seqs is None else seqs.N


def chunk_tables(seqs: Packed | None):
    """The per-chunk kernels' packed-batch arguments: `cu_seqlens, chunk_indices` (None, None when dense)."""
    return (None, None) if seqs is None else (seqs.cu_seqlens, seqs.chunk_indices)


def sequence_tables(seqs: Packed | None):
    """The per-sequence kernels' packed-batch arguments: `cu_seqlens, chunk_offsets` (None, None when dense)."""
    return (None, None) if seqs is None else (seqs.cu_seqlens, seqs.chunk_offsets)


def chunk_cumsum(g: torch.Tensor, BT: int, checks=None, name="g", also=None, also_name="k",
                 seqs: Packed | None = None) -> torch.Tensor:
    """Chunk-local inclusive cumulative log-decay, fp32, same shape as g. `checks` (`contract.KernelChecks`):
    g's value check, under the argument name `name`, in the same pass, and that of `also` (a tensor shaped like g,
    argument name `also_name`) when given. `seqs`: a packed batch's tables (`conventions.Packed`), else dense."""
    B, T, H, D = g.shape
    gi = empty_f32(g, B, T, H, D)
    BD = tile_width(D)
    chunk_cumsum_kernel[(grid_size(D, BD), chunks(T, BT, seqs), B * H)](
        g, gi, also, check_flags(checks), *chunk_tables(seqs), T, H=H, K=D, BT=BT, BK=BD,
        G_SLOT=check_slot(checks, name), X_SLOT=-1 if also is None else check_slot(checks, also_name))
    return gi


def forward_states(k, v, gi, h0, output_final_state, BT, launch, gate_v, seqs=None, h_dtype=torch.float32):
    """h, the state before each chunk (in `h_dtype`), and the final state (fp32) when asked for."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    BK, N = tile_width(K), sequences(B, seqs)
    BV = launch.state_width(k, V, H, seqs)
    h = torch.empty(B, chunks(T, BT, seqs), H, K, V, dtype=h_dtype, device=k.device)
    ht = empty_f32(k, N, H, K, V) if output_final_state else None
    chunk_fwd_h_kernel[(grid_size(K, BK), grid_size(V, BV), N * H)](
        k, v, gi, h, h0, ht, *sequence_tables(seqs), T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, DOT=dot_of(launch, k),
        SPLIT_STATES=launch.precision.split_states, GATE_V=gate_v, USE_H0=h0 is not None, STORE_HT=output_final_state,
        num_warps=launch.state_warps, num_stages=launch.state_stages)
    return h, ht


def state_adjoints(q, do, gi, h, ht, dht, need_dh0, scale, BT, launch, gate_v, rwkv6=False, seqs=None):
    """dh (the adjoint of the state after each chunk), dh0, and each chunk's boundary term of dg, `bnd
    [B, NT, H, NP, D]` (D the gated channels, NP partials over the other axis); `h`, `ht`: the forward's states."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    BK, NT, N = tile_width(K), chunks(T, BT, seqs), sequences(B, seqs)
    BV = launch.state_width(q, V, H, seqs)
    dh = empty_f32(q, B, NT, H, K, V)
    dh0 = empty_f32(q, N, H, K, V) if need_dh0 else None
    if dht is not None and ht is None:
        raise RuntimeError("state_adjoints: a final-state cotangent needs the final state (its share of dg)")
    bnd = empty_f32(q, B, NT, H, grid_size(K, BK), V) if gate_v else empty_f32(q, B, NT, H, grid_size(V, BV), K)
    chunk_bwd_dh_kernel[(grid_size(K, BK), grid_size(V, BV), N * H)](
        q, do, gi, h, ht, dh, dht, dh0, bnd, scale, *sequence_tables(seqs), T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
        DOT=dot_of(launch, q), SPLIT_STATES=launch.precision.split_states, GATE_V=gate_v, RWKV6=rwkv6,
        USE_DHT=dht is not None, STORE_DH0=need_dh0,
        num_warps=launch.state_warps, num_stages=launch.state_stages)
    return dh, dh0, bnd


def plain_scores(x, y, scale, BT, launch, seqs=None):
    B, T, H, D = x.shape
    A = empty_f32(x, B, T, H, BT)
    plain_scores_kernel[(chunks(T, BT, seqs), B * H)](x, y, A, scale, *chunk_tables(seqs), T, H=H, D=D, BT=BT,
                                                         BD=tile_width(D), DOT=dot_of(launch, x))
    return A


def plain_rows(A, x, y, gi, h, alpha, beta, BT, launch, *, transpose_A, to_end, transpose_h, dtype=torch.float32,
               seqs=None):
    """`alpha * op(A) @ x + beta * (y * exp(G)) @ op(h)` (see `plain_rows_kernel`), `[B, T, H, DX]` in `dtype`."""
    B, T, H, DX = x.shape
    DY = y.shape[-1]
    out = torch.empty(B, T, H, DX, dtype=dtype, device=x.device)
    BX, NT = tile_width(DX), chunks(T, BT, seqs)
    plain_rows_kernel[(grid_size(DX, BX), NT, B * H)](
        A, x, y, gi, h, out, alpha, beta, *chunk_tables(seqs), T, NT, H=H, DX=DX, DY=DY, BT=BT, BX=BX,
        BY=tile_width(DY), DOT=dot_of(launch, x), A_T=transpose_A, TO_END=to_end, H_T=transpose_h)
    return out


def decay_grad(readers, d_readers, writers, d_writers, bnd, BT, launch, dtype, u=None, dA=None, add=None,
               cast_dtype=torch.float32, seqs=None):
    """dg (and RWKV6's du) from the closed form in `chunk_bwd_dg_kernel`, plus `add` (another pass's dg);
    `bnd`: the boundary terms from `state_adjoints`; `d_writers=None` leaves the writer term out.
    Returns `(dg, du, d_readers, d_writers)`, the last two in `cast_dtype`: a 16-bit one is written by the same
    kernel, which reads the fp32 gradients anyway (no separate cast pass)."""
    B, T, H, D = readers.shape
    NT = chunks(T, BT, seqs)
    # in place over `add` when it can hold the result: each element is read and written by the same program
    dg = add if add is not None and add.dtype == dtype else torch.empty(B, T, H, D, dtype=dtype, device=readers.device)
    du = empty_f32(readers, B, NT, H, D) if u is not None else None  # one part per chunk, summed below
    cast = cast_dtype != d_readers.dtype
    dr_cast = torch.empty_like(d_readers, dtype=cast_dtype) if cast else d_readers
    dw_cast = torch.empty_like(d_writers, dtype=cast_dtype) if cast and d_writers is not None else d_writers
    chunk_bwd_dg_kernel[(grid_size(D, launch.dg_BK), NT, B * H)](
        readers, writers, d_readers, d_writers, u, dA, bnd, add, dg, du, dr_cast, dw_cast, *chunk_tables(seqs), T,
        NT, H=H, K=D, NP=bnd.shape[3], BT=BT, BK=launch.dg_BK, RWKV6=u is not None, ADD=add is not None,
        WRITERS=d_writers is not None, CAST=cast)
    return dg, (du.sum((0, 1)) if u is not None else None), dr_cast, dw_cast


# chunk_rwkv6's slot: the REFERENCE_ROW of `gated_scores_kernel` and `chunk_bwd_dqk_kernel` (ops/gla/chunk.py)
REFERENCE_ROW_SLOT = Slot("chunk_rwkv6", "REFERENCE_ROW", reference_row, reference_row_inclusive, "exclusive_reference")

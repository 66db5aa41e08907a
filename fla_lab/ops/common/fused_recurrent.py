"""The fused recurrent kernels of RWKV6, GLA and both passes of GSA: one time step per loop iteration, the state in
registers (as FLA's fla/ops/common/fused_recurrent.py, which its GLA and RWKV6 ops share). The ops are in their
families' files (`rwkv6/`, `gla/`, `gsa/fused_recurrent.py`). Top to bottom: the forward kernel, the backward
kernels (#18's initial-state mask is the dq kernel's H0_MASK slot), their launchers `fused_recurrent_fwd` and
`fused_recurrent_bwd` (`decay_and_bonus_grads`: the backward's fallback for several value blocks), the autograd
function. Tiles and warps: `RecurrentLaunch` (`fla_lab.ops.common.launch`).

Packed batches (`cu_seqlens`, FLA's varlen): every kernel runs once for the whole batch, as FLA's. With VARLEN the
grid's batch axis runs over the N sequences, a program steps through its own sequence's rows (`sequence_rows`) and
indexes the `[N, H, K, V]` states by sequence; an empty sequence runs no step (its state passes through).

GLA and RWKV6 differ in one constexpr, `RWKV6`: RWKV6 reads the state *before* this step's decay and adds the
bonus `diag(u) k_t v_t^T` for the current token; GLA reads the state after the update. GLA's state may decay on
either side, `S_t = diag(exp gk_t) S_{t-1} diag(exp gv_t) + k_t v_t^T` (GATE_K, GATE_V: GSA's first pass gates
the value side only).
"""
from __future__ import annotations

import torch
import triton.language as tl

from fla_lab.ops.common.launch import RecurrentLaunch
from fla_lab.ops.common.utils import (as_contiguous, batch_head, cast_grad, custom_bwd, custom_fwd, grid_size,
                                      kernel, next_pow2, packed_switch, sequence_rows, state_tile)


@packed_switch
@kernel
def fused_recurrent_fwd_kernel(q, k, v, g, gv, u, o, h0, ht, scale, cu_seqlens, B, T,
                               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                               BK: tl.constexpr, BV: tl.constexpr, RWKV6: tl.constexpr, GATE_K: tl.constexpr,
                               GATE_V: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                               SPLIT_K: tl.constexpr, VARLEN: tl.constexpr):
    """One program per (value block, key block, sequence * head): B * T rows dense; packed (VARLEN, B = 1), the
    batch axis runs over the sequences of `cu_seqlens` and each program steps through its own sequence's rows."""
    i_v, i_bh = tl.program_id(0), tl.program_id(2)
    # i_k constant with one key block, so the key masks fold away: docs/performance.md, 'fused_recurrent_rwkv6: SPLIT_K'
    i_k = tl.program_id(1) if SPLIT_K else 0
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T_seq = sequence_rows(i_b, T, cu_seqlens, VARLEN)  # T stays the batch's rows: the partials' stride
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    o += i_k * B * T * H * V  # this key block's partial output, [NK, B, T, H, V]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)  # key-major state tile, fp32
    if USE_H0:  # mutation: rwkv6_fused_h0_only_with_ht
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    if RWKV6:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_g = tl.zeros([BK], dtype=tl.float32)  # no key-side gate: exp(0) = 1
    for t in range(0, T_seq):
        row = (bos + t) * H + i_h
        if GATE_V:  # GLA only (the decay before the read): it commutes with the key side's below
            b_h *= value_decay(gv, row, o_v, m_v, V)[None, :]
        b_q = tl.load(q + row * K + o_k, mask=m_k, other=0).to(tl.float32) * scale
        b_k = tl.load(k + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        if GATE_K:
            b_g = tl.load(g + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(v + row * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_kv = b_k[:, None] * b_v[None, :]
        if RWKV6:  # read S_{t-1} plus the bonus, then decay and write
            b_o = tl.sum((b_h + b_u[:, None] * b_kv) * b_q[:, None], axis=0)  # mutation: rwkv6_fused_bonus_dropped
            b_h = b_h * tl.exp(b_g)[:, None] + b_kv
        else:  # decay and write, then read S_t
            b_h = b_h * tl.exp(b_g)[:, None] + b_kv
            b_o = tl.sum(b_h * b_q[:, None], axis=0)
        tl.store(o + row * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


# The mask of the dq kernel's initial-state load, for its H0_MASK slot: `bug="transposed_h0_mask"` takes the first
# helper, the default is the second (kept one blank line apart so `python -m fla_lab bugs` prints both).
@kernel
def h0_mask_transposed(m_k, m_v):
    # bug: transposed_h0_mask
    return m_k[:, None] & m_v[None, :]  # upstream #18 (before 1547448b): key-major [BK, BV] mask

@kernel
def h0_mask(m_k, m_v):
    return m_v[:, None] & m_k[None, :]  # fixed: the mask has the pointer tile's own [BV, BK] shape


@kernel
def value_decay(gv, row, o_v, m_v, V: tl.constexpr):
    """exp(gv_t) of one value block: the value-side decay of GATE_V (GLA-mode only)."""
    return tl.exp(tl.load(gv + row * V + o_v, mask=m_v, other=0).to(tl.float32))


# Backward, as upstream structures it (and as bug #18 needs): a `dq` kernel that replays the recurrence forward
# with a value-major `[BV, BK]` state tile, and a `dkv` kernel that runs the state adjoint backwards in time with
# a key-major `[BK, BV]` tile. When one value block covers V, the dkv kernel's dk_t is complete, so it also reads
# dq_t (the dq kernel runs first), accumulates the key-side decay gradient dg (a reverse cumulative sum) in
# registers and adds the RWKV6 bonus terms: no extra pass over [B, T, H, K]. With several value blocks (V larger
# than `RecurrentLaunch.dkv_BV`) the same quantities come from `decay_and_bonus_grads` over the summed partials: dg's
# reverse cumulative sum in `decay_grad_kernel` (it must stop at a packed batch's sequence boundaries), the bonus in
# torch.
# The value-side decay gradient (GATE_V) is that kernel's other side.
@packed_switch
@kernel
def fused_recurrent_bwd_dq_kernel(k, v, g, gv, do, dq, h0, scale, cu_seqlens, B, T,
                                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                  BK: tl.constexpr, BV: tl.constexpr, RWKV6: tl.constexpr, GATE_K: tl.constexpr,
                                  GATE_V: tl.constexpr, USE_H0: tl.constexpr, H0_MASK: tl.constexpr = h0_mask,
                                  VARLEN: tl.constexpr = False):
    """dq_t = scale * S S do_t (S_t for GLA, S_{t-1} for RWKV6), one partial sum per value block.
    H0_MASK(m_k, m_v): a `@triton.jit` helper that returns the mask of the initial-state load."""
    i_v, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T_seq = sequence_rows(i_b, T, cu_seqlens, VARLEN)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    b_h = tl.zeros([BV, BK], dtype=tl.float32)  # the state tile
    if USE_H0:
        p_h0 = h0 + i_bh * K * V + o_k[None, :] * V + o_v[:, None]  # h0: [K, V] per head
        b_h += tl.load(p_h0, mask=H0_MASK(m_k, m_v), other=0).to(tl.float32)
    b_g = tl.zeros([BK], dtype=tl.float32)
    for t in range(0, T_seq):
        row = (bos + t) * H + i_h
        b_k = tl.load(k + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        if GATE_K:
            b_g = tl.load(g + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        if GATE_V:  # GLA-mode: decays before the read, like the key side below
            b_h *= value_decay(gv, row, o_v, m_v, V)[:, None]
        b_v = tl.load(v + row * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_do = tl.load(do + row * V + o_v, mask=m_v, other=0).to(tl.float32)
        if RWKV6:
            b_dq = tl.sum(b_h * b_do[:, None], axis=0) * scale
            b_h = b_h * tl.exp(b_g)[None, :] + b_v[:, None] * b_k[None, :]
        else:
            b_h = b_h * tl.exp(b_g)[None, :] + b_v[:, None] * b_k[None, :]
            b_dq = tl.sum(b_h * b_do[:, None], axis=0) * scale
        tl.store(dq + (i_v * B * T * H + row) * K + o_k, b_dq, mask=m_k)


@kernel
def rwkv6_bonus_grads(b_q, b_k, b_v, b_do, b_u, b_dq, b_dk, b_dv, scale):
    """The bonus path o_t += (q_t . u k_t)(v_t): its dq (q unscaled), dk, dv, and du's per-step term (b_q scaled)."""
    b_dov = tl.sum(b_do * b_v, axis=0)  # do_t . v_t over the whole value dimension (one value block)
    b_dq += scale * b_u * b_k * b_dov
    b_dk += b_u * b_q * b_dov
    b_dv += tl.sum(b_q * b_u * b_k, axis=0) * b_do  # this key block's share; dv's key partials add up the rest
    return b_dq, b_dk, b_dv, b_q * b_k * b_dov


@packed_switch
@kernel
def fused_recurrent_bwd_dkv_kernel(q, k, v, g, gv, u, do, dq, dk, dv, dg, du, ht, dht, dh0, scale, cu_seqlens, B, T,
                                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                   BK: tl.constexpr, BV: tl.constexpr, RWKV6: tl.constexpr,
                                   GATE_K: tl.constexpr, GATE_V: tl.constexpr,
                                   USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                                   FUSE_DG: tl.constexpr, DG_HT: tl.constexpr, VARLEN: tl.constexpr):
    """The state adjoint dS runs backwards in time; dk_t = dS v_t and dv_t = dS^T k_t (partial sums per block).

    FUSE_DG (one value block, so dk_t is complete): also dg_t = sum_{s>=t}(q_s dq_s - k_s dk_s) + rowsum(ht dht)
    from the state-path dq and dk (RWKV6's query term one step later: it reads S_{t-1}), then the RWKV6 bonus is
    added to dq, dk, dv, and du's partial for this (sequence, head) is stored. Same semantics as
    `decay_and_bonus_grads`. Packed (VARLEN): every sum runs over the program's own sequence only."""
    i_v, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T_seq = sequence_rows(i_b, T, cu_seqlens, VARLEN)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    b_dg_sum = tl.zeros([BK], dtype=tl.float32)  # reverse cumulative sum of q dq - k dk
    b_qdq_later = tl.zeros([BK], dtype=tl.float32)  # RWKV6: q_{t+1} dq_{t+1}, the query term dg_t receives
    b_dg_final = tl.zeros([BK], dtype=tl.float32)  # rowsum(ht * dht): G_{T-1} reaches the final state
    if DG_HT:
        b_dg_final += tl.sum(tl.load(ht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32) * b_dh, axis=1)
    if RWKV6:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_du = tl.zeros([BK], dtype=tl.float32)
    b_g = tl.zeros([BK], dtype=tl.float32)
    for i in range(0, T_seq):
        t = T_seq - 1 - i
        row = (bos + t) * H + i_h
        b_q_raw = tl.load(q + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_q = b_q_raw * scale
        b_k = tl.load(k + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        if GATE_K:
            b_g = tl.load(g + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(v + row * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_do = tl.load(do + row * V + o_v, mask=m_v, other=0).to(tl.float32)
        if not RWKV6:  # o_t reads S_t, so its adjoint joins before k_t v_t^T is differentiated
            b_dh += b_q[:, None] * b_do[None, :]
        b_dk = tl.sum(b_dh * b_v[None, :], axis=1)
        b_dv = tl.sum(b_dh * b_k[:, None], axis=0)
        if FUSE_DG:
            p_dq = dq + row * K + o_k  # complete (summed over the dq kernel's value blocks), state path only
            b_dq = tl.load(p_dq, mask=m_k, other=0).to(tl.float32)
            if RWKV6:
                b_dg_sum += b_qdq_later - b_k * b_dk
                b_qdq_later = b_q_raw * b_dq
            else:
                b_dg_sum += b_q_raw * b_dq - b_k * b_dk
            tl.store(dg + row * K + o_k, b_dg_sum + b_dg_final, mask=m_k)
            if RWKV6:  # the bonus has no decay: after dg, which takes the state-path dq and dk
                b_dq, b_dk, b_dv, b_du_t = rwkv6_bonus_grads(b_q, b_k, b_v, b_do, b_u, b_dq, b_dk, b_dv, scale)
                b_du += b_du_t
                tl.store(p_dq, b_dq, mask=m_k)
        tl.store(dk + (i_v * B * T * H + row) * K + o_k, b_dk, mask=m_k)
        tl.store(dv + (i_k * B * T * H + row) * V + o_v, b_dv, mask=m_v)
        b_dh = b_dh * tl.exp(b_g)[:, None]
        if GATE_V:
            b_dh *= value_decay(gv, row, o_v, m_v, V)[None, :]
        if RWKV6:  # o_t reads S_{t-1}
            b_dh += b_q[:, None] * b_do[None, :]
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)
    if FUSE_DG and RWKV6:
        tl.store(du + i_bh * K + o_k, b_du, mask=m_k)  # [B or N, H, K]: summed over the batch in torch


@kernel
def decay_grad_rows(a, da, b, db, dg, b_dg, o_c, m_c, bos, T_seq, i_h, H: tl.constexpr, C: tl.constexpr,
                    SHIFT: tl.constexpr):
    """The reverse cumulative sum of `decay_grad_kernel` over one sequence's rows (C channels per row), from b_dg."""
    b_later = tl.zeros_like(b_dg)  # SHIFT: a_{t+1} da_{t+1}; none past the sequence's last row
    for i in range(0, T_seq):
        p_c = ((bos + T_seq - 1 - i) * H + i_h) * C + o_c
        b_a = tl.load(a + p_c, mask=m_c, other=0).to(tl.float32)
        b_da = tl.load(da + p_c, mask=m_c, other=0).to(tl.float32)
        b_b = tl.load(b + p_c, mask=m_c, other=0).to(tl.float32)
        if SHIFT:
            b_dg += b_later - b_b * tl.load(db + p_c, mask=m_c, other=0).to(tl.float32)
            b_later = b_a * b_da
        else:
            b_dg += b_a * b_da - b_b * tl.load(db + p_c, mask=m_c, other=0).to(tl.float32)
        tl.store(dg + p_c, b_dg, mask=m_c)


@packed_switch
@kernel
def decay_grad_kernel(a, da, b, db, ht, dht, dg, cu_seqlens, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, KEY_SIDE: tl.constexpr, SHIFT: tl.constexpr,
                      USE_DHT: tl.constexpr, VARLEN: tl.constexpr):
    """A decay gradient, one program per (channel block, sequence * head), as a reverse cumulative sum over the
    program's own sequence: dg_t = sum_{s>=t}(a_{s+SHIFT} da_{s+SHIFT} - b_s db_s) + the final state's term.

    Value side (GATE_V; a, da, b, db = o, do, v, dv over V): dgv_t = sum_{s>=t}(o_s do_s - v_s dv_s) + colsum(ht dht).
    With Gv the cumulative value-side log-decay, o_s[j] holds exp(Gv_s[j]) in every term (the query side), v_s[j]
    enters every later output and the final state with exp(-Gv_s[j]) (the key side), and the final state holds
    exp(Gv_{T-1}[j]) in every term. `o` is the op's (scaled) output, `dv` the complete gradient of v.
    Key side (KEY_SIDE; a, da, b, db = q, dq, k, dk over K, the state-path gradients): the dkv kernel's FUSE_DG sum
    with rowsum(ht dht), for several value blocks; SHIFT (RWKV6, whose query reads S_{t-1}) takes the query term
    one row later."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T_seq = sequence_rows(i_b, T, cu_seqlens, VARLEN)
    if KEY_SIDE:
        b_dg = tl.zeros([BK], dtype=tl.float32)
        if USE_DHT:
            for i_v in range(0, tl.cdiv(V, BV)):
                o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_c, i_v, K, V, BK, BV)
                b_ht = tl.load(ht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
                b_dg += tl.sum(b_ht * tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32), axis=1)
        o_k = i_c * BK + tl.arange(0, BK)
        decay_grad_rows(a, da, b, db, dg, b_dg, o_k, o_k < K, bos, T_seq, i_h, H, K, SHIFT)
    else:
        b_dg = tl.zeros([BV], dtype=tl.float32)
        if USE_DHT:
            for i_k in range(0, tl.cdiv(K, BK)):
                o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_c, K, V, BK, BV)
                b_ht = tl.load(ht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
                b_dg += tl.sum(b_ht * tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32), axis=0)
        o_v = i_c * BV + tl.arange(0, BV)
        decay_grad_rows(a, da, b, db, dg, b_dg, o_v, o_v < V, bos, T_seq, i_h, H, V, SHIFT)


def _sequences(B: int, seqs):
    """Batch size of the grid and the kernels' offsets: (B, None) dense, (N, cu_seqlens) packed, where one program per
    (sequence, head) runs over that sequence's rows."""
    return (B, None) if seqs is None else (seqs.N, seqs.cu_seqlens)


def fused_recurrent_fwd(q, k, v, g, u, scale, h0, output_final_state, launch: RecurrentLaunch, gv=None, o_dtype=None,
                        seqs=None):
    """`g` (key side) and `gv` (value side, GLA-mode only) may each be None: no decay on that side. The output in
    `o_dtype` (default q's). `seqs`: a packed batch (`conventions.Packed`: B = 1, states `[N, H, K, V]`)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    N, cu_seqlens = _sequences(B, seqs)
    o_dtype = q.dtype if o_dtype is None else o_dtype
    BK, BV, warps = launch.forward_tiles(q, V, seqs)
    NK = grid_size(K, BK)
    # one key block writes the output in place; several write fp32 partials (each a sum over its keys) to add up
    o = torch.empty(NK, B, T, H, V, dtype=o_dtype if NK == 1 else torch.float32, device=q.device)
    ht = q.new_empty(N, H, K, V, dtype=torch.float32) if output_final_state else None
    fused_recurrent_fwd_kernel[(grid_size(V, BV), NK, N * H)](
        q, k, v, g, gv, u, o, h0, ht, scale, cu_seqlens, B, T, H=H, K=K, V=V, BK=BK, BV=BV, RWKV6=u is not None,
        GATE_K=g is not None, GATE_V=gv is not None, USE_H0=h0 is not None, STORE_HT=output_final_state,
        SPLIT_K=NK > 1, num_warps=warps)
    return sum_partials(o).to(o_dtype), ht


def sum_partials(x):
    """Sum a kernel's per-block partials over axis 0; one block is already the sum (a view, no copy)."""
    return x[0] if x.shape[0] == 1 else x.sum(0)


def fused_recurrent_bwd(q, k, v, g, u, scale, h0, ht, do, dht, launch: RecurrentLaunch, h0_mask_fn, gv=None, o=None,
                        seqs=None):
    """dq, dk, dv, dg, du, dh0 and dgv (None where the input is): `o`, the forward's output, only with `gv`.
    `h0_mask_fn`: the dq kernel's H0_MASK helper. `seqs`: a packed batch, as `fused_recurrent_fwd`.

    The dkv kernel's state tile is at most [dkv_BK, dkv_BV]. One value block (V <= dkv_BV) keeps dg and the RWKV6
    bonus inside the kernel; more key blocks keep that too (dg is per key, dv's key partials are summed), at the
    cost of one [NK, B, T, H, V] sum."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    N, cu_seqlens = _sequences(B, seqs)
    rwkv6 = u is not None
    gates = dict(GATE_K=g is not None, GATE_V=gv is not None)
    f32 = dict(dtype=torch.float32, device=q.device)
    BKq, BVq = launch.dq_BK, launch.dq_BV
    NVq = grid_size(V, BVq)
    dq = torch.empty(NVq, B, T, H, K, **f32)
    fused_recurrent_bwd_dq_kernel[(NVq, grid_size(K, BKq), N * H)](
        k, v, g, gv, do, dq, h0, scale, cu_seqlens, B, T, H=H, K=K, V=V, BK=BKq, BV=BVq, RWKV6=rwkv6, **gates,
        USE_H0=h0 is not None, H0_MASK=h0_mask_fn, num_warps=launch.dq_warps)
    dq = sum_partials(dq)  # the dkv kernel reads the complete dq_t
    BK, BV = min(next_pow2(K), launch.dkv_BK), min(next_pow2(V), launch.dkv_BV)
    NK, NV = grid_size(K, BK), grid_size(V, BV)
    # each program holds all of V: its dk_t is complete, so dg and the bonus fit in the kernel
    fuse_dg = NV == 1 and g is not None
    dg_ht = dht is not None and ht is not None
    dk, dv = torch.empty(NV, B, T, H, K, **f32), torch.empty(NK, B, T, H, V, **f32)
    dg = torch.empty(B, T, H, K, **f32) if fuse_dg else None
    du = torch.empty(N, H, K, **f32) if fuse_dg and rwkv6 else None
    dh0 = torch.empty(N, H, K, V, **f32) if h0 is not None else None
    fused_recurrent_bwd_dkv_kernel[(NV, NK, N * H)](
        q, k, v, g, gv, u, do, dq, dk, dv, dg, du, ht, dht, dh0, scale, cu_seqlens, B, T, H=H, K=K, V=V, BK=BK,
        BV=BV, RWKV6=rwkv6, **gates, USE_DHT=dht is not None, STORE_DH0=h0 is not None, FUSE_DG=fuse_dg,
        DG_HT=fuse_dg and dg_ht, num_warps=launch.dkv_warps)
    dk, dv = sum_partials(dk), sum_partials(dv)
    dgv = value_decay_grad(o, do, v, dv, ht, dht, launch, seqs) if gv is not None else None
    if fuse_dg:
        return dq, dk, dv, dg, (du.sum(0) if rwkv6 else None), dh0, dgv
    dg, du = (decay_and_bonus_grads(q, k, v, u, scale, dq, dk, dv, do, ht, dht, launch, seqs) if g is not None
              else (None, None))
    return dq, dk, dv, dg, du, dh0, dgv


def _decay_grad(a, da, b, db, ht, dht, key_side: bool, shift: bool, launch: RecurrentLaunch, seqs):
    """`decay_grad_kernel` over `[B, T, H, C]` rows: the key side (C = K) or the value side (C = V) of the state."""
    B, T, H, C = a.shape
    N, cu_seqlens = _sequences(B, seqs)
    use_dht = dht is not None and ht is not None
    K, V = tuple(ht.shape[-2:]) if use_dht else (C, C)  # the final state's other side (only with its cotangent)
    BK = min(next_pow2(K), launch.dkv_BK) if key_side else launch.dkv_BK
    BV = min(next_pow2(V), launch.dkv_BV)
    dg = torch.empty(B, T, H, C, dtype=torch.float32, device=a.device)
    decay_grad_kernel[(grid_size(C, BK if key_side else BV), N * H)](
        a, da, b, db, ht, dht, dg, cu_seqlens, T, H=H, K=K, V=V, BK=BK, BV=BV, KEY_SIDE=key_side, SHIFT=shift,
        USE_DHT=use_dht)
    return dg


def value_decay_grad(o, do, v, dv, ht, dht, launch: RecurrentLaunch, seqs=None):
    """GATE_V's decay gradient (`decay_grad_kernel`'s value side)."""
    return _decay_grad(o, do, v, dv, ht, dht, key_side=False, shift=False, launch=launch, seqs=seqs)


def decay_and_bonus_grads(q, k, v, u, scale, dq, dk, dv, do, ht, dht, launch: RecurrentLaunch, seqs=None):
    """The fallback of the dkv kernel's FUSE_DG path for several value blocks, on top of the summed state-path
    gradients (updates dq, dk, dv in place for the RWKV6 bonus).

    With G the cumulative log-decay, the output depends on G through exp(G_query - G_key), so
    dL/dG_t = q_t * dq_t (query side) - k_t * dk_t (key side), and dg is its reverse cumulative sum over the
    sequence (`decay_grad_kernel`, which stops at a packed batch's sequence boundaries). RWKV6's query side is
    exclusive (G_{t-1}), which shifts its term by one step. The final state depends on G_{T-1} as a whole:
    rowsum(ht * dht) joins every step. The bonus path has no decay and is added after, row by row (du sums over
    every row of the batch).
    """
    dg = _decay_grad(q, dq, k, dk, ht, dht, key_side=True, shift=u is not None, launch=launch, seqs=seqs)
    du = None
    if u is not None:
        qf, kf = q.float(), k.float()
        dov = (do.float() * v.float()).sum(-1, keepdim=True)  # do_t . v_t
        uf = u.float()[None, None]
        dq += scale * uf * kf * dov
        dk += scale * uf * qf * dov
        dv += scale * (qf * uf * kf).sum(-1, keepdim=True) * do.float()
        du = scale * (qf * kf * dov).sum((0, 1))
    return dg, du


class FusedRecurrentFunction(torch.autograd.Function):
    """GLA's and RWKV6's op (`u` None: GLA); `h0_mask_fn`: the dq kernel's H0_MASK helper."""

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, g, u, scale, h0, output_final_state, launch, h0_mask_fn, seqs=None):
        q, k, v, g, u, h0 = as_contiguous(q, k, v, g, u, h0)
        o, ht = fused_recurrent_fwd(q, k, v, g, u, scale, h0, output_final_state, launch, seqs=seqs)
        ctx.save_for_backward(q, k, v, g, u, h0, ht)
        ctx.scale, ctx.launch, ctx.h0_mask_fn, ctx.seqs = scale, launch, h0_mask_fn, seqs
        return o, ht

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dht):
        q, k, v, g, u, h0, ht = ctx.saved_tensors
        do, dht = as_contiguous(do, dht)
        dq, dk, dv, dg, du, dh0, _ = fused_recurrent_bwd(q, k, v, g, u, ctx.scale, h0, ht, do, dht, ctx.launch,
                                                         ctx.h0_mask_fn, seqs=ctx.seqs)
        return (cast_grad(dq, q), cast_grad(dk, k), cast_grad(dv, v), cast_grad(dg, g), cast_grad(du, u), None,
                cast_grad(dh0, h0), None, None, None, None)

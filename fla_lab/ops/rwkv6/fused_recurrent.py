"""Fused recurrent RWKV6 (and GLA, and both passes of GSA): one time step per loop iteration, the state in registers.
Top to bottom: the forward kernel, the backward kernels (#18's initial-state mask is the dq kernel's H0_MASK slot),
their launchers (`decay_and_bonus_grads`: the backward's torch fallback), the autograd function, the op.

GLA and RWKV6 differ in one constexpr, `RWKV6`: RWKV6 reads the state *before* this step's decay and adds the
bonus `diag(u) k_t v_t^T` for the current token; GLA reads the state after the update. GLA's state may decay on
either side, `S_t = diag(exp gk_t) S_{t-1} diag(exp gv_t) + k_t v_t^T` (GATE_K, GATE_V: GSA's first pass gates
the value side only).
"""
from __future__ import annotations

import torch
import triton.language as tl

from fla_lab.bugs import check_bug
from fla_lab.ops import contract
from fla_lab.ops.common.utils import (as_contiguous, batch_head, cast_grad, custom_bwd, custom_fwd, grid_size,
                                      kernel, next_pow2, reverse_cumsum, slot_helper, state_tile)
from fla_lab.ops.common.conventions import per_sequence

FWD_BK = 256  # keys per forward program; a larger K splits into blocks whose outputs add up (FLA 0.6.0 splits at 64:
#             `_fused_recurrent_tiling`, `o.sum(0)`, fla/ops/common/fused_recurrent.py)
FWD_BV = 16  # value columns per forward program: more programs (H200, B=8, T=4096, H=16, K=V=64, bf16: forward
#             4.30 ms at 16, 6.02 at 32, 7.17 at 64)


@kernel
def fused_recurrent_fwd_kernel(q, k, v, g, gv, u, o, h0, ht, scale, B, T,
                               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                               BK: tl.constexpr, BV: tl.constexpr, RWKV6: tl.constexpr, GATE_K: tl.constexpr,
                               GATE_V: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                               SPLIT_K: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(2)
    i_k = tl.program_id(1) if SPLIT_K else 0  # one key block: a constant, so the key masks fold away (7% on an H200)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    o += i_k * B * T * H * V  # this key block's partial output, [NK, B, T, H, V]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)  # key-major state tile, fp32
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    if RWKV6:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_g = tl.zeros([BK], dtype=tl.float32)  # no key-side gate: exp(0) = 1
    for t in range(0, T):
        row = (i_b * T + t) * H + i_h
        if GATE_V:  # GLA only (the decay before the read): it commutes with the key side's below
            b_h *= value_decay(gv, row, o_v, m_v, V)[None, :]
        b_q = tl.load(q + row * K + o_k, mask=m_k, other=0).to(tl.float32) * scale
        b_k = tl.load(k + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        if GATE_K:
            b_g = tl.load(g + row * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(v + row * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_kv = b_k[:, None] * b_v[None, :]
        if RWKV6:  # read S_{t-1} plus the bonus, then decay and write
            b_o = tl.sum((b_h + b_u[:, None] * b_kv) * b_q[:, None], axis=0)
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
# registers and adds the RWKV6 bonus terms: no extra pass over [B, T, H, K]. With several value blocks
# (V > DKV_BV) the same quantities come from `decay_and_bonus_grads`, closed forms in torch over the summed
# partials. The value-side decay gradient (GATE_V) has its own kernel, `value_decay_grad_kernel`.
@kernel
def fused_recurrent_bwd_dq_kernel(k, v, g, gv, do, dq, h0, scale, B, T,
                                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                  BK: tl.constexpr, BV: tl.constexpr, RWKV6: tl.constexpr, GATE_K: tl.constexpr,
                                  GATE_V: tl.constexpr, USE_H0: tl.constexpr, H0_MASK: tl.constexpr = h0_mask):
    """dq_t = scale * S S do_t (S_t for GLA, S_{t-1} for RWKV6), one partial sum per value block.
    H0_MASK(m_k, m_v): a `@triton.jit` helper that returns the mask of the initial-state load."""
    i_v, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    b_h = tl.zeros([BV, BK], dtype=tl.float32)  # value-major state tile: rows are values, columns keys
    if USE_H0:
        p_h0 = h0 + i_bh * K * V + o_k[None, :] * V + o_v[:, None]  # h0 is stored key-major, [K, V] per head
        b_h += tl.load(p_h0, mask=H0_MASK(m_k, m_v), other=0).to(tl.float32)
    b_g = tl.zeros([BK], dtype=tl.float32)
    for t in range(0, T):
        row = (i_b * T + t) * H + i_h
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


@kernel
def fused_recurrent_bwd_dkv_kernel(q, k, v, g, gv, u, do, dq, dk, dv, dg, du, ht, dht, dh0, scale, B, T,
                                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                   BK: tl.constexpr, BV: tl.constexpr, RWKV6: tl.constexpr,
                                   GATE_K: tl.constexpr, GATE_V: tl.constexpr,
                                   USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                                   FUSE_DG: tl.constexpr, DG_HT: tl.constexpr):
    """The state adjoint dS runs backwards in time; dk_t = dS v_t and dv_t = dS^T k_t (partial sums per block).

    FUSE_DG (one value block, so dk_t is complete): also dg_t = sum_{s>=t}(q_s dq_s - k_s dk_s) + rowsum(ht dht)
    from the state-path dq and dk (RWKV6's query term one step later: it reads S_{t-1}), then the RWKV6 bonus is
    added to dq, dk, dv, and du's partial for this (batch, head) is stored. Same semantics as
    `decay_and_bonus_grads`."""
    i_v, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_b, i_h = batch_head(i_bh, H)
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
    for i in range(0, T):
        t = T - 1 - i
        row = (i_b * T + t) * H + i_h
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
        tl.store(du + i_bh * K + o_k, b_du, mask=m_k)  # [B, H, K]: summed over the batch in torch


@kernel
def value_decay_grad_kernel(o, do, v, dv, ht, dht, dgv, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BK: tl.constexpr, BV: tl.constexpr, USE_DHT: tl.constexpr):
    """GATE_V's decay gradient, the key side's transposed: dgv_t = sum_{s>=t}(o_s do_s - v_s dv_s) + colsum(ht dht).

    With Gv the cumulative value-side log-decay, o_s[j] holds exp(Gv_s[j]) in every term (the query side), v_s[j]
    enters every later output and the final state with exp(-Gv_s[j]) (the key side), and the final state holds
    exp(Gv_{T-1}[j]) in every term. `o` is the op's (scaled) output, `dv` the complete gradient of v."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    b_dg = tl.zeros([BV], dtype=tl.float32)
    if USE_DHT:
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
            b_ht = tl.load(ht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
            b_dg += tl.sum(b_ht * tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32), axis=0)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    for i in range(0, T):
        p_v = ((i_b * T + T - 1 - i) * H + i_h) * V + o_v
        b_o = tl.load(o + p_v, mask=m_v, other=0).to(tl.float32)
        b_do = tl.load(do + p_v, mask=m_v, other=0).to(tl.float32)
        b_v = tl.load(v + p_v, mask=m_v, other=0).to(tl.float32)
        b_dg += b_o * b_do - b_v * tl.load(dv + p_v, mask=m_v, other=0).to(tl.float32)
        tl.store(dgv + p_v, b_dg, mask=m_v)


def _forward(q, k, v, g, u, scale, h0, output_final_state, gv=None, o_dtype=None):
    """`g` (key side) and `gv` (value side, GLA-mode only) may each be None: no decay on that side. The output in
    `o_dtype` (default q's)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o_dtype = q.dtype if o_dtype is None else o_dtype
    BK, BV = min(next_pow2(K), FWD_BK), min(next_pow2(V), FWD_BV)
    NK = grid_size(K, BK)
    # one key block writes the output in place; several write fp32 partials (each a sum over its keys) to add up
    o = torch.empty(NK, B, T, H, V, dtype=o_dtype if NK == 1 else torch.float32, device=q.device)
    ht = q.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None
    fused_recurrent_fwd_kernel[(grid_size(V, BV), NK, B * H)](
        q, k, v, g, gv, u, o, h0, ht, scale, B, T, H=H, K=K, V=V, BK=BK, BV=BV, RWKV6=u is not None,
        GATE_K=g is not None, GATE_V=gv is not None, USE_H0=h0 is not None, STORE_HT=output_final_state,
        SPLIT_K=NK > 1)
    return sum_partials(o).to(o_dtype), ht


# The dkv kernel's state tile is at most [DKV_BK, DKV_BV]. One value block (V <= DKV_BV) keeps dg and the RWKV6
# bonus inside the kernel; more key blocks keep that too (dg is per key, dv's key partials are summed), at the cost
# of one [NK, B, T, H, V] sum. Measured on an H200 (fused_recurrent_rwkv6, bf16, B=8, T=4096, H=16, K=V=64),
# forward+backward: DKV_BK = 64: 27.1 ms (128 programs on 132 SMs), 32: 19.3 ms, 16: 18.5 ms (512 programs).
DKV_BK, DKV_BV = 16, 64


def sum_partials(x):
    """Sum a kernel's per-block partials over axis 0; one block is already the sum (a view, no copy)."""
    return x[0] if x.shape[0] == 1 else x.sum(0)


def _backward(q, k, v, g, u, scale, h0, ht, do, dht, dq_tiles, h0_mask_fn, gv=None, o=None):
    """dq, dk, dv, dg, du, dh0 and dgv (None where the input is): `o`, the forward's output, only with `gv`."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    rwkv6 = u is not None
    gates = dict(GATE_K=g is not None, GATE_V=gv is not None)
    f32 = dict(dtype=torch.float32, device=q.device)
    BKq, BVq = dq_tiles
    NVq = grid_size(V, BVq)
    dq = torch.empty(NVq, B, T, H, K, **f32)
    fused_recurrent_bwd_dq_kernel[(NVq, grid_size(K, BKq), B * H)](
        k, v, g, gv, do, dq, h0, scale, B, T, H=H, K=K, V=V, BK=BKq, BV=BVq, RWKV6=rwkv6, **gates,
        USE_H0=h0 is not None, H0_MASK=h0_mask_fn)
    dq = sum_partials(dq)  # the dkv kernel reads the complete dq_t
    BK, BV = min(next_pow2(K), DKV_BK), min(next_pow2(V), DKV_BV)
    NK, NV = grid_size(K, BK), grid_size(V, BV)
    # each program holds all of V: its dk_t is complete, so dg and the bonus fit in the kernel
    fuse_dg = NV == 1 and g is not None
    dg_ht = dht is not None and ht is not None
    dk, dv = torch.empty(NV, B, T, H, K, **f32), torch.empty(NK, B, T, H, V, **f32)
    dg = torch.empty(B, T, H, K, **f32) if fuse_dg else None
    du = torch.empty(B, H, K, **f32) if fuse_dg and rwkv6 else None
    dh0 = torch.empty(B, H, K, V, **f32) if h0 is not None else None
    fused_recurrent_bwd_dkv_kernel[(NV, NK, B * H)](
        q, k, v, g, gv, u, do, dq, dk, dv, dg, du, ht, dht, dh0, scale, B, T, H=H, K=K, V=V, BK=BK, BV=BV,
        RWKV6=rwkv6, **gates, USE_DHT=dht is not None, STORE_DH0=h0 is not None, FUSE_DG=fuse_dg,
        DG_HT=fuse_dg and dg_ht)
    dk, dv = sum_partials(dk), sum_partials(dv)
    dgv = value_decay_grad(o, do, v, dv, ht, dht) if gv is not None else None
    if fuse_dg:
        return dq, dk, dv, dg, (du.sum(0) if rwkv6 else None), dh0, dgv
    dg, du = decay_and_bonus_grads(q, k, v, u, scale, dq, dk, dv, do, ht, dht) if g is not None else (None, None)
    return dq, dk, dv, dg, du, dh0, dgv


def value_decay_grad(o, do, v, dv, ht, dht):
    B, T, H, V = v.shape
    K = ht.shape[-2] if ht is not None else 1  # the final state's keys (only with its cotangent)
    BV = min(next_pow2(V), DKV_BV)
    dgv = torch.empty(B, T, H, V, dtype=torch.float32, device=v.device)
    value_decay_grad_kernel[(grid_size(V, BV), B * H)](o, do, v, dv, ht, dht, dgv, T, H=H, K=K, V=V, BK=DKV_BK,
                                                        BV=BV, USE_DHT=dht is not None and ht is not None)
    return dgv


def decay_and_bonus_grads(q, k, v, u, scale, dq, dk, dv, do, ht, dht):
    """Closed forms on top of the state-path gradients (updates dq, dk, dv in place for the RWKV6 bonus): the
    fallback for several value blocks, and the spec of the dkv kernel's FUSE_DG path.

    With G the cumulative log-decay, the output depends on G through exp(G_query - G_key), so
    dL/dG_t = q_t * dq_t (query side) - k_t * dk_t (key side), and dg is its reverse cumulative sum.
    RWKV6's query side is exclusive (G_{t-1}), which shifts its term by one step. The final state depends on
    G_{T-1} as a whole: rowsum(ht * dht) joins every step. The bonus path has no decay and is added after.
    """
    qf, kf = q.float(), k.float()
    query_side, key_side = qf * dq, kf * dk
    if u is not None:
        query_side = torch.cat([query_side[:, 1:], torch.zeros_like(query_side[:, :1])], 1)
    dg = reverse_cumsum(query_side - key_side, 1)
    if dht is not None and ht is not None:
        dg = dg + (ht * dht.float()).sum(-1)[:, None]
    du = None
    if u is not None:
        dov = (do.float() * v.float()).sum(-1, keepdim=True)  # do_t . v_t
        uf = u.float()[None, None]
        dq += scale * uf * kf * dov
        dk += scale * uf * qf * dov
        dv += scale * (qf * uf * kf).sum(-1, keepdim=True) * do.float()
        du = scale * (qf * kf * dov).sum((0, 1))
    return dg, du


class FusedRecurrentFunction(torch.autograd.Function):
    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, g, u, scale, h0, output_final_state, dq_tiles, h0_mask_fn):
        q, k, v, g, u, h0 = as_contiguous(q, k, v, g, u, h0)
        o, ht = _forward(q, k, v, g, u, scale, h0, output_final_state)
        ctx.save_for_backward(q, k, v, g, u, h0, ht)
        ctx.scale, ctx.dq_tiles, ctx.h0_mask_fn = scale, dq_tiles, h0_mask_fn
        return o, ht

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dht):
        q, k, v, g, u, h0, ht = ctx.saved_tensors
        do, dht = as_contiguous(do, dht)
        dq, dk, dv, dg, du, dh0, _ = _backward(q, k, v, g, u, ctx.scale, h0, ht, do, dht, ctx.dq_tiles,
                                               ctx.h0_mask_fn)
        return (cast_grad(dq, q), cast_grad(dk, k), cast_grad(dv, v), cast_grad(dg, g), cast_grad(du, u), None,
                cast_grad(dh0, h0), None, None, None)


DEFAULT_DQ_TILES = (16, 64)  # (BK, BV) of the dq kernel: upstream's non-square tiles, where #18 showed


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, bug=None,
                          dq_tiles=None, h0_mask_fn=None, cu_seqlens=None, **kwargs):
    """Fused recurrent RWKV6, forward and backward in Triton.

    `w` is the `[B, T, H, K]` natural-log decay (<= 0), `u` the `[H, K]` bonus. `dq_tiles=(BK, BV)` sets the tile
    of the dq backward kernel (default upstream's (16, 64)); notebook 04 sweeps it.
    `bug="transposed_h0_mask"` turns on upstream #18's initial-state mask in that kernel (its H0_MASK slot takes
    `h0_mask_transposed` instead of `h0_mask`); `h0_mask_fn`: a `@triton.jit` helper for that slot instead of the
    shipped one (notebook 04's exercise).
    """
    if cu_seqlens is not None:  # packed sequences (FLA's varlen): one call per sequence
        return per_sequence("fused_recurrent_rwkv6", fused_recurrent_rwkv6, dict(r=r, k=k, v=v, w=w), cu_seqlens,
                            initial_state, output_final_state, u=u, scale=scale, bug=bug, dq_tiles=dq_tiles,
                            h0_mask_fn=h0_mask_fn, **kwargs)
    check_bug(bug, "fused_recurrent_rwkv6")
    contract.check_gated_inputs("fused_recurrent_rwkv6", r, k, v, w, names=("r", "k", "v", "w"), u=u,
                                initial_state=initial_state, kwargs=kwargs)
    contract.check_kernel_device("fused_recurrent_rwkv6", dict(r=r, k=k, v=v, w=w, u=u, initial_state=initial_state))
    scale = r.shape[-1] ** -0.5 if scale is None else scale
    dq_tiles = tuple(dq_tiles) if dq_tiles is not None else DEFAULT_DQ_TILES
    h0_mask_fn = slot_helper("fused_recurrent_rwkv6", "H0_MASK", bug == "transposed_h0_mask", h0_mask_transposed,
                             h0_mask, h0_mask_fn)
    o, ht = FusedRecurrentFunction.apply(r, k, v, w, u, scale, initial_state, output_final_state, dq_tiles,
                                         h0_mask_fn)
    return o, (ht if output_final_state else None)

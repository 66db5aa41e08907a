"""RWKV-7 / DPLR: `S_t = (diag(exp w_t) + b_t a_t^T) S_{t-1} + k_t v_t^T`, `o_t = scale * S_t^T r_t`.

Reference: `fla_lab.spec.reference.recurrent_rwkv7`. The transition acts on the key axis only, so every value column
of the `[K, V]` state evolves on its own: a program owns a `[K, BV]` tile (the whole key dimension) of one head.

Backward with state checkpoints, as the official RWKV-7 CUDA kernels do (BlinkDL/RWKV-LM `wkv7_cuda.cu`,
`CHUNK_LEN = 16`): the forward stores the state entering every `CHECKPOINT_EVERY`-step segment,
`[B, H, ceil(T/16), K, V]` fp32 (T/16 states per head, never one per step). The backward walks the segments
in reverse, replays each segment forward from its checkpoint into a small scratch, then runs the adjoint
backwards through it. It never divides by the decay to step backwards: that is unstable once decays leave
RWKV-7's range (-e^-0.5, 0).

A packed batch (`cu_seqlens`, B = 1) runs both kernels once for all its sequences: a program per (value block,
sequence * head) over its own sequence's rows, the segments counted per sequence (`hc` is `[segments of all
sequences, H, K, V]`, sequence n's from `chunk_offsets[n]`, FLA's `prepare_chunk_offsets` for chunks of 16), so no
segment spans two sequences.

Adjoint of one step, with dS the adjoint of S_t (o_t adds `scale * r_t do_t^T` to it) and sa_t = a_t^T S_{t-1}:
    dr_t = scale * S_t do_t,  dk_t = dS v_t,  dv_t = dS^T k_t,  db_t = dS sa_t,  dsa_t = dS^T b_t,
    da_t = S_{t-1} dsa_t,  dw_t = exp(w_t) * rowsum(S_{t-1} * dS),  dS_{t-1} = diag(exp w_t) dS + a_t dsa_t^T.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_lab.ops import contract
from fla_lab.ops.common.launch import resolve
from fla_lab.ops.common.utils import (as_contiguous, batch_head, cast_grad, custom_bwd, custom_fwd, grid_size,
                                      kernel, next_pow2, packed_switch, sequence_chunks, state_tile)
from fla_lab.ops.common.conventions import packed_batch

MAX_K = 128  # a program keeps the whole key dimension of its state tile in registers
CHECKPOINT_EVERY = 16  # steps per segment; the official RWKV-7 kernels' CHUNK_LEN


@kernel
def load_step(r, w, k, v, a, b, row, o_k, o_v, m_k, m_v, K: tl.constexpr, V: tl.constexpr):
    """One step's vectors in fp32: r, exp(w), k, a, b over keys `[BK]`, v over this program's values `[BV]`."""
    b_r = tl.load(r + row * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_d = tl.exp(tl.load(w + row * K + o_k, mask=m_k, other=0).to(tl.float32))
    b_k = tl.load(k + row * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_a = tl.load(a + row * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_b = tl.load(b + row * K + o_k, mask=m_k, other=0).to(tl.float32)
    b_v = tl.load(v + row * V + o_v, mask=m_v, other=0).to(tl.float32)
    return b_r, b_d, b_k, b_v, b_a, b_b


@kernel
def transition(b_h, b_d, b_k, b_v, b_a, b_b):
    """S_{t-1} -> S_t on a `[BK, BV]` tile; also returns sa = a^T S_{t-1}, read before the decay."""
    b_sa = tl.sum(b_a[:, None] * b_h, axis=0)  # mutation: rwkv7_fused_sa_wrong_axis
    return b_h * b_d[:, None] + b_b[:, None] * b_sa[None, :] + b_k[:, None] * b_v[None, :], b_sa


@kernel
def transition_keys_last(b_h, b_d, b_k, b_v, b_a, b_b):
    """The same step on a `[BV, BK]` tile (the state transposed)."""
    b_sa = tl.sum(b_h * b_a[None, :], axis=1)
    return b_h * b_d[None, :] + b_sa[:, None] * b_b[None, :] + b_v[:, None] * b_k[None, :], b_sa


@kernel
def checkpoint(hc, i_bh, i_h, boc, NS, H: tl.constexpr, KV: tl.constexpr, VARLEN: tl.constexpr):
    """Where the program's checkpoints start and the stride between them: `hc[b, h, s]` dense (`[B, H, NS, K, V]`),
    `hc[boc + s, h]` packed (`[segments of all sequences, H, K, V]`). 64-bit, offsets and stride: B * H * NS * K * V
    passes 2**31 on long sequences."""
    if VARLEN:
        p_hc = hc + (boc * H + i_h) * KV
        stride = tl.full([], H * KV, tl.int64)
    else:
        p_hc = hc + i_bh.to(tl.int64) * NS * KV
        stride = tl.full([], KV, tl.int64)
    return p_hc, stride


@packed_switch
@kernel
def fused_recurrent_rwkv7_fwd_kernel(r, w, k, v, a, b, o, h0, ht, hc, scale, cu_seqlens, chunk_offsets, T,
                                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                     BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
                                     USE_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HC: tl.constexpr,
                                     KEYS_LAST: tl.constexpr = False, VARLEN: tl.constexpr = False):
    """One step per iteration; `hc[b, h, s]` is the state entering segment s of BT steps (packed:
    `hc[chunk_offsets[n] + s, h]`). One flat loop over the steps, the checkpoint stored where a segment starts,
    rather than a loop nested per segment that restarts every 16 steps (docs/performance.md, 'fused_recurrent_rwkv7:
    flat step loop').
    KEYS_LAST holds the tile as `[BV, BK]`: the same entries of the `[K, V]` state, transposed in registers."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    bos, T, NS, boc = sequence_chunks(i_b, T, BT, cu_seqlens, chunk_offsets, VARLEN)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(0, i_v, K, V, BK, BV)
    if KEYS_LAST:
        m_kv, p_kv = tl.trans(m_kv), tl.trans(p_kv)
    if STORE_HC:  # hc is None without it
        p_hc, s_hc = checkpoint(hc, i_bh, i_h, boc, NS, H, K * V, VARLEN)
    b_h = tl.zeros(p_kv.shape, dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    for t in range(0, T):
        if STORE_HC:
            if t % BT == 0:
                tl.store(p_hc + (t // BT) * s_hc + p_kv, b_h, mask=m_kv)
        row = (bos + t) * H + i_h
        b_r, b_d, b_k, b_v, b_a, b_b = load_step(r, w, k, v, a, b, row, o_k, o_v, m_k, m_v, K, V)
        if KEYS_LAST:
            b_h, b_sa = transition_keys_last(b_h, b_d, b_k, b_v, b_a, b_b)
            b_o = tl.sum(b_h * b_r[None, :], axis=1) * scale
        else:
            b_h, b_sa = transition(b_h, b_d, b_k, b_v, b_a, b_b)
            b_o = tl.sum(b_h * b_r[:, None], axis=0) * scale
        tl.store(o + row * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@packed_switch
@kernel
def fused_recurrent_rwkv7_bwd_kernel(r, w, k, v, a, b, do, dht, hc, scratch, dr, dw, dk, dv, da, db, dh0,
                                     scale, cu_seqlens, chunk_offsets, B, T, H: tl.constexpr, K: tl.constexpr,
                                     V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
                                     USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, VARLEN: tl.constexpr):
    """Segments in reverse: replay S_{t-1} for the segment's steps into `scratch`, then the adjoint backwards.

    Gradients that contract over values (dr, dw, dk, da, db) are partial sums per value block
    `[NV, B, T, H, K]`; dv and dh0 belong to this program's columns alone.
    """
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_bh, i_b, i_h = batch_head(i_bh, H)
    NV = tl.num_programs(0)
    bos, T_seq, NS, boc = sequence_chunks(i_b, T, BT, cu_seqlens, chunk_offsets, VARLEN)  # T: the partials' stride
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(0, i_v, K, V, BK, BV)
    p_scratch = scratch + (i_bh * NV + i_v).to(tl.int64) * BT * BK * BV + o_k[:, None] * BV + tl.arange(0, BV)[None, :]
    p_hc, s_hc = checkpoint(hc, i_bh, i_h, boc, NS, H, K * V, VARLEN)
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0).to(tl.float32)
    for i in range(0, NS):
        i_s = NS - 1 - i
        t0 = i_s * BT
        n = tl.minimum(BT, T_seq - t0)
        b_h = tl.load(p_hc + i_s * s_hc + p_kv, mask=m_kv, other=0)
        for j in range(0, n):  # replay: scratch[j] = S_{t0+j-1}
            row = (bos + t0 + j) * H + i_h
            tl.store(p_scratch + j * BK * BV, b_h, mask=m_kv)
            b_r, b_d, b_k, b_v, b_a, b_b = load_step(r, w, k, v, a, b, row, o_k, o_v, m_k, m_v, K, V)
            b_h, b_sa = transition(b_h, b_d, b_k, b_v, b_a, b_b)
        tl.debug_barrier()  # the replay's stores must land before the adjoint reads them
        for jj in range(0, n):
            j = n - 1 - jj
            row = (bos + t0 + j) * H + i_h
            b_hp = tl.load(p_scratch + j * BK * BV, mask=m_kv, other=0)  # S_{t-1}
            b_r, b_d, b_k, b_v, b_a, b_b = load_step(r, w, k, v, a, b, row, o_k, o_v, m_k, m_v, K, V)
            b_do = tl.load(do + row * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_h, b_sa = transition(b_hp, b_d, b_k, b_v, b_a, b_b)  # S_t, one step from S_{t-1}
            b_dh += scale * b_r[:, None] * b_do[None, :]
            b_dsa = tl.sum(b_dh * b_b[:, None], axis=0)
            p_k = (i_v * B * T * H + row) * K + o_k
            tl.store(dr + p_k, scale * tl.sum(b_h * b_do[None, :], axis=1), mask=m_k)
            tl.store(dk + p_k, tl.sum(b_dh * b_v[None, :], axis=1), mask=m_k)
            tl.store(db + p_k, tl.sum(b_dh * b_sa[None, :], axis=1), mask=m_k)
            tl.store(da + p_k, tl.sum(b_hp * b_dsa[None, :], axis=1), mask=m_k)
            tl.store(dw + p_k, b_d * tl.sum(b_hp * b_dh, axis=1), mask=m_k)
            tl.store(dv + row * V + o_v, tl.sum(b_dh * b_k[:, None], axis=0), mask=m_v)
            b_dh = b_dh * b_d[:, None] + b_a[:, None] * b_dsa[None, :]
        tl.debug_barrier()  # the next segment's replay overwrites the scratch
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


def _sequences(B: int, seqs):
    """The grid's batch size and the kernels' packed-batch arguments: (B, None, None) dense, (N, cu_seqlens,
    chunk_offsets) packed (`seqs`, a `conventions.Packed` in segments of CHECKPOINT_EVERY steps)."""
    return (B, None, None) if seqs is None else (seqs.N, seqs.cu_seqlens, seqs.chunk_offsets)


def _forward(r, w, k, v, a, b, scale, h0, output_final_state, save_checkpoints, launch, seqs=None):
    B, T, H, K = r.shape
    V = v.shape[-1]
    N, cu_seqlens, chunk_offsets = _sequences(B, seqs)
    BK, (BV, warps) = next_pow2(K), launch.forward_launch(r, V, H, seqs)
    f32 = dict(dtype=torch.float32, device=r.device)
    o = torch.empty(B, T, H, V, dtype=r.dtype, device=r.device)
    ht = torch.empty(N, H, K, V, **f32) if output_final_state else None
    hc = None
    if save_checkpoints:  # dense [B, H, NS, K, V]; packed [NS of all sequences, H, K, V]
        hc_shape = (B, H, triton.cdiv(T, CHECKPOINT_EVERY)) if seqs is None else (seqs.NT, H)
        hc = torch.empty(*hc_shape, K, V, **f32)
    fused_recurrent_rwkv7_fwd_kernel[(grid_size(V, BV), N * H)](
        r, w, k, v, a, b, o, h0, ht, hc, scale, cu_seqlens, chunk_offsets, T, H=H, K=K, V=V, BK=BK, BV=BV,
        BT=CHECKPOINT_EVERY, USE_H0=h0 is not None, STORE_HT=output_final_state, STORE_HC=save_checkpoints,
        KEYS_LAST=(BV, warps) in launch.keys_last_launches, num_warps=warps)
    return o, ht, hc


def _backward(r, w, k, v, a, b, scale, h0, hc, do, dht, launch, seqs=None):
    B, T, H, K = r.shape
    V = v.shape[-1]
    N, cu_seqlens, chunk_offsets = _sequences(B, seqs)
    BK, (BV, warps) = next_pow2(K), launch.backward_launch(r, V)
    NV = grid_size(V, BV)
    f32 = dict(dtype=torch.float32, device=r.device)
    dr, dw, dk, da, db = (torch.empty(NV, B, T, H, K, **f32) for _ in range(5))
    dv = torch.empty(B, T, H, V, **f32)
    dh0 = torch.empty(N, H, K, V, **f32) if h0 is not None else None
    scratch = torch.empty(N * H * NV, CHECKPOINT_EVERY, BK, BV, **f32)
    fused_recurrent_rwkv7_bwd_kernel[(NV, N * H)](
        r, w, k, v, a, b, do, dht, hc, scratch, dr, dw, dk, dv, da, db, dh0, scale, cu_seqlens, chunk_offsets, B, T,
        H=H, K=K, V=V, BK=BK, BV=BV, BT=CHECKPOINT_EVERY, USE_DHT=dht is not None, STORE_DH0=h0 is not None,
        num_warps=warps)
    return dr.sum(0), dw.sum(0), dk.sum(0), dv, da.sum(0), db.sum(0), dh0


class FusedRecurrentRWKV7Function(torch.autograd.Function):
    @staticmethod
    @custom_fwd
    def forward(ctx, r, w, k, v, a, b, scale, h0, output_final_state, needs_grad, launch, seqs=None):
        r, w, k, v, a, b, h0 = as_contiguous(r, w, k, v, a, b, h0)
        o, ht, hc = _forward(r, w, k, v, a, b, scale, h0, output_final_state, save_checkpoints=needs_grad,
                             launch=launch, seqs=seqs)
        ctx.save_for_backward(r, w, k, v, a, b, h0, hc)
        ctx.scale, ctx.launch, ctx.seqs = scale, launch, seqs
        return o, ht

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dht):
        r, w, k, v, a, b, h0, hc = ctx.saved_tensors
        do, dht = as_contiguous(do, dht)
        dr, dw, dk, dv, da, db, dh0 = _backward(r, w, k, v, a, b, ctx.scale, h0, hc, do, dht, ctx.launch, ctx.seqs)
        return (cast_grad(dr, r), cast_grad(dw, w), cast_grad(dk, k), cast_grad(dv, v), cast_grad(da, a),
                cast_grad(db, b), None, cast_grad(dh0, h0), None, None, None, None)


def check_key_width(op: str, K: int) -> None:
    if K > MAX_K:
        raise ValueError(f"{op}: K={K} > {MAX_K}: each program keeps the whole key dimension of its state tile "
                         f"in registers. Split the heads so that K <= {MAX_K}.")


def fused_recurrent_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
                          cu_seqlens_cpu=None, launch=None, **kwargs):
    """Fused recurrent RWKV-7, forward and backward in Triton.

    `w` is the `[B, T, H, K]` natural-log decay (<= 0; RWKV-7 keeps it in (-e^-0.5, 0)); `a, b` the removal
    vectors (RWKV-7's own, as its layer builds them: `fla_lab.spec.harness.rwkv7_inputs`). The state is
    `[B, H, K, V]` fp32. `w` may be float32 while the rest is bf16 (the layer keeps the decay in fp32, upstream
    #181). Returns `(o, final_state or None)`; K <= MAX_K = 128. `cu_seqlens` (and its host copy
    `cu_seqlens_cpu`): FLA's packed batches, one launch per kernel for the whole batch
    (`fla_lab.ops.common.conventions`). `launch`: a `fla_lab.ops.RWKV7RecurrentLaunch`, None for the device's
    default.

    Differences from flash-linear-attention 0.6.0:
    - upstream's `fused_recurrent_rwkv7` defaults to `scale=None`, meaning `K ** -0.5`, and
      `output_final_state=True`, while upstream's `chunk_rwkv7` defaults to `scale=1.0`. fla_lab defaults to
      `scale=1.0`, RWKV-7's own value (`scale=None` still means `K ** -0.5`), and `output_final_state=False`.
    - upstream's fused recurrent RWKV7 is inference only (its backward raises `NotImplementedError`);
      this one has a backward, with one state checkpoint every `CHECKPOINT_EVERY` = 16 steps.
    """
    op = "fused_recurrent_rwkv7"
    contract.check_rwkv7_inputs(op, r, w, k, v, a, b, initial_state, kwargs, packed=cu_seqlens is not None)
    check_key_width(op, r.shape[-1])
    contract.check_kernel_device(op, dict(r=r, w=w, k=k, v=v, a=a, b=b, initial_state=initial_state))
    scale = r.shape[-1] ** -0.5 if scale is None else scale
    seqs = None if cu_seqlens is None else packed_batch(op, cu_seqlens, cu_seqlens_cpu, r, initial_state,
                                                        CHECKPOINT_EVERY)  # chunk_offsets: each one's first segment
    # Checkpoints only where autograd records the call: `ctx.needs_input_grad` says True under torch.no_grad() too
    # (it reads requires_grad alone), which made an inference forward store T/16 states it never reads.
    needs_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                                 for x in (r, w, k, v, a, b, initial_state))
    o, ht = FusedRecurrentRWKV7Function.apply(r, w, k, v, a, b, scale, initial_state, output_final_state, needs_grad,
                                              resolve(launch, "rwkv7_recurrent", r), seqs)
    return o, (ht if output_final_state else None)

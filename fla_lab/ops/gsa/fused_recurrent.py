"""Fused recurrent Gated Slot Attention: GSA's two gated passes one time step at a time, the states in registers.

    pass 1, keys -> slots:   Hk_t = Hk_{t-1} diag(exp g_t) + k_t s_t^T     [K, M], gate on the slot (value) side
                             p_t  = softmax(scale * Hk_t^T q_t)              over the M slots, fp32
    pass 2, slots -> values: Hv_t = diag(exp g_t) Hv_{t-1} + s_t v_t^T     [M, V], gate on the slot (key) side
                             o_t  = Hv_t^T p_t

Both passes run the GLA kernels of `fla_lab/ops/common/fused_recurrent.py` (pass 1 with GATE_V, value-side decay
only; pass 2 with the key-side decay, the slots as keys); the softmax between them is `chunk.py`'s slot softmax
kernels. The slot scores and weights stay fp32 between the passes (as upstream's `qv`). g's gradient is the sum of
the two passes' decay gradients (pass 1's from `decay_grad_kernel`'s value side), s's the sum of pass 1's dv and
pass 2's dk. Reference: `fla_lab.spec.reference.recurrent_gsa`. flash-linear-attention 0.6.0's `fused_recurrent_gsa` signature
(`fla/ops/gsa/fused_recurrent.py`); its single-token inference kernel is not separate here (T = 1 runs the same
kernels). A packed batch (`cu_seqlens`) runs every kernel of both passes once for all its sequences.
"""
from __future__ import annotations

import torch

from fla_lab.ops.common.conventions import packed
from fla_lab.ops.common.fused_recurrent import fused_recurrent_bwd, fused_recurrent_fwd, h0_mask
from fla_lab.ops.common.launch import resolve
from fla_lab.ops.common.utils import as_contiguous, cast_grad, custom_bwd, custom_fwd
from fla_lab.ops.gsa.chunk import gsa_arguments, slot_softmax, slot_softmax_backward


def query_groups(op: str, q, k) -> int:
    """How many query heads share each head of k, v, s, g (1 unless q has more heads than k)."""
    if not (torch.is_tensor(q) and torch.is_tensor(k) and q.dim() == 4 and k.dim() == 4) or q.shape[2] == k.shape[2]:
        return 1  # the contract checks the rest
    HQ, H = q.shape[2], k.shape[2]
    if HQ % H:
        raise ValueError(f"{op}: q has {HQ} heads and k {H}: grouped query heads need a multiple of k's heads")
    return HQ // H


class FusedRecurrentGSAFunction(torch.autograd.Function):
    """Saves the inputs, both final states (the decay gradients' final-state terms) and the fp32 slot scores and
    weights; the passes' states are replayed by the backward kernels, as in the GLA op."""

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, s, g, scale, hk0, hv0, output_final_state, launch, seqs=None):
        q, k, v, s, g, hk0, hv0 = as_contiguous(q, k, v, s, g, hk0, hv0)
        scores, hkt = fused_recurrent_fwd(q, k, s, None, None, scale, hk0, output_final_state, launch, gv=g,
                                          o_dtype=torch.float32, seqs=seqs)  # safeguard: gsa_fused_slot_scores_fp32
        p = slot_softmax(scores, torch.float32, launch.softmax_rows)
        o, hvt = fused_recurrent_fwd(p, s, v, g, None, 1.0, hv0, output_final_state, launch, o_dtype=v.dtype,
                                     seqs=seqs)
        ctx.save_for_backward(q, k, v, s, g, hk0, hv0, hkt, hvt, scores, p)
        ctx.scale, ctx.launch, ctx.seqs = scale, launch, seqs
        return o, hkt, hvt

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dhkt, dhvt):
        q, k, v, s, g, hk0, hv0, hkt, hvt, scores, p = ctx.saved_tensors
        do, dhkt, dhvt = as_contiguous(do, dhkt, dhvt)
        launch = ctx.launch
        dp, ds_keys, dv, dg_keys, _, dhv0, _ = fused_recurrent_bwd(p, s, v, g, None, 1.0, hv0, hvt, do, dhvt,
                                                                   launch, h0_mask, seqs=ctx.seqs)
        dscores = slot_softmax_backward(scores, dp, launch.softmax_rows, out=dp)
        dq, dk, ds_values, _, _, dhk0, dg_values = fused_recurrent_bwd(q, k, s, None, None, ctx.scale, hk0, hkt,
                                                                       dscores, dhkt, launch, h0_mask, gv=g,
                                                                       o=scores, seqs=ctx.seqs)
        return (cast_grad(dq, q), cast_grad(dk, k), cast_grad(dv, v), cast_grad(ds_keys + ds_values, s),
                cast_grad(dg_keys + dg_values, g), None, cast_grad(dhk0, hk0), cast_grad(dhv0, hv0), None, None,
                None)


def fused_recurrent_gsa(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False, reverse=False,
                        cu_seqlens=None, cu_seqlens_cpu=None, launch=None, **kwargs):
    """Fused recurrent Gated Slot Attention, forward and backward in Triton; the same function as `chunk_gsa`.

    q `[B, T, HQ, K]`, k `[B, T, H, K]`, v `[B, T, H, V]`, s (slot writes) and g (natural-log forget gate <= 0)
    `[B, T, H, M]`; `g=None` is vanilla ABC. HQ a multiple of H: grouped query heads (FLA's decode path), query
    head i reading head i // (HQ / H) of everything else. `initial_state` is the pair `(Hk0 [N, H, K, M],
    Hv0 [N, H, M, V])`. Returns `(o [B, T, HQ, V], (HkT, HvT) in fp32 or None)`, as fla_lab's `chunk_gsa`
    (upstream's fused op returns the pair as a list, `[None, None]` without `output_final_state`). `reverse=True`
    runs both recurrences from the last step to the first (the gates of `g=None` still accumulate forwards, as
    upstream's); each sequence of a packed batch from its own last step. `cu_seqlens` (and its host copy
    `cu_seqlens_cpu`): FLA's packed batches, one launch per kernel for the whole batch
    (`fla_lab.ops.common.conventions`). `launch`: a `fla_lab.ops.RecurrentLaunch`, None for the device's default.
    """
    op = "fused_recurrent_gsa"
    groups = query_groups(op, q, k)
    if groups > 1:  # each group of query heads reads one head's k, v, s, g and states: that head, once per query
        spread = lambda t, dim=2: None if t is None else t.repeat_interleave(groups, dim=dim)  # noqa: E731
        h0 = None if initial_state is None else tuple(spread(t, 1) for t in initial_state)
        o, ht = fused_recurrent_gsa(q, spread(k), spread(v), spread(s), spread(g), scale, h0, output_final_state,
                                    reverse, cu_seqlens, cu_seqlens_cpu, launch, **kwargs)
        return o, (None if ht is None else tuple(t[:, ::groups] for t in ht))  # the copies of a group are equal
    s, g, hk0, hv0, scale, seqs = gsa_arguments(op, q, k, v, s, g, scale, initial_state, kwargs, 64, cu_seqlens,
                                                cu_seqlens_cpu)
    if reverse:  # the time axis flipped on the way in and out: the kernels always step forwards
        q, k, v, s, g = (t.flip(1) for t in (q, k, v, s, g))
        if seqs is not None:  # the flip reverses the order of the sequences too: their offsets and states with it
            T = q.shape[1]
            seqs = packed(tuple((T - eos, T - bos) for bos, eos in reversed(seqs.bounds)), seqs.BT, q.device)
            hk0, hv0 = (None if h is None else h.flip(0) for h in (hk0, hv0))
    o, hkt, hvt = FusedRecurrentGSAFunction.apply(q, k, v, s, g, scale, hk0, hv0, output_final_state,
                                                  resolve(launch, "recurrent", q), seqs)
    if reverse and seqs is not None and output_final_state:
        hkt, hvt = hkt.flip(0), hvt.flip(0)
    return (o.flip(1) if reverse else o), ((hkt, hvt) if output_final_state else None)

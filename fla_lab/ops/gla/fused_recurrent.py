"""Fused recurrent GLA: the kernels of `fla_lab/ops/common/fused_recurrent.py` with `RWKV6=False` (no bonus, the
output reads the state after the step's update).
`S_t = diag(exp g_t) S_{t-1} + k_t v_t^T`, `o_t = scale * S_t^T q_t`. A packed batch (`cu_seqlens`) runs those kernels
once for all its sequences.
"""
from __future__ import annotations

from fla_lab.ops import contract
from fla_lab.ops.common.conventions import deprecated_state_layout, key_major, packed_batch, v_first
from fla_lab.ops.common.fused_recurrent import FusedRecurrentFunction, h0_mask
from fla_lab.ops.common.launch import resolve


def fused_recurrent_gla(q, k, v, gk, gv=None, scale=None, initial_state=None, output_final_state=False,
                        state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, launch=None, **kwargs):
    """One step at a time, the state in registers. `gk` is the `[B, T, H, K]` natural-log decay (<= 0).

    Returns `(o [B, T, H, V], final_state [B, H, K, V] in fp32 or None)`. Value-side gates (`gv`) are not
    implemented in fla_lab. `cu_seqlens` (and its host copy `cu_seqlens_cpu`), `state_v_first` (or its deprecated
    name `transpose_state_layout`): FLA's packed batches, one launch per kernel for the whole batch, and V-first
    states (`fla_lab.ops.common.conventions`). `launch`: a `fla_lab.ops.RecurrentLaunch`, None for the device's
    default.
    """
    state_v_first = deprecated_state_layout("fused_recurrent_gla", state_v_first, kwargs)
    if state_v_first:  # FLA's [N, H, V, K] states in and out; the kernels keep them key-major
        o, ht = fused_recurrent_gla(q, k, v, gk, gv, scale, key_major(initial_state), output_final_state,
                                    cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, launch=launch, **kwargs)
        return o, v_first(ht)
    if gv is not None:
        raise NotImplementedError("fused_recurrent_gla: fla_lab implements key-side gates (gk) only; gv must be None")
    contract.check_gated_inputs("fused_recurrent_gla", q, k, v, gk, names=("q", "k", "v", "gk"),
                                initial_state=initial_state, kwargs=kwargs, packed=cu_seqlens is not None)
    contract.check_kernel_device("fused_recurrent_gla", dict(q=q, k=k, v=v, gk=gk, initial_state=initial_state))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    seqs = None if cu_seqlens is None else packed_batch("fused_recurrent_gla", cu_seqlens, cu_seqlens_cpu, q,
                                                        initial_state, 64)  # rows only: any chunk size
    o, ht = FusedRecurrentFunction.apply(q, k, v, gk, None, scale, initial_state, output_final_state,
                                         resolve(launch, "recurrent", q), h0_mask, seqs)
    return o, (ht if output_final_state else None)

"""Fused recurrent RWKV6: the kernels GLA and GSA share (`fla_lab/ops/common/fused_recurrent.py`) with `RWKV6=True`:
the output reads the state *before* this step's decay and adds the bonus `diag(u) k_t v_t^T` for the current token.
#18's initial-state mask is the dq kernel's H0_MASK slot there (`h0_mask_transposed`, `h0_mask`).
"""
from __future__ import annotations

from fla_lab.ops import contract
from fla_lab.ops.common.conventions import packed_batch
from fla_lab.ops.common.fused_recurrent import FusedRecurrentFunction, h0_mask, h0_mask_transposed
from fla_lab.ops.common.launch import resolve
from fla_lab.ops.common.switches import Switch, check_switch
from fla_lab.ops.common.utils import Slot


SWITCHES = (Switch("transposed_h0_mask", "fused_recurrent_rwkv6", 18,
                   located=("fused_recurrent_rwkv6", "fused_recurrent_bwd_dq_kernel", "kernel_raised")),)
# the H0_MASK slot of the dq kernel (`fused_recurrent_bwd_dq_kernel`)
H0_MASK_SLOT = Slot("fused_recurrent_rwkv6", "H0_MASK", h0_mask, h0_mask_transposed, "transposed_h0_mask")


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, bug=None,
                          helper=None, cu_seqlens=None, cu_seqlens_cpu=None, launch=None, **kwargs):
    """Fused recurrent RWKV6, forward and backward in Triton.

    `w` is the `[B, T, H, K]` natural-log decay (<= 0), `u` the `[H, K]` bonus. `bug="transposed_h0_mask"` turns
    on upstream #18's initial-state mask in the dq backward kernel (its H0_MASK slot takes `h0_mask_transposed`
    instead of `h0_mask`); `helper`: a `@triton.jit` helper for that slot instead of the shipped one (notebook 04's
    exercise; `utils.Slot`). `cu_seqlens` (and its host copy `cu_seqlens_cpu`): FLA's packed batches, one launch per
    kernel for the whole batch (`fla_lab.ops.common.conventions`). `launch`: a `fla_lab.ops.RecurrentLaunch`, None
    for the device's default; its `dq_BK`, `dq_BV` are the dq kernel's tile, upstream's (16, 64) by default, which
    notebook 04 sweeps.
    """
    op = "fused_recurrent_rwkv6"
    check_switch(bug, op, SWITCHES)
    contract.check_gated_inputs(op, r, k, v, w, names=("r", "k", "v", "w"), u=u, initial_state=initial_state,
                                kwargs=kwargs, packed=cu_seqlens is not None)
    contract.check_kernel_device(op, dict(r=r, k=k, v=v, w=w, u=u, initial_state=initial_state))
    scale = r.shape[-1] ** -0.5 if scale is None else scale
    h0_mask_fn = H0_MASK_SLOT.pick(bug, helper)
    seqs = None if cu_seqlens is None else packed_batch(op, cu_seqlens, cu_seqlens_cpu, r, initial_state, 64)
    o, ht = FusedRecurrentFunction.apply(r, k, v, w, u, scale, initial_state, output_final_state,
                                         resolve(launch, "recurrent", r), h0_mask_fn, seqs)
    return o, (ht if output_final_state else None)

"""Chunked RWKV6: the GLA chunk pass (`fla_lab/ops/gla/chunk.py`) with `RWKV6=True`.
`o_t = scale * (S_{t-1} + diag(u) k_t v_t^T)^T r_t`, `S_t = diag(exp w_t) S_{t-1} + k_t v_t^T`.

RWKV6 reads the state before its own decay, so its queries carry the exclusive cumulative decay, and the reference
row that splits a sub-chunk pair's decay must be `gi[start - 1]` (upstream 0c1c0b65, the fix of #77): the
REFERENCE_ROW slot of `gated_scores_kernel` and `chunk_bwd_dqk_kernel` (`REFERENCE_ROW_SLOT`); the
historical row and the shipped one sit side by side in `fla_lab/ops/common/chunk.py` (`reference_row_inclusive`,
`reference_row`). Reference: `fla_lab.spec.reference.recurrent_rwkv6`.
"""
from __future__ import annotations

from fla_lab.ops import contract
from fla_lab.ops.common.chunk import REFERENCE_ROW_SLOT
from fla_lab.ops.common.launch import check_chunk_size, resolve
from fla_lab.ops.common.switches import Switch, check_switch
from fla_lab.ops.gla.chunk import ChunkGLAFunction
from fla_lab.ops.common.conventions import packed_batch


SWITCHES = (Switch("exclusive_reference", "chunk_rwkv6", 77, located=("chunk_rwkv6", "gated_scores_kernel", "exp_overflow")),)


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, chunk_size=64, bug=None,
                launch=None, helper=None, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """Chunked RWKV6, forward and backward in Triton.

    `w` is the `[B, T, H, K]` natural-log decay (<= 0), `u` the `[H, K]` bonus; `chunk_size` a power of two
    >= 16; `launch` a `fla_lab.ops.ChunkLaunch`. `bug="exclusive_reference"` restores upstream #77's reference row
    (fixed in 0c1c0b65): NaN in the output and dq once the per-step log-decay is about -89 or stronger.
    `helper`: a `@triton.jit` helper for the kernels' REFERENCE_ROW slot instead of the shipped `reference_row`
    (notebook 03a's exercise; `fla_lab.ops.common.utils.Slot`). `cu_seqlens` (and its host copy `cu_seqlens_cpu`):
    FLA's packed batches, one launch per kernel for the whole batch (`fla_lab.ops.common.conventions`).
    """
    check_switch(bug, "chunk_rwkv6", SWITCHES)
    names = ("r", "k", "v", "w")
    checks = contract.check_gated_inputs("chunk_rwkv6", r, k, v, w, names=names, u=u, initial_state=initial_state,
                                         kwargs=kwargs, in_kernel=True, packed=cu_seqlens is not None)
    BT = check_chunk_size(chunk_size)
    seqs = None if cu_seqlens is None else packed_batch("chunk_rwkv6", cu_seqlens, cu_seqlens_cpu, r, initial_state,
                                                        BT)
    contract.check_kernel_device("chunk_rwkv6", dict(r=r, k=k, v=v, w=w, u=u, initial_state=initial_state))
    scale = r.shape[-1] ** -0.5 if scale is None else scale
    row = REFERENCE_ROW_SLOT.pick(bug, helper)
    o, ht = ChunkGLAFunction.apply(r, k, v, w, u, scale, initial_state, output_final_state, BT,
                                   resolve(launch, "chunk", r), row, checks, names, seqs)
    return o, (ht if output_final_state else None)

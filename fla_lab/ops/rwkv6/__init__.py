"""RWKV6: `o_t = scale * (S_{t-1} + diag(u) k_t v_t^T)^T r_t`, `S_t = diag(exp w_t) S_{t-1} + k_t v_t^T`.

Reference: `fla_lab.reference.recurrent_rwkv6`. Same signatures as flash-linear-attention 0.6.0, plus `bug=`
(see `fla_lab.bugs`): `bug=None` is the fixed kernel.
"""
from __future__ import annotations

from fla_lab.bugs import check_bug
from fla_lab.ops import contract
from fla_lab.ops.common.chunk_pass import key_side_chunk
from fla_lab.ops.common.fused_recurrent import fused_recurrent


def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, bug=None,
                          dq_tiles=None, **kwargs):
    """Fused recurrent RWKV6, forward and backward in Triton.

    `w` is the `[B, T, H, K]` natural-log decay (<= 0), `u` the `[H, K]` bonus. `dq_tiles=(BK, BV)` sets the tile
    of the dq backward kernel (default upstream's (16, 64)); notebook 04 sweeps it.
    `bug="transposed_h0_mask"` turns on upstream #18's initial-state mask in that kernel.
    """
    check_bug(bug, "fused_recurrent_rwkv6")
    contract.check_gated_inputs("fused_recurrent_rwkv6", r, k, v, w, names=("r", "k", "v", "w"), u=u,
                                initial_state=initial_state, kwargs=kwargs)
    scale = r.shape[-1] ** -0.5 if scale is None else scale
    return fused_recurrent(r, k, v, w, u, scale, initial_state, output_final_state, dq_tiles,
                           bug == "transposed_h0_mask")


def chunk_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, chunk_size=64, bug=None,
                launch=None, **kwargs):
    """Chunked RWKV6 (see `fla_lab.ops.common.chunk_stages`), forward and backward in Triton.

    `w` is the `[B, T, H, K]` natural-log decay (<= 0), `u` the `[H, K]` bonus; `chunk_size` a power of two
    >= 16; `launch` a `fla_lab.ops.ChunkLaunch`. `bug="exclusive_reference"` restores upstream #77's reference row (fixed in 0c1c0b65): NaN in the
    output and dq once the per-step log-decay is about -89 or stronger.
    """
    check_bug(bug, "chunk_rwkv6")
    names = ("r", "k", "v", "w")
    checks = contract.check_gated_inputs("chunk_rwkv6", r, k, v, w, names=names, u=u, initial_state=initial_state,
                                         kwargs=kwargs, in_kernel=True)
    scale = r.shape[-1] ** -0.5 if scale is None else scale
    return key_side_chunk("chunk_rwkv6", r, k, v, w, u, scale, initial_state, output_final_state, chunk_size, launch,
                          bug == "exclusive_reference", checks=checks, names=names)

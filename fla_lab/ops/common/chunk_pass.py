"""Launchers of one gated chunk pass (forward and backward, the gate on either side), and the key-side op GLA
and RWKV6 share. The kernels and the algorithm are in `chunk_stages`.

All intermediates are fp32: `gi` (chunk-local cumulative decay), `h [B, NT, H, K, V]` (the state entering each
chunk), `A [B, T, H, BT]` (scores of each row against its chunk).
"""
from __future__ import annotations

import torch

from fla_lab.ops import contract
from fla_lab.ops.common import chunk_stages as st
from fla_lab.ops.common.launch import ChunkLaunch, check_chunk_size, resolve
from fla_lab.ops.common.utils import (as_contiguous, cast_grad, custom_bwd, custom_fwd, dot_dtype, grid_size,
                                      next_pow2, slot_helper)

BC = 16  # rows per sub-chunk: the smallest tile a GPU `tl.dot` takes


def _f32(x, *shape):
    return torch.empty(*shape, dtype=torch.float32, device=x.device)


def _tile(D: int) -> int:
    return max(16, min(next_pow2(D), 64))


def _dot(launch: ChunkLaunch, x: torch.Tensor):
    return dot_dtype(launch.dot_dtype or x.dtype)


def _slot(checks: contract.KernelChecks | None, name: str) -> int:
    return -1 if checks is None else checks.slot(name)


def _flags(checks: contract.KernelChecks | None):
    return None if checks is None else checks.flags


def chunk_cumsum(g: torch.Tensor, BT: int, checks=None, name="g", also=None, also_name="k") -> torch.Tensor:
    """Chunk-local inclusive cumulative log-decay, fp32, same shape as g. `checks` (`contract.KernelChecks`):
    g's value check, under the argument name `name`, in the same pass, and that of `also` (a tensor shaped like g,
    argument name `also_name`) when given."""
    B, T, H, D = g.shape
    gi = _f32(g, B, T, H, D)
    BD = _tile(D)
    st.chunk_cumsum_kernel[(grid_size(D, BD), grid_size(T, BT), B * H)](
        g, gi, also, _flags(checks), T, H=H, K=D, BT=BT, BK=BD, G_SLOT=_slot(checks, name),
        X_SLOT=-1 if also is None else _slot(checks, also_name))
    return gi


def forward_states(k, v, gi, h0, output_final_state, BT, launch, gate_v):
    B, T, H, K = k.shape
    V = v.shape[-1]
    BK, BV, NT = _tile(K), min(_tile(V), launch.state_BV), grid_size(T, BT)
    h = _f32(k, B, NT, H, K, V)
    ht = _f32(k, B, H, K, V) if output_final_state else None
    st.chunk_fwd_h_kernel[(grid_size(K, BK), grid_size(V, BV), B * H)](
        k, v, gi, h, h0, ht, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, DOT=_dot(launch, k), GATE_V=gate_v,
        USE_H0=h0 is not None, STORE_HT=output_final_state, num_warps=launch.state_warps,
        num_stages=launch.state_stages)
    return h, ht


def state_adjoints(q, do, gi, h, ht, dht, need_dh0, scale, BT, launch, gate_v, rwkv6=False):
    """dh (the adjoint of the state after each chunk), dh0, and each chunk's boundary term of dg, `bnd
    [B, NT, H, NP, D]` (D the gated channels, NP partials over the other axis); `h`, `ht`: the forward's states."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    BK, BV, NT = _tile(K), min(_tile(V), launch.state_BV), grid_size(T, BT)
    dh = _f32(q, B, NT, H, K, V)
    dh0 = _f32(q, B, H, K, V) if need_dh0 else None
    if dht is not None and ht is None:
        raise RuntimeError("state_adjoints: a final-state cotangent needs the final state (its share of dg)")
    bnd = _f32(q, B, NT, H, grid_size(K, BK), V) if gate_v else _f32(q, B, NT, H, grid_size(V, BV), K)
    st.chunk_bwd_dh_kernel[(grid_size(K, BK), grid_size(V, BV), B * H)](
        q, do, gi, h, ht, dh, dht, dh0, bnd, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, DOT=_dot(launch, q),
        GATE_V=gate_v, RWKV6=rwkv6, USE_DHT=dht is not None, STORE_DH0=need_dh0, num_warps=launch.state_warps,
        num_stages=launch.state_stages)
    return dh, dh0, bnd


def reference_row(bug_exclusive_reference=False, helper=None, op="chunk_rwkv6"):
    """The helper for the REFERENCE_ROW slot of the RWKV6 kernels (`utils.slot_helper`): the historical row under
    the bug switch, else `helper` (a `@triton.jit` function, e.g. notebook 03a's) or the shipped `st.reference_row`."""
    return slot_helper(op, "REFERENCE_ROW", bool(bug_exclusive_reference), st.reference_row_inclusive,
                       st.reference_row, helper)


def gated_scores(q, k, gi, u, scale, BT, launch, row=st.reference_row):
    B, T, H, K = q.shape
    A = _f32(q, B, T, H, BT)
    st.gated_scores_kernel[(grid_size(T, BT) * (BT // BC), B * H)](
        q, k, gi, u, A, scale, T, H=H, K=K, BT=BT, BC=BC, BK=min(_tile(K), launch.scores_BK), DOT=_dot(launch, q),
        RWKV6=u is not None, REFERENCE_ROW=row, num_warps=launch.scores_warps)
    return A


def plain_scores(x, y, scale, BT, launch):
    B, T, H, D = x.shape
    A = _f32(x, B, T, H, BT)
    st.plain_scores_kernel[(grid_size(T, BT), B * H)](x, y, A, scale, T, H=H, D=D, BT=BT, BD=_tile(D),
                                                      DOT=_dot(launch, x))
    return A


def plain_rows(A, x, y, gi, h, alpha, beta, BT, launch, *, transpose_A, to_end, transpose_h, dtype=torch.float32):
    """`alpha * op(A) @ x + beta * (y * exp(G)) @ op(h)` (see `plain_rows_kernel`), `[B, T, H, DX]` in `dtype`."""
    B, T, H, DX = x.shape
    DY = y.shape[-1]
    out = torch.empty(B, T, H, DX, dtype=dtype, device=x.device)
    BX = _tile(DX)
    st.plain_rows_kernel[(grid_size(DX, BX), grid_size(T, BT), B * H)](
        A, x, y, gi, h, out, alpha, beta, T, grid_size(T, BT), H=H, DX=DX, DY=DY, BT=BT, BX=BX, BY=_tile(DY),
        DOT=_dot(launch, x), A_T=transpose_A, TO_END=to_end, H_T=transpose_h)
    return out


def decay_grad(readers, d_readers, writers, d_writers, bnd, BT, launch, dtype, u=None, dA=None, add=None,
               cast_dtype=torch.float32):
    """dg (and RWKV6's du) from the closed form in `chunk_bwd_dg_kernel`, plus `add` (another pass's dg);
    `bnd`: the boundary terms from `state_adjoints`; `d_writers=None` leaves the writer term out.
    Returns `(dg, du, d_readers, d_writers)`, the last two in `cast_dtype`: a 16-bit one is written by the same
    kernel, which reads the fp32 gradients anyway (no separate cast pass)."""
    B, T, H, D = readers.shape
    NT = grid_size(T, BT)
    # in place over `add` when it can hold the result: each element is read and written by the same program
    dg = add if add is not None and add.dtype == dtype else torch.empty(B, T, H, D, dtype=dtype, device=readers.device)
    du = _f32(readers, B, NT, H, D) if u is not None else None  # one part per chunk, summed below
    cast = cast_dtype != d_readers.dtype
    dr_cast = torch.empty_like(d_readers, dtype=cast_dtype) if cast else d_readers
    dw_cast = torch.empty_like(d_writers, dtype=cast_dtype) if cast and d_writers is not None else d_writers
    st.chunk_bwd_dg_kernel[(grid_size(D, launch.dg_BK), NT, B * H)](
        readers, writers, d_readers, d_writers, u, dA, bnd, add, dg, du, dr_cast, dw_cast, T, NT, H=H, K=D,
        NP=bnd.shape[3], BT=BT, BK=launch.dg_BK, RWKV6=u is not None, ADD=add is not None,
        WRITERS=d_writers is not None, CAST=cast)
    return dg, (du.sum((0, 1)) if u is not None else None), dr_cast, dw_cast


# ----------------------------------------------------------------------------------------------------------
# Key side: GLA, RWKV6 (`u` its bonus), GSA's value pass


def key_side_forward(q, k, v, gi, u, scale, h0, output_final_state, BT, launch, out_dtype, row=st.reference_row,
                     checks=None, names=("q", "k", "v")):
    """`checks` (`contract.KernelChecks`): the value checks of q and v (argument names `names[0]`, `names[2]`) in
    the output kernel; k's is the cumulative decay's (`chunk_cumsum`)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    nq, _, nv = names
    h, ht = forward_states(k, v, gi, h0, output_final_state, BT, launch, gate_v=False)
    A = gated_scores(q, k, gi, u, 1.0, BT, launch, row)
    o = torch.empty(B, T, H, V, dtype=out_dtype, device=q.device)
    BV = min(_tile(V), launch.out_BV)
    st.chunk_fwd_o_kernel[(grid_size(V, BV), grid_size(T, BT), B * H)](
        q, v, gi, h, A, o, _flags(checks), scale, T, grid_size(T, BT), H=H, K=K, V=V, BT=BT, BK=_tile(K), BV=BV,
        DOT=_dot(launch, q), RWKV6=u is not None, Q_SLOT=_slot(checks, nq), V_SLOT=_slot(checks, nv),
        num_warps=launch.out_warps)
    return o, ht, h, A


def key_side_backward(q, k, v, gi, u, scale, h0, ht, h, A, do, dht, BT, launch, dg_dtype, row=st.reference_row,
                      key_term_in_dg=True, grad_dtype=torch.float32):
    """Returns dq, dk, dv (in grad_dtype), dg (dg_dtype), du (RWKV6) and dh0. `h=None`, `A=None`: recompute them
    here (each intermediate is dropped after its last use, which bounds the peak memory of GSA's backward). `row`:
    the REFERENCE_ROW helper (see `reference_row`).
    `key_term_in_dg=False` leaves `- k * dk` out of dg (GSA adds it once, for the summed slot gradient), and keeps
    dq and dk fp32 whatever grad_dtype (GSA's softmax backward and its other pass take them on)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT, rwkv6 = grid_size(T, BT), u is not None
    if h is None:
        h, _ = forward_states(k, v, gi, h0, False, BT, launch, gate_v=False)
    if A is None:
        A = gated_scores(q, k, gi, u, 1.0, BT, launch, row)
    dh, dh0, bnd = state_adjoints(q, do, gi, h, ht, dht, h0 is not None, scale, BT, launch, gate_v=False,
                                  rwkv6=rwkv6)
    dA = plain_scores(do, v, scale, BT, launch)
    dv = plain_rows(A, do, k, gi, dh, scale, 1.0, BT, launch, transpose_A=True, to_end=True, transpose_h=False,
                    dtype=grad_dtype)
    del A
    dq, dk = _f32(q, B, T, H, K), _f32(q, B, T, H, K)
    BKi = min(_tile(K), launch.dqk_BK)  # the diagonal block is a [BC, BC, BKi] tile: keep it in registers
    st.chunk_bwd_dqk_kernel[(grid_size(K, BKi), NT * (BT // BC), B * H)](
        q, k, v, gi, u, h, dh, dA, do, dq, dk, scale, T, NT, H=H, K=K, V=V, BT=BT, BC=BC, BK=BKi, BV=_tile(V),
        DOT=_dot(launch, q), RWKV6=rwkv6, REFERENCE_ROW=row, num_warps=launch.dqk_warps)
    del h, dh
    if key_term_in_dg:
        dg, du, dq, dk = decay_grad(q, dq, k, dk, bnd, BT, launch, dg_dtype, u=u, dA=dA if rwkv6 else None,
                                    cast_dtype=grad_dtype)
    else:
        dg, du, _, _ = decay_grad(q, dq, k, None, bnd, BT, launch, dg_dtype, u=u, dA=dA if rwkv6 else None)
    return dq, dk, dv, dg, du, dh0


# ----------------------------------------------------------------------------------------------------------
# Value side: GSA's slot pass (keys -> slots, the decay on the slot channel)


def value_side_forward(q, k, v, gi, scale, h0, output_final_state, BT, launch):
    """Returns o (fp32: it feeds a softmax and the decay gradient), ht, h, A."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    h, ht = forward_states(k, v, gi, h0, output_final_state, BT, launch, gate_v=True)
    A = plain_scores(q, k, 1.0, BT, launch)
    o = _f32(q, B, T, H, V)
    BV = min(_tile(V), launch.slots_BV)
    st.slot_rows_kernel[(grid_size(V, BV), grid_size(T, BT) * (BT // BC), B * H)](
        q, v, gi, h, A, o, scale, T, grid_size(T, BT), H=H, K=K, V=V, BT=BT, BC=BC, BK=_tile(K), BV=BV,
        DOT=_dot(launch, q), BACKWARD=False, ACC=False, num_warps=launch.slots_warps)
    return o, ht, h, A


def value_side_backward(q, k, v, gi, scale, h0, ht, h, A, o, do, dht, BT, launch,
                        exponent=st.later_rows_exponent, dv_add=None, dg_add=None, qk_dtype=torch.float32):
    """Returns dq, dk (in qk_dtype, written so by their kernel), dv, dg (fp32) and dh0; `o` is the pass's fp32
    output, `do` its cotangent. `h=None`, `A=None`: recompute them here. `exponent`: the dv kernel's EXPONENT helper
    (`chunk_stages.later_rows_exponent` ships). `dv_add`, `dg_add` (GSA's other pass) are added in place."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = grid_size(T, BT)
    if h is None:
        h, _ = forward_states(k, v, gi, h0, False, BT, launch, gate_v=True)
    if A is None:
        A = plain_scores(q, k, 1.0, BT, launch)
    dh, dh0, bnd = state_adjoints(q, do, gi, h, ht, dht, h0 is not None, scale, BT, launch, gate_v=True)
    dA = gated_scores(do, v, gi, None, scale, BT, launch)
    dv = dv_add if dv_add is not None else _f32(q, B, T, H, V)
    BV = min(_tile(V), launch.slots_BV)
    st.slot_rows_kernel[(grid_size(V, BV), NT * (BT // BC), B * H)](
        k, do, gi, dh, A, dv, scale, T, NT, H=H, K=K, V=V, BT=BT, BC=BC, BK=_tile(K), BV=BV, DOT=_dot(launch, q),
        BACKWARD=True, ACC=dv_add is not None, EXPONENT=exponent,
        num_warps=launch.slots_warps)
    del A
    dq = plain_rows(dA, k, do, gi, h, 1.0, scale, BT, launch, transpose_A=False, to_end=False, transpose_h=True,
                    dtype=qk_dtype)
    del h
    dk = plain_rows(dA, q, v, gi, dh, 1.0, 1.0, BT, launch, transpose_A=True, to_end=True, transpose_h=True,
                    dtype=qk_dtype)
    del dA, dh
    dg, _, _, _ = decay_grad(o, do, v, dv, bnd, BT, launch, torch.float32, add=dg_add)  # dv, dg: fp32 sums
    return dq, dk, dv, dg, dh0


def key_side_scores(q, k, g, u=None, chunk_size=64, launch=None, bug_exclusive_reference=False, row=None):
    """The intra-chunk scores `A [B, T, H, chunk_size]` (fp32) the key-side forward builds, for inspection: row t
    holds t's scores against every row of its chunk (RWKV6's bonus on the diagonal, zeros right of it). `row`: a
    REFERENCE_ROW helper in place of the shipped one."""
    BT = check_chunk_size(chunk_size)
    q, k, g, u = as_contiguous(q, k, g, u)
    return gated_scores(q, k, chunk_cumsum(g, BT), u, 1.0, BT, resolve(launch),
                        reference_row(bug_exclusive_reference, row))


# ----------------------------------------------------------------------------------------------------------
# The key-side op of GLA and RWKV6


class KeySideChunkFunction(torch.autograd.Function):
    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, g, u, scale, h0, output_final_state, chunk_size, launch, row, checks, names):
        q, k, v, g, u, h0 = as_contiguous(q, k, v, g, u, h0)
        gi = chunk_cumsum(g, chunk_size, checks, names[3], also=k, also_name=names[1])
        o, ht, h, A = key_side_forward(q, k, v, gi, u, scale, h0, output_final_state, chunk_size, launch, q.dtype,
                                       row, checks, names[:3])
        if checks is not None:
            checks.submit()
        ctx.save_for_backward(q, k, v, g, u, h0, ht, gi, h, A)
        ctx.scale, ctx.chunk_size, ctx.launch, ctx.row = scale, chunk_size, launch, row
        return o, ht

    @staticmethod
    @custom_bwd
    def backward(ctx, do, dht):
        q, k, v, g, u, h0, ht, gi, h, A = ctx.saved_tensors
        do, dht = as_contiguous(do, dht)
        # dq, dk, dv in their inputs' dtype straight from the kernels when q, k, v, g share it (no cast pass)
        same = q.dtype == k.dtype == v.dtype == g.dtype
        dq, dk, dv, dg, du, dh0 = key_side_backward(q, k, v, gi, u, ctx.scale, h0, ht, h, A, do, dht,
                                                    ctx.chunk_size, ctx.launch, g.dtype, ctx.row,
                                                    grad_dtype=g.dtype if same else torch.float32)
        return (cast_grad(dq, q), cast_grad(dk, k), cast_grad(dv, v), dg, cast_grad(du, u), None,
                cast_grad(dh0, h0), None, None, None, None, None, None)


def key_side_chunk(op, q, k, v, g, u, scale, initial_state, output_final_state, chunk_size, launch,
                   bug_exclusive_reference, row=None, checks=None, names=("q", "k", "v", "g")):
    """Chunked GLA (`u=None`) or RWKV6 (`u` the bonus), forward and backward in Triton. `row`: a `@triton.jit`
    helper for RWKV6's REFERENCE_ROW slot in place of the shipped one (notebook 03a's exercise). `checks`: the
    contract's `KernelChecks` for q, k, v, g (their argument names `names`), done by the forward's kernels."""
    contract.check_kernel_device(op, dict(q=q, k=k, v=v, g=g, u=u, initial_state=initial_state))
    o, ht = KeySideChunkFunction.apply(q, k, v, g, u, scale, initial_state, output_final_state,
                                       check_chunk_size(chunk_size), resolve(launch),
                                       reference_row(bug_exclusive_reference, row, op), checks, names)
    return o, (ht if output_final_state else None)

"""The ops' entry points: one call checks an op's inputs, metadata first, then values (`value_check_mode`)."""
from __future__ import annotations

from fla_lab.ops.contract.metadata import (_check_metadata, _check_value_shape, _describe, check_shape,
                                           warn_if_head_first)
from fla_lab.ops.contract.values import KernelChecks, _check_values


def check_gated_inputs(op: str, q, k, v, g, *, names=("q", "k", "v", "g"), u=None, initial_state=None,
                       kwargs=None, in_kernel: bool = False, packed: bool = False) -> KernelChecks | None:
    """The contract of GLA-style ops: q, k, g `[B, T, H, K]`, v `[B, T, H, V]`, u `[H, K]`, h0 `[B, H, K, V]`
    (`packed`, a batch of `cu_seqlens`: `[N, H, K, V]`, one per sequence, N checked against the offsets by
    `check_cu_seqlens`).

    Value checks (finite inputs, log-decay <= 0) follow `value_check_mode`. `in_kernel`: the op's kernels check
    q, k, v and g as they read them when the check is deferred (the returned `KernelChecks`, else None).
    """
    nq, nk, nv, ng = names
    tensors = {nq: q, nk: k, nv: v, ng: g, "u": u, "initial_state": initial_state}
    B, T, H, K = _check_metadata(op, tensors, nq, (nq, nk, nv), kwargs)
    check_shape(op, nk, k, (B, T, H, K), f"like `{nq}`, [B, T, H, K]")
    check_shape(op, ng, g, (B, T, H, K), f"like `{nq}`, [B, T, H, K]")
    V = _check_value_shape(op, nv, v, B, T, H)
    if u is not None:
        check_shape(op, "u", u, (H, K), "[H, K]")
    if initial_state is not None:
        N = initial_state.shape[0] if packed and initial_state.dim() == 4 else B
        check_shape(op, "initial_state", initial_state, (N, H, K, V), "[N, H, K, V]" if packed else "[B, H, K, V]")
    warn_if_head_first(op, nq, q)
    return _check_values(op, tensors, decay=ng, in_kernel=names if in_kernel else ())


def check_rwkv7_inputs(op: str, r, w, k, v, a, b, initial_state=None, kwargs=None, packed: bool = False,
                       in_kernel: tuple[str, ...] = ()) -> KernelChecks | None:
    """The contract of RWKV-7 (DPLR) ops: r, w, k, a, b `[B, T, H, K]`, v `[B, T, H, V]`, h0 `[B, H, K, V]`
    (`packed`: `[N, H, K, V]`, as `check_gated_inputs`).

    `w` is the natural-log decay (<= 0) and may be float32 while the rest is bf16 (the layer computes the decay
    in fp32, upstream #181). r, k, v, a, b share a dtype. Value checks (finite, w <= 0, and a `TransitionWarning`
    when diag(exp w) + b a^T can grow the state) follow `value_check_mode`. `in_kernel`: the inputs (of r, k, v)
    the op's kernels check as they read them when the check is deferred (the returned `KernelChecks`, else None);
    w, a and b stay in the flag pass, whose transition test reads them together.
    """
    tensors = {"r": r, "w": w, "k": k, "v": v, "a": a, "b": b, "initial_state": initial_state}
    B, T, H, K = _check_metadata(op, tensors, "r", ("r", "k", "v", "a", "b"), kwargs)
    for name in ("w", "k", "a", "b"):
        check_shape(op, name, tensors[name], (B, T, H, K), "like `r`, [B, T, H, K]")
    V = _check_value_shape(op, "v", v, B, T, H)
    if initial_state is not None:
        N = initial_state.shape[0] if packed and initial_state.dim() == 4 else B
        check_shape(op, "initial_state", initial_state, (N, H, K, V), "[N, H, K, V]" if packed else "[B, H, K, V]")
    warn_if_head_first(op, "r", r)
    return _check_values(op, tensors, decay="w", transition=("w", "a", "b"), in_kernel=in_kernel)


def check_gsa_inputs(op: str, q, k, v, s, g, initial_state=None, kwargs=None, packed: bool = False) -> None:
    """The contract of GSA: q, k `[B, T, H, K]`, v `[B, T, H, V]`, s, g `[B, T, H, M]` (g may be None: vanilla
    ABC), `initial_state` the pair `(Hk0 [B, H, K, M], Hv0 [B, H, M, V])` (`packed`, a batch of `cu_seqlens`:
    N states each, N checked against the offsets by `check_cu_seqlens`). q, k, v, s share a dtype; g is a
    natural-log forget gate (<= 0) in any supported dtype. Value checks follow `value_check_mode`."""
    if initial_state is not None and not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2):
        raise TypeError(f"{op}: `initial_state` is the pair (Hk0 [B, H, K, M], Hv0 [B, H, M, V]), "
                        f"got {type(initial_state).__name__}")
    hk0, hv0 = initial_state if initial_state is not None else (None, None)
    tensors = {"q": q, "k": k, "v": v, "s": s, "g": g, "initial_state[0]": hk0, "initial_state[1]": hv0}
    B, T, H, K = _check_metadata(op, tensors, "q", ("q", "k", "v", "s"), kwargs)
    check_shape(op, "k", k, (B, T, H, K), "like `q`, [B, T, H, K]")
    V = _check_value_shape(op, "v", v, B, T, H)
    if s.dim() != 4 or tuple(s.shape[:3]) != (B, T, H):
        raise ValueError(f"{op}: `s` should be [B, T, H, M] = ({B}, {T}, {H}, M), got {_describe(s)}")
    M = s.shape[-1]
    if g is not None:
        check_shape(op, "g", g, (B, T, H, M), "like `s`, [B, T, H, M]")
    if hk0 is not None or hv0 is not None:
        if hk0 is None or hv0 is None:
            raise ValueError(f"{op}: `initial_state` needs both Hk0 and Hv0 (pass zeros for the one you lack)")
        N, n = (hk0.shape[0], "N") if packed and hk0.dim() == 4 else (B, "B")
        check_shape(op, "initial_state[0]", hk0, (N, H, K, M), f"Hk0 [{n}, H, K, M]")
        check_shape(op, "initial_state[1]", hv0, (N, H, M, V), f"Hv0 [{n}, H, M, V]")
    warn_if_head_first(op, "q", q)
    _check_values(op, tensors, decay="g")

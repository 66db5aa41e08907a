"""Input checks shared by every op: bad input gets an error that names the argument and says how to fix it.

Shape, dtype, device and keyword checks read only metadata and always run. Value checks (a positive
log-decay, non-finite values) read the data; on the CPU they always run, on a GPU they cost a reduction and a
device sync per call, so they are off by default there: turn them on with `set_value_checks(True)` (or
FLA_LAB_VALUE_CHECKS=1) while debugging, or for one block with `with value_checks(True): ...`.
"""
from __future__ import annotations

import contextlib
import os
import warnings

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class LayoutWarning(UserWarning):
    """Inputs look like [B, H, T, D] where [B, T, H, D] is expected. Silence with `warnings.simplefilter('ignore', LayoutWarning)`."""


class TransitionWarning(UserWarning):
    """An RWKV-7 transition `diag(exp w) + b a^T` has an eigenvalue above 1: the state can grow step after step."""


_value_checks: bool | None = None  # None: decide by device


def set_value_checks(enabled: bool | None) -> None:
    """True: always check values; False: never; None: the default (on for CPU tensors, off for CUDA ones)."""
    global _value_checks
    _value_checks = enabled


@contextlib.contextmanager
def value_checks(enabled: bool | None):
    """Value checks on (True), off (False) or by device (None) inside the block, restored afterwards.

    The layers use `value_checks(False)` to let a deliberately wrong input (a `bug=` switch) reach the kernel.
    """
    global _value_checks
    previous, _value_checks = _value_checks, enabled
    try:
        yield
    finally:
        _value_checks = previous


def value_checks_enabled(x: torch.Tensor) -> bool:
    """Whether to read `x`'s values: on for CPU tensors, off for CUDA ones (a sync per call), unless set."""
    if _value_checks is not None:
        return _value_checks
    env = os.environ.get("FLA_LAB_VALUE_CHECKS")
    if env is not None:
        return env not in ("", "0")
    return x.device.type != "cuda"


def reject_kwargs(op: str, kwargs: dict) -> None:
    if not kwargs:
        return
    if "head_first" in kwargs:
        raise TypeError(
            f"{op}: `head_first` was removed upstream (flash-linear-attention #853) and fla_lab never had it. "
            "Pass tensors as [B, T, H, D]; from [B, H, T, D] use `x.transpose(1, 2)`.")
    raise TypeError(f"{op}: unexpected keyword argument(s) {sorted(kwargs)}")


def _describe(x: torch.Tensor) -> str:
    return f"shape {tuple(x.shape)}, {x.dtype}, {x.device}"


def check_same_device(op: str, tensors: dict[str, torch.Tensor]) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{op}: tensors are on different devices: {devices}. Move them with `.to(device)`.")


def check_kernel_device(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """Compiled kernels read GPU memory: a CPU tensor would reach Triton as an opaque pointer error.

    Called at the kernel launch, after the contract checks, so those report their own (more specific) errors.
    """
    from fla_lab import runtime

    if runtime.device() == "cuda":
        on_cpu = [name for name, t in tensors.items() if t is not None and t.device.type != "cuda"]
        if on_cpu:
            raise ValueError(f"{op}: {on_cpu} are on the CPU, but here the Triton kernels run compiled on the GPU. "
                             "Move the inputs with `.to(fla_lab.device())` (or `.cuda()`).")


def check_dtypes(op: str, tensors: dict[str, torch.Tensor], same: tuple[str, ...]) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{op}: `{name}` is {t.dtype}; use float32, float16 or bfloat16 (`{name}.float()`).")
    dtypes = {name: tensors[name].dtype for name in same if tensors.get(name) is not None}
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"{op}: {', '.join(dtypes)} must share a dtype, got {dtypes}. Cast them to one.")


def check_shape(op: str, name: str, x: torch.Tensor, expected: tuple, meaning: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{op}: `{name}` should be {meaning} = {tuple(expected)}, got {_describe(x)}.")


def warn_if_head_first(op: str, name: str, x: torch.Tensor) -> None:
    B, T, H, D = x.shape
    if T < H:  # upstream's heuristic (#457): fewer steps than heads usually means [B, H, T, D]
        warnings.warn(
            f"{op}: `{name}` has T={T} < H={H}; inputs are [B, T, H, D], so this looks like [B, H, T, D]. "
            "If so, pass `x.transpose(1, 2)`. Silence: warnings.simplefilter('ignore', fla_lab.ops.LayoutWarning).",
            LayoutWarning, stacklevel=4)


def check_finite(op: str, tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if t is not None and not torch.isfinite(t).all():
            n = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{op}: `{name}` has {n} non-finite value(s) (NaN/inf); "
                             "fix the producer (see fla_lab.check.nonfinite_census to locate them).")


def check_log_decay(op: str, name: str, g: torch.Tensor) -> None:
    """Decays are natural-log decays: exp(g) must not grow the state."""
    if (g > 0).any():
        top = float(g.max())
        raise ValueError(
            f"{op}: `{name}` is a log-decay and must be <= 0, but its maximum is {top:.3g} (every step would "
            f"multiply the state by exp({top:.3g}) > 1). Pass log-space decays, e.g. "
            f"`F.logsigmoid(x)` or `-torch.exp(x)`, not `sigmoid(x)` or a decay in (0, 1).")


def _check_metadata(op: str, tensors: dict, first: str, same_dtype: tuple[str, ...], kwargs) -> tuple:
    """Keywords, types, rank, device and dtypes: everything but the shapes; returns `first`'s [B, T, H, K]."""
    reject_kwargs(op, kwargs or {})
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    x = tensors[first]
    if x.dim() != 4:
        raise ValueError(f"{op}: `{first}` must be 4-D [B, T, H, K], got {_describe(x)}")
    check_same_device(op, tensors)
    check_dtypes(op, tensors, same=same_dtype)
    if x.shape[1] == 0:
        raise ValueError(f"{op}: the sequence is empty (T = 0)")
    return tuple(x.shape)


def _check_value_shape(op: str, nv: str, v: torch.Tensor, B: int, T: int, H: int) -> int:
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"{op}: `{nv}` should be [B, T, H, V] = ({B}, {T}, {H}, V), got {_describe(v)}")
    return v.shape[-1]


def check_gated_inputs(op: str, q, k, v, g, *, names=("q", "k", "v", "g"), u=None, initial_state=None,
                       kwargs=None) -> None:
    """The contract of GLA-style ops: q, k, g `[B, T, H, K]`, v `[B, T, H, V]`, u `[H, K]`, h0 `[B, H, K, V]`.

    Value checks (finite inputs, log-decay <= 0) follow `value_checks_enabled`: on for CPU tensors, off by
    default on CUDA so the GPU fast path never syncs.
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
        check_shape(op, "initial_state", initial_state, (B, H, K, V), "[B, H, K, V]")
    warn_if_head_first(op, nq, q)
    if value_checks_enabled(q):
        check_finite(op, tensors)
        check_log_decay(op, ng, g)


TRANSITION_TOL = 0.02  # bf16 rounding of a unit-norm kk moves a contract transition's radius by ~4e-3 above 1
TRANSITION_SAMPLES = 32


def transition_radius(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, samples: int = TRANSITION_SAMPLES,
                      seed: int = 0) -> float:
    """Largest |eigenvalue| of `diag(exp w_t) + b_t a_t^T` over `samples` random (batch, step, head) triples.

    For RWKV-7's `a = -kk`, `b = kk * a_gate` (unit-norm kk, a_gate in [0, 1]) it is <= 1: the rank-one term
    removes part of the state. For `a, b ~ U(0, 1)` (upstream #150) it is about 1 + a.b, near 17 for K = 64.
    """
    B, T, H, K = w.shape
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randperm(B * T * H, generator=gen)[:samples]
    pick = lambda x: x.detach().reshape(B * T * H, K)[flat.to(x.device)].cpu().double()  # noqa: E731
    w, a, b = pick(w), pick(a), pick(b)
    M = torch.diag_embed(w.exp()) + b[:, :, None] * a[:, None, :]
    return float(torch.linalg.eigvals(M).abs().max())


def warn_if_transition_grows(op: str, w, a, b) -> None:
    radius = transition_radius(w, a, b)
    if radius > 1 + TRANSITION_TOL:
        warnings.warn(
            f"{op}: the transition diag(exp w) + b a^T has an eigenvalue of modulus {radius:.3g} > 1, so the "
            f"state can grow like {radius:.3g}^t and overflow (upstream #150 used a, b ~ rand). RWKV-7 passes "
            "a = -kk, b = kk * a_gate with kk = F.normalize(k * k_k, dim=-1) and a_gate in (0, 1). Silence: "
            "warnings.simplefilter('ignore', fla_lab.ops.contract.TransitionWarning).",
            TransitionWarning, stacklevel=4)


def check_rwkv7_inputs(op: str, r, w, k, v, a, b, initial_state=None, kwargs=None) -> None:
    """The contract of RWKV-7 (DPLR) ops: r, w, k, a, b `[B, T, H, K]`, v `[B, T, H, V]`, h0 `[B, H, K, V]`.

    `w` is the natural-log decay (<= 0) and may be float32 while the rest is bf16 (the layer computes the decay
    in fp32, upstream #181). r, k, v, a, b share a dtype. Value checks (finite, w <= 0, and a `TransitionWarning`
    when diag(exp w) + b a^T can grow the state) follow `value_checks_enabled`: on for CPU tensors, off by
    default on CUDA.
    """
    tensors = {"r": r, "w": w, "k": k, "v": v, "a": a, "b": b, "initial_state": initial_state}
    B, T, H, K = _check_metadata(op, tensors, "r", ("r", "k", "v", "a", "b"), kwargs)
    for name in ("w", "k", "a", "b"):
        check_shape(op, name, tensors[name], (B, T, H, K), "like `r`, [B, T, H, K]")
    V = _check_value_shape(op, "v", v, B, T, H)
    if initial_state is not None:
        check_shape(op, "initial_state", initial_state, (B, H, K, V), "[B, H, K, V]")
    warn_if_head_first(op, "r", r)
    if value_checks_enabled(r):
        check_finite(op, tensors)
        check_log_decay(op, "w", w)
        warn_if_transition_grows(op, w, a, b)


def check_gsa_inputs(op: str, q, k, v, s, g, initial_state=None, kwargs=None) -> None:
    """The contract of GSA: q, k `[B, T, H, K]`, v `[B, T, H, V]`, s, g `[B, T, H, M]` (g may be None: vanilla
    ABC), `initial_state` the pair `(Hk0 [B, H, K, M], Hv0 [B, H, M, V])`. q, k, v, s share a dtype; g is a
    natural-log forget gate (<= 0) in any supported dtype. Value checks follow `value_checks_enabled`."""
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
        check_shape(op, "initial_state[0]", hk0, (B, H, K, M), "Hk0 [B, H, K, M]")
        check_shape(op, "initial_state[1]", hv0, (B, H, M, V), "Hv0 [B, H, M, V]")
    warn_if_head_first(op, "q", q)
    if value_checks_enabled(q):
        check_finite(op, tensors)
        if g is not None:
            check_log_decay(op, "g", g)

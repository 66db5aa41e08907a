"""Numerical checks shared by the tests and the notebooks: errors, non-finite census, tolerances.

Errors are relative Frobenius norms computed in float64: ||got - ref|| / ||ref||.
Gradients use a floor on the denominator (see `grad_errors`) so that a gradient whose exact value underflows
towards 0 under strong decay is judged against the scale of the whole gradient, not its own vanishing norm.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# How each tolerance was chosen. The reference runs on the *same* (already rounded) inputs upcast to float64,
# so what remains is the kernel's own arithmetic plus rounding of the stored outputs/gradients:
# - float32: fp32 accumulation over T steps / chunks (for the errors it gives, see docs/performance.md, 'Agreement
#   with FLA 0.6.0 in fp32'); the GPU dots run in IEEE fp32, not TF32.
# - float16: outputs and gradients are rounded to fp16 (unit roundoff 2**-11 = 4.9e-4); on a GPU the `tl.dot`
#   operands are fp16 too, so a few roundings add up: 5e-3.
# - bfloat16: unit roundoff 2**-8 = 3.9e-3 on every stored value and, on a GPU, on the dot operands: 2e-2.
#   (Triton's CPU interpreter truncates fp32 -> bf16; `runtime.round_bf16_casts_to_nearest` makes it round to
#   nearest even, as a GPU does.)


@dataclass(frozen=True)
class Tolerance:
    fwd: float   # outputs and final states
    grad: float  # every input gradient, after the whole-gradient floor

    def of(self, name: str) -> float:
        """The tolerance of one compared tensor: `o` and the final states (`ht...`) are outputs, the rest gradients."""
        return self.fwd if name == "o" or name.startswith("ht") else self.grad

TOLERANCES = {
    torch.float32: Tolerance(fwd=2e-5, grad=5e-5),
    torch.float16: Tolerance(fwd=5e-3, grad=5e-3),
    torch.bfloat16: Tolerance(fwd=2e-2, grad=2e-2),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    if dtype not in TOLERANCES:
        raise ValueError(f"no tolerance for {dtype}; fla_lab kernels accept {list(TOLERANCES)}")
    return TOLERANCES[dtype]


def _norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x.detach().to(torch.float64).cpu()))


def rel_error(got: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """||got - ref|| / max(||ref||, floor); inf when `got` has a non-finite value and `ref` does not."""
    got = got.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    if got.shape != ref.shape:
        raise ValueError(f"shape mismatch: got {tuple(got.shape)}, reference {tuple(ref.shape)}")
    if not torch.isfinite(got).all():
        return math.nan if not torch.isfinite(ref).all() else math.inf
    denom = max(_norm(ref), floor)
    diff = _norm(got - ref)
    if denom == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / denom


def grad_errors(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative error of each gradient, with the whole gradient's scale as a floor on the denominator.

    The floor for a tensor of n elements is the norm it would have if its entries had the RMS of all the
    reference gradients together: sqrt(n) * RMS(all). A decay gradient whose exact value is 1e-21 (strong
    decay) is thus judged against what an error of that size means next to the other gradients.

    A gradient that is exactly zero everywhere while its reference is not negligible (DROPPED_ABOVE of the floor
    or more) gets its plain relative error (1.0) instead: the floor forgives rounding noise on a small gradient,
    never a dropped one (a kernel that zeroes du or dg would otherwise pass, being small next to dq and dk). An
    exact gradient below that, which the kernel's exp underflow returns as 0 (GSA's dg is 4e-24 of the others at
    decay knob 1e3), stays floored. `plain_grad_errors` gives the unfloored error of every gradient.
    """
    _require_every_gradient(ref, got)
    total_sq = sum(_norm(x) ** 2 for x in ref.values())
    total_n = sum(x.numel() for x in ref.values())
    rms_all = math.sqrt(total_sq / max(total_n, 1))
    floors = {name: math.sqrt(r.numel()) * rms_all for name, r in ref.items()}
    return {name: rel_error(got[name], r, floor=0.0 if zeroed(got[name], r, floors[name]) else floors[name])
            for name, r in ref.items()}


def plain_grad_errors(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> dict[str, float]:
    """||got - ref|| / ||ref|| of each gradient, no floor (upstream's measure; inf where ref is 0 and got is not)."""
    _require_every_gradient(ref, got)
    return {name: rel_error(got[name], r) for name, r in ref.items()}


def _require_every_gradient(ref: dict, got: dict) -> None:
    missing = sorted(set(ref) - set(got))
    if missing:
        raise ValueError(f"gradients missing from the result: {missing}")


DROPPED_ABOVE = 1e-6  # an exact gradient this small next to its floor may underflow to 0 in the kernel


def zeroed(got: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> bool:
    """Whether `got` is exactly 0 everywhere while `ref` is not negligible: its norm is above DROPPED_ABOVE times
    `floor` (with no floor: any nonzero entry). A dropped gradient."""
    return not bool(got.detach().any()) and _norm(ref) > DROPPED_ABOVE * floor


@dataclass
class Census:
    """Where non-finite values are in a `[B, T, H, D]` tensor (or any tensor; `first` is then a flat index)."""
    count: int
    total: int
    first: dict | None  # time step, batch, head, channel of the earliest non-finite value (earliest t first)

    @property
    def fraction(self) -> float:
        return self.count / max(self.total, 1)

    def __str__(self) -> str:
        if self.count == 0:
            return f"all {self.total} values finite"
        where = ", ".join(f"{k}={v}" for k, v in self.first.items())
        return f"{self.count}/{self.total} non-finite ({100 * self.fraction:.1f}%), first at {where}"


def nonfinite_census(x: torch.Tensor, dims: tuple[str, ...] = ("b", "t", "h", "d")) -> Census:
    """Count NaN/inf values and locate the first one in time (then batch, head, channel)."""
    bad = ~torch.isfinite(x.detach())
    count = int(bad.sum())
    if count == 0:
        return Census(0, x.numel(), None)
    idx = bad.nonzero().cpu()
    if x.dim() == len(dims) and "t" in dims:
        t_axis = dims.index("t")
        order = sorted(range(len(dims)), key=lambda a: (a != t_axis, a))  # time first, then the rest in order
        keys = idx[:, order]
        first_row = min(range(len(keys)), key=lambda i: tuple(keys[i].tolist()))
        first = {dims[a]: int(idx[first_row, a]) for a in order}
    else:
        first = {"index": tuple(int(i) for i in idx[0])}
    return Census(count, x.numel(), first)


def report(errors: dict[str, float], tol: Tolerance, digits: int = 1) -> str:
    """One line per error, rounded, with a pass/fail mark against its own tolerance: what the notebooks print."""
    width = max(map(len, errors))
    lines = []
    for name, err in errors.items():
        ok = err <= tol.of(name)
        lines.append(f"{name:<{width}}  {err:.{digits}e}  {'ok' if ok else 'FAIL'}")
    return "\n".join(lines)


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float, floor: float = 0.0) -> float:
    err = rel_error(got, ref, floor=floor)
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.1e} ({nonfinite_census(got)})"
    return err

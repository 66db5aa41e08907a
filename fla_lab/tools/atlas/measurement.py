"""One setting of the atlas measured: the grid's axes (`DECAYS`, `DTYPES`, `COMBINATIONS`), a `Setting`, and its
record (`measure`: the op forward and backward against the float64 reference, a `STATUSES` status) with the
helpers that read a record (`worst_error`, `combination_of`, `line_label`).
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass

import torch

from fla_lab.spec import check, harness, registry
from fla_lab import runtime
from fla_lab.tools import viz

DECAYS = (1e-3, 1e-1, 1.0, 10.0, 30.0, 100.0, 1e3, 1e4)
STATUSES = ("right", "wrong", "nonfinite", "raises")  # finite and within tolerance / finite, beyond / NaN or inf / error
DTYPES = viz.DTYPES

# (h0, dht): an initial state is passed / the final state gets a random cotangent (else zeros)
COMBINATIONS = ((True, True), (True, False), (False, True), (False, False))


def combination_name(h0: bool, dht: bool) -> str:
    """"h0,dht", "h0,no-dht", "no-h0,dht" or "no-h0,no-dht": the label of figures, the summary and the CLI."""
    return f"{'' if h0 else 'no-'}h0,{'' if dht else 'no-'}dht"


def parse_combination(name: str) -> tuple[bool, bool]:
    by_name = {combination_name(*c): c for c in COMBINATIONS}
    if name not in by_name:
        raise ValueError(f"no combination {name!r}; known: {list(by_name)}")
    return by_name[name]


def combination_of(record: dict) -> tuple[bool, bool]:
    """(h0, dht) of a record; records written before the atlas swept them always passed both."""
    return record.get("h0", True), record.get("dht", True)


@dataclass(frozen=True)
class Setting:
    op: str                 # registry label: "chunk_rwkv6" or "fla:chunk_rwkv6"
    variant: str            # "fixed" or a catalogue name
    dtype: str              # "fp32" | "bf16" | "fp16"
    decay: float            # per-step log-decay magnitude m: g = -m * U(0.05, 1)
    T: int
    chunk_size: int | None = None
    B: int = 1
    H: int = 2
    K: int = 32
    V: int = 32
    M: int = 32
    seed: int = 0
    h0: bool = True          # an initial state is passed (its gradient is then measured too)
    dht: bool = True         # the final state gets a random cotangent (False: zeros)
    q_scale: float = 1.0     # the queries (q, or RWKV-7's r) are multiplied by it: GSA's slot logits grow with it

    @property
    def shape(self) -> registry.Shape:
        return registry.Shape(self.B, self.T, self.H, self.K, self.V, self.M)


@functools.lru_cache(maxsize=4)
def _exact(op: str, dtype: str, decay: float, shape: registry.Shape, seed: int, h0: bool = True, dht: bool = True,
           q_scale: float = 1.0):
    """The float64 reference on the rounded inputs (shared by every variant and chunk size of one setting)."""
    spec = registry.get(*_split(op))
    inputs = scale_queries(spec.inputs(shape, decay=decay, initial_state=h0, seed=seed), q_scale)
    rounded = harness.leaves(inputs, DTYPES[dtype], runtime.device())
    exact, cot = harness.exact_run(spec.reference, rounded, seed=seed, state_grad=dht, device=_reference_device())
    return rounded, exact, cot


def scale_queries(inputs: dict, q_scale: float) -> dict:
    """`inputs` with the queries (`q`, or RWKV-7's `r`) multiplied by `q_scale` before rounding to the dtype."""
    if q_scale == 1.0:
        return inputs
    name = "q" if "q" in inputs else "r"
    return inputs | {name: inputs[name] * q_scale}


def _reference_device() -> str:
    return "cuda" if runtime.device() == "cuda" else "cpu"  # float64 on the GPU: seconds, not minutes, at T = 4096


def _split(label: str) -> tuple[str, str]:
    library, _, name = label.rpartition(":")
    return name, library or "fla_lab"


def measure(setting: Setting) -> dict:
    """Run one setting: the op forward and backward against the float64 reference. Never raises."""
    spec = registry.get(*_split(setting.op))
    start = time.perf_counter()
    rounded, exact, cot = _exact(setting.op, setting.dtype, setting.decay, setting.shape, setting.seed,
                                 setting.h0, setting.dht, setting.q_scale)
    record = asdict(setting) | {"status": "right", "message": "", "nonfinite": {}, "errors": {},
                                "errors_unfloored": {}}
    try:
        with _quiet():
            got = harness.run(spec.op(setting.variant, setting.chunk_size), harness.leaves(rounded), cot)
    except Exception as exc:  # a kernel that fails to compile or launch is a result, not a crash of the sweep
        record.update(status="raises", message=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}")
        return record | {"seconds": time.perf_counter() - start}
    record.update(_compare(got, exact, DTYPES[setting.dtype]))
    return record | {"seconds": time.perf_counter() - start}


def _compare(got: harness.Run, exact: harness.Run, dtype: torch.dtype) -> dict:
    pairs = {"o": (got.o, exact.o), **{n: (got.states[n], s) for n, s in exact.states.items()},
             **{f"d{n}": (got.grads[n], g) for n, g in exact.grads.items()}}
    nonfinite = {n: int((~torch.isfinite(x)).sum()) for n, (x, _) in pairs.items()}
    errors = {"o": check.rel_error(got.o, exact.o)}
    errors.update({n: check.rel_error(got.states[n], s) for n, s in exact.states.items()})
    errors.update({f"d{n}": e for n, e in check.grad_errors(exact.grads, got.grads).items()})
    unfloored = {n: check.rel_error(x, r) for n, (x, r) in pairs.items()}
    tol = check.tolerance(dtype)
    over = [n for n, e in errors.items() if not e <= (tol.grad if n.startswith("d") else tol.fwd)]
    status = "nonfinite" if any(nonfinite.values()) else ("wrong" if over else "right")
    first = next((check.nonfinite_census(x).first for n, (x, _) in pairs.items() if nonfinite[n] and x.dim() == 4),
                 None)
    state_max = max(float(s.abs().max()) for s in exact.states.values())
    return {"status": status, "nonfinite": {n: c for n, c in nonfinite.items() if c}, "errors": errors,
            "errors_unfloored": unfloored, "beyond_tolerance": over, "first_bad": first, "state_max": state_max}


def _quiet():
    import contextlib
    import warnings

    from fla_lab.ops import contract

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contract.value_checks(False))  # the atlas measures kernels, not the input contract
    return stack


def worst_error(record: dict) -> float:
    """The largest (scale-aware) error of a record; inf when non-finite, nan when it raised."""
    if record["status"] == "raises":
        return math.nan
    if record["status"] == "nonfinite":
        return math.inf
    return max(record["errors"].values())


def line_label(record: dict) -> str:
    """The record's variant, with its query scale when that is not 1 ("fixed, q x100")."""
    q_scale = record.get("q_scale", 1.0)
    return record["variant"] if q_scale == 1.0 else f"{record['variant']}, q x{q_scale:g}"

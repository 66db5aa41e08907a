"""Audit mode: results that are finite but wrong, call by call, on the training step's own inputs and gradients.

    with fla_lab.tools.audit.audit(model) as recorded:
        loss = model(x).float().pow(2).mean()
        loss.backward()
    print(recorded.report())        # one line per op call; recorded.wrong(): the calls beyond tolerance

Inside the block every fla_lab op call is recorded (the locator's recording, `fla_lab.tools.hunt`): the op, the module
that called it, its options, a copy of its inputs, and, during the backward, the cotangents its output and final
state(s) received. `report()` then replays each call twice on exactly those tensors, the kernel and the float64
reference, forward and backward, and compares every output and every gradient:
- `scale-aware`: the error the tolerances are for (`check.rel_error`; a gradient's denominator floored at its
  share of all the call's gradients, `check.grad_errors`, so an exactly tiny gradient does not read as wrong);
- `plain`: ||got - exact|| / ||exact|| without the floor (a small gradient that is wrong shows here first);
- where the absolute difference of the worst tensor peaks: (b, t, h) for sequence tensors, (b, h) for states.
A call is WRONG when a scale-aware error exceeds its dtype's tolerance (`check.tolerance`), or when it returned an
output without a graph although an input required grad (a cut gradient path: what the next segment of truncated
BPTT sends back into the final state is lost, and no cotangent is ever recorded to replay). A call made without
`output_final_state` is also run that way, and its output compared too. A call whose output got no cotangent (no
backward, or an unused output), or a non-finite one (the locator's case), is compared forward only.

Off by default: nothing is recorded outside the block. Cost inside the block: the locator's (a copy of every op
input and cotangent, one finiteness check, so one host sync, per op output and gradient). `report()` costs, per
call, one forward and backward of the kernel and one of the float64 reference on the call's device (a loop over
time steps). Both timed on a 12-layer RWKV-7 training step by `python -m benchmarks.hunt_cost`: docs/performance.md,
'Locator and audit cost'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fla_lab.spec import check, harness
from fla_lab.tools import hunt
from fla_lab.ops import contract


@dataclass
class CallAudit:
    """One op call replayed against float64: errors per tensor, where the worst one peaks, the verdict."""
    call: hunt.Call
    dtype: torch.dtype
    errors: dict[str, float]  # scale-aware: the numbers the tolerance is for
    plain: dict[str, float]   # no floor
    peaks: dict[str, dict] = field(default_factory=dict)  # tensor -> {"b":.., "t":.., "h":..} of max |got - exact|
    backward: bool = True
    replayed_on: str = ""  # "" the op the model called; "fla_lab" fla_lab's kernel on the same call (an FLA call)

    @property
    def label(self) -> str:
        return self.call.label + (f" [{self.replayed_on}]" if self.replayed_on else "")

    @property
    def tolerance(self) -> check.Tolerance:
        return check.tolerance(self.dtype)

    @property
    def worst(self) -> str:
        tol = self.tolerance
        return max(self.errors, key=lambda n: _ratio(self.errors[n], tol.of(n)))

    @property
    def ok(self) -> bool:
        tol = self.tolerance
        return not self.call.detached and all(e <= tol.of(n) for n, e in self.errors.items())

    def line(self) -> str:
        n = self.worst
        where = ", ".join(f"{k}={v}" for k, v in self.peaks.get(n, {}).items() if k in ("b", "t", "h")) or "-"
        return (f"#{self.call.index:<3} {self.call.module.split(' (')[0]:<14} {self.label:<30} "
                f"{str(self.dtype)[6:]:<9} {n:<5} {self.errors[n]:>9.1e} {self.plain[n]:>9.1e} "
                f"{self.tolerance.of(n):>9.0e}  {where:<14} {'right' if self.ok else 'WRONG'}"
                + ("" if self.backward else "  (forward only)")
                + (f"  ({', '.join(self.call.detached)} returned detached: no gradient can flow back through it)"
                   if self.call.detached else ""))


HEADER = (f"{'call':<4} {'module':<14} {'op':<30} {'dtype':<9} {'worst':<5} {'scale-aw.':>9} {'plain':>9} "
          f"{'tolerance':>9}  {'peak at':<14} verdict")


def _ratio(error: float, tol: float) -> float:
    return math.inf if math.isnan(error) else error / tol


class Auditor:
    """Records through the locator (without its NaN replay); `report()` replays every call against float64."""

    def __init__(self, model: torch.nn.Module | None = None, fla: bool | None = None, kernel: bool = False):
        """`fla`: record flash-linear-attention's op calls too (None: when `fla` is imported); `kernel`: replay each
        FLA call on fla_lab's kernel as well (a second line per call)."""
        self._locator = hunt.Locator(model, replay=False, fla=fla)
        self._results: list[CallAudit] | None = None
        self.kernel = kernel

    @property
    def calls(self) -> list[hunt.Call]:
        return self._locator.calls

    def __enter__(self) -> "Auditor":
        self._locator.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._locator.__exit__(exc_type, exc, tb)
        return False  # an exception inside the block is the caller's: it propagates

    def results(self) -> list[CallAudit]:
        if self._results is None:
            self._results = [result for call in self.calls for result in self._replays(call)]
        return self._results

    def _replays(self, call: hunt.Call) -> list[CallAudit]:
        results = [replay_call(call)]
        if self.kernel and call.library != "fla_lab":
            from fla_lab.spec import upstream

            results.append(replay_call(call, upstream.kernel(call.op), replayed_on="fla_lab"))
        return results

    def wrong(self) -> list[CallAudit]:
        return [r for r in self.results() if not r.ok]

    def report(self) -> str:
        lines = [HEADER] + [r.line() for r in self.results()]
        bad = self.wrong()
        replays = len(self.results())
        lines.append(f"{len(bad)} of {len(self.calls)} call(s) beyond tolerance" + (
            f" ({replays} replays)" if replays != len(self.calls) else "") + (
            ": " + ", ".join(f"#{r.call.index} {r.label} {r.worst}" for r in bad) if bad else ""))
        return "\n".join(lines)


def audit(model: torch.nn.Module | None = None, fla: bool | None = None, kernel: bool = False) -> Auditor:
    """`with audit(model) as recorded: <forward and backward>`; then `print(recorded.report())`.

    `model` only names the module of each call; without it every fla_lab op call is still recorded. With
    flash-linear-attention imported (or `fla=True`) its op calls are recorded too and replayed against fla_lab's
    float64 reference through `fla_lab.spec.upstream`'s mapping (`kernel=True`: and on fla_lab's kernel).
    """
    return Auditor(model, fla=fla, kernel=kernel)


# --- one call ----------------------------------------------------------------------------------------------------

def replay_call(call: hunt.Call, fn=None, replayed_on: str = "") -> CallAudit:
    """The kernel (the call's own, or `fn` with the same signature) and the float64 reference on the call's
    recorded inputs and cotangents; errors per tensor."""
    spec = hunt.spec_of(call)
    fn = fn or call.fn
    dtype = next(t.dtype for _, t in hunt._tensors(call.inputs) if t.is_floating_point())
    cotangent, backward = _recorded_cotangent(call)
    # float64 where the call ran (a GPU's float64 is fast; the reference is a loop over time steps)
    exact = harness.run(hunt.reference_for_call(spec, call.kwargs), harness.exact_leaves(call.inputs, grads=backward),
                        cotangent)
    with contract.value_checks(False), hunt._quiet():  # the model's call got through: let the replay through too
        got = harness.run(fn, harness.leaves(call.inputs, grads=backward), cotangent, **call.kwargs)
    o = got.o if call.output_final_state else _worse(_output_as_called(call, fn), got.o, exact.o)
    pairs = {"o": (o, exact.o), **{n: (got.states[n], s) for n, s in exact.states.items()}}
    errors = {n: check.rel_error(g, r) for n, (g, r) in pairs.items()}
    if backward:  # gradients named as the atlas names them: d + the input's name
        errors.update({f"d{n}": e for n, e in check.grad_errors(exact.grads, got.grads).items()})
        pairs.update({f"d{n}": (got.grads[n], r) for n, r in exact.grads.items()})
    plain = {n: check.rel_error(g, r) for n, (g, r) in pairs.items()}
    peaks = {n: peak(g, r, state=_is_state(n)) for n, (g, r) in pairs.items()}
    return CallAudit(call, dtype, errors, plain, peaks, backward, replayed_on)


def _output_as_called(call: hunt.Call, fn) -> torch.Tensor:
    """The kernel's output with `output_final_state` as the model called it (the replay above asks for the state;
    an op whose output depends on that flag is wrong where the model uses it)."""
    with torch.no_grad(), contract.value_checks(False), hunt._quiet():
        o, _ = fn(**harness.leaves(call.inputs, grads=False), **call.kwargs, output_final_state=False)
    return o


def _worse(a: torch.Tensor, b: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    return a if check.rel_error(a, exact) > check.rel_error(b, exact) else b


def _recorded_cotangent(call: hunt.Call):
    """(cotangent function for harness.run, whether there is a backward): the recorded do and dht, zeros for an
    output or state that got none."""
    dhts = call.dht if isinstance(call.dht, list) else []
    if call.do is None and not any(d is not None for d in dhts):
        return None, False
    if not all(bool(torch.isfinite(d).all()) for d in (call.do, *dhts) if d is not None):
        return None, False  # a NaN sent back from later code: nothing to compare the op's backward on (the locator)

    def cotangent(o, states):
        do = call.do if call.do is not None else torch.zeros_like(o)
        names = list(states)  # "ht", or "ht[0]", "ht[1]": the order the op returns them in
        return do, {n: d for n, d in zip(names, dhts) if d is not None}
    return cotangent, True


def peak(got: torch.Tensor, exact: torch.Tensor, state: bool = False) -> dict:
    """Where |got - exact| is largest (a non-finite entry counts as largest): (b, t, h, d) for a [B, T, H, D]
    sequence tensor, (b, h, k, v) for a `state` [B, H, K, V], else a flat index per dimension."""
    diff = (got.detach().to(torch.float64).cpu() - exact.detach().to(torch.float64).cpu()).abs()
    if diff.numel() == 0:
        return {}
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, math.inf))
    index = torch.unravel_index(diff.argmax(), diff.shape)
    dims = (("b", "h", "k", "v") if state else ("b", "t", "h", "d")) if got.dim() == 4 else \
        tuple(f"i{n}" for n in range(got.dim()))
    return {d: int(i) for d, i in zip(dims, index)}


def _is_state(name: str) -> bool:
    return name.startswith("ht") or name.startswith("dinitial_state")

"""Notebook 06, "Beyond the workbook": the audit on a model built from flash-linear-attention's own layers.

On a GPU with FLA installed the report is run live (`fla_lab.tools.fla_audit`, the `python -m fla_lab audit` command);
elsewhere it is read from the saved GPU run, `fla_lab/tools/gpu_runs/fla_audit_rwkv6_fused.json`, and says so. The
atlas's (initial state, final-state cotangent) axis for FLA's op is read from the GPU atlas's result file.

The exercise: a minimal reproduction, `reproduction(op, x, do, dht)`, a call of the op and a backward that sends a
cotangent into the final state, as a truncated-BPTT segment's next segment does (`do`, `dht`: the check's random
cotangents of the output and the final state, the same for every op it runs). The check runs it on three ops: fla_lab's
`fused_recurrent_rwkv6` and the float64 reference, which must agree, and a stand-in for an op whose backward ignores
that cotangent (as FLA 0.6.0's does), which must not: a reproduction is one that tells the two apart.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from fla_lab.spec import check, harness, reference
from fla_lab.teaching import exercises
from fla_lab.spec import upstream
from fla_lab.tools import gpu_runs
from fla_lab.teaching.lessons import gsa_padding
from fla_lab.ops import fused_recurrent_rwkv6

SAVED = gpu_runs.path("fla_audit_rwkv6_fused")
FLA_OP = "fla:fused_recurrent_rwkv6"
COMMAND = "python -m fla_lab audit --fla rwkv6 --mode fused_recurrent --layers 2 --T 512 --tbptt 2"


def live() -> bool:
    """Whether the audit can run here: FLA installed and a CUDA device."""
    return torch.cuda.is_available() and upstream.version() is not None


def fla_audit_report(path: Path = SAVED) -> None:
    """The audit's report on the FLA model: run now on a GPU with FLA, else the saved GPU run's."""
    if live():
        from fla_lab import __main__ as cli

        cli.main(COMMAND.split()[3:])
        return
    run = json.loads(path.read_text())
    print(f"saved GPU run ({run['device']}, FLA {run['fla_version']}, torch {run['torch']}): {COMMAND}")
    print(f"{'call':<5} {'module':<15} {'op':<27} {'worst':<6} {'error':>8} {'tolerance':>9}  {'peak at':<16} "
          f"{'final-state cotangent':<22} verdict")
    for c in run["calls"]:
        peak = c["peaks"].get(c["worst"], {})
        where = ", ".join(f"{k}={v}" for k, v in peak.items() if k in ("b", "t", "h"))
        print(f"#{c['index']:<4} {c['module'].split()[0]:<15} {c['op']:<27} {c['worst']:<6} "
              f"{c['errors'][c['worst']]:>8.1e} {c['tolerance'][c['worst']]:>9.0e}  {where:<16} "
              f"{'yes' if c['final_state_cotangent'] else 'no':<22} {'right' if c['ok'] else 'WRONG'}")
    print(f"{run['wrong']} of {len(run['calls'])} call(s) beyond tolerance; {run['cost line']}")


def fla_atlas_axis(path: Path = gsa_padding.GPU_ATLAS, op: str = FLA_OP) -> None:
    """FLA's op in the GPU atlas, by (initial state, final-state cotangent): settings right, and the worst error."""
    run = json.loads(path.read_text())
    rows = [r for r in run["records"] if r["op"] == op and r["status"] in ("right", "wrong")]
    env = run["environment"]
    print(f"GPU atlas ({env['device']}, FLA {env.get('fla', '0.6.0')}): {op}, every length and decay it swept")
    for h0 in (False, True):
        for dht in (False, True):
            cell = [r for r in rows if r["h0"] == h0 and r["dht"] == dht]
            worst = max(cell, key=lambda r: max(r["errors"].values()))
            name = max(worst["errors"], key=worst["errors"].get)
            right = sum(r["status"] == "right" for r in cell)
            print(f"  initial state {'yes' if h0 else 'no ':<3}  final-state cotangent {'yes' if dht else 'no ':<3}: "
                  f"right in {right} of {len(cell)}, worst {name} {worst['errors'][name]:.2g}")


class _IgnoresCotangent(torch.autograd.Function):
    """The identity forward; the backward sends nothing on: a final state whose cotangent the op ignores."""

    @staticmethod
    def forward(ctx, ht):
        return ht.view_as(ht)

    @staticmethod
    def backward(ctx, dht):
        return torch.zeros_like(dht)


def ignores_final_state_cotangent(op):
    """`op` with a backward that ignores the final state's cotangent, the flaw the audit found in FLA 0.6.0's
    fused_recurrent_rwkv6 (its numbers: benchmarks/repro/RESULTS.md)."""
    def call(**x):
        o, ht = op(**x)
        return o, (None if ht is None else _IgnoresCotangent.apply(ht))
    return call


def _inputs() -> dict:
    x = harness.gated_inputs(1, 24, 2, 16, 16, bonus=True, names=("r", "k", "v", "w"), seed=3)
    return {n: t for n, t in x.items() if n != "initial_state"}  # the first segment: no initial state


def _cotangents(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, K = x["k"].shape
    V = x["v"].shape[-1]
    do, states = harness.cotangents((B, T, H, V), {"ht": (B, H, K, V)}, seed=3)
    return do, states["ht"]


def _gradients(reproduction, op, dtype) -> dict:
    x = harness.leaves(harness.on_device(_inputs()), dtype=dtype)
    do, dht = (harness.on_device(c).to(dtype) for c in _cotangents(x))
    reproduction(op, x, do, dht)
    grads = {n: t.grad for n, t in x.items()}
    missing = [n for n, g in grads.items() if g is None]
    if missing:
        raise ValueError(f"no gradient reached {', '.join(missing)}: run a backward through the op's output")
    return grads


_LINE = exercises.Sealed("bG9zcyA9IChvICogZG8pLnN1bSgpICsgKGh0ICogZGh0KS5zdW0oKQ==")  # the solution, sealed


def _supplied_cotangents(op, x, do, dht) -> None:
    """The check's own backward: the supplied cotangents sent into the output and the final state."""
    torch.autograd.backward(op(**x, output_final_state=True), (do, dht))


def _worst(got: dict, exact: dict) -> tuple[str, float]:
    errors = {n: check.rel_error(got[n].double().cpu(), exact[n].double().cpu()) for n in exact}
    name = max(errors, key=errors.get)
    return name, errors[name]


def check_fla_reproduction(reproduction) -> exercises.Verdict:
    """PASS when `reproduction(op, x, do, dht)` gives fla_lab's op the float64 reference's gradients and an op that ignores the
    final state's cotangent other ones (beyond fp32's tolerance)."""
    name = "the reproduction of the FLA call"
    tol = check.tolerance(torch.float32).of("dk")
    try:
        exact = _gradients(reproduction, reference.recurrent_rwkv6, torch.float64)
        ours = _gradients(reproduction, fused_recurrent_rwkv6, torch.float32)
        flawed = _gradients(reproduction, ignores_final_state_cotangent(fused_recurrent_rwkv6), torch.float32)
    except Exception as exc:  # the learner's code: any error is a result to explain
        return exercises.Verdict(name, False, [f"it raised {type(exc).__name__}: {str(exc)[:160]}"],
                                 hints=("Call `op(**x, output_final_state=True)`: it returns the output and the "
                                        "final state; then one `.backward()` of a scalar built from both.",))
    asked_name, asked_err = _worst(exact, _gradients(_supplied_cotangents, reference.recurrent_rwkv6, torch.float64))
    if asked_err > 1e-12:  # float64 both ways: only another loss differs
        return exercises.Verdict(name, False, [
            f"your backward on the float64 reference against one that weights o by do and ht by dht: worst "
            f"{asked_name} {asked_err:.1e}"], hints=(
            "The check hands you the cotangents `do` and `dht`, drawn at random: the next segment's gradient is "
            "not a constant.",
            "Your loss does not weight the output by `do` and the final state by `dht` (`ht.sum()` weights every "
            "entry by 1, a `dht` of ones), so the final state's share is not the one the model sends back.",
            _LINE))
    ours_name, ours_err = _worst(ours, exact)
    flawed_name, flawed_err = _worst(flawed, exact)
    facts = [f"fla_lab's op against float64: worst {ours_name} {ours_err:.1e} (tolerance {tol:g})",
             f"an op that ignores the final state's cotangent: worst {flawed_name} {flawed_err:.1e}"]
    if ours_err > tol:
        return exercises.Verdict(name, False, facts, hints=(
            "The reproduction should be right on a correct op: keep the call as the model makes it (no extra "
            "scaling of the inputs) and compare gradients, not values you changed after the call.",))
    if flawed_err <= tol:
        return exercises.Verdict(name, False, facts, hints=(
            "Which calls were wrong in the report: the ones whose final state fed the next segment.",
            "Your backward sends nothing into the final state, so an op that ignores its cotangent looks right.",
            exercises.Sealed.of(f"Add the next segment's share to the loss: `{_LINE.opened()}`."),))
    return exercises.Verdict(name, True, facts + ["it tells a correct op from one that drops dht: report-ready"])

#!/usr/bin/env python3
"""GSA's fp32 gradients at large slot logits (the atlas's `q_scales=(100,)`, the range of the slot-softmax
safeguards): how far chunk_gsa and fused_recurrent_gsa are from float64, beside the same recurrence run in fp32
arithmetic (what any fp32 implementation can be expected to reach on these inputs: the problem's conditioning).

    python benchmarks/repro/gsa_large_logits.py [--out FILE.json] [--stages]

`--stages` splits chunk_gsa's error at q x100, T = 64 by where it enters: the slot scores pass 1 saves (absolute
error against float64, per chunk size, beside the same scores from the fp32 recurrence), the softmax backward's
d(scores), and the gradients when that d(scores) is replaced by the exact one (what the two backward passes add).

Shape as the removal lesson's (B=1, H=1, K=V=M=16), fp32, decay 1, an initial state and a final-state cotangent.
"""
from __future__ import annotations

import argparse
import json

import torch

import fla_lab
from fla_lab.tools import atlas
from fla_lab.spec import check, harness, reference, registry
from fla_lab import runtime

SHAPE = dict(B=1, H=1, K=16, V=16, M=16)


def fp32_reference_run(spec, rounded, cot):
    """The reference recurrence with its float64 casts made fp32 casts: the same algorithm in fp32 arithmetic."""
    original = reference._f64
    reference._f64 = lambda *xs: [None if x is None else x.to(torch.float32) for x in xs]
    try:
        return harness.run(spec.reference, harness.leaves(rounded), cot)
    finally:
        reference._f64 = original


def measure(q_scale: float, T: int) -> dict:
    row = {"q_scale": q_scale, "T": T}
    gsa = registry.get("chunk_gsa")
    inputs = atlas.scale_queries(gsa.inputs(registry.Shape(T=T, **SHAPE), decay=1.0, initial_state=True, seed=0),
                                 q_scale)
    rounded = harness.leaves(inputs, torch.float32, runtime.device())
    exact, cot = harness.exact_run(gsa.reference, rounded, seed=0, state_grad=True, device=runtime.device())
    runs = {"fp32 recurrence": lambda: fp32_reference_run(gsa, rounded, cot),
            "chunk_gsa": lambda: harness.run(gsa.fn, harness.leaves(rounded), cot),
            "chunk_gsa chunk 16": lambda: harness.run(gsa.op(chunk_size=16), harness.leaves(rounded), cot),
            "fused_recurrent_gsa": lambda: harness.run(registry.get("fused_recurrent_gsa").fn, harness.leaves(rounded),
                                                       cot)}
    for name, run in runs.items():
        try:
            result = atlas.measurement._compare(run(), exact, torch.float32)
            row[name] = {"status": result["status"], **{k: float(v) for k, v in result["errors"].items()}}
        except Exception as exc:  # a run that fails is reported, the others still run
            row[name] = {"status": "raises", "message": f"{type(exc).__name__}: {exc}"[:200]}
    return row


def exact_slot_scores(rounded, cot):
    """The float64 pass-1 scores and their cotangent d(scores), from the reference's own steps."""
    lv = harness.exact_leaves(rounded)
    hk0, hv0 = lv["initial_state"]
    s, g = reference._gsa_gates(lv["s"], lv["g"])
    scores, hk = reference._gated_loop(lv["q"], lv["k"], s, gv=g, scale=lv["q"].shape[-1] ** -0.5, h0=hk0)
    scores.retain_grad()
    o, hv = reference._gated_loop(scores.softmax(-1), s, lv["v"], gk=g, scale=1.0, h0=hv0)
    do, dht = cot
    loss = (o * do.to(o)).sum() + sum((h * d.to(h)).sum() for h, d in zip((hk, hv), dht.values()))
    loss.backward()
    return scores.detach(), scores.grad.detach()


def stages(q_scale: float = 100.0, T: int = 64) -> list[str]:
    """Where chunk_gsa's gradient error enters (see the module docstring): one line per measurement."""
    from fla_lab.ops.common.launch import resolve
    from fla_lab.ops.gsa import chunk as gsa_chunk

    gsa = registry.get("chunk_gsa")
    inputs = atlas.scale_queries(gsa.inputs(registry.Shape(T=T, **SHAPE), decay=1.0, initial_state=True, seed=0),
                                 q_scale)
    rounded = harness.leaves(inputs, torch.float32, runtime.device())
    exact, cot = harness.exact_run(gsa.reference, rounded, seed=0, state_grad=True, device=runtime.device())
    scores, dscores = exact_slot_scores(rounded, cot)
    x = {n: (tuple(t.detach() for t in v) if isinstance(v, tuple) else v.detach()) for n, v in rounded.items()}
    lines = [f"q x{q_scale:g}, T={T}: |scores| max {float(scores.abs().max()):.0f} (fp32 ulp there "
             f"{float(scores.abs().max()) * 2 ** -23:.1e})"]
    for BT in (16, 64):
        got, *_ = gsa_chunk.slot_pass_fwd(x["q"], x["k"], x["s"], gsa_chunk.chunk_cumsum(x["g"], BT), SHAPE["K"] ** -0.5,
                                          x["initial_state"][0], True, BT, resolve(None, "chunk", x["q"]))
        lines.append(f"  pass-1 scores, chunk {BT}: abs error max {float((got.double() - scores).abs().max()):.1e}")
    s32, g32 = (x["s"].float(), x["g"].float())
    fp32, _ = reference._gated_loop(x["q"].float(), x["k"].float(), s32, gv=g32, scale=SHAPE["K"] ** -0.5,
                                    h0=x["initial_state"][0].float())
    lines.append(f"  pass-1 scores, fp32 recurrence: abs error max {float((fp32.double() - scores).abs().max()):.1e}")
    shipped = gsa_chunk.slot_softmax_backward

    def exact_backward(x_, dp, rows, out=None):
        got = shipped(x_, dp, rows, out=out)
        lines.append(f"  softmax backward d(scores): rel error {check.rel_error(got, dscores):.1e}")
        return got.copy_(dscores.reshape(got.shape))

    for BT in (16, 64):
        gsa_chunk.slot_softmax_backward = exact_backward
        try:
            run = harness.run(gsa.op(chunk_size=BT), harness.leaves(rounded), cot)
        finally:
            gsa_chunk.slot_softmax_backward = shipped
        errors = atlas.measurement._compare(run, exact, torch.float32)["errors"]
        lines.append(f"  chunk {BT}, exact d(scores): " + ", ".join(f"{k} {errors[k]:.1e}" for k in
                                                                  ("dq", "dk", "ds", "dg")))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="JSON of every error")
    parser.add_argument("--stages", action="store_true", help="where the error enters (q x100, T = 64)")
    args = parser.parse_args()
    if args.stages:
        print(f"device: {runtime.describe().get('gpu', 'cpu (interpreter)')}")
        print("\n".join(stages()), flush=True)
        return 0
    rows = []
    print(f"device: {runtime.describe().get('gpu', 'cpu (interpreter)')}; fp32 tolerance (grad) 5e-05")
    for q_scale in (1.0, 30.0, 100.0):
        for T in (33, 64):
            row = measure(q_scale, T)
            rows.append(row)
            for name in ("fp32 recurrence", "chunk_gsa", "chunk_gsa chunk 16", "fused_recurrent_gsa"):
                r = row[name]
                worst = max((v for k, v in r.items() if k not in ("status", "message")), default=float("nan"))
                which = ", ".join(f"{k} {v:.1e}" for k, v in r.items() if k in ("dk", "ds", "dg", "dq", "o"))
                print(f"q x{q_scale:<4g} T={T:<3} {name:<20} {r['status']:<9} worst {worst:.1e}  ({which})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": runtime.describe().get("gpu", "cpu"), "fla_lab": fla_lab.__version__, "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""GSA's fp32 gradients at large slot logits (the atlas's `q_scales=(100,)`, the range of the slot-softmax
safeguards): how far chunk_gsa and fused_recurrent_gsa are from float64, beside the same recurrence run in fp32
arithmetic (what any fp32 implementation can be expected to reach on these inputs: the problem's conditioning).

    python benchmarks/repro/gsa_large_logits.py [--out FILE.json]

Shape as the removal lesson's (B=1, H=1, K=V=M=16), fp32, decay 1, an initial state and a final-state cotangent.
"""
from __future__ import annotations

import argparse
import json

import torch

import fla_lab
from fla_lab import atlas, harness, reference, registry, runtime

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
            result = atlas._compare(run(), exact, torch.float32)
            row[name] = {"status": result["status"], **{k: float(v) for k, v in result["errors"].items()}}
        except Exception as exc:  # a run that fails is reported, the others still run
            row[name] = {"status": "raises", "message": f"{type(exc).__name__}: {exc}"[:200]}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="JSON of every error")
    args = parser.parse_args()
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

#!/usr/bin/env python3
"""FLA's `test_gla.py::test_chunk[B1-T128-H4-D512-gate_logit_normalizer1-bfloat16]` case, each side measured
against float64: FLA's test compares chunk_gla with fused_recurrent_gla (both fla_lab's under dev/fla_tests.py)
by FLA's error ratio (RMS of the difference over the RMS of the reference) with a 0.005 limit. Here each op's output,
final state and gradients get the same ratio against the float64 recurrence on the same bf16 inputs and
cotangents, so a miss of the pair's limit is traced to the side that carries it.

    python benchmarks/repro/gla_d512_bf16.py [--D 512] [--T 128] [--H 4]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from fla_lab.spec import reference
from fla_lab import runtime
from fla_lab.ops import chunk_gla, fused_recurrent_gla


def ratio(ref: torch.Tensor, got: torch.Tensor) -> float:
    """FLA's `get_err_ratio`: RMS(ref - got) / RMS(ref)."""
    ref, got = ref.detach().double(), got.detach().double()
    return float((ref - got).square().mean().sqrt() / (ref.square().mean().sqrt() + 1e-8))


def fla_test_inputs(B, T, H, D, device, dtype=torch.bfloat16, normalizer=1.0):
    """The test's own draws, in its order, from seed 42."""
    torch.manual_seed(42)
    q, k, v = (torch.rand((B, T, H, D), dtype=dtype, device=device) for _ in range(3))
    g = F.logsigmoid(torch.rand((B, T, H, D), dtype=dtype, device=device)) / normalizer
    h0 = torch.rand((B, H, D, D), dtype=torch.float32, device=device)
    do = torch.randn_like(v)
    dht = torch.randn((B, H, D, D), dtype=torch.float32, device=device)
    return dict(q=q, k=k, v=v, g=g, initial_state=h0), do, dht


def run(fn, inputs, do, dht, gate_name="g"):
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.items()}
    args = dict(leaves)
    if gate_name != "g":
        args[gate_name] = args.pop("g")
    o, ht = fn(**args, output_final_state=True)
    ((o * do.to(o.dtype)).sum() + (ht * dht.to(ht.dtype)).sum()).backward()
    return {"o": o, "ht": ht, **{f"d{n}": t.grad for n, t in leaves.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=1)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--D", type=int, default=512)
    args = parser.parse_args()
    device = runtime.device()
    inputs, do, dht = fla_test_inputs(args.B, args.T, args.H, args.D, device)
    exact = run(reference.recurrent_gla, {n: t.double() for n, t in inputs.items()}, do.double(), dht.double())
    chunk = run(chunk_gla, inputs, do, dht)
    fused = run(fused_recurrent_gla, inputs, do, dht, gate_name="gk")
    print(f"device: {runtime.describe().get('gpu', 'cpu (interpreter)')}; B={args.B} T={args.T} H={args.H} "
          f"K=V={args.D} bf16; FLA's error ratio (limit 0.005, o 0.004)")
    print(f"{'tensor':<16}{'chunk vs fused':>16}{'chunk vs f64':>14}{'fused vs f64':>14}")
    for name in exact:
        print(f"{name:<16}{ratio(fused[name], chunk[name]):>16.5f}{ratio(exact[name], chunk[name]):>14.5f}"
              f"{ratio(exact[name], fused[name]):>14.5f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

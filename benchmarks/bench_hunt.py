"""What the NaN locator and the audit cost: one training step of a 12-layer RWKV-7 model, bf16 autocast, with and
without `fla_lab.tools.hunt.locate` around it (a clean step: no replay, only the copies, the checks and the precision
audit), inside `fla_lab.tools.audit.audit` (recording), and the audit's `report()` (each call replayed, kernel and float64).

Run: `python benchmarks/bench_hunt.py [--out DIR]` (CUDA: hidden 1024, T 2048; CPU: a tiny model, for a smoke run).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from torch import nn  # noqa: E402

import fla_lab  # noqa: E402
from fla_lab.tools import audit, hunt  # noqa: E402
from fla_lab.layers import RWKV7Attention  # noqa: E402


def model(depth, hidden, device):
    layers = [RWKV7Attention("chunk", hidden_size=hidden, head_dim=64, layer_idx=i, num_hidden_layers=depth)
              for i in range(depth)]
    return nn.ModuleList(layers).to(device)


def step(layers, x):
    v_first, h = None, x
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        for layer in layers:
            out, _, _, v_first = layer(h, v_first=v_first)
            h = h + out
    h.float().pow(2).mean().backward()


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    cuda = fla_lab.device() == "cuda"
    depth, hidden, T, repeat = (12, 1024, 2048, 5) if cuda else (2, 64, 32, 2)
    layers = model(depth, hidden, fla_lab.device())
    x = torch.randn(2, T, hidden, device=fla_lab.device())

    def located():
        with hunt.locate(layers, replay=False):
            step(layers, x)

    recorded = []

    def audited():
        with audit.audit(layers) as rec:
            step(layers, x)
        recorded[:] = [rec]

    step(layers, x)  # compile
    located()
    audited()
    plain_ms, located_ms = timed(lambda: step(layers, x), repeat), timed(located, repeat)
    audited_ms = timed(audited, repeat)
    start = time.perf_counter()
    wrong = recorded[0].wrong()
    report_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")
    row = {"device": fla_lab.runtime.describe().get("gpu", "cpu"), "torch": torch.__version__,
           "triton": triton.__version__, "date": datetime.date.today().isoformat(), "depth": depth, "hidden": hidden,
           "T": T,
           "plain_ms": plain_ms, "located_ms": located_ms, "ratio": located_ms / plain_ms, "peak_MiB": peak,
           "audited_ms": audited_ms, "audit_ratio": audited_ms / plain_ms, "audit_report_s": report_s,
           "audit_calls": len(recorded[0].calls), "audit_wrong": len(wrong)}
    with open(os.path.join(args.out, "bench_hunt.json"), "w") as f:
        json.dump(row, f, indent=1)
    print(f"locator overhead, {depth}-layer RWKV-7 step (B=2, T={T}, hidden {hidden}, bf16 autocast): "
          f"{plain_ms:.1f} ms -> {located_ms:.1f} ms ({row['ratio']:.2f}x)")
    print(f"audit: recording {audited_ms:.1f} ms ({row['audit_ratio']:.2f}x); report() of {row['audit_calls']} calls "
          f"{report_s:.1f} s, {len(wrong)} beyond tolerance")
    print(recorded[0].report())


if __name__ == "__main__":
    main()

"""What the NaN locator and the audit cost: one training step of a 12-layer RWKV-7 model, bf16 autocast, with and
without `fla_lab.tools.hunt.locate` around it (a clean step: no replay, only the copies, the checks and the precision
audit), inside `fla_lab.tools.audit.audit` (recording), and the audit's `report()` (each call replayed, kernel and float64).

Run: `python -m benchmarks.hunt_cost [--out DIR]` (CUDA: hidden 1024, T 2048; CPU: a tiny model, for a smoke run).
It writes bench_hunt.json to DIR: by default, on a GPU, the copy the lessons show (`fla_lab.tools.gpu_runs`), on the
CPU the current folder (a smoke run does not replace a GPU run); a copy goes to $OUT.
"""
import argparse
import os
import time

import torch
from torch import nn

import fla_lab
from benchmarks import common
from fla_lab.layers import RWKV7Attention
from fla_lab.tools import audit, gpu_runs, hunt


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="folder for bench_hunt.json (default: the shipped copy on a GPU, else .)")
    args = parser.parse_args()
    cuda = fla_lab.device() == "cuda"
    out = args.out or (gpu_runs.FOLDER if cuda else ".")
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
    plain_ms, located_ms = common.wall_ms(lambda: step(layers, x), repeat), common.wall_ms(located, repeat)
    audited_ms = common.wall_ms(audited, repeat)
    start = time.perf_counter()
    wrong = recorded[0].wrong()
    report_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")
    row = {**common.environment(fla_lab.runtime.describe().get("gpu", "cpu")), "depth": depth, "hidden": hidden,
           "T": T,
           "plain_ms": plain_ms, "located_ms": located_ms, "ratio": located_ms / plain_ms, "peak_MiB": peak,
           "audited_ms": audited_ms, "audit_ratio": audited_ms / plain_ms, "audit_report_s": report_s,
           "audit_calls": len(recorded[0].calls), "audit_wrong": len(wrong)}
    common.write_json(row, os.path.join(out, "bench_hunt.json"))
    print(f"locator overhead, {depth}-layer RWKV-7 step (B=2, T={T}, hidden {hidden}, bf16 autocast): "
          f"{plain_ms:.1f} ms -> {located_ms:.1f} ms ({row['ratio']:.2f}x)")
    print(f"audit: recording {audited_ms:.1f} ms ({row['audit_ratio']:.2f}x); report() of {row['audit_calls']} calls "
          f"{report_s:.1f} s, {len(wrong)} beyond tolerance")
    print(recorded[0].report())


if __name__ == "__main__":
    main()

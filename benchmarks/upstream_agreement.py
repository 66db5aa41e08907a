"""On a GPU: fla_lab's float64 references against flash-linear-attention 0.6.0's kernels, fp32.

Forward output, final state and every input gradient, relative Frobenius error (fla_lab.spec.check), over a few
shapes and decay strengths. Run: `python -m benchmarks.upstream_agreement` (needs CUDA and `fla` importable); it
writes benchmarks/results/upstream_agreement.json (`--out`) and a copy to $OUT.
Upstream's fp32 dots default to TF32; like upstream's own tests we set TRITON_F32_DEFAULT=ieee.
"""
import argparse
import os
import time

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks import common  # noqa: E402
from fla_lab.spec import harness, reference, upstream  # noqa: E402

OPS = ("chunk_gla", "fused_recurrent_gla", "chunk_gsa", "chunk_rwkv6", "fused_recurrent_rwkv6", "chunk_rwkv7")


def fla_ops():
    """FLA's ops, autotuning pinned: accuracy, not speed, is measured here."""
    upstream.pin_autotune_to_first_config()
    return common.upstream_ops(OPS)


def gsa_pair(op):
    """GSA's state is a pair: flatten it into one tensor so the harness can compare it."""
    def run(q, k, v, s, g, hk0, hv0, output_final_state=True, **kw):
        o, (hk, hv) = op(q, k, v, s, g, initial_state=(hk0, hv0), output_final_state=True, **kw)
        return o, torch.cat([hk.flatten(), hv.flatten()])
    return run


def rwkv7_inputs(B, T, H, K, V, gen):
    kk = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    return {"r": torch.randn(B, T, H, K, generator=gen), "w": -0.6065 * torch.rand(B, T, H, K, generator=gen),
            "k": torch.randn(B, T, H, K, generator=gen), "v": torch.randn(B, T, H, V, generator=gen),
            "a": -kk, "b": kk * torch.rand(B, T, H, K, generator=gen),
            "initial_state": torch.randn(B, H, K, V, generator=gen)}


def gsa_inputs(B, T, H, K, V, M, decay, gen):
    return {"q": torch.randn(B, T, H, K, generator=gen), "k": torch.randn(B, T, H, K, generator=gen),
            "v": torch.randn(B, T, H, V, generator=gen), "s": torch.randn(B, T, H, M, generator=gen),
            "g": harness.log_decay((B, T, H, M), decay, gen),
            "hk0": torch.randn(B, H, K, M, generator=gen), "hv0": torch.randn(B, H, M, V, generator=gen)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(common.RESULTS / "upstream_agreement.json"))
    args = p.parse_args(argv)
    common.require_cuda("upstream_agreement")
    ops = fla_ops()
    rows = []
    first = True
    for (B, T, H, K, V), decay in [((1, 128, 2, 64, 64), 1.0), ((2, 100, 2, 32, 64), 10.0), ((1, 200, 1, 64, 32), 0.1)]:
        gen = torch.Generator().manual_seed(T)
        gla = harness.gated_inputs(B, T, H, K, V, decay=decay, seed=T)
        rw6 = harness.gated_inputs(B, T, H, K, V, decay=decay, bonus=True, names=("r", "k", "v", "w"), seed=T)
        cases = [
            ("chunk_gla", ops["chunk_gla"], reference.recurrent_gla, gla),
            ("fused_recurrent_gla", lambda q, k, v, g, **kw: ops["fused_recurrent_gla"](q, k, v, gk=g, **kw),
             reference.recurrent_gla, gla),
            ("chunk_rwkv6", ops["chunk_rwkv6"], reference.recurrent_rwkv6, rw6),
            ("fused_recurrent_rwkv6", ops["fused_recurrent_rwkv6"], reference.recurrent_rwkv6, rw6),
            ("chunk_gsa", gsa_pair(ops["chunk_gsa"]), gsa_pair(reference.recurrent_gsa),
             gsa_inputs(B, T, H, K, V, 32, decay, gen)),
        ]
        if first:  # checked once, after everything else: upstream's fp32 chunk_rwkv7 compiles slowly
            extra = [("fused_recurrent_rwkv6 (no dht)", ops["fused_recurrent_rwkv6"], reference.recurrent_rwkv6, rw6),
                     ("chunk_rwkv7", ops["chunk_rwkv7"], reference.recurrent_rwkv7, rwkv7_inputs(B, T, H, K, V, gen))]
        first = False
        run_cases(cases, rows, (B, T, H, K, V), decay)
    run_cases(extra, rows, (1, 128, 2, 64, 64), 1.0)
    report(rows, args.out)


def run_cases(cases, rows, shape, decay):
    B, T, H, K, V = shape
    env = common.environment(fla=True)  # in every row: docs/performance.md names them beside each number
    for name, op, ref, inputs in cases:
        start = time.time()
        result = harness.compare(op, ref, inputs, dtype=torch.float32, state_grad="no dht" not in name)
        rows.append({"op": name, "shape": [B, T, H, K, V], "decay": decay, "errors": result.errors, **env})
        print(f"{name:<22} B,T,H,K,V={B},{T},{H},{K},{V} |g|~{decay:<5} max err {max(result.errors.values()):.1e}"
              f"  {result}  ({time.time() - start:.0f}s)", flush=True)


def report(rows, path):
    common.write_json(rows, path)
    worst = {}
    for row in rows:
        worst[row["op"]] = max(worst.get(row["op"], 0.0), max(row["errors"].values()))
    print("\nworst relative error per op (fp32, forward and every gradient):")
    for op, err in worst.items():
        print(f"  {op:<22} {err:.1e}")


if __name__ == "__main__":
    main()

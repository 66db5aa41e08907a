"""GPU benchmark: packed variable-length batches (`cu_seqlens`) beside flash-linear-attention 0.6.0, in one run.

N sequences of random lengths (seeded) packed into B = 1, T tokens in all; bf16, H=16, K=V=64 (GSA M=64). For each
op: forward and forward+backward `do_bench` medians of fla_lab's varlen call (one call of the op per sequence,
`fla_lab/ops/common/conventions.py`), FLA's (one fused launch over the pack), and, as the floor fla_lab's per-sequence
calls could reach, fla_lab on the same tokens as one dense batch of equal lengths (B = N, T / N each).

Usage on a GPU: python benchmarks/bench_varlen.py [--only chunk_gla chunk_rwkv7] [--out-dir DIR]
(writes varlen.json and varlen.md to DIR, default benchmarks/results)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench  # noqa: E402

N_SEQS, TOKENS, SEED = 8, 32768, 0
OPS = ("chunk_gla", "chunk_rwkv6", "chunk_gsa", "chunk_rwkv7", "fused_recurrent_rwkv6")
INPUTS = {"chunk_gla": lambda **s: bench.gated(False, **s), "chunk_rwkv6": lambda **s: bench.gated(True, **s),
          "fused_recurrent_rwkv6": lambda **s: bench.gated(True, **s), "chunk_gsa": bench.gsa,
          "chunk_rwkv7": bench.rwkv7}


def random_offsets(n=N_SEQS, tokens=TOKENS, seed=SEED):
    """`[0, ..., tokens]`: n lengths of at least 1, cut at n - 1 distinct random points."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(tokens - 1, generator=g)[: n - 1] + 1
    return torch.cat([torch.zeros(1, dtype=torch.long), cuts.sort().values, torch.tensor([tokens])])


def time_call(fn, inputs, kwargs):
    x = bench.on_device(inputs)
    do = bench.cotangent(x)
    return bench.forward_ms(fn, x, kwargs), bench.forward_backward_ms(fn, x, do, kwargs)


def measure(name, ours, theirs, offsets):
    torch.manual_seed(SEED)
    packed = INPUTS[name](B=1, T=TOKENS)
    cu = offsets.cuda()
    row = {"op": name, "lengths": offsets.diff().tolist()}
    row["fla_lab"] = time_call(ours[name][0], packed, {**ours[name][2], "cu_seqlens": cu})
    if name in theirs:
        row["fla"] = time_call(theirs[name][0], packed, {**theirs[name][2], "cu_seqlens": cu})
    dense = INPUTS[name](B=N_SEQS, T=TOKENS // N_SEQS)
    row["fla_lab_dense"] = time_call(ours[name][0], dense, ours[name][2])
    print(row, flush=True)
    return row


def ratio(row, i):
    return f"{row['fla_lab'][i] / row['fla'][i]:.2f}x" if "fla" in row else "-"


def table(rows, meta):
    lines = [f"# Packed variable-length batches beside flash-linear-attention", "",
             f"- {meta}", f"- lengths: {rows[0]['lengths']} (B = 1, T = {TOKENS}); bf16, H={bench.H}, K=V={bench.K}",
             "- fla_lab runs one call of the op per sequence; FLA one fused launch over the pack; `dense`: fla_lab on "
             f"B = {N_SEQS} sequences of {TOKENS // N_SEQS} tokens (the same token count, one call)", "",
             "| op | fwd ms fla_lab | fwd ms FLA | fwd ratio | fwd+bwd ms fla_lab | fwd+bwd ms FLA | fwd+bwd ratio | "
             "fwd+bwd ms fla_lab dense |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fla = r.get("fla", ("-", "-"))
        fmt = [f"{v:.3f}" if isinstance(v, float) else v for v in (*r["fla_lab"], *fla, *r["fla_lab_dense"])]
        lines.append(f"| {r['op']} | {fmt[0]} | {fmt[2]} | {ratio(r, 0)} | {fmt[1]} | {fmt[3]} | {ratio(r, 1)} | "
                     f"{fmt[5]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    ours, theirs = bench.cases()
    offsets = random_offsets()
    rows = [measure(name, ours, theirs, offsets) for name in args.only]
    import triton
    from datetime import date
    meta = (f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
            f"{date.today().isoformat()}")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "varlen.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out_dir, "varlen.md"), "w") as f:
        f.write(table(rows, meta))
    print(table(rows, meta))


if __name__ == "__main__":
    main()

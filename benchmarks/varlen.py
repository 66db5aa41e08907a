"""Packed variable-length batches (`cu_seqlens`) on a GPU, fla_lab beside flash-linear-attention 0.6.0, in one run.

N sequences of random lengths (seeded) packed into B = 1, T tokens in all; bf16, H=16, K=V=64 (GSA M=64). For each
op and N: forward and forward+backward `do_bench` medians of fla_lab's varlen call (one launch per kernel over the
pack, `fla_lab.ops.common.conventions.Packed`), FLA's (the same), fla_lab called once per sequence (how fla_lab ran
packed batches before), and fla_lab on the same tokens as one dense batch of equal lengths (B = N, T / N each).

Usage on a GPU: python -m benchmarks.varlen [--only chunk_gla chunk_rwkv7] [--n-seqs 8 64] [--out-dir DIR]
(writes varlen.json and varlen.md to DIR, default benchmarks/results; copies to $OUT)
"""
import argparse
import os

import torch

from benchmarks import common
from fla_lab import ops

N_SEQS, TOKENS, SEED = 8, 32768, 0
OPS = ("chunk_gla", "chunk_rwkv6", "chunk_gsa", "chunk_rwkv7", "fused_recurrent_rwkv6")


def random_offsets(n=N_SEQS, tokens=TOKENS, seed=SEED):
    """`[0, ..., tokens]`: n lengths of at least 1, cut at n - 1 distinct random points."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(tokens - 1, generator=g)[: n - 1] + 1
    return torch.cat([torch.zeros(1, dtype=torch.long), cuts.sort().values, torch.tensor([tokens])])


def time_call(fn, inputs, kwargs):
    x = common.on_device(inputs)
    do = common.cotangent(x)
    return common.forward_ms(fn, x, kwargs), common.forward_backward_ms(fn, x, do, kwargs)


def one_call_per_sequence(fn, offsets):
    """fn on each packed sequence's rows alone, outputs joined (no states): fla_lab's varlen before one launch."""
    bounds = list(zip(offsets[:-1].tolist(), offsets[1:].tolist()))

    def run(*x, **kwargs):
        outs = [fn(*[t[:, bos:eos] if t.dim() == 4 else t for t in x], **kwargs)[0] for bos, eos in bounds]
        return torch.cat(outs, 1), None
    return run


def measure(name, upstream, offsets):
    """fla_lab's varlen call, FLA's (when importable), fla_lab once per sequence and fla_lab on a dense batch of the
    same tokens; both libraries with the scaling benchmark's keywords (`common.op_kwargs`)."""
    torch.manual_seed(SEED)
    packed = common.INPUTS[name](B=1, T=TOKENS)
    cu = offsets.cuda()
    n = len(offsets) - 1
    ours, kwargs = getattr(ops, name), common.op_kwargs(name)
    row = {"op": name, "N": n, "lengths": offsets.diff().tolist()}
    row["fla_lab"] = time_call(ours, packed, {**kwargs, "cu_seqlens": cu})
    if name in upstream:
        row["fla"] = time_call(upstream[name], packed, {**kwargs, "cu_seqlens": cu})
    row["fla_lab_loop"] = time_call(one_call_per_sequence(ours, offsets), packed, kwargs)
    dense = common.INPUTS[name](B=n, T=TOKENS // n)
    row["fla_lab_dense"] = time_call(ours, dense, kwargs)
    print(row, flush=True)
    return row


def ratio(row, i):
    return f"{row['fla_lab'][i] / row['fla'][i]:.2f}x" if "fla" in row else "-"


def table(rows, meta):
    lengths = "; ".join(f"N = {r['N']}: {r['lengths']}" for r in rows if r["op"] == rows[0]["op"])
    lines = ["# Packed variable-length batches beside flash-linear-attention", "",
             f"- {meta}", f"- B = 1, T = {TOKENS}; bf16, H={common.H}, K=V={common.K} (GSA M={common.M}); lengths "
             f"(seed {SEED}): {lengths}",
             "- fla_lab and FLA: one launch per kernel over the pack; `loop`: fla_lab called once per sequence (its "
             "varlen path before); `dense`: fla_lab on B = N sequences of T / N tokens (the same token count)", "",
             "| op | N | fwd ms fla_lab | fwd ms FLA | fwd ratio | fwd+bwd ms fla_lab | fwd+bwd ms FLA | fwd+bwd ratio "
             "| fwd+bwd ms loop | fwd+bwd ms dense |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fla = r.get("fla", ("-", "-"))
        fmt = [f"{v:.3f}" if isinstance(v, float) else v
               for v in (*r["fla_lab"], *fla, *r["fla_lab_loop"], *r["fla_lab_dense"])]
        lines.append(f"| {r['op']} | {r['N']} | {fmt[0]} | {fmt[2]} | {ratio(r, 0)} | {fmt[1]} | {fmt[3]} | "
                     f"{ratio(r, 1)} | {fmt[5]} | {fmt[7]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--n-seqs", nargs="+", type=int, default=[N_SEQS, 64])
    p.add_argument("--out-dir", default=str(common.RESULTS))
    args = p.parse_args(argv)
    common.require_cuda("varlen")
    upstream = common.upstream_ops_or_none(OPS)
    rows = [measure(name, upstream, random_offsets(n)) for name in args.only for n in args.n_seqs]
    env = common.environment()
    meta = f"device: {env['device']}; torch {env['torch']}, triton {env['triton']}; {env['date']}"
    common.write_json({"meta": meta, "rows": rows}, os.path.join(args.out_dir, "varlen.json"))
    with open(os.path.join(args.out_dir, "varlen.md"), "w") as f:
        f.write(table(rows, meta))
    common.copy_to_out(os.path.join(args.out_dir, "varlen.md"))
    print(table(rows, meta))


if __name__ == "__main__":
    main()

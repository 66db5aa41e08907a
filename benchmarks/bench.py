"""GPU benchmark: fla_lab's kernels beside flash-linear-attention 0.6.0's, in one run.

bf16, B=8, T=4096, H=16, K=V=64 (upstream-baseline.md), `triton.testing.do_bench` medians of the forward and of
forward+backward (`fn(*x)[0].backward(do)` with fresh gradients). Writes benchmarks/results/bench.json (and a copy
to $OUT when set); `python benchmarks/plot_bench.py` draws the figure from it on any machine.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import fla_lab  # noqa: E402,F401
from fla_lab import ops  # noqa: E402

B, T, H, K, V, M = 8, 4096, 16, 64, 64, 64
DTYPE = torch.bfloat16


def gated(bonus, B=B, T=T, H=H):
    x = [torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V),
         F.logsigmoid(torch.randn(B, T, H, K))]
    if bonus:
        x.append(torch.randn(H, K))
    return x


def gsa(B=B, T=T, H=H):
    return [torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V), torch.randn(B, T, H, M),
            F.logsigmoid(torch.randn(B, T, H, M))]


def rwkv7(B=B, T=T, H=H):
    kk = F.normalize(torch.randn(B, T, H, K), dim=-1)
    return [torch.randn(B, T, H, K), -0.6065 * torch.rand(B, T, H, K), torch.randn(B, T, H, K),
            torch.randn(B, T, H, V), -kk, kk * torch.rand(B, T, H, K)]


def upstream_ops() -> dict:
    """flash-linear-attention 0.6.0's ops by name (ImportError when `fla` is missing). Its fused_recurrent_rwkv7
    is inference only: its backward raises NotImplementedError."""
    from fla.ops.gla import chunk_gla
    from fla.ops.gsa import chunk_gsa
    from fla.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
    from fla.ops.rwkv7 import chunk_rwkv7, fused_recurrent_rwkv7
    return {"chunk_gla": chunk_gla, "chunk_rwkv6": chunk_rwkv6, "fused_recurrent_rwkv6": fused_recurrent_rwkv6,
            "chunk_gsa": chunk_gsa, "chunk_rwkv7": chunk_rwkv7, "fused_recurrent_rwkv7": fused_recurrent_rwkv7}


def cases():
    ours = {
        "chunk_gla": (ops.chunk_gla, gated(False), {}),
        "chunk_rwkv6": (ops.chunk_rwkv6, gated(True), {}),
        "chunk_rwkv6 bug=exclusive_reference": (ops.chunk_rwkv6, gated(True), {"bug": "exclusive_reference"}),
        "chunk_gsa": (ops.chunk_gsa, gsa(), {}),
        "chunk_gsa bug=unmasked_padding": (ops.chunk_gsa, gsa(), {"bug": "unmasked_padding"}),
        "fused_recurrent_rwkv6": (ops.fused_recurrent_rwkv6, gated(True), {}),
        "fused_recurrent_rwkv7": (ops.fused_recurrent_rwkv7, rwkv7(), {}),
    }
    ours["chunk_rwkv7"] = (ops.chunk_rwkv7, ours["fused_recurrent_rwkv7"][1], {})
    theirs = {}
    try:
        fla = upstream_ops()
        theirs = {"chunk_gla": (fla["chunk_gla"], ours["chunk_gla"][1], {}),
                  "chunk_rwkv6": (fla["chunk_rwkv6"], ours["chunk_rwkv6"][1], {}),
                  "chunk_gsa": (fla["chunk_gsa"], ours["chunk_gsa"][1], {}),
                  "fused_recurrent_rwkv6": (fla["fused_recurrent_rwkv6"], ours["fused_recurrent_rwkv6"][1], {}),
                  "chunk_rwkv7": (fla["chunk_rwkv7"], ours["fused_recurrent_rwkv7"][1], {"scale": 1.0})}
    except ImportError as exc:
        print(f"flash-linear-attention not importable ({exc}): fla_lab only")
    return ours, theirs


def on_device(inputs, device="cuda"):
    """The inputs as bf16 leaves that require gradients."""
    return [t.to(device, DTYPE).requires_grad_() for t in inputs]


def cotangent(x, device="cuda"):
    """A random `do` shaped like the output `[B, T, H, V]` (B, T, H of the first input)."""
    return torch.randn(*x[0].shape[:3], V, device=device, dtype=DTYPE)


def forward_backward(fn, x, do, kwargs):
    fn(*x, **kwargs)[0].backward(do)


def forward_ms(fn, x, kwargs):
    with torch.no_grad():
        return triton.testing.do_bench(lambda: fn(*x, **kwargs), warmup=50, rep=300, return_mode="median")


def forward_backward_ms(fn, x, do, kwargs):
    """Median of forward+backward; `grad_to_none` gives every call fresh gradients."""
    return triton.testing.do_bench(lambda: forward_backward(fn, x, do, kwargs), warmup=50, rep=300, grad_to_none=x,
                                   return_mode="median")


def peak_MiB(fn, x, do, kwargs):
    """Peak memory of one forward+backward above what was allocated before it (the inputs and `do`, no
    gradients): the gradients, saved activations and workspace."""
    for t in x:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    forward_backward(fn, x, do, kwargs)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def timings(fn, inputs, kwargs):
    x = on_device(inputs)
    do = cotangent(x)
    fwd = forward_ms(fn, x, kwargs)
    fwd_bwd = forward_backward_ms(fn, x, do, kwargs)
    return fwd, fwd_bwd, peak_MiB(fn, x, do, kwargs)


def main(argv):
    """`--only a,b` keeps the ops whose name contains a or b (upstream's autotuning makes a full run long);
    `--ours` times fla_lab alone; `--upstream a,b` times only upstream ops whose name contains a or b."""
    only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else None
    torch.manual_seed(0)
    ours, theirs = cases()
    if "--ours" in argv:
        theirs = {}
    if "--upstream" in argv:
        keep = argv[argv.index("--upstream") + 1].split(",")
        theirs = {n: c for n, c in theirs.items() if any(word in n for word in keep)}
    rows = []
    for lib, table in (("fla_lab", ours), ("fla 0.6.0", theirs)):
        for name, (fn, inputs, kwargs) in table.items():
            if only and not any(word in name for word in only):
                continue
            fwd, fwd_bwd, peak = timings(fn, inputs, kwargs)
            rows.append({"lib": lib, "op": name, "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd, "peak_MiB": peak})
            print(f"{lib:<10} {name:<38} fwd {fwd:7.3f} ms   fwd+bwd {fwd_bwd:7.3f} ms   peak {peak:8.0f} MiB",
                  flush=True)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
              "shape": {"B": B, "T": T, "H": H, "K": K, "V": V}, "dtype": "bf16", "rows": rows}
    for folder in (os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"), os.environ.get("OUT")):
        if folder:
            os.makedirs(folder, exist_ok=True)
            tag = "-" + "-".join(only) if only else ""
            with open(os.path.join(folder, f"bench{tag}.json"), "w") as f:
                json.dump(result, f, indent=1)
    print_ratios(rows)


def print_ratios(rows):
    by = {(r["lib"], r["op"]): r for r in rows}
    print("\nratios (fla_lab / fla 0.6.0, medians; < 1 is faster):")
    for op, upstream in (("chunk_gla", "chunk_gla"), ("chunk_rwkv6", "chunk_rwkv6"), ("chunk_gsa", "chunk_gsa"),
                         ("fused_recurrent_rwkv6", "fused_recurrent_rwkv6"), ("chunk_rwkv7", "chunk_rwkv7"),
                         ("fused_recurrent_rwkv7", "chunk_rwkv7")):
        a, b = by.get(("fla_lab", op)), by.get(("fla 0.6.0", upstream))
        if a and b:
            print(f"  {op:<24} vs {upstream:<22} fwd {a['fwd_ms'] / b['fwd_ms']:5.2f}x   "
                  f"fwd+bwd {a['fwd_bwd_ms'] / b['fwd_bwd_ms']:5.2f}x   peak memory {a['peak_MiB'] / b['peak_MiB']:5.2f}x")
    for op, bug in (("chunk_rwkv6", "exclusive_reference"), ("chunk_gsa", "unmasked_padding")):
        fixed, buggy = by.get(("fla_lab", op)), by.get(("fla_lab", f"{op} bug={bug}"))
        if fixed and buggy:
            print(f"  {op} fixed / buggy: fwd {fixed['fwd_ms'] / buggy['fwd_ms']:5.3f}x   "
                  f"fwd+bwd {fixed['fwd_bwd_ms'] / buggy['fwd_bwd_ms']:5.3f}x")


if __name__ == "__main__":
    main(sys.argv[1:])

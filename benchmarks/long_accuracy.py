"""On a GPU: bf16 accuracy at training lengths, fla_lab beside flash-linear-attention 0.6.0 on the same inputs.

Every op, T = 4096 and 16384, weak and moderate decay (knob m: log-decay `-m * U(0.05, 1)`), B=1, H=2, K=V=64
(GSA M=64), initial state and final-state cotangent on. Both libraries are compared with one float64 reference run
(on the GPU) and its cotangents: the output, the final state and every gradient (check.grad_errors, floored), and
the decay gradient's plain error too. Writes benchmarks/results/long_accuracy.json (and $OUT/long_accuracy.json).

    python benchmarks/long_accuracy.py [--ops chunk_gla ...] [--T 4096 16384] [--decays 1e-3 1] [--no-upstream]

FLA_LAB_SPLIT_STATES=0 runs fla_lab with its state products unsplit (see fla_lab.ops.common.utils.mma_split).
"""
import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

from fla_lab.spec import harness, registry  # noqa: E402

OPS = ("chunk_gla", "chunk_rwkv6", "chunk_gsa", "chunk_rwkv7", "fused_recurrent_gla", "fused_recurrent_rwkv6",
       "fused_recurrent_rwkv7")
DTYPE = torch.bfloat16


def errors_of(spec, fn, x, exact, cot) -> dict:
    """`harness.judge` of `fn` against the shared reference run, plus the decay gradient's plain error."""
    result = harness.judge(harness.run(fn, harness.leaves(x, DTYPE, "cuda", True), cot), exact, DTYPE)
    return {**result.errors, f"{spec.decay_name} plain": result.plain_errors[spec.decay_name]}


def measure(name: str, T: int, decay: float, upstream: bool) -> list[dict]:
    spec = registry.get(name)
    x = spec.inputs(registry.Shape(1, T, 2, 64, 64, M=64), decay=decay)
    exact, cot = harness.exact_run(spec.reference, harness.leaves(x, DTYPE, "cuda", True), device="cuda")
    libs = [("fla_lab", spec)]
    if upstream and f"fla:{name}" in registry.ops():
        libs.append(("fla", registry.get(name, "fla")))
    rows = []
    for lib, s in libs:
        start = time.perf_counter()
        try:
            errors = errors_of(spec, s.fn, x, exact, cot)
        except Exception as e:  # an upstream op that refuses these inputs is a row, not a crash
            errors = {"error": f"{type(e).__name__}: {e}"[:200]}
        rows.append({"op": name, "T": T, "decay": decay, "library": lib, "errors": errors,
                     "split_states": os.environ.get("FLA_LAB_SPLIT_STATES", "1") != "0",
                     "seconds": round(time.perf_counter() - start, 1), "device": torch.cuda.get_device_name(0),
                     "torch": torch.__version__, "triton": triton.__version__,
                     "date": datetime.date.today().isoformat()})
        print(summary_line(rows[-1], spec.decay_name), flush=True)
    return rows


def summary_line(row: dict, decay_name: str) -> str:
    e = row["errors"]
    if "error" in e:
        return f"{row['op']:24s} T={row['T']:6d} m={row['decay']:g} {row['library']:8s} {e['error']}"
    grads = {n: v for n, v in e.items() if n != "o" and not n.startswith("ht") and not n.endswith("plain")}
    worst = max(grads, key=lambda n: grads[n])
    return (f"{row['op']:24s} T={row['T']:6d} m={row['decay']:<6g} {row['library']:8s} o={e['o']:.1e} "
            f"d{decay_name}={e[decay_name]:.1e} (plain {e[decay_name + ' plain']:.1e}) "
            f"worst d{worst}={grads[worst]:.1e}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", default=list(OPS))
    p.add_argument("--T", nargs="+", type=int, default=[4096, 16384])
    p.add_argument("--decays", nargs="+", type=float, default=[1e-3, 1.0])
    p.add_argument("--no-upstream", action="store_true")
    p.add_argument("--out", default="benchmarks/results/long_accuracy.json")
    args = p.parse_args(argv)
    if not args.no_upstream:
        from benchmarks.upstream_agreement import pin_autotune_to_first_config
        pin_autotune_to_first_config()  # accuracy, not speed: skip upstream's minutes of autotuning
        print("upstream ops:", registry.register_fla(), flush=True)
    rows = []
    for name in args.ops:
        for T in args.T:
            for decay in args.decays:
                rows += measure(name, T, decay, not args.no_upstream)
                write(rows, args.out)


def write(rows, path):
    copy = os.environ.get("OUT") and os.path.join(os.environ["OUT"], os.path.basename(path))
    for target in filter(None, [path, copy]):
        with open(target, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""On a GPU: bf16 accuracy at training lengths, fla_lab beside flash-linear-attention 0.6.0 on the same inputs.

Every op, T = 4096 and 16384, weak and moderate decay (knob m: log-decay `-m * U(0.05, 1)`), B=1, H=2, K=V=64
(GSA M=64), initial state and final-state cotangent on. Both libraries are compared with one float64 reference run
(on the GPU) and its cotangents: the output, the final state and every gradient (check.grad_errors, floored), and
the decay gradient's plain error too. Writes benchmarks/results/long_accuracy.json (and $OUT/long_accuracy.json).

    python -m benchmarks.long_accuracy [--ops chunk_gla ...] [--T 4096 16384] [--decays 1e-3 1] [--no-upstream]
                                       [--unsplit-states]

--unsplit-states runs fla_lab's chunk ops with their state products unsplit (`Precision(split_states=False)`,
fla_lab/ops/common/launch.py; see fla_lab.ops.common.utils.mma_split).
"""
import argparse
import dataclasses
import time

import torch

from benchmarks import common
from fla_lab.ops.common.launch import Precision, default_launch
from fla_lab.spec import harness, registry, upstream

OPS = ("chunk_gla", "chunk_rwkv6", "chunk_gsa", "chunk_rwkv7", "fused_recurrent_gla", "fused_recurrent_rwkv6",
       "fused_recurrent_rwkv7")
DTYPE = torch.bfloat16
CHUNK_FAMILIES = {"chunk_gla": "chunk", "chunk_rwkv6": "chunk", "chunk_gsa": "chunk", "chunk_rwkv7": "rwkv7_chunk"}


def precision_kwargs(name: str, split_states: bool) -> dict:
    """fla_lab's `launch=` for op `name` with `split_states` (the chunk ops' `Precision`); {} for the default."""
    if split_states or name not in CHUNK_FAMILIES:
        return {}
    launch = default_launch(CHUNK_FAMILIES[name], "cuda")
    return {"launch": dataclasses.replace(launch, precision=Precision(split_states=False))}


def errors_of(spec, fn, x, exact, cot, **kwargs) -> dict:
    """`harness.judge` of `fn(**kwargs)` against the shared reference run, plus the decay gradient's plain error."""
    result = harness.judge(harness.run(fn, harness.leaves(x, DTYPE, "cuda", True), cot, **kwargs), exact, DTYPE)
    return {**result.errors, f"{spec.decay_name} plain": result.plain_errors[spec.decay_name]}


def measure(name: str, T: int, decay: float, upstream: bool, split_states: bool = True) -> list[dict]:
    spec = registry.get(name)
    x = spec.inputs(registry.Shape(1, T, 2, 64, 64, M=64), decay=decay)
    exact, cot = harness.exact_run(spec.reference, harness.leaves(x, DTYPE, "cuda", True), device="cuda")
    libs = [("fla_lab", spec)]
    if upstream and f"fla:{name}" in registry.ops():
        libs.append(("fla", registry.get(name, "fla")))
    rows = []
    for lib, s in libs:
        start = time.perf_counter()
        kwargs = precision_kwargs(name, split_states) if lib == "fla_lab" else {}
        try:
            errors = errors_of(spec, s.fn, x, exact, cot, **kwargs)
        except Exception as e:  # an upstream op that refuses these inputs is a row, not a crash
            errors = {"error": f"{type(e).__name__}: {e}"[:200]}
        rows.append({"op": name, "T": T, "decay": decay, "library": lib, "errors": errors,
                     "split_states": split_states,
                     "seconds": round(time.perf_counter() - start, 1), **common.environment()})
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
    p.add_argument("--unsplit-states", action="store_true")
    p.add_argument("--out", default=str(common.RESULTS / "long_accuracy.json"))
    args = p.parse_args(argv)
    common.require_cuda("long_accuracy")
    if not args.no_upstream:
        upstream.pin_autotune_to_first_config()
        print("upstream ops:", registry.register_fla(), flush=True)
    rows = []
    for name in args.ops:
        for T in args.T:
            for decay in args.decays:
                rows += measure(name, T, decay, not args.no_upstream, not args.unsplit_states)
                common.write_json(rows, args.out)


if __name__ == "__main__":
    main()

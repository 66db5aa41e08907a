"""Launch settings (`ChunkLaunch`) of the key- and value-side chunk ops, tuned by one greedy pass over its fields
at bench.py's shape: each field in turn takes the value with the fastest forward+backward (or a 2% faster forward
at no cost to it), the others held at the best found so far.

Usage on a GPU: python benchmarks/tune_launch.py chunk_gla [chunk_gsa ...] [--json PATH]
(set the winners in `TUNED[<the card's name>]["chunk"]`, fla_lab/ops/common/launch.py)
The pass starts from the card's default launch (`default_launch`).
"""
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402
import torch  # noqa: E402

from fla_lab.ops.common.launch import default_launch  # noqa: E402

CHOICES = {  # field -> values tried; an op ignores the fields of kernels it does not run
    "state_BV": (None, 16, 32, 64), "state_warps": (1, 2, 4, 8), "state_stages": (1, 2, 3, 4),
    "out_BV": (16, 32, 64), "out_warps": (2, 4, 8),
    "scores_BK": (16, 32, 64), "scores_warps": (1, 2, 4),
    "dqk_BK": (16, 32, 64), "dqk_warps": (1, 2, 4, 8),
    "slots_BV": (16, 32, 64), "slots_warps": (2, 4, 8),
    "dg_BK": (16, 32, 64),
}


def tune(name: str) -> dict:
    fn, inputs, kwargs = bench.cases()[0][name]
    best = default_launch("chunk", "cuda" if torch.cuda.is_available() else "cpu")
    fwd, fwd_bwd, _ = bench.timings(fn, inputs, {**kwargs, "launch": best})
    start = {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd}
    print(f"{name} defaults: fwd {fwd:.3f} ms  fwd+bwd {fwd_bwd:.3f} ms", flush=True)
    for field, values in CHOICES.items():
        for value in values:
            if value == getattr(best, field):
                continue
            trial = dataclasses.replace(best, **{field: value})
            f, fb, _ = bench.timings(fn, inputs, {**kwargs, "launch": trial})
            print(f"  {field}={value}: fwd {f:.3f} ms  fwd+bwd {fb:.3f} ms", flush=True)
            if fb < fwd_bwd * 0.99 or (f < fwd * 0.98 and fb < fwd_bwd * 1.005):  # beyond noise (about 1%)
                best, fwd, fwd_bwd = trial, f, fb
    print(f"{name} best: fwd {fwd:.3f} ms  fwd+bwd {fwd_bwd:.3f} ms  {best}", flush=True)
    return {"defaults": start, "best": {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd}, "launch": {
        f.name: getattr(best, f.name) for f in dataclasses.fields(best) if f.name != "dot_dtype"}}


def main(argv):
    out = argv[argv.index("--json") + 1] if "--json" in argv else None
    names = [a for a in argv if not a.startswith("--") and a != out]
    results = {name: tune(name) for name in names}
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])

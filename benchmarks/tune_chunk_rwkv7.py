"""num_warps of each chunk_rwkv7 kernel, one kernel at a time (the others at their defaults), then the value
columns of the two sequential passes (STATE_BV), at bench.py's shape.

Usage on a GPU: python benchmarks/tune_chunk_rwkv7.py   (prints fwd+bwd medians; set the winners in
`fla_lab/ops/rwkv7/chunk.py`'s WARPS and STATE_BV)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402

from fla_lab.ops.rwkv7 import chunk  # noqa: E402


def main():
    fn, inputs, kwargs = bench.cases()[0]["chunk_rwkv7"]
    defaults = dict(chunk.WARPS)
    print(f"defaults {defaults}: fwd+bwd {bench.timings(fn, inputs, kwargs)[1]:.3f} ms", flush=True)
    for name in defaults:
        for warps in (1, 2, 4, 8):
            chunk.WARPS.update(defaults, **{name: warps})
            fwd, fwd_bwd, _ = bench.timings(fn, inputs, kwargs)
            print(f"{name:<7} warps={warps}: fwd {fwd:.3f} ms  fwd+bwd {fwd_bwd:.3f} ms", flush=True)
    chunk.WARPS.update(defaults)
    state_bv = chunk.STATE_BV
    for bv in (16, 32, 64):
        chunk.STATE_BV = bv
        fwd, fwd_bwd, _ = bench.timings(fn, inputs, kwargs)
        print(f"STATE_BV={bv}: fwd {fwd:.3f} ms  fwd+bwd {fwd_bwd:.3f} ms", flush=True)
    chunk.STATE_BV = state_bv


if __name__ == "__main__":
    main()

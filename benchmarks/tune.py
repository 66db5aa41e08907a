"""Launch settings of fla_lab's ops on a GPU: each field of an op's launch object swept one at a time at several
(B, T), or tuned by one greedy pass (`--greedy`).

A knob is one field of the op's launch object (`fla_lab.ops.common.launch`: ChunkLaunch for chunk_gla, chunk_rwkv6
and chunk_gsa, RecurrentLaunch, RWKV7RecurrentLaunch, RWKV7ChunkLaunch), passed as
`launch=dataclasses.replace(default, field=value)`: nothing global changes, and a (value tile, num_warps) pair or
None (a per-call rule) is a value like any other. Inputs and keywords are the scaling benchmark's
(`benchmarks.common`); every run starts from the card's default launch (`default_launch`).

The sweep (the default): the others at their defaults, one line per measurement (forward, or forward+backward where
the knob is a backward kernel's), at several (B, T) of constant tokens: where a setting measured at the reference
shape (B=8, T=4096) loses at B=64, T=1024 or B=1, T=65536, this shows it. The rows go to `--json` and $OUT.
`--profile` first prints each kernel's share of one forward+backward (torch.profiler), FLA's too with `--upstream`.
`--host` prints the host's time per forward call (kernels enqueued, not waited for), value checks deferred (the
default) and off: where it exceeds the GPU's time, do_bench measures the host.

`--greedy`: one pass over the fields, at each shape: each field in turn takes the value with the fastest
forward+backward (or a 2% faster forward at no cost to it), the others held at the best found so far. Set the
winners in `TUNED[<the card's model>]` (fla_lab/ops/common/launch.py, `tuned_model`).

    python -m benchmarks.tune fused_recurrent_rwkv7 --shapes 64x1024 16x4096
    python -m benchmarks.tune chunk_rwkv7 --profile --upstream --no-sweep   # where the time goes
    python -m benchmarks.tune chunk_rwkv6 chunk_gla --host --no-sweep --shapes 8x4096   # host-bound at this shape?
    python -m benchmarks.tune chunk_gla chunk_gsa --greedy --shapes 8x4096 --json tune_launch.json
"""
import argparse
import dataclasses
import itertools
import os
import time

import torch

from benchmarks import common
from fla_lab import ops
from fla_lab.ops import contract
from fla_lab.ops.common.launch import default_launch

TILES, WARPS = (16, 32, 64), (1, 2, 4, 8)
FALLBACKS = ((), ((32, 64, 2),), ((64, 16, 4), (32, 64, 2)))  # RecurrentLaunch.fwd_fallback_tiles tried
FAMILY = {"fused_recurrent_rwkv7": "rwkv7_recurrent", "fused_recurrent_rwkv6": "recurrent",
          "chunk_rwkv7": "rwkv7_chunk", "chunk_gla": "chunk", "chunk_rwkv6": "chunk", "chunk_gsa": "chunk"}
OPS = tuple(FAMILY)
RWKV7_CHUNK_WARPS = ("scores", "intra", "fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd")
CHOICES = {  # ChunkLaunch field -> values tried; an op ignores the fields of kernels it does not run
    "state_BV": (None, 16, 32, 64), "state_warps": (1, 2, 4, 8), "state_stages": (1, 2, 3, 4),
    "out_BV": (16, 32, 64), "out_warps": (2, 4, 8),
    "scores_BK": (16, 32, 64), "scores_warps": (1, 2, 4),
    "dqk_BK": (16, 32, 64), "dqk_warps": (1, 2, 4, 8),
    "slots_BV": (16, 32, 64), "slots_warps": (2, 4, 8),
    "dg_BK": (16, 32, 64),
}


def knobs(op):
    """op -> [(launch field, values, backward?)]; a ChunkLaunch op's fields are timed forward+backward."""
    tile_warps = list(itertools.product(TILES, WARPS))
    return {
        "fused_recurrent_rwkv7": [("fwd_launch", tile_warps, False), ("bwd_launch", tile_warps, True)],
        "fused_recurrent_rwkv6": [("fwd_fallback_tiles", FALLBACKS, False), ("fwd_BV", TILES, False),
                                  ("fwd_warps", WARPS, False), ("dkv_BK", TILES, True), ("dkv_warps", WARPS, True),
                                  ("dq_warps", WARPS, True)],
        "chunk_rwkv7": [(f"{name}_warps", WARPS, name.startswith("bwd")) for name in RWKV7_CHUNK_WARPS]
                       + [("state_BV", TILES, True), ("fwd_state_BV", TILES, False), ("bwd_BK", (16, 32, 64), True),
                          ("bwd_BV", TILES, True), ("dv_BV", TILES, True)],
    }.get(op, [(field, values, True) for field, values in CHOICES.items()])


def op_launch(op, where):
    """The launch the op runs with by default on `where` (a tensor or a device)."""
    return default_launch(FAMILY[op], where)


def time_it(fn, x, do, kwargs, backward):
    return common.forward_backward_ms(fn, x, do, kwargs) if backward else common.forward_ms(fn, x, kwargs)


def case(op, B, T):
    """The op's inputs (bf16 leaves on the GPU), cotangent and keywords at (B, T)."""
    x = common.on_device(common.INPUTS[op](B, T, common.H))
    return x, common.cotangent(x), common.op_kwargs(op)


# --- the sweep ------------------------------------------------------------------------------------------------------

def sweep(op, B, T, rows, with_profile, with_sweep, only=None, with_host=False):
    fn = getattr(ops, op)
    x, do, kwargs = case(op, B, T)
    if with_profile:
        profile(f"fla_lab {op} B={B} T={T}", fn, x, do, kwargs, backward=True)
    if with_host:
        host_times(op, fn, x, kwargs, rows, B, T)
    defaults(op, fn, x, do, kwargs, rows, B, T)
    for name, values, backward in knobs(op):
        default = getattr(op_launch(op, x[0]), name)
        for value in values if with_sweep and (not only or name in only) else ():
            launch = dataclasses.replace(op_launch(op, x[0]), **{name: value})
            try:
                ms = time_it(fn, x, do, {**kwargs, "launch": launch}, backward)
            except Exception as exc:  # a setting that does not compile (registers, shared memory) is a result too
                ms = float("nan")
                print(f"  {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            rows.append(dict(op=op, B=B, T=T, knob=name, value=value, default=value == default,
                             metric="fwd_bwd_ms" if backward else "fwd_ms", ms=ms))
            print(f"{op:<22} B={B:<3} T={T:<6} {name:<12} {str(value):<9}{' *' if value == default else '  '} "
                  f"{'fwd+bwd' if backward else 'fwd    '} {ms:8.3f} ms", flush=True)


def defaults(op, fn, x, do, kwargs, rows, B, T):
    """The op at the device's default launch, forward and forward+backward: the row a sweep is read against."""
    for metric, backward in (("fwd_ms", False), ("fwd_bwd_ms", True)):
        ms = time_it(fn, x, do, {**kwargs, "launch": op_launch(op, x[0])}, backward)
        rows.append(dict(op=op, B=B, T=T, knob="fla_lab default", value=str(op_launch(op, x[0])), metric=metric,
                         ms=ms))
        print(f"{op:<22} B={B:<3} T={T:<6} fla_lab default        {metric:<10} {ms:8.3f} ms", flush=True)


def profile(label, fn, x, do, kwargs, backward, calls=5):
    """Each kernel's CUDA time per call, largest first. Every backward starts from fresh gradients, as in
    do_bench's timings (otherwise autograd's accumulation adds kernels that are not the op's)."""
    def step():
        if not backward:
            return fn(*x, **kwargs)
        for t in x:
            t.grad = None
        common.forward_backward(fn, x, do, kwargs)

    for _ in range(3):  # compile and warm up
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    rows = sorted(((e.device_time_total / calls / 1000, e.count // calls, e.key) for e in prof.key_averages()
                   if e.device_time_total > 0), reverse=True)
    print(f"== {label}: {sum(r[0] for r in rows):.3f} ms of kernels per {'fwd+bwd' if backward else 'fwd'}")
    for ms, n, name in rows[:16]:
        print(f"  {ms:7.3f} ms  x{n:<3d} {name[:90]}", flush=True)


def host_ms(fn, x, kwargs, calls=50):
    """Host wall time per forward call while the GPU is still busy with earlier ones: 50 calls of a few kernels each
    stay well inside CUDA's launch queue, so nothing here waits for the GPU."""
    with torch.no_grad():
        for _ in range(3):
            fn(*x, **kwargs)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*x, **kwargs)
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
    return elapsed / calls * 1e3


def host_times(op, fn, x, kwargs, rows, B, T):
    """Value checks as an op call makes them by default (deferred: no sync) and off. Not `value_checks(True)`:
    that reads every flag at once, a sync per call (a first version measured that, 0.9 ms against 0.38 deferred
    for chunk_rwkv6 at B=8, T=4096)."""
    for mode, setting in (("deferred", None), ("off", False)):
        with contract.value_checks(setting):
            ms = host_ms(fn, x, kwargs)
        contract.flush_value_checks()
        rows.append(dict(op=op, B=B, T=T, knob="host", value=f"checks {mode}", metric="host_fwd_ms", ms=ms))
        print(f"{op:<22} B={B:<3} T={T:<6} host per fwd, checks {mode:<8} {ms:8.3f} ms", flush=True)


def upstream(op, B, T, rows, with_profile):
    fn = common.upstream_ops([op])[op]
    x, do, kwargs = case(op, B, T)
    if with_profile:
        profile(f"FLA 0.6.0 {op} B={B} T={T}", fn, x, do, kwargs, backward=op != "fused_recurrent_rwkv7")
    metrics = [("fwd_ms", False)] + ([] if op == "fused_recurrent_rwkv7" else [("fwd_bwd_ms", True)])
    for metric, backward in metrics:
        ms = time_it(fn, x, do, kwargs, backward)
        rows.append(dict(op=op, B=B, T=T, knob="FLA 0.6.0", value=None, metric=metric, ms=ms))
        print(f"{op:<22} B={B:<3} T={T:<6} FLA 0.6.0              {metric:<10} {ms:8.3f} ms", flush=True)


# --- the greedy pass ------------------------------------------------------------------------------------------------

def greedy(op: str, B: int = common.B, T: int = common.T) -> dict:
    """One greedy pass over the op's knobs at (B, T), from the card's default launch: a change is kept only beyond
    noise (about 1%)."""
    fn, inputs, kwargs = getattr(ops, op), common.INPUTS[op](B, T, common.H), common.op_kwargs(op)
    best = op_launch(op, "cuda" if torch.cuda.is_available() else "cpu")
    fwd, fwd_bwd, _ = common.timings(fn, inputs, {**kwargs, "launch": best})
    start = {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd}
    print(f"{op} B={B} T={T} defaults: fwd {fwd:.3f} ms  fwd+bwd {fwd_bwd:.3f} ms", flush=True)
    for field, values, _ in knobs(op):
        for value in values:
            if value == getattr(best, field):
                continue
            trial = dataclasses.replace(best, **{field: value})
            f, fb, _ = common.timings(fn, inputs, {**kwargs, "launch": trial})
            print(f"  {field}={value}: fwd {f:.3f} ms  fwd+bwd {fb:.3f} ms", flush=True)
            if fb < fwd_bwd * 0.99 or (f < fwd * 0.98 and fb < fwd_bwd * 1.005):
                best, fwd, fwd_bwd = trial, f, fb
    print(f"{op} best: fwd {fwd:.3f} ms  fwd+bwd {fwd_bwd:.3f} ms  {best}", flush=True)
    return {"defaults": start, "best": {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd}, "launch": settings(best)}


def settings(launch) -> dict:
    """The launch's tile and warp fields (its `precision` is not a setting the pass tunes)."""
    return {f.name: getattr(launch, f.name) for f in dataclasses.fields(launch) if f.name != "precision"}


# --- command line ---------------------------------------------------------------------------------------------------

def shape_list(shapes):
    return [tuple(map(int, shape.split("x"))) for shape in shapes]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ops", nargs="+", choices=OPS)
    p.add_argument("--shapes", nargs="+", default=["64x1024", "16x4096", "8x4096"], help="BxT")
    p.add_argument("--greedy", action="store_true", help="one greedy pass per op and shape instead of the sweep")
    p.add_argument("--upstream", action="store_true", help="time FLA 0.6.0's op at each shape too")
    p.add_argument("--profile", action="store_true", help="per-kernel times of one forward+backward first")
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True, help="the knobs' sweep")
    p.add_argument("--knobs", nargs="+", help="only these knobs, as printed (fwd_launch, bwd_dh_warps, ...)")
    p.add_argument("--host", action="store_true", help="host time per forward call, value checks deferred and off")
    p.add_argument("--json", help="write the rows (--greedy: {op: result}) here and to $OUT (default: $OUT only)")
    args = p.parse_args(argv)
    common.require_cuda("tune")
    shapes = shape_list(args.shapes)
    if args.greedy:
        result = {op if len(shapes) == 1 else f"{op} {B}x{T}": greedy(op, B, T) for op in args.ops for B, T in shapes}
    else:
        result = []
        for op in args.ops:
            for B, T in shapes:
                sweep(op, B, T, result, args.profile, args.sweep, args.knobs, args.host)
                if args.upstream:
                    upstream(op, B, T, result, args.profile)
    out = os.environ.get("OUT")
    path = args.json or (out and os.path.join(out, f"tune-{'-'.join(args.ops)}.json"))
    if path:
        common.write_json(result, path)


if __name__ == "__main__":
    main()

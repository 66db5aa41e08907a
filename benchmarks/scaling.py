"""fla_lab's kernels beside flash-linear-attention 0.6.0's (FLA) on a GPU: time, peak memory and the value checks'
cost as the sequence grows, in one process; the table and the figure from the JSON on any machine.

Per op and length T: forward and forward+backward times (`triton.testing.do_bench` medians), timed in alternation
fla_lab, FLA, fla_lab with value checks off, for `--rounds` rounds, each variant's time the median over rounds; the
peak memory of one forward+backward; the HBM floor (computed). Shapes: bf16, H=16, K=V=64 (GSA: M=64 slots),
B = tokens // T (65536 tokens per call by default), plus the reference shape B=8, T=4096 ("ref"); `--ref-only`
times that shape alone. `--bugs` also times the catalogued bugs whose fix could cost time (chunk_rwkv6
exclusive_reference, chunk_gsa unmasked_padding) beside the fixed op. RWKV-7: scale=1.0; every op:
output_final_state=False.

Every finished (op, B, T) row is merged into the JSON at once (and copied to $OUT), so a killed run keeps what it
measured; `--resume` skips rows already measured for the requested libraries. The loop is op-major: FLA's
autotuner compiles for minutes per op on a fresh machine, so pick ops per invocation with `--only`.

`--checks` (module `benchmarks.value_checks`) times the input value checks off, deferred (the default) and now (a
sync per call) at the reference shape, then counts the host syncs of one 12-layer RWKV7Attention training step
(`--sync-count`: that count alone); it writes checks.json.

    python -m benchmarks.scaling --only chunk_gla --resume --budget-s 420      # on the GPU
    python -m benchmarks.scaling --ref-only --bugs                              # the reference shape, bugs beside
    python -m benchmarks.scaling --checks --json checks_h100.json                # what value checks cost
    python -m benchmarks.scaling --checks --forward --only fused_recurrent_rwkv6  # checked in the kernel or not
    python -m benchmarks.scaling --plot                                         # table + figure, any machine
    python -m benchmarks.scaling --merge call1/scaling.json call2/scaling.json  # runs' rows into one JSON
    python -m benchmarks.scaling --dry-run --only chunk_gla --out-dir /tmp/x    # CPU, interpreter, T=32
"""
import argparse
import functools
import os
import sys
import tempfile
import time

if "--dry-run" in sys.argv:  # Triton reads TRITON_INTERPRET when a kernel is decorated: before fla_lab is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from benchmarks import common, scaling_report, value_checks  # noqa: E402
import fla_lab  # noqa: E402
from fla_lab import ops  # noqa: E402
from fla_lab.ops import contract  # noqa: E402

OPS = tuple(common.INPUTS)
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
TOKENS = 65536
REFERENCE_SHAPE = (common.B, common.T)
HBM_TBPS = 4.8  # H200 HBM3e bandwidth, the spec sheet's number
BUGS = {"chunk_rwkv6": "exclusive_reference", "chunk_gsa": "unmasked_padding"}  # op -> the bug `--bugs` times
ALL_METRICS = ("fwd_ms", "fwd_bwd_ms", "peak_MiB")


def without_value_checks(fn):
    def run(*x, **kwargs):
        with contract.value_checks(False):
            return fn(*x, **kwargs)
    return run


# --- what is measured ----------------------------------------------------------------------------------------------

def gpu_metrics():
    """metric -> f(fn, x, do, kwargs): do_bench medians and peak memory."""
    return {"fwd_ms": lambda fn, x, do, kw: common.forward_ms(fn, x, kw),
            "fwd_bwd_ms": common.forward_backward_ms,
            "peak_MiB": common.peak_MiB}


def dry_metrics():
    """One wall-clock call each, no do_bench (the interpreter): exercises the code paths, measures nothing."""
    def once_ms(call):
        start = time.perf_counter()
        call()
        return 1e3 * (time.perf_counter() - start)
    return {"fwd_ms": lambda fn, x, do, kw: once_ms(lambda: fn(*x, **kw)),
            "fwd_bwd_ms": lambda fn, x, do, kw: once_ms(lambda: common.forward_backward(fn, x, do, kw)),
            "peak_MiB": lambda fn, x, do, kw: None}


def variants(op, upstream, bugs):
    """name -> (whose errors it shares, fn, metrics it is timed for). "fla_lab checks off" is fla_lab with its value
    checks off; "fla_lab bug=NAME" (with `bugs`) the op with that catalogued bug."""
    ours = getattr(ops, op)
    out = {"fla_lab": ("fla_lab", ours, ALL_METRICS)}
    if op in upstream:
        out["fla"] = ("fla", upstream[op], ALL_METRICS)
    out["fla_lab checks off"] = ("fla_lab", without_value_checks(ours), ("fwd_bwd_ms",))
    if bugs and op in BUGS:
        name = f"fla_lab bug={BUGS[op]}"
        out[name] = (name, functools.partial(ours, bug=BUGS[op]), ALL_METRICS)
    return out


def error_text(exc):
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def measure(metric_fn, fn, x, do, kwargs):
    for t in x:
        t.grad = None
    try:
        return metric_fn(fn, x, do, kwargs)
    finally:
        contract.flush_value_checks()  # valid inputs: nothing to report, but the deferred queue is left empty


def measure_case(op, B, T, H, upstream, metrics, rounds, device, tag, bugs=False):
    """One (op, B, T): every metric in alternation over the variants, `rounds` times; a variant that fails (OOM,
    compile error, no backward) is recorded with its error and not run again in this case."""
    x = common.on_device(common.INPUTS[op](B, T, H), device)
    do = common.cotangent(x, device)
    kwargs = common.op_kwargs(op)
    runs, errors = {}, {}
    todo = variants(op, upstream, bugs)
    for metric, metric_fn in metrics.items():
        for r in range(1 if metric == "peak_MiB" else rounds):
            for name, (owner, fn, wanted) in todo.items():
                if metric not in wanted or owner in errors:
                    continue
                try:
                    value = measure(metric_fn, fn, x, do, kwargs)
                except Exception as exc:  # noqa: BLE001  OOM, compile error, NotImplementedError: a row, not a crash
                    errors[owner] = {"at": f"{name} {metric}", "error": error_text(exc)}
                    print(f"{tag} {name:<19} {metric:<10} ERROR {errors[owner]['error']}", flush=True)
                    free_memory(device)
                    continue
                runs.setdefault(name, {}).setdefault(metric, []).append(value)
                print(f"{tag} {name:<19} {metric:<10} {scaling_report.fmt(value)}   (round {r + 1})", flush=True)
    return summarize(runs, errors, x, do)


def summarize(runs, errors, x, do):
    row = {"bytes": {"inputs": sum(t.numel() * t.element_size() for t in x),
                     "output": do.numel() * do.element_size()}, "errors": errors}
    timed = [name for name in runs if name != "fla_lab checks off"]
    for name in dict.fromkeys([*timed, *errors]):
        row[name] = {m: common.median(v) for m, v in runs.get(name, {}).items()}
        row[name]["runs"] = runs.get(name, {})
    off = runs.get("fla_lab checks off", {}).get("fwd_bwd_ms")
    if off and "fla_lab" in row:
        row["fla_lab"]["fwd_bwd_checks_off_ms"] = common.median(off)
        row["fla_lab"]["runs"]["fwd_bwd_checks_off_ms"] = off
    return row


def free_memory(device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --- the JSON ------------------------------------------------------------------------------------------------------

def row_key(row):
    return row["op"], row["B"], row["T"]


def load(path):
    return common.load_json(path, empty={"rows": []})


def merge_row(result, row):
    result["rows"] = [r for r in result["rows"] if row_key(r) != row_key(row)] + [row]


def done(result, op, B, T, libs):
    """Measured before for every requested library (a recorded error counts as measured)."""
    row = next((r for r in result["rows"] if row_key(r) == (op, B, T)), None)
    return row is not None and all(lib in row for lib in libs)


# --- the run ---------------------------------------------------------------------------------------------------------

def shapes(lengths, tokens, reference, ref_only=False):
    """(B, T) per length, B = tokens // T (at least 1), then the reference shape unless already listed; with
    `ref_only` the reference shape alone."""
    if ref_only:
        return [REFERENCE_SHAPE]
    out = [(max(1, tokens // T), T) for T in lengths]
    if reference and REFERENCE_SHAPE not in out:
        out.append(REFERENCE_SHAPE)
    return out


def run(args):
    dry = args.dry_run
    device = fla_lab.device() if dry else "cuda"  # a dry run where the kernels run: the interpreter's CPU, or a GPU
    if not dry:
        common.require_cuda("scaling", " (--dry-run runs on the CPU, --plot draws)")
    upstream = common.upstream_ops_or_none(common.INPUTS) if args.upstream and not dry else {}
    libs = ["fla_lab"] + (["fla"] if upstream else [])
    metrics = dry_metrics() if dry else gpu_metrics()
    result = load(args.json)
    result["meta"] = {"hbm_TBps": args.hbm_tbps, "dtype": "bf16", "H": args.heads, "K": common.K, "V": common.V,
                      "M": common.M, "tokens": args.tokens, "reference": list(REFERENCE_SHAPE), "rounds": args.rounds,
                      "do_bench": f"warmup {common.WARMUP_MS} ms, rep {common.REP_MS} ms, median"}
    env = common.environment("CPU (dry run, Triton interpreter)" if dry else None, fla=True)
    print(f"{env}  libraries: {libs}", flush=True)
    run_start = time.time()
    for op in args.only:
        start = time.time()
        for B, T in shapes(args.T, args.tokens, args.ref, args.ref_only):
            tag = f"[{op} B={B} T={T}]"
            if args.resume and done(result, op, B, T, libs):
                print(f"{tag} in {args.json} already: skipped (--resume)", flush=True)
                continue
            if over(args.budget_s, start) or over(args.deadline_s, run_start):
                print(f"{tag} skipped: out of time (--budget-s {args.budget_s}, --deadline-s {args.deadline_s}); "
                      "rerun with --resume", flush=True)
                continue
            row = timed_case(op, B, T, args, upstream, metrics, device, tag, libs)
            row.update(**env)
            merge_row(result, row)
            common.write_json(result, args.json)
            free_memory(device)
            print(f"{tag} done in {row['seconds']} s: {scaling_report.one_line(row)}", flush=True)
    return result


def timed_case(op, B, T, args, upstream, metrics, device, tag, libs):
    """The row of one (op, B, T); inputs that cannot even be built (OOM) give a row of errors."""
    case_start = time.time()
    torch.manual_seed(0)
    try:
        row = measure_case(op, B, T, args.heads, upstream, metrics, args.rounds, device, tag, args.bugs)
    except Exception as exc:  # noqa: BLE001  e.g. OOM while building the inputs
        print(f"{tag} ERROR {error_text(exc)}", flush=True)
        row = {"errors": {lib: {"at": "inputs", "error": error_text(exc)} for lib in libs},
               **{lib: {} for lib in libs}}
    row.update(op=op, B=B, T=T, H=args.heads, shape="ref" if (B, T) == REFERENCE_SHAPE else "scaling",
               seconds=round(time.time() - case_start, 1))
    return row


def over(limit_s, since):
    return limit_s is not None and time.time() - since > limit_s


# --- command line --------------------------------------------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=list(LENGTHS), help="sequence lengths")
    p.add_argument("--tokens", type=int, default=TOKENS, help="B = tokens // T (at least 1)")
    p.add_argument("--ref", action=argparse.BooleanOptionalAction, default=True,
                   help=f"also the reference shape B={REFERENCE_SHAPE[0]}, T={REFERENCE_SHAPE[1]}")
    p.add_argument("--ref-only", action="store_true", help="only the reference shape")
    p.add_argument("--only", nargs="+", default=list(OPS), choices=OPS, metavar="OP", help=f"ops, of {OPS}")
    p.add_argument("--bugs", action="store_true", help=f"also the catalogued bugs beside the fixed op: {BUGS}")
    p.add_argument("--upstream", action=argparse.BooleanOptionalAction, default=True, help="time FLA 0.6.0 too")
    p.add_argument("--ours-only", dest="upstream", action="store_false", help="same as --no-upstream")
    p.add_argument("--rounds", type=int, help="alternating rounds per metric (default 2: A B A B; --checks: 3)")
    p.add_argument("--budget-s", type=float, help="per op: start no new T after this many seconds on the op")
    p.add_argument("--deadline-s", type=float, help="whole run: start no new case after this many seconds")
    p.add_argument("--resume", action="store_true", help="skip rows already in the JSON for these libraries")
    p.add_argument("--heads", type=int, default=common.H)
    p.add_argument("--hbm-tbps", type=float, default=HBM_TBPS, help="bandwidth of the floor, TB/s")
    p.add_argument("--out-dir", help="write scaling.json, scaling.md and scaling.png (--checks: checks.json) here")
    p.add_argument("--json", help="default benchmarks/results/scaling.json (--checks: checks.json)")
    p.add_argument("--md", help="default benchmarks/results/scaling.md")
    p.add_argument("--figure", help="default figures/scaling.png")
    p.add_argument("--plot", action="store_true", help="only the table and the figure, from the JSON (any machine)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge these runs' rows into the JSON, then --plot")
    p.add_argument("--checks", action="store_true", help="value checks off / deferred / now, then the sync count")
    p.add_argument("--sync-count", action="store_true", help="with --checks: only the 12-layer sync count")
    p.add_argument("--forward", action="store_true",
                   help="with --checks: forwards only, off / deferred / every input through the flag pass")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, Triton interpreter, T=32, B=1, H=1, fla_lab only, one wall-clock call per metric")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.checks else 2)
    if args.dry_run:
        args.T, args.tokens, args.ref, args.upstream, args.heads, args.rounds = [32], 32, False, False, 1, 1
        args.out_dir = args.out_dir or tempfile.mkdtemp(prefix="scaling_dry_")
    folder = args.out_dir or common.RESULTS
    args.json = args.json or os.path.join(folder, "checks.json" if args.checks else "scaling.json")
    args.md = args.md or os.path.join(folder, "scaling.md")
    args.figure = args.figure or os.path.join(args.out_dir or common.ROOT / "figures", "scaling.png")
    return args


def merge_files(path, others):
    """Rows of other runs' JSONs (e.g. one per GPU call) into `path`; a later file's row replaces an earlier one."""
    result = load(path)
    for other in others:
        theirs = load(other)
        result["meta"] = theirs.get("meta", result.get("meta"))
        for row in theirs["rows"]:
            merge_row(result, row)
    common.write_json(result, path)
    return result


def main(argv=None):
    args = parse(argv)
    if args.checks:
        common.require_cuda("scaling --checks")
        return value_checks.main(args.json, args.rounds, args.only, args.sync_count, args.forward)
    if args.merge:
        result = merge_files(args.json, args.merge)
    else:
        result = load(args.json) if args.plot else run(args)
    if not result["rows"]:
        sys.exit(f"no rows in {args.json}")
    scaling_report.write_outputs(result, args.md, args.figure)


if __name__ == "__main__":
    main()

"""GPU benchmark: fla_lab's kernels beside flash-linear-attention 0.6.0's as the sequence grows, in one process.

Per op and length T: forward and forward+backward times (`triton.testing.do_bench` medians, bench.py's helpers),
timed in alternation fla_lab, FLA, fla_lab with value checks off, for `--rounds` rounds, each lib's time the median
over rounds; the peak memory of one forward+backward; what fla_lab's value checks cost; the HBM floor (computed).
Shapes: bf16, H=16, K=V=64 (GSA: M=64 slots), B = tokens // T (65536 tokens per call by default), plus the
reference shape B=8, T=4096 of bench.py ("ref"). RWKV-7: scale=1.0; every op: output_final_state=False.

Every finished (op, B, T) row is merged into the JSON at once (and copied to $OUT), so a killed run keeps what it
measured; `--resume` skips rows already measured for the requested libraries. The loop is op-major: FLA's
autotuner compiles for minutes per op on a fresh machine, so pick ops per invocation with `--only`.

    python benchmarks/bench_scaling.py --only chunk_gla --resume --budget-s 420       # on the GPU
    python benchmarks/bench_scaling.py --plot                                          # table + figure, any machine
    python benchmarks/bench_scaling.py --merge call1/scaling.json call2/scaling.json  # runs' rows into one JSON
    python benchmarks/bench_scaling.py --dry-run --only chunk_gla --out-dir /tmp/x    # CPU, interpreter, T=32
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time

if "--dry-run" in sys.argv:  # Triton reads TRITON_INTERPRET when a kernel is decorated: before bench imports fla_lab
    os.environ["TRITON_INTERPRET"] = "1"

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]

import torch  # noqa: E402
import triton  # noqa: E402

import bench  # noqa: E402
from fla_lab import ops  # noqa: E402
from fla_lab.ops import contract  # noqa: E402

OPS = ("chunk_gla", "chunk_rwkv6", "fused_recurrent_rwkv6", "chunk_gsa", "chunk_rwkv7", "fused_recurrent_rwkv7")
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
TOKENS = 65536
REFERENCE_SHAPE = (bench.B, bench.T)  # (B, T) of bench.py and the issue: 8, 4096
HBM_TBPS = 4.8  # H200 HBM3e bandwidth, the spec sheet's number
INPUTS = {  # op -> builder of its CPU inputs, bench.py's
    "chunk_gla": lambda B, T, H: bench.gated(False, B, T, H),
    "chunk_rwkv6": lambda B, T, H: bench.gated(True, B, T, H),
    "fused_recurrent_rwkv6": lambda B, T, H: bench.gated(True, B, T, H),
    "chunk_gsa": bench.gsa,
    "chunk_rwkv7": bench.rwkv7,
    "fused_recurrent_rwkv7": bench.rwkv7,
}


def op_kwargs(op):
    """The same keywords for both libraries (their defaults differ: FLA's RWKV-7 ops output the final state)."""
    return {"output_final_state": False, **({"scale": 1.0} if "rwkv7" in op else {})}


def without_value_checks(fn):
    def run(*x, **kwargs):
        with contract.value_checks(False):
            return fn(*x, **kwargs)
    return run


# --- what is measured ----------------------------------------------------------------------------------------------

def gpu_metrics():
    """metric -> f(fn, x, do, kwargs): bench.py's do_bench medians and peak memory."""
    return {"fwd_ms": lambda fn, x, do, kw: bench.forward_ms(fn, x, kw),
            "fwd_bwd_ms": bench.forward_backward_ms,
            "peak_MiB": bench.peak_MiB}


def dry_metrics():
    """One wall-clock call each, no do_bench (the interpreter): exercises the code paths, measures nothing."""
    def once_ms(call):
        start = time.perf_counter()
        call()
        return 1e3 * (time.perf_counter() - start)
    return {"fwd_ms": lambda fn, x, do, kw: once_ms(lambda: fn(*x, **kw)),
            "fwd_bwd_ms": lambda fn, x, do, kw: once_ms(lambda: bench.forward_backward(fn, x, do, kw)),
            "peak_MiB": lambda fn, x, do, kw: None}


def variants(op, upstream):
    """name -> (lib, fn, metrics it is timed for). "fla_lab checks off" is fla_lab with its value checks off."""
    out = {"fla_lab": ("fla_lab", getattr(ops, op), ("fwd_ms", "fwd_bwd_ms", "peak_MiB"))}
    if op in upstream:
        out["fla"] = ("fla", upstream[op], ("fwd_ms", "fwd_bwd_ms", "peak_MiB"))
    out["fla_lab checks off"] = ("fla_lab", without_value_checks(getattr(ops, op)), ("fwd_bwd_ms",))
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


def measure_case(op, B, T, H, upstream, metrics, rounds, device, tag):
    """One (op, B, T): every metric in alternation over the variants, `rounds` times; a variant that fails (OOM,
    compile error, no backward) is recorded with its error and not run again in this case."""
    x = bench.on_device(INPUTS[op](B, T, H), device)
    do = bench.cotangent(x, device)
    kwargs = op_kwargs(op)
    runs, errors = {}, {}
    todo = variants(op, upstream)
    for metric, metric_fn in metrics.items():
        for r in range(1 if metric == "peak_MiB" else rounds):
            for name, (lib, fn, wanted) in todo.items():
                if metric not in wanted or lib in errors:
                    continue
                try:
                    value = measure(metric_fn, fn, x, do, kwargs)
                except Exception as exc:  # noqa: BLE001  OOM, compile error, NotImplementedError: a row, not a crash
                    errors[lib] = {"at": f"{name} {metric}", "error": error_text(exc)}
                    print(f"{tag} {name:<19} {metric:<10} ERROR {errors[lib]['error']}", flush=True)
                    free_memory(device)
                    continue
                runs.setdefault(name, {}).setdefault(metric, []).append(value)
                print(f"{tag} {name:<19} {metric:<10} {fmt(value)}   (round {r + 1})", flush=True)
    return summarize(runs, errors, x, do)


def summarize(runs, errors, x, do):
    row = {"bytes": {"inputs": sum(t.numel() * t.element_size() for t in x),
                     "output": do.numel() * do.element_size()}, "errors": errors}
    for lib in ("fla_lab", "fla"):
        if lib in runs or lib in errors:
            row[lib] = {m: median(v) for m, v in runs.get(lib, {}).items()}
            row[lib]["runs"] = runs.get(lib, {})
    off = runs.get("fla_lab checks off", {}).get("fwd_bwd_ms")
    if off and "fla_lab" in row:
        row["fla_lab"]["fwd_bwd_checks_off_ms"] = median(off)
        row["fla_lab"]["runs"]["fwd_bwd_checks_off_ms"] = off
    return row


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def significant(value):
    return "-" if value is None else f"{value:.3g}"


def free_memory(device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --- the JSON ------------------------------------------------------------------------------------------------------

def row_key(row):
    return row["op"], row["B"], row["T"]


def load(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"rows": []}


def merge_row(result, row):
    result["rows"] = [r for r in result["rows"] if row_key(r) != row_key(row)] + [row]


def save(result, path):
    """Atomic write, then a copy to $OUT (so a killed GPU call still brings its rows back)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    copy_to_out(path)


def copy_to_out(path):
    """A copy in $OUT when that is set (what comes back from the GPU machine)."""
    out = os.environ.get("OUT")
    if out and os.path.abspath(out) != os.path.dirname(os.path.abspath(path)):
        os.makedirs(out, exist_ok=True)
        shutil.copy(path, os.path.join(out, os.path.basename(path)))


def done(result, op, B, T, libs):
    """Measured before for every requested library (a recorded error counts as measured)."""
    row = next((r for r in result["rows"] if row_key(r) == (op, B, T)), None)
    return row is not None and all(lib in row for lib in libs)


def environment(dry_run):
    try:
        import fla
        fla_version = getattr(fla, "__version__", "?")
    except ImportError:
        fla_version = None
    device = "CPU (dry run, Triton interpreter)" if dry_run else torch.cuda.get_device_name(0)
    return {"device": device, "torch": torch.__version__, "triton": triton.__version__, "fla_version": fla_version,
            "date": datetime.date.today().isoformat()}


# --- the run ---------------------------------------------------------------------------------------------------------

def shapes(lengths, tokens, reference):
    """(B, T) per length, B = tokens // T (at least 1), then the reference shape unless already listed."""
    out = [(max(1, tokens // T), T) for T in lengths]
    if reference and REFERENCE_SHAPE not in out:
        out.append(REFERENCE_SHAPE)
    return out


def upstream_ops(wanted):
    if not wanted:
        return {}
    try:
        return bench.upstream_ops()
    except ImportError as exc:
        print(f"flash-linear-attention not importable ({exc}): fla_lab only", flush=True)
        return {}


def run(args):
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        sys.exit("bench_scaling.py times GPU kernels: no CUDA device here (--dry-run runs on the CPU, --plot draws)")
    upstream = upstream_ops(args.upstream and not dry)
    libs = ["fla_lab"] + (["fla"] if upstream else [])
    metrics = dry_metrics() if dry else gpu_metrics()
    result = load(args.json)
    result["meta"] = {"hbm_TBps": args.hbm_tbps, "dtype": "bf16", "H": args.heads, "K": bench.K, "V": bench.V,
                      "M": bench.M, "tokens": args.tokens, "reference": list(REFERENCE_SHAPE), "rounds": args.rounds,
                      "do_bench": "warmup 50 ms, rep 300 ms, median"}
    env = environment(dry)
    print(f"{env}  libraries: {libs}", flush=True)
    run_start = time.time()
    for op in args.only:
        start = time.time()
        for B, T in shapes(args.T, args.tokens, args.ref):
            tag = f"[{op} B={B} T={T}]"
            if args.resume and done(result, op, B, T, libs):
                print(f"{tag} in {args.json} already: skipped (--resume)", flush=True)
                continue
            if over(args.budget_s, start) or over(args.deadline_s, run_start):
                print(f"{tag} skipped: out of time (--budget-s {args.budget_s}, --deadline-s {args.deadline_s}); "
                      "rerun with --resume", flush=True)
                continue
            case_start = time.time()
            torch.manual_seed(0)
            try:
                row = measure_case(op, B, T, args.heads, upstream, metrics, args.rounds, device, tag)
            except Exception as exc:  # noqa: BLE001  e.g. OOM while building the inputs
                print(f"{tag} ERROR {error_text(exc)}", flush=True)
                row = {"errors": {lib: {"at": "inputs", "error": error_text(exc)} for lib in libs},
                       **{lib: {} for lib in libs}}
            row.update(op=op, B=B, T=T, H=args.heads, shape="ref" if (B, T) == REFERENCE_SHAPE else "scaling",
                       seconds=round(time.time() - case_start, 1), **env)
            merge_row(result, row)
            save(result, args.json)
            free_memory(device)
            print(f"{tag} done in {row['seconds']} s: {one_line(row)}", flush=True)
    return result


def over(limit_s, since):
    return limit_s is not None and time.time() - since > limit_s


def one_line(row):
    a, b = row.get("fla_lab", {}), row.get("fla", {})
    return (f"fwd {fmt(a.get('fwd_ms'))} / {fmt(b.get('fwd_ms'))} ms, fwd+bwd {fmt(a.get('fwd_bwd_ms'))} / "
            f"{fmt(b.get('fwd_bwd_ms'))} ms, peak {fmt(a.get('peak_MiB'), 0)} / {fmt(b.get('peak_MiB'), 0)} MiB "
            "(fla_lab / FLA)")


# --- table and figure (CPU, from the JSON alone) -------------------------------------------------------------------

def floor_ms(row, meta, backward):
    """Inputs read and the output written once (forward); forward+backward adds `do` read and every input's
    gradient written: twice the forward's bytes. Divided by the HBM bandwidth."""
    if "bytes" not in row:  # the case failed before its inputs existed
        return None
    once = row["bytes"]["inputs"] + row["bytes"]["output"]
    return (2 if backward else 1) * once / (meta["hbm_TBps"] * 1e12) * 1e3


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


def checks_cost_pct(ours):
    on, off = ours.get("fwd_bwd_ms"), ours.get("fwd_bwd_checks_off_ms")
    return f"{100 * (on / off - 1):+.1f}%" if on and off else "-"


def sorted_rows(result):
    order = {op: i for i, op in enumerate(OPS)}
    return sorted(result["rows"], key=lambda r: (order.get(r["op"], len(OPS)), r["shape"] == "ref", r["T"]))


def distinct(rows, key):
    return ", ".join(sorted({str(r.get(key)) for r in rows}))


def table(result) -> str:
    meta, rows = result["meta"], sorted_rows(result)
    lines = [
        "# fla_lab vs flash-linear-attention: scaling with T",
        "",
        f"- device: {distinct(rows, 'device')}; torch {distinct(rows, 'torch')}, triton {distinct(rows, 'triton')}, "
        f"fla {distinct(rows, 'fla_version')}; measured {distinct(rows, 'date')}",
        f"- {meta['dtype']}, H={meta['H']}, K={meta['K']}, V={meta['V']} (GSA: M={meta['M']} slots), "
        f"B = {meta['tokens']} // T (tokens per call constant), plus the `ref` row B={meta['reference'][0]}, "
        f"T={meta['reference'][1]} (bench.py's shape); RWKV-7 scale=1.0, output_final_state=False everywhere",
        f"- times: `triton.testing.do_bench` ({meta['do_bench']}), fwd+bwd = `o.backward(do)` with fresh "
        f"gradients; timed in alternation fla_lab, FLA, fla_lab checks off (rounds: {meta['rounds']}), each the "
        "median over rounds. Ratios: fla_lab / FLA in the same row, timed on that row's card (< 1: fla_lab faster or "
        "smaller)",
        "- peak: `torch.cuda.max_memory_allocated()` during one forward+backward minus what was allocated before it "
        "(inputs and `do` resident, no gradients): gradients + saved activations + workspace",
        "- checks: fla_lab's fwd+bwd with its value checks on (default, deferred) over off, minus 1",
        f"- floor: bytes of the inputs and output read/written once (fwd), plus `do` and every input gradient "
        f"(fwd+bwd: twice that), at {meta['hbm_TBps']} TB/s (H200 HBM spec); computed, not measured",
        "",
        "| op | device | shape | B | T | fwd ms fla_lab | fwd ms FLA | fwd ratio | fwd+bwd ms fla_lab | fwd+bwd ms FLA "
        "| fwd+bwd ratio | peak MiB fla_lab | peak MiB FLA | peak ratio | checks cost | floor fwd ms "
        "| floor fwd+bwd ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, b = row.get("fla_lab", {}), row.get("fla", {})
        errors = "; ".join(f"{lib} ({e['at']}): {e['error'][:100]}" for lib, e in row.get("errors", {}).items())
        lines.append(
            f"| {row['op']} | {short_device(row)} | {row['shape']} | {row['B']} | {row['T']} | {fmt(a.get('fwd_ms'))} | "
            f"{fmt(b.get('fwd_ms')) if 'fla' in row else 'not run'} | {ratio(a.get('fwd_ms'), b.get('fwd_ms'))} | "
            f"{fmt(a.get('fwd_bwd_ms'))} | {fmt(b.get('fwd_bwd_ms'))} | "
            f"{ratio(a.get('fwd_bwd_ms'), b.get('fwd_bwd_ms'))} | {fmt(a.get('peak_MiB'), 0)} | "
            f"{fmt(b.get('peak_MiB'), 0)} | {ratio(a.get('peak_MiB'), b.get('peak_MiB'))} | {checks_cost_pct(a)} | "
            f"{significant(floor_ms(row, meta, False))} | {significant(floor_ms(row, meta, True))} | "
            f"{errors.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def short_device(row) -> str:
    """"H200", "H100": each row's own card (a run may span machines; ratios compare within one row only)."""
    words = str(row.get("device", "?")).split()
    return next((w for w in words if w == "CPU" or (w[:1] in "HABL" and w[1:].isdigit())), "?")


def series(rows, lib, key):
    points = [(r["T"], r.get(lib, {}).get(key)) for r in rows]
    return [t for t, v in points if v is not None], [v for t, v in points if v is not None]


def draw_time(ax, op, rows, meta):
    for lib, label, style in (("fla_lab", "fla_lab", "o-"), ("fla", "FLA 0.6.0", "s-")):
        ax.plot(*series(rows, lib, "fwd_bwd_ms"), style, ms=3.5, label=label)
    floors = [(r["T"], floor_ms(r, meta, True)) for r in rows if "bytes" in r]
    ax.plot([t for t, _ in floors], [f for _, f in floors], "k--", lw=1, label="HBM floor")
    log_axes(ax, xlabel="T", ylabel="fwd+bwd ms (median)", title=f"{op}\ntime, fwd+bwd")
    note_errors(ax, rows, "fwd_bwd_ms")
    ax.legend(fontsize=6)


def draw_memory(ax, op, rows):
    for lib, label, style in (("fla_lab", "fla_lab", "o-"), ("fla", "FLA 0.6.0", "s-")):
        ax.plot(*series(rows, lib, "peak_MiB"), style, ms=3.5, label=label)
    log_axes(ax, xlabel="T", ylabel="peak MiB above the inputs", title=f"{op}\npeak memory, one fwd+bwd",
             yscale="linear")
    peaks = [v for line in ax.get_lines() for v in line.get_ydata()]
    if peaks:
        ax.set_ylim(0, 1.15 * max(peaks))
    note_errors(ax, rows, "peak_MiB")


def log_axes(ax, yscale="log", **labels):
    """Log T (and log y unless told otherwise) where there is something to draw (a panel without points, e.g. no
    peak memory in a dry run, stays linear: matplotlib cannot log-scale an empty range)."""
    ax.set(**labels)
    if any(len(line.get_xdata()) for line in ax.get_lines()):
        ax.set(xscale="log", yscale=yscale)
    else:
        ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", fontsize=7)


def note_errors(ax, rows, key):
    """Say in the panel why points are missing (e.g. FLA's fused_recurrent_rwkv7 has no backward)."""
    missing = {}
    for r in rows:
        for lib, e in r.get("errors", {}).items():
            if r.get(lib, {}).get(key) is None:
                missing.setdefault(f"{'FLA' if lib == 'fla' else lib}: {e['error'].split(':')[0]}", []).append(r["T"])
    lines = [f"{what} at {'every T' if len(ts) == len(rows) else 'T=' + ', '.join(map(str, ts))}"
             for what, ts in missing.items()]
    if lines:
        ax.text(0.98, 0.5, "no point, " + "\n".join(lines[:3]), transform=ax.transAxes, fontsize=6, color="#a00",
                ha="right", va="center", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})


def figure(result):
    from fla_lab.tools import viz

    meta = result["meta"]
    rows = [r for r in sorted_rows(result) if r["shape"] == "scaling"]
    ops_here = [op for op in OPS if any(r["op"] == op for r in rows)]
    ncols = 2 * min(2, len(ops_here))
    nrows = max(1, -(-len(ops_here) // 2))
    fig, axes = viz.figure(ncols=ncols, nrows=nrows, width=3.3, height=2.7)
    for i, op in enumerate(ops_here):
        mine = [r for r in rows if r["op"] == op]
        draw_time(axes[2 * i], op, mine, meta)
        draw_memory(axes[2 * i + 1], op, mine)
    for ax in axes[2 * len(ops_here):]:
        ax.set_visible(False)
    caption = (f"{distinct(rows, 'device')}, {meta['dtype']}, H={meta['H']} K=V={meta['K']} (GSA M={meta['M']}), "
               f"B = {meta['tokens']} // T: tokens per call constant, so a flat line scales linearly in T. "
               f"Left: fwd+bwd median (do_bench); dashed: HBM floor (inputs, output and their gradients moved once "
               f"at {meta['hbm_TBps']} TB/s). Right: peak memory of one fwd+bwd above the inputs.")
    fig.suptitle(textwrap.fill(caption, 36 * ncols), fontsize=8)
    return fig


def write_outputs(result, md_path, figure_path):
    with open(md_path, "w") as f:
        f.write(table(result))
    copy_to_out(md_path)
    print(f"wrote {md_path}", flush=True)
    try:
        fig = figure(result)
    except ImportError as exc:  # a GPU machine without matplotlib: the JSON and the table are what count
        print(f"no figure ({exc}): run `python benchmarks/bench_scaling.py --plot` elsewhere", flush=True)
        return
    os.makedirs(os.path.dirname(os.path.abspath(figure_path)), exist_ok=True)
    fig.savefig(figure_path, dpi=110, metadata={"Software": None})
    copy_to_out(figure_path)
    print(f"wrote {figure_path}", flush=True)


# --- command line --------------------------------------------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=list(LENGTHS), help="sequence lengths")
    p.add_argument("--tokens", type=int, default=TOKENS, help="B = tokens // T (at least 1)")
    p.add_argument("--ref", action=argparse.BooleanOptionalAction, default=True,
                   help=f"also the reference shape B={REFERENCE_SHAPE[0]}, T={REFERENCE_SHAPE[1]}")
    p.add_argument("--only", nargs="+", default=list(OPS), choices=OPS, metavar="OP", help=f"ops, of {OPS}")
    p.add_argument("--upstream", action=argparse.BooleanOptionalAction, default=True, help="time FLA 0.6.0 too")
    p.add_argument("--ours-only", dest="upstream", action="store_false", help="same as --no-upstream")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per metric (A B A B: 2)")
    p.add_argument("--budget-s", type=float, help="per op: start no new T after this many seconds on the op")
    p.add_argument("--deadline-s", type=float, help="whole run: start no new case after this many seconds")
    p.add_argument("--resume", action="store_true", help="skip rows already in the JSON for these libraries")
    p.add_argument("--heads", type=int, default=bench.H)
    p.add_argument("--hbm-tbps", type=float, default=HBM_TBPS, help="bandwidth of the floor, TB/s")
    p.add_argument("--out-dir", help="write scaling.json, scaling.md and scaling.png here")
    p.add_argument("--json", help="default benchmarks/results/scaling.json")
    p.add_argument("--md", help="default benchmarks/results/scaling.md")
    p.add_argument("--figure", help="default figures/scaling.png")
    p.add_argument("--plot", action="store_true", help="only the table and the figure, from the JSON (any machine)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge these runs' rows into the JSON, then --plot")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, Triton interpreter, T=32, B=1, H=1, fla_lab only, one wall-clock call per metric")
    args = p.parse_args(argv)
    if args.dry_run:
        args.T, args.tokens, args.ref, args.upstream, args.heads, args.rounds = [32], 32, False, False, 1, 1
        args.out_dir = args.out_dir or tempfile.mkdtemp(prefix="bench_scaling_dry_")
    folder = args.out_dir
    args.json = args.json or os.path.join(folder or os.path.join(HERE, "results"), "scaling.json")
    args.md = args.md or os.path.join(folder or os.path.join(HERE, "results"), "scaling.md")
    args.figure = args.figure or os.path.join(folder or os.path.join(ROOT, "figures"), "scaling.png")
    return args


def merge_files(path, others):
    """Rows of other runs' JSONs (e.g. one per GPU call) into `path`; a later file's row replaces an earlier one."""
    result = load(path)
    for other in others:
        theirs = load(other)
        result["meta"] = theirs.get("meta", result.get("meta"))
        for row in theirs["rows"]:
            merge_row(result, row)
    save(result, path)
    return result


def main(argv=None):
    args = parse(argv)
    if args.merge:
        result = merge_files(args.json, args.merge)
    else:
        result = load(args.json) if args.plot else run(args)
    if not result["rows"]:
        sys.exit(f"no rows in {args.json}")
    write_outputs(result, args.md, args.figure)


if __name__ == "__main__":
    main()

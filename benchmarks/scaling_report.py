"""The scaling benchmark's table (markdown) and figure, drawn from its JSON alone on any machine (matplotlib for the
figure): `python -m benchmarks.scaling --plot`.
"""
import os
import textwrap

from benchmarks import common

OPS = tuple(common.INPUTS)


def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def significant(value):
    return "-" if value is None else f"{value:.3g}"


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


def ratio(a, b, digits=2):
    return f"{a / b:.{digits}f}x" if a is not None and b else "-"


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
        f"T={meta['reference'][1]} (the reference shape); RWKV-7 scale=1.0, output_final_state=False everywhere",
        f"- times: `triton.testing.do_bench` ({meta['do_bench']}), fwd+bwd = `o.backward(do)` with fresh "
        f"gradients; timed in alternation fla_lab, FLA, fla_lab checks off (rounds: {meta['rounds']}), each the "
        "median over rounds. Ratios: fla_lab / FLA in the same row, timed on that row's card (< 1: fla_lab faster or "
        "smaller)",
        "- peak: `torch.cuda.max_memory_allocated()` during one forward+backward minus what was allocated before it "
        "(inputs and `do` resident, no gradients): gradients + saved activations + workspace",
        "- checks: fla_lab's fwd+bwd with its value checks on (default, deferred) over off, minus 1",
        f"- floor: bytes of the inputs and output read/written once (fwd), plus `do` and every input gradient "
        f"(fwd+bwd: twice that), at {meta['hbm_TBps']} TB/s (the card's HBM spec); computed, not "
        "measured",
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
    return "\n".join(lines + bug_lines(rows)) + "\n"


def bug_lines(rows) -> list[str]:
    """Fixed over buggy (`--bugs`): what each fix costs, from the rows that timed a catalogued bug beside the op."""
    pairs = [(row, name) for row in rows for name in row if name.startswith("fla_lab bug=")]
    if not pairs:
        return []
    lines = ["", "Fixed over buggy, fla_lab (`--bugs`):", "",
             "| op | shape | B | T | bug | fwd ratio | fwd+bwd ratio |", "|---|---|---|---|---|---|---|"]
    for row, name in pairs:
        fixed, buggy = row.get("fla_lab", {}), row[name]
        lines.append(f"| {row['op']} | {row['shape']} | {row['B']} | {row['T']} | {name.split('=', 1)[1]} | "
                     f"{ratio(fixed.get('fwd_ms'), buggy.get('fwd_ms'), 3)} | "
                     f"{ratio(fixed.get('fwd_bwd_ms'), buggy.get('fwd_bwd_ms'), 3)} |")
    return lines


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
    common.copy_to_out(md_path)
    print(f"wrote {md_path}", flush=True)
    try:
        fig = figure(result)
    except ImportError as exc:  # a GPU machine without matplotlib: the JSON and the table are what count
        print(f"no figure ({exc}): run `python -m benchmarks.scaling --plot` elsewhere", flush=True)
        return
    os.makedirs(os.path.dirname(os.path.abspath(figure_path)), exist_ok=True)
    fig.savefig(figure_path, dpi=110, metadata={"Software": None})
    common.copy_to_out(figure_path)
    print(f"wrote {figure_path}", flush=True)

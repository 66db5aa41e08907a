"""Turn benchmarks/results/bench.json (measured on the GPU) into a markdown table and a figure, on any machine."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PAIRS = [("chunk_gla", "chunk_gla"), ("chunk_rwkv6", "chunk_rwkv6"),
         ("chunk_rwkv6 bug=exclusive_reference", "chunk_rwkv6"),
         ("chunk_gsa", "chunk_gsa"), ("chunk_gsa bug=unmasked_padding", "chunk_gsa"),
         ("fused_recurrent_rwkv6", "fused_recurrent_rwkv6"), ("chunk_rwkv7", "chunk_rwkv7"),
         ("fused_recurrent_rwkv7", "chunk_rwkv7")]


def table(result) -> str:
    by = {(r["lib"], r["op"]): r for r in result["rows"]}
    s = result["shape"]
    lines = [f"Measured on {result['device']} (torch {result['torch']}, triton {result['triton']}), {result['dtype']}, "
             f"B={s['B']}, T={s['T']}, H={s['H']}, K={s['K']}, V={s['V']}; `triton.testing.do_bench` medians. "
             "Each ratio compares two ops timed in the same run.", ""]
    lines += [f"- run {name}: {text}" for name, text in result.get("runs", {}).items()]
    lines += ["", "| fla_lab op | fwd ms | fwd+bwd ms | fla 0.6.0 op | fwd ms | fwd+bwd ms | ratio fwd | ratio fwd+bwd | run |",
              "|---|---|---|---|---|---|---|---|---|"]
    for ours, theirs in PAIRS:
        a, b = by.get(("fla_lab", ours)), by.get(("fla 0.6.0", theirs))
        if not a:
            continue
        run = a.get("run", "")
        if b and b.get("run") == a.get("run"):
            lines.append(f"| {ours} | {a['fwd_ms']:.3f} | {a['fwd_bwd_ms']:.3f} | {theirs} | {b['fwd_ms']:.3f} | "
                         f"{b['fwd_bwd_ms']:.3f} | {a['fwd_ms'] / b['fwd_ms']:.2f}x | {a['fwd_bwd_ms'] / b['fwd_bwd_ms']:.2f}x | {run} |")
        else:
            lines.append(f"| {ours} | {a['fwd_ms']:.3f} | {a['fwd_bwd_ms']:.3f} | {theirs} (not measured) | | | | | {run} |")
    for op, bug in (("chunk_rwkv6", "exclusive_reference"), ("chunk_gsa", "unmasked_padding")):
        fixed, buggy = by.get(("fla_lab", op)), by.get(("fla_lab", f"{op} bug={bug}"))
        if fixed and buggy:
            lines += ["", f"Fixed over buggy {op}: fwd {fixed['fwd_ms'] / buggy['fwd_ms']:.3f}x, "
                          f"fwd+bwd {fixed['fwd_bwd_ms'] / buggy['fwd_bwd_ms']:.3f}x."]
    peaks = [(ours, theirs) for ours, theirs in PAIRS if by.get(("fla_lab", ours), {}).get("peak_MiB")
             and by.get(("fla 0.6.0", theirs), {}).get("peak_MiB") and "bug=" not in ours]
    for ours, theirs in peaks:
        a, b = by[("fla_lab", ours)], by[("fla 0.6.0", theirs)]
        lines.append(f"Peak memory of one forward+backward, {ours}: {a['peak_MiB']:.0f} MiB vs {b['peak_MiB']:.0f} MiB "
                     f"({a['peak_MiB'] / b['peak_MiB']:.2f}x).")
    return "\n".join(lines) + "\n"


def figure(result):
    import numpy as np

    from fla_lab.tools import viz

    by = {(r["lib"], r["op"]): r for r in result["rows"]}
    pairs = [(o, t) for o, t in PAIRS if ("fla_lab", o) in by and "bug=" not in o]
    fig, axes = viz.figure(ncols=2, width=5.2, height=3.6)
    x = np.arange(len(pairs))
    for ax, key, title in ((axes[0], "fwd_ms", "forward"), (axes[1], "fwd_bwd_ms", "forward + backward")):
        ax.bar(x - 0.2, [by[("fla_lab", o)][key] for o, _ in pairs], 0.4, label="fla_lab")
        ax.bar(x + 0.2, [by.get(("fla 0.6.0", t), {}).get(key, 0) for _, t in pairs], 0.4, label="fla 0.6.0")
        ax.set_xticks(x, [o.replace("fused_recurrent", "fused_rec") for o, _ in pairs], rotation=20, fontsize=7)
        ax.set(ylabel="ms (median)", title=title, yscale="log")
        ax.legend(fontsize=7)
    s = result["shape"]
    fig.suptitle(f"{result['device']}, bf16, B={s['B']} T={s['T']} H={s['H']} K=V={s['K']} "
                 "(no orange bar: upstream not measured)", fontsize=9)
    return fig


def main():
    path = os.path.join(HERE, "results", "bench.json")
    with open(path) as f:
        result = json.load(f)
    with open(os.path.join(HERE, "results", "bench.md"), "w") as f:
        f.write(table(result))
    fig = figure(result)
    fig.savefig(os.path.join(os.path.dirname(HERE), "figures", "bench_h200.png"), dpi=110, metadata={"Software": None})
    print(table(result))


if __name__ == "__main__":
    main()

"""docs/performance.md, generated from the result files in benchmarks/results/ and the GPU runs the package ships
(fla_lab/tools/gpu_runs/), stdlib only, any machine.

    python -m dev.performance_page           # write docs/performance.md and docs/gpu-results.md's scaling tables
    python -m dev.performance_page --check   # exit 1 when either is not what this writes

Every section names the device, versions and date its JSON records: a number here is one run on one card, not a
property of every GPU. fla_lab's code comments point here by section title (docs/performance.md, '<title>') instead
of quoting timings; tests/test_source_text.py checks that each title exists and that the page is current,
and tests/test_readme_claims.py renders docs/gpu-results.md's scaling table with `reference_table`.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GPU_RUNS = ROOT / "fla_lab" / "tools" / "gpu_runs"  # the GPU runs the lessons show (fla_lab.tools.gpu_runs)
PAGE = ROOT / "docs" / "performance.md"
README = ROOT / "docs" / "gpu-results.md"  # the page whose scaling tables (`markers`) this renders
SCALING_RUNS = {"scaling.json": ("H200", "reference"), "scaling_h100.json": ("H100", "h100")}  # file: card, marker


def markers(name: str) -> tuple[str, str]:
    """The lines around the reference-shape table of scaling run `name` on docs/gpu-results.md."""
    tag = SCALING_RUNS[name][1]
    return f"  <!-- scaling:{tag}:begin -->\n", f"  <!-- scaling:{tag}:end -->\n"
OPS = ("chunk_gla", "chunk_rwkv6", "fused_recurrent_rwkv6", "chunk_gsa", "chunk_rwkv7", "fused_recurrent_rwkv7")


def load(name: str, folder: Path = RESULTS):
    return json.loads((folder / name).read_text(encoding="utf-8"))


# --- numbers --------------------------------------------------------------------------------------------------------

def sig(value, digits: int = 3) -> str:
    """`digits` significant digits, trailing zeros kept (0.740, 2.43, 14.3); '-' for a missing value."""
    if value is None:
        return "-"
    return f"{value:#.{digits}g}".rstrip(".")


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def cost(on, off) -> str:
    """What switching something on costs, in percent of the time without it."""
    return f"{100 * (on / off - 1):+.1f}%" if on and off else "-"


def recorded(value) -> str:
    """A value as a result file records it by hand (launch_choices.json): no rounding beyond six digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def table(columns, rows) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(recorded(v) for v in row) + " |" for row in rows]


def environment(d, fla=None) -> str:
    """'NVIDIA H200; torch 2.11.0+cu130, triton 3.6.0, fla 0.6.0; 2026-11-27' from a record's fields."""
    versions = f"torch {d['torch']}, triton {d['triton']}"
    fla = fla or d.get("fla_version") or d.get("fla")
    if isinstance(fla, str):
        versions += f", fla {fla}"
    return f"{d['device']}; {versions}; {d['date']}"


def distinct(rows, key) -> str:
    return ", ".join(sorted({str(r[key]) for r in rows}))


# --- sections -------------------------------------------------------------------------------------------------------

def reference_rows(scaling) -> dict:
    return {r["op"]: r for r in scaling["rows"] if r["shape"] == "ref"}


def reference_table(scaling) -> list[str]:
    """fla_lab / FLA at the reference shape (B=8, T=4096): the README's table, rendered the same way here."""
    lines = ["| op | fwd+bwd ms | ratio | fwd ms | fwd ratio | peak memory ratio | value checks |",
             "|---|---|---|---|---|---|---|"]
    rows = reference_rows(scaling)
    for op in (op for op in OPS if op in rows):  # a card's run may leave an op out (it says why)
        a, b = rows[op]["fla_lab"], rows[op].get("fla", {})
        lines.append(f"| {op} | {sig(a['fwd_bwd_ms'])} / {sig(b.get('fwd_bwd_ms'))} | "
                     f"{ratio(a['fwd_bwd_ms'], b.get('fwd_bwd_ms'))} | {sig(a['fwd_ms'])} / {sig(b.get('fwd_ms'))} | "
                     f"{ratio(a['fwd_ms'], b.get('fwd_ms'))} | {ratio(a['peak_MiB'], b.get('peak_MiB'))} | "
                     f"{cost(a['fwd_bwd_ms'], a.get('fwd_bwd_checks_off_ms'))} |")
    return lines


def scaling_section(scaling, name="scaling.json") -> list[str]:
    rows, meta = scaling["rows"], scaling["meta"]
    over_t = sorted((r for r in rows if r["shape"] != "ref"), key=lambda r: (OPS.index(r["op"]), r["T"]))
    lines = [f"## Scaling beside FLA 0.6.0 on the {SCALING_RUNS[name][0]}", "",
             f"`benchmarks/results/{name}` (`python -m benchmarks.scaling`): {distinct(rows, 'device')}; torch "
             f"{distinct(rows, 'torch')}, triton {distinct(rows, 'triton')}, fla {distinct(rows, 'fla_version')}; "
             f"{distinct(rows, 'date')}. {meta['dtype']}, H={meta['H']}, K={meta['K']}, V={meta['V']} (GSA M="
             f"{meta['M']}); fla_lab, FLA and fla_lab without value checks timed in alternation in one process "
             f"({meta['rounds']} rounds, `do_bench` {meta['do_bench']}); ratios fla_lab / FLA (< 1: fla_lab faster or "
             "smaller); value checks: fla_lab's forward+backward with them over without. All rows: "
             f"[{name[:-5]}.md](../benchmarks/results/{name[:-5]}.md).", "",
             f"### At the reference shape (B={meta['reference'][0]}, T={meta['reference'][1]})", ""]
    lines += reference_table(scaling)
    lines += ["", f"### Over T (B = {meta['tokens']} // T)", "",
              "| op | T | B | fwd ratio | fwd+bwd ratio | peak memory ratio | value checks |",
              "|---|---|---|---|---|---|---|"]
    for r in over_t:
        a, b = r["fla_lab"], r.get("fla", {})
        lines.append(f"| {r['op']} | {r['T']} | {r['B']} | {ratio(a['fwd_ms'], b.get('fwd_ms'))} | "
                     f"{ratio(a['fwd_bwd_ms'], b.get('fwd_bwd_ms'))} | {ratio(a['peak_MiB'], b.get('peak_MiB'))} | "
                     f"{cost(a['fwd_bwd_ms'], a.get('fwd_bwd_checks_off_ms'))} |")
    return lines


def checks_section(runs, measurements, choices) -> list[str]:
    lines = ["## Value checks", "",
             "`python -m benchmarks.scaling --checks`: forward+backward with the input value checks off, deferred (the "
             "default) "
             "and read at once (a sync per call); the median of the rounds. Later runs are in the scaling table's "
             "value-check column."]
    for name, run in runs:
        shape = ", ".join(f"{k}={v}" for k, v in run["shape"].items())
        lines += ["", f"`benchmarks/results/{name}`: {environment(run)}; {shape}, {run['dtype']}.", "",
                  "| op | off ms | deferred ms | cost | now ms | cost |", "|---|---|---|---|---|---|"]
        for r in run["rows"]:
            lines.append(f"| {r['op']} | {sig(r['off_ms'], 4)} | {sig(r['deferred_ms'], 4)} | "
                         f"{cost(r['deferred_ms'], r['off_ms'])} | {sig(r['now_ms'], 4)} | "
                         f"{cost(r['now_ms'], r['off_ms'])} |")
        syncs = ", ".join(f"{s['mode']} {s['syncs']}" for s in run.get("sync_count", []))
        if syncs:
            lines += ["", f"Host syncs in one 12-layer `RWKV7Attention` training step: {syncs}."]
    for m in measurements:
        lines += ["", f"{m['what']} ({m['op']}, {m['shape']}): {environment(m)}; {m['source']}.", ""]
        lines += table(m["columns"], m["rows"])
    for c in choices:
        lines += [""] + choice_section(c)
    return lines


def tune_launch_section(tune, choices) -> list[str]:
    shape = ", ".join(f"{k}={v}" for k, v in tune["shape"].items())
    lines = ["## ChunkLaunch defaults", "",
             f"`benchmarks/results/tune_launch.json` (`python -m benchmarks.tune --greedy`): {environment(tune)}; "
             f"{shape}, "
             f"{tune['dtype']}. {tune['note']}.", "",
             "| pass | op | defaults fwd ms | defaults fwd+bwd ms | best fwd ms | best fwd+bwd ms | best launch |",
             "|---|---|---|---|---|---|---|"]
    for name in ("pass1", "pass2"):
        for op, r in tune[name].items():
            launch = ", ".join(f"{k}={v}" for k, v in r["launch"].items())
            lines.append(f"| {name} | {op} | {sig(r['defaults']['fwd_ms'])} | {sig(r['defaults']['fwd_bwd_ms'])} | "
                         f"{sig(r['best']['fwd_ms'])} | {sig(r['best']['fwd_bwd_ms'])} | {launch} |")
    for c in choices:
        lines += [""] + choice_section(c)
    return lines


def choice_section(c) -> list[str]:
    lines = [f"### {c['id']}", "", f"Code: {c['code']}. Choice: {c['choice']}.", "",
             f"{environment(c)}; {c['shape']}. Source: {c['source']}."]
    for t in c["tables"]:
        lines += [""] + ([f"{t['title']}:", ""] if t.get("title") else []) + table(t["columns"], t["rows"])
    return lines


def history_section(launch) -> list[str]:
    lines = ["## What moved the numbers", "",
             "Each change timed on one card beside the code before it, in one process (FLA 0.6.0 beside it where a "
             "value is given). From `benchmarks/results/launch_choices.json` ('history').", "",
             "| change | op | metric | shape | before | after | FLA 0.6.0 | device, versions, date | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for h in launch["history"]:
        lines.append(f"| {h['change']} | {h['op']} | {h['metric']} | {h['shape']} | {recorded(h['before'])} | "
                     f"{recorded(h['after'])} | {recorded(h.get('fla'))} | {environment(h)} | {h['source']} |")
    lines += ["", "## Tried and dropped", "",
              "| tried | op | metric | shape | shipped | tried | device, versions, date | source |",
              "|---|---|---|---|---|---|---|---|"]
    for d in launch["dropped"]:
        lines.append(f"| {d['tried']} | {d['op']} | {d['metric']} | {d['shape']} | {recorded(d['shipped'])} | "
                     f"{recorded(d['tried_value'])} | {environment(d)} | {d['source']} |")
    return lines


def hunt_section(run) -> list[str]:
    return ["## Locator and audit cost", "",
            f"`fla_lab/tools/gpu_runs/bench_hunt.json` (`python -m benchmarks.hunt_cost`): {environment(run)}; a "
            "training step "
            f"of {run['depth']} `RWKV7Attention(\"chunk\")` layers, hidden {run['hidden']}, T = {run['T']}, bf16 "
            "autocast, forward+backward.", "",
            "| step | ms | over the plain step |", "|---|---|---|",
            f"| plain | {sig(run['plain_ms'], 4)} | 1.00x |",
            f"| inside `hunt.locate` | {sig(run['located_ms'], 4)} | {ratio(run['located_ms'], run['plain_ms'])} |",
            f"| inside `audit.audit` (recording) | {sig(run['audited_ms'], 4)} | "
            f"{ratio(run['audited_ms'], run['plain_ms'])} |", "",
            f"`report()` replayed the step's {run['audit_calls']} calls (kernel and float64 reference) in "
            f"{run['audit_report_s']:.0f} s; {run['audit_wrong']} beyond tolerance."]


def accuracy_section(rows) -> list[str]:
    def grad(r, suffix=""):
        return r["errors"].get("g" + suffix, r["errors"].get("w" + suffix))

    first = rows[0]
    lines = ["## Accuracy at T = 4096", "",
             f"`benchmarks/results/long_accuracy.json` (`python -m benchmarks.long_accuracy`): {environment(first)}. "
             "bf16, "
             f"T = {first['T']}, both libraries against one float64 run; scale-aware relative error of the output and "
             "of the decay gradient; `variant` names a run of older or switched-off code.", "",
             "| op | m | library | variant | o | decay gradient | decay gradient, plain |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        variant = r.get("note") or ("" if r.get("split_states", True) else "state products unsplit")
        lines.append(f"| {r['op']} | {r['decay']:g} | {r['library']} | {variant or 'shipped'} | "
                     f"{r['errors']['o']:.1e} | {grad(r):.1e} | {grad(r, ' plain'):.1e} |")
    return lines


def worst_agreement(rows) -> dict:
    """{op: the worst relative error over its shapes, forward and every gradient}."""
    worst = {}
    for r in rows:
        worst[r["op"]] = max(worst.get(r["op"], 0.0), max(r["errors"].values()))
    return worst


def agreement_section(rows) -> list[str]:
    lines = ["## Agreement with FLA 0.6.0 in fp32", "",
             f"`benchmarks/results/upstream_agreement.json` (`python -m benchmarks.upstream_agreement`): "
             f"{environment(rows[0])}. fla_lab's float64 references against FLA's kernels in fp32 (IEEE dots), "
             "forward and every gradient, shapes (B, T, H, K, V) "
             f"{'; '.join(sorted({str(tuple(r['shape'])) for r in rows}))}. fused_recurrent_rwkv6 with a final-state "
             "cotangent: FLA's backward drops it.", "",
             "| op | worst relative error |", "|---|---|"]
    lines += [f"| {op} | {err:.1e} |" for op, err in worst_agreement(rows).items()]
    return lines


def with_readme_table(readme: str, scaling, name="scaling.json") -> str:
    """The page with the scaling table of result file `name` (between its `markers`, indented as a list item)
    re-rendered."""
    begin, end = markers(name)
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + "".join(f"  {line}\n" for line in reference_table(scaling)) + end + tail


def with_readme_tables(readme: str) -> str:
    for name in SCALING_RUNS:
        readme = with_readme_table(readme, load(name), name)
    return readme


def page() -> str:
    launch = load("launch_choices.json")
    choices = {c["id"]: c for c in launch["choices"]}

    def take(*ids):
        return [choices.pop(i) for i in ids]

    checks = take("value checks: where k is checked", "value checks: tile")
    launch_defaults = take("ChunkLaunch: state_BV per call", "chunk scores: folded diagonal")
    lines = ["# Performance, launch choices and their measurements", "",
             "Generated by `python -m dev.performance_page` from `benchmarks/results/*.json`; do not edit by "
             "hand (`--check` fails when this page is stale). Each number is one run on one card, with the device, "
             "versions and date beside it: another card (an H100 rather than an H200, say) gives other numbers. "
             "Comments in `fla_lab/` name a choice and point to a section here by its title.", ""]
    for name in SCALING_RUNS:
        lines += scaling_section(load(name), name) + [""]
    lines += tune_launch_section(load("tune_launch.json"), launch_defaults) + [""]
    lines += ["## Choices in the kernels", "", f"From `benchmarks/results/launch_choices.json`: {launch['about']}"]
    for c in choices.values():
        lines += [""] + choice_section(c)
    runs = [(name, load(name)) for name in ("checks.json", "checks_h100.json")]
    lines += [""] + checks_section(runs, launch["measurements"], checks)
    lines += [""] + history_section(launch)
    lines += [""] + hunt_section(load("bench_hunt.json", GPU_RUNS))
    lines += [""] + accuracy_section(load("long_accuracy.json"))
    lines += [""] + agreement_section(load("upstream_agreement.json"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/performance.md is stale")
    args = parser.parse_args(argv)
    readme = README.read_text(encoding="utf-8")
    wanted = {PAGE: page(), README: with_readme_tables(readme)}
    current = {PAGE: PAGE.read_text(encoding="utf-8") if PAGE.exists() else "", README: readme}
    stale = [path for path, text in wanted.items() if current[path] != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run python -m dev.performance_page", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

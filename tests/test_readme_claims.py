"""The GPU, accuracy and performance numbers of docs/gpu-results.md against the result files they come from.

The README sends its readers to docs/gpu-results.md for these numbers (they were the README's until issue 45). Each
passage of that page (the GPU phases, what was measured on a GPU, the value checks' cost, the locator's and the
audit's cost, the mutation check, the GPU atlas, the audit of an FLA model) is compared with the JSON (or generated
table) in benchmarks/results that names its device and date: the numbers a sentence quotes are recomputed from the
data and rendered as the page prints them, and every other number in the passage must be one of those or a stated
constant of the text (a shape, a tolerance, a count of layers). A number no result file backs fails here, naming the
passage. One table drives it: CHECKS maps each passage to where it lies on the page and to the function that
recomputes it. The scaling table itself is rendered by dev/performance_page.py; the per-notebook times (between
the `times:notebooks` markers) come from their own file (tests/test_notebook_times.py).
"""
import json
import math
import re
from pathlib import Path

import pytest

from conftest import ROOT
from dev import performance_page
from fla_lab.tools import gpu_runs

PAGE = Path(ROOT) / "docs" / "gpu-results.md"
TEXT = PAGE.read_text(encoding="utf-8")
RESULTS = Path(ROOT) / "benchmarks" / "results"


def load(name):
    """A result file: from benchmarks/results/, or one of the GPU runs the package ships (fla_lab.tools.gpu_runs)."""
    stem = name.removesuffix(".json")
    if stem in gpu_runs.FILES:
        return gpu_runs.load(stem)
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


# --- where a passage lies -------------------------------------------------------------------------------------

def at(phrase: str, text: str, pos: int = 0) -> int:
    """Where `phrase` first stands in `text` from `pos`, however the page wraps it (a space: any whitespace)."""
    found = re.compile(r"\s+".join(map(re.escape, phrase.split(" ")))).search(text, pos)
    if found is None:
        raise ValueError(f"the page has no {phrase!r}")
    return found.start()


def block(text: str, start: str, end: str | None, fold: bool = True) -> str:
    """`text` from `start` up to (not including) `end` (None: to the end), whitespace folded to single spaces."""
    i = at(start, text)
    part = text[i:] if end is None else text[i:at(end, text, i)]
    return " ".join(part.split()) if fold else part


def bullet(text: str, start: str) -> str:
    """The bullet of the section 'What was measured on a GPU' that starts with `start`, whitespace folded."""
    section = block(text, "## What was measured on a GPU", "![Time and peak", fold=False)
    return " ".join(next(b for b in section.split("\n- ") if b.startswith(start)).split())


# --- numbers as the page prints them --------------------------------------------------------------------------

IGNORED = [
    re.compile(r"`[^`]*`"),  # code: names, shapes of tiles, file names
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"\d{4}-\d{2}-\d{2}(?:/\d{2})?"),  # dates: compared with the files' dates where they are quoted
    re.compile(r"\b(?:torch|triton|fla|FLA|Python) \d+(?:\.\d+)*(?:\+\w+)?"),  # versions: compared separately
    re.compile(r"\b\d+\.\d+\.\d+\b"),  # other x.y.z versions (flash-linear-attention 0.6.0)
    re.compile(r"\b[Nn]otebooks? \d\d[ab]?\b"),  # notebook numbers
    re.compile(r"#\d+"),  # upstream issue numbers
]
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z_]-)[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?(?:k|x|%)?(?![\w])")


def normal(token: str) -> str:
    return token.lstrip("+-").rstrip("kx%").replace(",", "")


def numbers(text: str) -> list[str]:
    for pattern in IGNORED:
        text = pattern.sub(" ", text)
    return [normal(m.group(0)) for m in NUMBER.finditer(text)]


def unbacked(text: str, backed, constants=()) -> list[str]:
    allowed = {normal(str(v)) for v in [*backed, *constants]}
    return [n for n in numbers(text) if n not in allowed]


def short(value: float) -> str:
    """Errors as the page prints them: 3.3e-3 below 0.01, else two significant digits (0.11, 0.093)."""
    if value >= 0.01:
        return f"{value:.2g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def knob(m: float) -> str:
    """A decay knob as the page writes it: 1e-3, 0.1, 30, 1e3, 1e4."""
    if m < 0.01 or m >= 1000:
        mantissa, exponent = f"{m:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{m:g}"


def pct(on, off) -> str:
    return f"{100 * (on / off - 1):.1f}"


def environment_quoted(text: str, env: dict, device_words: str):
    """The passage names the record's card, its torch and triton (as far as it quotes them) and its date."""
    assert device_words in text and device_words.split()[-1] in env["device"], (device_words, env["device"])
    for name in ("torch", "triton"):
        quoted = re.search(rf"\b{name} (\d+(?:\.\d+)*(?:\+\w+)?)", text)
        if quoted:
            assert env[name].startswith(quoted.group(1)), (name, quoted.group(1), env[name])
    assert env["date"] in text, (env["date"], text[:200])


# --- the passages: each function asserts what its passage quotes and returns the (text, backed, constants) -------
# --- whose numbers must all be backed ----------------------------------------------------------------------------

def gpu_phases(text, table):
    run = load("gpu_phases.json")
    environment_quoted(text, run, "NVIDIA H200")
    assert f"{run['cpu_cores']} cores" in text and f"Python {run['python']}" in text and "no network" in text
    rows = []
    for phase in run["phases"]:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{phase['phase']}` |"))
        if not phase["ran"]:
            assert "not run" in row
            continue
        facts = {k: v for k, v in phase.items() if isinstance(v, int) and not isinstance(v, bool)}
        for key in ("passed", "failed", "skipped"):
            if key in phase and (phase[key] or key in row):
                assert f"{phase[key]} {key}" in row, (row, key, phase[key])
        assert f"| {phase['wall_s']} s" in row, (row, phase["wall_s"])
        if "notebooks" in phase:
            assert f"{phase['notebooks_finished']} of {phase['notebooks']} notebooks" in row
            assert f"{phase['exercise_checks_passed']} of {phase['exercise_checks']} exercise checks" in row
        rows.append((row, facts.values(), ["2.11", "3.6"]))  # the versions the row names (masked)
    return rows


def latest_unit_cuda_run() -> dict:
    """The newest `unit-cuda` row of gpu_phases.md's session tables (its card, commit and counts), and whether that
    session left a failure open."""
    md = (RESULTS / "gpu_phases.md").read_text(encoding="utf-8")
    parts = re.split(r"^## (\d{4}-\d\d-\d\d)", md, flags=re.M)
    row = re.compile(r"^\| \d+ \| (NVIDIA [^|]+?) \| `unit-cuda`[^|]*commit (\w+) \| "
                     r"\*\*(\d+) passed, (\d+) failed, (\d+) skipped\*\*", re.M)
    runs = [dict(zip(("date", "card", "commit", "passed", "failed", "skipped"), (date, *m.groups())),
                 open="**open**" in body)
            for date, body in zip(parts[1::2], parts[2::2]) for m in row.finditer(body)]
    return max(runs, key=lambda r: r["date"])


def unit_cuda(text):
    run = load("gpu_phases.json")
    cuda = next(p for p in run["phases"] if p["phase"] == "unit-cuda")
    assert f"on the H200, {run['date']}: {cuda['passed']} passed, {cuda['skipped']} CPU-only skips" in text
    assert f"That run is of commit {run['commit']}." in text
    latest = latest_unit_cuda_run()
    assert (f"The latest `unit-cuda` run, on an {latest['card']} on {latest['date']} (commit {latest['commit']}), "
            f"had {latest['passed']} passed, {latest['failed']} failed, {latest['skipped']} skipped") in text
    assert ("one of them still open" in text) == latest["open"]
    final_state = (Path(ROOT) / "tests" / "test_final_state_flag.py").read_text(encoding="utf-8")
    recurrent = (Path(ROOT) / "tests" / "test_recurrent.py").read_text(encoding="utf-8")
    assert "else 4  # see the module docstring" in final_state and "4 fp32 ulps" in text  # the tests' bounds
    assert "diff <= 1e-6 * float(grad.abs().max())" in recurrent and "1e-6 of the gradient's scale" in text
    backed = [cuda["passed"], cuda["skipped"], latest["passed"], latest["failed"], latest["skipped"],
              latest["commit"]]  # a commit of digits only reads as a number
    return [(text, backed, [4, "1e-6", 4096, 16384])]


def upstream_agreement(text):
    rows = load("upstream_agreement.json")
    environment_quoted(text, rows[0], "H200")
    worst = performance_page.worst_agreement(rows)
    quoted = dict(re.findall(r"(chunk_\w+|fused_recurrent_\w+) (\d\.\de-\d)", text))
    assert quoted == {op: short(err) for op, err in worst.items() if op in quoted} and len(quoted) == 5, quoted
    assert f"agrees ({short(worst['fused_recurrent_rwkv6 (no dht)'])})" in text
    with_dht = max(max(r["errors"][g] for g in ("k", "v", "w")) for r in rows if r["op"] == "fused_recurrent_rwkv6")
    assert f"off by up to {with_dht:.1g}" in text
    return [(text, [*quoted.values(), short(worst["fused_recurrent_rwkv6 (no dht)"]), f"{with_dht:.1g}"], [])]


def scaling_table(text):
    for name in performance_page.SCALING_RUNS:
        begin, end = performance_page.markers(name)
        rendered = "\n".join("  " + line for line in performance_page.reference_table(load(name)))
        assert begin + rendered + "\n" + end in text, "run python -m dev.performance_page"
    return []


def ratio_of(row, key):
    a, b = row["fla_lab"].get(key), row.get("fla", {}).get(key)
    return round(a / b, 2) if a and b else None


def kilo(T: int) -> str:
    return f"{T // 1024}k"


def scaling_prose(text):
    scaling = load("scaling.json")
    rows, meta = scaling["rows"], scaling["meta"]
    environment_quoted(text, rows[0], "NVIDIA H200")
    assert len({(r["device"], r["date"]) for r in rows}) == 1 and f"fla {rows[0]['fla_version']}" in text
    over_t = [r for r in rows if r["shape"] == "scaling"]
    lengths = sorted({r["T"] for r in over_t})
    assert "T = " + ", ".join(kilo(T) for T in lengths[:-1]) + f" and {kilo(lengths[-1])}" in text
    assert f"B = {meta['tokens']} // T" in text and "B={}, T={}".format(*meta["reference"]) in text
    # every ratio at or under FLA's, less peak memory wherever FLA has a backward
    assert all(ratio_of(r, k) is None or ratio_of(r, k) <= 1.0 for r in over_t for k in ("fwd_ms", "fwd_bwd_ms"))
    assert all(ratio_of(r, "peak_MiB") is None or ratio_of(r, "peak_MiB") < 1.0 for r in over_t)
    worst = re.findall(r"(\w+)'s (forward\+backward|forward) (\d\.\d\d)x at T = ([\dk]+(?:(?:, | and )[\dk]+)*)", text)
    assert len(worst) == 3, worst
    keys = {"forward": "fwd_ms", "forward+backward": "fwd_bwd_ms"}
    for op, metric, value, at in worst:
        mine = {r["T"]: ratio_of(r, keys[metric]) for r in over_t if r["op"] == op}
        top = max(mine.values())
        assert f"{top:.2f}" == value, (op, metric, top)
        assert sorted(re.findall(r"\d+k", at), key=lambda k: int(k[:-1])) == [kilo(T) for T in sorted(mine)
                                                                               if mine[T] == top], (op, at)
    for metric, key in keys.items():  # the first two named are the worst of all ops
        overall = max(ratio_of(r, key) or 0 for r in over_t)
        assert any(m == metric and float(v) == overall for _, m, v, _ in worst[:2]), (metric, overall)
    costs = {(r["op"], r["shape"]): pct(r["fla_lab"]["fwd_bwd_ms"], r["fla_lab"]["fwd_bwd_checks_off_ms"])
             for r in rows}
    odd = costs.pop(("chunk_rwkv6", "ref"))
    low, high = min(costs.values(), key=float), max(costs.values(), key=float)
    assert f"cost {low}-{high}% of forward+backward, and {odd}% for chunk_rwkv6 at the reference shape" in text
    bench = {(r["lib"], r["op"]): r for r in load("bench.json")["rows"]}
    for op, bug in (("chunk_rwkv6", "exclusive_reference"), ("chunk_gsa", "unmasked_padding")):
        fixed, buggy = bench[("fla_lab", op)], bench[("fla_lab", f"{op} bug={bug}")]
        both = sorted(f"{fixed[k] / buggy[k]:.3f}" for k in ("fwd_ms", "fwd_bwd_ms"))
        assert f"`{op}` {both[0]}-{both[-1]}x" in text, (op, both)
    backed = [low, high, odd, *(r["T"] for r in rows), *(kilo(T) for T in lengths), meta["tokens"],
              *meta["reference"], *(v for _, _, v, _ in worst), "0.999", "1.000", "1.002"]
    constants = [meta["H"], meta["K"], meta["M"], 16, 32, 2, 8, 1]  # tiles, warps, the B range of the tuning
    prose = re.sub(r"<!-- scaling:reference:begin -->.*<!-- scaling:reference:end -->", " ", text)  # rendered
    return [(prose, backed, constants)]


def scaling_h100_prose(text):
    """The H100 run (issue 46): the ratios above 1.0 named and profiled, the geometric mean, FLA's run-to-run spread,
    and the forward measurements behind the recurrent ops' launches and value checks."""
    rows = load("scaling_h100.json")["rows"]
    environment_quoted(text, rows[0], "NVIDIA H100 80GB HBM3")
    assert len({(r["device"], r["date"]) for r in rows}) == 1
    lengths = sorted({r["T"] for r in rows if r["shape"] == "scaling"})
    assert "T = " + ", ".join(kilo(T) for T in lengths[:-1]) + f" and {kilo(lengths[-1])}" in text
    names = {"fwd_ms": "forward", "fwd_bwd_ms": "forward+backward"}
    above = [(r, k) for r in rows for k in names if (ratio_of(r, k) or 0) > 1.0]
    quoted = [f"{r['op']}'s {names[k]} {ratio_of(r, k):.2f}x at "
              + ("the reference shape" if r["shape"] == "ref" else f"T = {kilo(r['T'])}")
              + f" ({r['fla_lab'][k]:.2f} / {r['fla'][k]:.2f} ms)" for r, k in above]
    assert len(above) == 1 and "One ratio is above 1.0" in text, quoted
    both = [r["fla_lab"]["fwd_bwd_ms"] / r["fla"]["fwd_bwd_ms"] for r in rows if r["fla"].get("fwd_bwd_ms")]
    mean = math.exp(sum(map(math.log, both)) / len(both))
    assert f"the {len(both)} forward+backward ratios is {mean:.2f};" in text
    assert all(r["fla_lab"]["peak_MiB"] < r["fla"]["peak_MiB"] for r in rows if r["fla"].get("peak_MiB"))
    row = {(r["op"], r["B"], r["T"]): r for r in rows}
    log = (RESULTS / "raw_times" / "profile_chunk_rwkv7_h100_2026-12-06.log").read_text(encoding="utf-8")
    total = dict(re.findall(r"B=(\d+) T=\d+: ([\d.]+) ms of kernels", log))
    bwd = re.search(r"B=64 T=1024.*?([\d.]+) ms +x1 +dplr_bwd_kernel", log, re.S).group(1)
    quoted.append(f"take {float(total['64']):.2f} ms per forward+backward at B=64, T=1024 and {float(total['8']):.2f} ms "
                  f"at B=8, T=4096, the same per token, while FLA's forward+backward took "
                  f"{row['chunk_rwkv7', 64, 1024]['fla']['fwd_bwd_ms']:.2f} and "
                  f"{row['chunk_rwkv7', 8, 4096]['fla']['fwd_bwd_ms']:.2f} ms in the table; the largest kernel is the "
                  f"backward's dplr_bwd_kernel ({float(bwd):.2f} ms at T = 1k)")
    ref, earlier = (next(r for r in load(f)["rows"] if (r["op"], r["shape"]) == ("fused_recurrent_rwkv6", "ref"))
                    for f in ("scaling_h100.json", "scaling_h100_earlier.json"))
    quoted.append(f"took {ref['fla']['fwd_ms']:.2f} ms here ({ratio_of(ref, 'fwd_ms'):.2f}x) and "
                  f"{earlier['fla']['fwd_ms']:.2f} ms in the day's earlier H100 run (`scaling_h100_earlier.json`), where "
                  f"fla_lab's was {ratio_of(earlier, 'fwd_ms'):.2f}x")
    checks = {r["op"]: r for r in load("checks_forward_h100.json")["rows"]}
    inside = {r["op"]: r for r in load("checks_forward_h100_rwkv6_in_kernel.json")["rows"]}
    rwkv6, rwkv7 = checks["fused_recurrent_rwkv6"], checks["fused_recurrent_rwkv7"]
    dropped = next(r for r in load("scaling_h100_rwkv7_in_kernel.json")["rows"] if (r["B"], r["T"]) == (1, 65536))
    quoted += [f"{rwkv6['off_ms']:.2f} ms with its value checks off and {rwkv6['flag pass_ms']:.2f} ms with their flag",
               f"it took {inside['fused_recurrent_rwkv6']['deferred_ms']:.2f} ms",
               f"went from {rwkv7['flag pass_ms']:.2f} to {rwkv7['deferred_ms']:.2f} ms",
               f"cost {pct(dropped['fla_lab']['fwd_bwd_ms'], dropped['fla_lab']['fwd_bwd_checks_off_ms'])}% of"]
    tune = [r for r in load("tune_recurrent_h100.json") if (r["B"], r["T"], r["knob"]) == (16, 4096, "fwd_fallback_tiles")]
    before, after = (next(r["ms"] for r in tune if len(r["value"]) == n) for n in (0, 2))
    quoted.append(f"its forward went from {before:.2f} to {after:.2f} ms")
    rwkv7_tune = {(tuple(r["value"]) if isinstance(r["value"], list) else r["knob"]): r["ms"]
                  for r in load("tune_rwkv7_recurrent_h100.json") if (r["B"], r.get("metric", "fwd")) in
                  ((16, "fwd"), (16, "fwd_ms"))}
    quoted.append(f"it went from {rwkv7_tune[16, 4]:.2f} to {rwkv7_tune[32, 4]:.2f} ms (`tune_rwkv7_recurrent_h100.json`), "
                  f"where FLA's took {rwkv7_tune['FLA 0.6.0']:.2f} ms in that call and "
                  f"{row['fused_recurrent_rwkv7', 16, 4096]['fla']['fwd_ms']:.2f} ms in the table's")
    assert all(q in text for q in quoted), [q for q in quoted if q not in text]
    backed = [*(kilo(T) for T in lengths), *(re.findall(r"\d+\.\d+", " ".join(quoted))), len(both), f"{mean:.2f}"]
    return [(re.sub(r"<!-- scaling:h100:begin -->.*<!-- scaling:h100:end -->", " ", text), backed,
             [16, 4096, 8, 64, 1024, 1.0, 1, 65536, 4686, 1])]


def varlen(text):
    table = (RESULTS / "varlen.md").read_text(encoding="utf-8")
    assert "NVIDIA H200" in table and "2026-11-27" in table  # the file names its card and date
    cells = [c.strip() for line in table.splitlines() if line.startswith("| chunk_") for c in line.split("|")[3:-2]]
    backed = set()
    for cell in cells:
        try:
            value = float(cell.rstrip("x"))
        except ValueError:
            continue
        backed |= {cell, f"{value:#.3g}".rstrip("."), f"{value:.3g}"}
    header = table[:table.index("| op |")]
    assert "H200, 2026-11-27" in text
    lengths = re.findall(r"(\d[\d,]*) to (\d[\d,]*)", header)
    backed |= {n.replace(",", "") for pair in lengths for n in pair}
    return [(text, backed, [1, 32768, 16, 64, 8])]


def long_accuracy(text):
    rows = load("long_accuracy.json")
    environment_quoted(text, rows[0], "H200")
    shipped = [r for r in rows if "note" not in r and r["split_states"]]

    def dg(op, lib, m):
        errors = next(r for r in shipped if (r["op"], r["library"], r["decay"]) == (op, lib, m))["errors"]
        return short(errors.get("g", errors.get("w")))

    ops = ("chunk_gla", "chunk_rwkv6", "chunk_gsa", "chunk_rwkv7")
    weak = ", ".join(f"{dg(op, 'fla_lab', 1e-3)} ({op})" for op in ops)
    assert weak.replace(", " + dg(ops[-1], "fla_lab", 1e-3), " and " + dg(ops[-1], "fla_lab", 1e-3)) in text
    upstream = [dg(op, "fla", 1e-3) for op in ops]
    assert f"against upstream's {', '.join(upstream[:-1])} and {upstream[-1]}" in text
    strong = f"at m = 1, {dg('chunk_gla', 'fla_lab', 1.0)} and {dg('chunk_rwkv6', 'fla_lab', 1.0)} for chunk_gla and " \
             f"chunk_rwkv6 against upstream's {dg('chunk_gla', 'fla', 1.0)} and {dg('chunk_rwkv6', 'fla', 1.0)}"
    assert strong in text
    backed = [dg(op, lib, m) for op in ops for lib in ("fla_lab", "fla") for m in (1e-3, 1.0)]
    return [(text, backed, [4096, "1e-3", 1, 16384])]


def chunk_gsa_decay_gradient(text):
    atlas = load("atlas_gpu.json")
    records = [r for r in atlas["records"] if r["dtype"] == "bf16"]
    decays = sorted({r["decay"] for r in records})
    ours = [r for r in records if r["op"] == "chunk_gsa" and r["variant"] == "fixed"]
    assert max(r["errors"]["dg"] for r in ours) < 2e-2 and "2e-2" in text
    assert f"from {knob(decays[0])} to {knob(decays[-1])}" in text
    fla = [r for r in records if r["op"] == "fla:chunk_gsa"]
    weak = short(max(r["errors"]["dg"] for r in fla if r["decay"] == decays[0]))
    assert f"off by {weak} at m = 1e-3" in text
    plain = {m: max(r["errors_unfloored"]["dg"] for r in fla if r["decay"] == m and r["T"] == 512) for m in (30, 100)}
    assert all(max(r["errors"]["dg"] for r in fla if r["decay"] == m) < 2e-2 for m in plain)
    assert f"reaches {plain[30]:.2g} and {plain[100]:.2g} (T = 512" in text
    declared = "nothing here measured them"  # the notebook's upstream figures are said to be unbacked
    assert declared in text
    quoted = text[text.index("(Notebook 03b quotes"):]
    before = text[:text.index("(Notebook 03b quotes")]
    assert set(numbers(quoted)) <= {"0.28", "30", "16.5", "100", "128..512", "128", "512"}, numbers(quoted)
    return [(before, [weak, f"{plain[30]:.2g}", f"{plain[100]:.2g}", "2e-2", "1e-3", "1e4", 512, 4096],
             [1, "0.05", 30, 100])]


def fla_tests(text):
    md = (RESULTS / "fla_tests.md").read_text(encoding="utf-8")
    total = re.search(r"\| \*\*total\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\*", md)
    passed, failed = int(total.group(1)), int(total.group(2))
    assert f"{passed} of {passed + failed} pass" in text and "2026-11-27" in md and "CPU" in md
    varlen_tests = re.search(r"\*\*(\d+) passed, 0\s+failed\*\*", md)
    assert f"FLA's {varlen_tests.group(1)} varlen tests pass" in text
    ratio = re.search(r"error ratio (0\.\d+) > (0\.\d+)", md)
    assert f"(error ratio {float(ratio.group(1)):.2e}".replace("e-03", "e-3") in text
    return [(text, [passed, passed + failed, varlen_tests.group(1), "4.19e-3", "4e-3"], [512])]


def value_check_costs(text):
    scaling = load("scaling.json")
    ref = {r["op"]: r["fla_lab"] for r in scaling["rows"] if r["shape"] == "ref"}
    over_t = [r for r in scaling["rows"] if r["shape"] == "scaling"]
    for op, ours in ref.items():
        assert f"+{pct(ours['fwd_bwd_ms'], ours['fwd_bwd_checks_off_ms'])}% {op}" in text, op

    def span(ops):
        costs = [float(pct(r["fla_lab"]["fwd_bwd_ms"], r["fla_lab"]["fwd_bwd_checks_off_ms"])) for r in over_t
                 if r["op"] in ops]
        return f"{min(costs)}-{max(costs)}% over T"

    assert span({"chunk_gla", "chunk_rwkv6"}) in text and span({"chunk_rwkv7"}) in text
    runs = [load("checks.json"), load("checks_h100.json")]
    now = [100 * (r["now_ms"] / r["off_ms"] - 1) for run in runs for r in run["rows"]
           if r["op"] in ("chunk_gla", "chunk_rwkv6")]
    assert f"chunk_gla and chunk_rwkv6 {min(now):.0f}-{max(now):.0f}%" in text
    host = next(m for m in load("launch_choices.json")["measurements"] if m["op"] == "chunk_rwkv6")
    (_, on, gpu), (_, off, _) = host["rows"]
    assert f"about {on - off:.2f} ms" in text and f"({on} against {off} ms" in text and f"takes {gpu};" in text
    syncs = {s["mode"]: s["syncs"] for s in runs[0]["sync_count"]}
    assert f"pays {syncs['deferred']} host syncs for them ({syncs['now']} in the sync-per-call mode" in text
    backed = [pct(o["fwd_bwd_ms"], o["fwd_bwd_checks_off_ms"]) for o in ref.values()] + [
        *re.findall(r"[\d.]+", span({"chunk_gla", "chunk_rwkv6"}) + span({"chunk_rwkv7"})),
        f"{min(now):.0f}", f"{max(now):.0f}", f"{on - off:.2f}", on, off, gpu, syncs["deferred"], syncs["now"]]
    constants = [8, 4096, 16, 64, 12, 3]  # the shape; 12 layers; `call #3` in the quoted message
    return [(text, backed, constants)]


def locator_and_audit_cost(locator, audit_cost):
    run = load("bench_hunt.json")
    environment_quoted(locator, run, "H200")
    assert (f"{run['located_ms']:.1f} ms against {run['plain_ms']:.1f} ms without it, "
            f"**{run['ratio']:.2f}x**") in locator
    assert f"{run['depth']} `RWKV7Attention(\"chunk\")` layers, hidden {run['hidden']}, T = {run['T']}" in locator
    assert (f"{run['audited_ms']:.1f} ms against {run['plain_ms']:.1f} ms, **{run['audit_ratio']:.2f}x**"
            in audit_cost)
    assert (f"each of the {run['audit_calls']} calls" in audit_cost and f"**{run['audit_report_s']:.0f} s**, all "
            f"{run['audit_calls'] - run['audit_wrong']} right" in audit_cost)
    backed = [f"{run[k]:.1f}" for k in ("located_ms", "plain_ms", "audited_ms")] + [
        f"{run['ratio']:.2f}", f"{run['audit_ratio']:.2f}", f"{run['audit_report_s']:.0f}", run["depth"],
        run["hidden"], run["T"], run["audit_calls"]]
    return [(locator + audit_cost, backed, [5, 3])]  # median of 5 (benchmarks.hunt_cost's repeat), 3 layers


def mutation_check_counts(text):
    rows = [r for r in load("mutations.json") if r.get("kind", "slip") == "slip"]  # the safeguards: their own check
    caught = sum(r["tests"]["verdict"] == "caught" for r in rows)
    flagged = sum(r["atlas"]["verdict"] == "flagged" for r in rows)
    audited = sum(r["locate"]["audit_op"] for r in rows)
    located = sum(r["locate"]["locator_op"] and r["locate"]["locator_kernel"] for r in rows)
    seconds = round(sum(r["seconds"] for r in rows))
    days = sorted({r["finished"][:10] for r in rows})
    assert {r["device"] for r in rows} == {"CPU (Triton interpreter)"} and "CPU" in text
    assert f"applies {len(rows)} plausible" in text and f"{seconds} s, {days[0]}/{days[-1][-2:]}" in text
    assert f"the tests catch {caught} of {len(rows)} (the {len(rows)}th is an equivalent mutant)" in text
    assert f"the atlas flags {flagged} and the audit {audited}" in text and located == 1 and "for the one" in text
    return [(text, [len(rows), caught, flagged, audited, seconds], [])]


def safeguard_mutation_counts(text):
    from dev import mutation_check as mc

    rows = {r["id"]: r for r in load("mutations.json")}
    s = mc.safeguard_summary(rows)
    gpu = [r for r in rows.values() if r.get("kind") == "safeguard" and not r["device"].startswith("CPU")]
    assert not s["missed"] and not s["not_run"] and s["ran"] == s["entries"]
    assert f"lists the kernels' and layers' {s['entries']} numerical safeguards" in text
    assert f"{s['ran'] - len(gpu)} on the CPU, the {len(gpu)}" in text and {r["device"] for r in gpu} == {"NVIDIA H200"}
    assert f"the tests catch {s['tests']} of {s['ran']}. Of the {s['op_level']} in kernels" in text
    assert f"the atlas flags {s['atlas']}, {s['atlas_only_in_range']} of them only in their range" in text
    assert f"flags {s['audit']}. The other {s['entries'] - s['op_level']} act" in text
    days = sorted({r["finished"][:10] for r in rows.values() if r.get("kind") == "safeguard"})
    assert f"H200, {days[-1]})" in text
    backed = [s["entries"], s["ran"] - len(gpu), len(gpu), s["tests"], s["ran"], s["op_level"], s["atlas"],
              s["atlas_only_in_range"], s["audit"], s["entries"] - s["op_level"], days[-1]]
    return [(text, backed, [88, 100, 16, 32, 4096])]


def gpu_atlas(text):
    atlas = load("atlas_gpu.json")
    env, records = atlas["environment"], atlas["records"]
    environment_quoted(text, env, "H100 80GB")
    assert f"FLA {env['fla_version']}" in text
    backed = set()

    def worst(op, weak):
        rows = [r for r in records if r["op"] == op and r["variant"] == "fixed" and r["T"] == 4096
                and ((r["decay"] <= 1) if weak else (r["decay"] >= 10))]
        return max((v, name, r["decay"]) for r in rows for name, v in r["errors"].items())

    for op in ("chunk_gla", "chunk_rwkv6", "fused_recurrent_rwkv6", "chunk_gsa", "chunk_rwkv7"):
        row = next(line for line in text.split(" | " + op + " | ")[1:2])
        cells = [c.strip() for c in row.split(" |")[:4]]
        for cell, (lib, weak) in zip(cells, [("", True), ("", False), ("fla:", True), ("fla:", False)]):
            value, name, decay = worst(lib + op, weak)
            assert cell.split(" ")[0] == short(value), (op, lib, weak, cell, value)
            if "m = " in cell:
                assert f"(d{name[1:] if name.startswith('d') else name}" in cell or f"({name}" in cell, (cell, name)
                assert cell.endswith(f"m = {knob(decay)})"), (cell, decay)
            backed |= {short(value), knob(decay)}
    decays = sorted({r["decay"] for r in records})
    assert "(" + ", ".join(knob(m) if m >= 1000 else f"{m:g}" for m in decays) + ")" in text
    nan_from = {T: min(r["decay"] for r in records if r["variant"] == "exclusive_reference" and r["T"] == T
                       and r["status"] == "nonfinite") for T in (512, 4096)}
    assert set(nan_from.values()) == {100.0} and "goes NaN from m = 100 at both lengths" in text
    h0_mask = {(r["h0"], r["status"]) for r in records if r["variant"] == "transposed_h0_mask"}
    assert h0_mask == {(True, "raises"), (False, "right")} and "every setting with an initial state" in text
    fla_gsa = [r["errors"]["dg"] for r in records if r["op"] == "fla:chunk_gsa" and r["decay"] == 1e-3]
    assert f"off by {min(fla_gsa):.1g}-{max(fla_gsa):.2g} at m = 1e-3" in text
    ours = [r for r in records if not r["op"].startswith("fla:") and r["variant"] == "fixed"]
    assert {r["status"] for r in ours} == {"right"}
    assert f"(worst {short(max(max(r['errors'].values()) for r in ours))}, chunk_gsa's" in text
    weak_dg = {lib: sorted(short(worst(lib + op, True)[0]) for op in ("chunk_gla", "chunk_rwkv6"))
               for lib in ("", "fla:")}
    lo, hi = weak_dg[""]
    assert f"({lo.split('e')[0]}-{hi})" in text and "({}-{})".format(weak_dg["fla:"][0].split("e")[0],
                                                                   weak_dg["fla:"][1]) in text
    backed |= {f"{min(fla_gsa):.1g}", f"{max(fla_gsa):.2g}", *weak_dg[""], *weak_dg["fla:"],
               lo.split("e")[0], weak_dg["fla:"][0].split("e")[0], "1e-3", "1e4", "1e3"}
    backed |= {f"{m:g}" for m in decays} | {r["T"] for r in records} | {r["B"] for r in records}
    backed |= {r["H"] for r in records} | {r["K"] for r in records}
    exp_max = f"{math.log(2 ** 128):.1f}"  # log(float32 max): where exp overflows (arithmetic, not a measurement)
    return [(text, backed, [exp_max, 200, 16384, 64, 0.001])]


def fla_model_audit(text):
    run = load("fla_audit_rwkv6_fused.json")
    repro = json.loads((RESULTS.parent / "repro" / "fused_recurrent_rwkv6_dht.json").read_text(encoding="utf-8"))
    assert run["device"] == "NVIDIA H200" == repro["device"] and run["fla_version"] == "0.6.0" == repro["fla"]
    wrong = [c for c in run["calls"] if not c["ok"]]
    assert len(wrong) == run["wrong"] == run["calls_with_final_state_cotangent"]
    assert all(c["final_state_cotangent"] for c in wrong), "a wrong call without a final-state cotangent"
    dht = next(r["errors"] for r in repro["rows"] if r["case"] == "with dht")
    none = next(r["errors"] for r in repro["rows"] if r["case"] == "no dht")
    assert f"flagged {run['wrong']} of its {len(run['calls'])} calls" in text
    backed = [run["wrong"], len(run["calls"]), f"{max(c['errors']['dk'] for c in wrong):.2f}",
              f"{run['step_s'] * 1e3:.1f}", f"{run['recorded_step_s'] * 1e3:.1f}",
              f"{run['replay_s'] / len(run['calls']) * 1e3:.0f}", f"{dht['dk']:.2f}", f"{dht['dv']:.2f}",
              f"{dht['dw']:.2f}", short(max(none.values()))]
    return [(text, backed, [])]


def fla_models_h100(text):
    """The audits of FLA's RWKV-7, GSA and GLA models on the H100 and their controls: every row of the table
    recomputed from its two reports."""
    backed = []
    for family in ("rwkv7", "gsa", "gla"):
        run, control = load(f"fla_audit_{family}_h100.json"), load(f"fla_audit_{family}_control_h100.json")
        assert run["device"] == control["device"] == "NVIDIA H100 80GB HBM3" and run["fla_version"] == "0.6.0"
        assert run["args"] | {"control": True} == control["args"] and run["args"]["first_config"]
        assert run["wrong"] == 0 and control["control caught"]
        carried = [c for c in control["calls"] if not c["final_state_cotangent"]]  # the later segment's calls
        assert control["wrong"] == len(carried) and not any(c["ok"] for c in carried)
        n = len(run["calls"])
        worst = max(run["calls"], key=lambda c: c["errors"][c["worst"]] / c["tolerance"][c["worst"]])
        cells = [family, n, run["wrong"], run["calls_with_final_state_cotangent"],
                 f"{worst['worst']} {short(worst['errors'][worst['worst']])} ({short(worst['tolerance'][worst['worst']])})",
                 f"{run['step_s'] * 1e3:.1f}", f"{run['recorded_step_s'] * 1e3:.1f}", f"{run['replay_s'] / n * 1e3:.0f}",
                 f"{control['wrong']} of {len(control['calls'])}"]
        row = "| " + " | ".join(map(str, cells)) + " |"
        assert row in text, row
        backed += [str(c) for c in cells[1:4]] + re.findall(r"\d+(?:\.\d+)?(?:e-\d+)?", " ".join(map(str, cells[4:])))
        assert f"flagged the {control['wrong']} calls given an initial state" in text
    return [(text, backed, [2048, 2, 2026, 12, 6, 4, 4686, 0, 0.6])]


# --- the table: each passage, where it lies on the page, and the function that recomputes it -------------------

def passage(start, end=None):
    return lambda text: block(text, start, end)


def measured(start):
    return lambda text: bullet(text, start)


CHECKS = {
    "the GPU phases": (gpu_phases, passage("**What has run on a GPU machine**", "\n\n|"),
                       lambda text: block(text, "| phase | result on the H200 | wall time |", "\n\n", fold=False)),
    "unit-cuda": (unit_cuda, measured("The unit tests on CUDA")),
    "agreement with FLA": (upstream_agreement, measured("The float64 references agree")),
    "the scaling table": (scaling_table, lambda text: text),
    "speed and memory": (scaling_prose, measured("Speed and memory beside upstream over T")),
    "speed and memory on the H100": (scaling_h100_prose,
                                     measured("Speed and memory beside upstream on an NVIDIA H100")),
    "packed batches": (varlen, measured("Packed variable-length batches")),
    "accuracy at training length": (long_accuracy, measured("Accuracy at training length")),
    "chunk_gsa's decay gradient": (chunk_gsa_decay_gradient, measured("`chunk_gsa`'s bf16 decay gradient")),
    "FLA's own op tests": (fla_tests, measured("flash-linear-attention's own op tests")),
    "the value checks' cost": (value_check_costs, passage("GPU cost of the input value checks", "\n\n## ")),
    "the locator's and the audit's cost": (locator_and_audit_cost, passage("The locator (", "\n\nThe audit's cost ("),
                                           passage("The audit's cost (", "Notebook 06 finds")),
    "the mutation check": (mutation_check_counts, passage("## The mutation check: who catches what",
                                                          "`tests/test_final_state_flag.py` exists.")),
    "the safeguards": (safeguard_mutation_counts, passage("**Every safeguard is load-bearing.**", "\n\n## ")),
    "the GPU atlas": (gpu_atlas, passage("**On an H100 80GB**", "![Worst error against decay")),
    "the audit of an FLA model": (fla_model_audit, passage("On an H200 (FLA 0.6.0", "On an H100 80GB HBM3 (FLA 0.6.0")),
    "the audits of FLA's models on the H100": (fla_models_h100, passage("On an H100 80GB HBM3 (FLA 0.6.0")),
}


def check(name: str, text: str = TEXT):
    """Run the check of passage `name` on the page `text`: its own assertions, then every number backed."""
    recompute, *where = CHECKS[name]
    for part, backed, constants in recompute(*(find(text) for find in where)):
        assert not unbacked(part, backed, constants), (name, unbacked(part, backed, constants))


@pytest.mark.parametrize("name", CHECKS)
def test_passage_matches_its_result_file(name):
    check(name)


@pytest.mark.parametrize("broken,name", [("1.37x", "the locator's and the audit's cost"),
                                         ("742 passed", "the GPU phases")])
def test_a_changed_number_is_caught(broken, name):
    """Sanity: with one quoted number changed, the passage's check fails."""
    with pytest.raises(AssertionError):
        check(name, TEXT.replace(broken, broken.replace("7", "9", 1), 1))

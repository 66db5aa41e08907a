"""The one file of notebook times, `benchmarks/results/notebook_times.json`, and everything said from it.

The file holds a learner's reading time per notebook (with its source: a cold reader's measurement or the author's
estimate) and one run per device (the CPU, each GPU card) of `python -m dev.notebook_times`: the device, Python,
torch and triton versions, the date, the commit and the command, and per notebook its times. `notebook_times.py
--record` merges a run into it (replacing the earlier run of the same device); `--render` prints, and `--render
--write` writes, the passages of docs/onboarding.md and docs/gpu-results.md that state notebook times: each lies between
`<!-- times:NAME:begin -->` and `<!-- times:NAME:end -->` and is made here from the file and the notebooks' markdown
(word counts). tests/test_notebook_times.py checks that those passages equal what this module makes, that every
notebook's header states the file's time for it, and that every run names its device, versions and date.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES_FILE = ROOT / "benchmarks" / "results" / "notebook_times.json"
GUIDE = ROOT / "docs" / "onboarding.md"
README = ROOT / "docs" / "gpu-results.md"  # the GPU results page (its times:notebooks passage)
RUN_KEYS = ("device", "python", "torch", "triton", "date", "commit", "how")  # every run names these
GOING_FURTHER = re.compile(r"^## Going further", re.M)

# the guide's name for each notebook in its tables
TITLES = {
    "00_start_here": "00 start here",
    "01_all_nan_output": "01 the RWKV-7 layer returns all-NaN (#150)",
    "02_gradients_blow_up": "02 gradients blow up (#11, #150)",
    "03a_nan_under_strong_decay": "03a NaN under strong decay (#77, RWKV6)",
    "03b_nan_gradients_that_come_and_go": "03b NaN gradients that come and go (#77, GSA)",
    "04_backward_fails_with_initial_state": "04 the backward fails with an initial state (#18)",
    "05_precision_gap_under_amp": "05 a precision gap under AMP (#181)",
    "06_nan_hunting": "06 capstone: hunting bugs",
}


# ---------------------------------------------------------------------------------------------------- the file


def load(path: Path = TIMES_FILE) -> dict:
    return json.loads(Path(path).read_text())


def save(data: dict, path: Path = TIMES_FILE) -> None:
    Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def merge(data: dict, run: dict) -> dict:
    """`data` with `run` in place of the earlier run of the same device (CPU first, then the cards by name)."""
    runs = [r for r in data.get("runs", []) if r["device"] != run["device"]] + [run]
    data["runs"] = sorted(runs, key=lambda r: (r["device"] != "cpu", r["device"]))
    return data


def cpu_run(data: dict) -> dict | None:
    return next((_named(r) for r in data["runs"] if r["device"] == "cpu"), None)


def gpu_runs(data: dict) -> list[dict]:
    return [_named(r) for r in data["runs"] if r["device"] != "cpu"]


def _named(run: dict) -> dict:
    """The run, with "not recorded" for a field it lacks (the test names those; rendering goes on)."""
    return {**{k: "not recorded" for k in RUN_KEYS}, **run}


def card(run: dict) -> str:
    """The card's short name ("H200" of "NVIDIA H200"), "CPU" for the CPU run."""
    if run["device"] == "cpu":
        return "CPU"
    words = run["device"].replace("NVIDIA", "").split()
    return next((w for w in words if re.fullmatch(r"[A-Z]+\d+\w*", w)), " ".join(words))


# ------------------------------------------------------------------------------------------------- recording


def going_further_index(nb_path: Path) -> int | None:
    """Index of the markdown cell that opens `## Going further` (None: the notebook has none)."""
    cells = json.loads(Path(nb_path).read_text())["cells"]
    return next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and GOING_FURTHER.search(_text(c))),
                None)


def run_from_results(repeats: list[list[dict]], meta: dict) -> dict:
    """A run for the file from notebook_times.py's results (one list per repeat; on a GPU: cold, then warm) and `meta`
    (device, versions, date, commit, command; anything else in it is kept)."""
    run = {k: meta[k] for k in RUN_KEYS if meta.get(k) is not None}
    run.update({k: v for k, v in meta.items() if k not in RUN_KEYS and v is not None})
    run["notebooks"] = {}
    warm_runs = {r["notebook"]: r for r in repeats[1]} if len(repeats) > 1 else {}
    for r in repeats[0]:
        stem = r["notebook"].removesuffix(".ipynb")
        entry = {"status": r["status"], "kernel_start_s": _round(r.get("kernel_start_s"))}
        if meta["device"] == "cpu":  # the interpreter compiles nothing
            entry.update(wall_s=_round(r["total_s"]), cpu_s=_round(r.get("cpu_s")),
                         load_avg=[r.get("load_avg_before"), r.get("load_avg_after")])
            gf = going_further_index(ROOT / "notebooks" / r["notebook"])
            main = [c for c in r["cells"] if gf is not None and c["index"] < gf]
            if main and len(main) < len(r["cells"]):
                entry["main_path_wall_s"] = _round(r.get("kernel_start_s", 0) + sum(c["s"] for c in main))
                entry["main_path_cpu_s"] = _round(main[-1].get("cpu_s_so_far"))
        else:
            entry.update(cold_s=_round(r["total_s"]), compiles=r.get("compiles"), compile_s=_round(r.get("compile_s")))
            warm = warm_runs.get(r["notebook"])
            if warm:
                entry.update(warm_s=_round(warm["total_s"]), warm_compile_s=_round(warm.get("compile_s")))
                if warm["status"] != "ok" and entry["status"] == "ok":
                    entry["status"] = f"warm run: {warm['status']}"
            if r.get("widgets"):
                w = max(r["widgets"], key=lambda w: w["first_s"])
                entry["widgets"] = {"controls": len(r["widgets"]), "first_max_s": w["first_s"],
                                    "first_max_control": w["control"],
                                    "warm_max_s": max(x["warm_s"] for x in r["widgets"])}
            elif r.get("widgets_summary"):  # a run read back from its log
                entry["widgets"] = r["widgets_summary"]
        run["notebooks"][stem] = {k: v for k, v in entry.items() if v is not None}
    return run


def _round(x, digits: int = 2):
    return None if x is None else round(float(x), digits)


# -------------------------------------------------------------------------------------------------- rendering


def _text(cell) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def notebook_paths() -> dict[str, Path]:
    return {stem: ROOT / "notebooks" / f"{stem}.ipynb" for stem in TITLES}


def words(nb_path: Path) -> tuple[int, int]:
    """Words of markdown before `## Going further` and after the heading (`fla_lab.teaching.edition.markdown_words`)."""
    from fla_lab.teaching.edition import markdown_words

    return markdown_words(nb_path)


def fmt_s(x: float) -> str:
    """Seconds as the tables print them: one decimal under 100 s, whole seconds from there."""
    return f"{x:.1f} s" if x < 100 else f"{x:.0f} s"


def fmt_total(x: float) -> str:
    return f"{x:.0f} s" if x < 120 else f"{int(x // 60)} min {x % 60:.0f} s"


def minutes(reading: dict) -> str:
    lo, hi = reading["minutes"]
    return f"{lo}-{hi}" if lo != hi else f"about {lo}"


def learner_time(reading: dict) -> str:
    extra = reading.get("extra")
    more = f", {extra['minutes']} {extra['with']}" if extra else ""
    return f"{minutes(reading)} min{more} ({reading['source']})"


def _status_note(entry: dict) -> str:
    return "" if entry.get("status", "ok") == "ok" else f" ({entry['status']})"


def cpu_cell(entry: dict | None, what: str = "") -> str:
    if not entry or "cpu_s" not in entry:
        return "not measured"
    text = f"{fmt_s(entry['cpu_s'])}{what} ({fmt_s(entry['wall_s'])} wall)"
    if "main_path_cpu_s" in entry and entry["main_path_cpu_s"] < 0.85 * entry["cpu_s"]:
        text += f"; main path {fmt_s(entry['main_path_cpu_s'])}"
    return text + _status_note(entry)


def gpu_cell(entry: dict | None) -> str:
    if not entry or "cold_s" not in entry:
        return "not measured"
    warm = fmt_s(entry["warm_s"]) if "warm_s" in entry else "-"
    return f"{fmt_s(entry['cold_s'])} / {warm}{_status_note(entry)}"


def _versions(run: dict) -> str:
    return f"Python {run['python']}, torch {run['torch']}, triton {run['triton']}"


def table(data: dict) -> str:
    cpu, gpus = cpu_run(data), gpu_runs(data)
    head = ["notebook", "words, main path / going further", "CPU seconds, 2-core machine (wall)"]
    head += [f"{card(g)} GPU, cold / warm" for g in gpus] + ["a learner's time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    totals = {"main": 0, "further": 0}
    for stem, path in notebook_paths().items():
        main, further = words(path)
        totals["main"] += main
        totals["further"] += further
        row = [TITLES[stem], f"{main:,} / {further:,}", cpu_cell(cpu["notebooks"].get(stem) if cpu else None)]
        row += [gpu_cell(g["notebooks"].get(stem)) for g in gpus] + [learner_time(data["reading"][stem])]
        lines.append("| " + " | ".join(row) + " |")
    row = [f"all {len(TITLES)}", f"{totals['main']:,} / {totals['further']:,}", _sum_cell(cpu, ("cpu_s", "wall_s"))]
    row += [_sum_cell(g, ("cold_s", "warm_s")) for g in gpus] + [""]
    lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _sum_cell(run: dict | None, keys: tuple[str, str]) -> str:
    entries = [run["notebooks"].get(stem) for stem in TITLES] if run else []
    if not entries or not all(e and keys[0] in e for e in entries):
        return ""
    first, second = (fmt_total(sum(e[k] for e in entries)) if all(k in e for e in entries) else "-" for k in keys)
    return f"{first} ({second} wall)" if keys[0] == "cpu_s" else f"{first} / {second}"


def _span(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f} s" if values else "-"


def _load_span(run: dict) -> str:
    loads = [x for e in run["notebooks"].values() for x in e.get("load_avg", []) if x is not None]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "not recorded"


def bullets(data: dict) -> str:
    cpu, out = cpu_run(data), []
    out.append("- **Words**: markdown before and after each notebook's `## Going further` heading (the main path is "
               "what the agenda times; going further is for the two-day format or for fast learners).")
    if cpu:
        out.append(
            f"- **CPU seconds**: `{cpu['how']}` on {cpu.get('cpu_model', 'a CPU machine')} with "
            f"{cpu.get('cores', '?')} cores ({_versions(cpu)}, Triton interpreter; {cpu['date']}, commit "
            f"{cpu['commit']}): each notebook in a fresh Jupyter kernel, one after the other. The figure is the CPU "
            "time of the notebook's kernel process (user + system, its start included): it does not depend on what "
            "else runs on the machine. The wall time beside it does (one-minute load average "
            f"{_load_span(cpu)} during this run); on a machine shared with other work, expect it to grow. Main "
            "path: the cells before `## Going further`, where those after it take a large share.")
    for g in gpu_runs(data):
        compile_s = [e["compile_s"] for e in g["notebooks"].values() if "compile_s" in e]
        text = (f"- **{card(g)}** ({g['device']}, {_versions(g)}; {g['date']}, commit {g['commit']}): `{g['how']}`, "
                "each notebook in a fresh Jupyter kernel. Cold = empty Triton cache, every kernel specialisation "
                f"compiled, the wait a learner meets on a first run ({_span(compile_s)} of compiling per notebook); "
                "warm = the cache filled, a fresh kernel (a second session).")
        if widget_times(g):
            text += (" Both include the widget probe after the last cell (every explorer's controls moved): "
                     f"{widget_times(g)}.")
        if g.get("note"):
            text += " " + g["note"]
        out.append(text)
    readers = sorted({r["date"] for r in data["reading"].values() if r.get("date")})
    out.append(
        "- **A learner's time**: reading, predicting, the exercises and the notebook's questions at a normal pace. "
        f"\"Cold reader\" ({', '.join(readers)}): an engineer who had not seen the code worked the half-day agenda's "
        "four notebooks in the learner's edition, every Predict written down first and every exercise done, and "
        "estimated a new engineer's time from it (all four passed on the first try, so people who need the hints "
        "take longer). The others are their authors' estimates, not yet measured with a reader: plan with a margin.")
    return "\n".join(wrap(item, "  ") for item in out)


def widget_times(run: dict) -> str:
    """The explorers' worst redraw once compiled and worst first move, from the run's widget probe ("" without)."""
    widgets = {s: e["widgets"] for s, e in run["notebooks"].items() if e.get("widgets", {}).get("controls")}
    if not widgets:
        return ""
    worst = max(widgets, key=lambda s: widgets[s]["first_max_s"])
    control = widgets[worst].get("first_max_control")
    return (f"every redraw once compiled within {max(w['warm_max_s'] for w in widgets.values()):.2f} s, a first move "
            f"(which may compile) up to {widgets[worst]['first_max_s']:.1f} s ({worst[:3].rstrip('_')}"
            + (f"'s {control})" if control else ")"))


def gpu_sentence(data: dict) -> str:
    """One sentence: per card, the range of notebook times with an empty and a filled Triton cache."""
    parts = []
    for g in gpu_runs(data):
        nbs = list(g["notebooks"].values())
        notes = [g["date"]] + [f"{s[:3].rstrip('_')}: {e['status']}" for s, e in g["notebooks"].items()
                               if e.get("status", "ok") != "ok"]
        text = (f"on the {g['device']} {_span([e['cold_s'] for e in nbs if 'cold_s' in e])} "
                f"({_span([e['compile_s'] for e in nbs if 'compile_s' in e])})")
        if any("warm_s" in e for e in nbs):
            text += f" and {_span([e['warm_s'] for e in nbs if 'warm_s' in e])}"
        parts.append(text + f" ({'; '.join(notes)})")
    if not parts:
        return "No notebook has been timed on a GPU yet."
    return ("Per notebook on a GPU, with an empty Triton cache (of it compiling) and with a filled one: "
            + "; ".join(parts) + ".")


def cpu_sentence(data: dict) -> str:
    cpu = cpu_run(data)
    if not cpu:
        return ""
    nbs = list(cpu["notebooks"].values())
    return (f"On a {cpu.get('cores', '?')}-core CPU machine (Triton interpreter) each notebook takes "
            f"{_span([e['cpu_s'] for e in nbs if 'cpu_s' in e])} of CPU time ({cpu.get('date')}).")


def readme_times(data: dict) -> str:
    explorers = "; ".join(f"on the {card(g)} {widget_times(g)}" for g in gpu_runs(data) if widget_times(g))
    explorers = f" Explorers moved from the kernel: {explorers}." if explorers else ""
    return wrap(gpu_sentence(data) + explorers + " " + cpu_sentence(data) + " Per notebook and per card: the "
                "facilitator's guide "
                "([times](onboarding.md#times-per-notebook)), from `benchmarks/results/notebook_times.json`.")


def wrap(text: str, indent: str = "", first: str = "") -> str:
    """A paragraph (or a list item, with `indent`) wrapped as the guide and the README are, at 118 columns; a number
    stays on the line of its unit ("35.8 s")."""
    import textwrap

    text = re.sub(r"(\d) (s|min)\b", "\\1\0\\2", text)
    return textwrap.fill(text, width=118, initial_indent=first, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False).replace("\0", " ")


def notebook_timing(data: dict, stem: str) -> str:
    """The guide's timing paragraph of one notebook."""
    main, further = words(notebook_paths()[stem])
    cpu = cpu_run(data)
    text = (f"Main path {main:,} words of markdown (going further {further:,}). "
            f"A learner: {learner_time(data['reading'][stem])}.")
    if cpu and stem in cpu["notebooks"]:
        text += (f" On a {cpu.get('cores', '?')}-core CPU ({cpu['date']}): "
                 f"{cpu_cell(cpu['notebooks'][stem], ' of CPU time')}.")
    gpus = [g for g in gpu_runs(data) if stem in g["notebooks"]]
    if gpus:
        text += " On a GPU, cold / warm Triton cache: " + "; ".join(
            f"{card(g)} {gpu_cell(g['notebooks'][stem])}" for g in gpus) + "."
    return text


def blocks(data: dict) -> dict[Path, dict[str, str]]:
    """Every generated passage, by file and marker name."""
    guide = {"table": table(data) + "\n\n" + bullets(data), "gpu": wrap(gpu_sentence(data), "  ", "  ")}
    guide.update({f"nb-{stem[:3].rstrip('_')}": wrap(notebook_timing(data, stem)) for stem in TITLES})
    return {GUIDE: guide, README: {"notebooks": readme_times(data)}}


def marker(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- times:{re.escape(name)}:begin -->)(\n?)(.*?)(\n?[ \t]*)"
                      rf"(<!-- times:{re.escape(name)}:end -->)", re.S)


def current(text: str, name: str) -> str | None:
    """The passage between a pair of markers in `text` (None: no such markers)."""
    m = marker(name).search(text)
    return None if m is None else m.group(3)


def fill(text: str, name: str, body: str) -> str:
    """`text` with the passage between the markers `name` replaced by `body` (a block on its own lines stays so)."""
    pattern = marker(name)
    if not pattern.search(text):
        raise KeyError(f"no <!-- times:{name}:begin/end --> markers")
    def put(m: re.Match) -> str:  # markers on lines of their own stay so, indented as the first one
        if not (m.group(2) or m.group(4)):
            return m.group(1) + body + m.group(5)
        lead = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        return m.group(1) + "\n" + body + "\n" + (lead if not lead.strip() else "") + m.group(5)

    return pattern.sub(put, text, count=1)


def render(data: dict, write: bool = False) -> list[str]:
    """Make every generated passage; with `write`, put it into its file. Returns the files that changed."""
    changed = []
    for path, passages in blocks(data).items():
        text = path.read_text()
        new = text
        for name, body in passages.items():
            new = fill(new, name, body)
        if new != text:
            changed.append(str(path.relative_to(ROOT)))
            if write:
                path.write_text(new)
    return changed


# -------------------------------------------------------------------------------------- the notebook headers


def round_cpu(seconds: float) -> int:
    """CPU seconds as a header states them: whole seconds under 20 s, to 5 s under a minute, to 10 s from there."""
    step = 1 if seconds < 20 else 5 if seconds < 60 else 10
    return max(step, int(step * round(seconds / step)))


def expected_header_phrase(stem: str, data: dict | None = None) -> str:
    """What the notebook's first markdown cell says about a learner's time, from the file."""
    reading = (data or load())["reading"][stem]
    extra = reading.get("extra")
    more = f", {extra['minutes']} {extra['with']}" if extra else ""
    if reading["source"] == "cold reader":
        return f"Time: {minutes(reading)} minutes{more}."
    return f"Time: {minutes(reading)} minutes{more} (an estimate)."


def expected_cpu_phrase(stem: str, data: dict | None = None) -> str:
    """What a header says about the notebook's CPU time, where it says anything (06 does)."""
    cpu = cpu_run(data or load())
    return f"about {round_cpu(cpu['notebooks'][stem]['cpu_s'])} s of CPU time"

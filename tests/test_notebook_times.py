"""Notebook times come from one file, benchmarks/results/notebook_times.json (written by
`python -m dev.notebook_times --record`): the guide's and the README's time passages are made from it
(`--render --write`), every notebook's header states the file's time for it, and every run in it names its device,
versions and date. Nothing here runs a notebook."""
import json
import re
from pathlib import Path

import pytest

from dev import notebook_times_data as times

DATA = times.load()
BLOCKS = [(path, name, body) for path, passages in times.blocks(DATA).items() for name, body in passages.items()]
REGENERATE = "python -m dev.notebook_times --render --write"

# a time as prose states it: "40 s", "35-40 minutes", "about a minute and a half", "2 min 10 s", "half an hour"
NUMBER = r"\d+(?:[.,]\d+)?(?:\s*(?:-|–|to)\s*\d+(?:[.,]\d+)?)?"
TIME = re.compile(rf"(?i)(?<![\w.])(?:{NUMBER}\s*(?:minutes?|mins?|hours?|seconds?|s)\b"
                  r"|(?:an?|one|two|three|half an?)\s+(?:minutes?|hours?)\b(?: and a half)?)")
# the times the guide may state outside its generated passages: the agendas' plans, not a measured time
GUIDE_ALLOWED = ("(about 4 hours", "gives 03a an hour")


def _header(stem: str) -> str:
    cells = json.loads(times.notebook_paths()[stem].read_text())["cells"]
    return next(times._text(c) for c in cells if c["cell_type"] == "markdown")


def header_problems(stem: str, header: str, data: dict) -> list[str]:
    """What a notebook's first markdown cell says about time that the times file does not."""
    header = " ".join(header.split())  # a phrase may be wrapped over two lines
    expected = times.expected_header_phrase(stem, data)
    allowed = [expected, times.expected_cpu_phrase(stem, data)] if times.cpu_run(data) else [expected]
    spans = [(m.start(), m.end()) for phrase in allowed for m in re.finditer(re.escape(phrase), header)]
    problems = []
    if expected not in header:
        problems.append(f"states no {expected!r}")
    for m in TIME.finditer(header):
        if not any(a <= m.start() and m.end() <= b for a, b in spans):
            sentence = re.search(rf"[^.]*{re.escape(m.group(0))}[^.]*\.?", header).group(0).strip()
            problems.append(f"says {m.group(0)!r} in {sentence!r}")
    return problems


@pytest.mark.parametrize("path,name,body", BLOCKS, ids=[f"{p.name}:{n}" for p, n, _ in BLOCKS])
def test_generated_passage_is_what_the_file_makes(path, name, body):
    found = times.current(path.read_text(), name)
    assert found is not None, f"{path.name}: no <!-- times:{name}:begin/end --> markers"
    assert found == body, (f"{path.name}'s times:{name} passage differs from what notebook_times.json makes "
                           f"(run `{REGENERATE}`):\n--- found\n{found}\n--- made\n{body}")


def test_the_guide_states_no_time_outside_its_generated_passages():
    text = times.GUIDE.read_text()
    for _, name, _ in BLOCKS:
        text = times.marker(name).sub("", text)
    stray = [m.group(0) for m in TIME.finditer(text)
             if not any(a in " ".join(text[max(0, m.start() - 40):m.end() + 40].split()) for a in GUIDE_ALLOWED)]
    assert not stray, (f"docs/onboarding.md states times outside the passages made from notebook_times.json: {stray} "
                       "(put them in the file, or say them without a number)")


@pytest.mark.parametrize("stem", list(times.TITLES))
def test_notebook_header_states_the_files_time(stem):
    problems = header_problems(stem, _header(stem), DATA)
    assert not problems, (f"{stem}: the first markdown cell {'; '.join(problems)}. The times file says: "
                          f"{times.expected_header_phrase(stem, DATA)!r}"
                          + (f" (and, where it states a CPU time, {times.expected_cpu_phrase(stem, DATA)!r})"
                             if times.cpu_run(DATA) else ""))


def test_header_check_catches_a_wrong_time_and_accepts_the_right_one():
    stem = "06_nan_hunting"
    right = f"Intro. {times.expected_header_phrase(stem, DATA)} More."
    assert header_problems(stem, right, DATA) == []
    wrong = right.replace(times.expected_header_phrase(stem, DATA), "Budget: about 45 minutes.")
    assert any("45 minutes" in p for p in header_problems(stem, wrong, DATA))
    if times.cpu_run(DATA):
        cpu = times.expected_cpu_phrase(stem, DATA)
        assert header_problems(stem, f"{right} It runs in {cpu} on a 2-core machine.", DATA) == []
        assert header_problems(stem, f"{right} It runs in about a minute and a half.", DATA) == [
            "says 'a minute and a half' in 'It runs in about a minute and a half.'"]


def test_every_run_names_device_versions_and_date():
    assert DATA["runs"], "no run recorded"
    devices = [run["device"] for run in DATA["runs"]]
    assert len(devices) == len(set(devices)), f"one run per device: {devices}"
    for run in DATA["runs"]:
        missing = [k for k in times.RUN_KEYS if not run.get(k)]
        assert not missing, f"the {run.get('device', '?')} run names no {missing}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", run["date"]), run["date"]
        assert re.match(r"\d+\.\d+", run["torch"]) and re.match(r"\d+\.\d+", run["triton"]), run
        assert run["device"] == "cpu" or re.search(r"[A-Z]\d{2,}", run["device"]), f"no card named: {run['device']}"
        need = ("cpu_s", "wall_s") if run["device"] == "cpu" else ("cold_s",)
        for stem in times.TITLES:
            entry = run["notebooks"].get(stem)
            assert entry and all(isinstance(entry.get(k), (int, float)) for k in need), (run["device"], stem, entry)


def test_every_notebook_has_a_reading_time_with_its_source():
    assert set(DATA["reading"]) == set(times.TITLES) == {p.stem for p in _tracked()}
    for stem, reading in DATA["reading"].items():
        lo, hi = reading["minutes"]
        assert 0 < lo <= hi, stem
        assert reading["source"] in ("cold reader", "author's estimate"), stem
        assert reading["source"] != "cold reader" or reading.get("date"), f"{stem}: a cold reader without a date"


def _tracked():
    return list((times.ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def test_record_replaces_the_run_of_the_same_device():
    results = [[{"notebook": "00_start_here.ipynb", "status": "ok", "total_s": 12.0, "compiles": 3, "compile_s": 1.0,
                 "cells": []}],
               [{"notebook": "00_start_here.ipynb", "status": "ok", "total_s": 8.0, "compile_s": 0.1, "cells": []}]]
    meta = {"device": "NVIDIA H100 80GB HBM3", "python": "3.12", "torch": "2.11.0", "triton": "3.6.0",
            "date": "2026-11-28", "commit": "abc1234", "how": "notebook_times.py"}
    data = {"reading": {}, "runs": [{**meta, "date": "2026-11-01", "notebooks": {}},
                                    {"device": "cpu", "notebooks": {}}]}
    data = times.merge(data, times.run_from_results(results, meta))
    assert [r["device"] for r in data["runs"]] == ["cpu", "NVIDIA H100 80GB HBM3"]
    assert data["runs"][1]["date"] == "2026-11-28"
    assert data["runs"][1]["notebooks"]["00_start_here"]["cold_s"] == 12.0
    assert data["runs"][1]["notebooks"]["00_start_here"]["warm_s"] == 8.0
    assert times.card(data["runs"][1]) == "H100"


def test_fill_replaces_only_between_its_markers(tmp_path: Path):
    text = "a\n<!-- times:x:begin -->\nold\n<!-- times:x:end -->\nb <!-- times:y:begin -->old<!-- times:y:end --> c"
    text = times.fill(times.fill(text, "x", "new"), "y", "NEW")
    assert text == ("a\n<!-- times:x:begin -->\nnew\n<!-- times:x:end -->\n"
                    "b <!-- times:y:begin -->NEW<!-- times:y:end --> c")
    with pytest.raises(KeyError):
        times.fill(text, "z", "")

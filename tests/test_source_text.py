"""fla_lab's source text, file by file, against the rules of one table (`SCANS`): comments and docstrings say what
the code does, not what one run on one card measured (timings, card names, memory figures and log paths go to
benchmarks/results/*.json and docs/performance.md, which `python -m dev.performance_page` writes); a comment that
rests on a measurement points to a section that page has (docs/performance.md, '<title>'); figure text is 9 pt or
more. Strings the code prints or plots are data shown to learners, not comments: measurements and pointers are read
from comments (tokenize) and docstrings (ast), font sizes from the keywords of the calls (ast)."""
import ast
import functools
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = Path(ROOT) / "fla_lab"
PAGE = Path(ROOT) / "docs" / "performance.md"

NUMBER = r"\d+(?:\.\d+)?(?:e[-+]?\d+)?"
MEASUREMENTS = {
    "card name": re.compile(r"\b(?:[ABHL]\d{2,3}|GH200|GB200|B200|RTX ?\d{4})\b"),
    "time": re.compile(rf"(?<![\w.]){NUMBER}\s?(?:ms|µs|us|ns|s|sec|secs|seconds|milliseconds)\b"),
    "memory or bandwidth": re.compile(r"\b(?:[KMGT]iB|[KMGT]B/s)\b|(?<![\w.])" + NUMBER + r"\s?[KMGT]B\b"),
    "relative timing": re.compile(rf"(?<![\w.]){NUMBER}\s?(?:%|x)\s+(?:faster|slower|longer|shorter|as long)\b"),
    "log path": re.compile(r"logs_\d{6,}|(?<![\w.])(?!(?:tl|torch|math|np|numpy)\.log\b)[\w/-]+\.log\b(?!\s*\()"),
}
QUOTED = re.compile(r'"[^"\n]*"')  # a quoted example ("40 s") is what a checker matches, not a measurement
POINTER = re.compile(r"docs/performance\.md,\s+'([^']+)'")
SMALLEST = 9  # pt
SIZE_KEYWORDS = {"fontsize", "labelsize", "title_fontsize"}  # and `size=` in the calls below
FONT_CALLS = {"FontProperties", "text", "annotate", "set_title", "set_xlabel", "set_ylabel", "legend"}


def comments_and_docstrings(source: str):
    """(line, text) of every comment and docstring of a module's source."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                yield node.body[0].lineno, doc


def measurements(source: str) -> list[tuple[int, str, str]]:
    return [(line, what, m.group(0)) for line, text in comments_and_docstrings(source)
            for what, pattern in MEASUREMENTS.items()
            for m in pattern.finditer(QUOTED.sub('""', text.replace("\n", " ")))]


def pointers(source: str) -> list[tuple[int, str, str]]:
    return [(line, "pointer", name) for line, text in comments_and_docstrings(source)
            for name in POINTER.findall(" ".join(text.split()))]  # a title may wrap onto the next line


@functools.cache
def page_sections() -> frozenset[str]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.lstrip("#").strip() for line in lines if line.startswith("#"))


def missing_sections(source: str) -> list[tuple[int, str, str]]:
    return [(line, "no such section", name) for line, _, name in pointers(source) if name not in page_sections()]


def font_sizes(source: str) -> list[tuple[int, str, object]]:
    """(line, keyword, value) of each literal font size: `fontsize=7` and the like, `size=` in a font or text call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for kw in node.keywords:
            named = kw.arg in SIZE_KEYWORDS or (kw.arg == "size" and called in FONT_CALLS)
            if named and isinstance(kw.value, ast.Constant):
                found.append((node.lineno, kw.arg, kw.value.value))
    return found


def small_text(source: str) -> list[tuple[int, str, str]]:
    return [(line, "small text", f"{keyword}={size!r}") for line, keyword, size in font_sizes(source)
            if size in ("xx-small", "x-small", "small") or (isinstance(size, (int, float)) and size < SMALLEST)]


SCANS = {  # name: (what breaks the rule in a module's source, what the scan reads there, the rule)
    "measurements": (measurements, lambda source: list(comments_and_docstrings(source)),
                     "comments and docstrings say what the code does; measurements go to benchmarks/results/*.json "
                     "and docs/performance.md"),
    "pointers": (missing_sections, pointers, "a comment points to docs/performance.md by a title the page has"),
    "figure text": (small_text, font_sizes, f"figure text at {SMALLEST} pt or more, no 'small' sizes"),
}

# Planted lines, put before a module of the package that keeps every rule: the scan must report exactly these
# (line, kind) pairs, the planted ones and nothing of the module after them.
CLEAN_MODULE = PACKAGE / "ops" / "common" / "launch.py"
PLANTED = [
    ("measurements", '''"""Forward 2.29 -> 1.91 ms on an H200 (logs_20261127/ab.log), peak 1346 MiB."""
x = 1  # 1.2 ms on an H200
y = 2  # 7% faster, 3.5 TB/s, 29.7 KB, 2.3x as long
label = "upstream 0.6.0 (H200, 2.3 ms)"  # a label, not a comment: allowed
z = tl.log(x)  # tl.log(x) and torch.log: no log file; "40 s" quoted: an example''',
     {(1, "card name"), (1, "time"), (1, "log path"), (1, "memory or bandwidth"), (2, "card name"), (2, "time"),
      (3, "memory or bandwidth"), (3, "relative timing")}),
    ("measurements", "# 1.2 ms on an H200", {(1, "time"), (1, "card name")}),
    ("measurements", '"""peak 1346 MiB, see logs_20261127/x.log."""', {(1, "memory or bandwidth"), (1, "log path")}),
    ("pointers", "x = 1  # tiles: docs/performance.md, 'no such section'", {(1, "no such section")}),
    ("figure text", "ax.text(0, 0, 'x', fontsize=7)\nax.legend(fontsize='small')\nax.set_title('t', size=8.5)\n"
                    "ax.plot(x, size=3)  # not text", {(1, "small text"), (2, "small text"), (3, "small text")}),
]


@pytest.mark.parametrize("name", SCANS)
def test_the_package_keeps_the_rule(name):
    find, reads, rule = SCANS[name]
    sources = {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}
    assert any(reads(source) for source in sources.values()), f"{name}: the scan read nothing in fla_lab/"
    bad = [f"{path.relative_to(ROOT)}:{line}: {kind}: {text!r}"
           for path, source in sources.items() for line, kind, text in find(source)]
    assert not bad, f"{rule}:\n" + "\n".join(bad)


@pytest.mark.parametrize("name, planted, expected", PLANTED, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(PLANTED)])
def test_the_scan_finds_what_was_planted(name, planted, expected):
    found = SCANS[name][0](planted + "\n" + CLEAN_MODULE.read_text(encoding="utf-8"))
    assert {(line, kind) for line, kind, _ in found} == expected


def test_performance_page_is_up_to_date():
    result = subprocess.run([sys.executable, "-m", "dev.performance_page", "--check"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr

"""fla_lab's comments and docstrings say what the code does, not what one run on one card measured.

Timings, card names, memory figures and log paths go stale with the next change and say nothing about the code:
they live in docs/performance.md, generated from benchmarks/results/*.json (device, versions and date beside every
number), and a comment that rests on one names the choice and points there. Strings the code prints or plots (a
figure's label) are data shown to learners, not comments: only comments (tokenize) and docstrings (ast) are read.
"""
import ast
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
FORBIDDEN = {
    "card name": re.compile(r"\b(?:[ABHL]\d{2,3}|GH200|GB200|B200|RTX ?\d{4})\b"),
    "time": re.compile(rf"(?<![\w.]){NUMBER}\s?(?:ms|µs|us|ns|s|sec|secs|seconds|milliseconds)\b"),
    "memory or bandwidth": re.compile(r"\b(?:[KMGT]iB|[KMGT]B/s)\b|(?<![\w.])" + NUMBER + r"\s?[KMGT]B\b"),
    "relative timing": re.compile(rf"(?<![\w.]){NUMBER}\s?(?:%|x)\s+(?:faster|slower|longer|shorter|as long)\b"),
    "log path": re.compile(r"logs_\d{6,}|(?<![\w.])(?!(?:tl|torch|math|np|numpy)\.log\b)[\w/-]+\.log\b(?!\s*\()"),
}
QUOTED = re.compile(r'"[^"\n]*"')  # a quoted example ("40 s") is what a checker matches, not a measurement
POINTER = re.compile(r"docs/performance\.md,\s+'([^']+)'")


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


def findings(source: str) -> list[tuple[int, str, str]]:
    found = []
    for line, text in comments_and_docstrings(source):
        text = QUOTED.sub('""', text.replace("\n", " "))
        for what, pattern in FORBIDDEN.items():
            found += [(line, what, m.group(0)) for m in pattern.finditer(text)]
    return found


def package_files():
    return sorted(PACKAGE.rglob("*.py"))


def test_the_patterns_flag_measurements_and_spare_code():
    source = '''"""Forward 2.29 -> 1.91 ms on an H200 (logs_20261127/ab.log), peak 1346 MiB."""
x = 1  # 1.2 ms on an H200
y = 2  # 7% faster, 3.5 TB/s, 29.7 KB, 2.3x as long
label = "upstream 0.6.0 (H200, 2.3 ms)"  # a label, not a comment: allowed
z = tl.log(x)  # tl.log(x) and torch.log: no log file; "40 s" quoted: an example
'''
    kinds = {(line, what) for line, what, _ in findings(source)}
    assert kinds == {(1, "card name"), (1, "time"), (1, "log path"), (1, "memory or bandwidth"), (2, "card name"),
                     (2, "time"), (3, "memory or bandwidth"), (3, "relative timing")}, sorted(kinds)


def test_no_measurement_in_comments_or_docstrings():
    bad = [f"{path.relative_to(ROOT)}:{line}: {what}: {text!r}"
           for path in package_files() for line, what, text in findings(path.read_text(encoding="utf-8"))]
    assert not bad, ("comments and docstrings say what the code does; measurements go to benchmarks/results/*.json "
                     "and docs/performance.md:\n" + "\n".join(bad))


def test_performance_page_is_up_to_date():
    result = subprocess.run([sys.executable, "-m", "dev.performance_page", "--check"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_pointer_names_a_section_of_the_page():
    headings = {line.lstrip("#").strip() for line in PAGE.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")}
    pointers = {(path.relative_to(ROOT), name) for path in package_files()
                for _, text in comments_and_docstrings(path.read_text(encoding="utf-8"))
                for name in POINTER.findall(" ".join(text.split()))}
    assert pointers, "no comment points to docs/performance.md"
    missing = sorted(f"{path}: '{name}'" for path, name in pointers if name not in headings)
    assert not missing, "pointers to sections docs/performance.md does not have:\n" + "\n".join(missing)


@pytest.mark.parametrize("stale", ["# 1.2 ms on an H200", '"""peak 1346 MiB, see logs_20261127/x.log."""'])
def test_a_measurement_put_back_is_found(stale):
    source = (PACKAGE / "ops" / "common" / "launch.py").read_text(encoding="utf-8")
    assert not findings(source)
    assert findings(stale + "\n" + source)

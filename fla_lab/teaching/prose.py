"""Check a notebook's prose against its own outputs: every number the markdown quotes about a result must be one the
notebook prints, so a kernel change that moves an output cannot leave a sentence behind.

    python -m fla_lab prose notebooks/*.ipynb        # one line per number the prose states and nothing backs

What the markdown of a notebook may state, and what backs it:
- a **line number** ("line 44", "lines 59-64"): never a literal; the cell that prints the lines says which
  (`bugs.locate`, the kernel's source), so they move together;
- a **fraction or range** ("80/2560", "64..79", "rows 44-63"): the same text in an output;
- a **measured-looking number** (a decimal, an exponent, a percentage, a ratio such as 1.17x, an integer >= 10): an
  output number that rounds to it at the prose's own precision, or the same number in a code cell (a parameter the
  learner sees set: `T = 100`, `chunk_size=64`);
- a **time** ("about 30 minutes", "40 s"): left to the times file's own test (tests/test_notebook_times.py), which
  holds each notebook's header to the measured times;
- text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` markers: generated from a result file and checked
  by its generator's test;
- anything else a lesson states on purpose (the 64 rows of a chunk, a number from a GPU run that a GPU test
  re-measures, an identity such as e^-0.4 = 0.67): listed in the cell as an HTML comment, invisible when rendered,
  ``<!-- constants: 0.67 (e^-0.4), 2080 (scores of a 64-row chunk) -->``, each with why.

Outputs are stdout, text/plain and text/markdown displays (a sentence rendered by the cell that computes it is an
output). Not numbers: digits inside words and identifiers (fp32, 03a, rwkv7), issue and commit references (#150),
versions (0.6.0), links, LaTeX commands, list enumerators and headings' section numbers.
"""
from __future__ import annotations

import functools
import json
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

CONSTANTS = re.compile(r"<!--\s*constants:(.*?)-->", re.S)
_NUM = r"\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?(?:[eE][-+−]?\d+)?"
# a number not glued to a word, an identifier, a path or an issue reference; an optional unit after it
NUMBER = re.compile(rf"(?<![\w.#/@`'\\^_-])(?:(?<=\s)-|(?<=^)-|(?<=\()-|−)?(?P<num>{_NUM})(?P<unit>%|x\b|×)?"
                    r"(?![\w.]\d|[A-Za-z_])")
FRACTION = re.compile(rf"(?<![\w./])(?P<text>(?:{_NUM})/(?:{_NUM}))(?![\w/])")  # 80/2560; "16 / 32" is a list
RANGE = re.compile(rf"(?<![\w.])(?P<text>(?:{_NUM})\s*(?:\.\.|–|-(?=\d))\s*(?:{_NUM}))(?![\w.]*\d)")
LINE_REF = re.compile(r"\blines?\s+\d+", re.I)
TIME = re.compile(rf"(?:{_NUM})(?:\s*(?:-|–|to)\s*(?:{_NUM}))?\s*(?:min(?:ute)?s?|s|seconds?|hours?|h)\b")
SCIENTIFIC = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\\cdot|\\times|×|·)\s*10\^\{?([-−]?\d+)\}?")
POWER_OF_TEN = re.compile(r"(?<![\d.])10\^\{?([-−]?\d+)\}?")
HIDDEN = [
    re.compile(r"<!--\s*([\w:-]+):begin\s*-->.*?<!--\s*\1:end\s*-->", re.S),  # generated, checked by its generator
    re.compile(r"<!--.*?-->", re.S),                       # comments (the constants list among them)
    re.compile(r"\bTime: [^.]*\."),                        # a header's time: tests/test_notebook_times.py
    re.compile(r"```.*?```", re.S),                        # fenced code: commands, not claims
    re.compile(r"\]\([^)]*\)"),                            # link targets
    re.compile(r"https?://\S+"),
    re.compile(r"\\[A-Za-z]+"),                            # LaTeX commands (\le, \mathbb)
    re.compile(r"\b\d+(?:\.\d+){2,}\b"),                   # versions
    re.compile(r"(?i)\b(?:torch|triton|python|cuda|nbval|fla|flash-linear-attention)\s+\d+(?:\.\d+)*"),
    re.compile(r"(?m)^\s{0,3}(?:#+\s*)?\d+[.)]\s"),       # enumerators, numbered headings
    re.compile(r"\b(?:19|20)\d\d(?:-\d\d){0,2}\b"),          # years and dates
    re.compile(r"\b[0-9a-f]{7,40}\b"),                     # commit hashes
    re.compile(r"\^\{?[-−]?[\d.]+\}?"),                    # other exponents (e^{-0.4}: its base is the claim)
    re.compile(r"(?<![\w.])0\d[ab]?(?:\s*[–-]\s*0\d[ab]?)?(?![\w.])"),  # notebooks (03a, 01–06)
]


@functools.cache
def workbook_facts() -> tuple[float, ...]:
    """Numbers any notebook may state because the package or the floating-point formats define them, computed here
    rather than listed: the tolerances of `check.tolerance`, each dtype's overflow exponent log(max), its smallest
    subnormal and that one's log, bit counts, RWKV-7's decay bound e^-1/2, the sweeps' U(0.05, 1) and the chunk and
    sub-chunk sizes."""
    import torch

    from fla_lab.spec import check
    from fla_lab.ops.common import chunk

    facts = [0.05, 0.5, math.exp(-0.5), chunk.BC, 64]  # 64: the chunked ops' default chunk size
    for tol in check.TOLERANCES.values():
        facts += [tol.fwd, tol.grad]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        info = torch.finfo(dtype)
        tiny = info.smallest_normal * info.eps
        facts += [info.max, math.log(info.max), tiny, -math.log(tiny), info.bits, 1 - math.log2(info.eps)]
    return tuple(facts)


@dataclass(frozen=True)
class Finding:
    notebook: str
    cell: int
    text: str
    why: str
    context: str

    def __str__(self) -> str:
        where = "line" if self.notebook.endswith(")") else "cell"  # the guide's findings carry a line
        return f"{self.notebook} {where} {self.cell}: {self.text!r} {self.why} | ...{self.context}..."


def _dots(text: str) -> str:
    """Ranges written any way (64..79, 64–79, 64-79) in one form."""
    return re.sub(r"(?<=\d)(?:\.\.|–|-)(?=\d)", "..", text)


def _value(literal: str) -> float:
    return float(literal.replace(",", "").replace("−", "-"))


def _significant(literal: str) -> int:
    mantissa = re.split(r"[eE]", literal.replace(",", ""))[0].lstrip("0.").replace(".", "")
    return max(len(mantissa.rstrip("0")) if "." not in literal else len(mantissa), 1)


def _rounds_to(value: float, literal: str) -> bool:
    want, digits = abs(_value(literal)), _significant(literal)
    got = abs(value)
    if want == 0:
        return got == 0
    if got == 0 or not math.isfinite(got):
        return False
    if "." not in literal and "e" not in literal.lower():  # an integer is exact
        return math.isclose(got, want, rel_tol=1e-12)
    scale = 10 ** (math.floor(math.log10(got)) - digits + 1)
    return any(math.isclose(round(got / scale + eps) * scale, want, rel_tol=1e-9) for eps in (0.0, 1e-9, -1e-9))


def output_text(cell) -> str:
    """What a code cell printed or displayed, as text."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append("".join(out.get("text", "")))
        for mime in ("text/markdown", "text/plain"):
            data = out.get("data", {}).get(mime)
            if data is not None:
                parts.append("".join(data))
                break
    return "\n".join(parts)


def _visible(markdown: str) -> str:
    markdown = POWER_OF_TEN.sub(r"1e\1", SCIENTIFIC.sub(r"\1e\2", markdown))  # 3.4 \cdot 10^{38} -> 3.4e38
    for pattern in HIDDEN:
        markdown = pattern.sub(" ", markdown)
    return markdown


def _constants(markdown: str) -> set[str]:
    found = set()
    for block in CONSTANTS.findall(markdown):
        found |= {m.group("num").replace(",", "") for m in NUMBER.finditer(block)}
        found |= {re.sub(r"\s", "", m.group("text")) for m in FRACTION.finditer(block)}
        found |= {re.sub(r"\s", "", m.group("text")) for m in RANGE.finditer(block)}
    return found


def _numbers(text: str) -> list[float]:
    """Every number printed or set in code, wherever it stands (80/2560, t=64, 1.6e-03)."""
    return [_value(m) for m in re.findall(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text)]


def _context(text: str, start: int, end: int) -> str:
    return " ".join(text[max(0, start - 50):end + 30].split())


@dataclass(frozen=True)
class Backing:
    """What one notebook shows: its outputs' text and numbers, and the numbers of its code cells."""
    compact: str
    outputs: list[float]
    code: list[float]

    @classmethod
    def of(cls, cells: list[dict]) -> "Backing":
        outputs = "\n".join(output_text(c) for c in cells if c["cell_type"] == "code")
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        return cls(_dots(re.sub(r"\s", "", outputs)), _numbers(outputs), _numbers(code) + list(workbook_facts()))

    def backs(self, literal: str, unit: str | None) -> bool:
        percent = [_value(literal) / 100] if unit == "%" else []
        return any(_rounds_to(v, literal) for v in self.outputs + self.code) or any(
            math.isclose(abs(v), c, rel_tol=1e-9) for v in self.outputs for c in percent)


def check_markdown(source: str, backing: Backing, where: str, index: int) -> list[Finding]:
    """The numbers of one markdown text that `backing` does not show (see the module's docstring)."""
    constants, text = _constants(source), _visible(source)
    findings = [Finding(where, index, m.group(0), "is a literal line number: print it from the source "
                        "(bugs.locate)", _context(text, m.start(), m.end())) for m in LINE_REF.finditer(text)]
    text = TIME.sub(" ", LINE_REF.sub(" ", text))
    for pattern in (FRACTION, RANGE):
        for m in pattern.finditer(text):
            compact = re.sub(r"\s", "", m.group("text"))
            if _dots(compact) not in backing.compact and compact not in constants:
                findings.append(Finding(where, index, m.group("text"), "is in no output",
                                        _context(text, m.start(), m.end())))
        text = pattern.sub(" ", text)
    for m in NUMBER.finditer(text):
        literal, unit = m.group("num"), m.group("unit")
        plain = literal.replace(",", "")
        measured = unit or "." in plain or "e" in plain.lower() or _value(plain) >= 10
        if measured and plain not in constants and not backing.backs(literal, unit):
            findings.append(Finding(where, index, literal + (unit or ""), "is in no output or code cell",
                                    _context(text, m.start(), m.end())))
    return findings


def _cells(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text())["cells"]


def check_notebook(path: str | Path) -> list[Finding]:
    """The numbers in `path`'s markdown that neither an output, a code cell nor the cell's constants list back."""
    cells = _cells(Path(path))
    backing = Backing.of(cells)
    return [finding for index, cell in enumerate(cells) if cell["cell_type"] == "markdown"
            for finding in check_markdown("".join(cell["source"]), backing, Path(path).stem, index)]


ANSWER_KEY = re.compile(r"(?m)^### (\d\d[ab]?) ·")


def check_guide(guide: str | Path, notebooks: str | Path) -> list[Finding]:
    """The facilitator's answer keys (the guide's `### NN · ...` sections) against the outputs of the notebook each
    is about: an answer key that quotes a result must quote what that notebook prints. `cell` is the guide's line."""
    text = Path(guide).read_text()
    heads = list(ANSWER_KEY.finditer(text))
    findings = []
    for head, following in zip(heads, heads[1:] + [None]):
        path = next(Path(notebooks).glob(f"{head.group(1)}_*.ipynb"))
        section = text[head.start():following.start() if following else len(text)]
        first_line = text.count("\n", 0, head.start()) + 1
        for f in check_markdown(section, Backing.of(_cells(path)), f"{Path(guide).name} ({head.group(1)})", 0):
            at = max(section.find(f.text), 0)  # the line of the number's first occurrence in the section
            findings.append(replace(f, cell=first_line + section.count("\n", 0, at)))
    return findings


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv else sorted(str(p) for p in Path("notebooks").glob("[0-9]*.ipynb"))
    checks = [(Path(p).stem, functools.partial(check_notebook, p)) for p in paths]
    if not argv and Path("docs/onboarding.md").exists():
        checks.append(("docs/onboarding.md (answer keys)", functools.partial(check_guide, "docs/onboarding.md",
                                                                              "notebooks")))
    total = 0
    for name, check in checks:
        found = check()
        total += len(found)
        for finding in found:
            print(finding)
        print(f"{name}: {len(found)} number(s) stated that no output backs")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Markers: comments that name a line of the kernels or layers, so that the registries find code by id, not by a copy.

A marker is the comment `# <kind>: <id>`, with `kind` one of KINDS and `id` made of `a-z`, `0-9` and `_`:

    safeguard  a numerical safeguard of `fla_lab.spec.safeguards` (its id)
    bug        the historical line that a `bug=` switch turns on (the switch's name, `fla_lab.ops.common.switches`)
    mutation   the line a slip of the mutation check edits (`dev/mutation_check.py`, its id)

At the end of a line of code a marker marks that line; several markers may end one line, one after another. Where
the line has no room for it (the files keep to 120 columns), the marker stands on a comment line of its own above
the line and marks the next line of code (blank lines and comment lines in between are skipped). Each (kind, id)
is marked exactly once in `fla_lab/ops` and `fla_lab/layers` (tests/test_markers.py). A registry holds the id and,
where it edits the line, the replacement for the marked line's code (a naive form); the shipped line is read from
the source through its marker, so editing that line needs no second edit anywhere.

`find(kind, id)` gives the Marker (file and line), `shipped(marker)` the marked line as it reads without markers,
`replace(text, kind, id, code)` a file's text with the marked line's code swapped, and `strip(text)` a source text
without its markers: what every printer of source to a learner shows (`source_of(obj)`: inspect.getsource, stripped).
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

KINDS = ("safeguard", "bug", "mutation")
PACKAGE = Path(__file__).resolve().parents[1]  # the fla_lab folder
SCANNED = ("ops", "layers")
_ONE = r"#\s*(safeguard|bug|mutation):\s*([a-z0-9_]+)"
ONE = re.compile(_ONE)
TRAILING = re.compile(rf"(?:\s*{_ONE})+\s*$")  # the markers that end a line
_KIND = re.compile(r"#\s*(?:safeguard|bug|mutation):")  # a cheap test first: most lines hold no marker


@dataclass(frozen=True)
class Marker:
    kind: str
    id: str
    path: str  # relative to the package's parent folder: "fla_lab/ops/common/chunk.py"
    line: int  # the marked line (1-based)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def markers_on(line: str) -> list[tuple[str, str]]:
    """The (kind, id) of the markers that end `line`, left to right."""
    found = TRAILING.search(line) if _KIND.search(line) else None
    return ONE.findall(found.group(0)) if found else []


def strip_line(line: str) -> str:
    """`line` without the markers that end it (and the spaces before them)."""
    return TRAILING.sub("", line) if _KIND.search(line) else line


def _is_code(line: str) -> bool:
    text = line.strip()
    return bool(text) and not text.startswith("#")


def marked_lines(text: str) -> list[tuple[str, str, int]]:
    """(kind, id, marked line) of every marker in a file's `text`, in file order."""
    found, waiting = [], []
    for number, line in enumerate(text.splitlines(), 1):
        here = markers_on(line)
        if _is_code(strip_line(line)):
            found += [(kind, id, number) for kind, id in waiting + here]
            waiting = []
        else:  # a marker on a line of its own marks the next line of code
            waiting += here
    if waiting:
        raise ValueError(f"markers {waiting} mark no line: no line of code follows them")
    return found


def locate(text: str, kind: str, id: str, path: str = "the text") -> int:
    """The line (1-based) that the marker (kind, id) marks in a file's `text`: it must be marked exactly once."""
    lines = [number for k, i, number in marked_lines(text) if (k, i) == (kind, id)]
    if len(lines) != 1:
        raise LookupError(f"`# {kind}: {id}` marks {len(lines)} lines of {path} (must be exactly one)")
    return lines[0]


def files(package: Path = PACKAGE) -> list[Path]:
    """The files whose markers count: every module under `fla_lab/ops` and `fla_lab/layers`."""
    return sorted(p for folder in SCANNED for p in (package / folder).rglob("*.py"))


def scan(package: Path = PACKAGE) -> list[Marker]:
    """Every marker in the scanned files of `package` (default: this fla_lab), in file order."""
    return [Marker(kind, id, str(path.relative_to(package.parent)), number)
            for path in files(package) for kind, id, number in _file_marks(path, *_stamp(path))]


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=256)
def _file_marks(path: Path, mtime_ns: int, size: int) -> tuple:
    """`marked_lines` of one file, read again whenever it changes (its modification time or size)."""
    return tuple(marked_lines(path.read_text()))


def index(kind: str, package: Path = PACKAGE) -> dict[str, Marker]:
    """id -> Marker of every marker of `kind` in `package`; ValueError when an id is marked more than once."""
    if kind not in KINDS:
        raise ValueError(f"no marker kind {kind!r}; the kinds are {KINDS}")
    found: dict[str, Marker] = {}
    for m in scan(package):
        if m.kind == kind and found.setdefault(m.id, m) != m:
            raise ValueError(f"`# {kind}: {m.id}` is marked twice: {found[m.id].where} and {m.where}")
    return found


def find(kind: str, id: str, package: Path = PACKAGE) -> Marker:
    """The one marker (kind, id) of `package`; LookupError when it is missing (ValueError: marked twice)."""
    found = index(kind, package)
    if id not in found:
        raise LookupError(f"no line of {package.name}/{{{','.join(SCANNED)}}} is marked `# {kind}: {id}`")
    return found[id]


def source(marker: Marker, package: Path = PACKAGE) -> str:
    """The text of the file that holds `marker`."""
    return (package.parent / marker.path).read_text()


def shipped(marker: Marker, package: Path = PACKAGE) -> str:
    """The marked line as it reads without its markers, indentation removed."""
    return strip_line(source(marker, package).splitlines()[marker.line - 1]).strip()


def replace(text: str, kind: str, id: str, code: str, path: str = "the text") -> str:
    """A file's `text` with the code of the line that (kind, id) marks replaced by `code` (its indentation kept,
    its comments dropped)."""
    lines = text.splitlines(keepends=True)
    number = locate(text, kind, id, path)
    old = lines[number - 1]
    indent = old[:len(old) - len(old.lstrip())]
    lines[number - 1] = indent + code + ("\n" if old.endswith("\n") else "")
    return "".join(lines)


def enclosing_function(text: str, line: int) -> str:
    """The innermost function whose body spans `line` (1-based) of a file's `text`."""
    best = None
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    return best.name if best else "<module>"


def visible_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line without its markers) of every line of `text` but those that hold markers only."""
    return [(number, strip_line(line)) for number, line in enumerate(text.splitlines(), 1)
            if not (markers_on(line) and not strip_line(line).strip())]


def strip(text: str) -> str:
    """Source text without its markers: a marker's own line goes, a marker that ends a line is cut off."""
    kept = "\n".join(line for _, line in visible_lines(text))
    return kept + "\n" if text.endswith("\n") else kept


def source_of(obj) -> str:
    """`inspect.getsource` of a function, class or module (a Triton kernel's Python function), without markers."""
    return strip(inspect.getsource(getattr(obj, "fn", obj)))

"""The README and the pages under docs/ against the tree and the files they describe (their measured numbers:
tests/test_readme_claims.py).

Three tables drive it:
- MAPS: the README's repository map and docs/developers.md's layout name every folder, package and module they are
  meant to cover, and nothing that does not exist;
- README_FACTS: what the README's first page states that is decided elsewhere (CI's command, the agenda and its
  times, the guide's half-day agenda) and its length;
- PAGES: in each page, every relative link leads to a file (and a heading) that exists, and every repository path it
  names in code exists.
"""
import fnmatch
import re
from pathlib import Path

import pytest

from conftest import ROOT
from dev import notebook_times_data as times

ROOT = Path(ROOT)
README = ROOT / "README.md"
DEVELOPERS = ROOT / "docs" / "developers.md"
GUIDE = ROOT / "docs" / "onboarding.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FIRST_PAGE_LINES = 150


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under `heading` (a line of its own) up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    start = text.index("\n" + heading + "\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(r"^#{1,%d} " % len(level), text[start:], re.M)]
    return text[start:start + ends[0]] if ends else text[start:]


def fenced(text: str) -> str:
    """The first fenced code block of `text`."""
    return re.search(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S).group(1)


# --- MAPS: a map names what the tree holds ----------------------------------------------------------------------

def named_paths(block: str) -> set[str]:
    """The paths a map names: the first word of each line that does not continue the line before (indented)."""
    return {line.split()[0] for line in block.splitlines() if line.strip() and not line[0].isspace()}


def ignored_folders() -> list[str]:
    """.gitignore's folder patterns (`learner/`, `artifacts/`, ...)."""
    lines = read(ROOT / ".gitignore").splitlines()
    return [line.strip() for line in lines if line.strip().endswith("/") and not line.startswith("#")]


def is_ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name + "/", pattern) for pattern in ignored_folders())


def top_level_folders() -> set[str]:
    """The checkout's folders that are neither hidden nor ignored by git."""
    return {p.name + "/" for p in ROOT.iterdir()
            if p.is_dir() and not p.name.startswith(".") and not is_ignored(p.name)}


def packages(top: str = "fla_lab", depth: int | None = None) -> set[str]:
    """The packages under `top` (folders with an __init__.py), as `path/`; `depth` 1: only its direct children."""
    found = (p.parent for p in (ROOT / top).rglob("__init__.py") if p.parent != ROOT / top)
    return {p.relative_to(ROOT).as_posix() + "/" for p in found
            if depth is None or len(p.relative_to(ROOT / top).parts) <= depth}


def modules(top: str = "fla_lab") -> set[str]:
    """Every module under `top` but the packages' own __init__.py (each package's line stands for it)."""
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / top).rglob("*.py") if p.name != "__init__.py"}


def exists_or_generated(path: str) -> bool:
    return (ROOT / path).exists() or (path.endswith("/") and is_ignored(path.rstrip("/")))


MAPS = {
    "README's repository map": (README, "## Repository map",
                                lambda: packages(depth=1) | top_level_folders()),
    "developers.md's layout": (DEVELOPERS, "## Layout", lambda: packages() | modules()),
}


def map_problems(text: str, heading: str, wanted: set[str]) -> list[str]:
    """What the map under `heading` misses of `wanted` (a folder counts as named when a path inside it is), and what
    it names that the tree does not hold."""
    named = named_paths(fenced(section(text, heading)))
    covered = named | {parent.as_posix() + "/" for path in named for parent in Path(path).parents if parent.parts}
    return ([f"missing from the map: {p}" for p in sorted(wanted - covered)]
            + [f"named but not in the tree: {p}" for p in sorted(p for p in named if not exists_or_generated(p))])


@pytest.mark.parametrize("name", MAPS)
def test_map_names_what_the_tree_holds(name):
    page, heading, wanted = MAPS[name]
    problems = map_problems(read(page), heading, wanted())
    assert not problems, f"{name} ({page.relative_to(ROOT)}, '{heading}'):\n" + "\n".join(problems)


def test_a_map_check_finds_a_missing_and_a_stale_entry():
    page, heading, wanted = MAPS["README's repository map"]
    text = read(page).replace("\nfla_lab/spec/ ", "\nfla_lab/specs/ ", 1)
    assert map_problems(text, heading, wanted()) == ["missing from the map: fla_lab/spec/",
                                                     "named but not in the tree: fla_lab/specs/"]


# --- README_FACTS: the first page states what is decided elsewhere ---------------------------------------------

def learner_part() -> str:
    return read(README).split("\n# For facilitators and maintainers\n")[0]


def ci_command() -> list[str]:
    """CI's command (.ci/run's last line) among the commands of the README's learner part."""
    command = read(ROOT / ".ci" / "run").strip().splitlines()[-1]
    blocks = re.findall(r"^```bash\n(.*?)^```", learner_part(), re.M | re.S)
    commands = {line.split("#")[0].strip() for block in blocks for line in block.splitlines()}
    return [] if command in commands else [f"the README's learner part never states CI's command {command!r}"]


def agenda() -> list[str]:
    """The agenda lists every notebook in order, each with a learner's time from the times file."""
    data = times.load()
    rows = re.findall(r"^\| `(\d\d[ab]?_\w+)` \|(.*)$", section(read(README), "## The agenda"), re.M)
    problems = [] if [stem for stem, _ in rows] == sorted(data["reading"]) else [
        f"the agenda lists {[stem for stem, _ in rows]}, the notebooks are {sorted(data['reading'])}"]
    return problems + [f"{stem}: no '{times.learner_time(data['reading'][stem])}'" for stem, row in rows
                       if f"| {times.learner_time(data['reading'][stem])} |" not in row]


def half_day() -> list[str]:
    """The README's half-day agenda is the guide's (the notebooks of its Half-day table, in order)."""
    table = read(GUIDE).split("**Half-day")[1].split("\n\n**")[0]
    guide = re.findall(r"^\| \d:\d\d \| (\d\d[ab]?) ", table, re.M)
    said = re.search(r"a half-day\s+of ([\d\w, ]+?) and (\d\d[ab]?);", read(README))
    readme = [*said.group(1).split(", "), said.group(2)] if said else []
    return [] if readme == guide else [f"the README's half-day is {readme}, the guide's {guide}"]


def length() -> list[str]:
    lines = read(README).count("\n")
    return [] if lines <= FIRST_PAGE_LINES else [f"README.md has {lines} lines (at most {FIRST_PAGE_LINES})"]


README_FACTS = {"CI's test command": ci_command, "the agenda and its times": agenda,
                "the half-day agenda": half_day, "the first page's length": length}


@pytest.mark.parametrize("fact", README_FACTS)
def test_readme_states(fact):
    problems = README_FACTS[fact]()
    assert not problems, "\n".join(problems)


# --- PAGES: links and paths lead somewhere ----------------------------------------------------------------------

GENERATED = re.compile(r"<!-- ([\w:-]+):begin -->.*?<!-- \1:end -->", re.S)  # checked by their generators
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:fla_lab|benchmarks|tests|docs|dev|notebooks|figures|\.ci)/[^\s<>*'\"():;,]*)")
MODULE = re.compile(r"python -m ((?:benchmarks|dev)\.\w+)")  # a repository tool run as a module


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in read(path).splitlines() if re.match(r"#{1,6} ", line)}


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            problems.append(f"link to a missing file: {target}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"link to a missing heading: {target}")
    return problems


def path_problems(text: str) -> list[str]:
    spans = CODE.findall(text)
    named = {path for span in spans for path in REPO_PATH.findall(span)}
    named |= {module.replace(".", "/") + ".py" for span in spans for module in MODULE.findall(span)}
    return [f"names a path that does not exist: {p}" for p in sorted(named) if not (ROOT / p.rstrip(".")).exists()]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_and_paths_lead_somewhere(page):
    text = GENERATED.sub(" ", read(page))
    problems = link_problems(page, text) + path_problems(text)
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_a_broken_link_and_a_stale_path_are_found():
    text = ("[x](developers.md#no-such-heading), [y](missing.md), `benchmarks/no_such_script.py --flag`, "
            "`python -m dev.no_such_tool`")
    assert link_problems(DEVELOPERS.parent / "gpu-results.md", text) == [
        "link to a missing heading: developers.md#no-such-heading", "link to a missing file: missing.md"]
    assert path_problems(text) == ["names a path that does not exist: benchmarks/no_such_script.py",
                                   "names a path that does not exist: dev/no_such_tool.py"]


"""`pip install -e .[test]` gives a user what the tests need: the `test` extra lists every third-party package
that tests/*.py imports, beside the package's own dependencies."""
import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("benchmarks", "dev")  # the repository's tool packages: python -m benchmarks.<name>, python -m dev.<name>
OURS = {"fla_lab", "conftest", *TOOLS}


def requirement_names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings ("pytest-xdist>=3.8" -> "pytest_xdist"), normalised."""
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("-", "_") for r in requirements}


def imported_top_level(path: Path) -> set[str]:
    """Top-level names of every absolute import in a file, nested ones (inside tests) included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_test_extra_lists_every_third_party_package_the_tests_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = requirement_names(project["dependencies"]) | requirement_names(project["optional-dependencies"]["test"])
    imported = set().union(*(imported_top_level(p) for p in (ROOT / "tests").glob("*.py")))
    third_party = imported - set(sys.stdlib_module_names) - OURS
    assert {"pytest", "hypothesis", "nbval", "torch"} <= third_party  # the parse finds imports at all
    undeclared = {n for n in third_party if n.lower() not in declared} - set(OPTIONAL)  # IPython is `ipython`
    assert not undeclared, f"imported by tests/ but in no dependency list: {undeclared}"
    assert {"pytest", "pytest_xdist", "hypothesis", "nbval"} <= requirement_names(project["optional-dependencies"]["test"])


# Imports that `pip install -e .[test]` leaves out on purpose: each is guarded where it is used.
OPTIONAL = {
    "fla": "flash-linear-attention, only beside upstream on a GPU (benchmarks, the FLA audit's CUDA tests: skipped "
           "without it)",
    "psutil": "a kernel's CPU time in dev/notebook_times.py (the GPU notebook phase runs it), read from /proc "
              "without it",
}


def tool_modules(path: Path) -> set[Path]:
    """The files of the benchmarks/ and dev/ modules that `path` imports (`from benchmarks import scaling`,
    `from dev.mutation_check import export_head`, `import benchmarks.tune`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in TOOLS:
            names |= {f"{node.module}.{a.name}" for a in node.names} if node.module in TOOLS else {node.module}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.split(".")[0] in TOOLS}
    return {p for p in (ROOT.joinpath(*name.split(".")).with_suffix(".py") for name in names) if p.exists()}


def scripts_the_tests_load() -> set[Path]:
    """benchmarks/ and dev/ modules that tests import or run (`"-m", "benchmarks.scaling"`), with the tool modules
    those import in turn."""
    tests = list((ROOT / "tests").glob("*.py"))
    run = re.findall(r'"-m", "((?:benchmarks|dev)\.\w+)"', "\n".join(p.read_text() for p in tests))
    todo = [ROOT.joinpath(*name.split(".")).with_suffix(".py") for name in run]
    todo += set().union(*(tool_modules(p) for p in tests))
    found = set()
    while todo:
        path = todo.pop()
        if path not in found and path.exists():
            found.add(path)
            todo += tool_modules(path)
    return found


def test_every_module_the_tests_reach_comes_from_a_declared_distribution():
    """tests/*.py, the package they test and the benchmark and dev tools they load: each third-party import maps (by
    importlib.metadata.packages_distributions, in this environment) to a distribution that pyproject declares, so a
    fresh `pip install -e .[test]` has it. tests/browser is optional (skipped without JupyterLab and Chromium)."""
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = requirement_names(project["dependencies"]) | requirement_names(project["optional-dependencies"]["test"])
    scripts = scripts_the_tests_load()
    assert {"common.py", "scaling.py", "fla_tests.py"} <= {p.name for p in scripts}  # the scan follows tool imports
    files = [*(ROOT / "tests").glob("*.py"), *(ROOT / "fla_lab").rglob("*.py"), *scripts]
    local = OURS | {"workbook"}
    modules = set().union(*(imported_top_level(p) for p in files)) - set(sys.stdlib_module_names) - local
    assert {"torch", "nbformat", "nbconvert", "pytest"} <= modules  # the scan reaches fla_lab.teaching.edition and tests
    distributions = packages_distributions()
    missing = {m: distributions.get(m) for m in modules - set(OPTIONAL)
               if not requirement_names(distributions.get(m, [m])) & declared}
    assert not missing, f"imported where the tests reach, in no dependency list (module: distributions): {missing}"


def test_the_gpu_runs_the_lessons_show_ship_as_package_data():
    """Every file of `fla_lab.tools.gpu_runs` (and only those) matches the package data pyproject declares for it, so
    an installed package, not only this repository, has what the lessons read."""
    from fnmatch import fnmatch

    from fla_lab.tools import gpu_runs

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = patterns[gpu_runs.__name__]
    assert {p.stem for p in gpu_runs.FOLDER.glob("*.json")} == set(gpu_runs.FILES)
    assert all(any(fnmatch(gpu_runs.path(name).name, pattern) for pattern in shipped) for name in gpu_runs.FILES)

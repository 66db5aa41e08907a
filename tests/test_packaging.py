"""`pip install -e .[test]` gives a user what the tests need: the `test` extra lists every third-party package
that tests/*.py imports, beside the package's own dependencies."""
import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = {"fla_lab", "conftest"}


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
}
BENCHMARKS = ROOT / "benchmarks"


def scripts_the_tests_load() -> set[Path]:
    """benchmarks/*.py that tests import (`benchmark_script("name")`) or run (`"benchmarks", "name.py"`), with the
    sibling scripts those import in turn."""
    text = "\n".join(p.read_text() for p in (ROOT / "tests").glob("*.py"))
    names = set(re.findall(r'benchmark_script\("(\w+)"\)', text)) | set(re.findall(r'"benchmarks", "(\w+)\.py"', text))
    found, todo = set(), [BENCHMARKS / f"{n}.py" for n in names]
    while todo:
        path = todo.pop()
        if path in found or not path.exists():
            continue
        found.add(path)
        todo += [BENCHMARKS / f"{n}.py" for n in imported_top_level(path)]
    return found


def test_every_module_the_tests_reach_comes_from_a_declared_distribution():
    """tests/*.py, the package they test and the benchmark scripts they load: each third-party import maps (by
    importlib.metadata.packages_distributions, in this environment) to a distribution that pyproject declares, so a
    fresh `pip install -e .[test]` has it. tests/browser is optional (skipped without JupyterLab and Chromium)."""
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = requirement_names(project["dependencies"]) | requirement_names(project["optional-dependencies"]["test"])
    files = [*(ROOT / "tests").glob("*.py"), *(ROOT / "fla_lab").rglob("*.py"), *scripts_the_tests_load()]
    local = OURS | {p.stem for p in BENCHMARKS.glob("*.py")} | {"benchmarks", "workbook"}
    modules = set().union(*(imported_top_level(p) for p in files)) - set(sys.stdlib_module_names) - local
    assert {"torch", "nbformat", "nbconvert", "pytest"} <= modules  # the scan reaches fla_lab.teaching.edition and tests
    distributions = packages_distributions()
    missing = {m: distributions.get(m) for m in modules - set(OPTIONAL)
               if not requirement_names(distributions.get(m, [m])) & declared}
    assert not missing, f"imported where the tests reach, in no dependency list (module: distributions): {missing}"

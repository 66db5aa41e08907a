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
    assert not third_party - declared, f"imported by tests/ but in no dependency list: {third_party - declared}"
    assert {"pytest", "pytest_xdist", "hypothesis", "nbval"} <= requirement_names(project["optional-dependencies"]["test"])

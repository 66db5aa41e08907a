"""fla_lab's packages form layers: a module imports only from its own layer or the ones below it.

    runtime < ops < layers < spec < tools < teaching      (`fla_lab/__init__` and `__main__` sit on top)

Every import counts, a function's lazy one included (ast, not the import system), so a kernel can never come to
depend on the teaching code, and the package's top level holds packages only.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fla_lab"
LAYERS = ("runtime", "ops", "layers", "spec", "tools", "teaching")


def layer_of(module: str) -> int | None:
    """The layer of a dotted `fla_lab...` name; None for the top (`fla_lab`, `fla_lab.__main__`)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every fla_lab module or name `path` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fla_lab"):
            found += [(node.lineno, f"{node.module}.{a.name}" if node.module == "fla_lab" else node.module)
                      for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("fla_lab")]
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_top_level_holds_packages_only():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules outside a layer package: {loose}"
    packages = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py")))
    assert packages == sorted(LAYERS)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_higher_layer(path):
    own = layer_of(module_name(path))
    if own is None:
        return
    upward = [f"line {line}: {name} ({LAYERS[layer_of(name)]})" for line, name in imports_of(path)
              if layer_of(name) is not None and layer_of(name) > own]
    assert not upward, f"{module_name(path)} ({LAYERS[own]}) imports a higher layer: {upward}"


def test_the_check_reads_lazy_imports_too(tmp_path):
    """The test can fail: a function-level import of a higher layer is found."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from fla_lab.teaching import bugs\n")
    assert imports_of(source) == [(2, "fla_lab.teaching")] and layer_of("fla_lab.teaching") > layer_of("fla_lab.ops")


def test_a_layers_modules_load_on_first_attribute_access():
    """`import fla_lab; fla_lab.tools.audit.audit(...)`, as the docs write it, loads the module when first named."""
    from conftest import run_python

    out = run_python("import fla_lab, sys; assert 'fla_lab.tools.audit' not in sys.modules; "
                     "print(fla_lab.tools.audit.__name__, fla_lab.teaching.bugs.CATALOGUE[0].name)")
    assert out.returncode == 0 and out.stdout.split() == ["fla_lab.tools.audit", "uninitialized_params"], out.stderr
    missing = run_python("import fla_lab; fla_lab.spec.no_such_module")
    assert "AttributeError: module 'fla_lab.spec' has no attribute 'no_such_module'" in missing.stderr

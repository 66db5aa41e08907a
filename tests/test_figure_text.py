"""Every figure's text is readable at notebook width: no font size below 9 pt anywhere in the package's plots."""
import ast
from pathlib import Path

import fla_lab

SMALLEST = 9
SIZE_KEYWORDS = {"fontsize", "labelsize", "title_fontsize", "size"}


def small_text(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            size = kw.value.value if isinstance(kw.value, ast.Constant) else None
            named = kw.arg in SIZE_KEYWORDS - {"size"} or (kw.arg == "size" and _is_font_call(node))
            if named and isinstance(size, (int, float)) and size < SMALLEST:
                found.append(f"{path.name}:{node.lineno} {kw.arg}={size}")
            if named and size in ("xx-small", "x-small", "small"):
                found.append(f"{path.name}:{node.lineno} {kw.arg}={size!r}")
    return found


def _is_font_call(node: ast.Call) -> bool:
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return name in ("FontProperties", "text", "annotate", "set_title", "set_xlabel", "set_ylabel", "legend")


def test_no_figure_text_below_9_pt():
    root = Path(fla_lab.__file__).parent
    found = [hit for path in sorted(root.rglob("*.py")) for hit in small_text(path)]
    assert not found, "text below 9 pt: " + ", ".join(found)


def test_the_scan_sees_a_small_font(tmp_path):
    (tmp_path / "plot.py").write_text("ax.text(0, 0, 'x', fontsize=7)\nax.legend(fontsize='small')\n")
    assert small_text(tmp_path / "plot.py") == ["plot.py:1 fontsize=7", "plot.py:2 fontsize='small'"]

"""The mutation check's mechanics only (no kernel runs): every mutation applies exactly once at HEAD."""
import subprocess
from pathlib import Path

from conftest import benchmark_script

ROOT = Path(__file__).resolve().parent.parent
mc = benchmark_script("mutation_check")


def _head(path: str) -> str:
    return subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def test_every_old_snippet_occurs_exactly_once_and_the_edit_changes_the_file():
    for m in mc.MUTATIONS:
        text = _head(m.path)
        assert text.count(m.old) == 1, (m.id, text.count(m.old))
        assert text.replace(m.old, m.new) != text, m.id
        mc.check_mutation(m, text)  # the script's own check agrees


def test_the_mutated_kernel_is_defined_in_the_package_and_no_bug_switch_is_touched():
    shared = {"fla_lab/ops/common/chunk.py", "fla_lab/ops/gla/chunk.py"}
    kernels = "".join(_head(p) for p in {m.path for m in mc.MUTATIONS} | shared)
    for m in mc.MUTATIONS:
        assert f"def {m.kernel}(" in kernels, m.id
        assert "bug" not in m.old.lower() and "END_DECAY" not in m.old, m.id  # the slot chunk_rwkv7's switch fills


def test_ids_are_unique_and_there_are_at_least_ten_across_four_ops():
    ids = [m.id for m in mc.MUTATIONS]
    assert len(ids) == len(set(ids)) >= 10
    assert len({m.op for m in mc.MUTATIONS}) >= 4
    assert all(m.op in mc.TESTS and m.what for m in mc.MUTATIONS)


def test_a_snippet_that_does_not_occur_once_fails_loudly():
    m = mc.MUTATIONS[0]
    import pytest

    with pytest.raises(SystemExit, match="occurs 0 times"):
        mc.check_mutation(m, "nothing here")
    with pytest.raises(SystemExit, match="occurs 2 times"):
        mc.check_mutation(m, m.old + m.old)

"""The mutation check's mechanics only (no kernel runs): every mutation's marker marks exactly one line of the package,
and its edit changes that line only, and what the file computes."""
from dataclasses import replace

import pytest

from dev import mutation_check as mc
from fla_lab.spec import markers

ROOT = markers.PACKAGE.parent


def test_every_mutation_applies_to_exactly_its_marked_line_and_changes_the_file():
    for m in mc.MUTATIONS:
        text = (ROOT / m.path).read_text()
        mutated = mc.mutated(m, text, m.path)  # the script's own check: one marked line, a change that runs
        changed = [n for n, (a, b) in enumerate(zip(text.splitlines(), mutated.splitlines()), 1) if a != b]
        assert changed == [markers.locate(text, m.marker, m.id)], (m.id, changed)
        assert len(mutated.splitlines()) == len(text.splitlines()), m.id


def test_the_mutated_kernel_is_defined_in_the_package_and_no_bug_switch_is_touched():
    shared = {"fla_lab/ops/common/chunk.py", "fla_lab/ops/gla/chunk.py"}
    kernels = "".join((ROOT / p).read_text() for p in {m.path for m in mc.MUTATIONS} | shared)
    for m in mc.MUTATIONS:
        line = markers.shipped(markers.find(m.marker, m.id))
        assert f"def {m.kernel}(" in kernels, m.id
        assert "bug" not in line.lower() and "END_DECAY" not in line, m.id  # the slot chunk_rwkv7's switch fills


def test_ids_are_unique_and_there_are_at_least_ten_across_four_ops():
    ids = [m.id for m in mc.MUTATIONS]
    assert len(ids) == len(set(ids)) >= 10
    assert len({m.op for m in mc.MUTATIONS}) >= 4
    assert all(m.op in mc.TESTS and m.what for m in mc.MUTATIONS)


def test_a_marker_that_does_not_mark_one_line_or_an_edit_that_changes_nothing_fails_loudly():
    m = mc.MUTATIONS[0]
    marked = f"x = 1  # mutation: {m.id}\n"
    with pytest.raises(SystemExit, match="marks 0 lines"):
        mc.mutated(m, "nothing here\n")
    with pytest.raises(SystemExit, match="marks 2 lines"):
        mc.mutated(m, marked + marked)
    with pytest.raises(SystemExit, match="the marked line's code"):
        mc.mutated(replace(m, new="x = 1  # respaced"), marked)
    with pytest.raises(SystemExit, match="invalid syntax|was never closed"):
        mc.mutated(replace(m, new="x = (1"), marked)

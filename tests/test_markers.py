"""Code found by marker, not by copy (`fla_lab.spec.markers`): every registry id marks exactly one line of the
kernels and layers, every marker there belongs to a registry entry, a marked line is still found after the code on
it is renamed, and what a learner is shown of the source carries no marker."""
import ast
import contextlib
import io
import shutil
from collections import Counter

import pytest

from dev import mutation_check
from fla_lab import layers
from fla_lab.spec import markers, safeguards
from fla_lab.teaching import exercises
from fla_lab.teaching.lessons import decay_contract, gsa_padding, overflow, safeguard_removal


def registry_ids() -> set[tuple[str, str]]:
    """(kind, id) of every entry that names a line: the safeguards, the `bug=` switches, the mutation check's slips."""
    return ({("safeguard", g.id) for g in safeguards.REGISTRY} | {("bug", s.name) for s in layers.SWITCHES}
            | {("mutation", m.id) for m in mutation_check.MUTATIONS if m.kind == "slip"})


def test_every_registry_id_is_marked_once_and_every_marker_belongs_to_an_entry():
    counts = Counter((m.kind, m.id) for m in markers.scan())
    expected = registry_ids()
    assert {key: n for key, n in counts.items() if key in expected and n != 1} == {}
    assert sorted(expected - set(counts)) == [], "registry ids that mark no line"
    assert sorted(set(counts) - expected) == [], "markers that name no registry entry"


def test_a_bug_marker_names_no_switch_its_file_does_not_already_name():
    """A learner who opens a kernel file before an exercise's PASS learns nothing new from a `# bug:` marker: the
    switch's name is already in that file's code or comments (the printers strip the markers anyway)."""
    for m in markers.scan():
        if m.kind == "bug":
            assert m.id in markers.strip(markers.source(m)), m


def test_a_marker_marks_its_own_line_or_the_next_line_of_code():
    text = ("def f(x):\n"
            "    y = x + 1  # safeguard: a  # mutation: b\n"
            "    # bug: c\n"
            "\n"
            "    # a comment between the marker and its line\n"
            "    z = y * 2  # a comment that names no marker\n"
            "    # see the bug: not_a_marker, nor is # safeguard: this one\n"
            "    return z\n")
    assert markers.marked_lines(text) == [("safeguard", "a", 2), ("mutation", "b", 2), ("bug", "c", 6)]
    assert markers.strip(text) == text.replace("  # safeguard: a  # mutation: b", "").replace("    # bug: c\n", "")
    assert markers.replace(text, "bug", "c", "z = y * 3").splitlines()[5] == "    z = y * 3"
    with pytest.raises(ValueError, match="mark no line"):
        markers.marked_lines("x = 1\n# bug: c\n")
    with pytest.raises(LookupError, match="marks 2 lines"):
        markers.locate(text + "w = 1  # safeguard: a\n", "safeguard", "a")


def test_stripping_the_markers_removes_comments_only():
    for path in markers.files():
        text = path.read_text()
        stripped = markers.strip(text)
        assert ast.dump(ast.parse(stripped)) == ast.dump(ast.parse(text)), path
        assert not markers.marked_lines(stripped), path
        assert len(text.splitlines()) - len(stripped.splitlines()) == sum(
            1 for line in text.splitlines() if markers.markers_on(line) and not markers.strip_line(line).strip())


def test_a_renamed_and_reflowed_marked_line_is_still_found_by_its_id(tmp_path):
    """The edit that broke the copies: a variable renamed and a comment line added above the marked line, in a copy
    of the package. The id still finds the line, and a naive form still replaces exactly that line."""
    copy = tmp_path / "fla_lab"
    for folder in markers.SCANNED:
        shutil.copytree(markers.PACKAGE / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shipped = markers.find("safeguard", "gla_diagonal_masked_before_exp")
    target = copy / shipped.path.removeprefix("fla_lab/")
    text = target.read_text()
    old_copy = markers.shipped(shipped)  # what the registry held as a copy of the line before the markers
    assert "b_gq" in old_copy and old_copy in text
    renamed = text.replace("b_gq", "b_gquery").replace(
        "    # safeguard: gla_diagonal_masked_before_exp\n",
        "    # the GLA path: causal pairs only\n    # safeguard: gla_diagonal_masked_before_exp\n")
    target.write_text(renamed)
    assert old_copy not in renamed
    found = markers.find("safeguard", "gla_diagonal_masked_before_exp", copy)
    assert found.path == shipped.path and found.line == shipped.line + 1
    assert markers.shipped(found, copy) == old_copy.replace("b_gq", "b_gquery")
    naive = markers.replace(renamed, "safeguard", found.id, "return tl.exp(b_gquery - b_gk) * causal.to(tl.float32)")
    changed = [n for n, (a, b) in enumerate(zip(renamed.splitlines(), naive.splitlines()), 1) if a != b]
    assert changed == [found.line]


def _printed(fn, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        returned = fn(*args)
    return out.getvalue() + (returned if isinstance(returned, str) else "")


def _gla_chunk():
    from fla_lab.ops.gla import chunk

    return chunk


PRINTERS = {  # a printer of kernel or layer source to a learner, and a marker whose line it prints
    "overflow.stage_source": (lambda: overflow.stage_source("diagonal_weight", "rows_from_earlier_subchunks"),
                              ("mutation", "gla_diag_mask_after_exp")),
    "overflow.kernel_lines": (lambda: overflow.kernel_lines(_gla_chunk().gated_scores_kernel),
                              ("safeguard", "gated_scores_key_decay")),
    "gsa_padding.show_slot": (gsa_padding.show_slot, ("safeguard", "later_rows_query_decay")),
    "gsa_padding.show_switch": (gsa_padding.show_switch, ("bug", "unmasked_padding")),
    "decay_contract.decay_lines": (decay_contract.decay_lines, ("mutation", "rwkv6_fused_bonus_dropped")),
    "decay_contract.removal_lines": (decay_contract.removal_lines, ("safeguard", "rwkv7_key_norm_eps")),
    "safeguard_removal.show": (lambda: safeguard_removal.show("state_key_decay_to_chunk_end"),
                               ("safeguard", "state_key_decay_to_chunk_end")),
}


@pytest.mark.parametrize("printer", PRINTERS)
def test_what_a_learner_is_shown_of_the_source_carries_no_marker(printer, monkeypatch):
    monkeypatch.setattr(exercises, "_OPENED", {gsa_padding.EXERCISE, decay_contract.EXERCISE_REMOVAL})
    fn, marker = PRINTERS[printer]
    out = _printed(fn)
    assert markers.shipped(markers.find(*marker)) in out and not markers.ONE.search(out), out

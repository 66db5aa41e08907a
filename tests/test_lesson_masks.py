"""Notebook 04's module: the mask model and the kernel sweep classify known cases right; the explorer is live;
the exercise's check rejects the transposed mask and accepts the fix.

Reproduces the catalogue entry "transposed_h0_mask" (upstream #18) with the real dq backward kernel.
"""
import pytest
import torch
import triton
import triton.language as tl  # noqa: F401  (the interpreter looks for triton.language in a jit'd helper's module)

from fla_lab.teaching.lessons import masks


@pytest.mark.parametrize("K,V,tiles,buggy,status", [
    (16, 64, (16, 64), True, "raises"),    # upstream's dq tiles: mask [16, 64] vs pointers [64, 16]
    (16, 64, (16, 64), False, "right"),    # the fix
    (64, 64, (32, 32), True, "right"),     # square tiles that K and V fill: the bug hides
    (32, 16, (32, 32), True, "wrong"),     # square tiles that V does not fill: silently wrong dq
    (16, 32, (32, 32), True, "wrong"),     # ... and reads past the end of h0
    (16, 32, (32, 32), False, "right"),
])
def test_run_backward_classifies_known_cases(K, V, tiles, buggy, status):
    outcome = masks.run_backward(K, V, tiles, buggy, T=4)
    assert outcome.status == status, (outcome.status, outcome.errors, outcome.message)
    if status == "raises":
        assert "incompatible dimensions" in outcome.message and "64 and 16" in outcome.message
    if status == "wrong":  # only dq is wrong, and dw through it; dh0 comes from the other kernel
        assert outcome.failing == ("r", "w")


def test_bug_needs_the_backward_and_an_initial_state():
    assert masks.run_backward(16, 64, (16, 64), True, initial_state=False, T=4).status == "right"


def test_sweep_keys_and_summary():
    results = masks.sweep(tiles=((16, 64), (32, 32)), problems=((32, 32), (32, 16)), T=4)
    assert len(results) == 2 * 2 * 2
    assert masks.summary(results) == {"buggy": {"raises": 2, "right": 1, "wrong": 1},
                                      "fixed": {"raises": 0, "right": 4, "wrong": 0}}
    table = masks.status_table(results, buggy=True).splitlines()
    assert table[1].split()[1:] == ["raises", "raises"]
    assert table[2].split()[1:] == ["wrong", "right"]  # columns sorted: (32,16), (32,32)


@pytest.mark.parametrize("K,V,BK", [(32, 16, 32), (16, 32, 32), (16, 64, 64), (64, 64, 32), (16, 16, 64)])
def test_cell_model_matches_a_direct_index_count(K, V, BK):
    """Missing = h0 elements the fixed load reads and the buggy one does not; outside = addresses >= K*V."""
    cells = masks.h0_cells(K, V, BK, BK)
    rows, cols = torch.meshgrid(torch.arange(cells.shape[0]), torch.arange(cells.shape[1]), indexing="ij")
    in_problem = (rows < V) & (cols < K)
    assert ((cells == 1) | (cells == 2)).eq(in_problem).all()  # the fixed mask is exactly the problem
    counts = masks.cell_counts(K, V, BK, BK)
    if K == V or (K % BK == 0 and V % BK == 0):
        assert counts == {"missing": 0, "extra inside h0": 0, "extra outside h0": 0}
    else:
        assert counts["missing"] > 0


def test_canary_buffer_covers_every_address_and_keeps_h0():
    h0 = torch.randn(1, 1, 16, 32)
    view = masks.in_canary_buffer(h0, masks.padding_needed(16, 32, 32, 32))
    assert torch.equal(view, h0) and view.is_contiguous()
    storage = view.untyped_storage().nbytes() // view.element_size()
    largest_address = (32 - 1) * 32 + (32 - 1)  # o_k up to the padded K=32, times V=32, plus o_v up to 31
    assert storage > largest_address
    assert storage - view.numel() == masks.padding_needed(16, 32, 32, 32)
    assert torch.isnan(torch.as_strided(view, (storage,), (1,))[view.numel():]).all()


def test_non_square_tiles_cannot_be_modelled():
    assert not masks.broadcastable(masks.tile_shapes(16, 64)["pointers"], masks.tile_shapes(16, 64)["buggy mask"])
    assert masks.broadcastable(masks.tile_shapes(32, 32)["pointers"], masks.tile_shapes(32, 32)["buggy mask"])


def test_tile_shapes_gives_the_fixed_masks_shape_only_once_the_exercise_is_open(monkeypatch):
    from fla_lab.teaching import exercises
    monkeypatch.setattr(exercises, "_OPENED", set())
    assert masks.tile_shapes(16, 64)["fixed mask"] == masks.FIXED_MASK_HIDDEN
    assert masks.tile_shapes(16, 64)["pointers"] == (64, 16)
    exercises.record_open(masks.EXERCISE)
    assert masks.tile_shapes(16, 64)["fixed mask"] == (64, 16)
    with pytest.raises(ValueError, match="square"):
        masks.h0_cells(16, 64, 16, 64)


def test_explorer_controls_drive_the_kernels(monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    calls = []
    real = masks.run_backward
    monkeypatch.setattr(masks, "run_backward", lambda *a, **kw: calls.append(a) or real(*a, **kw, T=2))
    ui = masks.explorer()
    assert calls[-2:] == [(32, 16, (32, 32), True), (32, 16, (32, 32), False)]  # the default draws once
    controls = {c.description.split()[0]: c for c in ui.children[:-1]}
    controls["BV"].value = 64
    assert calls[-1] == (32, 16, (32, 64), False)
    controls["V"].value = 64
    assert calls[-1] == (32, 64, (32, 64), False)


def test_reads_outside_h0_lists_only_square_buggy_configs_with_oob_cells():
    results = {(True, (32, 32), (16, 32)): None, (True, (32, 32), (32, 16)): None,
               (True, (16, 64), (16, 64)): None, (False, (32, 32), (16, 32)): None}
    assert masks.reads_outside_h0(results) == [((32, 32), (16, 32))]


# The exercise: the learner's `@triton.jit` mask helper in the shipped dq kernel's H0_MASK slot.


@triton.jit
def transposed_mask(m_k, m_v):  # the notebook's stub: upstream's line before 1547448b
    return m_k[:, None] & m_v[None, :]


@triton.jit
def pointer_shaped_mask(m_k, m_v):  # the fix: the pointer tile's own [BV, BK] broadcast
    return m_v[:, None] & m_k[None, :]


@triton.jit
def values_only_mask(m_k, m_v):  # right orientation, but lets padded key columns through
    return m_v[:, None] & (m_k[None, :] | True)


@triton.jit
def keys_only_mask(m_k, m_v):  # right orientation, but lets padded value rows through
    return m_k[None, :]


@triton.jit
def half_transposed_mask(m_k, m_v):  # [BK, 1]: m_k down the rows, no value check
    return m_k[:, None]


def test_the_shipped_kernel_takes_the_mask_from_its_slot():
    """The default of the slot is the fixed helper; the bug switch selects the historical one; a helper passed in
    runs in the same kernel (the stub raises exactly where bug="transposed_h0_mask" does)."""
    import inspect

    from fla_lab.ops.common import fused_recurrent as fr

    slot = inspect.signature(fr.fused_recurrent_bwd_dq_kernel.fn).parameters["H0_MASK"]
    assert slot.default is fr.h0_mask
    assert "H0_MASK(m_k, m_v)" in inspect.getsource(fr.fused_recurrent_bwd_dq_kernel.fn)
    stub = masks.run_backward(32, 16, (32, 32), False, T=4, h0_mask=transposed_mask)
    switch = masks.run_backward(32, 16, (32, 32), True, T=4)
    assert stub.status == switch.status == "wrong" and stub.errors == switch.errors


def test_check_rejects_the_transposed_mask_with_every_kind_of_failure():
    verdict = masks.check_h0_mask(transposed_mask)
    assert not verdict.passed
    trials = {s: masks.try_mask(transposed_mask, *s) for s in masks.EXERCISE_SHAPES}
    assert trials[16, 64, 16, 64].backward.status == "raises"               # upstream's dq tiles
    assert "mask's shape does not match" in str(trials[16, 64, 16, 64])     # a version-independent sentence
    silent = trials[32, 32, 32, 16]
    assert silent.backward.failing == ("r", "w") and silent.transposed
    assert (silent.missing, silent.through_k, silent.through_v, silent.outside) == (256, 0, 256, 0)
    oob = trials[32, 32, 16, 32]
    assert (oob.missing, oob.through_k, oob.through_v, oob.outside) == (256, 256, 0, 256)
    assert trials[32, 32, 64, 64].right                                      # full square tiles hide it
    assert [str(t) for t in trials.values()] == verdict.facts
    assert len(verdict.hints) == 3 and "transposed" in verdict.hints[1] and "o_v" in verdict.hints[0]


def test_check_accepts_the_pointer_shaped_mask():
    verdict = masks.check_h0_mask(pointer_shaped_mask)
    assert verdict.passed, str(verdict)
    assert all("backward right; the mask is exactly h0's cells" in fact for fact in verdict.facts)


def test_the_probe_counts_the_cells_the_real_load_reads():
    """The probe's cells for the historical helper are the cell model's (1, 3, 4: let through), tile by tile."""
    from fla_lab.ops.common.fused_recurrent import h0_mask, h0_mask_transposed

    for BK, BV, K, V in [s for s in masks.EXERCISE_SHAPES if s[0] == s[1]]:
        model = masks.h0_cells(K, V, BK, BV)
        assert torch.equal(masks.mask_cells(h0_mask_transposed, K, V, BK, BV), torch.isin(model, torch.tensor([1, 3, 4])))
        assert torch.equal(masks.mask_cells(h0_mask, K, V, BK, BV), torch.isin(model, torch.tensor([1, 2])))


def test_hints_follow_the_mistake():
    """Gradients right but padding read (values only); padding rows read past h0 turn dq NaN (keys only); a
    mask of the wrong shape that is not the transposed one gets the shape hint without the transposition story."""
    values_only = masks.check_h0_mask(values_only_mask)
    assert not values_only.passed and "backward right" in values_only.facts[1]
    assert "key columns k >= K" in values_only.hints[0] and "o_k[j] < K" in values_only.hints[1]
    keys_only = masks.check_h0_mask(keys_only_mask)
    assert "backward wrong (dr, dw)" in keys_only.facts[1]
    assert "value rows v >= V" in keys_only.hints[0] and "0 * NaN" in keys_only.hints[1]
    half = masks.check_h0_mask(half_transposed_mask)
    assert "raises" in half.facts[0] and "transposed" not in half.hints[1] and "[BV, BK]" in half.hints[1]
    for verdict in (values_only, keys_only, half):
        assert verdict.hints[-1] == masks._LINE


def test_check_refuses_a_plain_function():
    verdict = masks.check_h0_mask(lambda m_k, m_v: m_v[:, None] & m_k[None, :])
    assert not verdict.passed and "not a @triton.jit function" in verdict.facts[0]


def test_explain_error_wording():
    assert masks.explain_error("ValueError('Cannot make_shape_compatible: incompatible dimensions at index 0')") \
        == masks.explain_error("Cannot broadcast, the expanded size of the tensor (16) must match")
    assert "did not run" in masks.explain_error("NameError: name 'foo' is not defined")


def test_figure_legends_name_only_what_is_drawn(monkeypatch):
    """No legend entry for a line or colour that no panel draws; the error bars are labelled by kernel."""
    import matplotlib
    matplotlib.use("Agg")

    def legend_labels(fig):
        return [text.get_text() for legend in fig.legends for text in legend.get_texts()]

    shapes = legend_labels(masks.plot_tile_shapes())
    assert not any(label.startswith("solid") for label in shapes)  # K, V fit in one 32x32 tile in every panel
    assert len([label for label in shapes if label in masks.CELL_NAMES]) == len(masks.CELL_NAMES)
    real = masks.run_backward
    monkeypatch.setattr(masks, "run_backward", lambda *a, **kw: real(*a, **kw, T=2))
    fig = masks.plot_config(32, 32, 32, 16)
    assert "extra: reads OUTSIDE h0" not in legend_labels(fig)
    bars = [text.get_text() for text in fig.axes[1].get_legend().get_texts()]
    assert bars == ["fp32 gradient tolerance", "buggy kernel", "fixed kernel"]
    assert any(label.startswith("solid") for label in legend_labels(masks.plot_config(16, 16, 24, 40)))


def test_the_solution_line_is_sealed_out_of_tab_and_source():
    import inspect

    from fla_lab.teaching import exercises

    assert isinstance(masks._LINE, exercises.Sealed) and masks._LINE == "return m_v[:, None] & m_k[None, :]"
    assert masks._LINE not in inspect.getsource(masks) and masks._LINE not in repr(masks._LINE)
    assert not any(getattr(masks, name) == masks._LINE for name in dir(masks) if not name.startswith("_"))
    docs = [inspect.getdoc(masks)] + [inspect.getdoc(getattr(masks, n)) or "" for n in dir(masks)
                                      if not n.startswith("_") and getattr(getattr(masks, n), "__module__", "")
                                      == masks.__name__]
    assert not any("m_v[:, None] & m_k[None, :]" in doc or "fixed `[BV, BK]`" in doc for doc in docs)


def test_the_cell_model_and_the_probe_do_not_write_the_right_mask():
    """`lesson.h0_cells??` and `lesson.mask_probe_kernel??` are on the learner's path: neither builds a mask with the
    values down the rows and the keys across (the exercise's line, in any names), issue 44. The right cells come
    from the grid (`needed[:V, :K]`), the same cells the pointer-shaped mask lets through."""
    import inspect
    import re

    column_then_row = re.compile(r"[om]_v\[:, None\][^\n]*&[^\n]*[om]_k\[None, :\]")
    for code in (masks.h0_cells, masks.mask_probe_kernel.fn):
        assert not column_then_row.search(inspect.getsource(code)), code
    assert not column_then_row.search(inspect.getsource(masks))
    assert torch.equal(masks.h0_cells(16, 32, 32, 32) == 2, masks.mask_cells(pointer_shaped_mask, 16, 32, 32, 32)
                       & ~masks.mask_cells(transposed_mask, 16, 32, 32, 32))  # missing: needed, masked off


def _trial(status="right", message="", **counts) -> "masks.MaskTrial":
    return masks.MaskTrial(32, 32, 16, 32, masks.Outcome(status, {}, message=message), **counts)


@pytest.mark.parametrize("trials", [
    [_trial("raises", "incompatible dimensions"), _trial(transposed=True)],         # the transposed mask
    [_trial("raises", "incompatible dimensions")],                                  # another wrong shape
    [_trial(missing=4)],                                                            # elements dropped
    [_trial(through_k=4)], [_trial(through_v=4)], [_trial(through_k=4, through_v=4)],  # padding let through
], ids=["transposed", "shape", "drops", "keys", "values", "both"])
def test_tiers_that_say_how_to_build_the_mask_are_sealed(trials):
    """Tier 2 says how the mask must be built (its orientation, the checks each cell needs): Sealed, so `lesson??`
    shows base64 there (issue 44); the last tier is the sealed line."""
    import inspect

    from fla_lab.teaching import exercises

    hints = masks.mask_hints(trials)
    assert isinstance(hints[1], exercises.Sealed) and hints[1] not in inspect.getsource(masks)
    assert not isinstance(hints[0], exercises.Sealed) and hints[-1] == masks._LINE


def test_a_helper_that_does_not_run_gets_no_line():
    """Its two tiers stop short of the line and stay plain: a Sealed last tier counts as the line, and a helper
    broken on purpose must not open the fix."""
    from fla_lab.teaching import exercises

    hints = masks.mask_hints([_trial("raises", "NameError: name 'x' is not defined")])
    assert len(hints) == 2 and not any(isinstance(tier, exercises.Sealed) for tier in hints)

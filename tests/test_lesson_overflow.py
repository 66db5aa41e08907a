"""Notebook 03's module: the bug's NaN sits exactly where the analysis says (first query row of every later
sub-chunk), the threshold is 88.72 / max |U| on those rows, the fixed kernel matches the float64 spec at extreme
decay, the clamp changes the model by about e^-level, and the explorer drives the package function."""
import math

import pytest
import torch

from fla_lab.spec import harness
from fla_lab.teaching.lessons import overflow

BUG = overflow.BUG
EXP_MAX = math.log(torch.finfo(torch.float32).max)  # 88.72: exp() of anything larger is inf in fp32


@pytest.mark.parametrize("chunk_size", [32, 64])
def test_nan_rows_are_the_first_rows_of_later_sub_chunks(chunk_size):
    x = overflow.inputs(1e3, T=128)
    got = overflow.run_with_grads(x, BUG, chunk_size)
    starts = overflow.sub_chunk_starts(128, chunk_size)
    assert overflow.bad_rows(got["o"]) == starts == overflow.bad_rows(got["dr"])
    census = overflow.census(got)
    assert all(census[n].count == 0 for n in ("dk", "du", "dinitial_state"))
    assert census["dv"].count > 0 and census["dw"].count > 0
    fixed = overflow.census(overflow.run_with_grads(x, None, chunk_size))
    assert all(c.count == 0 for c in fixed.values())


def test_sub_chunk_starts():
    assert overflow.sub_chunk_starts(128, 64) == [16, 32, 48, 80, 96, 112]
    assert overflow.sub_chunk_starts(100, 32) == [16, 48, 80]
    assert overflow.sub_chunk_starts(300, 16) == []
    assert overflow.sub_chunk_starts(70, 64) == [16, 32, 48]


def test_score_census_marks_whole_rows_of_earlier_keys():
    x = overflow.inputs(1e3, T=64)
    scores = overflow.score_census(x, BUG, 64)
    assert scores == {16: list(range(16)), 32: list(range(32)), 48: list(range(48))}
    assert overflow.score_census(x, None, 64) == {}


def test_spans():
    assert overflow.spans([0, 1, 2, 5, 7, 8]) == "0..2, 5, 7..8"
    assert overflow.spans([]) == ""


@pytest.mark.parametrize("g", [-0.5, -100.0])
def test_exponents_sign(g):
    bug, fixed = overflow.exponents(g, "buggy"), overflow.exponents(g, "fixed")
    assert float(bug["query_exp"][0]) == pytest.approx(-g)  # ge[start] - gi[start] = |g|
    assert (bug["query_exp"][1:] <= 0).all() and (bug["key_exp"] <= 0).all()
    assert (fixed["query_exp"] <= 0).all() and (fixed["key_exp"] <= 0).all()
    # the split must reproduce the exact exponent ge[t] - gi[s] = (t - 1 - s) * g either way
    for e in (bug, fixed):
        total = e["query_exp"][:, None] + e["key_exp"][None, :]
        exact = (e["query_rows"][:, None] - 1 - e["key_rows"][None, :]).double() * g
        assert torch.allclose(total, exact)


@pytest.mark.parametrize("chunk_size", [32, 64])
def test_threshold_is_88_72_over_the_largest_first_row_decay(chunk_size):
    m = overflow.predicted_threshold(chunk_size)
    # recomputed here: w = -m * U with U ~ U(0.05, 1) drawn by harness.gated_inputs (B = H = 1, T = 128, K = 16);
    # the bug's query factor exp(|w|) on a sub-chunk's first row overflows once m * U > EXP_MAX there
    U = -harness.gated_inputs(1, 128, 1, 16, 16, decay=1.0, bonus=True, names=("r", "k", "v", "w"))["w"][0, :, 0]
    assert m == pytest.approx(EXP_MAX / float(U[overflow.sub_chunk_starts(128, chunk_size)].max()), rel=1e-6)
    assert EXP_MAX < m < EXP_MAX / 0.05
    assert overflow.forward_finite(m * (1 - 1e-4), chunk_size)
    assert not overflow.forward_finite(m * (1 + 1e-4), chunk_size)
    assert overflow.forward_finite(1e4, chunk_size, bug=None)


def test_measured_threshold_agrees_and_chunk_16_never_fires():
    m = overflow.measured_threshold(64, lo=80.0, hi=120.0, steps=8)
    assert m == pytest.approx(overflow.predicted_threshold(64), rel=2e-3)
    assert overflow.predicted_threshold(16) == math.inf == overflow.measured_threshold(16)


def test_clamp_bounds_the_decay_and_kills_its_gradient():
    w = torch.tensor([-0.5, -11.0, -13.0, -1e4], requires_grad=True)
    clamped = overflow.clamp_log_decay(w, 12.0)
    assert clamped.tolist() == [-0.5, -11.0, -12.0, -12.0]
    clamped.sum().backward()
    assert w.grad.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_clamp_cost_is_about_e_to_minus_level():
    c = overflow.clamp_cost(1e3, level=12.0)
    assert c["clamped"] == 1.0
    assert 0.1 * math.exp(-12) < c["model"] < 3 * math.exp(-12)
    assert c["buggy kernel, clamped w"] == pytest.approx(c["model"], rel=0.05)  # finite, and only the model change
    assert c["fixed kernel, true w"] < c["model"] / 10
    errors = overflow.clamp_model_errors([4, 8, 16], [1e3])[1e3]
    assert errors[0] > errors[1] > errors[2] > 0


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_fixed_kernel_matches_the_spec_at_extreme_decay(chunk_size):
    comparison = overflow.verify(decay=1e4, chunk_size=chunk_size)
    assert comparison.ok, comparison.failures()
    assert set(comparison.errors) == {"o", "ht", "r", "k", "v", "w", "u", "initial_state"}


def test_buggy_kernel_fails_exactly_where_the_reference_row_is_used():
    assert set(overflow.verify(decay=1e4, bug=BUG).failures()) == {"o", "r", "v", "w"}


def test_gla_is_unaffected():
    assert overflow.gla_check(decay=1e4).ok


def test_sweep_and_summary():
    results = overflow.sweep(decays=(1.0, 1e3), dtypes=("fp32",), progress=False)
    assert set(results) == {("fp32", b, m) for b in (BUG, None) for m in (1.0, 1e3)}
    assert math.isinf(results[("fp32", BUG, 1e3)]["o"]) and results[("fp32", None, 1e3)]["o"] < 2e-5
    below = results[("fp32", BUG, 1.0)], results[("fp32", None, 1.0)]  # both accurate below the threshold
    assert all(max(e.values()) < 5e-5 for e in below)
    summary = overflow.sweep_summary(results)["fp32"]
    assert summary["bug fires at"] == 1e3 and summary["fixed fires at"] == math.inf
    assert summary["fixed worst error"] < 5e-5
    assert overflow.worst_grad(results[("fp32", BUG, 1e3)]) == math.inf


def test_decade_and_summary():
    assert overflow.decade(8.3e-08) == "< 1e-07" and overflow.decade(1.2e-6) == "< 1e-05"
    assert overflow.decade(math.inf) == "non-finite" and overflow.decade(0.0) == "0"
    line = overflow.summary(overflow.verify(decay=1e4, bug=BUG))
    assert "worst error non-finite" in line and line.endswith("failing: o, r, v, w")


def test_figures_draw():
    import matplotlib
    matplotlib.use("Agg")
    assert len(overflow.plot_exponents(-100.0).axes) == 2
    assert [ax.get_title() for ax in overflow.plot_exponents(-100.0, ("buggy",)).axes] == [
        overflow.EXPONENT_TITLES["buggy"]]
    results = overflow.sweep(decays=(1.0, 1e3), dtypes=("fp32",), progress=False)
    assert "fp32" in overflow.plot_sweep(results).axes[0].get_title()
    assert "bf16" in overflow.plot_setting(300.0, torch.bfloat16, 32).axes[1].get_title()


def test_explorer_controls_drive_plot_setting(monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    calls = []
    monkeypatch.setattr(overflow, "plot_setting",
                        lambda decay, dtype, chunk_size: calls.append((decay, dtype, chunk_size)))
    ui = overflow.explorer()
    assert calls[-1] == (100.0, torch.float32, 64)
    decay, dtype, chunk_size = ui.children[:3]
    chunk_size.value = 16
    dtype.value = torch.float16
    decay.value = 1e3
    assert calls[-1] == (pytest.approx(1e3), torch.float16, 16)


# ---------------------------------------------------------------------------------------------------- exercise
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from fla_lab.ops.common import chunk as common_chunk  # noqa: E402
from fla_lab.ops.gla import chunk as gla_chunk  # noqa: E402


@triton.jit
def inclusive_reference(gi, i_start, o_k, HK: tl.constexpr):  # the notebook's stub: de4235fd's row
    return gi + i_start * HK + o_k


@triton.jit
def exclusive_reference(gi, i_start, o_k, HK: tl.constexpr):  # 0c1c0b65's row
    return gi + (i_start - 1) * HK + o_k


@triton.jit
def two_rows_back(gi, i_start, o_k, HK: tl.constexpr):  # too early by one: the last key's factor overflows
    return gi + (i_start - 2) * HK + o_k


@triton.jit
def previous_subchunk_start(gi, i_start, o_k, HK: tl.constexpr):  # too early: above the keys of sub-chunk i - 1
    return gi + (i_start - 16) * HK + o_k


@triton.jit
def three_rows_late(gi, i_start, o_k, HK: tl.constexpr):  # too late: the first four query rows overflow
    return gi + (i_start + 3) * HK + o_k


def test_check_rejects_the_inclusive_row_and_accepts_the_fix():
    stub = overflow.check_reference_row(inclusive_reference)
    assert not stub.passed and str(stub).startswith("NOT YET")
    assert stub.facts[0].startswith("strong decay (m = 100): o, ht and every gradient vs float64, worst error inf")
    assert stub.facts[0].endswith("failing: o, dr, dv, dw; o non-finite at t = 16, 48")
    assert "within tolerance" in stub.facts[1]  # weak decay hides it
    fixed = overflow.check_reference_row(exclusive_reference)
    assert fixed.passed, str(fixed)
    assert "verdict.hint()" not in str(fixed)


def test_hints_follow_the_side_that_overflows(capsys):
    """The stub breaks the query side (one row per sub-chunk), a row above start - 1 the key side (every row)."""
    stub = overflow.check_reference_row(inclusive_reference)
    assert len(stub.hints) == 3
    assert "exp(ge[t] - gn)" in stub.hints[0] and "reads row i_start." in stub.hints[1]
    assert "return gi + (i_start - 1) * HK + o_k" in stub.hints[2]
    assert not any("(i_start - 1)" in h for h in stub.hints[:2])  # the line only in the last tier
    early = overflow.check_reference_row(two_rows_back)
    assert not early.passed and early.facts[0].endswith("o non-finite at t = 16..63")
    assert "key factor exp(gn - gi[s])" in early.hints[0] and "reads row i_start - 2," in early.hints[1]
    stub.hint()
    stub.hint()
    out = capsys.readouterr().out
    assert out.startswith("hint 1 of 3 (where to look)") and "hint 2 of 3 (what is wrong)" in out


@pytest.mark.parametrize("helper, offset", [(inclusive_reference, 0), (exclusive_reference, -1), (two_rows_back, -2),
                                            (previous_subchunk_start, -16), (three_rows_late, 3)])
def test_the_probe_reads_the_row_a_helper_points_at(helper, offset):
    assert overflow.reference_row_offset(helper) == offset


def test_the_shipped_default_and_the_switch_are_the_slot_helpers():
    """The slot's default is the shipped row and `bug=` swaps in the historical helper: identical results, bit
    for bit, whether the helper comes from the switch, the default or a caller."""
    x = overflow.inputs(100.0, T=128)
    default = overflow.run_with_grads(x, None)
    passed = overflow.run_with_grads(x, None, row=common_chunk.reference_row)
    learners = overflow.run_with_grads(x, None, row=exclusive_reference)
    assert all(torch.equal(default[n], passed[n]) and torch.equal(default[n], learners[n]) for n in default)
    bug = overflow.scores(x, BUG)
    historical = overflow.scores(x, None, row=common_chunk.reference_row_inclusive)
    assert torch.equal(bug.isnan(), historical.isnan()) and torch.equal(bug.nan_to_num(), historical.nan_to_num())


def test_kernel_lines_show_the_split_from_the_shipped_kernel():
    text = overflow.kernel_lines(gla_chunk.gated_scores_kernel)
    assert len(text.splitlines()) == 4 and text.splitlines()[0].startswith("b_gq = load_query_decay(")
    assert "b_gq - b_gn[None, :]" in text and "b_gn[:, None] - b_gkt" in text
    assert "(i_start - 1)" not in text  # the split, not the answer


@pytest.mark.parametrize("T", [64, 128])
def test_a_first_row_fires_iff_its_own_decay_passes_88_72(T):
    """The explorer's default (T = 64, m = 100) fires at rows 16 and 48, not 32: row 32's largest |w| is 72."""
    tops = overflow.first_row_decays(100.0, T)
    got = overflow.run_with_grads(overflow.inputs(100.0, T=T), BUG)
    assert overflow.bad_rows(got["o"]) == [s for s, top in tops.items() if top > EXP_MAX]
    if T == 64:
        assert overflow.bad_rows(got["o"]) == [16, 48] and tops[32] < EXP_MAX
    assert overflow.census(got)["ht"].count == 0


def test_a_first_row_misses_about_one_time_in_eight_at_m_100():
    rate = overflow.first_row_miss_rate(100.0, T=1024, draws=50)
    assert rate["predicted"] == pytest.approx(0.132, abs=2e-3)
    assert abs(rate["measured"] - rate["predicted"]) < 0.04 and rate["rows"] == 50 * 48


# ---------------------------------------------------------------------------------------------------- wrong answers
# Each passed an earlier version of the check (issue 44): it must now say NOT YET, with the hint tier that fits.


@triton.jit
def stride_sixteen(gi, i_start, o_k, HK: tl.constexpr):  # the row stride written as 16: right only for H * K = 16
    return gi + (i_start - 1) * 16 + o_k


@triton.jit
def last_row(gi, i_start, o_k, HK: tl.constexpr):  # a fixed row, the chunk's last: below every query's ge
    return gi + 63 * HK + o_k


def test_a_hard_coded_row_stride_fails_with_two_heads():
    verdict = overflow.check_reference_row(stride_sixteen)
    assert not verdict.passed and str(verdict).startswith("NOT YET")
    one_head, weak, two_heads = verdict.facts
    assert one_head.endswith("within tolerance") and weak.endswith("within tolerance")  # one head: rows 16 apart
    assert two_heads.startswith("strong decay, 2 heads (m = 100; rows of gi 32 apart): o and ht vs float64")
    assert "worst error inf, failing: o" in two_heads
    assert overflow.reference_row_offset(stride_sixteen) == -1  # the safe row with one head...
    assert overflow.reference_row_offset(stride_sixteen, H=2) == -17  # ...and 17 rows early with two
    where, what, line = verdict.hints
    assert "2 heads" in where and "steps from one row to the next" in where
    assert "row stride" in what and "HK = H * K" in what and "K or 16" in what and "i_start - 17" in what
    assert line.startswith(overflow._LINE) and not any(overflow._LINE in h for h in (where, what))


def test_a_fixed_last_row_gets_the_hint_of_every_query_row():
    verdict = overflow.check_reference_row(last_row)
    assert not verdict.passed
    assert verdict.facts[0].endswith("failing: o, dr, dv, dw; o non-finite at t = 16..63")
    assert overflow.reference_row_offset(last_row) == overflow.BC - 1  # "15 or later": every query row breaks
    where, what, _ = verdict.hints
    assert "only on the first row" not in where and "most rows of the later sub-chunks" in where
    assert "every query row's own factor exp(ge[t] - gn)" in where
    assert "reads row i_start + 15 or later" in what and "a fixed row" in what and "moves with i_start" in what
    # the stub keeps its own hint: one query row at a time
    assert "only on the first row of a sub-chunk" in overflow.check_reference_row(inclusive_reference).hints[0]


def test_the_solution_passes_every_case_with_one_head_and_two():
    verdict = overflow.check_reference_row(exclusive_reference)
    assert verdict.passed and len(verdict.facts) == len(overflow.EXERCISE_CASES) == 3
    assert all(fact.endswith("within tolerance") for fact in verdict.facts)
    assert verdict.facts[2].startswith("strong decay, 2 heads (m = 100; rows of gi 32 apart)")


def test_the_solution_line_is_sealed():
    """No public name, docstring or readable source line of the module gives the answer; the last hint tier does,
    and it is the line the shipped kernel runs."""
    import inspect

    from fla_lab.teaching import exercises

    answer = "(i_start - 1) * HK"
    assert isinstance(overflow._LINE, exercises.Sealed) and answer in overflow._LINE
    assert answer in inspect.getsource(common_chunk.reference_row.fn)  # the shipped fix's line
    assert answer not in repr(overflow._LINE) and not hasattr(overflow, "THE_LINE")
    assert answer not in inspect.getsource(overflow) and "start - 1]" not in (overflow.__doc__ or "")
    public = {n: getattr(overflow, n) for n in dir(overflow) if not n.startswith("_")}
    assert not [n for n, v in public.items() if isinstance(v, str) and answer in v]
    docs = [inspect.getdoc(v) or "" for v in public.values()
            if inspect.isfunction(v) and v.__module__ == overflow.__name__]
    assert docs and not [d for d in docs if answer in d or "gi[start - 1]" in d]
    assert overflow.reference_row_hints(0)[-1].opened().startswith(overflow._LINE.opened())
    assert answer not in str(overflow.reference_row_hints(0)[-1])  # printed only by verdict.hint()



def test_stage_source_refuses_an_answer_until_its_exercise_is_open(monkeypatch):
    """`stage_source` prints any stage, but the ones that are an exercise's answer (03a's reference row, 03b's
    exponent and the loop around it) raise NotRevealed until that exercise is open in this kernel (issue 44)."""
    from fla_lab.teaching import exercises
    from fla_lab.teaching.lessons import gsa_padding

    monkeypatch.setattr(exercises, "_OPENED", set())
    assert "REFERENCE_ROW(" in overflow.stage_source("load_query_decay", "load_reference_decay")
    for name in ("reference_row", "later_rows_exponent", "cols_from_later_subchunks"):
        with pytest.raises(exercises.NotRevealed, match=f"stage_source\\('{name}'\\).*says PASS"):
            overflow.stage_source("load_query_decay", name)
    with pytest.raises(exercises.NotRevealed):
        gsa_padding.show_shipped_exponent()
    exercises.record_open(overflow.EXERCISE)
    assert "(i_start - 1) * HK" in overflow.stage_source("reference_row")
    with pytest.raises(exercises.NotRevealed, match="check_padded_exponent"):
        overflow.stage_source("later_rows_exponent")
    exercises.record_open(gsa_padding.EXERCISE)
    assert "tl.where((o_j < T)[:, None] & m_d[None, :]" in overflow.stage_source("later_rows_exponent")

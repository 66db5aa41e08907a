"""Notebook 03b's module: the buggy kernel's NaN sits exactly where the gate alone predicts (rows of the partial last
chunk's sub-chunks whose cumulative decay passes -88.72, and every earlier row of dg), a full chunk never fires, the
threshold is 88.72 over the summed rows, the forward direction never exponentiates a positive number, the users'
clamp does not reach the cumulative decay, the fixed kernel matches the float64 spec, and the explorer runs only on
demand, and the exercise's check rejects the buggy exponent and accepts a masked one. Kernel calls stay at T <= 64
(the layer's at T = 20)."""
import math

import pytest
import torch
import triton
import triton.language as tl

from fla_lab import bugs, check
from fla_lab.lessons import gsa_padding as lesson

BUG = lesson.BUG
EXP_MAX = math.log(torch.finfo(torch.float32).max)  # 88.72: exp() of anything larger is inf in fp32


def nonfinite(x):
    return ~torch.isfinite(x)


# ---------------------------------------------------------------------------------------------------- the kernel


def test_prediction_matches_the_kernel_on_random_gates():
    got = lesson.kernel_run(T=45, decay=5.0)
    predicted = lesson.predicted_nonfinite(got["g"])
    assert predicted["ds"].any() and not predicted["ds"].all()  # a setting where some rows and slots survive
    for name in ("ds", "dg"):
        assert torch.equal(predicted[name], nonfinite(got[name])), name
    for name in ("o", "dq", "dk", "dv", "dinitial_state[0]", "dinitial_state[1]"):
        assert torch.isfinite(got[name]).all(), name
    # dg is a reverse cumulative sum over time: a slot with a bad ds row is bad on every row up to it
    bad_slots = predicted["ds"].any(1)
    last = max(t for t in range(45) if predicted["ds"][0, t].any())
    assert nonfinite(got["dg"])[0, :last + 1].eq(bad_slots).all()


def test_no_partial_chunk_no_nan():
    got = lesson.kernel_run(T=64, decay=30.0)
    assert all(torch.isfinite(got[n]).all() for n in ("o", "dq", "dk", "dv", "ds", "dg"))
    assert not lesson.predicted_nonfinite(got["g"])["ds"].any()
    assert -float(lesson.chunk_cumsum(got["g"]).min()) > 10 * EXP_MAX  # strong decay: only the padding was missing


def test_chunk_16_never_fires():
    got = lesson.kernel_run(T=45, decay=30.0, chunk_size=16)  # every chunk is one sub-chunk: no later sub-chunks
    assert all(torch.isfinite(got[n]).all() for n in ("ds", "dg"))
    assert not lesson.predicted_nonfinite(got["g"], chunk_size=16)["ds"].any()
    assert lesson.predicted_nonfinite(got["g"])["ds"].any()  # the same gate fires at chunk 64


def test_threshold_is_the_cumulative_decay_over_the_rows():
    T = 45
    g = lesson.threshold_per_step(T)
    assert g == pytest.approx(EXP_MAX / T)
    below = lesson.kernel_run(T=T, decay=1.0, constant_gate=-g * 0.98)
    above = lesson.kernel_run(T=T, decay=1.0, constant_gate=-g * 1.02)
    assert torch.isfinite(below["ds"]).all() and torch.isfinite(below["dg"]).all()
    # only sub-chunk 2 (rows 32..44, the one whose gn sums all 45 rows) crosses, in every slot
    assert set(lesson.nonfinite_slots(above["ds"]).values()) == {"32..44"}
    assert len(lesson.nonfinite_slots(above["ds"])) == above["ds"].shape[-1]
    assert set(lesson.nonfinite_slots(above["dg"]).values()) == {"0..44"}


def test_threshold_formula_agrees_with_the_prediction():
    assert lesson.threshold_per_step(0) == lesson.threshold_per_step(128) == math.inf
    assert lesson.threshold_per_step(45, chunk_size=16) == math.inf  # one sub-chunk per chunk: no later rows
    assert lesson.threshold_per_step(16) == pytest.approx(EXP_MAX / 16)
    assert lesson.threshold_per_step(50) == lesson.threshold_per_step(63) == pytest.approx(EXP_MAX / 48)
    for r in (1, 5, 16, 17, 33, 47, 48, 49, 63):
        for T in (r, 64 + r):
            g = lesson.threshold_per_step(r)
            fires = [bool(lesson.predicted_nonfinite(torch.full((1, T, 1, 2), -g * f))["ds"].any())
                     for f in (0.99, 1.01)]
            assert fires == [False, True], (T, fires)


def test_chunk_cumsum_restarts_every_chunk():
    g = -torch.ones(1, 80, 1, 1)
    gi = lesson.chunk_cumsum(g)
    assert gi[0, 63, 0, 0] == -64 and gi[0, 64, 0, 0] == -1 and gi[0, 79, 0, 0] == -16


def test_exponent_ranges():
    g = -torch.rand(1, 45, 1, 4, generator=torch.Generator().manual_seed(0)) * 5
    e = lesson.exponent_ranges(g)
    for name in ("forward: query factor", "forward: key factor", "transposed: valid later rows",
                 "transposed: rows past T, fixed"):
        assert e[name] <= 0, name
    gi = lesson.chunk_cumsum(g.double())
    assert e["transposed: rows past T, bug"] == pytest.approx(-float(gi[0, [15, 31, 44]].min()))
    full = lesson.exponent_ranges(-torch.rand(1, 64, 1, 4))
    assert full["transposed: rows past T, bug"] == -math.inf  # no partial chunk: never visited


# ---------------------------------------------------------------------------------------------------- the layer


@pytest.fixture(scope="module")
def layer_and_batch():
    layer, x = lesson.grown_layer(), lesson.batch(T=20)
    return layer, x, lesson.training_step(layer, x)


def test_layer_step_nan_only_in_f_proj_and_where_predicted(layer_and_batch):
    layer, x, step = layer_and_batch
    assert math.isfinite(step.loss) and torch.isfinite(step.output).all()
    predicted = lesson.predicted_nonfinite(step.gate)
    slots = predicted["ds"].any(1)[0]  # [H, M]
    assert slots.any()
    for name in ("ds", "dg"):
        assert torch.equal(predicted[name], nonfinite(step.kernel_grads[name].cpu())), name
    census = lesson.param_census(step)
    assert all(census[n] == "finite" for n in census if n != "f_proj.weight")
    rows = nonfinite(step.grads["f_proj.weight"]).any(1).cpu()
    assert torch.equal(rows, slots.flatten())  # f_proj's rows are (head, slot)
    assert str(slots.flatten().nonzero().flatten().tolist()[0] % lesson.SLOTS) in census["f_proj.weight"]
    assert lesson.gate_report(layer, x)["slots predicted NaN"] == int(slots.sum())


def test_anomaly_mode_names_the_node_and_output_3(layer_and_batch):
    layer, x, _ = layer_and_batch
    lines = lesson.anomaly_report(layer, x)
    assert lines[0].startswith(f"Error detected in {lesson.NODE}")
    assert lines[-1].startswith("RuntimeError") and lesson.NODE in lines[-1] and "3th output" in lines[-1]
    assert lesson.KERNEL_GRADS[3] == "ds"
    assert lesson.anomaly_report(lesson.grown_layer(bug=None), x) == []


def test_clamps_and_reinit(layer_and_batch):
    _, x, step = layer_and_batch
    report = lesson.gate_report(lesson.grown_layer(gate_clamp=20.0), x)
    raw = step.gate
    assert report["clamped"] == int((raw < -20).sum()) and report["f min"] == pytest.approx(-20.0)
    assert report["slots predicted NaN"] > 0  # the per-step bound leaves the sum over 16 rows past -88.72
    levels = lesson.clamp_levels(20)
    assert levels["enough for T mod 64 = 20"] == pytest.approx(EXP_MAX / 20)
    for name, level in levels.items():
        clamped = lesson.gate_report(lesson.grown_layer(gate_clamp=level), x)
        assert (clamped["slots predicted NaN"] == 0) == (level < 20), name
    fresh = lesson.gate_report(lesson.reinitialise_gate(lesson.grown_layer()), x)
    assert fresh["slots predicted NaN"] == 0 and fresh["worst cumulative decay"] > -EXP_MAX / 10


def test_training_step_of_the_fixed_layer_is_finite(layer_and_batch):
    _, x, _ = layer_and_batch
    step = lesson.training_step(lesson.grown_layer(bug=None), x)
    assert all(torch.isfinite(g).all() for g in step.grads.values())
    assert all(torch.isfinite(g).all() for g in step.kernel_grads.values())


def test_autograd_node():
    a = torch.ones(2, requires_grad=True)
    assert lesson.autograd_node(a * 2, "MulBackward0") is not None
    assert lesson.autograd_node(a * 2) is None


def test_nonfinite_slots_and_census_formatting():
    x = torch.zeros(1, 8, 2, 3)
    x[0, 2:5, 1, 2] = float("nan")
    x[0, 7, 0, 0] = float("inf")
    assert lesson.nonfinite_slots(x) == {(0, 0): "7", (1, 2): "2..4"}
    census = lesson.kernel_census({"ds": x})["ds"]
    assert census.count == 4 and census.first == {"t": 2, "b": 0, "h": 1, "d": 2}


# ---------------------------------------------------------------------------------------------------- fix and accuracy


def test_fixed_kernel_matches_the_spec_and_the_bug_fails_only_ds_dg():
    fixed = lesson.fixed_comparison(45, 1e4)
    assert fixed.ok, fixed.failures()
    assert {"initial_state[0]", "initial_state[1]", "ht[0]", "ht[1]"} <= set(fixed.errors)
    assert set(lesson.fixed_comparison(45, 30.0, bug=BUG).failures()) == {"s", "g"}


def test_gradient_errors_two_measures():
    e = lesson.gradient_errors(45, 30.0, "bf16")
    tol = check.tolerance(torch.bfloat16).grad
    assert lesson.meaningful(e) and e["plain"]["dg"] <= tol and max(e["scale-aware"].values()) <= tol
    assert set(e["plain"]) == set(e["scale-aware"]) == set(e["norm"]) >= {"dq", "dk", "dv", "ds", "dg"}
    fake = {"norm": {"dq": 1.0, "dg": 1e-23}}
    assert not lesson.meaningful(fake) and lesson.meaningful({"norm": {"dq": 1.0, "dg": 1e-3}})


def test_switch_and_catalogue(capsys):
    lesson.show_switch()
    lesson.show_catalogue()
    out = capsys.readouterr().out
    assert "- b_e = b_gq - b_gn[None, :]" in out
    assert "+ b_e = tl.where(m_jd, b_gq - b_gn[None, :], 0)" in out
    assert bugs.get(BUG).component in out and "737550ff" in out
    assert bugs.locate(BUG).split(":")[0] in out


# ---------------------------------------------------------------------------------------------------- figures, explorer


def test_figures_draw():
    import matplotlib
    matplotlib.use("Agg")
    assert len(lesson.plot_padded_rows(45, -4.0).axes) == 2
    assert "cumulative" in lesson.plot_thresholds({(45, 2.0): True}, init_f=0.087).axes[0].get_title()
    fake = {m: {"plain": {"dq": 1e-3, "dk": 1e-3, "dv": 1e-3, "ds": 2e-3, "dg": 3e-3},
                "scale-aware": {"dg": 1e-4}, "norm": {"dq": 1.0, "dg": 1.0 if m < 1e3 else 0.0}}
            for m in lesson.SWEEP_DECAYS}
    assert "bf16" in lesson.plot_accuracy(fake).axes[0].get_title()
    fig = lesson.plot_setting(torch.float32, 30.0, 20)
    assert "T = 20" in fig._suptitle.get_text() and "all within tolerance" in fig.axes[2].get_title()
    # the bars carry the names the comparison prints (initial_state[0], not h0[0])
    assert "initial_state[0]" in [t.get_text() for t in fig.axes[2].get_xticklabels()]
    # two measured runs 1 % apart: the thresholds figure zooms in on them
    measured = {(45, 1.95): False, (45, 2.0): True}
    zoom = lesson.plot_thresholds(measured).axes[0].child_axes
    assert len(zoom) == 1 and zoom[0].get_ylim()[0] < 1.95 < lesson.threshold_per_step(45) < 2.0 < zoom[0].get_ylim()[1]


def test_h200_atlas_numbers_the_notebook_quotes():
    ours, upstream = lesson.h200_dg_errors(), lesson.h200_dg_errors("fla:chunk_gsa")
    assert len(ours) == len(upstream) == 16  # T in {512, 4096} x 8 decay knobs
    assert round(ours[(512, 1e-3)]["scale-aware"], 3) == 0.023 and round(ours[(4096, 1e-3)]["scale-aware"], 3) == 0.031
    assert round(ours[(4096, 1.0)]["scale-aware"], 3) == 0.024
    assert max(ours[(T, m)]["scale-aware"] for T in (512, 4096) for m in (30.0, 100.0)) < 2e-3
    assert round(upstream[(512, 100.0)]["plain"]) == 42 and round(ours[(512, 100.0)]["plain"], 2) == 0.14


def test_explorer_runs_on_demand(monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    calls = []
    monkeypatch.setattr(lesson, "plot_setting", lambda dtype, decay, remainder: calls.append((dtype, decay, remainder)))
    ui = lesson.explorer()
    assert calls == []  # nothing runs until the button is clicked
    dtype, decay, remainder = ui.children[:3]
    assert (dtype.value, decay.value, remainder.value) == (torch.float32, pytest.approx(5.0), 45)
    dtype.value, decay.value, remainder.value = torch.bfloat16, 1e3, 0
    assert calls == []
    ui.manual_button.click()
    assert calls == [(torch.bfloat16, pytest.approx(1e3), 0)]


# ---------------------------------------------------------------------------------------------------- exercise


@triton.jit
def masked_exponent(b_gq, b_gn, valid):
    return tl.where(valid, b_gq - b_gn, 0)


@triton.jit
def later_rows_dropped(b_gq, b_gn, valid):  # "no NaN" by throwing the later rows away: must not pass
    return tl.where(valid, float("-inf"), float("-inf")) + 0 * b_gq


def test_exercise_check_rejects_the_bug_and_accepts_the_mask():
    stub = lesson.check_padded_exponent(lesson.buggy_exponent)
    assert not stub and "non-finite 720 of 720" in str(stub) and "NOT YET" in str(stub)
    assert "ds (T = 45, m = 1): non-finite 0 of 720" in str(stub)  # at weak decay the bug is invisible
    good = lesson.check_padded_exponent(masked_exponent)
    assert good and str(good).startswith("PASS")
    assert not lesson.check_padded_exponent(later_rows_dropped)
    assert not lesson.check_padded_exponent(lambda b_gq, b_gn, valid: b_gq - b_gn)  # not @triton.jit


def test_exercise_kernel_fails_where_the_real_kernel_does():
    ds = lesson.slot_write_grad(lesson.buggy_exponent, 45, 5.0)[None, :, None, :]
    real = lesson.kernel_run(T=45, decay=5.0)
    assert torch.equal(nonfinite(ds), nonfinite(real["ds"]))
    assert torch.equal(nonfinite(ds), lesson.predicted_nonfinite(real["g"])["ds"])


def test_exercise_reference_is_the_dense_sum():
    T, decay = 45, 3.0
    x = lesson.exercise_inputs(T, decay)
    q, k, do = (x[n][0, :, 0].double() for n in ("q", "k", "do"))
    gi = x["g"][0, :, 0].double().cumsum(0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[..., None]  # t >= s
    decay_ts = torch.where(causal, (gi[:, None, :] - gi[None, :, :]).clamp(max=0).exp(), 0)  # exp(gi_t - gi_s)
    dense = torch.einsum("ts,tm,tsm->sm", x["scale"] * q @ k.T, do, decay_ts)
    assert torch.allclose(lesson.slot_write_grad_reference(T, decay), dense, rtol=1e-10, atol=1e-12)
    fixed = lesson.slot_write_grad(masked_exponent, T, decay)
    assert check.rel_error(fixed, dense) < 1e-5

"""Lesson module of notebook 02: the decay contract. Small shapes; each test checks what a function claims."""
from __future__ import annotations

import math

import ipywidgets
import matplotlib
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

matplotlib.use("Agg")

from fla_lab.spec import reference  # noqa: E402
from fla_lab.teaching.lessons import decay_contract as dc  # noqa: E402


def test_log_misuses_give_nan_and_minus_inf():
    logs = dict(dc.log_misuses().values())
    assert logs[0.0] == -math.inf
    assert any(value < 0 and math.isnan(lv) for value, lv in logs.items())
    assert logs[0.9] == pytest.approx(math.log(0.9), rel=1e-6) and logs[1.5] > 0


@pytest.mark.parametrize("name", ["logsigmoid", "-exp", "rwkv7"])
def test_log_space_parametrisations_are_non_positive(name):
    x = torch.linspace(-30, 30, 601)
    assert (dc.PARAMETRISATIONS[name](x) <= 0).all()
    assert (dc.PARAMETRISATIONS["sigmoid"](x) >= 0).all()  # the mistake: a decay, not a log-decay


def test_bonus_gradient_matches_autograd_of_the_reference():
    x = dc.rwkv6_inputs("logsigmoid", T=6, K=4, seed=1)
    u = x["u"].double().requires_grad_()
    o, _ = reference.recurrent_rwkv6(x["r"], x["k"], x["v"], x["w"], u)
    do = torch.randn(o.shape, dtype=torch.float64)
    (o * do).sum().backward()
    assert torch.allclose(dc.bonus_gradient(x["r"], x["k"], x["v"], do, scale=4 ** -0.5), u.grad)


def test_state_trajectory_ends_at_the_reference_final_state():
    x = dc.rwkv6_inputs("logsigmoid", T=12, K=4, seed=2)
    sizes = dc.rwkv6_state_trajectory(**x)
    _, final = reference.recurrent_rwkv6(**x, output_final_state=True)
    assert sizes.shape == (12,) and sizes[-1] == pytest.approx(float(final.abs().max()))
    y = dc.rwkv7_case("RWKV-7 contract", T=10, K=8)
    _, final7 = reference.recurrent_rwkv7(**y, output_final_state=True)
    assert dc.rwkv7_state_trajectory(**y)[-1] == pytest.approx(float(final7.abs().max()))


def test_first_step_above():
    sizes = torch.tensor([1.0, 1e30, 1e39, math.inf], dtype=torch.float64)
    assert dc.first_step_above(sizes) == 2
    assert dc.first_step_above(torch.tensor([1.0, math.nan])) == 1
    assert dc.first_step_above(torch.ones(3)) is None


def test_sigmoid_decay_blows_up_everything_but_du():
    """#11 at a reduced size: T = 200 still passes fp32's range (~t = 165), du stays finite and exact."""
    bad = dc.run_rwkv6("sigmoid", T=200, K=8)
    assert bad.output.count > 0 and all(bad.grads[n].count > 0 for n in "rkvw")
    assert bad.grads["u"].count == 0 and bad.du_formula_error < 1e-5
    assert bad.output.first["t"] == dc.first_step_above(bad.state) + 1  # o_t reads S_{t-1}
    assert bad.bad_steps["dk"][0] and not bad.bad_steps["dr"][0]  # the adjoint fails at the start
    good = dc.run_rwkv6("logsigmoid", T=200, K=8)
    assert good.finite and dc.first_step_above(good.state) is None


def test_rwkv7_rand_ab_grows_and_the_contract_does_not():
    T, K = 56, 32  # radius ~9: fp32 overflows near t = 40
    rand = dc.run_rwkv7(dc.RWKV7_CASES[0], T=T, K=K)
    good = dc.run_rwkv7(dc.RWKV7_CASES[2], T=T, K=K)
    assert rand.radii.median() == pytest.approx(dc.rand_radius_estimate(K), rel=0.1)
    assert rand.output.count > 0 and good.output.count == 0
    assert good.radii.max() <= 1.0 and good.state.max() < 1e3
    assert rand.radii.shape == (T,) and rand.state.shape == (T,)


def test_radius_by_width_follows_k_over_four_plus_one_half():
    radii = dc.radius_by_width(widths=(8, 64), T=32)
    assert radii["rand a, b"][1] > radii["rand a, b"][0] > 1
    # a, b, exp w ~ U(0, 1)^K: the largest eigenvalue of diag(exp w) + b a^T is b.a plus a weighted mean of exp w,
    # about E[b.a] + E[exp w] = K/4 + 1/2 (16.5 at K = 64), below I + b a^T's 1 + K/4, which bounds it
    for K, radius in zip((8, 64), radii["rand a, b"]):
        assert radius == pytest.approx(dc.rand_radius_estimate(K), rel=0.1)
        assert radius < 1 + K / 4
    assert max(radii["RWKV-7 contract"]) <= 1


def test_contract_checks_fire_on_bad_calls_and_stay_quiet_on_good_ones():
    table = dc.contract_table(T=8, K=8)
    assert {kind for kind, _ in table.values()} >= {"accepted", "ValueError", "TypeError", "LayoutWarning",
                                                     "TransitionWarning"}
    for name, (expected, got) in table.items():
        assert got.split(":")[0] == expected, (name, got)


def test_verdict_reports_errors_warnings_and_acceptance():
    def raises():
        raise ValueError("bad w")

    def warns():
        import warnings
        warnings.warn("careful", UserWarning)

    assert dc.verdict(raises) == "ValueError: bad w"
    assert dc.verdict(warns) == "UserWarning: careful"
    assert dc.verdict(lambda: None) == "accepted"


def test_explorer_inputs_have_the_requested_b_dot_a_and_sign():
    x = dc.explorer_inputs(decay=0.3, sign=1.0, ab=-0.5, T=5, K=8)
    assert torch.allclose((x["a"] * x["b"]).sum(-1), torch.full((1, 5, 1), -0.5), atol=1e-6)
    assert (x["w"] > 0).all() and (dc.explorer_inputs(0.3, -1.0, 0.0, T=5, K=8)["w"] < 0).all()


def test_growth_by_dtype_fp16_overflows_first():
    curves = dc.growth_by_dtype(decay=0.1, sign=-1.0, ab=1.0, T=48, K=8)
    assert set(curves) == {"exact state (fp64)", "fp32", "bf16", "fp16"}
    assert dc.first_step_above(curves["fp16"], torch.finfo(torch.float16).max) is not None
    assert torch.isfinite(curves["fp32"]).all()


def test_explorer_starts_at_the_static_figures_setting():
    controls = {c.description: c.value for c in dc.growth_explorer().children if hasattr(c, "description")}
    assert (controls["|w| per step"], controls["sign of w"], controls["b . a"]) == tuple(dc.EXPLORER_DEFAULTS.values())


def test_growth_summary_reads_the_curves():
    curves = dc.growth_by_dtype(**dc.EXPLORER_DEFAULTS, T=48, K=8)
    summary = dc.growth_summary(curves)
    assert summary["fp16"] == dc.first_step_above(curves["fp16"], torch.finfo(torch.float16).max) is not None
    assert summary["fp32"] is None and summary["exact state at the last step"] == float(curves["exact state (fp64)"][-1])


def test_explorer_controls_drive_the_figure(monkeypatch):
    calls = []
    monkeypatch.setattr(dc, "plot_growth", lambda decay, sign, ab, **kw: calls.append((decay, sign, ab)))
    explorer = dc.growth_explorer()
    assert isinstance(explorer, ipywidgets.interactive)
    controls = {c.description: c for c in explorer.children if hasattr(c, "description")}
    controls["b . a"].value = 16.0
    controls["sign of w"].value = 1.0
    assert calls[-1][1:] == (1.0, 16.0)


def test_figures_draw():
    import matplotlib.pyplot as plt

    runs = [dc.run_rwkv6(p, T=16, K=4) for p in ("sigmoid", "logsigmoid")]
    fig = dc.plot_rwkv6_states(runs)
    assert len(fig.axes) == 2
    fig7 = dc.plot_rwkv7([dc.run_rwkv7(c, T=8, K=8) for c in dc.RWKV7_CASES], widths=(4, 8))
    assert len(fig7.axes) == 2
    assert len(dc.plot_growth(T=8, K=4).axes) == 1
    plt.close("all")


def test_layer_with_sigmoid_decay_overflows_and_the_fixed_layer_does_not():
    """At T = 400 on any device. Where the first NaN lands depends on the GroupNorm after the kernel (whose output is
    the same on both): the CPU's turns non-finite once the attention output reaches about 5e20 (t = 181), CUDA's
    only where the kernel's own output passes fp32's range (t = 336 on the H200)."""
    assert dc.layer_output(None, T=400).count == 0
    bad = dc.layer_output("sigmoid_decay", T=400)
    assert bad.count > 0 and bad.first["t"] > 100  # sigmoid(w_raw) <= 0.27 at init: slow growth


def test_trace_rwkv7_finds_the_reports_steps_and_why_the_chunk_kernel_is_early():
    """#150's call: upstream measured t = 31 with log(w) and t = 16 with raw w in its chunk kernel. fla_lab's
    chunk kernel gives the same steps; at t = 16 the exact output is finite (0 * inf inside the chunk's product)."""
    logged, raw = (dc.trace_rwkv7(case, T=64, K=64) for case in dc.RWKV7_CASES[:2])
    assert logged.first["chunk_rwkv7: first non-finite o"] == 31 == logged.first["fused_recurrent_rwkv7: first non-finite o"]
    assert logged.u_later is None
    assert raw.first["chunk_rwkv7: first non-finite o"] == 16 and raw.first["fused_recurrent_rwkv7: first non-finite o"] == 30
    assert raw.u_later == 31 and raw.exact_there < 3.4e38
    assert "0 * inf" in str(raw)


def test_saturation_does_not_decide_the_overflow():
    """#11 is not sigmoid saturation: unsaturated sigmoid gates overflow, saturated log-space ones do not."""
    rows = {row["w"]: row for row in dc.saturation_table(T=200, K=8)}
    assert rows["sigmoid(0.1 x)"]["saturated"] == 0 and rows["sigmoid(0.1 x)"]["state passes fp32 max"] is not None
    assert rows["sigmoid(10 x)"]["saturated"] > 0.5 and rows["sigmoid(10 x)"]["first non-finite o"] is not None
    assert rows["logsigmoid(10 x)"]["saturated"] > 0.5 and rows["logsigmoid(10 x)"]["first non-finite o"] is None
    assert rows["logsigmoid(10 x)"]["state passes fp32 max"] is None


def test_rwkv6_inputs_scale_and_raw_activations():
    raw = dc.rwkv6_inputs(None, T=4, K=4, seed=3, x_scale=10.0)["w"]
    assert torch.allclose(dc.rwkv6_inputs("sigmoid", T=4, K=4, seed=3, x_scale=10.0)["w"], torch.sigmoid(raw))
    assert torch.allclose(raw, 10 * dc.rwkv6_inputs(None, T=4, K=4, seed=3)["w"])


# the exercise of #11: helpers as a learner would write them


@triton.jit
def gate_as_reported(x):
    return tl.sigmoid(x)  # #11: the gate itself


@triton.jit
def naive_log_of_gate(x):
    return tl.log(tl.sigmoid(x))  # -inf where fp32 rounds the sigmoid to 0


STABLE_SOURCE = """
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))
"""


@triton.jit
def stable_log_sigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


def test_gate_kernel_applies_the_helper_elementwise():
    x = torch.randn(2, 70, 3, 12)  # T not a multiple of the block, K not a power of two: the masks matter
    assert torch.allclose(dc.gate_to_log_decay(stable_log_sigmoid, x), F.logsigmoid(x), atol=1e-6)
    w = dc.gate_to_log_decay(naive_log_of_gate, dc.saturated_activations())
    assert torch.isneginf(w).any()
    assert torch.isfinite(dc.gate_to_log_decay(stable_log_sigmoid, dc.saturated_activations())).all()


@triton.jit
def clamped_log_of_gate(x):
    return tl.log(tl.maximum(tl.sigmoid(x), 1e-30))  # finite, but capped near -69 where log(sigmoid(x)) ~ x


def _tiers(verdict) -> list[str]:
    return list(verdict.hints)


def test_check_log_decay_rejects_the_reported_gate_and_its_hints_start_from_the_positive_w():
    verdict = dc.check_log_decay(gate_as_reported)
    assert not verdict.passed
    text = str(verdict)
    assert text.startswith("NOT YET") and "ValueError" in text and "error inf" in text and "verdict.hint()" in text
    where, what, line = _tiers(verdict)
    assert "positive" in where and "exp(w)" in what and "tl.log(tl.sigmoid(x))" in line
    assert "tl.abs" not in "".join(_tiers(verdict))  # the stable form comes only after the naive one


def test_naive_log_of_gate_gets_hints_that_say_where_and_why_it_is_not_finite():
    """The naive log(sigmoid(x)) passes #11's randn x and fails only where fp32 rounds the sigmoid to 0: the hints
    name that range of x and the reason, and only the last tier gives the stable line."""
    verdict = dc.check_log_decay(naive_log_of_gate)
    assert not verdict.passed and "non-finite w on saturated x: 0 of" not in str(verdict)
    where, what, line = _tiers(verdict)
    lo, hi = (float(v) for v in where.split("from ")[1].split(" that")[0].split(" to "))
    assert lo == dc.SATURATED_X[0] and -90 < hi < -88  # exp(-x) overflows fp32 below x = -88.7 (interpreter)
    assert "every other x matches float64" in where
    assert "log(0) = -inf" in what and "88.7" in what and dc._LOG_DECAY_LINE not in where + what
    assert dc._LOG_DECAY_LINE in line
    assert _tiers(verdict) != _tiers(dc.check_log_decay(gate_as_reported))  # not the stub's hints


def test_a_clamped_log_is_finite_but_off_and_the_hint_says_where():
    verdict = dc.check_log_decay(clamped_log_of_gate)
    assert not verdict.passed and "non-finite w on saturated x: 0 of" in str(verdict)
    where, what, _ = _tiers(verdict)
    assert "finite but off" in where and "x = -200.00" in where and "clamp" in what


def test_check_log_decay_rejects_plain_python():
    assert not dc.check_log_decay(lambda x: x).passed


def test_check_log_decay_accepts_a_stable_log_sigmoid():
    verdict = dc.check_log_decay(stable_log_sigmoid)
    assert verdict.passed, str(verdict)
    assert str(verdict).startswith("PASS") and "accepted" in str(verdict)


def test_the_solution_line_in_the_hints_is_the_helper_that_passes():
    assert STABLE_SOURCE.strip().endswith(dc._LOG_DECAY_LINE)


# the exercise of #150: a, b as a learner might build them


def _unit(k):
    return F.normalize(k, dim=-1)


REMOVALS = {
    "reported": lambda k, a, b: (a, b),
    "same sign": lambda k, a, b: (_unit(k), _unit(k) * a),
    "unnormalised": lambda k, a, b: (-k, k * a),
    "zero": lambda k, a, b: (torch.zeros_like(a), torch.zeros_like(b)),
    "gate read": lambda k, a, b: (-_unit(k) * a, _unit(k)),
    "layer": lambda k, a, b: (-_unit(k), _unit(k) * a),
    "sign on b": lambda k, a, b: (_unit(k), -_unit(k) * a),
    "report negated": lambda k, a, b: (-a, b),  # removes, but along the report's vectors: no key
}


@pytest.fixture(scope="module")
def removal_verdicts():
    return {name: dc.check_removal(f) for name, f in REMOVALS.items()}


def test_check_removal_accepts_the_layers_step_in_either_sign_convention(removal_verdicts):
    for name in ("layer", "sign on b"):  # only b a^T enters the recurrence
        assert removal_verdicts[name].passed, str(removal_verdicts[name])


@pytest.mark.parametrize("name, where, what", [
    ("reported", "b . a > 0", "report's b"),
    ("same sign", "wrong sign", "minus sign"),
    ("unnormalised", "below -1", "normalised per head"),
    ("zero", "b . a = 0", "fraction a_gate"),
    ("gate read", "transpose", "scales b"),
])
def test_check_removal_hints_follow_the_mistake(removal_verdicts, name, where, what):
    verdict = removal_verdicts[name]
    assert not verdict.passed and str(verdict).startswith("NOT YET")
    tiers = _tiers(verdict)
    assert len(tiers) == 3 and where in tiers[0] and what in tiers[1], tiers
    assert "-kk, kk * a" in tiers[2] and not any("-kk, kk * a" in t for t in tiers[:2])


def test_a_removal_without_the_key_gets_a_hint_about_the_key_not_its_length(removal_verdicts):
    """(-a, b): b . a < -1 as for the unnormalised key, but the answer uses no key: the hint says so, instead of
    blaming the key's squared length."""
    verdict = removal_verdicts["report negated"]
    assert not verdict.passed and str(verdict).startswith("NOT YET")
    where, what, line = _tiers(verdict)
    assert "below -1" in where and "do not depend on k" in where
    assert "built from k" in what and "report's b" in what and "squared length" not in what
    assert line.startswith(dc._REMOVAL_LINE) and not any(dc._REMOVAL_LINE in t for t in (where, what))
    k, a, b = (torch.rand(1, 4, 1, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    assert not dc.uses_key(REMOVALS["report negated"], k, a, b, -a, b)
    assert dc.uses_key(REMOVALS["layer"], k, a, b, *REMOVALS["layer"](k, a, b))


def test_check_removal_rejects_a_key_normalised_over_the_heads_together():
    """k / k.norm(dim=(-2, -1)): the same as per head when H = 1 (#150's case), too short a key with two heads."""
    def over_heads(k, a, b):
        kk = k / k.norm(dim=(-2, -1), keepdim=True)
        return -kk, kk * a
    verdict = dc.check_removal(over_heads)
    assert not verdict.passed and str(verdict).startswith("NOT YET")
    bad = [line for line in verdict.facts if " > " in line]
    assert len(bad) == 1 and bad[0].startswith("with H = 2 heads")
    where, what, line = _tiers(verdict)
    assert "one head (H = 1)" in where and "per head" in what and "heads together" in what
    assert line.startswith(dc._REMOVAL_LINE)


def test_check_removal_facts_do_not_print_the_answer(removal_verdicts):
    text = str(removal_verdicts["reported"])
    assert "TransitionWarning" in text and "normalize" not in text and "kk" not in text


def test_probe_reads_b_dot_a_and_the_eigenvalues():
    x = dc.rwkv7_case(dc.RWKV7_CASES[0], T=16, K=8)
    probed = dc.probe(**x)
    ba = (x["a"] * x["b"]).sum(-1)
    assert probed.ba == pytest.approx((float(ba.min()), float(ba.max())))
    assert probed.radius == pytest.approx(float(dc.step_radii(x["w"], x["a"], x["b"]).max()))
    assert probed.radius > 1 and probed.state == pytest.approx(float(dc.rwkv7_state_trajectory(**x).max()))
    layer = dc.probe_removal(REMOVALS["layer"], widths=(8,), T=16)[0]
    assert layer.K == 8 and -1 < layer.ba[0] <= layer.ba[1] < 0 and layer.radius <= 1


def test_step_radii_are_the_contracts_transition_radius_per_step():
    from fla_lab.ops import contract

    x = dc.rwkv7_case(dc.RWKV7_CASES[0], T=6, K=8)
    radii = dc.step_radii(x["w"], x["a"], x["b"])
    for t in range(6):
        one = contract.transition_radius(x["w"][:, t:t + 1], x["a"][:, t:t + 1], x["b"][:, t:t + 1], samples=1)
        assert float(radii[t]) == pytest.approx(one, rel=1e-12)


def test_brief_verdict_stops_before_the_advice():
    x = dc.rwkv7_case(dc.RWKV7_CASES[0], T=16, K=16)
    from fla_lab import ops

    full, brief = dc.verdict(ops.chunk_rwkv7, **x), dc.verdict(ops.chunk_rwkv7, **x, brief=True)
    assert full.startswith(brief) and "RWKV7Attention" in full and "RWKV7Attention" not in brief
    assert brief.startswith("TransitionWarning")


def test_the_full_verdict_says_where_to_look_not_exercise_2s_line():
    """Without `brief`, #150's TransitionWarning says what is wrong (b . a, RWKV-7's layer builds a and b), but not
    the line: no kk, no normalize, no sign of a or b (issue 44); `transition_radius`'s docstring neither."""
    import inspect

    from fla_lab import ops
    from fla_lab.ops import contract

    full = dc.verdict(ops.chunk_rwkv7, **dc.rwkv7_case(dc.RWKV7_CASES[0], T=16, K=16))
    assert full.startswith("TransitionWarning") and "b . a in [-1, 0]" in full and "RWKV7Attention" in full
    for answer in ("kk", "normalize", "a = -", "-k", "a_gate"):
        assert answer not in full, answer
        assert answer not in inspect.getdoc(contract.transition_radius), answer


@pytest.fixture
def opened_exercises(monkeypatch):
    """A kernel in which no exercise has been solved or revealed yet (`exercises.is_open` keeps a set per
    process: tests that run a passing check open it for every later test)."""
    from fla_lab.teaching import exercises

    monkeypatch.setattr(exercises, "_OPENED", set())
    return exercises


@pytest.mark.parametrize("lines, expected", [
    ("decay_lines", "b_h = b_h * tl.exp(b_g)[:, None] + b_kv"),
    ("rwkv7_step_lines", "removed = "),
    ("removal_lines", "return -kk, kk * gate"),
])
def test_source_lines_point_at_the_shipped_code(lines, expected, opened_exercises):
    import importlib

    opened_exercises.record_open(dc.EXERCISE_REMOVAL)  # removal_lines: after a PASS or the last hint
    text = getattr(dc, lines)()
    assert expected in text
    for line in text.splitlines():
        where, code = line.split("  ", 1)
        path, number = where.rsplit(":", 1)
        module = importlib.import_module(path[:-3].replace("/", "."))
        import inspect

        from fla_lab.spec import markers

        source_line = inspect.getsource(module).splitlines()[int(number) - 1]
        assert markers.strip_line(source_line).strip() == code  # the shipped line, its markers not printed


def test_removal_lines_wait_for_a_pass_or_the_last_hint(opened_exercises):
    """`lesson.removal_lines()` prints the layer's lines that build a and b: exercise 2's answer. Before a PASS or
    the last hint tier it says when they show instead (issue 44); after either, it prints them."""
    closed = dc.removal_lines()
    assert "check_removal" in closed and "kk" not in closed and "attend" not in closed
    verdict = dc.check_removal(REMOVALS["reported"])
    for _ in verdict.hints[:-1]:
        verdict.hint()
    assert "kk" not in dc.removal_lines()  # two of three tiers: still closed
    verdict.hint()  # the last tier: the line
    assert "-kk, kk * gate" in dc.removal_lines()


def test_on_device_moves_tensors_in_containers_and_leaves_the_rest():
    from fla_lab import runtime

    moved = dc.on_device({"a": torch.ones(2), "b": [torch.zeros(1), 3], "c": "text"})
    assert moved["a"].device.type == runtime.device() and moved["b"][0].device.type == runtime.device()
    assert moved["b"][1] == 3 and moved["c"] == "text" and isinstance(moved["b"], list)


def test_the_solution_lines_are_sealed_out_of_tab_and_source():
    """Neither Tab (the public names), `??` (the module's source, docstrings included) nor a repr shows an answer;
    `harness.rwkv7_inputs`, which notebook 02 names before its exercise 2, does not give a and b either."""
    import inspect

    from fla_lab.teaching import exercises
    from fla_lab.spec import harness

    lines = (dc._LOG_DECAY_LINE, dc._REMOVAL_LINE)
    assert all(isinstance(line, exercises.Sealed) for line in lines)
    source = inspect.getsource(dc)
    for line in lines:
        assert line not in source and line not in repr(line)
        assert not any(getattr(dc, name) == line for name in dir(dc) if not name.startswith("_"))
    docs = "".join(inspect.getdoc(f) or "" for f in (dc, *(getattr(dc, n) for n in dir(dc) if not n.startswith("_"))))
    assert "kk * a" not in docs and "-kk" not in docs and "tl.minimum(x, 0.0)" not in docs
    assert "-kk" not in inspect.getdoc(harness.rwkv7_inputs) and "kk * a" not in inspect.getdoc(harness.rwkv7_inputs)
    assert "-kk, kk * a" not in source and "return -kk" not in source  # the check's reference runs the seal


def test_hint_tiers_that_state_a_fix_are_sealed(removal_verdicts):
    """Tier 2 (what is wrong) where it says what to write, and every tier 3, are Sealed: `??` on the lesson shows
    base64, not the fix in words (issue 44); the texts are still what `verdict.hint()` prints."""
    import inspect

    from fla_lab.teaching import exercises

    source = inspect.getsource(dc)
    fixes = {name: removal_verdicts[name].hints for name in ("reported", "same sign", "unnormalised", "gate read",
                                                             "report negated")}
    fixes["naive log"] = dc.check_log_decay(naive_log_of_gate).hints
    fixes["clamp"] = dc.check_log_decay(clamped_log_of_gate).hints
    for name, (where, what, line) in fixes.items():
        assert not isinstance(where, exercises.Sealed), name  # where to look: measured, plain
        assert isinstance(what, exercises.Sealed) and isinstance(line, exercises.Sealed), name
        assert what not in source and line not in source, name
    # the stub's last tier is the direct form, not the line: plain, since a Sealed last tier counts as the line
    # (printing it would open the fix without the learner having seen it)
    assert not isinstance(dc.check_log_decay(gate_as_reported).hints[2], exercises.Sealed)
    assert dc._removal_reference(torch.ones(1, 1, 1, 4), torch.full((1, 1, 1, 4), 0.5))[1].tolist() == \
        [[[[0.25] * 4]]]  # the sealed line, run: kk = 1/2 per channel, times the gate

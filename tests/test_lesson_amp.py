"""Notebook 05's module: the decays come from the layer's code, the bf16 bias has the sign and size the
functions report and grows with T, the long-context stand-in matches the kernel, the explorer is live."""
import math

import pytest
import torch

import fla_lab

from fla_lab.layers import init
from fla_lab.teaching.lessons import amp


def test_log_decays_are_the_layers_two_paths():
    x = torch.tensor([-8.0, -2.5, 0.0, 3.0])
    low, fixed = amp.log_decays(x, torch.bfloat16)
    xb = x.to(torch.bfloat16)
    # independent: bf16 sigmoid then bf16 product, against the fp32 sigmoid of the same bf16 input
    expected_low = (-math.exp(-0.5) * torch.sigmoid(xb)).double()
    expected_fixed = (-math.exp(-0.5) * torch.sigmoid(xb.float())).double()
    assert torch.equal(low, expected_low) and torch.equal(fixed, expected_fixed)
    assert not torch.equal(low, fixed)


def test_log_decays_follow_the_layer_switch(monkeypatch):
    from fla_lab.layers import rwkv7

    calls = []
    real = rwkv7.log_decay_from_lora
    monkeypatch.setattr(rwkv7, "log_decay_from_lora", lambda x, bug: calls.append(bug) or real(x, bug))
    amp.log_decays(torch.zeros(3))
    assert calls == ["bf16_decay", None]


def _log_decays_by_hand(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent of the package: -e^-0.5 * sigmoid in `dtype`, and the fp32 sigmoid of the same rounded input."""
    xd = x.to(dtype)
    return (-math.exp(-0.5) * torch.sigmoid(xd)).double(), (-math.exp(-0.5) * torch.sigmoid(xd.float())).double()


def test_rounding_stats_are_recomputed_and_vanish_in_fp32():
    stats = amp.rounding_stats()
    low, fixed = _log_decays_by_hand(amp.lora_grid(), torch.bfloat16)  # the same grid, computed here
    err = (low - fixed).abs()
    assert stats["max_abs"] == pytest.approx(float(err.max()), rel=1e-12)
    assert stats["mean_abs"] == pytest.approx(float(err.mean()), rel=1e-12)
    assert stats["max_rel"] == pytest.approx(float((err / fixed.abs()).max()), rel=1e-12)
    # closed-form bounds: two roundings (the sigmoid, the product) of at most half a bf16 ulp, i.e. the unit
    # roundoff 2^-8 relative, each; |w| < e^-0.5 bounds the absolute error
    assert 0 < stats["max_rel"] <= 2 * 2.0 ** -8 * 1.01
    assert 0 < stats["max_abs"] <= 2 * 2.0 ** -8 * math.exp(-0.5) * 1.01
    assert amp.rounding_stats(dtype=torch.float32)["max_abs"] == 0.0
    assert amp.rounding_stats(dtype=torch.float16)["max_abs"] < stats["max_abs"] / 4


@pytest.mark.parametrize("x, T", [(-8.0, 4096), (-6.0, 4096), (-4.0, 1024)])
def test_cumulative_decay_error_is_the_compounded_per_step_bias(x, T):
    rel, decay = amp.cumulative_decay(x, T)
    # closed form: the same per-step error b = w_bf16 - w_fp32 at every step, so exp(T w_bf16) / exp(T w_fp32) - 1
    # = expm1(T b), with b computed here from torch's own bf16 and fp32 sigmoids
    low, fixed = _log_decays_by_hand(torch.tensor([x]), torch.bfloat16)
    bias = float(low - fixed)
    assert bias != 0 and amp.per_step_bias(x) == pytest.approx(bias, rel=1e-12)
    assert float(rel) == pytest.approx(math.expm1(T * bias), rel=1e-9)
    assert math.copysign(1, float(rel)) == math.copysign(1, bias)
    # direct: the product of T equal bf16 and fp32 decays
    low, fixed = amp.log_decays(torch.tensor([x]))
    assert float(rel) == pytest.approx(math.exp(T * float(low)) / math.exp(T * float(fixed)) - 1, rel=1e-9)
    assert float(decay) == pytest.approx(math.exp(T * float(fixed)))


def test_the_bias_grows_linearly_with_T():
    T = torch.tensor([256, 512, 1024, 2048, 4096])
    rel, _ = amp.cumulative_decay(-8.0, T)
    ratios = (rel[1:] / rel[:-1]).tolist()
    assert all(1.99 < r < 2.01 for r in ratios)
    assert (rel > 0).all()  # x = -8 rounds towards a slower decay: the same sign at every T


def test_varying_lora_outputs_compound_only_their_mean_rounding():
    steady = amp.cumulative_decay_varying(-8.0, 0.0, 4096)
    assert float(steady[-1]) == pytest.approx(float(amp.cumulative_decay(-8.0, 4096)[0]), rel=1e-6)
    varied = amp.cumulative_decay_varying(-8.0, 1.0, 4096)
    assert abs(float(varied[-1])) < abs(float(steady[-1]))


def test_channel_decays_come_from_the_layer_at_init():
    d = amp.channel_decays(0, 128, torch.bfloat16)
    # independent of channel_decays: a fresh bf16 layer's decay LoRA at init has a zero down-projection, so its
    # output is the up-projection's bias w0 (the official init's vector, rounded to bf16) at every token
    layer = amp.decay_layer(128, 0)
    down, up = layer.w_lora.lora[0], layer.w_lora.lora[2]
    assert not down.weight.any()
    w0 = up.bias.detach()
    assert w0.dtype == torch.bfloat16
    assert torch.equal(w0, init.rwkv7_vectors(128, layer.head_dim, 0, amp.DEPTH)["w0"].to(torch.bfloat16))
    assert torch.equal(d["x"], w0.double()) and float(d["x"][0]) == -8.0  # official w0 starts at -8
    exact = -math.exp(-0.5) * torch.sigmoid(w0.double())  # float64 log-decay of the bf16 bias
    assert torch.allclose(d["fixed"], exact, rtol=1e-6, atol=0)  # fixed: an fp32 sigmoid
    expected_low = (-math.exp(-0.5) * torch.sigmoid(w0)).double()  # the bug: sigmoid and product in bf16
    assert torch.equal(d["low"], expected_low) and not torch.equal(d["low"], d["fixed"])
    rel, decay = amp.channel_cumulative_error(4096, 0, 128)
    assert torch.allclose(decay, torch.exp(4096 * exact), rtol=1e-3, atol=0)
    assert rel.shape == decay.shape == (128,)
    assert (decay[0] > 0.4) and abs(float(rel[0])) < 0.01


def test_long_context_stand_in_matches_the_kernel():
    kc = amp.kernel_check(T=32, hidden_size=64)
    assert kc["stand-in vs kernel, fixed"] < 2e-2 and kc["stand-in vs kernel, bug"] < 2e-2
    assert kc["bug - fixed, kernel"] > 0 and kc["bug - fixed, stand-in"] > 0
    assert amp.stand_in_agrees(kc)  # 20% under the interpreter, a factor of 2 with a GPU's bf16 tensor cores


def test_output_errors_cover_every_window():
    outs = amp.long_context_outputs(T=100, hidden_size=64)
    assert set(outs) == {"fp32", "bf16 fixed", "bf16 bug"} and outs["fp32"].shape == (100, 64)
    errors = amp.output_errors(outs)
    assert [t for t, _ in errors["bug - fixed (the decay's share)"]] == [16, 32, 64, 100]
    assert all(0 < e < 0.05 for rows in errors.values() for _, e in rows)
    assert amp.windows(100) == [(0, 16), (16, 32), (32, 64), (64, 100)]


def test_cpu_autocast_returns_bf16_for_every_op():
    # each op run here, not through autocast_dtypes: under CPU autocast the Linear casts its fp32 input to bf16
    # and every op after it keeps bf16 (CUDA autocast would give exp, softplus and log in fp32)
    ops = {"exp": torch.exp, "softplus": torch.nn.functional.softplus, "log": lambda t: torch.log(t.abs()),
           "sigmoid": torch.sigmoid, "tanh": torch.tanh, "mul by a constant": lambda t: -0.6065 * t}
    assert {"linear", *ops} == set(amp.AUTOCAST_OPS) == set(amp.CUDA_AUTOCAST_BF16)
    h, linear = torch.randn(4, 8), torch.nn.Linear(8, 8)
    assert linear(h).dtype == torch.float32  # outside autocast nothing is bf16: the bf16 below is autocast's
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = linear(h)
        ran = {"linear": x.dtype} | {name: op(x).dtype for name, op in ops.items()}
    assert ran == dict.fromkeys(amp.AUTOCAST_OPS, torch.bfloat16)
    assert amp.autocast_dtypes("cpu") == dict.fromkeys(amp.AUTOCAST_OPS, "bf16")  # the table the notebook prints


def test_official_form_equals_the_fixed_path():
    x = amp.lora_grid(-8, 4, 301).to(torch.bfloat16)
    assert torch.allclose(amp.log_decays(x)[1], amp.official_log_decay(x.float()), rtol=1e-6, atol=0)


def test_explorer_controls_drive_plot_decay_error(monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    calls = []
    monkeypatch.setattr(amp, "plot_decay_error", lambda channel, T, dtype: calls.append((channel, T, dtype)))
    ui = amp.decay_explorer()
    assert calls[-1] == (0, 4096, torch.bfloat16)
    dtype, T, channel = ui.children[:3]
    channel.value = 70
    assert calls[-1] == (70, 4096, torch.bfloat16)
    T.value = 256
    dtype.value = torch.float16
    assert calls[-1] == (70, 256, torch.float16)


def test_plot_decay_error_runs_for_every_dtype():
    import matplotlib
    matplotlib.use("Agg")
    for dtype in amp.SIGMOID_DTYPES.values():
        fig = amp.plot_decay_error(channel=3, T=512, dtype=dtype, hidden_size=128)
        assert "channel 3" in fig.axes[1].get_title()


def test_amp_step_on_the_chunked_layer_feeds_the_kernel_an_fp32_decay_only_when_fixed():
    cmp = amp.amp_step_comparison(T=48)
    assert cmp["fixed"].dtypes["w"] == "fp32" and cmp["bug"].dtypes["w"] == "bf16"
    assert {cmp["fixed"].dtypes[n] for n in "rkvab"} == {"bf16"}
    assert cmp["fixed"].finite and cmp["bug"].finite
    assert 0 < cmp["w bias max"] <= 2 ** -7
    assert all(0 < drift < 1e-2 for _, drift in cmp["output drift"])


def test_debug_in_fp32_separates_precision_from_range_bugs():
    verdicts = amp.debug_in_fp32()
    assert verdicts["#181 bf16 decay, the buggy line in fp32"].endswith("gone")
    assert "non-finite" in verdicts["#77 exclusive reference, fp32, decay 100"]
    assert "non-finite" in verdicts["#150 a, b ~ rand, fp32"]


def _buggy_decay(w_raw):
    return -math.exp(-0.5) * w_raw.sigmoid()  # the stub: bug="bf16_decay"


def _fp32_decay(w_raw):
    return -math.exp(-0.5) * w_raw.float().sigmoid()  # the solution: upcast before the sigmoid


def _late_cast_decay(w_raw):
    return (-math.exp(-0.5) * w_raw.sigmoid()).float()  # fp32 dtype, bf16 values


def test_check_log_decay_rejects_the_buggy_line_and_accepts_the_fp32_one():
    stub, late, fixed = (amp.check_log_decay(f, T=16) for f in (_buggy_decay, _late_cast_decay, _fp32_decay))
    assert not stub and "w is bf16" in str(stub) and "receives w as bf16" in str(stub)
    assert not late and "w is fp32" in str(late) and "before the first op that rounds" in late.hints[1]
    assert fixed and str(fixed).startswith("PASS") and "receives w as fp32" in str(fixed) and not fixed.hints
    # tiers follow the mistake: where (the ops that round, from the trace), what, the line
    assert "(sigmoid, mul)" in stub.hints[0] and "sigmoid is on neither" in stub.hints[1]
    assert stub.hints[2] == late.hints[2] == amp._LINE


def _official_formula_decay(w_raw):
    return -torch.exp(-torch.nn.functional.softplus(-w_raw) - 0.5)  # the official formula, no explicit cast


def test_check_log_decay_tells_other_bf16_roundings_from_the_sigmoids():
    x = amp.lora_grid(-8, 4, 101).to(torch.bfloat16)
    assert amp.rounded_like_the_sigmoid_line(_buggy_decay(x), x, "cpu")
    assert amp.rounded_like_the_sigmoid_line(_late_cast_decay(x), x, "cpu")
    assert not amp.rounded_like_the_sigmoid_line(_fp32_decay(x), x, "cpu")
    verdict = amp.check_log_decay(_official_formula_decay, T=16)
    if fla_lab.device() == "cuda":  # CUDA autocast runs softplus and exp in fp32: the official formula is right there
        assert verdict.passed
        return
    assert str(verdict).startswith("NOT YET") and "not by the historical line" in verdict.hints[1]
    assert "softplus" in verdict.hints[0] and "exp" in verdict.hints[0] and "sigmoid" not in verdict.hints[0]


def test_check_log_decay_reports_a_refused_dtype_instead_of_raising():
    verdict = amp.check_log_decay(lambda w_raw: -math.exp(-0.5) * w_raw.double().sigmoid(), T=16)
    assert not verdict and "TypeError" in str(verdict)


def test_decay_errors_measure_the_bf16_rounding_against_float64():
    x = amp.lora_grid(-8, 4, 4001).to(torch.bfloat16)
    bug = amp.decay_errors(_buggy_decay(x), x)
    assert 4e-3 < bug["max"] <= 2 * 2.0 ** -8 and 1e-3 < bug["mean"] < bug["max"]
    assert amp.decay_errors(_fp32_decay(x), x)["max"] < 1e-6


def test_amp_step_plugs_a_decay_line_into_the_layer():
    ref = amp.amp_step(None, T=16)
    plugged = amp.amp_step(None, T=16, log_decay=_fp32_decay)
    assert torch.equal(plugged.w, ref.w) and torch.equal(plugged.output, ref.output)
    assert ref.lora.dtype == torch.bfloat16 and ref.lora.shape == (1, 16, 64)
    assert amp.amp_step(None, T=16, log_decay=_buggy_decay).dtypes["w"] == "bf16"


def test_trace_dtypes_gives_cpu_autocast_live_and_cuda_autocast_by_its_op_lists():
    """The tool of the exercise: the historical line rounds at the sigmoid on both devices; the official formula
    only under CPU autocast (CUDA lists softplus and exp as fp32 ops, and what follows them stays fp32)."""
    historical = amp.trace_dtypes(_buggy_decay)
    assert historical == [("linear", "bf16", "bf16"), ("sigmoid", "bf16", "bf16"), ("mul", "bf16", "bf16")]
    official = amp.trace_dtypes(_official_formula_decay)
    assert [name for name, _, _ in official] == ["linear", "neg", "softplus", "neg", "sub", "exp", "neg"]
    assert all(cpu == "bf16" for _, cpu, _ in official)
    assert [cuda for _, _, cuda in official] == ["bf16", "bf16", "fp32", "fp32", "fp32", "fp32", "fp32"]
    assert amp.trace_dtypes(_fp32_decay)[1:] == [("float", "fp32", "fp32"), ("sigmoid", "fp32", "fp32"),
                                                 ("mul", "fp32", "fp32")]
    # the op lists agree with what was measured on an H200 for every op the measurement covers
    for op in ("exp", "softplus", "log", "sigmoid", "tanh"):
        assert amp._cuda_rule(op, [torch.bfloat16], torch.bfloat16) == {"fp32": torch.float32, "bf16": torch.bfloat16}[
            amp.CUDA_AUTOCAST_BF16[op]]


def _wrong_constant_decay(w_raw):
    return -0.6 * w_raw.float().sigmoid()  # fp32, nothing rounded, but the scale is not e^-0.5


def _flipped_sign_decay(w_raw):
    return math.exp(-0.5) * w_raw.float().sigmoid()  # fp32, a positive "log-decay"


def test_a_wrong_constant_gets_hints_about_the_value_not_the_rounding():
    verdict = amp.check_log_decay(_wrong_constant_decay, T=16)
    assert str(verdict).startswith("NOT YET") and "w is fp32" in str(verdict)
    where, what, line = verdict.hints
    assert "value error, not a rounding one" in where and "same factor" in where and "0.98923" in where
    assert "e^-0.5" in what and "math.exp(-0.5)" in what
    assert not any(word in where + what for word in ("softplus", "autocast", "show_dtypes"))
    assert line == amp._LINE


def test_a_flipped_sign_gets_hints_about_the_sign_of_a_log_decay():
    verdict = amp.check_log_decay(_flipped_sign_decay, T=16)
    assert str(verdict).startswith("NOT YET") and "w is fp32" in str(verdict)
    where, what, line = verdict.hints
    assert "positive" in where and "value error, not a rounding one" in where
    assert "w <= 0" in what and "sign" in what and "exp(w)" in what
    assert not any(word in where + what for word in ("softplus", "autocast", "show_dtypes"))
    assert line == amp._LINE


def test_rounding_mistakes_keep_their_rounding_hints():
    """The value check does not take over the bf16 cases: the stub and a late cast still get the trace."""
    x = amp.lora_grid(-8, 4, 4001).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        for line in (_buggy_decay, _late_cast_decay, _official_formula_decay):
            w = line(x)
            rounded = [n for n, got, _ in amp.trace_dtypes(line, "cpu")[1:] if got == "bf16"]
            assert amp.value_hints(w, x, rounded) == ()


def test_the_solution_line_is_sealed_out_of_tab_and_source():
    import inspect

    from fla_lab.teaching import exercises

    assert isinstance(amp._LINE, exercises.Sealed) and amp._LINE == "return -math.exp(-0.5) * w_raw.float().sigmoid()"
    assert amp._LINE not in inspect.getsource(amp) and amp._LINE not in repr(amp._LINE)
    assert not any(getattr(amp, name) == amp._LINE for name in dir(amp) if not name.startswith("_"))
    assert "upcast" not in (amp.__doc__ or "") and "fp32 first" not in (amp.__doc__ or "")


def test_the_layers_decay_line_is_not_one_name_away():
    """`amp.log_decay_from_lora??` showed the shipped fix (issue 44): amp no longer holds that name, no public
    callable of amp has the fix in its source, and neither the layer function's docstring nor the layer's (help
    on `RWKV7Attention`, which notebook 05 imports) says in words that the fix computes in fp32."""
    import inspect

    from fla_lab.layers import rwkv7

    assert not hasattr(amp, "log_decay_from_lora")
    fix = "float().sigmoid()"
    for name in dir(amp):
        value = getattr(amp, name)
        if not name.startswith("_") and callable(value) and getattr(value, "__module__", "").startswith("fla_lab"):
            assert fix not in inspect.getsource(value), name
    assert fix not in inspect.getsource(amp)
    assert "fp32" not in inspect.getdoc(rwkv7.log_decay_from_lora)
    for doc in (inspect.getdoc(rwkv7.log_decay_from_lora), inspect.getdoc(amp.RWKV7Attention.attend)):
        assert "fix of #181" not in doc and "w as computed (fp32" not in doc
    x = amp.lora_grid(-8, 4, 101).to(torch.bfloat16)
    buggy, fixed = amp.log_decays(x)  # still the layer's own two lines
    assert torch.equal(fixed, rwkv7.log_decay_from_lora(x).double()) and not torch.equal(buggy, fixed)


def test_tiers_that_say_where_the_cast_goes_are_sealed():
    """The tier after a late cast says where the cast has to go: Sealed, so `amp??` shows base64 there (issue 44);
    `verdict.hint()` prints it as before."""
    import inspect

    from fla_lab.teaching import exercises

    late = amp.check_log_decay(_late_cast_decay, T=16)
    in_float64 = amp.check_log_decay(lambda w_raw: _fp32_decay(w_raw).double(), T=16)  # right values, float64
    assert "the dtype of w" in in_float64.hints[0]
    assert isinstance(late.hints[1], exercises.Sealed) and late.hints[1] not in inspect.getsource(amp)
    # right values in another dtype: two tiers, no line; plain, since a Sealed last tier counts as the line
    assert len(in_float64.hints) == 2 and not isinstance(in_float64.hints[-1], exercises.Sealed)


def test_the_module_docstring_names_no_function_whose_source_is_the_fix():
    """`amp?` (issue 44): the docstring pointed at the layer's decay function as "the fixed path"."""
    for name in ("log_decay_from_lora", "RWKV7Attention.log_decay", "fixed path"):
        assert name not in amp.__doc__
        assert name not in (amp.log_decays.__doc__ or "") and name not in (amp.amp_step.__doc__ or "")

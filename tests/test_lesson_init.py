"""Notebook 01's module: the census finds exactly #150's garbage, the trace is the real forward pass, the
init figures' quantities are right, and the explorer drives the package function."""
import math

import pytest
import torch

from fla_lab.layers import init as official
from fla_lab.teaching.lessons import init as lesson

# The tensors upstream created with torch.empty, as the catalogue entry "uninitialized_params" names them
# (x_x, k_k, k_a, r_k; x_x is [6, C]: x_r, x_w, x_k, x_v, x_a, x_g).
EMPTY_UPSTREAM = {"x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "k_k", "k_a", "r_k"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_census_finds_exactly_the_uninitialised_parameters(dtype):
    rows = lesson.parameter_census(lesson.reported_layer(hidden_size=64, dtype=dtype))
    assert {r.name for r in rows if r.garbage} == EMPTY_UPSTREAM
    assert set(lesson.vector_parameters()) == EMPTY_UPSTREAM


def test_census_counts_match_a_direct_count():
    layer = lesson.reported_layer(hidden_size=128, dtype=torch.float32)
    for row in lesson.parameter_census(layer):
        p = layer.get_parameter(row.name).detach()
        assert row.nonfinite == int((~torch.isfinite(p)).sum())
        assert row.huge == sum(1 for v in p.flatten().tolist() if math.isfinite(v) and abs(v) > lesson.HUGE)
        assert row.total == p.numel() and row.shape == tuple(p.shape)
    assert sum(r.nonfinite for r in lesson.parameter_census(layer)) > 0  # the seeded garbage holds NaN/inf


def test_official_layer_has_no_garbage_and_matches_the_formulas():
    layer = lesson.official_layer(hidden_size=128, dtype=torch.float32)
    assert not any(r.garbage for r in lesson.parameter_census(layer))
    assert max(lesson.init_mismatch(layer).values()) == 0.0
    with torch.no_grad():
        layer.k_k[3] += 0.5
    assert lesson.init_mismatch(layer)["k_k"] == pytest.approx(0.5)


def test_apply_visits_every_module_and_no_parameter():
    layer = lesson.reported_layer(hidden_size=64)
    visits = lesson.apply_visits(layer)
    assert len(visits) == len(list(layer.modules()))
    assert visits[-1] == ("(the layer itself)", "RWKV7Attention")  # children first, the module itself last
    assert all(kind != "Parameter" for _, kind in visits)
    assert layer.legacy_parameter_branch_runs == 0
    assert lesson.parameter_owners(layer, ("x_r", "w_lora.lora.2.bias")) == {"x_r": "RWKV7Attention",
                                                                             "w_lora.lora.2.bias": "Linear"}


def test_trace_is_the_real_forward_and_leaves_the_layer_untouched():
    layer = lesson.open_output(lesson.official_layer(hidden_size=64, dtype=torch.float32))
    x = lesson.layer_input(T=8, hidden_size=64, dtype=torch.float32)
    stages = lesson.trace(layer, x)
    assert list(stages)[0] == "input x" and list(stages)[-1] == "output"
    assert torch.equal(stages["output"], layer(x)[0].detach())
    assert "log_decay" not in vars(layer) and layer.attention_op is None
    assert not any(m._forward_hooks for m in layer.modules())
    # the decay really is the layer's: -e^-0.5 * sigmoid(w0) at init (the LoRA's down-projection is 0)
    w0 = layer.w_lora.lora[2].bias.detach()
    assert torch.allclose(stages["log-decay w"][0, 0], -math.exp(-0.5) * torch.sigmoid(w0))


@pytest.mark.parametrize("names, first", [((), None), (("x_r",), "mix x_r"), (("k_k",), "a, into the kernel"),
                                          (("k_a",), "k after k_a"), (("r_k",), None)])
def test_first_nonfinite_stage(names, first):
    # (which stage turns non-finite first depends on the garbage drawn: these are the notebook's sizes)
    layer = lesson.layer_with_uninitialized(names, torch.float32, hidden_size=128)
    stages = lesson.trace(layer, lesson.layer_input(T=4, hidden_size=128, dtype=torch.float32))
    assert lesson.first_nonfinite(stages) == first
    if names == ("r_k",):  # finite, but garbage
        assert lesson.huge_fraction(stages["output"]) == 1.0


def test_layer_with_uninitialized_takes_the_bug_layers_garbage():
    garbage = lesson.reported_layer(hidden_size=64, dtype=torch.float32)
    layer = lesson.layer_with_uninitialized(("x_g", "r_k"), torch.float32, hidden_size=64)
    vec = official.rwkv7_vectors(64, 64, 0, lesson.DEPTH)
    assert torch.equal(layer.x_g, garbage.x_g) and torch.equal(layer.r_k, garbage.r_k)
    assert torch.equal(layer.x_r.cpu().flatten(), vec["x_r"]) and torch.equal(layer.k_k.cpu(), vec["k_k"])
    assert layer.o_proj.weight.abs().sum() > 0  # opened, so garbage can reach the output
    with pytest.raises(ValueError, match="uninitialised upstream"):
        lesson.layer_with_uninitialized(("o_proj.weight",))


def test_half_life_and_decay():
    w0 = torch.tensor([-8.0, 0.0, 3.0])
    hl = lesson.half_life(w0)
    assert torch.allclose(lesson.decay_per_step(w0) ** hl, torch.full((3,), 0.5, dtype=torch.float64))
    # closed form at w0 = -8: ln 2 / (e^-0.5 * sigmoid(-8)) = ln 2 * e^0.5 * (1 + e^8), about 3408 steps
    assert float(hl[0]) == pytest.approx(math.log(2) * math.exp(0.5) * (1 + math.exp(8)), rel=1e-9)
    # and -8 is where the official init starts: its slowest channel, w0[0] = -6 + 0.5 - 2.5 (zigzag = -1)
    w0_official = official.rwkv7_vectors(64, 64, 0, lesson.DEPTH)["w0"]
    assert float(w0_official[0]) == -8.0 and float(w0_official.min()) == -8.0
    assert (lesson.decay_per_step(w0) > math.exp(-math.exp(-0.5))).all()  # official range (0.545, 1)


def test_reported_layer_is_all_nan_and_fixed_layer_is_finite_with_gradients():
    x = lesson.layer_input(T=8, hidden_size=64, dtype=torch.bfloat16)
    o, *_ = lesson.reported_layer(hidden_size=64)(x)
    assert torch.isnan(o).all()
    result = lesson.forward_backward_census(lesson.open_output(lesson.official_layer(hidden_size=64)), x)
    assert all(c.count == 0 for c in result.values())
    assert {"output", "d input", "d x_r", "d w_lora.lora.0.weight"} <= set(result)


def test_explorer_controls_drive_plot_trace(monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    calls = []
    monkeypatch.setattr(lesson, "plot_trace", lambda names, dtype: calls.append((tuple(names), dtype)))
    ui = lesson.trace_explorer()
    assert calls[-1] == (lesson.vector_parameters(), torch.bfloat16)
    names, dtype = ui.children[0], ui.children[1]
    names.value = ("k_k",)
    assert calls[-1] == (("k_k",), torch.bfloat16)
    dtype.value = torch.float32
    assert calls[-1] == (("k_k",), torch.float32)


def test_plot_trace_draws_one_bar_per_stage():
    import matplotlib
    matplotlib.use("Agg")
    fig = lesson.plot_trace(("k_a",), torch.float32, hidden_size=64, T=4)
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == len(ax.patches) // 2
    assert "k_a" in ax.get_title()


# ---------------------------------------------------------------- the exercise: the learner writes the skipped init

@torch.no_grad()
def historical_init(layer):
    """The notebook's stub: the routine before d49c52f6, whose nn.Parameter branch Module.apply never reaches."""
    def init(module):
        if isinstance(module, torch.nn.Parameter):
            torch.nn.init.xavier_uniform_(module, gain=2 ** -2.5)
    layer.apply(init)


def official_init(names=None, depth_aware=True, recurse=False):
    """The notebook's solution (the layer's own vectors from `rwkv7_vectors`), or one of its usual mistakes: only
    some of the nine, the depth left out, every parameter of the layer (recurse=True)."""
    @torch.no_grad()
    def init(layer):
        l, L = (layer.layer_idx, layer.num_hidden_layers) if depth_aware else (0, lesson.DEPTH)
        vec = official.rwkv7_vectors(layer.hidden_size, layer.head_dim, l, L)
        for name, p in layer.named_parameters(recurse=recurse):
            if names is None or name in names:
                p.copy_(vec[name].view_as(p))
    return init


def formula_init(k_k_ramp_to_last_channel=True):
    """The nine written from the formulas by hand, in fp32 (a few ulps from the fixed path is a pass)."""
    @torch.no_grad()
    def init(layer):
        C, l, L = layer.hidden_size, layer.layer_idx, layer.num_hidden_layers
        c = torch.arange(C, dtype=torch.float32)
        rho1 = 1 - l / L
        for name, power in {"x_r": 0.2, "x_w": 0.9, "x_k": 0.7, "x_v": 0.7, "x_a": 0.9, "x_g": 0.2}.items():
            getattr(layer, name).copy_((1 - (c / C) ** (power * rho1)).view(1, 1, C))
        layer.k_k.copy_(0.71 - 0.1 * (c / ((C - 1) if k_k_ramp_to_last_channel else C) - 0.5))
        layer.k_a.fill_(1.02)
        layer.r_k.fill_(-0.04)
    return init


def failing(verdict):
    return [line for line in verdict.facts if " > " in line]


def test_check_rejects_the_historical_init_and_its_hints_explain_apply():
    verdict = lesson.check_initialisation(historical_init)
    assert not verdict.passed and str(verdict).startswith("NOT YET")
    text = str(verdict)
    assert "output vs float64: error nan" in text and "the 31 other parameters" in text and "verdict.hint()" in text
    where, what, line = verdict.hints
    assert "apply_visits" in where and "nothing your function ran changed" in where
    assert "never on a parameter" in what and "RWKV7Attention" in what
    assert "named_parameters(recurse=False)" in line and "layer.layer_idx" in line


def test_the_solution_passes_exactly():
    verdict = lesson.check_initialisation(official_init())
    assert verdict.passed, str(verdict)
    assert "49 of 49" in str(verdict) and "31 of 31" in str(verdict)
    assert all("error 0.0e+00 <=" in line for line in verdict.facts[:9])


def test_check_accepts_the_formulas_in_fp32():
    verdict = lesson.check_initialisation(formula_init())
    assert verdict.passed, str(verdict)


def test_a_partial_fix_is_told_which_vectors_still_hold_garbage():
    verdict = lesson.check_initialisation(official_init(names=set(lesson.MIX_POWERS)))
    assert not verdict.passed
    assert {line.split()[0] for line in failing(verdict)} >= {"k_k", "k_a", "r_k"}
    assert verdict.hints[0] == "k_k, k_a, r_k still hold the garbage"
    assert "recurse=False" in verdict.hints[1]


def test_check_rejects_an_init_that_ignores_the_depth():
    verdict = lesson.check_initialisation(official_init(depth_aware=False))
    assert not verdict.passed
    bad = failing(verdict)
    assert bad and all(line.startswith(("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")) for line in bad)
    # per layer: right at layer 0 (rho1 = 1 there), wrong at layer 7, and the hints say it is the depth
    assert all("<=" in line.split(";")[0] and " > " in line.split(";")[1] for line in bad)
    assert "right at layer 0 and wrong at layer 7" in verdict.hints[0] and "rho1" in verdict.hints[1]


def test_check_points_at_k_k_when_only_k_k_is_off():
    # c/C instead of c/(C-1): off by 0.1 / C at the last channel, at both layers
    verdict = lesson.check_initialisation(formula_init(k_k_ramp_to_last_channel=False))
    bad = failing(verdict)
    assert len(bad) == 1 and bad[0].startswith("k_k") and "error 7.8e-04 >" in bad[0]
    assert verdict.hints[0].startswith("k_k") and "C-1" in verdict.hints[1]


@pytest.mark.parametrize("init", ["reset_official", "recursive"])
def test_check_rejects_replacing_the_other_weights(init):
    # the fixed path's own reset sets the nine right but also replaces the other weights: not what was asked
    candidate = ((lambda layer: layer.reset_official(layer.num_hidden_layers)) if init == "reset_official"
                 else official_init(recurse=True))
    verdict = lesson.check_initialisation(candidate)
    assert not verdict.passed
    if init == "recursive":  # rwkv7_vectors has no r_proj.weight: the check reports the KeyError, no traceback
        assert "raised KeyError" in verdict.facts[0] and "submodules" in verdict.hints[1]
        return
    bad = [line for line in verdict.facts if " > " in line or line.endswith(" of 31")]
    assert len(bad) == 1 and "other parameters" in bad[0] and not bad[0].endswith("31 of 31")
    assert "besides the nine changed" in verdict.hints[0] and "r_proj.weight" in verdict.hints[0]


def test_zeros_are_finite_but_not_the_official_init():
    verdict = lesson.check_initialisation(torch.no_grad()(
        lambda layer: [p.zero_() for p in layer.parameters(recurse=False)]))
    assert not verdict.passed
    assert "output vs float64: error" in str(verdict) and "49 of 49" in str(verdict)
    assert verdict.hints[0] == "the nine are zeros at every layer checked"


def test_the_routines_own_formula_on_the_vectors_raises_and_is_reported():
    @torch.no_grad()
    def xavier(layer):
        for p in layer.parameters(recurse=False):
            torch.nn.init.xavier_uniform_(p, gain=2 ** -2.5)
    verdict = lesson.check_initialisation(xavier)
    assert not verdict.passed and "raised ValueError" in verdict.facts[0]
    assert "xavier_uniform_" in verdict.hints[1] and len(verdict.hints) == 3


def test_check_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    lesson.exercise_layer(0, 64)
    lesson.fixed_path_vectors(0, 64)
    assert torch.equal(torch.rand(3), expected)


def test_the_skipped_parameters_are_the_layers_own():
    """What the solution relies on: the nine are exactly the parameters registered on the layer itself."""
    layer = lesson.exercise_layer(7, 64)
    assert {name for name, _ in layer.named_parameters(recurse=False)} == EMPTY_UPSTREAM


def test_float64_twin_is_exact_for_the_same_weights():
    layer = lesson.exercise_layer(0, 64)
    official_init()(layer)
    twin = lesson.float64_twin(layer)
    assert twin.x_r.dtype == torch.float64 and layer.x_r.dtype == torch.float32
    x = lesson.layer_input(T=4, hidden_size=64, dtype=torch.float64, B=1)
    o, grads = lesson.forward_backward(twin, x)
    o_ref, _ = lesson.forward_backward(twin, x)
    assert torch.equal(o, o_ref) and set(grads) == {"input", *dict(layer.named_parameters())}


def hard_coded_init(C=128, N=64, L=12):
    """The solution with the notebook's sizes written in as numbers (None: read from the layer)."""
    @torch.no_grad()
    def init(layer):
        vec = official.rwkv7_vectors(C or layer.hidden_size, N or layer.head_dim, layer.layer_idx,
                                     L or layer.num_hidden_layers)
        for name, p in layer.named_parameters(recurse=False):
            p.copy_(vec[name].view_as(p))
    return init


def test_check_rejects_the_notebooks_sizes_written_as_numbers():
    # rwkv7_vectors(128, 64, layer.layer_idx, 12): right at C = 128 with 12 layers, raises on the layer of other sizes
    verdict = lesson.check_initialisation(hard_coded_init())
    assert not verdict.passed and str(verdict).startswith("NOT YET")
    assert "layer 5 of 24 (C=64)" in verdict.facts[0] and "raised RuntimeError" in verdict.facts[0]
    assert "layer 5 of 24 (C=64)" in verdict.hints[0] and "layer.hidden_size" in verdict.hints[1]


def test_check_rejects_a_layer_count_written_as_a_number():
    # the width read from the layer, the depth written in: wrong only at the layer of another depth
    verdict = lesson.check_initialisation(hard_coded_init(C=None, N=None))
    assert not verdict.passed
    bad = failing(verdict)
    assert bad and all(line.startswith(("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")) for line in bad)
    assert all(" > " in line.split(";")[2] and " > " not in line.split(";")[0] + line.split(";")[1] for line in bad)
    assert "wrong at layer 5 of 24 (C=64)" in verdict.hints[0] and "num_hidden_layers" in verdict.hints[1]

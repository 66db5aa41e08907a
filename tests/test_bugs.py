"""The catalogue is real: every entry points at its switch and has a reproduction that runs.

A reproduction is a pair of functions in REPRODUCTIONS, keyed by the catalogue name:
- trigger(): runs the real op or layer with `bug=name` under the entry's trigger and asserts its symptom;
- control(): runs the same call with `bug=None` (the fix) and asserts the fixed behaviour, and where meaningful
  the buggy switch without the trigger, which must behave like the fix.
A catalogue entry without a reproduction fails `test_entry_has_a_reproduction`.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
import pathlib

import pytest
import torch

import fla_lab
from fla_lab.teaching import bugs
from fla_lab.spec import check, harness, markers, reference
from fla_lab import ops
from fla_lab.layers import RWKV6Attention, RWKV7Attention
from fla_lab.ops import chunk_rwkv6, fused_recurrent_rwkv6

DEV = fla_lab.device()
RWKV6_NAMES = ("r", "k", "v", "w")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def spy_op(name: str):
    """Wrap `fla_lab.ops.<name>` (the layers look their op up at call time) and record every call: the bound
    arguments by parameter name, and what the op returned. The real op still runs."""
    real = getattr(ops, name)
    calls = []

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append((inspect.signature(real).bind(*args, **kwargs).arguments, out))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, name, spy)
        yield calls


@torch.no_grad()
def open_output(layer: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The official init zeroes the output projection; give it random weights (as training would), so that
    whatever the attention computes reaches the layer's output."""
    w = layer.o_proj.weight
    w.copy_(torch.randn(w.shape, generator=gen(seed)) / math.sqrt(w.shape[1]))
    return layer


# ---------------------------------------------------------------------------------------------------------
# uninitialized_params (RWKV7Attention, upstream #150): torch.empty parameters that the init never visits

RWKV7_SMALL = dict(hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2)


def _rwkv7_output(bug):
    """#150's call at a CPU-friendly size (mode "chunk", layer 0) on the real kernel, output projection opened."""
    layer = open_output(RWKV7Attention("chunk", bug=bug, **RWKV7_SMALL)).to(DEV)
    with torch.no_grad():
        return layer, layer(torch.randn(2, 16, 64, generator=gen(5)).to(DEV))[0]


def uninitialized_params_trigger():
    layer, out = _rwkv7_output("uninitialized_params")
    garbage = torch.cat([getattr(layer, n).detach().flatten() for n in (*RWKV7Attention.MIX, "k_k", "k_a", "r_k")])
    assert (~torch.isfinite(garbage)).any() or garbage.abs().max() > 1e30  # what the memory held, kept
    assert (~torch.isfinite(out)).all(), f"expected an all-NaN output: {check.nonfinite_census(out)}"


def uninitialized_params_control():
    layer, out = _rwkv7_output(None)
    assert all(torch.isfinite(p).all() for p in layer.parameters())
    assert torch.isfinite(out).all() and out.abs().sum() > 0, check.nonfinite_census(out)


# ---------------------------------------------------------------------------------------------------------
# sigmoid_decay (RWKV6Attention, upstream #11): a decay in (0, 1) passed where the kernel expects its log


def _rwkv6_sigmoid_run(bug):
    """RWKV6Attention at its official init on the real fused recurrent kernel, T = 360 (at init sigmoid(w_raw) is
    at most ~0.27, so the state needs a few hundred steps to pass fp32's range). Returns the layer output, the
    kernel's inputs and output, and the kernel's input gradients under a random cotangent on its output."""
    T, C = 360, 16
    torch.manual_seed(0)  # the official init draws a few matrices uniformly
    layer = RWKV6Attention("fused_recurrent", hidden_size=C, num_heads=1, expand_k=1.0, layer_idx=0,
                           num_hidden_layers=2, bug=bug).to(DEV)
    with spy_op("fused_recurrent_rwkv6") as calls:
        out = layer(torch.randn(1, T, C, generator=gen(10)).to(DEV))[0]
    (args, (o, _)), = calls
    do = torch.randn(o.shape, generator=gen(1)).to(o)
    grads = dict(zip("rkvwu", torch.autograd.grad(o, [args[n] for n in ("r", "k", "v", "w", "u")], do)))
    return out.detach(), args, o.detach(), grads


def sigmoid_decay_trigger():
    out, args, o, grads = _rwkv6_sigmoid_run("sigmoid_decay")
    assert (args["w"] > 0).all()  # the kernel received a positive "log-decay": every step grows the state
    assert not torch.isfinite(out).all() and not torch.isfinite(o).all()
    for name in "rkvw":
        assert not torch.isfinite(grads[name]).all(), f"d{name} stayed finite"
    assert torch.isfinite(grads["u"]).all(), check.nonfinite_census(grads["u"])  # du: the bonus path only


def sigmoid_decay_control():
    out, args, o, grads = _rwkv6_sigmoid_run(None)
    assert (args["w"] <= 0).all()
    assert torch.isfinite(out).all() and torch.isfinite(o).all()
    assert all(torch.isfinite(g).all() for g in grads.values())


# ---------------------------------------------------------------------------------------------------------
# exclusive_reference (chunk_rwkv6, upstream #77): the inclusive reference row of the sub-chunk factorisation


def _chunk_rwkv6_run(decay, bug, T=80, chunk_size=32):
    """harness.compare of chunk_rwkv6 against the float64 reference; also the kernel's output and dq."""
    x = harness.gated_inputs(1, T, 2, 32, 16, decay=decay, initial_state=True, bonus=True, seed=7,
                             names=RWKV6_NAMES)
    op = functools.partial(chunk_rwkv6, chunk_size=chunk_size, bug=bug)
    leaves = {}

    def capture(**kw):  # keep the leaf r, whose .grad is dq once harness.compare has run backward
        leaves["r"] = kw["r"]
        return op(**kw)

    result = harness.compare(capture, reference.recurrent_rwkv6, x)
    return result, result.outputs["o"], leaves["r"].grad


STRONG_DECAYS = (100.0, 1e4)  # per-step log-decay -m * U(0.05, 1): beyond -90 on some rows for both


def exclusive_reference_trigger():
    for decay in STRONG_DECAYS:
        result, o, dq = _chunk_rwkv6_run(decay, "exclusive_reference")
        o_census, dq_census = check.nonfinite_census(o), check.nonfinite_census(dq)
        assert o_census.count > 0 and dq_census.count > 0, f"decay {decay}: o {o_census}, dq {dq_census}"
        # the first NaN is on the first row of a query sub-chunk past the first of its chunk (16-row sub-chunks)
        assert o_census.first["t"] % 16 == 0 and o_census.first["t"] % 32 != 0, o_census
        # the state between chunks and the key path do not use the reference row
        assert result.errors["ht"] <= result.tolerance.fwd and result.errors["k"] <= result.tolerance.grad, result


def exclusive_reference_control():
    for decay in STRONG_DECAYS:
        result, o, dq = _chunk_rwkv6_run(decay, None)
        assert check.nonfinite_census(o).count == 0 and check.nonfinite_census(dq).count == 0
        assert result.ok, f"decay {decay}: {result.failures()} | {result}"
    # the buggy switch without the trigger (weak decay): accurate, and the same as the fix
    buggy, o_buggy, dq_buggy = _chunk_rwkv6_run(1.0, "exclusive_reference")
    fixed, o_fixed, dq_fixed = _chunk_rwkv6_run(1.0, None)
    assert buggy.ok and fixed.ok, f"{buggy.failures()} | {buggy}"
    tol = check.tolerance(torch.float32)
    check.assert_close("o", o_buggy, o_fixed, tol.fwd)
    check.assert_close("dq", dq_buggy, dq_fixed, tol.grad)


# ---------------------------------------------------------------------------------------------------------
# transposed_h0_mask (fused_recurrent_rwkv6, upstream #18): a [BK, BV] mask on [BV, BK] initial-state pointers


def _rwkv6_backward(bug, tiles, h0=True, K=32, V=64):
    from fla_lab.teaching.lessons.masks import dq_launch

    x = harness.gated_inputs(1, 8, 1, K, V, initial_state=h0, bonus=True, names=RWKV6_NAMES)
    return harness.compare(lambda **kw: fused_recurrent_rwkv6(**kw, bug=bug, launch=dq_launch(*tiles)),
                           reference.recurrent_rwkv6, x)


def transposed_h0_mask_trigger():
    with pytest.raises(Exception, match=r"(64 and 16|16 and 64|\[16, 64\]|\[64, 16\])"):
        _rwkv6_backward("transposed_h0_mask", (16, 64))


def transposed_h0_mask_control():
    fixed = _rwkv6_backward(None, (16, 64))
    assert fixed.ok and fixed.errors["initial_state"] < 1e-6, fixed
    # the buggy switch without the trigger: no initial state, or square tiles that K and V fill exactly
    assert _rwkv6_backward("transposed_h0_mask", (16, 64), h0=False).ok
    assert _rwkv6_backward("transposed_h0_mask", (32, 32), K=32, V=64).ok


# ---------------------------------------------------------------------------------------------------------
# bf16_decay (RWKV7Attention, upstream #181): the decay sigmoid rounded to bf16


def _rwkv7_decay_layers(dtype):
    """(fixed, buggy) RWKV7Attention in `dtype` with the same weights: the official init, output opened."""
    fixed = open_output(RWKV7Attention("fused_recurrent", **RWKV7_SMALL))
    buggy = RWKV7Attention("fused_recurrent", bug="bf16_decay", **RWKV7_SMALL)
    buggy.load_state_dict(fixed.state_dict())
    return fixed.to(DEV, dtype), buggy.to(DEV, dtype)


def _rwkv7_decay_run(layer, T=16):
    """The layer output and the log-decay `w` the real kernel receives, with the exact value of that decay:
    -e^-0.5 * sigmoid(LoRA output) in float64. At the official init the decay LoRA's down-projection is zero, so
    its output is the bias w0 (as the layer holds it, rounded to its dtype) at every token."""
    x = torch.randn(1, T, layer.hidden_size, generator=gen(6)).to(DEV, layer.o_proj.weight.dtype)
    with spy_op("fused_recurrent_rwkv7") as calls, torch.no_grad():
        out = layer(x)[0]
    (args, _), = calls
    w0 = layer.w_lora.lora[2].bias.detach().double().view(layer.num_heads, layer.head_dim)
    return out, args["w"], (-math.exp(-0.5) * torch.sigmoid(w0)).expand_as(args["w"])


def bf16_decay_trigger():
    # On the CPU there is no autocast: a bf16 layer gives the decay LoRA output in bf16, as CUDA autocast does
    # for its Linear layers, and the buggy path keeps the sigmoid in that dtype.
    fixed, buggy = _rwkv7_decay_layers(torch.bfloat16)
    out, w, exact = _rwkv7_decay_run(buggy)
    assert w.dtype == torch.bfloat16
    err = w.double() - exact
    # at most two bf16 roundings (the sigmoid, the product), unit roundoff 2^-8 each, and not zero
    assert (err.abs() <= 2 * 2.0 ** -8 * exact.abs()).all()
    assert err.abs().max() > 1e-4
    # a bias, not noise: the same error at every step, so the log of the cumulative decay is off by T times it
    assert torch.equal(err, err[:, :1].expand_as(err))
    T = w.shape[1]
    torch.testing.assert_close(err.sum(1), T * err[:, 0], rtol=1e-12, atol=0)
    # and it reaches the layer output (same weights, same input, only the decay's rounding differs)
    out_fixed, _, _ = _rwkv7_decay_run(fixed)
    assert not torch.equal(out, out_fixed)


def bf16_decay_control():
    fixed, _ = _rwkv7_decay_layers(torch.bfloat16)
    out, w, exact = _rwkv7_decay_run(fixed)
    assert w.dtype == torch.float32 and torch.isfinite(out).all()
    assert (w.double() - exact).abs().max() < 1e-7  # the fp32 sigmoid of the same bf16 LoRA output
    assert ((w <= 0) & (w > -math.exp(-0.5))).all()  # RWKV-7's range
    # the buggy switch without the trigger (an fp32 layer): the same decay and output as the fix
    fixed32, buggy32 = _rwkv7_decay_layers(torch.float32)
    (out_f, w_f, _), (out_b, w_b, _) = _rwkv7_decay_run(fixed32), _rwkv7_decay_run(buggy32)
    assert w_b.dtype == torch.float32 and torch.equal(w_b, w_f) and torch.equal(out_b, out_f)


# ---------------------------------------------------------------------------------------------------------
# One entry per catalogue name: (trigger, control).

# ---------------------------------------------------------------------------------------------------------
# unmasked_padding (chunk_gsa, upstream #77 GSA half): rows past T of a partial last chunk stay live in backward


def _chunk_gsa_run(T, decay, bug):
    """harness.compare of chunk_gsa (chunk size 64, initial states, both final-state cotangents) and its output."""
    x = harness.gsa_inputs(1, T, 1, 16, 16, 16, decay=decay, initial_state=True, seed=11)
    grads = {}

    def capture(**kw):  # keep the leaves s and g, whose .grad harness.compare fills
        grads.update(s=kw["s"], g=kw["g"])
        return ops.chunk_gsa(**kw, chunk_size=64, bug=bug)

    result = harness.compare(capture, reference.recurrent_gsa, x)
    return result, {n: t.grad for n, t in grads.items()}


def unmasked_padding_trigger():
    for T in (45, 80):  # a partial last chunk: partial sub-chunk (45) or whole padded sub-chunks (80)
        result, grads = _chunk_gsa_run(T, 30.0, "unmasked_padding")
        for name in ("s", "g"):
            assert torch.isnan(grads[name]).any(), f"T={T}: d{name} {check.nonfinite_census(grads[name])}"
        # forward, final states and the other gradients never touch the padded rows' exponent
        fine = ("o", "ht[0]", "ht[1]", "q", "k", "v", "initial_state[0]", "initial_state[1]")
        assert all(result.errors[n] <= result.tolerance.grad for n in fine), result


def unmasked_padding_control():
    for T in (45, 80):
        result, _ = _chunk_gsa_run(T, 30.0, None)
        assert result.ok, f"T={T}: {result.failures()} | {result}"
    # the buggy switch without the trigger: no partial chunk (T = 64), or a weak decay
    for T, decay in ((64, 30.0), (45, 1.0)):
        result, _ = _chunk_gsa_run(T, decay, "unmasked_padding")
        assert result.ok, f"T={T}, decay {decay}: {result.failures()} | {result}"


REPRODUCTIONS = {
    "uninitialized_params": (uninitialized_params_trigger, uninitialized_params_control),
    "sigmoid_decay": (sigmoid_decay_trigger, sigmoid_decay_control),
    "exclusive_reference": (exclusive_reference_trigger, exclusive_reference_control),
    "transposed_h0_mask": (transposed_h0_mask_trigger, transposed_h0_mask_control),
    "bf16_decay": (bf16_decay_trigger, bf16_decay_control),
    "unmasked_padding": (unmasked_padding_trigger, unmasked_padding_control),
}

CATALOGUE_NAMES = [bug.name for bug in bugs.CATALOGUE]


@pytest.mark.parametrize("name", CATALOGUE_NAMES)
def test_entry_has_a_reproduction(name):
    assert name in REPRODUCTIONS, f"catalogue entry {name!r} has no reproduction: add (trigger, control) to " \
                                  "REPRODUCTIONS in tests/test_bugs.py"


def test_every_reproduction_is_a_catalogue_entry():
    assert set(REPRODUCTIONS) <= set(CATALOGUE_NAMES)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # the interpreter's numpy overflowing
@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_trigger_shows_the_symptom(name):
    trigger, _ = REPRODUCTIONS[name]
    trigger()


@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_control_is_fixed(name):
    _, control = REPRODUCTIONS[name]
    control()


# ---------------------------------------------------------------------------------------------------------
# The catalogue's other claims


@pytest.mark.parametrize("bug", bugs.CATALOGUE, ids=lambda b: b.name)
def test_entry_points_at_its_switch(bug):
    where = bugs.locate(bug.name)  # the line that `# bug: <name>` marks
    path, line = where.rsplit(":", 1)
    text = (pathlib.Path(bugs.__file__).parents[2] / path).read_text().splitlines()[int(line) - 1]
    assert path == f"fla_lab/{bug.switch_file}"
    assert f"upstream #{bug.issue}" in text and not text.lstrip().startswith("#")  # the historical line, not a comment
    assert bug.issue > 0 and bug.fix and bug.trigger and bug.symptom


def test_unknown_bug_name_is_rejected():
    x = harness.gated_inputs(1, 4, 1, 16, 16, bonus=True, names=RWKV6_NAMES)
    with pytest.raises(ValueError, match="unknown bug='nope'.*transposed_h0_mask"):
        fused_recurrent_rwkv6(**x, bug="nope")


def test_index_names_every_entry_by_its_symptom_without_giving_the_cause_away(capsys):
    from fla_lab.teaching import bugs

    bugs.index()
    out = capsys.readouterr().out
    assert len(out.splitlines()) == len(bugs.CATALOGUE)
    for bug in bugs.CATALOGUE:
        assert bug.title in out and f"notebook {bug.notebook}" in out
        assert bug.name not in out  # the switch names the cause (exclusive_reference, transposed_h0_mask, ...)
        assert bug.trigger not in out and bug.symptom not in out
    assert "switch" not in out


def test_a_bug_switch_and_a_slot_helper_together_are_refused():
    """Each slot-carrying op declares its slot (`utils.Slot`) and resolves (switch, learner's `helper=`, shipped) by
    it: the historical helper under the switch, the caller's, else the shipped one; both at once is refused."""
    from fla_lab.ops.common import chunk as common_chunk
    from fla_lab.ops.common import fused_recurrent
    from fla_lab.ops.gsa.chunk import EXPONENT_SLOT
    from fla_lab.ops.rwkv6.fused_recurrent import H0_MASK_SLOT
    from fla_lab.ops.rwkv7.chunk import END_DECAY_SLOT, end_decay, end_decay_alt

    slots = {common_chunk.REFERENCE_ROW_SLOT: (common_chunk.reference_row, common_chunk.reference_row_inclusive),
             EXPONENT_SLOT: (common_chunk.later_rows_exponent, common_chunk.later_rows_exponent_unmasked),
             H0_MASK_SLOT: (fused_recurrent.h0_mask, fused_recurrent.h0_mask_transposed),
             END_DECAY_SLOT: (end_decay, end_decay_alt)}
    for slot, (shipped, historical) in slots.items():
        switch = slot.switch or "any accepted bug"  # chunk_rwkv7's only switch is unlisted: any bug is it
        assert slot.pick() is shipped and slot.pick(switch) is historical
        assert slot.pick(None, historical) is historical  # a caller's helper
        with pytest.raises(ValueError, match="pass bug= or helper=, not both"):
            slot.pick(switch, shipped)


# ---------------------------------------------------------------------------------------------------------
# The catalogue in a learner's session: an entry's cause and switch lines stay sealed until its exercise is opened


def _fixed_line(bug) -> str:
    """The lines after the switch line (the fixed one among them), as the catalogue prints them outside a learner's
    session, without line numbers: one string per line of code."""
    code = [line.split("  ", 1)[1].strip() for line in bugs.switch_lines(bug.name)[1:]]
    return "\n".join(line for line in code if len(line) > 8)


@pytest.fixture
def session(monkeypatch, tmp_path):
    """(learner, reference): put this process in a learner's session or out of it; the kernel's record of opened
    exercises starts empty, whatever other tests passed."""
    from fla_lab.teaching import edition, exercises

    monkeypatch.setattr(exercises, "_OPENED", set())
    monkeypatch.setattr(edition, "_SESSION", None)  # unlatched here, and restored after the test
    monkeypatch.chdir(tmp_path)

    def learner():
        monkeypatch.setenv(edition.SESSION_ENV, "learner")
        edition.reset_session()

    def reference():
        monkeypatch.setenv(edition.SESSION_ENV, "reference")
        edition.reset_session()

    return learner, reference


def _printed(fn, *args) -> str:
    out = __import__("io").StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue()


def test_outside_a_learner_session_the_catalogue_shows_every_fixed_line(session):
    _, reference = session
    reference()
    fixed = {bug.name: _fixed_line(bug) for bug in bugs.CATALOGUE}
    out = _printed(bugs.show)
    for bug in bugs.CATALOGUE:
        assert all(line in out for line in fixed[bug.name].splitlines()) and bugs.locate(bug.name) in out
        assert f"fix {bug.fix.opened()}" in out and bug.trigger.opened() in out and bug.symptom.opened() in out
        assert str(bug.fix) == bug.fix.opened() and bug.fix.opened() in repr(bug)


def test_in_a_learner_session_no_display_path_shows_an_unopened_entry(session):
    learner, reference = session
    reference()
    fixed = {bug.name: _fixed_line(bug) for bug in bugs.CATALOGUE}
    causes = {bug.name: [bug.fix.opened(), bug.trigger.opened(), bug.symptom.opened()] for bug in bugs.CATALOGUE}
    learner()
    shown = _printed(bugs.show) + repr(bugs.CATALOGUE) + str(list(bugs.CATALOGUE)) + "".join(
        f"{b.fix} {b.trigger} {b.symptom} {b.fix!r} {b.trigger!s}" for b in bugs.CATALOGUE)
    for bug in bugs.CATALOGUE:
        assert not [line for line in fixed[bug.name].splitlines() if line in shown], bug.name
        assert not [text for text in causes[bug.name] if text in shown], bug.name
        switch = markers.shipped(markers.find("bug", bug.name))  # the historical line, as the catalogue prints it
        assert switch not in shown and bug.located[2] not in shown and bug.component not in shown, bug.name
        assert f"notebook {bug.notebook.split('_')[0]}'s exercise" in shown
        for reach in (bugs.switch_lines, bugs.locate):
            with pytest.raises(exercises_NotRevealed(), match="PASS or verdict.hint"):
                reach(bug.name)
    assert "sealed until notebook 03a's exercise says PASS" in _printed(bugs.show, ["exclusive_reference"])
    # what the checks and tests use still holds: names, ops, the fix commit by value
    assert bugs.get("exclusive_reference").fix.split()[0] == "0c1c0b65" and "0c1c0b65" in bugs.get(
        "exclusive_reference").fix


def exercises_NotRevealed():
    from fla_lab.teaching.exercises import NotRevealed

    return NotRevealed


def test_in_a_learner_session_an_entry_opens_with_its_exercise(session, capsys):
    from fla_lab.teaching import exercises

    learner, reference = session
    reference()
    mask, row = (_fixed_line(bugs.get(name)).splitlines() for name in ("transposed_h0_mask", "exclusive_reference"))
    learner()

    def shows(lines, *args):
        out = _printed(bugs.show, *args)
        return [line for line in lines if line in out]

    exercises.Verdict("some other exercise", True)  # another exercise's PASS opens nothing here
    assert not shows(mask) and not shows(row)
    stub = exercises.Verdict(bugs.get("transposed_h0_mask").exercise, False, ["f"],
                             ("where", "what", exercises.Sealed(exercises.seal("the line"))))
    stub.hint(), stub.hint()
    assert not shows(mask, ["transposed_h0_mask"])
    stub.hint()  # the last tier: a recorded reveal
    assert shows(mask, ["transposed_h0_mask"]) == mask
    assert bugs.get("transposed_h0_mask").fix.opened() in _printed(bugs.show, ["transposed_h0_mask"])
    assert not shows(row)  # the others stay sealed
    exercises.verdict(bugs.get("exclusive_reference").exercise, [(True, "o: right")])  # a PASS
    assert shows(row, ["exclusive_reference"]) == row
    assert bugs.locate("exclusive_reference").startswith("fla_lab/")


def test_a_kernel_in_the_learners_edition_is_a_learners_session(session, monkeypatch, tmp_path):
    """Whatever started the kernel: one whose working directory is a folder of the edition (its manifest) seals too;
    FLA_LAB_EDITION=reference opens the catalogue there (a facilitator)."""
    from fla_lab.teaching import edition

    monkeypatch.delenv(edition.SESSION_ENV, raising=False)
    edition.reset_session()
    assert bugs.get("bf16_decay").answer_shown()
    (tmp_path / edition.MANIFEST).write_text("{}\n")
    edition.reset_session()
    assert not bugs.get("bf16_decay").answer_shown() and "sealed" in str(bugs.get("bf16_decay").fix)
    monkeypatch.setenv(edition.SESSION_ENV, "reference")
    edition.reset_session()
    assert bugs.get("bf16_decay").answer_shown()


def test_a_learners_kernel_cannot_switch_itself_to_reference(session, monkeypatch):
    """The first answer of `learner_session()` holds in the process: setting FLA_LAB_EDITION=reference (or leaving
    the edition's folder) inside a learner's kernel does not unseal the catalogue."""
    from fla_lab.teaching import edition

    learner, _ = session
    learner()
    bug = bugs.get("bf16_decay")
    assert not bug.answer_shown()
    monkeypatch.setenv(edition.SESSION_ENV, "reference")
    monkeypatch.chdir("/")
    assert not bug.answer_shown() and "sealed" in str(bug.fix) and edition.learner_session()
    edition.reset_session()  # what only a restart (or a test) does
    assert bug.answer_shown()


def test_a_held_text_stays_held_when_sliced_added_or_iterated(session):
    learner, _ = session
    learner()
    fix = bugs.get("bf16_decay").fix
    text = fix.opened()
    for derived in (fix[:], fix[:400], fix + "", "" + fix, fix * 1, 1 * fix, fix[0], next(iter(fix))):
        assert isinstance(derived, bugs.Held) and derived.exercise == fix.exercise, repr(derived)
        assert "sealed" in str(derived) and text not in str(derived) and text not in f"{derived}"
    assert "".join(str(ch) for ch in fix).count("sealed") == len(text)


def test_each_entry_names_the_exercise_its_fixed_line_answers():
    """`Bug.exercise` is the name a check of the entry's notebook gives its verdict (the lesson's source has it): a
    renamed exercise would leave its entry sealed for good."""
    from fla_lab.teaching import lessons

    for bug in bugs.CATALOGUE:
        lesson = lessons.notebook(bug.notebook.split("_")[0])
        assert f'"{bug.exercise}"' in inspect.getsource(lesson), (bug.name, bug.exercise, lesson.__name__)


def test_the_catalogues_source_states_no_exercise_answer():
    """`bugs??` in a notebook shows the module's source: the causes that state an exercise's answer are sealed there."""
    source = pathlib.Path(bugs.__file__).read_text()
    for answer in ("gi[start-1]", "dropped the -1", "mask rows past T", "fp32 sigmoid", "never visits"):
        assert answer not in source, answer
    assert "(reference row gi[start-1])" in bugs.get("exclusive_reference").fix


def test_the_command_line_prints_every_entry():
    """`python -m fla_lab bugs` (the README's command) loads the catalogue itself and prints each entry."""
    from conftest import run_python

    out = run_python("import sys, runpy; sys.argv = ['fla_lab', 'bugs']; runpy.run_module('fla_lab', run_name='__main__')")
    assert out.returncode == 0, out.stderr
    assert all(f"{b.name}  [{b.op}]" in out.stdout for b in bugs.CATALOGUE)

"""Notebook 06's capstone: the model's two faults enter through documented options of its layers, stay out of the
catalogue, and do what the answer key says (one NaN made in a layer's backward, one wrong-but-finite kernel); the
checks follow the learner's mistakes; no answer can be read from the installed package (item 2 of issue 34), and the
kernel switch enters under a name that says nothing, in the package, the model's vars() or the call record (item 2 of
issue 44)."""
import ast
import contextlib
import importlib.util
import inspect
import io
import json
import re
from pathlib import Path

import pytest
import torch

import fla_lab
from fla_lab.tools import audit
from fla_lab.teaching import bugs, exercises
from fla_lab.spec import check, harness, reference, registry
from fla_lab.layers import GatedSlotAttention
from fla_lab.teaching.lessons import hunting
from fla_lab.ops.rwkv7 import chunk as rwkv7_chunk

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "06_nan_hunting.ipynb"
CARRY = hunting._option("silent")[2].options["bug"]  # chunk_rwkv7's unlisted switch, as the model's RWKV-7 block
# binds it to its op (an id that says nothing; it is written only in hunting's encoded material)
OLD_NAME = "carry_ge"  # the switch's name before issue 44: it led `grep -rn` straight to the kernel's branch


def _printed(fn, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue()


def test_the_unlisted_switch_is_nowhere_in_the_catalogue_and_only_its_op_takes_it():
    assert CARRY not in {b.name for b in bugs.CATALOGUE}
    assert CARRY not in _printed(bugs.index) + _printed(bugs.show)
    assert not any(CARRY in spec.variants for spec in registry.ops().values())
    bugs.check_bug(CARRY, "chunk_rwkv7")
    with pytest.raises(ValueError, match=f"unknown bug='{CARRY}'") as err:
        bugs.check_bug(CARRY, "chunk_gsa")
    assert CARRY not in str(err.value).split("has", 1)[1]  # the error lists catalogue names only


def _rwkv7(T: int, bug, dtype=torch.float32):
    spec = registry.get("chunk_rwkv7")
    x = harness.leaves(spec.inputs(registry.Shape(1, T, 1, 16, 16), decay=1.0, initial_state=False), dtype,
                       fla_lab.device())
    o, ht = fla_lab.ops.chunk_rwkv7(**x, output_final_state=True, bug=bug)
    return x, o.float(), ht


def test_the_unlisted_switch_is_wrong_but_finite_and_only_past_the_first_chunk():
    """The state leaving a 16-row chunk is wrong: the output of one chunk is bit-identical, the final state and every
    later chunk's output are finite but off by far more than rounding."""
    x, o_fixed, ht_fixed = _rwkv7(16, None)
    _, o_bug, ht_bug = _rwkv7(16, CARRY)
    assert torch.equal(o_fixed, o_bug)
    assert torch.isfinite(ht_bug).all() and check.rel_error(ht_bug, ht_fixed) > 1e-2
    x, o_fixed, _ = _rwkv7(32, None)
    _, o_bug, _ = _rwkv7(32, CARRY)
    assert torch.equal(o_fixed[:, :16], o_bug[:, :16]) and torch.isfinite(o_bug).all()
    exact, _ = registry.get("chunk_rwkv7").reference(**{n: t.double() for n, t in x.items()})
    assert check.rel_error(o_fixed, exact) < 2e-5 < 1e-2 < check.rel_error(o_bug, exact)


def _switched_reference(x: dict, chunk: int = 16):
    """float64: chunk_rwkv7 under its switch, as the answer key states it. Inside a 16-row chunk every step is exact;
    the state leaving a chunk is decayed by the exclusive row G[last - 1] instead of G[last], i.e. the exact state
    at the chunk's end with its last step's decay undone (exp(-w_last), per key channel)."""
    T, state, outputs = x["r"].shape[1], None, []
    for start in range(0, T, chunk):
        part = {n: t[:, start:start + chunk] for n, t in x.items()}
        o, ht = reference.recurrent_rwkv7(**part, initial_state=state, output_final_state=True)
        outputs.append(o)
        state = ht * (-part["w"][:, -1].double()).exp()[..., None]
    return torch.cat(outputs, 1), state


@pytest.mark.parametrize("T", [16, 33, 40])
def test_the_switch_computes_exactly_what_the_answer_key_says(T):
    """The shipped path matches float64; the switched path matches the answer key's mechanism to the same precision
    (a chunk of one row, T = 33, and a partial last chunk, T = 40, included): the slot changed the plumbing only."""
    spec = registry.get("chunk_rwkv7")
    x = harness.leaves(spec.inputs(registry.Shape(1, T, 2, 16, 16), decay=1.0, initial_state=False), torch.float32,
                       fla_lab.device())
    exact = registry.get("chunk_rwkv7").reference(**{n: t.double() for n, t in x.items()}, output_final_state=True)
    switched = _switched_reference({n: t.double() for n, t in x.items()})
    for bug, (o_ref, ht_ref) in ((None, exact), (CARRY, switched)):
        o, ht = fla_lab.ops.chunk_rwkv7(**x, output_final_state=True, bug=bug)
        assert check.rel_error(o, o_ref) < 2e-5 and check.rel_error(ht, ht_ref) < 2e-5, (bug, T)
    assert check.rel_error(switched[1], exact[1]) > 1e-2  # the two references do differ


def test_the_switch_enters_through_a_slot_helper_and_no_name_says_what_it_does():
    """Item 2 of issue 44: `bug="carry_ge"` showed in vars(), the call record, and `grep -rn carry_ge fla_lab/` led to
    the kernel's `if CARRY_GE:` branch. Now the switch is an id that no source file holds in plain text, and the
    kernel takes a helper for its END_DECAY slot (the shipped one, or the other under the switch), as the
    catalogue's kernel bugs do."""
    sources = _installed_sources()
    assert not [path for path, text in sources.items() if OLD_NAME in text.lower()]
    assert not [path for path, text in sources.items() if re.search(rf"(?<![\w]){re.escape(CARRY)}(?![\w])", text)]
    assert "END_DECAY" in rwkv7_chunk.dplr_fwd_h_kernel.arg_names
    assert not any("carry" in name.lower() for name in rwkv7_chunk.dplr_fwd_h_kernel.arg_names)
    assert rwkv7_chunk.END_DECAY_SLOT.pick(None) is rwkv7_chunk.end_decay
    assert rwkv7_chunk.END_DECAY_SLOT.pick(CARRY) is rwkv7_chunk.end_decay_alt

    model = hunting.mystery_model()
    held = repr({name: vars(module) for name, module in model.named_modules()}) + repr(model)
    assert "carry" not in held.lower() and f"bug={CARRY!r}" in held  # the opaque id is all vars() shows
    with audit.audit(model) as recorded:
        hunting.loss_of(model, hunting.tokens()).backward()
    calls = {call.op: call for call in recorded.calls}
    assert "carry" not in repr([(c.op, c.module, c.kwargs) for c in recorded.calls]).lower()
    assert calls["chunk_rwkv7"].kwargs.get("bug") == CARRY


def _gate_grads(gate_fn):
    with hunting._fork(0):
        layer = GatedSlotAttention(hidden_size=32, num_heads=1, num_slots=16, gate_fn=gate_fn).to(fla_lab.device())
    with torch.no_grad():
        layer.f_proj.weight.mul_(hunting.GATE_GROWTH)
    x = torch.randn(1, 20, 32, generator=torch.Generator().manual_seed(3)).to(fla_lab.device())
    o = layer(x)[0]
    o.pow(2).mean().backward()
    return o.detach(), {n: p.grad for n, p in layer.named_parameters()}


def test_the_piecewise_gate_keeps_the_forward_and_makes_the_gate_gradient_nan():
    o_fixed, g_fixed = _gate_grads("logsigmoid")
    o_bug, g_bug = _gate_grads("piecewise")
    assert torch.isfinite(o_bug).all() and check.rel_error(o_bug, o_fixed) < 1e-5
    assert all(torch.isfinite(g).all() for g in g_fixed.values())
    assert [n for n, g in g_bug.items() if not torch.isfinite(g).all()] == ["f_proj.weight"]
    with pytest.raises(ValueError, match="gate_fn must be one of"):
        GatedSlotAttention(hidden_size=32, num_heads=1, gate_fn="where")


def test_the_model_is_built_with_documented_options_that_switch_off_returns_to_the_defaults():
    model = hunting.mystery_model()
    options = [hunting._option(e) for e in hunting.EXERCISES]
    assert hunting._switches_on(model) == 2 and [name for name, _, _ in options] == ["blocks.1.attn", "blocks.2.attn"]
    gsa, rwkv7 = (model.get_submodule(name) for name, _, _ in options)
    assert gsa.gate_fn == "piecewise" and gsa.bug is None
    assert isinstance(rwkv7.attention_op, hunting.BoundOp) and rwkv7.attention_op.options == {"bug": CARRY}
    hunting.switch_off(model, "blocks.0.attn (RWKV6Attention)")  # the locator's spelling; nothing held
    assert hunting._switches_on(model) == 2
    hunting.switch_off(model, "blocks.1.attn")
    assert gsa.gate_fn == "logsigmoid"
    hunting.switch_off(model, "blocks.2.attn")
    assert rwkv7.attention_op is None and hunting._switches_on(model) == 0
    assert hunting._switches_on(hunting.mystery_model(switched_on=False)) == 0


def test_switch_off_says_the_same_of_every_module():
    """Item 3 of issue 44: switch_off was True only on the module that held an option, an oracle for the module.
    It now prints the same line whichever module it is given, and returns nothing."""
    model = hunting.mystery_model()
    said = {name: _printed(hunting.switch_off, model, name) for name in ("blocks.0.attn", "blocks.1.attn",
                                                                         "blocks.2.attn")}
    assert {text.replace(name, "<m>") for name, text in said.items()} == {"<m>: back on its layer's defaults\n"}
    assert hunting.switch_off(model, "blocks.0.attn") is None and hunting._switches_on(model) == 0
    assert "not a module of the model" in _printed(hunting.switch_off, model, "banana")


def test_the_mystery_model_hunt_end_to_end():
    """One bf16 step inside the locator: the NaN reaches block 0 as a gradient (not the catalogue's, says
    suspects()); block 1's gate is the only parameter of that block with a non-finite gradient; the audit flags
    only the RWKV-7 call; the checks say NOT YET with hints that follow the finding, and PASS once it is right."""
    model = hunting.mystery_model()
    report = hunting.hunt_step(model)
    d = report.diagnosis
    assert report.event.call.module.startswith("blocks.0.attn") and d.cause == "nonfinite_cotangent", str(report)
    assert report.suspects() == [] and "no catalogue entry matches" in str(report.suspects())
    assert "downstream" in str(report) and "upstream" not in str(report.suspects())  # one direction: the fix line's
    census = hunting.grad_census(model, "blocks.1.attn")
    assert [n for n, c in census.items() if c.count] == ["blocks.1.attn.f_proj.weight"]
    with audit.audit(model) as recorded:  # block 0's call gets the NaN cotangent: compared forward only
        hunting.loss_of(model, hunting.tokens()).backward()
    assert [r.call.op for r in recorded.wrong()] == ["chunk_rwkv7"], recorded.report()

    victim = hunting.check_nan_hunt(model, {"module": "blocks.0.attn (RWKV6Attention)", "where": "x"})
    assert not victim.passed and "reach that op" in victim.hints[0] and "chunk_rwkv6" not in victim.hints[0]
    op = hunting.check_nan_hunt(model, {"module": "blocks.1.attn", "where": "chunk_gsa"})
    assert not op.passed and "PyTorch code" in op.hints[0]
    nan, silent = (_solutions()[name] for name in ("finding", "finding2"))
    on = hunting.check_nan_hunt(model, nan)  # still switched on
    assert not on.passed and "switch it off" in on.hints[0]
    hunting.switch_off(model, "blocks.1.attn")
    assert hunting.check_nan_hunt(model, nan).passed

    wrong_kernel = hunting.check_silent_hunt(model, {"module": "blocks.2.attn", "where": "dplr_fwd_o_kernel"})
    assert not wrong_kernel.passed and "T = 16" in wrong_kernel.hints[0]
    backward = hunting.check_silent_hunt(model, {"module": "blocks.2.attn", "where": "dplr_bwd_kernel"})
    assert "backward only" in backward.hints[0]
    assert hunting._switches_on(model) == 1
    hunting.switch_off(model, "blocks.2.attn")
    assert hunting.check_silent_hunt(model, silent).passed and hunting._switches_on(model) == 0


# --- item 3 of issue 44: the finding is graded as a whole -------------------------------------------------------

def _off_model():
    model = hunting.mystery_model()
    for exercise in hunting.EXERCISES:
        hunting.switch_off(model, hunting._option(exercise)[0])
    return model


@pytest.mark.parametrize("exercise, name, check", [("nan", "finding", "check_nan_hunt"),
                                                   ("silent", "finding2", "check_silent_hunt")])
def test_a_wrong_field_gets_one_not_yet_that_does_not_say_which(exercise, name, check):
    """One wrong field, any of the five, gets the same NOT YET: the same notes, the same hints (which enumerate no
    choices), nothing that says which field it was; the option's state is not said either."""
    model, solution = _off_model(), _solutions()[name]
    wrong = {"module": "blocks.0.norm", "mechanism": "cancellation", "tensor": "dv", "condition": "any_input",
             "where": "GatedSlotAttention.forward" if exercise == "nan" else "dplr_fwd_o_kernel"}
    verdicts = {field: getattr(hunting, check)(model, {**solution, field: value}) for field, value in wrong.items()}
    for field, verdict in verdicts.items():
        assert not verdict.passed, (field, str(verdict))
        text = str(verdict)
        assert "graded as a whole" in text and "(not yet)" not in text and "option" not in text, text
        for choice in [*hunting.MECHANISMS, *hunting.CONDITIONS]:
            assert not any(re.search(rf"\b{choice}\b", h) for h in verdict.hints[:2]), (field, choice)
    assert len({v.hints for v in verdicts.values()}) == 1, "the hints tell the wrong field apart"


def test_why_must_cite_a_number():
    """Item 4 of issue 44: `why` was never read; now it must be a sentence that cites a number."""
    model, solution = _off_model(), _solutions()["finding"]
    for why in ("", "the gate is wrong", "the torch.where in the gate makes the backward NaN somehow"):
        verdict = hunting.check_nan_hunt(model, {**solution, "why": why})
        assert not verdict.passed and "cites a number" in str(verdict) and verdict.hints, str(verdict)
    assert hunting.check_nan_hunt(model, solution).passed


def _printed_tiers(verdict) -> list[str]:
    """Every hint tier as `verdict.hint()` prints it (a sealed tier opened)."""
    return [_printed(verdict.hint).split("): ", 1)[1].split("\n")[0] for _ in verdict.hints]


@pytest.mark.parametrize("exercise, name, check", [("nan", "finding", "check_nan_hunt"),
                                                   ("silent", "finding2", "check_silent_hunt")])
def test_the_tiers_that_state_the_answer_are_sealed_and_open_as_hints(exercise, name, check):
    """Item 2 of issue 44: NAN_HINTS and SILENT_HINTS were public tuples, their second tier the reasoning to the
    answer in plain text (Tab, `??`). Now they are private, that tier is sealed (base64 in the source) and so is the
    last one (the whole finding, from the encoded material): `verdict.hints` shows placeholders, `hint()` opens
    them in turn."""
    assert not hasattr(hunting, "NAN_HINTS") and not hasattr(hunting, "SILENT_HINTS")
    table = {"nan": hunting._NAN_HINTS, "silent": hunting._SILENT_HINTS}[exercise]
    assert not isinstance(table[0], exercises.Sealed) and isinstance(table[1], exercises.Sealed)
    source = inspect.getsource(hunting)
    for public in (n for n in dir(hunting) if not n.startswith("_")):  # no public name holds a tier
        value = getattr(hunting, public)
        assert not (isinstance(value, tuple) and set(value) & set(table)), public
    reasoning = str.__str__(table[1])  # the text itself, whatever display paths show
    assert reasoning[:60] not in source and len(reasoning) > 200

    verdict = getattr(hunting, check)(_off_model(), {})  # the stub: every field empty
    assert not verdict.passed and len(verdict.hints) == 3
    assert all(isinstance(tier, exercises.Sealed) and "sealed" in repr(tier) for tier in verdict.hints[1:])
    first, second, last = _printed_tiers(verdict)
    assert first == table[0] and second == reasoning
    assert f"where = {_solutions()[name]['where']!r}" in last and "sealed" not in last


def test_the_model_as_called_joins_the_registry_beside_the_shipped_op():
    from fla_lab.tools import hunt

    call = hunt.Call(0, "chunk_rwkv7", "blocks.2.attn", fla_lab.ops.chunk_rwkv7, {}, {"bug": CARRY, "scale": 1.0})
    label = hunting.register_as_called(call, library="test")
    try:
        spec = registry.get("chunk_rwkv7", library="test")
        assert label == "test:chunk_rwkv7" and spec.variants == (registry.FIXED,)
        assert spec.fn.keywords == {"bug": CARRY}  # the switch, not the options the atlas sets itself
    finally:
        registry.ops().pop(label)


# ---------------------------------------------------------------------------------------------------------------
# Item 2 of issue 34: the answers are not readable from the package. The answers are taken from the reference
# notebook's solution cells, so that putting one back in plain text anywhere in the package fails here.

def _solutions() -> dict[str, dict]:
    """{variable: finding} for every `finding... = {...}` a solution cell of notebook 06 writes."""
    found = {}
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        if cell["cell_type"] == "code" and "solution" in cell["metadata"].get("tags", []):
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                        and node.targets[0].id.startswith("finding")):
                    found[node.targets[0].id] = ast.literal_eval(node.value)
    assert set(found) == {"finding", "finding2"}, found
    return found


CAUSE = ("mechanism", "tensor", "condition")


def _installed_sources() -> dict[str, str]:
    """Every .py file of the fla_lab that `import fla_lab` loads (located by importlib, not by the checkout)."""
    root = Path(next(iter(importlib.util.find_spec("fla_lab").submodule_search_locations)))
    sources = {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.py"))}
    assert "teaching/lessons/hunting.py" in sources and len(sources) > 20
    return sources


def _strings(tree: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _leaks(sources: dict[str, str], findings: dict[str, dict]) -> list[str]:
    """Where an answer can be read: the module names anywhere; the code (`where`) named outside the file that
    defines it; two parts of one cause (mechanism, tensor, condition) in one string or one literal tuple, list, set
    or dict; and the words "capstone" and "planted"."""
    leaks = []
    for path, text in sources.items():
        tree = ast.parse(text)
        for word in ("capstone", "planted"):
            if word in text.lower():
                leaks.append(f"{path}: {word!r}")
        for exercise, finding in findings.items():
            module, where = finding["module"], finding["where"]
            if module.lower() in text.lower():
                leaks.append(f"{path}: the module {module!r} ({exercise})")
            name = where.rsplit(".", 1)[-1]
            if f"def {name}(" not in text:
                if where in text:
                    leaks.append(f"{path}: the code {where!r} ({exercise})")
                if name in (s.strip() for s in _strings(tree)):
                    leaks.append(f"{path}: the string {name!r} ({exercise})")
            parts = {hunting._normal(field, finding[field]) for field in CAUSE}
            words = [re.compile(rf"(?<![\w.]){re.escape(p)}(?![\w.])") for p in parts]
            for string in _strings(tree):
                if sum(bool(w.search(string.lower())) for w in words) >= 2:
                    leaks.append(f"{path}: two parts of {exercise}'s cause in one string: {string[:60]!r}")
            for node in ast.walk(tree):
                items = (node.keys + node.values if isinstance(node, ast.Dict) else
                         node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [])
                held = {i.value.strip().lower() for i in items
                        if isinstance(i, ast.Constant) and isinstance(i.value, str)}
                if len(held & parts) >= 2:
                    leaks.append(f"{path}:{node.lineno}: {sorted(held & parts)} of {exercise}'s cause side by side")
    return leaks


def test_no_answer_can_be_read_from_the_installed_package():
    findings = _solutions()
    assert not _leaks(_installed_sources(), findings)
    # the test sees an answer put back in plain text, in each of the ways it looks for
    nan, silent = findings["finding"], findings["finding2"]
    for leaked in (f'_ANSWERS = {{"nan": ({nan["module"]!r}, ("gates",))}}',
                   f'HINT = "kernel = {silent["where"]!r}"',
                   f'CAUSE = ({nan["mechanism"]!r}, {nan["tensor"]!r}, {nan["condition"]!r})',
                   f'HINT = "the {silent["mechanism"]} of {silent["tensor"]}"',
                   "# the capstone's answers"):
        assert _leaks({"lessons/extra.py": leaked}, findings), leaked


def test_the_key_accepts_the_solutions_as_written_and_in_other_spellings():
    for exercise, name in (("nan", "finding"), ("silent", "finding2")):
        finding = _solutions()[name]
        for field in hunting.FIELDS:
            assert hunting._right(exercise, field, finding[field]), (exercise, field)
        assert hunting._right(exercise, "module", finding["module"].upper() + " (SomeLayer)")
        assert hunting._right(exercise, "where", "fla_lab.something." + finding["where"])
        assert not hunting._right(exercise, "module", "")
    assert hunting._right("nan", "tensor", "blocks.1.attn." + _solutions()["finding"]["tensor"])


def test_docstrings_the_learner_reaches_do_not_point_to_the_answer_key():
    """`lesson?` and `lesson.mystery_model?` (issue 44): no path to the facilitator's answer key."""
    public = [hunting] + [getattr(hunting, name) for name in dir(hunting)
                          if not name.startswith("_") and callable(getattr(hunting, name))]
    for obj in public:
        doc = inspect.getdoc(obj) or ""
        assert "onboarding" not in doc and "Answer keys" not in doc, obj

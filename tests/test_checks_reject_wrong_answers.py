"""Every exercise's check rejects what is not the answer (item 3 of issue 34): the notebook's own stub, a plausible
wrong answer and nonsense each get NOT YET, with at least one hint.

The exercises are found in the notebooks (a cell tagged `exercise`, then its `check` cell, whose `<module>.check_*`
call names the check); the stub is the exercise cell's code as the learner's edition ships it. A new exercise without
wrong answers here fails `test_every_exercise_has_wrong_answers_to_reject`. Notebook 06's findings are dicts, built
from its solution cells (so the right module and code with a wrong cause is tested as well: the cause is checked for
content, not length).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import textwrap
from pathlib import Path

import pytest

import fla_lab  # noqa: F401  (the interpreter is on before the candidates' helpers are decorated)
from fla_lab.teaching import lessons

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
PREAMBLE = """
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl
"""


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _exercises() -> dict[str, dict]:
    """`<prefix>:<check>` -> the stub's source, the check's module and function, and the argument the stub defines."""
    found = {}
    for path in NOTEBOOKS:
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        prefix = path.name.split("_")[0]
        for cell, after in zip(cells, cells[1:]):
            if "exercise" not in _tags(cell):
                continue
            assert "check" in _tags(after), f"{path.name}: an exercise without its check"
            call = re.search(r"(\w+)\.(check_\w+)\(([^)]*)\)", "".join(after["source"]))
            alias, check, args = call.groups()
            found[f"{prefix}:{check}"] = {"stub": "".join(cell["source"]), "alias": alias, "check": check,
                                          "prefix": prefix, "argument": args.split(",")[-1].strip()}
    return found


EXERCISES = _exercises()


def _check(exercise: dict):
    module = (importlib.import_module(f"fla_lab.teaching.lessons.{exercise['alias']}") if exercise["alias"] != "lesson"
              else lessons.notebook(exercise["prefix"]))
    return getattr(module, exercise["check"])


# What each check must reject besides the stub: {exercise: {label: source defining the exercise's argument}}.
WRONG = {
    "01:check_initialisation": {
        "zeros (upstream's first fix: finite, not the official init)": """
            @torch.no_grad()
            def init_skipped(layer):
                for _, p in layer.named_parameters(recurse=False):
                    p.zero_()
            """,
        "the official values of one depth, whatever the layer's": """
            from fla_lab.layers.init import rwkv7_vectors

            @torch.no_grad()
            def init_skipped(layer):
                vec = rwkv7_vectors(layer.hidden_size, layer.head_dim, 0, 1)
                for name, p in layer.named_parameters(recurse=False):
                    p.copy_(vec[name].view_as(p))
            """,
        "nonsense": """
            def init_skipped(layer):
                return "banana"
            """,
    },
    "02:check_log_decay": {
        "the direct form, -inf where sigmoid saturates": """
            @triton.jit
            def gate_to_log_decay(x):
                return tl.log(tl.sigmoid(x))
            """,
        "nonsense: a constant that the contract accepts": """
            @triton.jit
            def gate_to_log_decay(x):
                return x * 0.0 - 1.0
            """,
    },
    "02:check_removal": {
        "the key, not normalised": """
            def removal(k, a, b):
                return -k, k * a
            """,
        "nonsense: removes nothing (stable, but not RWKV-7)": """
            def removal(k, a, b):
                return torch.zeros_like(a), torch.zeros_like(b)
            """,
    },
    "03a:check_reference_row": {
        "the sub-chunk's last row": """
            @triton.jit
            def gn_pointer(gi, i_start, o_k, HK: tl.constexpr):
                return gi + (i_start + 15) * HK + o_k
            """,
        "nonsense: one cell for every channel": """
            @triton.jit
            def gn_pointer(gi, i_start, o_k, HK: tl.constexpr):
                return gi + o_k * 0
            """,
    },
    "03b:check_padded_exponent": {
        "the channel mask only": """
            @triton.jit
            def later_rows_exponent(b_gq, b_gn, o_j, m_d, T):
                return tl.where(m_d[None, :], b_gq - b_gn, 0)
            """,
        "rows up to T itself": """
            @triton.jit
            def later_rows_exponent(b_gq, b_gn, o_j, m_d, T):
                return tl.where((o_j <= T)[:, None], b_gq - b_gn, 0)
            """,
        "nonsense: an exponent of 0 everywhere": """
            @triton.jit
            def later_rows_exponent(b_gq, b_gn, o_j, m_d, T):
                return b_gq * 0.0
            """,
    },
    "04:check_h0_mask": {
        "or instead of and": """
            @triton.jit
            def mask(m_k, m_v):
                return m_v[:, None] | m_k[None, :]
            """,
        "nonsense: the key mask twice": """
            @triton.jit
            def mask(m_k, m_v):
                return m_k[:, None] & m_k[None, :]
            """,
    },
    "05:check_log_decay": {
        "the cast after the sigmoid": """
            def my_log_decay(w_raw):
                return (-math.exp(-0.5) * w_raw.sigmoid()).float()
            """,
        "nonsense: a constant fp32 decay": """
            def my_log_decay(w_raw):
                return torch.full_like(w_raw, -1.0, dtype=torch.float32)
            """,
        "nonsense: a constant built from the shape alone": """
            def my_log_decay(w_raw):
                return -torch.ones(w_raw.shape, dtype=torch.float32, device=w_raw.device)
            """,
    },
    "06:check_fla_reproduction": {
        "the final state's share detached": """
            def reproduction(op, x, do, dht):
                o, ht = op(**x, output_final_state=True)
                ((o * do).sum() + (ht.detach() * dht).sum()).backward()
            """,
        "the cotangent sent into the inputs instead": """
            def reproduction(op, x, do, dht):
                o, ht = op(**x, output_final_state=True)
                ((o * do).sum() + (x["k"] * dht.sum()).sum()).backward()
            """,
        "a constant in place of the supplied dht (issue 44)": """
            def reproduction(op, x, do, dht):
                o, ht = op(**x, output_final_state=True)
                ((o * do).sum() + ht.sum()).backward()
            """,
        "nonsense: no call, no backward": """
            def reproduction(op, x, do, dht):
                return dht
            """,
    },
    "06:check_removal": {
        "ordinary inputs noticing it too": """
            prediction = {"safeguard": "gsa_softmax_max_first", "naive": None, "ordinary": "nonfinite",
                          "in_range": "nonfinite"}
            """,
        "finite but wrong in its range": """
            prediction = {"safeguard": "gsa_softmax_max_first", "naive": None, "ordinary": "right",
                          "in_range": "wrong"}
            """,
        "nonsense": """
            prediction = {"safeguard": "banana", "naive": None, "ordinary": "apple", "in_range": "cherry"}
            """,
    },
}
CAUSE = ("mechanism", "tensor", "condition")
# Notebook 06: findings made from the solution's (`s`); "off": the model with its options back to the defaults, so
# that only the finding decides.
FINDINGS = {
    "06:check_nan_hunt": {
        "the victim, as the locator's report names it": (True, lambda s: {
            "module": "blocks.0.attn (RWKV6Attention)", "where": "fused_recurrent_rwkv6", "mechanism": "exp_overflow",
            "tensor": "dw", "condition": "strong_decay", "why": "the decay of -148 overflows exp"}),
        "the right code, a plausible wrong cause": (False, lambda s: {
            **s, "mechanism": "exp_overflow", "tensor": "dg", "condition": "bf16_inputs"}),
        "the right code, the cause as a sentence (the old form)": (False, lambda s: {
            **{k: v for k, v in s.items() if k not in CAUSE}, "cause": s["why"]}),
        "the right code, nonsense words": (False, lambda s: {
            **s, "mechanism": "banana", "tensor": "apple", "condition": "cherry grape"}),
        "nonsense": (True, lambda s: {"module": "banana", "where": "apple", "cause": "banana apple cherry grape"}),
    },
    "06:check_silent_hunt": {
        "a forward kernel that is not the state pass": (True, lambda s: {
            **s, "where": "dplr_fwd_o_kernel", "mechanism": "exp_overflow", "tensor": "o",
            "condition": "strong_decay"}),
        "the right kernel, a plausible wrong cause": (False, lambda s: {
            **s, "mechanism": "shifted_row", "tensor": "o", "condition": "any_input"}),
        "the right kernel, the cause as a sentence (the old form)": (False, lambda s: {
            **{k: v for k, v in s.items() if k not in CAUSE}, "cause": s["why"]}),
        "nonsense": (True, lambda s: {"module": "banana", "where": "apple", "cause": "banana apple cherry grape"}),
    },
}


def _cases():
    for exercise in EXERCISES:
        yield pytest.param(exercise, "stub", id=f"{exercise}-stub")
        for label in {**WRONG.get(exercise, {}), **FINDINGS.get(exercise, {})}:
            yield pytest.param(exercise, label, id=f"{exercise}-{label}")


def test_every_exercise_has_wrong_answers_to_reject():
    assert len(EXERCISES) >= 9, sorted(EXERCISES)
    assert not set(EXERCISES) - set(WRONG) - set(FINDINGS), "an exercise without wrong answers here"
    assert not (set(WRONG) | set(FINDINGS)) - set(EXERCISES), "wrong answers for an exercise the notebooks lack"
    for exercise in EXERCISES:
        labels = [*WRONG.get(exercise, {}), *FINDINGS.get(exercise, {})]
        assert len(labels) >= 2 and any("nonsense" in label for label in labels), exercise


def _defined(source: str, name: str, tmp_path: Path):
    """`name` as `source` defines it, from a module on disk (Triton's jit reads its function's source)."""
    path = tmp_path / f"candidate_{abs(hash(source))}.py"
    path.write_text(PREAMBLE + "\n" + textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _solution(exercise: dict) -> dict:
    path = next(p for p in NOTEBOOKS if p.name.startswith(exercise["prefix"] + "_"))
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code" and "solution" in _tags(cell):
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == exercise["argument"]:
                    return ast.literal_eval(node.value)
    raise LookupError(f"no solution assigns {exercise['argument']}")


@pytest.fixture(scope="module")
def mystery_models():
    hunting = lessons.notebook("06")
    off = hunting.mystery_model()
    for exercise in hunting.EXERCISES:
        hunting.switch_off(off, hunting._option(exercise)[0])
    return {True: hunting.mystery_model(), False: off}


@pytest.mark.parametrize("exercise, label", _cases())
def test_the_check_says_not_yet_with_a_hint(exercise, label, tmp_path, mystery_models):
    spec = EXERCISES[exercise]
    check = _check(spec)
    if exercise in FINDINGS:
        finding = {}
        if label == "stub":
            exec(spec["stub"], {}, scope := {})  # noqa: S102  (the notebook's own cell)
            finding, on = scope[spec["argument"]], True
        else:
            on, make = FINDINGS[exercise][label]
            finding = make(_solution(spec))
        verdict = check(mystery_models[on], finding)
        if not on:  # module, code and options right: the cause alone says NOT YET, without saying which part
            assert any("graded as a whole" in f for f in verdict.facts), verdict
            assert not any(re.search(r"\(not yet", f) for f in verdict.facts), verdict
    else:
        source = spec["stub"] if label == "stub" else WRONG[exercise][label]
        verdict = check(_defined(source, spec["argument"], tmp_path))
    assert not verdict.passed and str(verdict).startswith("NOT YET"), str(verdict)
    assert verdict.hints and all(verdict.hints), str(verdict)


def test_a_channel_only_mask_does_not_get_the_stubs_hint(tmp_path):
    spec = EXERCISES["03b:check_padded_exponent"]
    stub = _check(spec)(_defined(spec["stub"], spec["argument"], tmp_path))
    channels = _check(spec)(_defined(WRONG["03b:check_padded_exponent"]["the channel mask only"], spec["argument"],
                                     tmp_path))
    assert channels.hints[:2] != stub.hints[:2]

"""Notebook 06: hunting bugs nobody has catalogued, with the package's own tools (`fla_lab.tools.hunt`, the census in
`fla_lab.spec.check`, `fla_lab.tools.audit`, `fla_lab.tools.atlas`).

Two kinds of models live here:
- `scenario(name)`: one layer (or one op call) per catalogue entry, triggered the way its report met it; the
  tests check the locator names the entry's op, kernel and cause (`bugs.Bug.located`) on every one;
- `mystery_model()`: a small language model built from fla_lab layers, some of them with options that are not
  the defaults, for the learner to find what goes wrong while training it in bf16 (`fla_lab.tools.audit` replays every
  op call of a step against float64); `register_as_called` puts an op as the model called it in the atlas;
  `check_nan_hunt` / `check_silent_hunt` are the two exercises' checks, `cause_choices()` the words they take.

Which options the model is built with, and the last hint tier of each check, are kept in `_MATERIAL`, encoded, the
hint tiers that reason to the answer sealed (`exercises.Sealed`: only `verdict.hint()` opens them), and the
exercises' answers only as digests (`_digest`), so that reading or grepping the package does not answer them:
decoding `_MATERIAL` by hand is reading the answer key.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import inspect
import json
import math
import re
import zlib
from dataclasses import dataclass, replace

import torch
from torch import nn

from fla_lab.spec import check, harness, registry
from fla_lab.teaching import exercises
from fla_lab.tools import gpu_runs, hunt
from fla_lab import runtime
from fla_lab.layers import GatedSlotAttention, RWKV6Attention, RWKV7Attention
from fla_lab.teaching.lessons import gsa_padding

VOCAB, HIDDEN, T_TRAIN = 64, 32, 80  # T = 80: past the chunk path's 64 and a partial last chunk (80 = 64 + 16)
T_HUNT = 48  # the mystery model's sequence: three 16-row chunks of RWKV-7; GSA runs fused_recurrent_gsa (T <= 64)
GATE_GROWTH = 90.0  # the mystery model's GSA gate weights, scaled from their init: slots trained to forget fast
FAST_DECAY_BIAS = 5.0  # w = -exp(5) = -148 per step on a few channels: a decay training pushed to forget at once


@contextlib.contextmanager
def _fork(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def fast_forgetting(layer: RWKV6Attention, channels: int = 4) -> RWKV6Attention:
    """Push a few decay channels of an RWKV6 layer to `-exp(FAST_DECAY_BIAS)` per step (as training can)."""
    with torch.no_grad():
        layer.w_lora.lora[2].bias[:channels] = FAST_DECAY_BIAS
    return layer


class Block(nn.Module):
    """Pre-norm residual block around one attention layer."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.norm = nn.RMSNorm(HIDDEN)
        self.attn = attn

    def forward(self, x):
        return x + self.attn(self.norm(x))[0]


class TinyLM(nn.Module):
    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        with torch.no_grad():  # a shared direction, as trained hidden states have (it is what drives GSA's gates)
            self.embed.weight.add_(1.0)
        self.blocks = nn.ModuleList(Block(layer) for layer in layers)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _layers(seed: int) -> list[nn.Module]:
    with _fork(seed):
        rwkv6 = fast_forgetting(RWKV6Attention("chunk", hidden_size=HIDDEN, num_heads=1, layer_idx=0,
                                               num_hidden_layers=3))
        gsa = GatedSlotAttention(hidden_size=HIDDEN, num_heads=1, num_slots=16)
        with torch.no_grad():
            gsa.f_proj.weight.mul_(GATE_GROWTH)  # some slots have learnt to forget fast (notebook 03b)
        rwkv7 = RWKV7Attention("chunk", hidden_size=HIDDEN, head_dim=HIDDEN, layer_idx=0, num_hidden_layers=3)
    return [rwkv6, gsa, rwkv7]


class BoundOp:
    """An op of `fla_lab.ops` with some of its keyword arguments bound, looked up at call time (so the locator and
    the audit see the call): how a layer runs its op with options of its own (`RWKV7Attention.attention_op`)."""

    def __init__(self, op: str, **options):
        self.op, self.options = op, options

    def __call__(self, *args, **kwargs):
        from fla_lab import ops

        return getattr(ops, self.op)(*args, **kwargs, **self.options)

    def __repr__(self) -> str:
        return f"BoundOp({self.op!r}{''.join(f', {n}={v!r}' for n, v in self.options.items())})"


# The exercises' material, encoded (see the module docstring): per exercise, the module that holds the option the
# model is built with, that option, and the last hint tier of each field of the finding.
_MATERIAL = (
    "eNqNVd1P2zAQ/1dOeSmd2tKyCRCIBzQQb520TUITQpHjXBKvrp3ZTkOF+r/vzk75mEDsLbbPd7+PO+cxM8JkZ/CYrW3ZaaTPrNBWrvxs"
    "MRMhmGwCmW2Dshx1l9UiYF7F3VahxF55zO5ppZVB/0+i9AUXMHqVcnQGoUGwRm+hFU6sMaADW9GuCBBDoW+sR6idKBWaAMqDsWZaKaMC"
    "8qrKW2d/z3pUdRPOwaEo4YawlT+0DZch0CWCPGO4nsH2DbqIKX4wpPeiR3DA6CrragzAW5MIlwkmhNKu244ioRpz6jXKRhjl15HyfsEl"
    "1sKvsMwLJ4xsmLV1spklBCvE1sMDFKhtD9OjOSgDQ+FeuHICRRfiRiHkinfAB6U1lKqqKAEhZrSgbX3gVb22qjx4GI8ng3IlOrURQW0Q"
    "FofP5yzd4nBO4JSpyAGJ8OLQ2c6UnmDC/Bzm8CkGXcBSLJknqeStY5Lpixm+smHw9cm06ChGCRmmCh5u84o4h84Zz2n3nJ8o0pVowgSE"
    "KeORpFqdhzUiXVcBKuU8pTavO4DxSWtKNTTq84JR+uCsqfMSpdgSyJeABvlPT2cnLB07MwjyUg3GWbWfj1JrUFujHvmUJ9UnwMEJ6pCS"
    "44feqYQPE25N2YAoLNk5XRzNx9luR2i90qTR25N39NbkiX2b5ralo0c6i0Sbzqxy1682J3yh6Gre/fNlc5rt/nsuU0HqfJbkRUaQgjqO"
    "eoZpi44UJdq3378tb8gBHJ/zPimjBq9W6Azqt8etbLXLq77MmzyFkRFxavlidIbd1VaQ5CI1fgRCBTXpSG70PIdkSt0Aw7xeXuVX118v"
    "f4GnIU7ONKhbekri69LS2+I9TQi5SHvR7K6+AN+rIJsPJtc3qqLnIaeqQ1f7ELsGxUaZGkQCx9JE7OR7sYWbuwh1Cov79Gbgg9Sd5yGM"
    "8JXxgSkPg6HM/jRdvD9jVakSthySRAnW0tMTAvnF1GLZ96bxaQQTWCmcU4SMO4/y4QbddsCdnjhlhE6x1Ps8Iqz8T8q0OAah2Z3t+KPJ"
    "4v+BdJaVzpNhZ6TOq9QE7ic5a+pojTCR5eJ4SpoMfHa73V+BsTiy"
)
EXERCISES = ("nan", "silent")


@functools.cache
def _material() -> dict:
    return json.loads(zlib.decompress(base64.b64decode(_MATERIAL)))


def _option(exercise: str) -> tuple[str, str, object]:
    """(module name, attribute, value) of the option the model is built with for `exercise`."""
    entry = _material()[exercise]
    attr, value = entry["option"]
    return entry["module"], attr, BoundOp(**value) if isinstance(value, dict) else value


def _default(module: nn.Module, attr: str):
    """The layer's default for `attr`: its constructor's, or None (an attribute the constructor sets to None)."""
    parameter = inspect.signature(type(module)).parameters.get(attr)
    return None if parameter is None else parameter.default


def _is_on(model: nn.Module, exercise: str) -> bool:
    name, attr, _ = _option(exercise)
    module = model.get_submodule(name)
    return getattr(module, attr, None) != _default(module, attr)


def mystery_model(seed: int = 0, switched_on: bool = True) -> TinyLM:
    """Three blocks (RWKV6, GSA, RWKV-7), some built with options other than the defaults; what goes wrong,
    where, and why, is the exercise."""
    model = TinyLM(_layers(seed))
    for exercise in EXERCISES if switched_on else ():
        name, attr, value = _option(exercise)
        setattr(model.get_submodule(name), attr, value)
    return model.to(runtime.device())


def _switches_on(model: TinyLM) -> int:
    """How many of the options that make the model go wrong are still on (for the tests: on the learner's path,
    only a check whose finding is right says whether its option is off)."""
    return sum(_is_on(model, exercise) for exercise in EXERCISES)


def switch_off(model: nn.Module, module_name: str) -> None:
    """Put the module `module_name` (the locator's `module` line, or a name like "blocks.0.attn") back on the
    layer's defaults: its `bug=` switch off, and any option the model was built with back to the default. It says
    the same for every module, whether or not it held one: what tells is the check, once the finding is right, and
    a training step."""
    name = str(module_name or "").split(" (")[0].strip()
    try:
        module = model.get_submodule(name) if name else None
    except AttributeError:
        module = None
    if module is None or module is model:
        print(f"{name or '(empty)'!r} is not a module of the model: print(model) lists them")
        return
    if hasattr(module, "bug"):
        module.bug = None
    for exercise in EXERCISES:
        where, attr, _ = _option(exercise)
        if where == name and _is_on(model, exercise):
            setattr(module, attr, _default(module, attr))
    print(f"{name}: back on its layer's defaults")


def tokens(T: int = T_HUNT, seed: int = 0) -> torch.Tensor:
    """Synthetic data: a repeated random sequence, so a working model's loss falls within a few steps."""
    gen = torch.Generator().manual_seed(seed)
    period = torch.randint(0, VOCAB, (T // 4 + 1,), generator=gen)
    return period.repeat(4)[: T + 1][None].to(runtime.device())


@dataclass
class Step:
    loss: float
    grads_finite: bool
    error: str = ""  # what an op's input check raised, if it did

    def __str__(self) -> str:
        if self.error:
            return f"raised: {self.error}"
        return f"loss {self.loss:.3f}, every gradient finite: {self.grads_finite}" + ("" if self.grads_finite else
                                                                                        " (update skipped)")


def autocast():
    return torch.autocast(runtime.device(), dtype=torch.bfloat16)


def loss_of(model: TinyLM, data: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of one bf16 autocast forward."""
    with autocast():
        logits = model(data[:, :-1])
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), data[:, 1:].flatten())


def train_step(model: TinyLM, optimizer, data: torch.Tensor) -> Step:
    """One bf16 autocast step: next-token cross-entropy, backward, and an update only if every gradient is finite
    (the guard a training loop has: a NaN gradient skips the step rather than poison the weights)."""
    optimizer.zero_grad()
    try:
        loss = loss_of(model, data)
    except ValueError as exc:  # an op's input check: non-finite or out-of-contract input
        return Step(math.nan, False, str(exc).split(";")[0])
    loss.backward()
    finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    if finite:
        optimizer.step()
    return Step(float(loss.detach()), finite)


def train(model: TinyLM, steps: int = 3, lr: float = 1e-3, seed: int = 0) -> list[Step]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = tokens(seed=seed)
    return [train_step(model, optimizer, data) for _ in range(steps)]


def hunt_step(model: TinyLM, seed: int = 0) -> hunt.Report:
    """One training step's forward and backward inside the locator; returns its report (`report.calls` holds
    every op call it recorded, with its inputs)."""
    with hunt.locate(model) as found:
        loss_of(model, tokens(seed=seed)).backward()
    return found.report


def grad_census(model: nn.Module, prefix: str = "") -> dict[str, check.Census]:
    """The non-finite census of every parameter's gradient under `prefix` (after a backward)."""
    return {name: check.nonfinite_census(p.grad, dims=tuple(f"i{n}" for n in range(p.grad.dim())))
            for name, p in model.named_parameters() if name.startswith(prefix) and p.grad is not None}


def register_as_called(call: hunt.Call, library: str = "model") -> str:
    """Register the op of a recorded call, with the call's switches bound, as `<library>:<op>` in the registry
    (same inputs, reference and tolerances as the shipped op), so the atlas can sweep it beside the shipped one."""
    spec = registry.get(call.op)
    switches = {n: v for n, v in call.kwargs.items() if n == "bug"}
    registry.ops()[f"{library}:{spec.name}"] = replace(spec, fn=functools.partial(spec.fn, **switches),
                                                       library=library, bug_names=())
    return f"{library}:{spec.name}"


# --- the checks ------------------------------------------------------------------------------------------------
# A finding names the module, the code (`where`) and the cause, chosen from `cause_choices()`: the mechanism, the
# tensor it first makes wrong, and the condition for it to show; `why` is the learner's own sentence, which must cite
# a number read off a tool (a threshold, a length, an error). Each field is compared with the answer key as a digest
# (`_digest` of the normalised answer), and the finding is graded as a whole: a NOT YET never says which field is
# right, so that no field falls to trial and error, and its hints point at the tool output to read, following only
# what a tool's output already contradicts (the victim the report names, an op where the locator found none).

FIELDS = ("module", "where", "mechanism", "tensor", "condition")
MECHANISMS = {  # the locator's causes (`hunt.CAUSES`), and what else a kernel or a layer can get wrong
    "exp_overflow": "exp of a large positive exponent overflows to inf (then inf * 0 = NaN)",
    "padded_rows": "rows past the end of the sequence stay live in a computation",
    "positive_decay": "a log-decay above 0: the state grows at every step",
    "rounded_decay": "a decay rounded to 16 bits: a per-step bias that compounds",
    "uninitialised": "values read before anything wrote them (torch.empty)",
    "cancellation": "a difference of two nearly equal numbers keeps none of their digits",
    "masked_branch": "a branch that torch.where (or a mask) discards in the forward still enters the backward",
    "shifted_row": "a value read from the neighbouring row or step (t - 1 for t, exclusive for inclusive)",
    "unmasked_load": "a load or store reaches past the valid rows or channels of its tile",
    "transposed_index": "a tile or a mask indexed with its two axes swapped",
    "narrow_accumulator": "a sum accumulated in 16 bits",
}
CONDITIONS = {  # the atlas's axes and the locator's stats
    "any_input": "any input at all",
    "strong_decay": "a per-step log-decay, or a gate logit, far below 0 (the atlas's large m)",
    "weak_decay": "a per-step log-decay near 0",
    "partial_last_chunk": "T not a multiple of the chunk size",
    "state_crosses_chunk": "a state carried out of a chunk: a final state, or T longer than one chunk",
    "initial_state": "an initial state passed in",
    "bf16_inputs": "inputs in 16 bits (autocast)",
    "long_sequence": "hundreds of steps, for something that compounds",
    "packed_batch": "several sequences packed into one (cu_seqlens)",
}
OP_TENSORS = ("o", "ht", "dq", "dk", "dv", "dg", "ds", "dr", "dw", "du", "da", "db", "dinitial_state")  # the audit's

_KEY = {  # per exercise and field: the digests of the accepted answers ("victim": the module whose op received the NaN)
    "nan": {"module": {"0f8b8362b163bf01"}, "where": {"7a3340fc6b7b0573"}, "mechanism": {"36aed9b43f0dbd08"},
            "tensor": {"f0ab84b583ffddd5"}, "condition": {"255001a47441f368"}, "victim": {"28e878b910f6a551"}},
    "silent": {"module": {"786ad87fd605d364"}, "where": {"aa079ccfd217013e"}, "mechanism": {"02a2ce9e99bd1440"},
               "tensor": {"81c88b0619f98690"}, "condition": {"dac50e60a6f724d6"}},
}


def _normal(field: str, value) -> str:
    """A finding's field as the key compares it: lower case, without the locator's " (Class)"; `where`: the last
    dotted name (`Class.method` -> `method`); `tensor`: without its block's prefix (`blocks.0.attn.`)."""
    text = str(value or "").split(" (")[0].strip().lower()
    if field == "where":
        return text.removesuffix("()").rsplit(".", 1)[-1]
    if field == "tensor":
        return re.sub(r"^blocks\.\d+\.(attn\.)?", "", text.removesuffix(".grad"))
    return text


def _digest(exercise: str, field: str, value) -> str:
    return hashlib.sha256(f"fla_lab 06 {exercise} {field}: {_normal(field, value)}".encode()).hexdigest()[:16]


def _right(exercise: str, field: str, value) -> bool:
    return bool(_normal(field, value)) and _digest(exercise, field, value) in _KEY[exercise][field]


def _tensors(model: nn.Module) -> set[str]:
    return set(OP_TENSORS) | {_normal("tensor", name) for name, _ in model.named_parameters()}


def cause_choices() -> None:
    """Print the words a finding's cause is written in: mechanisms, tensors, conditions."""
    width = max(map(len, [*MECHANISMS, *CONDITIONS]))
    print("mechanism: what goes wrong")
    print("\n".join(f"  {key:<{width}}  {text}" for key, text in MECHANISMS.items()))
    print("tensor: the first value it makes wrong (or non-finite)")
    print("  an op's output, final state or gradient, as the audit names them:")
    print(f"    {', '.join(OP_TENSORS)}")
    print("  or a parameter's gradient, as lesson.grad_census names it, with or without its block:")
    print("    blocks.0.attn.r_proj.weight or r_proj.weight")
    print("condition: what the input must have for it to show")
    print("\n".join(f"  {key:<{width}}  {text}" for key, text in CONDITIONS.items()))


WHY_WORDS = 8  # `why`: a sentence at least this long, citing a number


@dataclass
class _Finding:
    shown: dict[str, str]     # each field as the check prints it
    right: dict[str, bool]    # never printed one by one: the finding is graded as a whole
    offered: dict[str, bool]  # the cause's fields: one of `cause_choices()`
    facts: list[tuple[bool, str]]

    @property
    def whole(self) -> bool:
        return all(self.right.values())


def _why(finding: dict) -> tuple[bool, str]:
    """`why` holds when it is a sentence that cites a number: what the learner measured or read (a threshold, a
    length, an error). The check cannot grade the reasoning; it asks that the sentence rest on something measured."""
    text = str(finding.get("why") or "")
    words, cites = len(text.split()), bool(re.search(r"\d", text))
    ok = words >= WHY_WORDS and cites
    need = "" if ok else (f" (a sentence of {WHY_WORDS} words or more that cites a number you read off a tool: a "
                          "threshold, a length, an error)")
    return ok, f"why: {words} word(s), cites a number: {'yes' if cites else 'no'}{need}"


def _read(model: nn.Module, finding, exercise: str) -> _Finding:
    finding = finding if isinstance(finding, dict) else {}
    shown = {field: _normal(field, finding.get(field)) for field in FIELDS}
    shown["module"] = str(finding.get("module") or "").split(" (")[0].strip()
    right = {field: _right(exercise, field, finding.get(field)) for field in FIELDS}
    right["where"] &= right["module"]
    choices = {"mechanism": set(MECHANISMS), "tensor": _tensors(model), "condition": set(CONDITIONS)}
    offered = {field: shown[field] in options for field, options in choices.items()}
    # each field as written; a note only where the word is no answer at all (empty, or not in the list)
    facts = [(bool(shown[field]), f"{field}: {shown[field] or '(empty)'}") for field in ("module", "where")]
    for field in choices:
        note = ("" if offered[field] else
                " (not one of lesson.cause_choices())" if shown[field] else " (choose from lesson.cause_choices())")
        facts.append((offered[field], f"{field}: {shown[field] or '(empty)'}{note}"))
    facts.append(_why(finding))
    found = _Finding(shown, right, offered, facts)
    facts.append((found.whole, "the finding as a whole: right" if found.whole else
                  "the finding as a whole: not yet (graded as a whole: this check does not say which part; read "
                  "each part off a tool's output)"))
    return found


def _module_hint(model: nn.Module, module: str) -> tuple[str, ...] | None:
    """A hint when `module` is no layer of the model: not a module at all, or a block rather than its layer."""
    try:
        found = model.get_submodule(module)
    except AttributeError:
        return exercises.hints(where=f"{module!r} is not a module of the model: print(model) lists them, and the "
                                     "report's `module` line spells one")
    if isinstance(found, Block):
        return exercises.hints(what=f"name the layer, not its block: {module}.attn, as the locator's `module` "
                                    "line and grad_census spell it")
    return None


def _answer(exercise: str) -> exercises.Sealed:
    """The last hint tier of a finding not yet right: the whole finding, field by field, sealed (only the hint
    that prints it as a tier opens it; `verdict.hints` shows a placeholder)."""
    lines = _material()[exercise]["lines"]
    return exercises.Sealed(exercises.seal(" | ".join(lines[field] for field in FIELDS)))


def _with_format_notes(found: _Finding, tiers: tuple[str, ...]) -> tuple[str, ...]:
    """Tiers with a note, first, on every cause word that is not in `cause_choices()` (a word, not an answer)."""
    stray = [f"{found.shown[f]!r} is not one of lesson.cause_choices()'s {f}s" for f in found.offered
             if found.shown[f] and not found.offered[f]]
    return ((f"{'; '.join(stray)}. {tiers[0]}",) + tiers[1:]) if stray else tiers


def _switched_on_hints(on: bool) -> tuple[str, ...]:
    """A right finding whose option is still on."""
    return exercises.hints(what="the finding is right: now switch it off, lesson.switch_off(model, module)") if on \
        else ()


def _op_or_kernel(name: str) -> bool:
    """`name` spells an op of the registry or a Triton kernel (not a layer's method)."""
    return name.endswith("_kernel") or any(name == spec.name for spec in registry.ops().values())


_NAN_HINTS = (  # a finding not yet right, when nothing it says contradicts a tool's output on its face
    "Read each part off a tool's output, not off this check (it grades the finding as a whole). module: the census "
    "of each block's parameter gradients, lesson.grad_census(model, prefix): on the way back from the loss, where "
    "does finite turn non-finite? where: the locator checked every op's boundary, so read the layer's own PyTorch "
    "code, the method that uses the parameter with the non-finite gradient (inspect.getsource). mechanism: what "
    "that method's line does in the forward, and what autograd does with it in the backward. tensor: the first "
    "value the census finds non-finite. condition: what the input of that line must be for its backward to be "
    "non-finite.",
    exercises.Sealed(  # the reasoning: it states the answer, so it opens only as a hint
        "VGhlIGZvcndhcmQgaXMgZmluaXRlIGFuZCBubyBvcCBtYWRlIHRoZSBOYU46IHRoZSBibG9jayBiZXR3ZWVuIHRoZSBmaW5pdGUgZ3JhZGll"
        "bnRzIGFuZCBibG9jayAwIGNvbXB1dGVzIGl0cyBnYXRlIHdpdGggdG9yY2gud2hlcmUuIEF1dG9ncmFkIGRpZmZlcmVudGlhdGVzIGJvdGgg"
        "YnJhbmNoZXMgb2YgdG9yY2gud2hlcmUgYW5kIG11bHRpcGxpZXMgdGhlIGRpc2NhcmRlZCBicmFuY2gncyBncmFkaWVudCBieSAwOyB3aGVy"
        "ZSB0aGF0IGJyYW5jaCdzIGRlcml2YXRpdmUgaXMgaW5maW5pdGUsIDAgKiBpbmYgPSBOYU4uIGxvZyhzaWdtb2lkKHgpKSBpcyAtaW5mLCBh"
        "bmQgaXRzIGRlcml2YXRpdmUgMS9zaWdtb2lkKHgpIGlzIGluZiwgb25jZSBzaWdtb2lkKHgpIHJvdW5kcyB0byAwOiBiZWxvdyB4ID0gLTg4"
        "LjcgaW4gZnAzMiAoYmYxNiBoYXMgdGhlIHNhbWUgcmFuZ2U6IHRoZSAxNiBiaXRzIGFyZSBub3QgdGhlIGNhdXNlKSwgYSBnYXRlIHRoYXQg"
        "Zm9yZ2V0cyBldmVyeXRoaW5nIGluIG9uZSBzdGVwLiBUaGUgb3AncyBvd24gZ3JhZGllbnRzIGFyZSBmaW5pdGUsIHNvIHRoZSBmaXJzdCBu"
        "b24tZmluaXRlIHZhbHVlIGlzIGEgcGFyYW1ldGVyJ3MgZ3JhZGllbnQsIGFzIGdyYWRfY2Vuc3VzIG5hbWVzIGl0Lg=="),
)


def check_nan_hunt(model: TinyLM, finding: dict, steps: int = 1) -> exercises.Verdict:
    """Exercise 1: `finding` names the module and the code (kernel or layer method) that make the NaN, its cause
    from `cause_choices()`, and a `why` that cites a number; graded as a whole. Once it is right: the module's
    option is back to its default, and a bf16 training step is finite."""
    found = _read(model, finding, "nan")
    facts = list(found.facts)
    on = found.whole and _is_on(model, "nan")
    if found.whole:  # the option's state is said only of a right finding (else the check would name the module)
        facts.append((not on, f"its option is back to the default: {not on}"))
    if all(ok for ok, _ in facts):
        trained = train(model, steps=steps)
        finite = all(step.grads_finite for step in trained)
        facts.append((finite, f"{steps} bf16 training step(s), every gradient finite: {finite}"))
    return exercises.verdict("find where the NaN is made", facts, hint=_nan_hints(model, found, on))


def _nan_hints(model: nn.Module, found: _Finding, on: bool) -> tuple[str, ...]:
    module, where = found.shown["module"], found.shown["where"]
    if found.whole:
        return _switched_on_hints(on) or _why_hints(found)
    if module and _right("nan", "victim", module):  # the report's own module: its `fault` line says input
        tiers = exercises.hints(
            where="the report's `call` and `cause` lines: did the NaN appear in the op the report names, or did it "
                  "reach that op already non-finite?",
            what="the gradient reached block 0 already non-finite, so it was made later in the forward; the census "
                 "of the parameter gradients of blocks.1 and blocks.2 shows where finite turns non-finite",
            line=_answer("nan"))
    elif module and _module_hint(model, module):
        tiers = _module_hint(model, module) + (_answer("nan"),)
    elif where and _op_or_kernel(where):  # the locator found every op's gradients finite where the op made them
        tiers = exercises.hints(
            where=f"{where!r} is an op or a kernel, and the locator checked every op's boundary: the report's cause "
                  "says the gradient reached the op already non-finite, and its fix line points at PyTorch code "
                  "between ops",
            what="the NaN is made in a layer's own PyTorch code: which parameter's gradient is non-finite while the "
                 "op's are finite? Follow it to the method that uses it (`Class.method`)",
            line=_answer("nan"))
    else:
        tiers = _NAN_HINTS + (_answer("nan"),)
    return _with_format_notes(found, tiers)


def _why_hints(found: _Finding) -> tuple[str, ...]:
    """The parts are right and `why` is not yet a sentence that cites a number."""
    return exercises.hints(what="the parts are right; write `why` as a sentence of your own that cites what you "
                                "measured or read (a threshold, a length, an error)")


_SILENT_HINTS = (  # a finding not yet right, when nothing it says contradicts a tool's output on its face
    "Read each part off a tool's output, not off this check (it grades the finding as a whole). module: the audit "
    "table's WRONG call. where: the atlas lines of that call's op (which tensors are wrong at T = 16, one chunk, "
    "and which only from T = 32?), then the op's module docstring, which says what each kernel computes, and the "
    "kernel's source. mechanism: what that kernel's line computes, and from which data. tensor: the first value it "
    "makes wrong, as the audit and the atlas name it. condition: what the input must have for the error to show "
    "(compare the two lengths).",
    exercises.Sealed(  # the reasoning: it states the answer, so it opens only as a hint
        "Tm90aGluZyBvdmVyZmxvd3MgYW5kIG5vdGhpbmcgaXMgTmFOOiBhIGtlcm5lbCBjb21wdXRlcyBhIGZpbml0ZSBudW1iZXIgZnJvbSB0aGUg"
        "d3JvbmcgZGF0YS4gVGhlIGZpcnN0IGNodW5rJ3Mgb3V0cHV0IG5ldmVyIHJlYWRzIHRoZSBjYXJyaWVkIHN0YXRlLCBzbyBpdCBpcyByaWdo"
        "dCBhdCBUID0gMTY7IHRoZSB2YWx1ZSB0aGUga2VybmVsIGdldHMgd3JvbmcgZmlyc3QgaXMgdGhlIG9uZSBpdCBjYXJyaWVzIG91dCBvZiBh"
        "IGNodW5rLCB3cm9uZyBhdCBUID0gMTYgYWxyZWFkeS4gT25seSBvbmUgZm9yd2FyZCBrZXJuZWwgY2FycmllcyB0aGUgc3RhdGUgZnJvbSBv"
        "bmUgY2h1bmsgdG8gdGhlIG5leHQgKHRoZSBvcCdzIG1vZHVsZSBkb2NzdHJpbmcgbmFtZXMgaXQpOiByZWFkIHRoZSBkZWNheSBpdCBsb2Fk"
        "cyBhdCB0aGUgY2h1bmsncyBsYXN0IHJvdywgdGhyb3VnaCBpdHMgRU5EX0RFQ0FZIHNsb3QgKHRoZSBsYXVuY2hlciwgX3N0YXRlcywgc2F5"
        "cyB3aGljaCBoZWxwZXIgYSBjYWxsIHBhc3NlczsgdGhlIG9wJ3MgYnVnPSBzd2l0Y2ggcGlja3MgdGhlIG90aGVyIG9uZSksIGFnYWluc3Qg"
        "dGhlIGRvY3N0cmluZydzIEdfdCAoaW5jbHVzaXZlOiB1cCB0byByb3cgdCkgYW5kIEdlX3QgPSBHX3t0LTF9IChleGNsdXNpdmUpLg=="),
)


def check_silent_hunt(model: TinyLM, finding: dict) -> exercises.Verdict:
    """Exercise 2: `finding` names the module and the kernel of the wrong-but-finite result, its cause from
    `cause_choices()`, and a `why` that cites a number; graded as a whole. Once it is right: the module's option is
    back to its default, and the module's op, as the model calls it now, matches float64 over two chunks."""
    found = _read(model, finding, "silent")
    facts = list(found.facts)
    on = found.whole and _is_on(model, "silent")
    if found.whole:  # the option's state is said only of a right finding (else the check would name the module)
        facts.append((not on, f"its option is back to the default: {not on}"))
    if all(ok for ok, _ in facts):
        cmp = _layer_op_check(model.get_submodule(found.shown["module"]))
        worst = max(cmp.errors.values())
        facts.append((cmp.ok, f"the block's op against float64 (T = 32, bf16): worst error {worst:.1e}, tolerance "
                              f"{cmp.tolerance.fwd:.0e}: {'right' if cmp.ok else 'WRONG'}"))
    return exercises.verdict("find the wrong-but-finite result", facts, hint=_silent_hints(model, found, on))


def _layer_op(layer: nn.Module):
    """The op a layer runs now, and its registry name."""
    op = getattr(layer, "attention_op", None) or layer.default_op()
    return op, getattr(op, "op", None) or op.__name__


def _layer_op_check(layer) -> harness.Comparison:
    op, name = _layer_op(layer)
    spec = registry.get(name)
    return harness.compare(op, spec.reference, spec.inputs(registry.Shape(1, 32, 1, 16, 16), initial_state=False),
                           dtype=torch.bfloat16)


@functools.cache
def _kernels(op: str) -> tuple[frozenset[str], frozenset[str]]:
    """The Triton kernels `op` launches in its forward, and in its forward and backward (traced on a small call)."""
    spec = registry.get(op)
    x = harness.leaves(spec.inputs(registry.Shape(1, 32, 1, 16, 16), initial_state=False), torch.float32,
                       runtime.device())
    with hunt.trace_kernels() as tracer:
        o, _ = spec.fn(**x)
        o.sum().backward()
    launched = {phase: frozenset(l.kernel for l in tracer.launches if l.phase == phase)
                for phase in ("forward", "backward")}
    return launched["forward"], launched["forward"] | launched["backward"]


def _silent_hints(model: nn.Module, found: _Finding, on: bool) -> tuple[str, ...]:
    module, where = found.shown["module"], found.shown["where"]
    if found.whole:
        return _switched_on_hints(on) or _why_hints(found)
    tiers = _SILENT_HINTS + (_answer("silent"),)
    if module and _module_hint(model, module):
        tiers = _module_hint(model, module) + (_answer("silent"),)
    elif module and where and hasattr(model.get_submodule(module), "default_op"):  # an attention layer, whose op
        # does not launch `where`, or launches it only in its backward: the atlas contradicts that on its face
        _, op = _layer_op(model.get_submodule(module))
        forward, launched = _kernels(op)
        family = registry.get(op).family
        if where not in launched:
            tiers = (f"{where!r} is not a kernel that {module}'s op, {op}, launches: the module docstring of "
                     f"fla_lab.ops.{family}.chunk names its kernels. {_SILENT_HINTS[0]}",) + tiers[1:]
        elif where not in forward:
            tiers = (f"{where!r} runs in {op}'s backward only, and the atlas lines show the flagged call's output o "
                     f"wrong from T = 32, which no backward kernel computes. {_SILENT_HINTS[0]}",) + tiers[1:]
    return _with_format_notes(found, tiers)


# --- one scenario per catalogue entry -----------------------------------------------------------------------------

def _rwkv6_layer(mode: str, bug: str | None, seed: int = 0, hidden: int = HIDDEN):
    with _fork(seed):
        return RWKV6Attention(mode, hidden_size=hidden, num_heads=1, layer_idx=0, num_hidden_layers=2,
                              bug=bug).to(runtime.device())


def _hidden(T: int, width: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, T, width, generator=torch.Generator().manual_seed(seed)).to(runtime.device())


def _locate_layer(layer: nn.Module, x: torch.Tensor, autocast_bf16: bool = False) -> hunt.Report:
    with hunt.locate(layer) as found:
        with autocast() if autocast_bf16 else contextlib.nullcontext():
            out = layer(x)[0]
        out.float().pow(2).mean().backward()
    return found.report


def _uninitialized_params():
    with _fork(0):
        layer = RWKV7Attention("chunk", hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2,
                               bug="uninitialized_params").to(runtime.device())
    return _locate_layer(layer, _hidden(16, 64))


def _sigmoid_decay():  # #11: the official init, 360 steps for the state to pass fp32's range
    return _locate_layer(_rwkv6_layer("fused_recurrent", "sigmoid_decay", hidden=16), _hidden(360, 16))


def _exclusive_reference():
    return _locate_layer(fast_forgetting(_rwkv6_layer("chunk", "exclusive_reference")), _hidden(T_TRAIN, HIDDEN))


def _unmasked_padding():
    return _locate_layer(gsa_padding.grown_layer(), gsa_padding.batch(T_TRAIN))


def _transposed_h0_mask():  # #18: the op itself, with an initial state, as the report called it
    from fla_lab import ops
    from fla_lab.spec import registry

    spec = registry.get("fused_recurrent_rwkv6")
    x = {n: t.to(runtime.device()).requires_grad_() for n, t in
         spec.inputs(registry.Shape(1, 16, 1, 32, 64), initial_state=True).items()}
    with hunt.locate() as found:
        o, _ = ops.fused_recurrent_rwkv6(**x, bug="transposed_h0_mask")
        o.sum().backward()
    return found.report


def _bf16_decay():
    with _fork(0):
        layer = RWKV7Attention("chunk", hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2,
                               bug="bf16_decay").to(runtime.device())
    return _locate_layer(layer, _hidden(32, 64), autocast_bf16=True)


SCENARIOS = {"uninitialized_params": _uninitialized_params, "sigmoid_decay": _sigmoid_decay,
             "exclusive_reference": _exclusive_reference, "unmasked_padding": _unmasked_padding,
             "transposed_h0_mask": _transposed_h0_mask, "bf16_decay": _bf16_decay}


def scenario(name: str) -> hunt.Report:
    """Trigger catalogue entry `name` in a layer (or op call) inside the locator; returns the report."""
    return SCENARIOS[name]()


# ----------------------------------------------------------------------------------------------------------
# Going further: what the GPU runs measured, read from their result files (not recomputed here)


def gpu_atlas_summary(path=gsa_padding.GPU_ATLAS) -> str:
    """One line on the GPU atlas (`python -m benchmarks.atlas_gpu`): its device, and the worst scale-aware error of
    fla_lab's fixed ops over every setting, with how many settings it judged right."""
    import json

    run = json.loads(path.read_text())
    ours = [r for r in run["records"] if not r["op"].startswith("fla:") and r["variant"] == "fixed"]
    worst = max(ours, key=lambda r: max(r["errors"].values()))
    env = run["environment"]
    right = sum(r["status"] == "right" for r in ours)
    return (f"GPU atlas ({env['device']}, torch {env['torch']}, triton {env['triton']}): fla_lab's fixed ops right "
            f"in {right} of {len(ours)} settings, worst scale-aware error {max(worst['errors'].values()):.2g} "
            f"({worst['op']}, T = {worst['T']}, m = {worst['decay']:g})")


def locator_cost(path=gpu_runs.path("bench_hunt")) -> str:
    """One line on what the locator costs a training step (`python -m benchmarks.hunt_cost`'s result, shipped)."""
    import json

    run = json.loads(path.read_text())
    return (f"locator ({run['device']}, fla_lab/tools/gpu_runs/bench_hunt.json): a clean step of {run['depth']} "
            f"RWKV7Attention('chunk') layers, hidden {run['hidden']}, T = {run['T']}, bf16 autocast: "
            f"{run['plain_ms']:.1f} ms without it, {run['located_ms']:.1f} ms inside the block, "
            f"{run['ratio']:.2f}x")

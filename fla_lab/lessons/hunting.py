"""Notebook 06: hunting bugs nobody has catalogued, with the package's own tools (`fla_lab.hunt`, the census in
`fla_lab.check`, `fla_lab.atlas`).

Two kinds of models live here:
- `scenario(name)`: one layer (or one op call) per catalogue entry, triggered the way its report met it; the
  tests check the locator names the entry's op, kernel and cause (`bugs.Bug.located`) on every one;
- `mystery_model()`: a small language model built from fla_lab layers with switches planted inside that are NOT
  in the catalogue (`bugs.PLANTED`), for the learner to find while training it in bf16 (`fla_lab.audit` replays
  every op call of a step against float64), `register_as_called` puts an op as the model called it in the atlas,
  `check_nan_hunt` / `check_silent_hunt` are the two exercises' checks.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from fla_lab import bugs, check, exercises, harness, hunt, registry, runtime
from fla_lab.layers import GatedSlotAttention, RWKV6Attention, RWKV7Attention
from fla_lab.lessons import gsa_padding

VOCAB, HIDDEN, T_TRAIN = 64, 32, 80  # T = 80: past the chunk path's 64 and a partial last chunk (80 = 64 + 16)
T_HUNT = 48  # the capstone's model: three 16-row chunks of RWKV-7; GSA: a partial 64-row chunk while its switch
#             is on (chunk_gsa), fused_recurrent_gsa once it is off (T <= 64, as upstream's layer)
GATE_GROWTH = 90.0  # the capstone's GSA gate weights, scaled from their init: slots trained to forget fast
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


def _layers(switches: dict[str, str | None], seed: int) -> list[nn.Module]:
    with _fork(seed):
        rwkv6 = fast_forgetting(RWKV6Attention("chunk", hidden_size=HIDDEN, num_heads=1, layer_idx=0,
                                               num_hidden_layers=3, bug=switches.get("rwkv6")))
        gsa = GatedSlotAttention(hidden_size=HIDDEN, num_heads=1, num_slots=16, bug=switches.get("gsa"))
        with torch.no_grad():
            gsa.f_proj.weight.mul_(GATE_GROWTH)  # some slots have learnt to forget fast (notebook 03b)
        rwkv7 = RWKV7Attention("chunk", hidden_size=HIDDEN, head_dim=HIDDEN, layer_idx=0, num_hidden_layers=3)
        if switches.get("rwkv7"):
            rwkv7.attention_op = KernelSwitch("chunk_rwkv7", switches["rwkv7"])
    return [rwkv6, gsa, rwkv7]


class KernelSwitch:
    """An op looked up in `fla_lab.ops` at call time (so the locator sees the call) with a `bug=` switch on: how a
    layer without a kernel switch of its own (RWKV7Attention) runs a switched kernel."""

    def __init__(self, op: str, bug: str):
        self.op, self.bug = op, bug

    def __call__(self, *args, **kwargs):
        from fla_lab import ops

        return getattr(ops, self.op)(*args, **kwargs, bug=self.bug)


_SWITCHES = {"gsa": "capstone_a", "rwkv7": "capstone_b"}  # bugs.PLANTED, by the block that holds each


def mystery_model(seed: int = 0, switched_on: bool = True) -> TinyLM:
    """Three blocks (RWKV6, GSA, RWKV-7) with bugs planted somewhere inside, none of them in the catalogue. Where,
    and why, is the exercise (the answer key: docs/onboarding.md, "Answer keys")."""
    return TinyLM(_layers(_SWITCHES if switched_on else {}, seed)).to(runtime.device())


def switches_on(model: TinyLM) -> int:
    """How many planted switches are still on (not which)."""
    return sum(_switch(m) is not None for m in model.modules())


def _switch(module: nn.Module) -> str | None:
    planted = {name for name, _ in bugs.PLANTED}
    op = getattr(module, "attention_op", None)
    for bug in (getattr(module, "bug", None), getattr(op, "bug", None)):
        if bug in planted:
            return bug
    return None


def switch_off(model: nn.Module, module_name: str) -> bool:
    """Turn off every switch of the module `module_name` (the locator's `module` line, or a name like
    "blocks.0.attn"): its `bug=` and a switched op. Returns whether it held one."""
    module = model.get_submodule(module_name.split(" (")[0])
    held = _switch(module) is not None or getattr(module, "bug", None) is not None
    module.bug = None
    if isinstance(getattr(module, "attention_op", None), KernelSwitch):
        module.attention_op = None
    return held


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

@dataclass(frozen=True)
class Answer:
    module: str
    where: tuple[str, ...]  # accepted last names of the code that holds the line (a kernel, a layer method)
    victim: str             # the module the locator (or a careless reading) points at instead


_ANSWERS = {"nan": Answer("blocks.1.attn", ("gates",), "blocks.0.attn"),
           "silent": Answer("blocks.2.attn", ("dplr_fwd_h_kernel",), "")}


def _named(finding: dict, key: str) -> str:
    return str(finding.get(key) or "").split(" (")[0].strip().rsplit(".", 1)[-1] if key == "where" else \
        str(finding.get(key) or "").split(" (")[0].strip()


def _finding_facts(finding: dict, answer: Answer, what: str) -> tuple[list[tuple[bool, str]], str, str]:
    module, where = _named(finding, "module"), _named(finding, "where")
    cause = len(str(finding.get("cause") or "").split())
    facts = [(module == answer.module, f"module: {module or '(empty)'}"
                                       + ("" if module == answer.module else f" (not where {what} is made)")),
             (module == answer.module and where in answer.where, f"where: {where or '(empty)'}"
                                                                 + ("" if where in answer.where else " (not yet)")),
             (cause >= 4, f"cause: {cause} word(s) (write a sentence)" if cause < 4 else f"cause: {cause} words")]
    return facts, module, where


def check_nan_hunt(model: TinyLM, finding: dict, steps: int = 1) -> exercises.Verdict:
    """Exercise 1: `finding` names the module and the code (kernel or layer method) that make the NaN, and says
    why; the module's switch is off; a bf16 training step is finite."""
    answer = _ANSWERS["nan"]
    facts, module, where = _finding_facts(finding, answer, "the NaN")
    on = _switch(model.get_submodule(answer.module)) is not None
    facts.append((not on, f"the NaN's switch is off: {not on}"))
    if all(ok for ok, _ in facts):
        trained = train(model, steps=steps)
        finite = all(step.grads_finite for step in trained)
        facts.append((finite, f"{steps} bf16 training step(s), every gradient finite: {finite}"))
    return exercises.verdict("find where the NaN is made", facts, hint=_nan_hints(module, where, on))


def _nan_hints(module: str, where: str, on: bool) -> tuple[str, ...]:
    answer = _ANSWERS["nan"]
    if module in ("", answer.victim):
        return exercises.hints(
            where="the report's `call` line: did the NaN appear in chunk_rwkv6, or did it arrive there?",
            what="the gradient reached block 0 already non-finite, so it was made later in the forward; the census "
                 "of the parameter gradients of blocks.1 and blocks.2 shows where finite turns non-finite",
            line="blocks.1.attn: the only parameter of that block whose gradient is non-finite is f_proj.weight: "
                 "read GatedSlotAttention.gates")
    if module != answer.module:
        return exercises.hints(where=f"{module}'s parameter gradients: are they all finite? (grad_census)",
                               what="the block whose gradients turn non-finite on the way back is the one "
                                    "between the finite ones and block 0")
    if where not in answer.where:
        return exercises.hints(
            where="no op of blocks.1.attn reports a non-finite gradient (the locator watched them): the NaN is "
                  "made in the layer's own PyTorch code",
            what="which parameter of the block has a non-finite gradient? Follow it to the method that uses it",
            line="where = 'GatedSlotAttention.gates' (the forget gate)")
    if on:
        return exercises.hints(what="the finding is right: now switch it off, lesson.switch_off(model, module)")
    return exercises.hints(what="write the cause as a sentence: which operation, why finite forward, why NaN backward")


def check_silent_hunt(model: TinyLM, finding: dict) -> exercises.Verdict:
    """Exercise 2: `finding` names the module and the kernel of the wrong-but-finite result and why; its switch
    is off; the module's op, as the model calls it now, matches float64 over two chunks."""
    answer = _ANSWERS["silent"]
    facts, module, where = _finding_facts(finding, answer, "the wrong result")
    layer = model.get_submodule(answer.module)
    on = _switch(layer) is not None
    facts.append((not on, f"the wrong result's switch is off: {not on}"))
    if all(ok for ok, _ in facts):
        cmp = _layer_op_check(layer)
        worst = max(cmp.errors.values())
        facts.append((cmp.ok, f"the block's op against float64 (T = 32, bf16): worst error {worst:.1e}, tolerance "
                              f"{cmp.tolerance.fwd:.0e}: {'right' if cmp.ok else 'WRONG'}"))
    return exercises.verdict("find the wrong-but-finite result", facts, hint=_silent_hints(module, where, on))


def _layer_op_check(layer) -> harness.Comparison:
    spec = registry.get("chunk_rwkv7")
    op = layer.attention_op or layer.default_op()
    return harness.compare(op, spec.reference, spec.inputs(registry.Shape(1, 32, 1, 16, 16), initial_state=False),
                           dtype=torch.bfloat16)


def _silent_hints(module: str, where: str, on: bool) -> tuple[str, ...]:
    answer = _ANSWERS["silent"]
    if module != answer.module:
        return exercises.hints(where="the audit table: which call is WRONG while finite?",
                               what="the module is the one whose op call is beyond its tolerance; its op's "
                                    "kernels are in that op's module (fla_lab.ops.<family>.chunk)",
                               line="module = 'blocks.2.attn' (its chunk_rwkv7 call); then find the kernel")
    if where not in answer.where:
        forward = where in ("dplr_scores_kernel", "dplr_intra_kernel", "dplr_fwd_o_kernel")
        return exercises.hints(
            where="the atlas: at T = 16 (one chunk) the output is right; from T = 32 it is not" if forward else
                  "the output o is already wrong, so a forward kernel is at fault, and only with more than one chunk",
            what="only one forward kernel carries the state from one chunk to the next (the module docstring of "
                 "fla_lab.ops.rwkv7.chunk names it); the final state is wrong even at T = 16",
            line="kernel = 'dplr_fwd_h_kernel': read the line that loads the decay at the chunk's last row")
    if on:
        return exercises.hints(what="the finding is right: now switch it off, lesson.switch_off(model, module)")
    return exercises.hints(what="write the cause as a sentence: which row's decay, and why the error grows per chunk")


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
    from fla_lab import ops, registry

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

RESULTS = gsa_padding.GPU_ATLAS.parent


def gpu_atlas_summary(path=gsa_padding.GPU_ATLAS) -> str:
    """One line on the GPU atlas (`benchmarks/atlas_gpu.py`): its device, and the worst scale-aware error of
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


def locator_cost(path=RESULTS / "bench_hunt.json") -> str:
    """One line on what the locator costs a training step (`benchmarks/bench_hunt.py`'s result)."""
    import json

    run = json.loads(path.read_text())
    return (f"locator ({run['device']}, benchmarks/results/bench_hunt.json): a clean step of {run['depth']} "
            f"RWKV7Attention('chunk') layers, hidden {run['hidden']}, T = {run['T']}, bf16 autocast: "
            f"{run['plain_ms']:.1f} ms without it, {run['located_ms']:.1f} ms inside the block, "
            f"{run['ratio']:.2f}x")

"""Notebook 06: hunting NaNs with the package's own tools (`fla_lab.hunt`, `fla_lab.atlas`, `fla_lab.bugs`).

Two kinds of models live here:
- `scenario(name)`: one layer (or one op call) per catalogue entry, triggered the way its report met it; the
  tests check the locator names the entry's op, kernel and cause (`bugs.Bug.located`) on every one;
- `mystery_model()`: a small language model built from fla_lab layers with historical bugs planted
  deterministically, for the learner to find one at a time while training it in bf16.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from fla_lab import exercises, hunt, runtime
from fla_lab.layers import GatedSlotAttention, RWKV6Attention, RWKV7Attention
from fla_lab.lessons import gsa_padding

VOCAB, HIDDEN, T_TRAIN = 64, 32, 80  # T = 80: past the chunk path's 64 and a partial last chunk (80 = 64 + 16)
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


def _layers(bugs: dict[str, str | None], seed: int) -> list[nn.Module]:
    with _fork(seed):
        rwkv6 = fast_forgetting(RWKV6Attention("chunk", hidden_size=HIDDEN, num_heads=1, layer_idx=0,
                                               num_hidden_layers=3, bug=bugs.get("rwkv6")))
        gsa = GatedSlotAttention(hidden_size=HIDDEN, num_heads=1, num_slots=16, bug=bugs.get("gsa"))
        with torch.no_grad():
            gsa.f_proj.weight.mul_(gsa_padding.GROWTH)  # some slots have learnt to forget fast (notebook 03b)
        rwkv7 = RWKV7Attention("chunk", hidden_size=HIDDEN, head_dim=HIDDEN, layer_idx=0, num_hidden_layers=3,
                               bug=bugs.get("rwkv7"))
    return [rwkv6, gsa, rwkv7]


PLANTED = {"rwkv6": "exclusive_reference", "gsa": "unmasked_padding", "rwkv7": "bf16_decay"}


def mystery_model(seed: int = 0) -> TinyLM:
    """Three blocks (RWKV6, GSA, RWKV-7) with historical bugs switched on somewhere inside. Which ones is the
    exercise; `planted(model)` tells (the notebook's solutions use it)."""
    return TinyLM(_layers(PLANTED, seed)).to(runtime.device())


def planted(model: TinyLM) -> dict[str, str]:
    return {name: m.bug for name, m in model.named_modules() if getattr(m, "bug", None)}


def switch_off(model: nn.Module, module_name: str) -> str | None:
    """Set `bug = None` on the module the locator named (its `module` line); returns the bug it held."""
    module = model.get_submodule(module_name.split(" (")[0])
    bug, module.bug = module.bug, None
    return bug


def tokens(T: int = T_TRAIN, seed: int = 0) -> torch.Tensor:
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


def train_step(model: TinyLM, optimizer, data: torch.Tensor) -> Step:
    """One bf16 autocast step: next-token cross-entropy, backward, and an update only if every gradient is finite."""
    optimizer.zero_grad()
    try:
        with autocast():
            logits = model(data[:, :-1])
    except ValueError as exc:  # an op's input check: non-finite or out-of-contract input
        return Step(math.nan, False, str(exc).split(";")[0])
    loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), data[:, 1:].flatten())
    loss.backward()
    finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    if finite:
        optimizer.step()
    return Step(float(loss.detach()), finite)


def train(model: TinyLM, steps: int = 3, lr: float = 1e-3, seed: int = 0) -> list[Step]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = tokens(seed=seed)
    return [train_step(model, optimizer, data) for _ in range(steps)]


def check_hunt(model: TinyLM, steps: int = 2) -> exercises.Verdict:
    """The capstone's check: no planted switch is left on (only how many, not where), then `steps` bf16 training
    steps with finite loss and gradients and a falling loss."""
    left = len(planted(model))
    facts = [(left == 0, f"planted bugs still switched on: {left} of {len(PLANTED)}")]
    if left == 0:
        trained = train(model, steps=steps)
        finite = all(step.grads_finite and math.isfinite(step.loss) for step in trained)
        losses = " -> ".join(f"{step.loss:.3f}" for step in trained)
        facts += [(finite, f"{steps} training steps, every loss and gradient finite: {finite}"),
                  (finite and trained[-1].loss < trained[0].loss, f"loss {losses}")]
    return exercises.verdict("hunt down every planted bug", facts,
                             hint="locate, read the report, look up its suspects, switch the named module off; "
                                  "repeat until the locator finds nothing (one bug never makes a NaN)")


def hunt_step(model: TinyLM, seed: int = 0) -> hunt.Report:
    """One training step's forward and backward inside the locator; returns its report."""
    data = tokens(seed=seed)
    with hunt.locate(model) as found:
        with autocast():
            logits = model(data[:, :-1])
        nn.functional.cross_entropy(logits.float().flatten(0, 1), data[:, 1:].flatten()).backward()
    return found.report


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


# --- the atlas part ------------------------------------------------------------------------------------------------

ATLAS_OPS = ("chunk_rwkv6", "chunk_gsa")  # the two planted kernel bugs, fixed and switched on
ATLAS_DECAYS = (1.0, 10.0, 100.0)
ATLAS_LENGTHS = (48, 64)  # a partial chunk and a whole one


def cpu_atlas(dtype: str = "bf16") -> list[dict]:
    """The atlas of the planted kernels at CPU sizes: both variants, decays 1, 10, 100, T = 48 and 64."""
    from fla_lab import atlas

    todo = atlas.settings(ATLAS_OPS, dtypes=(dtype,), decays=ATLAS_DECAYS, lengths=ATLAS_LENGTHS, chunk_sizes=(64,),
                          B=1, H=1, K=16, V=16, M=16)
    return atlas.sweep(todo)


def atlas_explorer(records: list[dict]):
    """Pick op and variant: the heatmap of that slice of `records` (already measured: redraws at once)."""
    from fla_lab import atlas, widgets

    keys = sorted({(r["op"], r["variant"]) for r in records})
    dtype = records[0]["dtype"]

    def draw(slice):
        op, variant = slice
        atlas.plot_heatmap(records, op, variant, dtype, 64)

    return widgets.explorer(draw, slice=widgets.choice("op [variant]", [(f"{o} [{v}]", (o, v)) for o, v in keys],
                                                       keys[0]))

"""Notebook 03b: GSA's padded rows and the NaN gradients of the slot writes (upstream #77, the GSA half).

GSA's slot pass (pass 1 of `chunk_gsa`) puts its forget gate on the slot side of the state. The gradient of the slot
writes `s` gathers from *later* rows: `ds_r = sum_{t >= r} A[t, r] do_t exp(gi_t - gi_r)`. The chunked kernel splits
each block of later rows around a reference `gn`, the chunk-local cumulative decay at the last valid row of the
sub-chunk being differentiated: `exp(gi_t - gn) * exp(gn - gi_r)`. For a valid later row `gi_t <= gn`; a row past the
end of the sequence (a partial last chunk) loads its decay as 0, so the factor is `exp(0 - gn) = exp(|gn|)`: inf once
`|gn| > 88.72` in fp32, times the zero-padded `do`: NaN, which the `tl.dot` spreads over the sub-chunk's rows and the
decay gradient's reverse cumulative sum over every earlier row. The fix 737550ff is the notebook's exercise.
Everything here runs the real kernel `chunk_gsa` (and the layer `GatedSlotAttention`) with and without
`bug="unmasked_padding"`, against the float64 spec `reference.recurrent_gsa`; the exercise's helper goes into the
EXPONENT slot of that kernel (`chunk_gsa(helper=...)`). `packed_batch` runs it on a packed batch
(`cu_seqlens`), where each sequence whose length is not a multiple of 64 ends in a partial chunk of its own.
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from fla_lab.teaching import bugs, exercises
from fla_lab.spec import check, harness, markers, reference
from fla_lab import runtime
from fla_lab.tools import gpu_runs, viz, widgets
from fla_lab.teaching.lessons.overflow import decade, spans, summary  # noqa: F401  (decade, summary: for the notebook)

BUG = "unmasked_padding"
NODE = "ChunkGSAFunctionBackward"  # the autograd node of fla_lab's (and upstream's) ChunkGSAFunction
FUSED_NODE = "FusedRecurrentGSAFunctionBackward"  # the layer's kernel at T <= 64 without a switch (as upstream's)
KERNEL_GRADS = ("dq", "dk", "dv", "ds", "dg")  # what both backwards return first, in this order (index 3 is ds)
BC = 16  # rows per sub-chunk (fla_lab/ops/common/chunk.py)
CHUNK = 64  # chunk_gsa's default chunk size
FP32_EXP_MAX = viz.EXP_OVERFLOW[torch.float32]  # log(float32 max) = 88.72: exp() of more is inf
HIDDEN, HEADS, SLOTS = 32, 2, 16  # the layer of this notebook: 2 heads of 16 key/value channels, 16 slots
GROWTH = 60.0  # f_proj's weights, scaled from their init: a gate that training has pushed to forget fast
USERS_CLAMP = 20.0  # the workaround of #77 / PR #78: |f| < 20
# Upstream flash-linear-attention 0.6.0's chunk_gsa: its bf16 decay gradient's relative error against a float64
# recurrence at decay knob m (per-step log-decay -m * U(0.05, 1)), B=1, T=128..512, H=1..2, K=V=64, M=32. Quoted
# from the upstream baseline notes this workbook started from (upstream-baseline.md, not in this repository); no
# result file here holds it and nothing here recomputes it.
UPSTREAM_BF16_DG = {30.0: 0.28, 100.0: 16.5}
SWEEP_DECAYS = (1e-3, 1e-1, 1.0, 10.0, 30.0, 100.0, 1e3, 1e4)
SWEEP_T = 32  # a partial chunk (two sub-chunks of 16 past T), small enough for eight runs under the interpreter


# ---------------------------------------------------------------------------------------------------- the layer


def grown_layer(bug: str | None = BUG, gate_clamp: float | None = None, growth: float = GROWTH, seed: int = 0):
    """`GatedSlotAttention(hidden_size=32, num_heads=2, num_slots=16)` with upstream's defaults (normalizer 8,
    swish, scale 1), PyTorch's init from `seed`, then `f_proj`'s weights scaled by `growth`: some slots' gate
    logits sit far below 0, as after training has taught them to forget fast. Same seed, same weights."""
    from fla_lab.layers import GatedSlotAttention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = GatedSlotAttention(hidden_size=HIDDEN, num_heads=HEADS, num_slots=SLOTS, bug=bug,
                                   gate_clamp=gate_clamp)
    with torch.no_grad():
        layer.f_proj.weight.mul_(growth)
    return layer.to(runtime.device())


def reinitialise_gate(layer, seed: int = 1):
    """What users did instead of the clamp: re-draw `f_proj` from PyTorch's default init (in place)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer.f_proj.reset_parameters()
    return layer


def batch(T: int = 80, seed: int = 100) -> torch.Tensor:
    """Hidden states `[1, T, 32]`: `1 + N(0, 1)`, i.e. with a shared direction (as normalised hidden states of a
    trained model have), so a slot whose f_proj row points against it forgets fast on every token."""
    x = 1 + torch.randn(1, T, HIDDEN, generator=torch.Generator().manual_seed(seed))
    return x.to(runtime.device())


def autograd_node(tensor: torch.Tensor, name: str = NODE):
    """The first node called `name` in the autograd graph that produced `tensor` (None when there is none)."""
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name() == name:
            return node
        stack.extend(n for n, _ in node.next_functions)
    return None


@dataclass
class Step:
    """One training step of the layer: its loss, output, parameter gradients, the gradients that the GSA kernel's
    backward returned (`dq, dk, dv, ds, dg` of the kernel's inputs, `[B, T, H, *]`) and the gate `f` it received."""
    loss: float
    output: torch.Tensor
    grads: dict[str, torch.Tensor]
    kernel_grads: dict[str, torch.Tensor]
    gate: torch.Tensor


def training_step(layer, x: torch.Tensor) -> Step:
    """`loss = mean(o^2)`, `loss.backward()`; a hook on the `ChunkGSAFunctionBackward` node (or, where the layer
    runs fused_recurrent_gsa, its node) records what the kernel's backward returned (the same tensors
    `torch.autograd.detect_anomaly` inspects)."""
    layer.zero_grad(set_to_none=True)
    o, _, _ = layer(x)
    captured = {}

    def record(grad_inputs, grad_outputs):
        captured.update({n: g.detach().clone() for n, g in zip(KERNEL_GRADS, grad_inputs) if g is not None})

    handle = (autograd_node(o) or autograd_node(o, FUSED_NODE)).register_hook(record)
    loss = o.float().square().mean()
    loss.backward()
    handle.remove()
    grads = {n: p.grad.detach().clone() for n, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    with torch.no_grad():
        gate, _ = layer.gates(x)
    return Step(float(loss.detach()), o.detach(), grads, captured, gate)


def anomaly_report(layer, x: torch.Tensor) -> list[str]:
    """The same step under `torch.autograd.detect_anomaly()`: the first line of PyTorch's 'Error detected in ...'
    warning and the error it raises (an empty list when the backward is finite)."""
    layer.zero_grad(set_to_none=True)
    lines = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime.hide_interpreter_noise()
        try:
            with torch.autograd.detect_anomaly():
                o, _, _ = layer(x)
                o.float().square().mean().backward()
        except RuntimeError as error:
            lines.append(f"RuntimeError: {error}")
    layer.zero_grad(set_to_none=True)
    found = [str(w.message).splitlines()[0] for w in caught if str(w.message).startswith("Error detected in")]
    return found + lines


def param_census(step: Step) -> dict[str, str]:
    """Per parameter: 'finite' or how many entries are NaN/inf, and for f_proj-shaped ones (one row per head and
    slot) which (head, slot) rows."""
    out = {}
    for name, g in step.grads.items():
        bad = ~torch.isfinite(g)
        if not bad.any():
            out[name] = "finite"
            continue
        text = f"{int(bad.sum())}/{g.numel()} non-finite"
        if g.dim() == 2 and g.shape[0] == HEADS * SLOTS:
            rows = torch.nonzero(bad.any(1)).flatten().tolist()
            text += f", rows of (head, slot) {[(r // SLOTS, r % SLOTS) for r in rows]}"
        out[name] = text
    return out


def kernel_census(grads: dict[str, torch.Tensor]) -> dict[str, check.Census]:
    """`check.nonfinite_census` of each `[B, T, H, D]` gradient (the first time step, then batch, head, channel)."""
    return {n: check.nonfinite_census(g, ("b", "t", "h", "d")) for n, g in grads.items()}


def nonfinite_slots(x: torch.Tensor) -> dict[tuple[int, int], str]:
    """{(head, slot): time steps holding a non-finite value, as spans} of a `[1, T, H, M]` tensor."""
    bad = ~torch.isfinite(x[0])
    return {(h, m): spans(torch.nonzero(bad[:, h, m]).flatten().tolist())
            for h in range(bad.shape[1]) for m in range(bad.shape[2]) if bad[:, h, m].any()}


# ---------------------------------------------------------------------------------------------------- prediction


def _sub_chunks_meeting_padding(T: int, chunk_size: int):
    """(first row, last valid row) of each sub-chunk of the partial last chunk that has a later sub-chunk."""
    r = T % chunk_size
    if r == 0:
        return []
    start = T - r
    return [(a, min(a + BC, T) - 1) for a in range(start, min(T, start + chunk_size - BC), BC)]


def predicted_nonfinite(g: torch.Tensor, chunk_size: int = CHUNK) -> dict[str, torch.Tensor]:
    """Where the bug makes ds and dg non-finite, from the gate `g [B, T, H, M]` alone (boolean masks).

    ds: the rows of a sub-chunk of the partial last chunk that has a later sub-chunk (whose rows past T load a
    decay of 0), in the slots where `exp(0 - gn)` overflows, i.e. `gn = gi[last valid row] < -88.72`.
    dg: the kernel sums a log-decay's gradient backwards over each chunk's own rows and hands earlier chunks their
    share through the state's gradient (`decay_grad`'s boundary term), which stays finite: so the rows of the
    partial chunk up to a slot's last bad ds row, and no earlier chunk.
    """
    gi = reference.chunk_local_cumsum(g, chunk_size, torch.float32)  # fp32, as the kernel's gi
    ds = torch.zeros(g.shape, dtype=torch.bool, device=g.device)
    for first, last in _sub_chunks_meeting_padding(g.shape[1], chunk_size):
        ds[:, first:last + 1] = (-gi[:, last] > FP32_EXP_MAX)[:, None]
    rows = torch.arange(g.shape[1], device=g.device)[None, :, None, None]
    last_bad = torch.where(ds, rows, -1).amax(1, keepdim=True)
    first_of_its_chunk = torch.div(last_bad, chunk_size, rounding_mode="floor") * chunk_size
    return {"ds": ds, "dg": (rows <= last_bad) & (rows >= first_of_its_chunk)}


def threshold_per_step(remainder: int, chunk_size: int = CHUNK) -> float:
    """The constant per-step forgetting |g| above which the bug fires, for T = remainder (mod chunk_size):
    88.72 over the rows from the chunk's start to the last valid row of a sub-chunk that has a later one."""
    r = remainder % chunk_size
    if r == 0 or chunk_size <= BC:
        return math.inf
    return FP32_EXP_MAX / min(r, chunk_size - BC)


def exponent_ranges(g: torch.Tensor, chunk_size: int = CHUNK) -> dict[str, float]:
    """The largest exponent each factor of the sub-chunk split exponentiates (float64, over every chunk, sub-chunk
    pair, batch, head and slot of the gate `g [B, T, H, M]`):

    - forward, `rows_from_earlier_subchunks` (rows t of sub-chunk i from earlier sub-chunks j, `gn = gi[first row
      of i]`): query factor `gi_t - gn` and key factor `gn - gi_s`;
    - transposed, `cols_from_later_subchunks` (rows s of sub-chunk i from later sub-chunks j, `gn = gi[last valid
      row of i]`): `gi_t - gn` over valid later rows, and over rows past T, where the decay loads as 0 (the bug)
      or as the fix 737550ff forms it.
    """
    gi = reference.chunk_local_cumsum(g, chunk_size)  # float64
    T = g.shape[1]
    out = {"forward: query factor": -math.inf, "forward: key factor": -math.inf,
           "transposed: valid later rows": -math.inf, "transposed: rows past T, bug": -math.inf,
           "transposed: rows past T, fixed": -math.inf}

    def bump(key, values):
        if values.numel():
            out[key] = max(out[key], float(values.max()))

    for c in range(0, T, chunk_size):
        for i in range(c, min(T, c + chunk_size), BC):
            last = min(i + BC, T) - 1
            if i > c:
                gn = gi[:, i]
                bump("forward: query factor", gi[:, i:last + 1] - gn[:, None])
                bump("forward: key factor", gn[:, None] - gi[:, c:i])
            later = range(i + BC, c + chunk_size)
            if len(later):
                gn = gi[:, last]
                bump("transposed: valid later rows", gi[:, i + BC:min(T, c + chunk_size)] - gn[:, None])
                if c + chunk_size > T:
                    bump("transposed: rows past T, bug", 0 - gn)
                    out["transposed: rows past T, fixed"] = max(out["transposed: rows past T, fixed"], 0.0)
    return out


# ---------------------------------------------------------------------------------------------------- the kernel


def inputs(T: int, decay: float, seed: int = 0) -> dict:
    """GSA inputs (B = H = 1, K = V = M = 16) with per-step log-decay `-decay * U(0.05, 1)` and both initial
    states (`harness.gsa_inputs`)."""
    return harness.gsa_inputs(1, T, 1, 16, 16, 16, decay=decay, seed=seed)


def constant_gate_inputs(T: int, log_decay: float, seed: int = 0) -> dict:
    """`inputs(T, 1)` with every slot forgetting the same `log_decay` per step."""
    x = inputs(T, 1.0, seed)
    return {**x, "g": torch.full_like(x["g"], log_decay)}


def _run(x: dict, bug: str | None, dtype: torch.dtype, seed: int = 0, reference: bool = False,
         chunk_size: int = CHUNK, exponent=None, cu_seqlens: torch.Tensor | None = None) -> dict:
    """`chunk_gsa` forward and backward under a random cotangent `do`: `o` and `d<name>` of every input (fp32, on the
    CPU), and `g`. `reference=True` adds `ref_o`, `ref_d<name>`: the float64 recurrence on the same rounded inputs
    with the same `do`. `exponent`: a helper for the kernel's EXPONENT slot (`chunk_gsa(helper=)`).
    `cu_seqlens` (CPU offsets): a packed batch, the kernel and the recurrence run on each sequence alone."""
    from fla_lab.spec import reference as spec
    from fla_lab.ops import chunk_gsa
    from fla_lab.ops.common.conventions import per_sequence

    dev = runtime.device()

    def leaf(n, t):
        t = t if n == "initial_state" else t.to(dtype)
        return t.to(dev).detach().clone().requires_grad_(True)

    def named(tree):  # the state pair as two names
        return {f"{n}[{i}]" if isinstance(v, tuple) else n: t
                for n, v in tree.items() for i, t in (enumerate(v) if isinstance(v, tuple) else [(0, v)])}

    ours = {n: (tuple(leaf(n, t) for t in v) if isinstance(v, tuple) else leaf(n, v)) for n, v in x.items()}
    packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens.to(dev)}
    o, _ = chunk_gsa(**ours, bug=bug, chunk_size=chunk_size, helper=exponent, **packed)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 1))
    (o * do.to(dev, o.dtype)).sum().backward()
    out = {"o": o.detach().float().cpu(), "g": x["g"]}
    out.update({f"d{n}": t.grad.detach().float().cpu() for n, t in named(ours).items()})
    if reference:
        as64 = lambda t: t.detach().cpu().double().requires_grad_(True)  # noqa: E731
        theirs = {n: (tuple(map(as64, v)) if isinstance(v, tuple) else as64(v)) for n, v in ours.items()}
        if cu_seqlens is None:
            o_ref, _ = spec.recurrent_gsa(**theirs)
        else:
            rows = {n: t for n, t in theirs.items() if n != "initial_state"}
            o_ref, _ = per_sequence("reference", spec.recurrent_gsa, rows, cu_seqlens, theirs.get("initial_state"),
                                    False)
        (o_ref * do.double()).sum().backward()
        out["ref_o"] = o_ref.detach()
        out.update({f"ref_d{n}": t.grad for n, t in named(theirs).items()})
    return out


@functools.lru_cache(maxsize=16)
def kernel_run(T: int, decay: float, dtype: str = "fp32", bug: str | None = BUG,
               constant_gate: float | None = None, chunk_size: int = CHUNK) -> dict[str, torch.Tensor]:
    """`chunk_gsa` forward and backward on `inputs(T, decay)` (or `constant_gate_inputs(T, constant_gate)`): `o`,
    `dq, dk, dv, ds, dg` (and the initial states' gradients) in fp32 on the CPU, and the gate `g` it ran on.
    Cached: treat the result as read-only."""
    x = inputs(T, decay) if constant_gate is None else constant_gate_inputs(T, constant_gate)
    return _run(x, bug, viz.DTYPES[dtype], chunk_size=chunk_size)


@functools.lru_cache(maxsize=32)
def fixed_comparison(T: int, decay: float, dtype: str = "fp32", bug: str | None = None) -> harness.Comparison:
    """`harness.compare` of `chunk_gsa` against `reference.recurrent_gsa` on `inputs(T, decay)`: the output, both
    final states and every gradient, initial states included. Cached."""
    from fla_lab.spec import reference
    from fla_lab.ops import chunk_gsa

    op = functools.partial(chunk_gsa, bug=bug)
    return harness.compare(op, reference.recurrent_gsa, inputs(T, decay), dtype=viz.DTYPES[dtype])


# ---------------------------------------------------------------------------------------------------- packed batches

PACKED_LENGTHS = (45, 64, 70, 100)  # last chunks of 45 rows, none (the control), 6 rows, 36 rows
PACKED_DECAY = 10.0  # per-step log-decays -0.5 to -10: 6 rows sum to at most -60, 36 or 45 rows pass -88.72


def packed_inputs(lengths: tuple[int, ...] = PACKED_LENGTHS, decay: float = PACKED_DECAY, seed: int = 0) -> dict:
    """`inputs` of the sequences packed along time (FLA's varlen batch: B = 1, T = sum of the lengths), with one
    initial state pair per sequence (`[N, ...]`)."""
    x = harness.gsa_inputs(1, sum(lengths), 1, 16, 16, 16, decay=decay, initial_state=False, seed=seed)
    x["initial_state"] = harness.gsa_inputs(len(lengths), 1, 1, 16, 16, 16, seed=seed + 1)["initial_state"]
    return x


def offsets(lengths: tuple[int, ...]) -> list[int]:
    """`cu_seqlens` of sequences of these lengths: [0, l0, l0 + l1, ..., T]."""
    return [0, *itertools.accumulate(lengths)]


@functools.lru_cache(maxsize=4)
def packed_batch(lengths: tuple[int, ...] = PACKED_LENGTHS, decay: float = PACKED_DECAY,
                 bug: str | None = BUG) -> list[dict]:
    """`chunk_gsa(..., cu_seqlens=offsets(lengths))` in fp32, forward and backward, against the float64 recurrence
    run on each sequence alone (`packed_inputs`). One row per sequence: `length`, `T mod 64` (rows of its last
    chunk; 0: none partial), `non-finite` (the gradients with a NaN/inf in its rows or its initial states),
    `slots` (how many of its slots have a non-finite ds), `error` (the worst scale-aware error of its gradients,
    inf when one is non-finite) and `ok` (within the fp32 gradient tolerance). Cached: treat as read-only."""
    bounds = offsets(lengths)
    got = _run(packed_inputs(lengths, decay), bug, torch.float32, reference=True, cu_seqlens=torch.tensor(bounds))
    names = [n[4:] for n in got if n.startswith("ref_d")]
    table = []
    for i, (bos, eos) in enumerate(zip(bounds, bounds[1:])):
        own = lambda n: got[n][i:i + 1] if "initial_state" in n else got[n][:, bos:eos]  # noqa: E731
        ours, ref = {n: own(n) for n in names}, {n: own(f"ref_{n}") for n in names}
        errors = check.grad_errors(ref, ours)
        worst = max(errors.values())
        table.append({"length": eos - bos, "T mod 64": (eos - bos) % CHUNK,
                      "non-finite": tuple(n for n in names if not torch.isfinite(ours[n]).all()),
                      "slots": int((~torch.isfinite(ours["ds"])).any(1).sum()), "error": worst,
                      "ok": worst <= check.tolerance(torch.float32).grad})
    return table


# ---------------------------------------------------------------------------------------------------- the catalogue


def show_catalogue() -> None:
    """The catalogue entry: op, kernel, cause, trigger, symptom and the file and helper of the switch (no line
    numbers: they move with every edit of the kernel file)."""
    bug = bugs.get(BUG)
    path = bugs.locate(BUG).rsplit(":", 1)[0]
    switch = markers.find("bug", BUG)
    print(f"{bug.name}  [{bug.op}]  upstream #{bug.issue}, fix {bug.fix}")
    print(f"  kernel : {bug.component}")
    print(f"  switch : {path}, in `{markers.enclosing_function(markers.source(switch), switch.line)}`")
    print(f"  trigger: {bug.trigger}")
    print(f"  symptom: {bug.symptom}")
    print(f"  taught : notebook {bug.notebook}")


def show_switch() -> None:
    """The two helpers for the EXPONENT slot as the catalogue prints them (`bugs.switch_lines`): the historical one
    that `bug="unmasked_padding"` plugs in, then the shipped default; and the one-line difference. The shipped one
    is the exercise's answer: until the check said PASS or the last hint tier was printed, only the historical one
    shows, from its own source (the catalogue seals both in a learner's session)."""
    if not exercises.is_open(EXERCISE):
        from fla_lab.ops.common import chunk

        historical = markers.source_of(chunk.later_rows_exponent_unmasked).rstrip().splitlines()[-1]
        print(f"the historical helper (bug={BUG!r}):\n{historical}\nthe shipped one {_SHOWS_ONCE_SOLVED}")
        return
    lines = [line[7:] for line in bugs.switch_lines(BUG)]  # drop the "{number:5d}  " prefix
    path = bugs.locate(BUG).rsplit(":", 1)[0]
    assert lines[0].lstrip().startswith("return") and lines[4].lstrip().startswith("return"), \
        "the two helpers changed shape: update show_switch"
    print(f"{path}: the historical helper (bug={BUG!r}), then the shipped one")
    print("\n".join(lines))
    code = lambda s: s.split("#")[0].strip()  # noqa: E731
    print(f"\n- {code(lines[0])}    # rows past T: 0 - gn = |gn|")
    print(f"+ {code(lines[4])}    # rows past T: exponent 0, times W = 0")


# ---------------------------------------------------------------------------------------------------- the clamp


def clamp_levels(remainder: int) -> dict[str, float]:
    """Per-step bounds |f| < level: the users' 20, the largest that keeps this T's partial chunk finite, and the
    largest that keeps every T finite (88.72 / 48)."""
    r = remainder % CHUNK
    return {"users' clamp": USERS_CLAMP, f"enough for T mod 64 = {r}": threshold_per_step(r),
            "enough for every T": threshold_per_step(CHUNK - BC)}


def layer_output(layer, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward output (no gradient): the bug lives in the backward, so this is the fixed model's too."""
    with torch.no_grad():
        return layer(x)[0]


def gate_report(layer, x: torch.Tensor) -> dict[str, float]:
    """What the layer's gate looks like on `x`: the logits `z = f_proj(x)` and `f = logsigmoid(z) / 8` (after the
    layer's clamp, if any); how many reach |f| >= 20; the most negative chunk-local cumulative decay of a sub-chunk
    that meets padded rows; how many slots the bug is predicted to turn NaN."""
    with torch.no_grad():
        z = layer.f_proj(x).float()
        f, _ = layer.gates(x)
    f_cut = -USERS_CLAMP * layer.gate_logit_normalizer  # logsigmoid(z) <= -160 <=> z <= about -160
    raw = torch.nn.functional.logsigmoid(z) / layer.gate_logit_normalizer
    clamped = int((raw < -layer.gate_clamp).sum()) if layer.gate_clamp is not None else 0
    gi = reference.chunk_local_cumsum(f, CHUNK, torch.float32)
    ends = [last for _, last in _sub_chunks_meeting_padding(x.shape[1], CHUNK)]
    worst = float(gi[:, ends].min()) if ends else 0.0
    bad = predicted_nonfinite(f)["ds"].any(1)
    return {"logits": z.numel(), "logit min": float(z.min()), "f min": float(f.min()),
            "f mean": float(f.mean()), "|f| >= 20": int((raw <= -USERS_CLAMP).sum()), "clamped": clamped,
            "logit cut": f_cut, "logits below cut": int((z <= f_cut).sum()),
            "worst cumulative decay": worst, "slots predicted NaN": int(bad.sum())}


# ---------------------------------------------------------------------------------------------------- figures


def plot_padded_rows(remainder: int = 45, log_decay: float = -4.0):
    """One slot, a constant per-step log-decay, the partial last chunk of `remainder` valid rows. Left: the
    chunk-local cumulative decay the kernel loads (0 past T). Right: the exponent `gi_t - gn` that
    `cols_from_later_subchunks` forms for each sub-chunk i against the rows of its later sub-chunks."""
    import numpy as np

    rows = np.arange(CHUNK)
    valid = rows < remainder
    gi = np.where(valid, log_decay * (rows + 1), 0.0)  # the bug's load: other=0 past T
    subs = _sub_chunks_meeting_padding(remainder, CHUNK)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c"]
    fig, (left, right) = viz.figure(ncols=2, width=4.9, height=3.7)
    for ax in (left, right):
        ax.axvspan(remainder - 0.5, CHUNK - 0.5, color="grey", alpha=0.18, lw=0)
        for b in range(BC, CHUNK, BC):
            ax.axvline(b - 0.5, color="k", lw=0.6, ls=":")
    left.plot(rows[valid], gi[valid], ".", ms=4, color="k", label=f"gi, valid rows ({log_decay:g} per step)")
    left.plot(rows[~valid], gi[~valid], "x", ms=4, color="#d62728", label="rows past T: the load gives 0")
    for (first, last), color in zip(subs, colors):
        left.hlines(gi[last], first - 0.5, last + 0.5, color=color, lw=2.5,
                    label=f"gn of sub-chunk {first // BC} = {gi[last]:.0f}")
    left.axhline(-FP32_EXP_MAX, color="#d62728", lw=0.8, ls="--")
    left.text(1, -FP32_EXP_MAX + 6, "-88.7", fontsize=9, color="#d62728")
    left.text(remainder + 0.5, -0.32 * abs(gi.min()), f"past T\n(T = {remainder})", fontsize=9, color="0.3")
    left.set(xlabel="row of the partial last chunk (lines: sub-chunks of 16)",
             ylabel="cumulative log-decay gi", title="what the kernel loads")
    left.legend(fontsize=9, loc="lower left")
    for (first, last), color in zip(subs, colors):
        later = rows[(first // BC + 1) * BC:]
        e = gi[later] - gi[last]
        ok = later < remainder
        if ok.any():
            right.plot(later[ok], e[ok], "o", ms=3, color=color, label=f"sub-chunk {first // BC}: valid rows, <= 0")
        right.plot(later[~ok], e[~ok], "x", ms=4, color=color,
                   label=f"sub-chunk {first // BC}: rows past T, 0 - gn = {e[~ok][0]:+.0f}")
    right.axhspan(FP32_EXP_MAX, 1e4, color="#d62728", alpha=0.12)
    right.axhline(FP32_EXP_MAX, color="#d62728", lw=0.8)
    right.text(BC + 0.5, FP32_EXP_MAX + 6, "exp() = inf in fp32 (> 88.7); do = 0 there: inf * 0 = NaN",
               fontsize=9, color="#d62728")
    right.axhline(0, color="k", lw=0.6)
    top = max(FP32_EXP_MAX, abs(gi.min())) + 45
    right.set(xlim=(-0.5, CHUNK - 0.5), ylim=(-top, top), xlabel="later row t of the chunk",
              ylabel="exponent gi_t - gn (bug)", title="the transposed factor exp(gi_t - gn), per sub-chunk i")
    right.legend(fontsize=9, loc="lower left")
    for ax in (left, right):
        ax.title.set_fontsize(9)
    fig.suptitle(f"a partial last chunk of {remainder} rows, one slot forgetting {-log_decay:g} per step "
                 "(grey: rows past T)", fontsize=10)
    return fig


def plot_thresholds(measured: dict[tuple[int, float], bool] | None = None, init_f: float | None = None):
    """The constant per-step forgetting |g| above which the bug fires, against T mod 64 (88.72 / min(r, 48)); the
    users' clamp; optionally the layer's gate at init and measured kernel runs {(T mod 64, |g|): NaN?}."""
    import numpy as np

    r = np.arange(1, CHUNK)
    th = np.array([threshold_per_step(int(x)) for x in r])
    fig, (ax,) = viz.figure(width=6.4, height=3.7)
    ax.fill_between(r, th, 1e3, color="#d62728", alpha=0.12, step="mid", label="ds, dg non-finite under the bug")
    ax.step(r, th, where="mid", color="#d62728", lw=1.2, label="88.72 / min(T mod 64, 48)")
    ax.axhline(USERS_CLAMP, color="k", ls="--", lw=0.9, label="users' clamp |f| < 20")
    if init_f is not None:
        ax.axhline(init_f, color="#1f77b4", ls="-.", lw=0.9, label=f"the layer's |f| at gate logit 0 ({init_f:.3f})")
    if measured:
        # the measured runs sit 1 % apart on either side of the curve: a linear zoom tells them apart
        zoom = ax.inset_axes([0.56, 0.10, 0.22, 0.26])  # below the curve, in the empty band under |g| = 1
        zoom.fill_between(r, th, 1e3, color="#d62728", alpha=0.12, step="mid")
        zoom.step(r, th, where="mid", color="#d62728", lw=1.2)
        for (rem, g), nan in measured.items():
            for a in (ax, zoom):
                a.plot(rem, g, "x" if nan else "o", ms=7, color="#d62728" if nan else "#2ca02c", mfc="none",
                       label=f"kernel, T = {rem}, |g| = {g:g}: " + ("NaN" if nan else "finite"))
        rems, gs = [k[0] for k in measured], [k[1] for k in measured]
        zoom.set(xlim=(min(rems) - 3, max(rems) + 3), ylim=(min(gs) - 0.05, max(gs) + 0.05))
        zoom.set_title("zoom (linear)", fontsize=9)
        zoom.tick_params(labelsize=9)
        zoom.set_facecolor("white")
        ax.indicate_inset_zoom(zoom, edgecolor="0.4")
    ax.annotate("T mod 64 = 0 (no partial chunk): never", (0, 0.3), (2, 0.3), fontsize=9, va="center",
                arrowprops=dict(arrowstyle="->", lw=0.8))
    ax.set(yscale="log", ylim=(0.05, 200), xlim=(0, CHUNK), xlabel="T mod 64 (rows in the partial last chunk)",
           ylabel="constant per-step forgetting |g|", title="where the bug fires: the cumulative decay, not the step")
    ax.legend(fontsize=9, loc="upper right")
    return fig


@functools.lru_cache(maxsize=32)
def gradient_errors(T: int, decay: float, dtype: str = "bf16", bug: str | None = None) -> dict[str, dict]:
    """Every gradient of `chunk_gsa` on `inputs(T, decay)` against the float64 recurrence, two ways:
    `plain` = ||got - ref|| / ||ref|| (upstream's baseline measure), `scale-aware` = `check.grad_errors` (the floor
    of the whole gradient's scale, as `harness.compare` and the tolerances use), and `norm` = ||ref||. Cached."""
    got = _run(inputs(T, decay), bug, viz.DTYPES[dtype], reference=True)
    names = [n[4:] for n in got if n.startswith("ref_d")]
    ref = {n: got[f"ref_{n}"] for n in names}
    ours = {n: got[n] for n in names}
    return {"plain": {n: check.rel_error(ours[n], ref[n]) for n in names},
            "scale-aware": check.grad_errors(ref, ours),
            "norm": {n: float(ref[n].norm()) for n in names}}


@functools.lru_cache(maxsize=4)
def sweep(decays: tuple[float, ...] = SWEEP_DECAYS, dtype: str = "bf16", T: int = SWEEP_T,
          progress: bool = True) -> dict[float, dict]:
    """{decay knob: `gradient_errors(T, decay, dtype)`} of the fixed `chunk_gsa` (cached: treat as read-only)."""
    from tqdm.auto import tqdm

    return {m: gradient_errors(T, m, dtype) for m in tqdm(decays, desc="sweep", leave=False, disable=not progress)}


GPU_ATLAS = gpu_runs.path("atlas_gpu")  # the GPU run shipped with the package


def gpu_dg_errors(op: str = "chunk_gsa", path: Path = GPU_ATLAS) -> dict[tuple[int, float], dict[str, float]]:
    """{(T, m): {"scale-aware": ..., "plain": ...}} of the fixed `op`'s bf16 decay gradient in the GPU atlas
    (`python -m benchmarks.atlas_gpu`, notebook 06: B=1, H=4, K=V=M=64, T in {512, 4096}). Read from the GPU run's json,
    not recomputed; "fla:chunk_gsa" is upstream 0.6.0's kernel in the same run."""
    from fla_lab.tools import atlas

    records = json.loads(path.read_text())["records"]
    # the quoted numbers: with an initial state and a final-state cotangent (all the atlas swept when it was run)
    return {(r["T"], r["decay"]): {"scale-aware": r["errors"]["dg"], "plain": r["errors_unfloored"]["dg"]}
            for r in records if r["op"] == op and r["variant"] == "fixed" and r["dtype"] == "bf16"
            and atlas.combination_of(r) == (True, True)}


def meaningful(errors: dict, name: str = "dg", floor: float = 1e-12) -> bool:
    """Whether the plain relative error of `name` means something: the exact gradient has not underflowed to
    (almost) nothing next to the other gradients (at decay knob 1e3 the exact dg is ~1e-23, at 1e4 exactly 0)."""
    return errors["norm"][name] > floor * max(errors["norm"].values())


def plot_accuracy(results: dict[float, dict], dtype: str = "bf16", T: int = SWEEP_T,
                  gpu: dict[tuple[int, float], dict[str, float]] | None = None):
    """dg (both measures), ds and the worst other gradient of the fixed kernel against the decay knob, beside
    upstream's two bf16 dg points; the plain dg error is drawn only where the exact dg has not underflowed.
    `gpu` (`gpu_dg_errors()`): the same kernel's scale-aware dg on the GPU at larger T, as open triangles."""
    import numpy as np

    decays = np.array(sorted(results))
    fig, (ax,) = viz.figure(width=6.6, height=5.0)
    plain = [m for m in decays if meaningful(results[m])]
    ax.plot(plain, [results[m]["plain"]["dg"] for m in plain], "o-", ms=5, lw=2.2, color="#d62728",
            label="fla_lab, fixed: dg, plain relative (upstream's measure)")
    ax.plot(decays, [results[m]["scale-aware"]["dg"] for m in decays], "o--", ms=3, lw=1.2, color="#d62728",
            mfc="none", label="fla_lab, fixed: dg, scale-aware (check.grad_errors)")
    ax.plot(decays, [results[m]["plain"]["ds"] for m in decays], "s-", ms=3, lw=1.0, color="#ff7f0e",
            label="fla_lab, fixed: ds, plain relative")
    others = ("dq", "dk", "dv")
    ax.plot(decays, [max(results[m]["plain"][n] for n in others) for m in decays], ":", marker=".", color="0.4",
            label="fla_lab, fixed: worst of dq, dk, dv, plain")
    ax.plot(list(UPSTREAM_BF16_DG), list(UPSTREAM_BF16_DG.values()), "*", ms=12, color="k",
            label="upstream 0.6.0: dg, plain (H200, T = 128..512, K = V = 64)")
    for (length, marker) in ((512, "^"), (4096, "v")):
        points = sorted((m, e["scale-aware"]) for (t, m), e in (gpu or {}).items() if t == length)
        if points:
            ax.plot(*zip(*points), marker, ms=6, color="#9467bd", mfc="none", ls="none",
                    label=f"fla_lab, fixed: dg, scale-aware, GPU atlas (H100), T = {length}")
    ax.axhline(check.tolerance(viz.DTYPES[dtype]).grad, color="grey", ls="--", lw=0.8,
               label=f"{dtype} gradient tolerance")
    if len(plain) < len(decays):
        ax.axvspan(max(plain) * 3, decays.max() * 3, color="grey", alpha=0.1, lw=0)
        ax.text(max(plain) * 3.5, 2e-4, "exact dg\nunderflows:\nno plain\nrel. error", fontsize=9, color="0.3")
    ax.set(xscale="log", yscale="log", ylim=(1e-7, 100), xlim=(decays.min() / 3, decays.max() * 3),
           xlabel="decay knob m: g = -m·U(0.05, 1)", ylabel="rel. error vs float64 reference",
           title=f"{dtype}, chunk 64: lines T = {T} on the CPU interpreter (fp32 dots); markers GPU measurements")
    ax.title.set_fontsize(9)
    fig.legend(fontsize=9, loc="outside lower center", ncol=2)  # below the axes: the weak-decay points are top left
    return fig


# ---------------------------------------------------------------------------------------------------- explorer


def plot_setting(dtype: torch.dtype = torch.float32, decay: float = 5.0, remainder: int = 45):
    """One setting, T = remainder (one partial chunk; 64 when 0). Left, middle: which rows and slots of ds and dg
    the buggy kernel makes non-finite (outlined: the prediction from the gate alone). Right: the fixed kernel's
    errors against the float64 reference."""
    import matplotlib.colors as mcolors
    import numpy as np
    from matplotlib.patches import Rectangle

    name = viz.DTYPE_NAMES[dtype]
    T = remainder % CHUNK or CHUNK
    got = kernel_run(T, float(decay), name, BUG)
    pred = predicted_nonfinite(got["g"])
    fixed = fixed_comparison(T, float(decay), name)
    fig, axes = viz.figure(ncols=3, width=3.5, height=3.9)
    cmap = mcolors.ListedColormap(["white", "#d62728", "#bbbbbb"])  # finite, non-finite, past T
    for ax, key in zip(axes[:2], ("ds", "dg")):
        img = np.full((CHUNK, got[key].shape[-1]), 2)
        img[:T] = (~torch.isfinite(got[key][0, :, 0])).numpy().astype(int)
        ax.imshow(img, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=2)
        p = pred[key][0, :, 0].numpy()
        for m in range(p.shape[1]):
            bad = np.flatnonzero(p[:, m])
            if bad.size:  # the predicted rows of a slot are one run: outline it
                ax.add_patch(Rectangle((m - 0.5, bad[0] - 0.5), 1, bad[-1] - bad[0] + 1, fill=False, ec="k", lw=0.9))
        for b in range(BC, CHUNK, BC):
            ax.axhline(b - 0.5, color="k", lw=0.5, ls=":")
        ax.set(xlabel="slot c", ylabel="time step t (dotted: sub-chunks)",
               title=f"bug: {key} (red: NaN/inf, white: finite, grey: past T)")
        ax.title.set_fontsize(8)
    names = list(fixed.errors)
    vals = np.array([fixed.errors[n] for n in names])
    ok = np.isfinite(vals)
    pos = np.arange(len(names))
    right = axes[2]
    right.bar(pos[ok], np.maximum(vals[ok], 1e-12), color="#1f77b4", log=True, label="fixed kernel")
    right.plot(pos[~ok], np.full((~ok).sum(), 3.0), "x", color="#d62728", ms=8)
    tol = check.tolerance(dtype)
    right.axhline(tol.grad, color="grey", ls=":", lw=0.8, label=f"gradient tolerance {tol.grad:g}")
    right.axhline(tol.fwd, color="grey", ls="--", lw=0.8, label=f"output tolerance {tol.fwd:g}")
    right.set_xticks(pos, names, fontsize=9, rotation=60, ha="right")  # the names of the comparison printed above
    right.set(ylim=(1e-12, 10), ylabel="rel. error vs reference (x: non-finite)",
              xlabel="o, ht: outputs; the others: gradients",
              title=f"fixed: {'all within tolerance' if fixed.ok else 'FAILING'}")
    right.title.set_fontsize(9)
    right.legend(fontsize=9, loc="upper left")
    fig.suptitle(f"{name}, T = {T} (T mod 64 = {remainder % CHUNK}), decay knob m = {decay:g}; "
                 "black outline: predicted from the gate", fontsize=10)
    return fig


def explorer():
    """dtype x decay knob x T mod 64, run on demand (each click runs the kernel twice under the interpreter)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    def draw(dtype, decay, remainder):
        plot_setting(dtype, decay, remainder)
        plt.show()

    return w.interactive(draw, {"manual": True, "manual_name": "Run the kernels"},
                         dtype=widgets.dtype_choice(),
                         decay=widgets.log_slider("decay knob m (g = -m·U)", 5.0, -3, 4),
                         remainder=widgets.int_slider("T mod 64", 45, 0, 63))


# ---------------------------------------------------------------------------------------------------- exercise
# The learner writes the exponent helper of `cols_from_later_subchunks` (`later_rows_exponent` ships, fla_lab/ops/common/chunk.py);
# `chunk_gsa(..., helper=later_rows_exponent)` puts it into the EXPONENT slot of the real `slot_rows_kernel`.

EXERCISE = "the exponent of the later rows in chunk_gsa's slot-gradient kernel"
_SHOWS_ONCE_SOLVED = "shows once check_padded_exponent says PASS, or after verdict.hint()'s last tier"
EXERCISE_T, EXERCISE_DECAY = 45, 30.0  # a partial chunk (sub-chunks 0..2 meet rows past T) at strong slot decay
EXERCISE_T_LATER = 109  # a full chunk, then a partial one (rows 64..108): a mask right only in the first chunk
#                         (o_j < 45, o_j % 64 < T, o_j < T % 64) fails here
EXERCISE_SLOTS = 24  # M: a slot tile of 32 channels, 8 of them past M (the helper's m_d); not 16, so that a mask
#                      built along the wrong axis fails to broadcast instead of silently masking slots
PROBE_ROWS, PROBE_T, PROBE_GN = 32, 45, 100.0  # the probe tile: later rows 32..47 with T = 45, |gn| >= 100
LATER_TILE = {"rows0": 96, "T": EXERCISE_T_LATER}  # the same tile in the second chunk: later rows 96..111, T = 109


def exercise_inputs(T: int, decay: float, seed: int = 0) -> dict:
    """GSA inputs (B = H = 1, K = V = 16, M = 24 slots) with slot log-decay `-decay * U(0.05, 1)`, both initial
    states."""
    return harness.gsa_inputs(1, T, 1, 16, 16, EXERCISE_SLOTS, decay=decay, seed=seed)


@triton.jit
def _probe_kernel(GQ, GN, E, T, ROW0: tl.constexpr, M: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
                  EXPONENT: tl.constexpr):
    """E = EXPONENT(gq, gn, o_j, m_d, T) on one [BC, BD] tile of later rows ROW0.. (no kernel around it): what the
    helper returns, cell by cell, for the check's hints."""
    o_c, o_d = tl.arange(0, BC), tl.arange(0, BD)
    p = o_c[:, None] * BD + o_d[None, :]
    b_e = EXPONENT(tl.load(GQ + p), tl.load(GN + o_d)[None, :], ROW0 + o_c, o_d < M, T)
    tl.store(E + p, b_e + tl.zeros([BC, BD], dtype=tl.float32))


def probe_tile(gn0: float = PROBE_GN, gn_step: float = 1.0, rows0: int = PROBE_ROWS,
               T: int = PROBE_T) -> dict[str, torch.Tensor]:
    """A tile as `cols_from_later_subchunks` loads it: later rows t = 32..47 of a partial chunk with T = 45, 24 slots
    of a 32-wide tile. gn = -(gn0 + gn_step * slot) (by default -(100 + slot)); gq_t = gn - 1.5 (t - 31) on real rows
    and slots, the load's 0 on rows past T. Slots past the tile's 24 get gn = -1, gq = -3 (any finite exponent will
    do there): unlike the load's 0, they tell a helper that masks slots only from the stub, so its hint can name the
    rows past T. `expected`: gq - gn on real cells (NaN where any finite exponent will do)."""
    rows, slots = torch.arange(BC)[:, None] + rows0, torch.arange(32)[None, :]
    real_slot = slots < EXERCISE_SLOTS
    gn = torch.where(real_slot, -(gn0 + gn_step * slots), -1.0).float()
    real = (rows < T) & real_slot
    gq = torch.where(real, gn - 1.5 * (rows - rows0 + 1), torch.where(real_slot, 0.0, -3.0)).float()
    return {"gq": gq, "gn": gn[0], "real": real, "past_T": (rows >= T) & real_slot, "rows0": rows0, "T": T,
            "rows": rows.expand(BC, 32), "expected": torch.where(real, gq - gn, math.nan)}


RAMP_TILE = {"gn0": 1.0, "gn_step": 8.0}  # a second probe tile, |gn| = 1..185 over the slots: on its rows past T the
#                                           unmasked exponent ranges from 1 to 185, below and above any cap


def probe_exponent(helper, tile: dict | None = None) -> torch.Tensor:
    """What `helper` returns on `tile` (`probe_tile()` by default): `[16, 32]` fp32 (raises what the helper
    raises)."""
    tile = probe_tile() if tile is None else tile
    gq, gn = harness.on_device((tile["gq"], tile["gn"].contiguous()))  # the kernel runs on fla_lab.device()
    out = torch.empty(BC, 32, device=gq.device)
    _probe_kernel[(1,)](gq, gn, out, tile["T"], ROW0=tile["rows0"], M=EXERCISE_SLOTS, BC=BC, BD=32, EXPONENT=helper)
    return out.cpu()  # beside probe_tile()'s CPU masks


def _message(error: Exception) -> str:
    """The innermost message of a Triton error: the interpreter wraps it (`InterpreterError("ValueError('...')")`),
    the GPU compiler chains it (`CompilationError` whose own text ends at a caret line, the ValueError as its cause)."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if re.search(r"\w", line)] or [type(error).__name__]
    return re.sub(r"""^(\w+\(['"])+|(['"]\))+$""", "", lines[-1])[:160]


def diagnose(helper, where: dict | None = None) -> dict:
    """What the helper got wrong on the probe tile: `raised` (the error's first line, or None), `overflow_rows` (rows
    past T whose exp() is inf or NaN), `past_T_max` (the largest exponent on rows past T of the real slots: a row
    that does not exist needs exp() <= 1, as every real row has, so at most 0), `caps` (it bounds the unmasked
    exponent instead of masking the rows: on `RAMP_TILE` too it returns min(gq - gn, past_T_max) on every real
    slot, and that bound cut some row past T), `wrong_real` (real cells whose exponent is not gq - gn),
    `like_stub` (the unmasked line's values on every cell of a real slot), `masks_slots` (like the stub there, and
    0 on the slots past the tile: a mask along the slot channels only), `example` (one wrong real cell: row, slot,
    got, expected). `where`: the tile's first row and T (`LATER_TILE`; by default rows 32..47, T = 45); `rows0` and
    `T` come back in the result."""
    from fla_lab.ops.common import chunk

    where = where or {}
    tile = probe_tile(**where)
    try:
        got = probe_exponent(helper, tile)
    except Exception as error:  # noqa: BLE001  (the learner's helper may fail to compile in any way)
        return {"raised": _message(error), "rows0": tile["rows0"], "T": tile["T"]}
    blows_up = ~torch.isfinite(got.exp())
    overflow_rows = sorted(set(tile["rows"][blows_up & tile["past_T"]].tolist()))
    wrong = tile["real"] & ~torch.isclose(got, tile["expected"], rtol=0, atol=1e-5)
    example = None
    if wrong.any():
        r, m = (int(i) for i in wrong.nonzero()[0])
        example = (tile["rows0"] + r, m, float(got[r, m]), float(tile["expected"][r, m]))
    stub = probe_exponent(chunk.later_rows_exponent_unmasked, tile)
    real_slots = tile["real"] | tile["past_T"]
    like_stub = bool(torch.equal(got[real_slots], stub[real_slots]))
    past_T_max = float(got[tile["past_T"]].max())  # NaN when one is NaN
    caps = False
    if not overflow_rows and past_T_max > 0:  # finite factors above 1 on rows past T: a cap, or a value above 0?
        ramp = probe_tile(**RAMP_TILE, **where)
        got_ramp, stub_ramp = probe_exponent(helper, ramp), probe_exponent(chunk.later_rows_exponent_unmasked, ramp)
        bound = torch.minimum(stub_ramp, torch.tensor(past_T_max))
        caps = bool(torch.equal(got_ramp[real_slots], bound[real_slots])
                    and (stub_ramp[ramp["past_T"]] < past_T_max).any())
    return {"raised": None, "overflow_rows": overflow_rows, "past_T_max": past_T_max, "caps": caps,
            "wrong_real": int(wrong.sum()), "real": int(tile["real"].sum()), "like_stub": like_stub,
            "masks_slots": like_stub and bool((got[~real_slots] == 0).all()), "example": example,
            "rows0": tile["rows0"], "T": tile["T"]}


_LINE = exercises.Sealed(
    "YHJldHVybiB0bC53aGVyZSgob19qIDwgVClbOiwgTm9uZV0gJiBtX2RbTm9uZSwgOl0sIGJfZ3EgLSBiX2duLCAwKWA6IGEgWzE2LCAxXSByb3cg"
    "bWFzayAod2l0aCB0aGUgY2hhbm5lbCBtYXNrKSBrZWVwcyBldmVyeSByZWFsIHJvdydzIGV4cG9uZW50IGFuZCBnaXZlcyBlYWNoIHJvdyBwYXN0"
    "IFQgYW4gZXhwb25lbnQgb2YgMCwgd2hvc2UgZXhwKCkgdGltZXMgdGhlIHJvdydzIHplcm8gVyBhZGRzIGV4YWN0bHkgMA==")
# what is wrong, where the tier also says what the fix must do: sealed like the line (`verdict.hint()` opens them).
# A helper that does not compile, a mask along the slots, an overflow on rows past T, a cap, a value above 0 on rows
# past T, real rows changed
_WHAT_SHAPE = exercises.Sealed(
    "dGhlIHRpbGUgaXMgWzE2IGxhdGVyIHJvd3MgdCwgMzIgc2xvdCBjaGFubmVsc107IG9faiBpcyBbMTZdLCBvbmUgZW50cnkgcGVyIHJvdy4gQSBtYX"
    "NrIGJ1aWx0IGZyb20gaXQgbXVzdCB2YXJ5IGRvd24gdGhlIHJvd3M6IChvX2ogPCBUKVtOb25lLCA6XSBpcyBhIFsxLCAxNl0gcm93IHZlY3Rvciwg"
    "bGFpZCBhbG9uZyB0aGUgY2hhbm5lbHMgKHdpdGggZXhhY3RseSAxNiBjaGFubmVscyBpdCB3b3VsZCBicm9hZGNhc3QgYW5kIG1hc2sgdGhlIHdyb2"
    "5nIGNlbGxzIHdpdGhvdXQgYW4gZXJyb3Ip")
_WHAT_SLOTS = exercises.Sealed(
    "eW91ciBtYXNrIGZvbGxvd3MgdGhlIHNsb3QgY2hhbm5lbHMgKG1fZCk6IGl0IHplcm9lcyB0aGUgc2xvdHMgcGFzdCB0aGUgdGlsZSwgd2hpY2ggd2"
    "VyZSBoYXJtbGVzcywgYW5kIGxlYXZlcyBldmVyeSByZWFsIHNsb3QgYXMgdGhlIHVubWFza2VkIGxpbmUgaGFzIGl0LiBXaGF0IG92ZXJmbG93cyBp"
    "cyBhICpyb3cqOiBvbiBhIHJvdyBwYXN0IFQgdGhlIGxvYWQgZ2F2ZSBncSA9IDAsIHNvIGdxIC0gZ24gPSB8Z258ID4gODguNy4gVGhlIG1hc2sgaG"
    "FzIHRvIHZhcnkgZG93biB0aGUgcm93cw==")
_WHAT_OVERFLOW = exercises.Sealed(
    "b24gYSByb3cgcGFzdCBUIHRoZSBsb2FkIGdhdmUgZ3EgPSAwLCBzbyBncSAtIGduID0gfGdufCA+IDg4LjcgYW5kIGV4cCgpIGlzIGluZjsgaW5mIH"
    "RpbWVzIHRoZSByb3cncyB6ZXJvIFcgaXMgTmFOLiBUaG9zZSByb3dzIG5lZWQgYW4gZXhwb25lbnQgd2hvc2UgZXhwKCkgaXMgZmluaXRlOiB0aGUg"
    "cm93IGNvbnRyaWJ1dGVzIFcgPSAwIGVpdGhlciB3YXk=")
_WHAT_CAP = exercises.Sealed(
    "eW91ciBoZWxwZXIgY2FwcyB0aGUgZXhwb25lbnQgKGEgYm91bmQgc3VjaCBhcyB0bC5taW5pbXVtKC4uLiwgODguMCkpIGluc3RlYWQgb2YgbWFza2"
    "luZyB0aGUgcm93cyBwYXN0IFQ6IGEgcm93IHBhc3QgVCBrZWVwcyBncSAtIGduID0gfGdufCB1cCB0byB0aGUgY2FwLiBUaGF0IHJvdyBhZGRzIDAg"
    "b25seSBiZWNhdXNlIGl0cyBkbyBsb2FkcyBhcyBleGFjdGx5IDAgKGEgbGFyZ2VyIGRvIHRoZXJlIG92ZXJmbG93cywgYWJvdmUpLCBhbmQgdGhlIG"
    "NhcCBob2xkcyBvbmx5IHdoaWxlIGl0IHN0YXlzIGJlbG93IDg4LjcyLiBBIHJvdyB0aGF0IGRvZXMgbm90IGV4aXN0IG5lZWRzIGFuIGV4cG9uZW50"
    "IGNob3NlbiBieSBhIGNvbmRpdGlvbiBvbiB0aGUgcm93cywgd2hvc2UgZXhwKCkgaXMgYXQgbW9zdCAxLCBhcyBvbiBldmVyeSByZWFsIHJvdyAoZ3"
    "FfdCA8PSBnbik=")
_WHAT_ABOVE_0 = exercises.Sealed(
    "cm93cyBwYXN0IFQgZ2V0IGFuIGV4cG9uZW50IGFib3ZlIDA6IGV4cCgpID4gMSwgd2hlcmUgZXZlcnkgcmVhbCByb3cncyBmYWN0b3IgaXMgYXQgbW"
    "9zdCAxIChncV90IDw9IGduKS4gVGhlIHJvdyBhZGRzIDAgb25seSBiZWNhdXNlIGl0cyBkbyBsb2FkcyBhcyBleGFjdGx5IDA7IGdpdmUgYSByb3cg"
    "dGhhdCBkb2VzIG5vdCBleGlzdCBhIHZhbHVlIHdob3NlIGV4cCgpIGlzIGF0IG1vc3QgMTogMCwgd2hvc2UgZXhwKCkgdGltZXMgdGhlIHplcm8gZG"
    "8gaXMgMCwgb3IgYmVsb3c=")
_WHAT_REAL_ROWS = exercises.Sealed(
    "YSByZWFsIGxhdGVyIHJvdyB0IGhhcyBncV90IDw9IGduIGFuZCBpdHMgZXhwb25lbnQgZ3FfdCAtIGduIG11c3Qgc3RheSBleGFjdGx5IHRoYXQ7IG"
    "9ubHkgdGhlIHJvd3MgcGFzdCBUIChvX2ogPj0gVCkgbWF5IGdldCBhbm90aGVyIHZhbHVl")
_WHAT_FIRST_CHUNK_ONLY = exercises.Sealed(
    "b19qIGhvbGRzIGVhY2ggcm93J3MgdGltZSBzdGVwIGNvdW50ZWQgZnJvbSB0aGUgc3RhcnQgb2YgdGhlIHNlcXVlbmNlICg5Ni4uMTExIG9uIHRo"
    "ZSBzZWNvbmQgY2h1bmsncyB0aWxlKSwgYW5kIFQgaXMgdGhlIHNlcXVlbmNlJ3MgbGVuZ3RoIG9uIHRoZSBzYW1lIGF4aXMuIEEgY29uZGl0aW9u"
    "IHRoYXQgb25seSBob2xkcyBpbiB0aGUgZmlyc3QgY2h1bmsgKGEgZml4ZWQgbnVtYmVyIGluIHBsYWNlIG9mIFQsIG9yIG9faiBvciBUIHRha2Vu"
    "IG1vZHVsbyB0aGUgY2h1bmsgc2l6ZSA2NCkgbWFya3MgdGhlIHdyb25nIHJvd3MgaW4gZXZlcnkgbGF0ZXIgY2h1bms6IHJlYWwgcm93cyBsb3Nl"
    "IHRoZWlyIGV4cG9uZW50LCBvciByb3dzIHBhc3QgVCBrZWVwIHRoZWlycw==")


def _tile(found: dict) -> str:
    return f"later rows {found['rows0']}..{found['rows0'] + BC - 1}, T = {found['T']}"


def exponent_hints(found: dict) -> tuple[str, ...]:
    """Hint tiers (where to look, what is wrong, the line) for what `diagnose` measured (on the tile of the first
    chunk, or, with `found["later_chunk"]`, on the second chunk's `LATER_TILE` after the first one was right)."""
    if found.get("later_chunk"):
        past = spans(list(range(found["T"], found["rows0"] + BC)))
        if found["overflow_rows"]:
            said = f"exp() of your exponent is inf or NaN on the rows past T ({spans(found['overflow_rows'])})"
        elif found["wrong_real"]:
            r, m, got, want = found["example"]
            said = (f"{found['wrong_real']} of its {found['real']} real cells changed (row {r}, slot {m}: "
                    f"{exercises.fmt(got)} instead of gq - gn = {exercises.fmt(want)})")
        else:
            said = (f"your exponent on the rows past T ({past}) reaches {exercises.fmt(found['past_T_max'])}, not 0 "
                    "or below")
        first = f"later rows {PROBE_ROWS}..{PROBE_ROWS + BC - 1}, T = {PROBE_T}"
        return exercises.hints(
            where=f"your helper is right on a probe tile of the first chunk ({first}) and wrong on the same tile in "
                  f"the second chunk ({_tile(found)}): {said}",
            what=_WHAT_FIRST_CHUNK_ONLY, line=_LINE)
    if found["raised"]:
        return exercises.hints(
            where=f"your helper does not compile against the kernel's tile: {found['raised']}",
            what=_WHAT_SHAPE, line=_LINE)
    rows = found["overflow_rows"]
    if rows:
        where = (f"rows past T: on the probe tile ({_tile(found)}, |gn| >= 100) exp() of your exponent "
                 f"is inf or NaN on row{'s' if len(rows) > 1 else ''} {spans(rows)}")
        if rows == [found["T"]]:
            what = ("row t = T itself: rows 0..T-1 exist, so row T is the first past the end. A comparison "
                    "o_j <= T keeps it live, with gq = 0 and an exponent |gn|")
        elif found.get("masks_slots"):
            what = _WHAT_SLOTS
        elif found["like_stub"]:
            what = ("your helper returns what the unmasked line returns on every real slot. On a row past T the load "
                    "already gave gq = 0 (masking b_gq again changes nothing): the difference 0 - gn = |gn| is "
                    "what overflows, before the multiplication by the row's zero W can cancel it")
        else:
            what = _WHAT_OVERFLOW
        if found["wrong_real"]:
            where += f"; and {found['wrong_real']} of its {found['real']} real cells changed"
        return exercises.hints(where=where, what=what, line=_LINE)
    top = found["past_T_max"]
    if top > 0:  # finite (no overflow row) but above 0: exp() > 1 on a row that does not exist
        where = (f"rows past T: on the probe tile ({_tile(found)}, |gn| >= 100) your exponent on rows "
                 f"{spans(list(range(found['T'], found['rows0'] + BC)))} reaches {exercises.fmt(top)}, not 0 or below: "
                 f"exp() = {exercises.fmt(math.exp(top))}, finite, so no NaN here, yet a factor above 1 on a row that "
                 "does not exist")
        if found["caps"]:  # the measured numbers stay here: the tier after it is sealed, so it cannot hold them
            where += (f"; any do above {exercises.fmt(torch.finfo(torch.float32).max / math.exp(top))} on those rows "
                      "would overflow")
        if found["wrong_real"]:
            where += f"; and {found['wrong_real']} of its {found['real']} real cells changed"
        return exercises.hints(where=where, what=_WHAT_CAP if found["caps"] else _WHAT_ABOVE_0, line=_LINE)
    if found["wrong_real"]:
        r, m, got, want = found["example"]
        return exercises.hints(
            where=f"real rows: {found['wrong_real']} of the probe tile's {found['real']} real cells changed "
                  f"(row {r}, slot {m}: {exercises.fmt(got)} instead of gq - gn = {exercises.fmt(want)})",
            what=_WHAT_REAL_ROWS, line=_LINE)
    return exercises.hints(where=f"the helper is right on the probe tiles ({_tile(found)}, and the first chunk's) but "
                                 "not in the kernel: does it depend on values the probe does not have?", line=_LINE)


def _clean(found: dict) -> bool:
    """Whether the helper is right on a probe tile: it compiles, no overflow, exponent <= 0 past T, real rows kept."""
    return (not found["raised"] and not found["overflow_rows"] and found["past_T_max"] <= 0
            and not found["wrong_real"])


def check_padded_exponent(helper) -> exercises.Verdict:
    """Run the real `chunk_gsa` (fp32, 24 slots, decay knob m = 30) with `helper` in the EXPONENT slot of its
    slot-gradient kernel, forward and backward, against the float64 recurrence, at T = 45 (one partial chunk) and
    T = 109 (a full chunk, then a partial one): PASS when every gradient is finite and within the fp32 gradient
    tolerance (scale-aware, as `harness.compare`) in both cases and, on the probe tile, the rows past T get an
    exponent of at most 0 (exp() <= 1, as every real row: a cap that keeps exp() finite is not a mask, it only works
    because the padded do loads as 0); ds and dg are printed, the two the helper reaches. The hints follow what the
    helper does on the probe tile (`diagnose`), and where it is right there, on the same tile in the second chunk
    (`LATER_TILE`)."""
    if rejected := exercises.not_a_jit_helper(EXERCISE, helper):
        return rejected
    found = diagnose(helper)
    if found["raised"]:
        return exercises.Verdict(EXERCISE, False, [f"the helper raised: {found['raised']}"], exponent_hints(found))
    hint_from = found
    if _clean(found):
        later = diagnose(helper, LATER_TILE)
        if not _clean(later):
            hint_from = dict(later, later_chunk=True)
    tol = check.tolerance(torch.float32).grad
    shown, extra, others_ok, others = {}, [], True, []
    for T in (EXERCISE_T, EXERCISE_T_LATER):
        got = _run(exercise_inputs(T, EXERCISE_DECAY), None, torch.float32, reference=True, exponent=helper)
        names = [n[4:] for n in got if n.startswith("ref_d")]
        errors = check.grad_errors({n: got[f"ref_{n}"] for n in names}, {n: got[n] for n in names})
        bad = {n: int((~torch.isfinite(got[n])).sum()) for n in ("ds", "dg")}
        others = [n for n in names if n not in bad]
        others_ok = others_ok and all(errors[n] <= tol for n in others)
        extra.append((not any(bad.values()),
                      f"non-finite (T = {T}): ds {bad['ds']}, dg {bad['dg']} of {got['ds'].numel()} each"))
        shown.update({f"{n} (T = {T}, m = {EXERCISE_DECAY:g})": errors[n] for n in ("ds", "dg")})
    top = found["past_T_max"]
    rows = spans(list(range(PROBE_T, PROBE_ROWS + BC)))
    extra += [(others_ok, f"the other gradients ({', '.join(others)}) within tolerance: {others_ok}"),
              (top <= 0, f"probe tile, rows past T (t = {rows}): largest exponent {exercises.fmt(top)} "
                         f"{'<=' if top <= 0 else '>'} 0 (exp() <= 1, as on every real row)")]
    return exercises.verdict_from_errors(EXERCISE, shown, tol, exponent_hints(hint_from), extra)


def show_slot() -> None:
    """The loop of `cols_from_later_subchunks` over later sub-chunks, where the EXPONENT helper is called, once the
    exercise is solved or revealed: before that, the loop would answer part of it."""
    from fla_lab.ops.common import chunk

    if not exercises.is_open(EXERCISE):
        print(f"(the kernel's loop around the EXPONENT slot {_SHOWS_ONCE_SOLVED})")
        return

    source = markers.source_of(chunk.cols_from_later_subchunks).splitlines()
    print("fla_lab/ops/common/chunk.py, cols_from_later_subchunks (the loop over later sub-chunks):")
    start = next(i for i, line in enumerate(source) if "for i_j in range" in line)
    stop = next(i for i in range(start, len(source)) if "EXPONENT(" in source[i])
    print("\n".join(source[start:stop + 1]))


def show_shipped_exponent() -> None:
    """The shipped helper of the EXPONENT slot (`later_rows_exponent`, fla_lab/ops/common/chunk.py), the exercise's
    answer: raises `exercises.NotRevealed` until the check says PASS or the last hint tier is printed."""
    from fla_lab.teaching.lessons.overflow import stage_source

    print(stage_source("later_rows_exponent"))

"""Hunting NaNs: which module, which op, which Triton kernel, which (batch, head, step), forward or backward, and why.

    with fla_lab.tools.hunt.locate(model) as found:
        loss = model(x).float().pow(2).mean()
        loss.backward()
    print(found.report)

`locate` wraps every fla_lab op (the layers look theirs up at call time) and every module of `model`. It keeps a
copy of each op call's inputs, checks each output in the forward and each gradient in the backward, and stops
at the first non-finite value (or the first exception). On leaving the block it replays that one call with
`trace_kernels` (which watches every Triton launch and notes the first kernel to write a non-finite value into
one of its arguments) and against the float64 reference (is the exact answer representable? then the kernel is
at fault; if not, the input is), and classifies the cause (`CAUSES`). Without a non-finite value it still audits
precision: a decay that reached the op in 16 bits is #181's pattern.

Cost: a copy of every op input and one sync per op output and gradient while the block runs (a debugging tool:
off unless you enter it; `benchmarks/bench_hunt.py` measures it), plus the replay on leaving.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import sys
from dataclasses import dataclass, field

import torch

from fla_lab.spec import check, harness, registry
from fla_lab.ops import contract

FP32_MAX = torch.finfo(torch.float32).max
GARBAGE = 1e30  # no trained parameter comes near this; uninitialised memory often does

# Cause classes: key -> (what happened, whose fault, what to do)
CAUSES = {
    "kernel_raised": ("a Triton kernel raised (compile or launch error)", "kernel",
                      "read the kernel's masks and tile shapes at the named kernel (cf. #18)"),
    "nonfinite_input": ("an input of the op already held NaN/inf", "input",
                        "look upstream of the op: the module's parameters or the previous layer"),
    "positive_decay": ("a log-decay above 0: every step multiplies the state by exp(g) > 1", "input",
                       "pass log-space decays (F.logsigmoid(x), -exp(x)), not sigmoid(x) (cf. #11, #150)"),
    "growing_transition": ("RWKV-7's transition diag(exp w) + b a^T has an eigenvalue above 1: the state grows "
                           "until it overflows", "input",
                           "build a and b as RWKV-7's layer does (fla_lab.layers.RWKV7Attention): they only remove "
                           "state (cf. #150)"),
    "exp_overflow": ("exp of a cumulative decay overflowed inside the kernel although the exact result is finite "
                     "(inf * 0 = NaN)", "kernel",
                     "factor the exponent against a reference row inside the sub-chunk (cf. #77, 0c1c0b65)"),
    "padded_rows": ("rows past the end of the sequence (a partial last chunk) stayed live in the backward: "
                    "exp(0 - gn) = inf times a zero-padded gradient", "kernel",
                    "mask rows past T before the exp (cf. #77 GSA, 737550ff)"),
    "rounded_decay": ("the decay reached the op rounded to 16 bits: a per-step bias that compounds over the "
                      "sequence (no NaN, just wrong)", "input",
                      "compute the decay in fp32 under autocast (cf. #181, 965c3553)"),
    "nonfinite_cotangent": ("the gradient reached the op's output already non-finite: it was made later in the "
                            "forward (earlier in the backward), outside this op", "input",
                            "look downstream: census the gradients of what consumed this output (parameters of "
                            "later modules, their PyTorch code between ops)"),
    "wrong_but_finite": ("the op's result is finite but disagrees with the float64 reference beyond the dtype's "
                         "tolerance", "kernel", "compare each output and gradient with fla_lab.spec.harness.compare"),
    "none": ("no non-finite value and nothing suspicious", "-", "-"),
}


@dataclass
class Launch:
    kernel: str
    phase: str
    written: dict[str, check.Census] = field(default_factory=dict)  # argument -> non-finite values that appeared
    raised: str | None = None
    masks: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # argument -> where (bool, CPU)


class KernelTracer:
    """Watches every launch of fla_lab's Triton kernels (`fla_lab.ops.common.utils.kernel`): after each launch,
    records every tensor argument that holds a non-finite value where it held a finite one before. Positions, not
    counts: an output from `torch.empty` may hold NaN bit patterns, more of them than the kernel writes.

    A replay tool: it reads every argument twice per launch (and syncs), so use it on one call, not in training.
    """

    def __init__(self):
        self.launches: list[Launch] = []

    def first_bad(self) -> Launch | None:
        return next((launch for launch in self.launches if launch.written or launch.raised), None)

    def _wrap(self, name: str, jitted):
        run, arg_names, tracer = jitted.run, list(jitted.arg_names), self

        def traced_run(*args, **kwargs):
            tensors = {n: a for n, a in zip(arg_names, args) if isinstance(a, torch.Tensor)}
            tensors.update({n: a for n, a in kwargs.items() if isinstance(a, torch.Tensor)})
            # positions, not counts: an output from torch.empty may hold NaN bit patterns before the kernel writes it
            before = {n: ~torch.isfinite(t) for n, t in tensors.items()}
            launch = Launch(name, autograd_phase())
            tracer.launches.append(launch)
            try:
                return run(*args, **kwargs)
            except Exception as exc:
                launch.raised = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                raise
            finally:
                for n, t in tensors.items():
                    bad = ~torch.isfinite(t)
                    if (bad & ~before[n]).any():
                        launch.written[n] = check.nonfinite_census(t, dims=_dims(t))
                        launch.masks[n] = bad.cpu()
        return traced_run

    @contextlib.contextmanager
    def watching(self):
        from fla_lab.ops.common import utils

        kernels = {n.rsplit(".", 1)[1]: k for n, k in utils.registered_kernels().items() if hasattr(k, "arg_names")}
        for name, jitted in kernels.items():
            jitted.run = self._wrap(name, jitted)
        empty, empty_like = torch.empty, torch.empty_like
        # The ops allocate their outputs with torch.empty: memory just freed by the same computation (the model's
        # own forward, before the replay) comes back holding the very NaN a kernel is about to write, and the write
        # would go unseen. While watching, new tensors start at zero.
        torch.empty = lambda *args, **kwargs: empty(*args, **kwargs).zero_()
        torch.empty_like = lambda *args, **kwargs: empty_like(*args, **kwargs).zero_()
        try:
            yield self
        finally:
            torch.empty, torch.empty_like = empty, empty_like
            for jitted in kernels.values():
                del jitted.run  # back to the class's method


def autograd_phase() -> str:
    """"backward" while autograd runs a backward pass (a graph task is executing), else "forward"."""
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


def _dims(t: torch.Tensor) -> tuple[str, ...]:
    """[B, T, H, D] for the ops' sequence tensors; anything else is located by flat index."""
    return ("b", "t", "h", "d") if t.dim() == 4 else tuple(f"i{n}" for n in range(t.dim()))


def trace_kernels() -> contextlib.AbstractContextManager[KernelTracer]:
    """`with trace_kernels() as tracer: ...` then `tracer.first_bad()`: the first launch that wrote NaN/inf."""
    return KernelTracer().watching()


# --- one call: replay and diagnosis -------------------------------------------------------------------------------

@dataclass
class Diagnosis:
    op: str
    phase: str                     # "forward" or "backward"
    cause: str                     # a key of CAUSES
    kernel: str | None = None      # the first Triton kernel that wrote a non-finite value (or raised)
    intermediate: str | None = None  # which of its arguments
    where: dict | None = None      # (b, t, h, d) of the op's first bad output (forward) or gradient (backward)
    stats: dict = field(default_factory=dict)
    note: str = ""
    written_at: dict | None = None  # where the kernel's first non-finite value sits in `intermediate`
    scores: "ScoreBlocks | None" = None  # `intermediate` is a [B, T, H, chunk] score matrix: its bad pairs
    advice: str = ""  # the fix line for this mechanism (CAUSES' advice when empty)

    @property
    def fault(self) -> str:
        return CAUSES[self.cause][1]

    def lines(self) -> list[str]:
        what, fault, advice = CAUSES[self.cause]
        advice = self.advice or advice
        written = f" (first at {_at(self.written_at)})" if self.written_at else ""
        out = [f"op       : {self.op} ({self.phase})",
               f"kernel   : {self.kernel or '-'}" + (f", writing `{self.intermediate}`{written}"
                                                      if self.intermediate else "")]
        if self.scores is not None:
            out.append(f"scores   : {self.scores}")
        out += [f"first bad: {_at(self.where) if self.where else '-'}" + (" (the op's output or gradient)"
                                                                           if self.written_at else ""),
               f"cause    : {self.cause}: {what}",
               f"fault    : {fault}",
               f"stats    : {', '.join(f'{k}={_fmt(v)}' for k, v in self.stats.items())}"]
        if self.note:
            out.append(f"note     : {self.note}")
        out.append(f"fix      : {advice}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _at(where: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in where.items())


@dataclass
class ScoreBlocks:
    """Where the non-finite entries of a [B, T, H, chunk] score matrix sit: query row t (of the sequence), key column
    s (of t's chunk), grouped into sub-chunk blocks (i, j) = (query sub-chunk, key sub-chunk) of the first chunk
    that has any. Diagonal blocks (i = j) hold the causal mask; off-diagonal ones the exponents that need a
    reference row between the two sub-chunks."""
    chunk: int
    sub: int
    chunk_index: int
    blocks: dict[tuple[int, int], int]
    first_pair: tuple[int, int]  # (t, s), rows of the sequence

    @property
    def diagonal(self) -> bool:
        return any(i == j for i, j in self.blocks)

    @property
    def off_diagonal(self) -> bool:
        return any(i != j for i, j in self.blocks)

    def __str__(self) -> str:
        kind = " and ".join(k for k, on in (("diagonal", self.diagonal), ("off-diagonal", self.off_diagonal)) if on)
        blocks = ", ".join(f"({i},{j}) x{n}" for (i, j), n in sorted(self.blocks.items())[:6])
        more = " ..." if len(self.blocks) > 6 else ""
        return (f"chunk {self.chunk_index} ({self.chunk} rows, sub-chunks of {self.sub}): {kind} block(s) "
                f"(query sub-chunk, key sub-chunk) {blocks}{more}; first pair (t, s) = {self.first_pair}")


def score_blocks(mask: torch.Tensor, T: int, chunk: int, sub: int = 16) -> ScoreBlocks | None:
    """The bad pairs of a [B, T', H, chunk] score matrix (T' >= T), or None when `mask` is not shaped like one."""
    if mask.dim() != 4 or mask.shape[-1] != chunk or mask.shape[1] < T or not mask.any():
        return None
    rows = mask[:, :T].any(0).any(1)  # [T, chunk]: (query row, key column within its chunk)
    t_bad, s_bad = rows.nonzero(as_tuple=True)
    if t_bad.numel() == 0:
        return None
    c = int(t_bad[0]) // chunk
    in_chunk = t_bad // chunk == c
    t_in, s_in = t_bad[in_chunk] % chunk, s_bad[in_chunk]
    sub = min(sub, chunk)
    blocks: dict[tuple[int, int], int] = {}
    for i, j in zip((t_in // sub).tolist(), (s_in // sub).tolist()):
        blocks[(i, j)] = blocks.get((i, j), 0) + 1
    return ScoreBlocks(chunk, sub, c, blocks, (int(t_bad[0]), c * chunk + int(s_bad[0])))


# The fix line per mechanism of an exp overflow inside a chunked kernel, by where its NaN sits in the scores.
OVERFLOW_ADVICE = {
    "diagonal": ("inside a diagonal sub-chunk block the causal mask must go on the exponent before exp "
                 "(exp(where(s <= t, G_t - G_s, -inf))); a mask applied after exp multiplies an overflowed inf "
                 "by 0 (read the block's mask and exp lines)"),
    "off-diagonal": ("between two sub-chunks the exponent must be split at a reference row that lies between "
                     "them (exp(G_t - G_n) * exp(G_n - G_s), both <= 0; cf. #77, 0c1c0b65): check which row the "
                     "kernel loads as its reference"),
    "unlocated": ("the kernel's exp overflowed: find its exp of a difference of cumulative decays and check "
                  "that both factors stay <= 0 (a reference row, or a mask on the exponent before exp)"),
}


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _tensors(inputs: dict):
    for name, x in inputs.items():
        if isinstance(x, (tuple, list)):
            yield from ((f"{name}[{i}]", t) for i, t in enumerate(x) if isinstance(t, torch.Tensor))
        elif isinstance(x, torch.Tensor):
            yield name, x


def _first_step(x: torch.Tensor, bad) -> int | None:
    """The first time step of a [B, T, H, D] tensor where `bad(x)` holds anywhere."""
    steps = bad(x.detach()).flatten(2).any(-1).any(0)
    return int(steps.nonzero()[0]) if steps.any() else None


def input_stats(spec: registry.OpSpec, inputs: dict) -> dict:
    """What explains most NaNs before any kernel runs: dtypes, the decay's range, non-finite inputs."""
    g = inputs[spec.decay_name]
    stats = {"dtype": str(inputs[next(iter(inputs))].dtype).replace("torch.", ""),
             "decay dtype": str(g.dtype).replace("torch.", ""),
             "log-decay min": float(g.min()), "log-decay max": float(g.max()),
             "T": g.shape[1]}
    bad = [n for n, t in _tensors(inputs) if not torch.isfinite(t).all()]
    if bad:
        stats["non-finite inputs"] = bad
    if spec.family == "rwkv7":
        from fla_lab.ops.contract import transition_radius

        ours = inputs if spec.library == "fla_lab" else _as_ours(spec, inputs)
        radius = transition_radius(ours["w"], ours["a"], ours["b"]) if not bad else math.nan
        stats["transition radius"] = radius
    return stats


def _as_ours(spec, inputs: dict) -> dict:
    """An FLA call's tensors under fla_lab's names (RWKV-7's a, b from FLA's kk, a; DPLR's q, gk as r, w)."""
    from fla_lab.tools import upstream

    return upstream.ENTRIES[spec.name].to_ours(inputs)


def reference_for_call(spec: registry.OpSpec, kwargs: dict):
    """The spec's float64 reference as one recorded call needs it: with the call's options that the reference takes
    (all of them for the adapter's references of FLA's ops, which take **kwargs), and a packed batch's sequences
    one at a time (`conventions.packed_reference`)."""
    import functools

    from fla_lab.ops.common.conventions import packed_reference

    parameters = inspect.signature(spec.reference).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    options = {n: v for n, v in kwargs.items() if takes_all or n in parameters}
    return functools.partial(packed_reference(spec.reference), **options, cu_seqlens=kwargs.get("cu_seqlens"))


def _reference_run(spec, inputs: dict, do, dht, kwargs: dict) -> dict:
    """The float64 answer on the same (already rounded) inputs: is it representable in fp32?"""
    ref_in = harness.exact_leaves(inputs, "cpu")
    o, ht = reference_for_call(spec, kwargs)(**ref_in, output_final_state=True)
    states = ht if isinstance(ht, tuple) else (ht,)
    out = {"o": o.detach(), "state max": max(float(s.detach().abs().max()) for s in states)}
    out["o first > fp32 max"] = _first_step(o, lambda x: ~(x.abs() <= FP32_MAX))
    if do is not None:
        loss = (o * do.double().cpu()).sum()
        if dht is not None:
            loss = loss + sum((s * d.double().cpu()).sum() for s, d in zip(states, dht if isinstance(dht, tuple)
                                                                             else (dht,)) if d is not None)
        loss.backward()
        grads = [t.grad for _, t in _tensors(ref_in) if t.grad is not None]
        out["grads finite"] = all(bool((g.abs() <= FP32_MAX).all()) for g in grads)
    return out


def replay(spec: registry.OpSpec, fn, inputs: dict, kwargs: dict | None = None, do=None, dht=None) -> Diagnosis:
    """Run one op call again (forward, and backward when `do` is given) watching its kernels, run the float64
    reference on the same inputs, and say where the first non-finite value appeared and why."""
    kwargs = dict(kwargs or {})
    stats = input_stats(spec, inputs)
    arrived = _nonfinite_cotangent(spec, do, dht, stats)
    if arrived is not None:  # nothing to replay: the op only passed on what it was given
        return arrived
    leaves = {n: (tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in x)
                  if isinstance(x, (tuple, list)) else x.detach().clone().requires_grad_(x.is_floating_point()))
              for n, x in inputs.items()}
    tracer, raised, o, phase = KernelTracer(), None, None, "forward"
    with tracer.watching(), _quiet(), contract.value_checks(False):  # let the input through, as the model did
        try:
            o, ht = fn(**leaves, **kwargs, output_final_state=True)
            if do is not None and torch.isfinite(o).all():
                phase = "backward"
                states = ht if isinstance(ht, tuple) else (ht,)
                dhts = dht if isinstance(dht, tuple) else (dht,)
                loss = (o * do.to(o)).sum() + sum((s * d.to(s)).sum() for s, d in zip(states, dhts) if d is not None)
                loss.backward()
        except Exception as exc:  # what a failing kernel does is part of the diagnosis
            raised = exc
    bad = tracer.first_bad()
    diagnosis = Diagnosis(spec.label, bad.phase if bad else phase, "none", stats=stats)
    if bad:
        diagnosis.kernel = bad.kernel
        if bad.written:
            diagnosis.intermediate, census = next(iter(bad.written.items()))
            diagnosis.where = diagnosis.written_at = census.first
            if spec.chunk_sizes:
                chunk = kwargs.get("chunk_size") or _default_chunk(spec)
                diagnosis.scores = score_blocks(bad.masks[diagnosis.intermediate], stats["T"], chunk)
    if raised is not None and bad is not None and bad.raised:
        diagnosis.cause, diagnosis.note = "kernel_raised", f"{type(raised).__name__}: {_first_line(raised)}"
        return diagnosis
    if raised is not None:  # raised outside any kernel: the op's own checks
        stats["raised"] = f"{type(raised).__name__}: {_first_line(raised)}"
    ref = _reference_run(spec, inputs, do, dht, kwargs) if "non-finite inputs" not in stats else {}
    if ref:
        stats["state max (float64)"] = ref["state max"]
    diagnosis.where = _where(o, leaves, diagnosis.phase) or diagnosis.where
    diagnosis.cause, diagnosis.note = _classify(spec, stats, ref, diagnosis, kwargs)
    return diagnosis


def _nonfinite_cotangent(spec, do, dht, stats) -> Diagnosis | None:
    """A cotangent (of the output or a final state) that arrived non-finite: the op is a victim, not the source."""
    named = {"do": do} | {f"dht[{i}]": d for i, d in enumerate(dht if isinstance(dht, tuple) else (dht,))}
    bad = {n: d for n, d in named.items() if d is not None and not torch.isfinite(d).all()}
    if not bad:
        return None
    name, d = next(iter(bad.items()))
    census = check.nonfinite_census(d, dims=_dims(d))
    return Diagnosis(spec.label, "backward", "nonfinite_cotangent", where={"grad of": name, **census.first},
                     stats=stats, note=f"`{name}` arrived with {census.count} non-finite value(s) of {d.numel()}")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[-1][:160]


def _where(o, leaves, phase) -> dict | None:
    """The (b, t, h, d) of the first non-finite value of the output (forward) or of the first gradient (backward)."""
    if phase == "forward" and o is not None and not torch.isfinite(o).all():
        return check.nonfinite_census(o).first
    for name, t in _tensors(leaves):
        if t.grad is not None and t.dim() == 4 and not torch.isfinite(t.grad).all():
            return {"grad": name, **check.nonfinite_census(t.grad).first}
    return None


def _classify(spec, stats, ref, diagnosis, kwargs) -> tuple[str, str]:
    if "non-finite inputs" in stats:
        return "nonfinite_input", f"non-finite: {', '.join(stats['non-finite inputs'])}"
    if stats["log-decay max"] > 0:
        return "positive_decay", f"max log-decay {stats['log-decay max']:.3g} > 0" + _chunk_early(ref, diagnosis)
    if stats.get("transition radius", 0.0) > 1.02:
        return "growing_transition", (f"eigenvalue modulus {stats['transition radius']:.3g}"
                                      + _chunk_early(ref, diagnosis))
    if diagnosis.kernel is None:
        if stats["decay dtype"] in ("bfloat16", "float16"):
            return "rounded_decay", f"{spec.decay_name} is {stats['decay dtype']}"
        return "none", ""
    if diagnosis.phase == "backward" and spec.chunk_sizes:
        chunk = kwargs.get("chunk_size") or _default_chunk(spec)
        if stats["T"] % chunk:
            return "padded_rows", f"T = {stats['T']} is not a multiple of chunk_size = {chunk}"
    scores = diagnosis.scores
    mechanism = ("unlocated" if scores is None else "diagonal" if not scores.off_diagonal else
                 "off-diagonal" if not scores.diagonal else None)
    diagnosis.advice = OVERFLOW_ADVICE[mechanism] if mechanism else (
        OVERFLOW_ADVICE["diagonal"] + "; and " + OVERFLOW_ADVICE["off-diagonal"])
    return "exp_overflow", (f"the float64 result is finite (state max {ref.get('state max', math.nan):.3g}); "
                            f"log-decay down to {stats['log-decay min']:.3g} per step")


def _chunk_early(ref: dict, diagnosis: Diagnosis) -> str:
    """A chunked kernel's first NaN can come before the exact output overflows: an inf later in the chunk meets
    the zeros of a masked score matrix (0 * inf) and poisons every row of the chunk."""
    exact_t, got_t = ref.get("o first > fp32 max"), (diagnosis.where or {}).get("t")
    if exact_t is None or got_t is None or got_t >= exact_t:
        return ""
    return (f"; chunk-early NaN: the exact output first leaves fp32 at t={exact_t}, the kernel's first NaN is at "
            f"t={got_t} (an overflow later in the chunk reaches earlier rows as 0 * inf)")


def _default_chunk(spec) -> int:
    return inspect.signature(spec.fn).parameters["chunk_size"].default or 64


@contextlib.contextmanager
def _quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --- a whole model: the locator ------------------------------------------------------------------------------------

class LocatorError(RuntimeError):
    """The locator itself failed (not the model, not an op)."""


@dataclass
class Call:
    index: int
    op: str
    module: str
    fn: object
    inputs: dict
    kwargs: dict
    do: torch.Tensor | None = None
    dht: object = None
    detached: tuple[str, ...] = ()  # outputs returned without a graph although an input required grad
    output_final_state: bool = True  # as called (replays ask for the final state; the audit also runs it as called)
    library: str = "fla_lab"  # or "fla": flash-linear-attention's op, `op` its FLA name (fla_lab.tools.upstream)

    @property
    def label(self) -> str:
        return self.op if self.library == "fla_lab" else f"{self.library}:{self.op}"


def spec_of(call: Call) -> registry.OpSpec:
    """The registry's spec for an fla_lab op call; for an FLA call, the adapter's (FLA's names, fla_lab's
    float64 reference through the mapping of `fla_lab.tools.upstream`)."""
    if call.library == "fla_lab":
        return registry.get(call.op)
    from fla_lab.tools import upstream

    return upstream.spec(call.op, call.fn)


@dataclass
class Event:
    call: Call
    phase: str
    what: str


@dataclass
class Report:
    calls: list[Call]
    event: Event | None
    diagnosis: Diagnosis | None
    modules: dict[str, str] = field(default_factory=dict)  # first module with a non-finite output / parameter

    def suspects(self) -> "Suspects":
        """Switches (`fla_lab.layers.SWITCHES`, the catalogue's entries) whose located (op, kernel, cause) is what this report found; printed empty, it says
        that nothing in the catalogue matches (a new bug) and what to compare next."""
        from fla_lab import layers

        d = self.diagnosis
        found = (d.op, d.kernel, d.cause) if d is not None else None
        return Suspects([s.name for s in layers.SWITCHES if s.located == found], found)

    def __str__(self) -> str:
        if self.diagnosis is None:
            return f"no non-finite value in {len(self.calls)} op call(s)"
        head = [f"module   : {self.event.call.module}",
                f"call     : #{self.event.call.index} of {len(self.calls)} ({self.event.what})"]
        head += [f"params   : {v}" for v in self.modules.values()]
        return "\n".join(head + self.diagnosis.lines())


class Suspects(list):
    """A list of catalogue names that says, when empty, that the failure matches no catalogue entry."""

    def __init__(self, names, located: tuple | None):
        super().__init__(names)
        self.located = located

    def __str__(self) -> str:
        if self or self.located is None:
            return list.__repr__(self) if self else "[] (nothing was located)"
        op, kernel, cause = self.located
        head = f"[] no catalogue entry matches (op={op}, kernel={kernel or '-'}, cause={cause}): a bug it does not know"
        if CAUSES[cause][1] == "input":
            return head + "; the op received it: look where the report's fix line points"
        return head + ("; compare the op with its float64 reference (fla_lab.spec.harness.compare) and with the "
                       "family's fused recurrent op on the same inputs (no chunks: if that one is right, the bug is "
                       "on the chunked path), and census where the bad values sit (the report's kernel and scores "
                       "lines)")

    __repr__ = __str__


class Locator:
    def __init__(self, model: torch.nn.Module | None = None, replay: bool = True, fla: bool | None = None):
        """`fla`: also record flash-linear-attention's op calls (None: when `fla` is already imported)."""
        self.model, self.do_replay = model, replay
        self.record_fla = ("fla" in sys.modules) if fla is None else fla
        self._inside_fla = 0  # > 0 while an FLA op runs: the ops it calls are its own, not the model's
        self.calls: list[Call] = []
        self.event: Event | None = None
        self.report: Report | None = None
        self._stack: list[str] = []
        self._pending: Call | None = None  # the call whose backward started and has not finished
        self._op_raised = False
        self.own_error: Exception | None = None  # a failure of the locator itself (its hooks)

    # forward ---------------------------------------------------------------------------------------------------
    def _wrap_op(self, name: str, real, library: str = "fla_lab"):
        signature = inspect.signature(real)
        fla = library != "fla_lab"

        def located(*args, **kwargs):
            if fla and self._inside_fla:  # 0.6.0's chunk_rwkv7 calls chunk_dplr_delta_rule: one call, the outer
                return real(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            bound = {**bound, **bound.pop("kwargs", {})}  # a wrapper's **kwargs may carry tensors too
            inputs = {n: v for n, v in bound.items() if _is_input(v)}
            options = {n: v for n, v in bound.items() if n not in inputs and n != "output_final_state"}
            if fla:
                from fla_lab.tools import upstream

                options = upstream.recorded_options(real, options)
            flag = signature.parameters.get("output_final_state")
            call = Call(len(self.calls), name, self._stack[-1] if self._stack else "-", real,
                        {n: _copy(v) for n, v in inputs.items()}, options,
                        output_final_state=bool(bound.get("output_final_state",
                                                          flag.default if flag is not None else True)),
                        library=library)
            self.calls.append(call)
            self._inside_fla += fla
            try:
                o, ht = real(*args, **kwargs)
            except Exception:
                self._record(call, "forward", "the op raised")
                self._op_raised = True
                raise
            finally:
                self._inside_fla -= fla
            if self.event is None and not _all_finite(o, ht):
                self._record(call, "forward", "non-finite output")
            self._watch_backward(call, inputs, o, ht)
            return o, ht
        return located

    def _record(self, call: Call, phase: str, what: str) -> None:
        if self.event is None:
            self.event = Event(call, phase, what)

    # backward --------------------------------------------------------------------------------------------------
    def _watch_backward(self, call: Call, inputs: dict, o, ht) -> None:
        states = ht if isinstance(ht, tuple) else (ht,)
        if torch.is_grad_enabled() and any(t.requires_grad for _, t in _tensors(inputs)):
            returned = {"o": o, **{f"ht[{i}]" if len(states) > 1 else "ht": s for i, s in enumerate(states)}}
            call.detached = tuple(n for n, t in returned.items() if t is not None and not t.requires_grad)
        if not torch.is_grad_enabled() or not o.requires_grad:
            return

        def got_do(grad):
            call.do, self._pending = grad.detach().clone(), call
            if self.event is None and not torch.isfinite(grad).all():
                self._record(call, "backward", "non-finite gradient reached the op's output")
        o.register_hook(self._guarded(got_do))
        call.dht = [None] * len(states)
        for i, s in enumerate(states):
            if s is not None and s.requires_grad:
                s.register_hook(self._guarded(_store_state_grad(call, i)))
        for name, t in _tensors(inputs):
            if t.requires_grad:
                t.register_hook(self._guarded(self._grad_check(call, name)))

    def _guarded(self, hook):
        """A hook of the locator's own: if it fails, that is the locator's failure, reported as such (LocatorError
        from the backward, `own_error` on the locator), never taken for the model's."""
        def guarded(grad):
            try:
                return hook(grad)
            except Exception as exc:
                self.own_error = exc
                raise LocatorError(f"fla_lab.tools.hunt's own backward hook failed ({type(exc).__name__}: {exc}); the "
                                   "model's backward was stopped by the locator, not by the model") from exc
        return guarded

    def _grad_check(self, call: Call, name: str):
        def check_grad(grad):
            if self._pending is call:
                self._pending = None
            if self.event is None and not torch.isfinite(grad).all():
                self._record(call, "backward", f"non-finite gradient of `{name}`")
        return check_grad

    # modules -----------------------------------------------------------------------------------------------------
    def _enter_module(self, name):
        def pre(module, args):
            self._stack.append(name)
        return pre

    def _leave_module(self, module, args, output):
        if self._stack:
            self._stack.pop()

    def __enter__(self) -> "Locator":
        from fla_lab import ops

        self._patches = []
        for spec in registry.ops().values():
            if spec.library == "fla_lab":
                real = getattr(ops, spec.name)
                self._patches.append((ops, spec.name, real))
                setattr(ops, spec.name, self._wrap_op(spec.name, real))
        if self.record_fla:
            self._patch_fla()
        self._hooks = []
        if self.model is not None:
            for name, module in self.model.named_modules():
                label = f"{name or 'model'} ({type(module).__name__})"
                self._hooks.append(module.register_forward_pre_hook(self._enter_module(label)))
                self._hooks.append(module.register_forward_hook(self._leave_module))
        return self

    def _patch_fla(self) -> None:
        """Wrap FLA's op entry points in every `fla.*` namespace that holds them (its layers import them by name):
        one wrapper per function, so each call is recorded once whichever namespace it came through."""
        from fla_lab.tools import upstream

        functions = upstream.entry_points()
        wrapped = {name: self._wrap_op(name, fn, "fla") for name, fn in functions.items()}
        for module, attribute, name in upstream.call_sites(functions):
            self._patches.append((module, attribute, functions[name]))
            setattr(module, attribute, wrapped[name])

    def __exit__(self, exc_type, exc, tb) -> bool:
        for module, name, real in self._patches:
            setattr(module, name, real)
        for hook in self._hooks:
            hook.remove()
        if self.own_error is not None:  # the locator's failure: no report to trust, and the exception propagates
            self.report = None
            return False
        if exc is not None and self.event is None and self._pending is not None:
            self._record(self._pending, "backward", f"the backward raised {exc_type.__name__}")
            self._op_raised = True
        self.report = self._report()
        # an op (or its backward) that raised is part of the report, even when it only reacted to an earlier NaN
        return exc is not None and self.event is not None and self._op_raised

    def _report(self) -> Report:
        if self.event is None:
            audit = self._precision_audit()
            return Report(self.calls, audit and Event(audit[0], "forward", "precision audit"),
                          audit and audit[1])
        call = self.event.call
        spec = spec_of(call)
        diagnosis = None
        if self.do_replay:
            do = call.do if self.event.phase == "backward" else None
            dht = tuple(call.dht) if isinstance(call.dht, list) and len(call.dht) > 1 else (
                call.dht[0] if isinstance(call.dht, list) else None)
            diagnosis = replay(spec, call.fn, call.inputs, call.kwargs, do=do, dht=dht)
        return Report(self.calls, self.event, diagnosis, self._bad_parameters())

    def _precision_audit(self):
        for call in self.calls:
            spec = spec_of(call)
            g = call.inputs.get(spec.decay_name)
            if g is not None and g.dtype in (torch.bfloat16, torch.float16):
                return call, Diagnosis(spec.label, "forward", "rounded_decay", stats=input_stats(spec, call.inputs),
                                       note=f"`{spec.decay_name}` arrived in {str(g.dtype)[6:]}")
        return None

    def _bad_parameters(self) -> dict[str, str]:
        if self.model is None:
            return {}
        bad = [n for n, p in self.model.named_parameters() if not (p.detach().abs() <= GARBAGE).all()]
        return {"parameters": f"{len(bad)} parameter(s) hold NaN/inf or |x| > {GARBAGE:g}: {', '.join(bad[:6])}"
                              + (" ..." if len(bad) > 6 else "")} if bad else {}


def _store_state_grad(call: Call, i: int):
    def store(grad):  # None when autograd gives this state no gradient (GSA's pair: only one of them used)
        call.dht[i] = None if grad is None else grad.detach().clone()
    return store


def _is_input(v) -> bool:
    """Floating-point tensors (or tuples of them: GSA's state pair); integer tensors (cu_seqlens) are options."""
    return _is_float(v) or (isinstance(v, (tuple, list)) and bool(v) and all(_is_float(t) for t in v))


def _is_float(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _copy(v):
    return tuple(t.detach().clone() for t in v) if isinstance(v, (tuple, list)) else v.detach().clone()


def _all_finite(o, ht) -> bool:
    states = ht if isinstance(ht, tuple) else (ht,)
    return bool(torch.isfinite(o).all()) and all(s is None or bool(torch.isfinite(s).all()) for s in states)


def locate(model: torch.nn.Module | None = None, replay: bool = True) -> Locator:
    """`with locate(model) as found: <forward and backward>`; then `print(found.report)`.

    An exception an fla_lab op (or its backward) raises inside the block, once something is located, is swallowed
    and reported (a kernel that fails to compile; an input check that meets an earlier op's NaN); any other
    exception propagates. A failure of the locator's own hooks raises `LocatorError` (the report is then None).
    """
    return Locator(model, replay)


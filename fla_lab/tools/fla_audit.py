"""`python -m fla_lab audit --fla rwkv7 --layers 2 --T 2048 --tbptt 2`: the audit on a model built from
flash-linear-attention's own layers.

The model: token embedding -> N x (LayerNorm, FLA attention layer, residual) -> LayerNorm -> head. It is built
from FLA's layer classes directly (fla.models' configs and Cache need `transformers`; the layers do not, see
`upstream.import_layer`). Initialisation as FLA's models do it: each attention layer keeps its constructor's own
init (`_initialize_weights`, which FLA's `_init_weights` then skips as `_is_hf_initialized`); the embedding and
head get FLA's `_init_weights` (normal, std = initializer_range = 0.02; RWKV-7's: uniform +-1e-4 and an orthogonal
head); each `o_proj` is re-drawn and scaled by 1/sqrt(2 * layers) (`rescale_prenorm_residual`).

Truncated BPTT (`--tbptt S`): the T tokens are cut into S segments; each layer's final state of one segment is the
initial state of the next (through `past_key_values`, `CarriedState`), the S losses are summed and one backward
runs. So every segment but the last gets a cotangent on its final state from the segments after it: the gradient
a truncated-BPTT window sends back across its segments. (The state carried on to the next window would be detached
there; within the window it is not.) With S = 1 no final state receives a gradient.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import time

import torch
from torch import nn

from fla_lab.tools import audit as audit_mode
from fla_lab.spec import upstream

INITIALIZER_RANGE = 0.02  # FLA's configs' default
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class CarriedState:
    """What FLA's layers read and write through `past_key_values` (0.5.2 and 0.6.0: `len(cache)`, `cache[i]` a dict
    with 'recurrent_state' and 'conv_state', `cache.update(layer_idx=i, **state)`), without fla.models' Cache.
    Nothing is detached: the next segment's loss reaches this segment's final states."""

    def __init__(self):
        self.layers: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer_idx: int) -> dict:
        return self.layers[layer_idx]

    def update(self, layer_idx: int, offset: int = 0, **state) -> dict:
        self.layers[layer_idx] = {"recurrent_state": None, "conv_state": None, **state}
        return self.layers[layer_idx]


class Block(nn.Module):
    def __init__(self, family: str, hidden: int, layer_idx: int, layers: int, mode: str):
        super().__init__()
        layer = upstream.LAYERS[family]
        self.v_first = layer.v_first
        self.norm = nn.LayerNorm(hidden)
        extra = {"num_hidden_layers": layers} if layer.v_first else {}
        self.attn = upstream.import_layer(family)(mode=mode, hidden_size=hidden, layer_idx=layer_idx,
                                                  **layer.kwargs, **extra)

    def forward(self, x, state: CarriedState, v_first=None):
        kwargs = {"v_first": v_first} if self.v_first else {}
        out = self.attn(self.norm(x), past_key_values=state, use_cache=True, **kwargs)
        return x + out[0], (out[3] if self.v_first else None)


class SmallModel(nn.Module):
    def __init__(self, family: str, layers: int, hidden: int = 256, vocab: int = 1024, mode: str = "chunk"):
        super().__init__()
        self.family = family
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(family, hidden, i, layers, mode) for i in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self._init_as_fla(layers, vocab, hidden)

    def _init_as_fla(self, layers: int, vocab: int, hidden: int) -> None:
        if self.family == "rwkv7":  # RWKV7PreTrainedModel._init_weights (after BlinkDL's RWKV-LM)
            nn.init.uniform_(self.embed.weight, -1e-4, 1e-4)
            nn.init.orthogonal_(self.head.weight, gain=0.5 * math.sqrt(max(vocab / hidden, 1.0)))
        else:
            nn.init.normal_(self.embed.weight, std=INITIALIZER_RANGE)
            nn.init.normal_(self.head.weight, std=INITIALIZER_RANGE)
        for block in self.blocks:
            nn.init.kaiming_uniform_(block.attn.o_proj.weight, a=math.sqrt(5))
            with torch.no_grad():
                block.attn.o_proj.weight /= math.sqrt(2 * layers)

    def forward(self, tokens, state: CarriedState):
        x, v_first = self.embed(tokens), None
        for block in self.blocks:
            x, v_first = block(x, state, v_first)
        return self.head(self.norm(x))


def training_step(model: SmallModel, tokens: torch.Tensor, targets: torch.Tensor, segments: int) -> float:
    """Forward over `segments` consecutive pieces carrying every layer's state, the summed loss, one backward."""
    state, loss = CarriedState(), 0.0
    for piece, target in zip(tokens.chunk(segments, 1), targets.chunk(segments, 1)):
        logits = model(piece, state)
        loss = loss + nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss)


@contextlib.contextmanager
def control_swap(family: str, mode: str = "chunk"):
    """The audit's control (`--control`): the op `family`'s layer calls in `mode`, swapped in FLA's op package and in
    the layer's module (where the layer looks it up) for one that reads half its initial state. An audit that works
    flags every call given an initial state, and no other."""
    name = f"{mode}_{family}"
    modules = [importlib.import_module(upstream.ENTRIES[name].module),
               importlib.import_module(upstream.LAYERS[family].module)]
    real = getattr(modules[0], name)

    @functools.wraps(real)  # FLA's signature: the audit binds the call's arguments as for the real op
    def reads_half_the_initial_state(*args, initial_state=None, **kwargs):
        if isinstance(initial_state, (tuple, list)):  # GSA's pair
            initial_state = type(initial_state)(s * 0.5 for s in initial_state)
        elif initial_state is not None:
            initial_state = initial_state * 0.5
        return real(*args, initial_state=initial_state, **kwargs)
    saved = [(module, module.__dict__.get(name)) for module in modules]
    try:
        for module in modules:
            setattr(module, name, reads_half_the_initial_state)
        yield
    finally:
        for module, op in saved:
            setattr(module, name, op) if op is not None else delattr(module, name)


def control_flagged(recorded) -> tuple[bool, str]:
    """(whether the control was caught, the line that says so): every call given an initial state wrong, every
    other right."""
    results = recorded.results()
    carried = [r for r in results if "initial_state" in r.call.inputs]
    fresh = [r for r in results if "initial_state" not in r.call.inputs]
    caught = sum(not r.ok for r in carried)
    false_alarms = sum(not r.ok for r in fresh)
    line = (f"control (an op reading half its initial state swapped in): {caught} of {len(carried)} call(s) with an "
            f"initial state flagged, {false_alarms} of {len(fresh)} without")
    return bool(carried) and caught == len(carried) and false_alarms == 0, line


def _timed(fn) -> tuple[object, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def run(args) -> int:
    problem = check_args(args)
    if problem:
        print(f"fla_lab audit: {problem}")
        return 2
    try:
        upstream.require()
        if args.first_config:
            upstream.pin_autotune_to_first_config()
        torch.manual_seed(args.seed)
        model = SmallModel(args.fla, args.layers, args.hidden, mode=args.mode).to("cuda", DTYPES[args.dtype])
    except (upstream.Unavailable, ImportError) as exc:
        print(f"fla_lab audit: {exc}")
        return 2
    gen = torch.Generator().manual_seed(args.seed)
    tokens, targets = (torch.randint(0, model.head.out_features, (args.B, args.T), generator=gen).cuda()
                       for _ in range(2))

    def step():
        return training_step(model, tokens, targets, args.tbptt)
    with control_swap(args.fla, args.mode) if args.control else contextlib.nullcontext():
        for _ in range(args.warmup):  # FLA's autotuner and Triton's compiler: not the step's cost
            step()
        _, plain_s = _timed(step)
        with audit_mode.audit(model, fla=True, kernel=args.kernel) as recorded:
            _, recorded_s = _timed(step)
    try:
        _, replay_s = _timed(recorded.results)
    except upstream.UnsupportedCall as exc:
        print(f"fla_lab audit: {exc}")
        return 2
    print(recorded.report())
    summary = _summary(args, recorded, plain_s, recorded_s, replay_s)
    print(summary["cost line"])
    if args.control:
        summary["control caught"], line = control_flagged(recorded)
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if args.control:
        return 0 if summary["control caught"] else 1
    return 1 if recorded.wrong() else 0


def _summary(args, recorded, plain_s: float, recorded_s: float, replay_s: float) -> dict:
    results = recorded.results()
    with_dht = sum(1 for c in recorded.calls if isinstance(c.dht, list) and any(d is not None for d in c.dht))
    cost = (f"cost: step {plain_s * 1e3:.1f} ms, recorded {recorded_s * 1e3:.1f} ms; replay {replay_s:.2f} s for "
            f"{len(results)} replay(s), {replay_s / max(len(results), 1) * 1e3:.0f} ms each; "
            f"{with_dht} of {len(recorded.calls)} call(s) got a final-state cotangent")
    return {"fla_version": upstream.version(), "torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "args": {k: v for k, v in vars(args).items() if k not in ("func", "json")},  # no path of this machine
            "cost line": cost,
            "step_s": plain_s, "recorded_step_s": recorded_s, "replay_s": replay_s,
            "calls_with_final_state_cotangent": with_dht, "wrong": len(recorded.wrong()),
            "calls": [_as_json(r) for r in results]}


def _as_json(result: audit_mode.CallAudit) -> dict:
    call, tol = result.call, result.tolerance
    return {"index": call.index, "module": call.module, "op": result.label, "dtype": str(result.dtype)[6:],
            "ok": result.ok, "worst": result.worst, "backward": result.backward,
            "final_state_cotangent": isinstance(call.dht, list) and any(d is not None for d in call.dht),
            "errors": result.errors, "plain": result.plain, "tolerance": {n: tol.of(n) for n in result.errors},
            "peaks": result.peaks}


def add_parser(sub) -> None:
    p = sub.add_parser("audit", help="audit a small model built from flash-linear-attention's layers: one training "
                                     "step, every FLA op call replayed against float64 (needs FLA and a GPU)")
    p.add_argument("--fla", required=True, choices=sorted(upstream.LAYERS), help="the FLA layer family")
    p.add_argument("--layers", type=_positive, default=2)
    p.add_argument("--T", type=_positive, default=2048, help="tokens per sequence (all segments together)")
    p.add_argument("--B", type=_positive, default=1)
    p.add_argument("--tbptt", type=_positive, default=1, metavar="S",
                   help="segments per step; each one's final states are the next one's initial states")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--mode", choices=["chunk", "fused_recurrent"], default="chunk",
                   help="the layers' mode (FLA switches to fused_recurrent itself for segments of <= 64 tokens)")
    p.add_argument("--hidden", type=_positive, default=256)
    p.add_argument("--kernel", action="store_true", help="also replay every call on fla_lab's kernel")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (autotuning, compilation)")
    p.add_argument("--first-config", action="store_true",
                   help="FLA's autotuners take their first config instead of compiling and timing every one (minutes "
                        "per op on a fresh machine): the same verdicts, but the step's times are not FLA's tuned ones")
    p.add_argument("--control", action="store_true",
                   help="the audit's control: swap in an op that reads half its initial state (needs --tbptt 2 or "
                        "more); exits 0 when the audit flags exactly the calls given an initial state")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="PATH", help="write the report and costs as JSON")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text} is not a positive integer")
    return value


def check_args(args) -> str | None:
    """What is wrong with the arguments (None: nothing): each segment needs at least one token."""
    if args.fla == "rwkv7" and args.layers < 2:  # its init divides by num_hidden_layers - 1 (fla/layers/rwkv7.py)
        return "--fla rwkv7 needs --layers 2 or more: FLA's RWKV7Attention initialises by layer_idx / (layers - 1)"
    if getattr(args, "control", False) and (args.tbptt < 2 or args.kernel):
        return ("--control needs --tbptt 2 or more (only later segments get an initial state to misread) and no "
                "--kernel (fla_lab's kernels are not swapped)")
    if args.T % args.tbptt:
        return f"--T {args.T} is not divisible by --tbptt {args.tbptt}: the segments would differ in length"
    return None

"""Notebook 04: a transposed initial-state mask that square tiles hid (upstream #18, fixed in 1547448b).

The RWKV6 `dq` backward kernel builds the pointers of its initial-state load in one orientation; before 1547448b
its mask was built in the other. With upstream's dq tiles (BK, BV) = (16, 64) the two shapes cannot broadcast and
Triton refuses the load; with square tiles the shapes agree, so the load runs and the mask is applied to the wrong
cells. This module models that mask cell by cell,
runs the real kernel over tile and problem shapes, and draws what it finds. For the exercise, the learner's
`@triton.jit` mask helper goes into the shipped dq kernel's `H0_MASK` slot: `check_h0_mask` runs
fused_recurrent_rwkv6's real backward with it on several tile and problem shapes, and a probe kernel
(`mask_probe_kernel`) counts the cells its mask drops or lets through, which the gradients cannot always show.

Out-of-bounds reads: a transposed mask can let through pointers past the end of `h0` (e.g. BK=BV=32, K=16,
V=32). An unmasked out-of-bounds read under the interpreter would read whatever memory follows (garbage, or a
crash). So every run here places `h0` at the start of a larger buffer whose tail is NaN: every read stays inside
memory we own, and a read outside `h0` shows up deterministically (as NaN where it reaches the result).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fla_lab.spec import check, harness, markers, reference
from fla_lab.teaching import exercises
from fla_lab import runtime
from fla_lab.tools import viz, widgets
from fla_lab.teaching.exercises import Verdict
from fla_lab.ops import default_launch, fused_recurrent_rwkv6
from fla_lab.ops.common.fused_recurrent import fused_recurrent_bwd_dq_kernel
from fla_lab.ops.common.utils import state_tile

BUG = "transposed_h0_mask"
SIZES = (16, 32, 64)              # tile sizes and problem sizes the sweep covers
TILES = tuple(itertools.product(SIZES, SIZES))     # (BK, BV) of the dq kernel
PROBLEMS = tuple(itertools.product(SIZES, SIZES))  # (K, V) of the problem
T = 8                             # short sequences: the bug is in the first load, not in the time loop
STATUSES = ("raises", "right", "wrong")
STATUS_COLORS = {"raises": "#ff7f0e", "right": "#2ca02c", "wrong": "#d62728"}
VARIANT_COLORS = {"buggy": "#8c564b", "fixed": "#1f77b4"}  # the explorer's error bars, one colour per kernel

# Cell categories of one initial-state tile, as `h0_cells` reports them.
CELL_NAMES = ("masked off (padding)", "loaded, right element", "MISSING: needed, masked off",
              "extra: padding cell reads inside h0", "extra: reads OUTSIDE h0")
CELL_COLORS = ("#eeeeee", "#2ca02c", "#d62728", "#9ecae1", "#6a3d9a")


# ---------------------------------------------------------------------------------------------------------------
# The mask, modelled cell by cell (the same index vectors as fused_recurrent_bwd_dq_kernel)

EXERCISE = "the mask of the initial-state load, in fused_recurrent_rwkv6's backward"
FIXED_MASK_HIDDEN = "shown once check_h0_mask says PASS (or its hints run out)"


def tile_shapes(BK: int, BV: int) -> dict[str, tuple[int, int] | str]:
    """Shapes of the dq kernel's initial-state load: its pointer tile, the historical (buggy) mask, and the fixed
    mask's once the exercise is open (`exercises.is_open`; before, a note in its place: it is the answer's shape)."""
    fixed = (BV, BK) if exercises.is_open(EXERCISE) else FIXED_MASK_HIDDEN
    return {"pointers": (BV, BK), "buggy mask": (BK, BV), "fixed mask": fixed}


def broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return all(x == y or 1 in (x, y) for x, y in zip(a, b))


def h0_cells(K: int, V: int, BK: int, BV: int) -> torch.Tensor:
    """Categories (indices into CELL_NAMES) of every cell of the buggy load, over all programs, `[Vpad, Kpad]`.

    Each cell is compared with what a right load does there (read it exactly when the cell is an element of h0), so
    a cell is right, missing, or an extra read inside or outside h0. Needs BK == BV (else the load cannot even be
    built, see `tile_shapes`). The right cells come from the grid itself, not from a mask: this source is on the
    learner's path (`lesson??`), and the right mask is the exercise's answer.
    """
    if BK != BV:
        raise ValueError(f"the transposed mask only builds for square tiles, got (BK, BV) = ({BK}, {BV})")
    NK, NV = math.ceil(K / BK), math.ceil(V / BV)
    v, k = torch.meshgrid(torch.arange(NV * BV), torch.arange(NK * BK), indexing="ij")  # the grid's cell (v, k)
    needed = torch.zeros(NV * BV, NK * BK, dtype=torch.bool)
    needed[:V, :K] = True  # the elements of h0: the rest of the grid is padding
    outside = k * V + v >= K * V  # the cell's pointer lies past the end of h0
    buggy = torch.zeros_like(needed)
    for i_v, i_k in itertools.product(range(NV), range(NK)):
        o_k, o_v = i_k * BK + torch.arange(BK), i_v * BV + torch.arange(BV)
        tile = slice(i_v * BV, (i_v + 1) * BV), slice(i_k * BK, (i_k + 1) * BK)
        buggy[tile] = (o_k[:, None] < K) & (o_v[None, :] < V)  # the historical [BK, BV] mask, laid on the tile
    cells = torch.zeros(NV * BV, NK * BK, dtype=torch.int64)
    cells[needed & buggy] = 1
    cells[needed & ~buggy] = 2
    cells[~needed & buggy & ~outside] = 3
    cells[~needed & buggy & outside] = 4
    return cells


def cell_counts(K: int, V: int, BK: int, BV: int) -> dict[str, int]:
    """How many cells of each category the buggy load has (square tiles only)."""
    counts = torch.bincount(h0_cells(K, V, BK, BV).flatten(), minlength=len(CELL_NAMES))
    return {"missing": int(counts[2]), "extra inside h0": int(counts[3]), "extra outside h0": int(counts[4])}


def padding_needed(K: int, V: int, BK: int, BV: int) -> int:
    """Elements past the last head's h0 that any load of the dq kernel (buggy or fixed) can address."""
    Kpad, Vpad = math.ceil(K / BK) * BK, math.ceil(V / BV) * BV
    return max(0, (Kpad - 1) * V + Vpad - K * V)  # largest address o_k * V + o_v, past K * V


# ---------------------------------------------------------------------------------------------------------------
# The real kernel

def rwkv6_inputs(K: int, V: int, *, T: int = T, initial_state: bool = True, seed: int = 0) -> dict:
    """B = H = 1 RWKV6 inputs (fp32) for `harness.compare` / `fused_recurrent_rwkv6`: drawn on the CPU (the same
    values on every machine), then moved to where the kernels run (`fla_lab.device()`: the GPU when there is one)."""
    return harness.on_device(harness.gated_inputs(1, T, 1, K, V, bonus=True, initial_state=initial_state, seed=seed,
                                                  names=("r", "k", "v", "w")))


def in_canary_buffer(h0: torch.Tensor, pad: int) -> torch.Tensor:
    """`h0` at the start of a NaN-filled buffer `pad` elements longer: a contiguous view, differentiable.

    Any read past h0's end then lands in memory we own and reads NaN: deterministic, and visible. `run_backward`
    builds it inside the op, after `harness.compare` has made its own copies of the inputs.
    """
    tail = torch.full((pad,), math.nan, dtype=h0.dtype, device=h0.device)
    return torch.cat([h0.flatten(), tail])[:h0.numel()].view(h0.shape)


def fresh(inputs: dict) -> dict:
    """Copies of the inputs: `harness.compare` attaches gradients to the tensors it is given."""
    return {name: x.detach().clone() for name, x in inputs.items()}


@dataclass
class Outcome:
    status: str                     # "raises", "right" or "wrong"
    errors: dict[str, float]        # relative errors against the float64 reference (empty when it raised)
    failing: tuple[str, ...] = ()   # the outputs / gradients beyond the fp32 tolerance
    message: str = ""               # the exception, when it raised


def dq_launch(BK: int, BV: int):
    """The device's default `RecurrentLaunch` with the dq kernel's tile set to (BK, BV) (`dq_BK`, `dq_BV`)."""
    return dataclasses.replace(default_launch("recurrent", runtime.device()), dq_BK=BK, dq_BV=BV)


def run_backward(K: int, V: int, tiles: tuple[int, int], buggy: bool, *, initial_state: bool = True,
                 T: int = T, seed: int = 0, h0_mask=None) -> Outcome:
    """Forward + backward of `fused_recurrent_rwkv6` with dq tiles `tiles` (BK, BV), judged by `harness.compare`.
    `h0_mask`: a `@triton.jit` helper for the dq kernel's H0_MASK slot instead of the shipped one."""
    x = fresh(rwkv6_inputs(K, V, T=T, initial_state=initial_state, seed=seed))
    kernels = slot_op(h0_mask, tiles) if h0_mask is not None else \
        lambda **kw: fused_recurrent_rwkv6(**kw, bug=BUG if buggy else None, launch=dq_launch(*tiles))  # noqa: E731
    pad = padding_needed(K, V, *tiles)

    def op(initial_state=None, **kw):
        h0 = None if initial_state is None else in_canary_buffer(initial_state, pad)
        return kernels(initial_state=h0, **kw)
    try:
        result = harness.compare(op, reference.recurrent_rwkv6, x)
    except Exception as error:  # noqa: BLE001  (Triton's refusal is the outcome we are measuring)
        return Outcome("raises", {}, message=f"{type(error).__name__}: {error}")
    return Outcome("right" if result.ok else "wrong", result.errors, tuple(result.failures()))


def sweep(tiles=TILES, problems=PROBLEMS, *, T: int = T) -> dict[tuple, Outcome]:
    """`{(buggy, (BK, BV), (K, V)): Outcome}` for every tile shape x problem shape, buggy and fixed kernel."""
    return {(buggy, tile, problem): run_backward(*problem, tile, buggy, T=T)
            for buggy in (True, False) for tile in tiles for problem in problems}


def status_table(results: dict[tuple, Outcome], buggy: bool) -> str:
    """The sweep as text: one row per tile shape, one column per problem shape."""
    tiles = sorted({t for b, t, _ in results if b == buggy})
    problems = sorted({p for b, _, p in results if b == buggy})
    head = "(BK,BV) \\ (K,V)  " + " ".join(f"{f'{K},{V}':>7}" for K, V in problems)
    rows = [f"{f'({BK},{BV})':<17}" + " ".join(f"{results[buggy, (BK, BV), p].status:>7}" for p in problems)
            for BK, BV in tiles]
    return "\n".join([head, *rows])


def summary(results: dict[tuple, Outcome]) -> dict[str, dict[str, int]]:
    """How many configurations raise / run right / run wrong, for the buggy and the fixed kernel."""
    out = {}
    for buggy, name in ((True, "buggy"), (False, "fixed")):
        statuses = [o.status for (b, _, _), o in results.items() if b == buggy]
        out[name] = {s: statuses.count(s) for s in STATUSES}
    return out


def reads_outside_h0(results: dict[tuple, Outcome]) -> list[tuple]:
    """The buggy square-tile configurations of a sweep whose load also points past the end of h0."""
    return sorted((t, p) for (b, t, p) in results if b and t[0] == t[1] and cell_counts(*p, *t)["extra outside h0"])


# ---------------------------------------------------------------------------------------------------------------
# The exercise: the learner's mask helper in the shipped dq kernel's H0_MASK slot

def show_dq_kernel() -> None:
    """Print the shipped dq backward kernel: its initial-state load takes the mask from the `H0_MASK` slot."""
    print(markers.source_of(fused_recurrent_bwd_dq_kernel))


@triton.jit
def mask_probe_kernel(out, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KP: tl.constexpr,
                      H0_MASK: tl.constexpr):
    """1 in each cell of the padded value-major state `out[VP, KP]` that `H0_MASK` lets the dq kernel's
    initial-state load read, 0 elsewhere. The same `state_tile` index vectors as the dq kernel; the mask is
    broadcast onto the kernel's state tile, as `tl.load` broadcasts it onto the pointers."""
    i_v, i_k = tl.program_id(0), tl.program_id(1)
    o_k, o_v, m_k, m_v, m_kv, p_kv = state_tile(i_k, i_v, K, V, BK, BV)
    tile = tl.full((BV, BK), 1, tl.int1)  # all true: the state tile the mask is broadcast onto
    tl.store(out + o_v[:, None] * KP + o_k[None, :], (H0_MASK(m_k, m_v) & tile).to(tl.int8))


def mask_cells(h0_mask, K: int, V: int, BK: int, BV: int) -> torch.Tensor:
    """The cells `[VP, KP]` of the padded value-major state that the helper `h0_mask` lets through (bool)."""
    NK, NV = math.ceil(K / BK), math.ceil(V / BV)
    out = torch.zeros(NV * BV, NK * BK, dtype=torch.int8, device=runtime.device())
    mask_probe_kernel[(NV, NK)](out, K=K, V=V, BK=BK, BV=BV, KP=NK * BK, H0_MASK=h0_mask)
    return out.cpu().bool()


# (BK, BV, K, V): upstream's non-square dq tiles (with and without padding), then square tiles that K or V do
# not fill (the transposed mask runs and loads wrong cells), then square tiles that K and V fill (it hides).
EXERCISE_SHAPES = ((16, 64, 16, 64), (16, 64, 40, 48), (32, 32, 32, 16), (32, 32, 16, 32), (16, 16, 24, 40),
                   (32, 32, 64, 64))


@dataclass
class MaskTrial:
    """The learner's helper on one tile and problem shape: the real backward, and the cells its mask lets through."""

    BK: int
    BV: int
    K: int
    V: int
    backward: Outcome               # fused_recurrent_rwkv6's backward with the helper in the H0_MASK slot
    missing: int = 0                # elements of h0 the mask drops
    through_k: int = 0              # padding cells it lets through in key columns k >= K
    through_v: int = 0              # ... in value rows v >= V
    outside: int = 0                # of those, cells whose pointer is past the end of h0
    transposed: bool = False        # the cells are exactly those of the historical [BK, BV] mask

    def __str__(self) -> str:
        where = f"(BK, BV) = ({self.BK}, {self.BV}), K = {self.K}, V = {self.V}"
        if self.backward.status == "raises":
            return f"{where}: raises: {explain_error(self.backward.message)}"
        grads = "backward right" if self.backward.status == "right" else \
            f"backward wrong ({', '.join('d' + n for n in self.backward.failing)})"
        problems = [f"drops {self.missing} of {self.K * self.V} elements of h0"] if self.missing else []
        through = [f"{n} in {axis}" for n, axis in ((self.through_k, "key columns k >= K"),
                                                     (self.through_v, "value rows v >= V")) if n]
        if through:
            past = f", {self.outside} past the end of h0" if self.outside else ""
            problems.append(f"lets padding cells through ({'; '.join(through)}{past})")
        return f"{where}: {grads}; " + (" and ".join(problems) if problems else "the mask is exactly h0's cells")

    @property
    def right(self) -> bool:
        return self.backward.status == "right" and not (self.missing or self.through_k or self.through_v)


def explain_error(message: str) -> str:
    """A short sentence for an exception of the dq kernel that does not depend on the Triton version."""
    text = message.lower()
    if "incompatible dimensions" in text or "broadcast" in text:
        return "Triton cannot build the load, the mask's shape does not match the pointer tile's"
    return f"the kernel did not run ({message.splitlines()[0][:100] if message else 'no message'})"


def slot_op(h0_mask, tiles: tuple[int, int]):
    """`fused_recurrent_rwkv6` (the function it runs, the same kernels) with `h0_mask` in the dq kernel's slot."""
    def op(r, k, v, w, u, initial_state=None, output_final_state=False):
        return fused_recurrent_rwkv6(r, k, v, w, u, None, initial_state, output_final_state, helper=h0_mask,
                                     launch=dq_launch(*tiles))
    return op


def try_mask(h0_mask, BK: int, BV: int, K: int, V: int) -> MaskTrial:
    """Run the learner's helper in the real backward on one shape, and count the cells its mask gets wrong."""
    backward = run_backward(K, V, (BK, BV), False, h0_mask=h0_mask)
    if backward.status == "raises":
        return MaskTrial(BK, BV, K, V, backward)
    through = mask_cells(h0_mask, K, V, BK, BV)
    rows, cols = torch.meshgrid(torch.arange(through.shape[0]), torch.arange(through.shape[1]), indexing="ij")
    inside, past_end = (rows < V) & (cols < K), cols * V + rows >= K * V
    extra = through & ~inside
    transposed = BK == BV and torch.equal(through, torch.isin(h0_cells(K, V, BK, BV), torch.tensor([1, 3, 4])))
    return MaskTrial(BK, BV, K, V, backward, int((inside & ~through).sum()), int((extra & (cols >= K)).sum()),
                     int((extra & (rows >= V)).sum()), int((extra & past_end).sum()), transposed)


# the solution line: sealed (base64 in this source; Tab, `??` and help() do not show it), opened by the last hint
# tier only
_LINE = exercises.Sealed("cmV0dXJuIG1fdls6LCBOb25lXSAmIG1fa1tOb25lLCA6XQ==")
# what is wrong, sealed like the line where it says how to build the mask (`verdict.hint()` opens them): the
# transposed mask, another wrong shape, dropped elements, padding let through (keys, values, both)
_WHAT_TRANSPOSED = exercises.Sealed(
    "cF9oMCA9IC4uLiArIG9fa1tOb25lLCA6XSAqIFYgKyBvX3ZbOiwgTm9uZV0gaXMgW0JWLCBCS106IHJvdyBpIGlzIHRoZSB2YWx1ZSBvX3ZbaV0sIG"
    "NvbHVtbiBqIHRoZSBrZXkgb19rW2pdLiBZb3VyIG1hc2sgcHV0cyBtX2sgZG93biB0aGUgcm93cywgW0JLLCBCVl0uIE9uIHNxdWFyZSB0aWxlcyBp"
    "dCBidWlsZHMsIGFuZCBpdHMgY2VsbCAoaSwgaikgYXNrcyBhYm91dCBrZXkgb19rW2ldIGFuZCB2YWx1ZSBvX3Zbal0sIHRoZSB0cmFuc3Bvc2VkIG"
    "VsZW1lbnQ6IHRoYXQgaXMgd2h5IHRoZSBzcXVhcmUtdGlsZSBsaW5lcyBkcm9wIGVsZW1lbnRzIGFuZCBsZXQgcGFkZGluZyB0aHJvdWdo")
_WHAT_SHAPE = exercises.Sealed(
    "cF9oMCBpcyBbQlYsIEJLXSAocm93IGk6IHRoZSB2YWx1ZSBvX3ZbaV0sIGNvbHVtbiBqOiB0aGUga2V5IG9fa1tqXSk7IHlvdXIgbWFzaydzIHNoYX"
    "BlIG5laXRoZXIgbWF0Y2hlcyBpdCBub3IgYnJvYWRjYXN0cyBvbnRvIGl0")
_WHAT_DROPS = exercises.Sealed(
    "cG9pbnRlciBjZWxsIChpLCBqKSBpcyBoMFtrPW9fa1tqXSwgdj1vX3ZbaV1dOiB0aGUgbWFzayBtdXN0IGJlIHRydWUgdGhlcmUgZXhhY3RseSB3aG"
    "VuIG9fdltpXSA8IFYgYW5kIG9fa1tqXSA8IEssIHdpdGggbV92IGRvd24gdGhlIHJvd3MgYW5kIG1fayBhY3Jvc3M=")
_WHAT_LEAKS_K = exercises.Sealed(
    "ZHEncyBzdG9yZSBkcm9wcyBrZXkgY29sdW1ucyBrID49IEssIHNvIHRoZSBncmFkaWVudHMgY2Fubm90IHNob3cgaXQsIGJ1dCB0aG9zZSBwb2ludG"
    "VycyBhZGRyZXNzIHRoZSBuZXh0IGtleSByb3dzIG9mIGgwIG9yIG1lbW9yeSBwYXN0IGl0cyBlbmQsIHdoaWNoIHRoZSBsb2FkIGRvZXMgbm90IG93"
    "biAob24gYSBHUFU6IGFub3RoZXIgdGVuc29yJ3MgbWVtb3J5LCBvciBhIGZhdWx0KS4gRWFjaCBjZWxsIG11c3QgYWxzbyBjaGVjayBvX2tbal0gPC"
    "BL")
_WHAT_LEAKS_V = exercises.Sealed(
    "cGFkZGluZyB2YWx1ZSByb3dzIG1lZXQgYSB6ZXJvLXBhZGRlZCBkbywgYnV0IGEgcmVhZCBwYXN0IHRoZSBlbmQgb2YgaDAgKE5hTiBoZXJlKSBnaX"
    "ZlcyAwICogTmFOID0gTmFOIGluIGRxOiB0aGUgJ2JhY2t3YXJkIHdyb25nJyBsaW5lcy4gRWFjaCBjZWxsIG11c3QgYWxzbyBjaGVjayBvX3ZbaV0g"
    "PCBW")
_WHAT_LEAKS_KV = exercises.Sealed(
    "cGFkZGluZyB2YWx1ZSByb3dzIG1lZXQgYSB6ZXJvLXBhZGRlZCBkbywgYnV0IGEgcmVhZCBwYXN0IHRoZSBlbmQgb2YgaDAgKE5hTiBoZXJlKSBnaX"
    "ZlcyAwICogTmFOID0gTmFOIGluIGRxOiB0aGUgJ2JhY2t3YXJkIHdyb25nJyBsaW5lcy4gRWFjaCBjZWxsIG11c3QgYWxzbyBjaGVjayBvX3ZbaV0g"
    "PCBWIGFuZCBvX2tbal0gPCBL")
_WHAT_LEAKS = {(True, False): _WHAT_LEAKS_K, (False, True): _WHAT_LEAKS_V, (True, True): _WHAT_LEAKS_KV}


def mask_hints(trials: list[MaskTrial]) -> tuple[str, ...]:
    """Hint tiers chosen from what the learner's mask did: wrong shape (transposed or not), elements dropped,
    padding let through on one axis or on both."""
    shape_errors = [t for t in trials if t.backward.status == "raises" and "shape" in str(t)]
    other_errors = [t for t in trials if t.backward.status == "raises" and t not in shape_errors]
    ran = [t for t in trials if t.backward.status != "raises"]
    if other_errors:
        return exercises.hints(
            f"the helper did not run inside the kernel: {other_errors[0].backward.message.splitlines()[0][:160]}",
            "a mask helper returns one boolean tile built from m_k and m_v (index them with [:, None] / [None, :])")
    if shape_errors:
        where = ("look at the (BK, BV) = (16, 64) lines: Triton cannot combine your mask with the pointer tile p_h0. "
                 "Read p_h0's line in the kernel: which index runs down its rows, o_k or o_v?")
        what = _WHAT_TRANSPOSED if ran and all(t.transposed for t in ran) else _WHAT_SHAPE
        return exercises.hints(where, what, _LINE)
    if any(t.missing for t in ran):
        return exercises.hints(
            "look at the lines that say 'drops': those elements of h0 never reach the state", _WHAT_DROPS, _LINE)
    k_leak, v_leak = any(t.through_k for t in ran), any(t.through_v for t in ran)
    if k_leak or v_leak:
        axis = " and ".join(name for name, leak in (("key columns k >= K", k_leak), ("value rows v >= V", v_leak))
                            if leak)
        return exercises.hints(f"look at the shapes that K or V do not fill: your mask lets padding cells through "
                               f"in {axis}", _WHAT_LEAKS[k_leak, v_leak], _LINE)
    return ()


def check_h0_mask(h0_mask, shapes=EXERCISE_SHAPES) -> Verdict:
    """The exercise's check: the learner's `h0_mask(m_k, m_v)` in the shipped dq kernel's H0_MASK slot must give the
    right backward (fused_recurrent_rwkv6 against float64) and read exactly h0's cells, on every shape."""
    name = EXERCISE
    refused = exercises.not_a_jit_helper(name, h0_mask)
    if refused is not None:  # a Verdict is falsy when it fails
        return refused
    trials = [try_mask(h0_mask, *shape) for shape in shapes]
    return Verdict(name, all(t.right for t in trials), [str(t) for t in trials], mask_hints(trials))


# ---------------------------------------------------------------------------------------------------------------
# Figures and the explorer

def _draw_cells(ax, K: int, V: int, BK: int, BV: int, title: str) -> set[str]:
    """The buggy load's cells over the whole padded state; solid lines: tiles, dashed: the problem's K and V.

    Returns the legend keys of what it drew (cell categories, "dashed", "solid"), so the legend lists only those.
    """
    import matplotlib.colors as mcolors

    cells = h0_cells(K, V, BK, BV)
    cmap = mcolors.ListedColormap(CELL_COLORS)
    ax.imshow(cells.numpy(), cmap=cmap, vmin=-0.5, vmax=len(CELL_COLORS) - 0.5, interpolation="nearest",
              aspect="auto")
    drawn = {CELL_NAMES[i] for i in cells.unique().tolist()}
    for edge in range(BV, cells.shape[0], BV):
        ax.axhline(edge - 0.5, color="k", lw=1)
    for edge in range(BK, cells.shape[1], BK):
        ax.axvline(edge - 0.5, color="k", lw=1)
    if cells.shape[0] > BV or cells.shape[1] > BK:  # K or V spans several tiles
        drawn.add("solid")
    if K < cells.shape[1]:
        ax.axvline(K - 0.5, color="k", ls="--", lw=1.2)
        drawn.add("dashed")
    if V < cells.shape[0]:
        ax.axhline(V - 0.5, color="k", ls="--", lw=1.2)
        drawn.add("dashed")
    ax.set(title=title, xlabel="key index k (tile columns, BK)", ylabel="value index v (tile rows, BV)")
    return drawn


def _cell_legend(fig, drawn: set[str], ncols: int = 4) -> None:
    """A legend for the cell panels, with an entry only for what `_draw_cells` drew."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=n) for c, n in zip(CELL_COLORS, CELL_NAMES) if n in drawn]
    lines = {"dashed": Line2D([], [], color="k", ls="--", lw=1.2, label="dashed: end of the problem (k = K or v = V)"),
             "solid": Line2D([], [], color="k", lw=1, label="solid: tile edges")}
    handles += [line for key, line in lines.items() if key in drawn]
    fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize=9)


def _draw_shape_clash(ax, BK: int, BV: int) -> None:
    from matplotlib.patches import Rectangle

    shapes = tile_shapes(BK, BV)
    (pr, pc), (mr, mc) = shapes["pointers"], shapes["buggy mask"]
    ax.add_patch(Rectangle((0, 0), pc, pr, fill=False, ec="#1f77b4", lw=2.5))
    ax.add_patch(Rectangle((0, 0), mc, mr, fc="#d62728", alpha=0.25, ec="#d62728", lw=2.5))
    # labels written inside the shapes they name (a legend box would cover the tall pointer tile)
    ax.text(pc / 2, (mr + pr) / 2, f"pointers [{pr}, {pc}]", rotation=90, ha="center", va="center",
            color="#1f77b4", fontsize=9)
    ax.text((pc + mc) / 2, mr / 2, f"mask [{mr}, {mc}]", ha="center", va="center", color="#d62728", fontsize=9)
    size = max(pr, pc, mr, mc)
    ax.set(xlim=(-1, size + 1), ylim=(size + 1, -1), aspect="equal", xlabel="tile column", ylabel="tile row",
           title=f"(BK, BV) = ({BK}, {BV}): the shapes differ,\nTriton refuses the load")


def plot_tile_shapes():
    """Why square tiles hid the bug: (16, 64) cannot broadcast; (32, 32) builds, and is right only when full."""
    fig, axes = viz.figure(ncols=4, width=3.3, height=3.9)
    _draw_shape_clash(axes[0], 16, 64)
    drawn = set()
    for ax, (K, V) in zip(axes[1:], ((32, 32), (32, 16), (16, 32))):
        drawn |= _draw_cells(ax, K, V, 32, 32, f"(BK, BV) = (32, 32), K={K}, V={V}")
    _cell_legend(fig, drawn)
    fig.suptitle("the dq kernel's initial-state load, mask built [BK, BV] against pointers [BV, BK] (upstream #18)\n"
                 "three right panels: what each cell of the padded state receives from that load")
    return fig


def plot_sweep(results: dict[tuple, Outcome]):
    """The sweep as two grids (buggy, fixed): rows = dq tile shapes, columns = problem shapes."""
    import matplotlib.colors as mcolors
    from matplotlib.patches import Patch

    tiles = sorted({t for _, t, _ in results})
    problems = sorted({p for _, _, p in results})
    cmap = mcolors.ListedColormap([STATUS_COLORS[s] for s in STATUSES])
    reads_outside = reads_outside_h0(results)
    fig, axes = viz.figure(ncols=2, width=5.4, height=5.0)  # cells wide enough for two lines of 9 pt labels
    for ax, buggy in zip(axes, (True, False)):
        grid = torch.tensor([[STATUSES.index(results[buggy, t, p].status) for p in problems] for t in tiles])
        ax.imshow(grid.numpy(), cmap=cmap, vmin=-0.5, vmax=len(STATUSES) - 0.5, interpolation="nearest")
        for r, t in enumerate(tiles):
            for c, p in enumerate(problems):
                outcome = results[buggy, t, p]
                if outcome.status == "wrong":
                    outside = (t, p) in reads_outside
                    ax.text(c, r, ",".join(outcome.failing) + ("\noob" if outside else ""), ha="center",
                            va="center", fontsize=9, color="w", linespacing=0.9)
        ax.set_xticks(range(len(problems)), [f"{K},{V}" for K, V in problems], rotation=60, fontsize=9)
        ax.set_yticks(range(len(tiles)), [f"{BK},{BV}" for BK, BV in tiles], fontsize=9)
        ax.set_xticks([c - 0.5 for c in range(1, len(problems))], minor=True)  # white lines between the cells,
        ax.set_yticks([r - 0.5 for r in range(1, len(tiles))], minor=True)     # so adjacent labels stay apart
        ax.grid(which="minor", color="w", lw=1.5)
        ax.tick_params(which="minor", length=0)
        ax.set(xlabel="problem (K, V)", ylabel="dq tiles (BK, BV)",
               title=f"{'buggy' if buggy else 'fixed'} kernel")
    fig.legend(handles=[Patch(color=STATUS_COLORS[s], label=s) for s in STATUSES], loc="outside lower center",
               ncols=3, fontsize=9)
    fig.suptitle(f"RWKV6 backward with an initial state (T={T}); text: the gradients that fail,\n"
                 "oob: the buggy load also reads past the end of h0 (into a NaN-filled pad)", fontsize=10)
    return fig


def plot_config(BK: int = 32, BV: int = 32, K: int = 32, V: int = 16):
    """One configuration: the buggy load's cells (or its shape clash) and both kernels' gradient errors."""
    import numpy as np

    fig, (left, right) = viz.figure(ncols=2, width=4.6, height=3.9)
    if BK == BV:
        drawn = _draw_cells(left, K, V, BK, BV, f"buggy load, (BK, BV)=({BK}, {BV}), K={K}, V={V}")
        _cell_legend(fig, drawn, ncols=3)
    else:
        _draw_shape_clash(left, BK, BV)
    outcomes = {name: run_backward(K, V, (BK, BV), buggy) for name, buggy in (("buggy", True), ("fixed", False))}
    names = list(outcomes["fixed"].errors)
    floor = 1e-9  # so a zero error still shows on the log axis
    for shift, (name, outcome) in zip((-0.2, 0.2), outcomes.items()):
        values = [max(outcome.errors.get(n, math.nan), floor) for n in names]
        values = [1.0 if math.isnan(e) else e for e in values]  # NaN drawn at the top
        if outcome.status == "raises":
            right.text(0.5, 0.6, f"{name} kernel raises:\nno gradients at all", transform=right.transAxes,
                       ha="center", color=STATUS_COLORS["raises"], fontsize=11)
            continue
        # one colour per kernel, whatever each bar's size: the dotted tolerance line says which bars fail
        right.bar(np.arange(len(names)) + shift, values, width=0.4, label=f"{name} kernel",
                  color=VARIANT_COLORS[name])
    right.axhline(check.tolerance(torch.float32).grad, color="k", ls=":", label="fp32 gradient tolerance")
    right.set_yscale("log")
    right.set_ylim(floor / 2, 1e4)  # headroom above the largest error (1, a NaN) for the legend
    right.set_xticks(range(len(names)), names, rotation=45, fontsize=9)
    right.set(ylabel="relative error vs float64",
              title="with h0, buggy vs fixed kernel\n(o, ht: forward; the rest: gradients)")
    right.legend(fontsize=9, loc="upper left")
    return fig


def explorer():
    """Tile shape and problem shape; each change runs both kernels' backward once."""
    return widgets.explorer(
        plot_config,
        BK=widgets.choice("BK (dq tile)", list(SIZES), 32),
        BV=widgets.choice("BV (dq tile)", list(SIZES), 32),
        K=widgets.choice("K", list(SIZES), 32),
        V=widgets.choice("V", list(SIZES), 16),
    )

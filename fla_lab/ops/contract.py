"""Input checks shared by every op: bad input gets an error that names the argument and says how to fix it.

Shape, dtype, device and keyword checks read only metadata and always run. Value checks (non-finite values, a
positive log-decay, an RWKV-7 transition that can grow the state) read the data, and are on by default on every
device. All of an op call's value checks are one pass (`fla_lab.ops.common.value_flags`) that sets bits in one
int32 flag; when the flag is read depends on `value_check_mode`:

- "now": read at once, before the op's kernels run (CPU tensors by default; `set_value_checks(True)`,
  `with value_checks(True):` or FLA_LAB_VALUE_CHECKS=1 anywhere, which costs a GPU sync per call: for debugging);
- "deferred" (CUDA tensors by default): the flag is copied to pinned host memory behind the op's work and read
  at a later checked op call once it has arrived (never waiting), or by `flush_value_checks()` (waits). The error
  or warning then names the call it comes from: "chunk_rwkv7 call #3 (checked without stopping the GPU, ...)";
- "off": `set_value_checks(False)`, `with value_checks(False):` (how the layers let a `bug=` switch's wrong
  input through) or FLA_LAB_VALUE_CHECKS=0.

The pass reads each input once (GPU cost: benchmarks/results/checks.md); a deferred check of chunk_gla and
chunk_rwkv6 leaves q, k, v and the decay to the forward's own kernels, which read them anyway (`KernelChecks`). A deferred check keeps references to
its call's inputs until its flag is read (so the message can count the bad values); at most MAX_PENDING checks
wait, beyond that the oldest is waited for. Inside a CUDA graph capture the checks are off.
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
import warnings
from dataclasses import dataclass, field

import torch

from fla_lab.ops.common.value_flags import (LAMBDA0, POSITIVE_DECAY_BIT, TRANSITION_BIT, TRANSITION_TOL,  # noqa: F401
                                            growing_rows, nonfinite_bit, value_flags)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class LayoutWarning(UserWarning):
    """Inputs look like [B, H, T, D] where [B, T, H, D] is expected. Silence with `warnings.simplefilter('ignore', LayoutWarning)`."""


class TransitionWarning(UserWarning):
    """An RWKV-7 transition `diag(exp w) + b a^T` has an eigenvalue above 1: the state can grow step after step."""


_value_checks: bool | None = None  # None: the default (now on the CPU, deferred on a GPU)


def set_value_checks(enabled: bool | None) -> None:
    """True: check values and read the result at once (a sync per call on a GPU); False: never check; None: the
    default, checked on every device, read at once on the CPU and at a later op call on a GPU."""
    global _value_checks
    _value_checks = enabled


@contextlib.contextmanager
def value_checks(enabled: bool | None):
    """Value checks now (True), off (False) or by default (None) inside the block, restored afterwards.

    The layers use `value_checks(False)` to let a deliberately wrong input (a `bug=` switch) reach the kernel.
    """
    global _value_checks
    previous, _value_checks = _value_checks, enabled
    try:
        yield
    finally:
        _value_checks = previous


def _setting() -> bool | None:
    if _value_checks is not None:
        return _value_checks
    env = os.environ.get("FLA_LAB_VALUE_CHECKS")
    return None if env is None else env not in ("", "0")


def _capturing(device: torch.device) -> bool:
    """A CUDA graph being captured: no flag can be read (or waited on) until it is replayed."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_DEFERRED_DEVICES = ("cuda",)  # devices with a queue to keep busy: their flags are read at a later call


def value_check_mode(x) -> str:
    """How an op call with `x` among its inputs checks values: "off", "now" or "deferred" (see the module doc)."""
    setting = _setting()
    if setting is False or x.device.type == "meta" or _capturing(x.device):
        return "off"
    if setting is True or x.device.type not in _DEFERRED_DEVICES:
        return "now"
    return "deferred"


def value_checks_enabled(x) -> bool:
    """Whether an op call with `x` among its inputs checks values (now or deferred): True unless switched off."""
    return value_check_mode(x) != "off"


def reject_kwargs(op: str, kwargs: dict) -> None:
    if not kwargs:
        return
    if "head_first" in kwargs:
        raise TypeError(
            f"{op}: `head_first` was removed upstream (flash-linear-attention #853) and fla_lab never had it. "
            "Pass tensors as [B, T, H, D]; from [B, H, T, D] use `x.transpose(1, 2)`.")
    raise TypeError(f"{op}: unexpected keyword argument(s) {sorted(kwargs)}")


def _describe(x: torch.Tensor) -> str:
    return f"shape {tuple(x.shape)}, {x.dtype}, {x.device}"


def check_same_device(op: str, tensors: dict[str, torch.Tensor]) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{op}: tensors are on different devices: {devices}. Move them with `.to(device)`.")


def check_kernel_device(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """Compiled kernels read GPU memory: a CPU tensor would reach Triton as an opaque pointer error.

    Called at the kernel launch, after the contract checks, so those report their own (more specific) errors.
    """
    from fla_lab import runtime

    if runtime.device() == "cuda":
        on_cpu = [name for name, t in tensors.items() if t is not None and t.device.type != "cuda"]
        if on_cpu:
            raise ValueError(f"{op}: {on_cpu} are on the CPU, but here the Triton kernels run compiled on the GPU. "
                             "Move the inputs with `.to(fla_lab.device())` (or `.cuda()`).")


def check_dtypes(op: str, tensors: dict[str, torch.Tensor], same: tuple[str, ...]) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{op}: `{name}` is {t.dtype}; use float32, float16 or bfloat16 (`{name}.float()`).")
    dtypes = {name: tensors[name].dtype for name in same if tensors.get(name) is not None}
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"{op}: {', '.join(dtypes)} must share a dtype, got {dtypes}. Cast them to one.")


def check_shape(op: str, name: str, x: torch.Tensor, expected: tuple, meaning: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{op}: `{name}` should be {meaning} = {tuple(expected)}, got {_describe(x)}.")


def warn_if_head_first(op: str, name: str, x: torch.Tensor) -> None:
    B, T, H, D = x.shape
    if T < H:  # upstream's heuristic (#457): fewer steps than heads usually means [B, H, T, D]
        warnings.warn(
            f"{op}: `{name}` has T={T} < H={H}; inputs are [B, T, H, D], so this looks like [B, H, T, D]. "
            "If so, pass `x.transpose(1, 2)`. Silence: warnings.simplefilter('ignore', fla_lab.ops.LayoutWarning).",
            LayoutWarning, stacklevel=4)


def _nonfinite_message(where: str, name: str, t: torch.Tensor) -> str:
    n = int((~torch.isfinite(t)).sum())
    return (f"{where}: `{name}` has {n} non-finite value(s) (NaN/inf); "
            "fix the producer (see fla_lab.check.nonfinite_census to locate them).")


def _log_decay_message(where: str, name: str, g: torch.Tensor) -> str:
    """Decays are natural-log decays: exp(g) must not grow the state."""
    top = float(g.max())
    return (f"{where}: `{name}` is a log-decay and must be <= 0, but its maximum is {top:.3g} (every step would "
            f"multiply the state by exp({top:.3g}) > 1). Pass log-space decays, e.g. "
            f"`F.logsigmoid(x)` or `-torch.exp(x)`, not `sigmoid(x)` or a decay in (0, 1).")


TRANSITION_SAMPLES = 32


def _largest_modulus(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> float:
    """Largest |eigenvalue| of `diag(exp w) + b a^T` over the given flat (batch, step, head) rows, in float64."""
    K = w.shape[-1]
    pick = lambda x: x.detach().reshape(-1, K)[rows.to(x.device)].cpu().double()  # noqa: E731
    w, a, b = pick(w), pick(a), pick(b)
    M = torch.diag_embed(w.exp()) + b[:, :, None] * a[:, None, :]
    return float(torch.linalg.eigvals(M).abs().max())


def transition_radius(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, samples: int = TRANSITION_SAMPLES,
                      seed: int = 0) -> float:
    """Largest |eigenvalue| of `diag(exp w_t) + b_t a_t^T` over `samples` random (batch, step, head) triples.

    For RWKV-7's `a = -kk`, `b = kk * a_gate` (unit-norm kk, a_gate in [0, 1]) it is <= 1: the rank-one term
    removes part of the state. For `a, b ~ U(0, 1)` (upstream #150) it is about 1 + a.b, near 17 for K = 64.
    The check itself does not sample: `value_flags.growing_rows` tests every row; this estimate only gives the
    warning its number.
    """
    B, T, H, K = w.shape
    gen = torch.Generator().manual_seed(seed)
    return _largest_modulus(w, a, b, torch.randperm(B * T * H, generator=gen)[:samples])


def _growth_modulus(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """The modulus a TransitionWarning reports: `transition_radius`, or, when its sample misses the few growing
    rows, the largest over (the first TRANSITION_SAMPLES of) the rows the check flagged."""
    radius = transition_radius(w, a, b)
    rows = growing_rows(w, a, b).flatten().nonzero().flatten()[:TRANSITION_SAMPLES]
    return radius if radius > LAMBDA0 or len(rows) == 0 else _largest_modulus(w, a, b, rows)


def _transition_message(where: str, w, a, b) -> str:
    radius = _growth_modulus(w, a, b)
    return (f"{where}: the transition diag(exp w) + b a^T has an eigenvalue of modulus {radius:.3g} > 1, so the "
            f"state can grow like {radius:.3g}^t and overflow (upstream #150 used a, b ~ rand). RWKV-7 passes "
            "a = -kk, b = kk * a_gate with kk = F.normalize(k * k_k, dim=-1) and a_gate in (0, 1). Silence: "
            "warnings.simplefilter('ignore', fla_lab.ops.contract.TransitionWarning).")


# ------------------------------------------------------------------------------------------------ value checks

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # .../fla_lab/


def _user_stacklevel() -> int:
    """The `stacklevel` that points a warning raised by our caller at the first frame outside fla_lab."""
    frame, level = sys._getframe(1), 1  # our caller, the one that warns: stacklevel 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


@dataclass
class _ValueCheck:
    """The value checks of one op call: its tensors (in the op's argument order) and what each flag bit means.

    Slot order for the flag kernel: the log-decay first, then (RWKV-7) a and b, then the rest.
    """
    op: str
    tensors: dict[str, torch.Tensor]
    decay: str | None = None
    transition: tuple[str, str, str] | None = None  # names of w, a, b (w is the decay)
    slots: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        self.tensors = {n: t.detach() for n, t in self.tensors.items() if t is not None and t.numel()}
        if self.decay not in self.tensors:
            self.decay = None
        if self.transition and not all(n in self.tensors for n in self.transition):
            self.transition = None
        first = self.transition or ((self.decay,) if self.decay else ())
        self.slots = tuple(dict.fromkeys((*first, *self.tensors)))

    def flags(self, leave_out: tuple[str, ...] = ()) -> torch.Tensor:
        """The flag, left on the tensors' device, from every slot but `leave_out` (the op's kernels set those)."""
        names = [n for n in self.slots if n not in leave_out]
        if not names:
            return torch.zeros(1, dtype=torch.int32, device=next(iter(self.tensors.values())).device)
        return value_flags([self.tensors[n] for n in names], decay=self.decay in names,
                           transition=self.transition is not None, bits=tuple(map(self.slots.index, names)))

    def report(self, flags: int, where: str) -> None:
        """Raise (non-finite values, named in argument order, then a positive log-decay) or warn (transition)."""
        for name in self.tensors:
            if flags & nonfinite_bit(self.slots.index(name)):
                raise ValueError(_nonfinite_message(where, name, self.tensors[name]))
        if flags & (1 << POSITIVE_DECAY_BIT):
            raise ValueError(_log_decay_message(where, self.decay, self.tensors[self.decay]))
        if flags & (1 << TRANSITION_BIT):
            warnings.warn(_transition_message(where, *(self.tensors[n] for n in self.transition)),
                          TransitionWarning, stacklevel=_user_stacklevel())


@dataclass
class _Pending:
    """A deferred check: its flag's host copy is valid once `done.query()` is True."""
    check: _ValueCheck
    call: int
    flags: torch.Tensor
    done: object  # torch.cuda.Event, or anything with query() and synchronize()


class _Done:
    """Completion marker of a flag computed off the GPU (no queue): done at once."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


MAX_PENDING = 64  # a CPU running this many checked calls ahead of the GPU waits for the oldest: bounded memory
_pending: collections.deque[_Pending] = collections.deque()
_calls: collections.Counter = collections.Counter()  # checked calls per op, for "call #N"


def _to_host(flags: torch.Tensor) -> tuple[torch.Tensor, object]:
    """(host copy of `flags`, its completion marker): a non-blocking copy to pinned memory and an event on a GPU."""
    if flags.device.type != "cuda":
        return flags, _Done()
    host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
    host.copy_(flags, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


def _report_oldest(wait: bool, when: str = "at a later op call") -> bool:
    """Report the oldest deferred check if its flag has arrived (or wait for it); False if there was none to report."""
    if not _pending or not (wait or _pending[0].done.query()):
        return False
    entry = _pending.popleft()  # dropped before reporting: its tensors are released even if it raises
    if wait:
        entry.done.synchronize()
    entry.check.report(int(entry.flags[0]), where=f"{entry.check.op} call #{entry.call} "
                                                  f"(checked without stopping the GPU, reported {when})")
    return True


def _report_pending(wait: bool, when: str = "at a later op call") -> None:
    while _report_oldest(wait, when):
        pass


def flush_value_checks() -> None:
    """Wait for every deferred value check and report it (raise its ValueError, warn its TransitionWarning),
    oldest first: at the end of a step, in a test, before trusting a result."""
    _report_pending(wait=True, when="by flush_value_checks()")


class KernelChecks:
    """The share of a deferred value check that an op's own kernels do as they read their inputs.

    `flags` is the call's flag (the pass over the other tensors has run); `slot(name)` the bit a kernel sets for
    `name`, -1 for a tensor it need not check. The op passes both to its kernels, then calls `submit()` once they
    are queued: the flag's host copy goes behind them.
    """

    def __init__(self, check: _ValueCheck, names: tuple[str, ...]):
        self.check, self.names = check, tuple(n for n in names if n in check.slots)
        self.flags = check.flags(leave_out=self.names)

    def slot(self, name: str) -> int:
        return self.check.slots.index(name) if name in self.names else -1

    def submit(self) -> None:
        _defer(self.check, self.flags)


def _defer(check: _ValueCheck, flags: torch.Tensor) -> None:
    host, done = _to_host(flags)
    _pending.append(_Pending(check, _calls[check.op], host, done))
    while len(_pending) > MAX_PENDING:
        _report_oldest(wait=True)


def _check_values(op: str, tensors: dict, decay: str | None = None, transition: tuple | None = None,
                  in_kernel: tuple[str, ...] = ()) -> KernelChecks | None:
    """One op call's value checks, as `value_check_mode` says; earlier calls' deferred checks are reported first.

    `in_kernel`: tensors the op's kernels can check as they read them. A deferred check leaves them out of the flag
    pass and returns the `KernelChecks` the op hands its kernels; otherwise (now, off) the result is None.
    """
    mode = value_check_mode(next(t for t in tensors.values() if t is not None))
    if mode == "off":
        return None
    _report_pending(wait=False)
    check = _ValueCheck(op, tensors, decay, transition)
    if not check.slots:
        return None
    _calls[op] += 1
    if mode == "now":
        check.report(int(check.flags()[0]), where=op)
        return None
    if in_kernel:
        return KernelChecks(check, in_kernel)
    _defer(check, check.flags())
    return None


def _check_metadata(op: str, tensors: dict, first: str, same_dtype: tuple[str, ...], kwargs) -> tuple:
    """Keywords, types, rank, device and dtypes: everything but the shapes; returns `first`'s [B, T, H, K]."""
    reject_kwargs(op, kwargs or {})
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    x = tensors[first]
    if x.dim() != 4:
        raise ValueError(f"{op}: `{first}` must be 4-D [B, T, H, K], got {_describe(x)}")
    check_same_device(op, tensors)
    check_dtypes(op, tensors, same=same_dtype)
    if x.shape[1] == 0:
        raise ValueError(f"{op}: the sequence is empty (T = 0)")
    return tuple(x.shape)


def _check_value_shape(op: str, nv: str, v: torch.Tensor, B: int, T: int, H: int) -> int:
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"{op}: `{nv}` should be [B, T, H, V] = ({B}, {T}, {H}, V), got {_describe(v)}")
    return v.shape[-1]


def check_gated_inputs(op: str, q, k, v, g, *, names=("q", "k", "v", "g"), u=None, initial_state=None,
                       kwargs=None, in_kernel: bool = False) -> KernelChecks | None:
    """The contract of GLA-style ops: q, k, g `[B, T, H, K]`, v `[B, T, H, V]`, u `[H, K]`, h0 `[B, H, K, V]`.

    Value checks (finite inputs, log-decay <= 0) follow `value_check_mode`. `in_kernel`: the op's kernels check
    q, k, v and g as they read them when the check is deferred (the returned `KernelChecks`, else None).
    """
    nq, nk, nv, ng = names
    tensors = {nq: q, nk: k, nv: v, ng: g, "u": u, "initial_state": initial_state}
    B, T, H, K = _check_metadata(op, tensors, nq, (nq, nk, nv), kwargs)
    check_shape(op, nk, k, (B, T, H, K), f"like `{nq}`, [B, T, H, K]")
    check_shape(op, ng, g, (B, T, H, K), f"like `{nq}`, [B, T, H, K]")
    V = _check_value_shape(op, nv, v, B, T, H)
    if u is not None:
        check_shape(op, "u", u, (H, K), "[H, K]")
    if initial_state is not None:
        check_shape(op, "initial_state", initial_state, (B, H, K, V), "[B, H, K, V]")
    warn_if_head_first(op, nq, q)
    return _check_values(op, tensors, decay=ng, in_kernel=names if in_kernel else ())


def check_rwkv7_inputs(op: str, r, w, k, v, a, b, initial_state=None, kwargs=None) -> None:
    """The contract of RWKV-7 (DPLR) ops: r, w, k, a, b `[B, T, H, K]`, v `[B, T, H, V]`, h0 `[B, H, K, V]`.

    `w` is the natural-log decay (<= 0) and may be float32 while the rest is bf16 (the layer computes the decay
    in fp32, upstream #181). r, k, v, a, b share a dtype. Value checks (finite, w <= 0, and a `TransitionWarning`
    when diag(exp w) + b a^T can grow the state) follow `value_check_mode`.
    """
    tensors = {"r": r, "w": w, "k": k, "v": v, "a": a, "b": b, "initial_state": initial_state}
    B, T, H, K = _check_metadata(op, tensors, "r", ("r", "k", "v", "a", "b"), kwargs)
    for name in ("w", "k", "a", "b"):
        check_shape(op, name, tensors[name], (B, T, H, K), "like `r`, [B, T, H, K]")
    V = _check_value_shape(op, "v", v, B, T, H)
    if initial_state is not None:
        check_shape(op, "initial_state", initial_state, (B, H, K, V), "[B, H, K, V]")
    warn_if_head_first(op, "r", r)
    _check_values(op, tensors, decay="w", transition=("w", "a", "b"))


def check_gsa_inputs(op: str, q, k, v, s, g, initial_state=None, kwargs=None) -> None:
    """The contract of GSA: q, k `[B, T, H, K]`, v `[B, T, H, V]`, s, g `[B, T, H, M]` (g may be None: vanilla
    ABC), `initial_state` the pair `(Hk0 [B, H, K, M], Hv0 [B, H, M, V])`. q, k, v, s share a dtype; g is a
    natural-log forget gate (<= 0) in any supported dtype. Value checks follow `value_check_mode`."""
    if initial_state is not None and not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2):
        raise TypeError(f"{op}: `initial_state` is the pair (Hk0 [B, H, K, M], Hv0 [B, H, M, V]), "
                        f"got {type(initial_state).__name__}")
    hk0, hv0 = initial_state if initial_state is not None else (None, None)
    tensors = {"q": q, "k": k, "v": v, "s": s, "g": g, "initial_state[0]": hk0, "initial_state[1]": hv0}
    B, T, H, K = _check_metadata(op, tensors, "q", ("q", "k", "v", "s"), kwargs)
    check_shape(op, "k", k, (B, T, H, K), "like `q`, [B, T, H, K]")
    V = _check_value_shape(op, "v", v, B, T, H)
    if s.dim() != 4 or tuple(s.shape[:3]) != (B, T, H):
        raise ValueError(f"{op}: `s` should be [B, T, H, M] = ({B}, {T}, {H}, M), got {_describe(s)}")
    M = s.shape[-1]
    if g is not None:
        check_shape(op, "g", g, (B, T, H, M), "like `s`, [B, T, H, M]")
    if hk0 is not None or hv0 is not None:
        if hk0 is None or hv0 is None:
            raise ValueError(f"{op}: `initial_state` needs both Hk0 and Hv0 (pass zeros for the one you lack)")
        check_shape(op, "initial_state[0]", hk0, (B, H, K, M), "Hk0 [B, H, K, M]")
        check_shape(op, "initial_state[1]", hv0, (B, H, M, V), "Hv0 [B, H, M, V]")
    warn_if_head_first(op, "q", q)
    _check_values(op, tensors, decay="g")

"""Value checks and their deferred flag: non-finite values, a positive log-decay, an RWKV-7 transition that can
grow the state. They read the data, and are on by default on every device.

All of an op call's value checks are one pass (`fla_lab.ops.common.value_flags`) that sets bits in one int32
flag; when the flag is read depends on `value_check_mode`:

- "now": read at once, before the op's kernels run (CPU tensors by default; `set_value_checks(True)`,
  `with value_checks(True):` or FLA_LAB_VALUE_CHECKS=1 anywhere, which costs a GPU sync per call: for debugging);
- "deferred" (CUDA tensors by default): the flag is copied to pinned host memory behind the op's work and read
  at a later checked op call once it has arrived (never waiting), or by `flush_value_checks()` (waits). The error
  or warning then names the call it comes from: "chunk_rwkv7 call #3 (checked without stopping the GPU, ...)";
- "off": `set_value_checks(False)`, `with value_checks(False):` (how the layers let a `bug=` switch's wrong
  input through) or FLA_LAB_VALUE_CHECKS=0.

The pass reads each input once (GPU cost: benchmarks/results/checks.md); a deferred check of chunk_gla and
chunk_rwkv6 leaves q, k, v and the decay to the forward's own kernels, which read them anyway, and one of
chunk_rwkv7 leaves r, k and v (`KernelChecks`).
A deferred check keeps references to its call's inputs until its flag is read (so the message can count the bad
values); at most MAX_PENDING checks wait, beyond that the oldest is waited for. Inside a CUDA graph capture the
checks are off.
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
import warnings
from dataclasses import dataclass, field

import torch

from fla_lab.ops.common.value_flags import POSITIVE_DECAY_BIT, TRANSITION_BIT, nonfinite_bit, value_flags
from fla_lab.ops.contract.messages import (TransitionWarning, _log_decay_message, _nonfinite_message,
                                           _transition_message)

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


_PACKAGE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")) + os.sep  # .../fla_lab/


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

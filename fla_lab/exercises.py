"""The learner writes the fix: one verdict format for every notebook's "your turn" exercise.

Each bug notebook has an exercise cell where the learner writes the fixed code (a `@triton.jit` helper that a
small lesson kernel calls through a `tl.constexpr` slot, or a PyTorch function for the layer bugs), a check
cell that runs it against the float64 reference at once, and a collapsed solution cell (cell metadata
`jupyter.source_hidden` and the tag `solution`) followed by the same check. CI executes the solution, so a
solution that stops working fails the notebook tests.

A lesson module's `check_*` function measures and returns a `Verdict`; printing it gives a stable, rounded
pass / not-yet message (nbval compares it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

SOLUTION_TAG = "solution"


@dataclass
class Verdict:
    """The outcome of one exercise check: a name, a pass flag, and the measured facts behind it."""

    exercise: str
    passed: bool
    facts: list[str] = field(default_factory=list)
    hint: str = ""

    def __str__(self) -> str:
        head = f"PASS  {self.exercise}" if self.passed else f"NOT YET  {self.exercise}"
        lines = [head, *(f"  - {fact}" for fact in self.facts)]
        if not self.passed and self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def __bool__(self) -> bool:
        return self.passed


def fmt(x: float) -> str:
    """A rounded, platform-stable rendering of a measured number (nbval compares the text)."""
    if isinstance(x, bool):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.1e}"


def error_fact(name: str, err: float, tol: float) -> tuple[bool, str]:
    """(within tolerance, a line such as `o: error 1.2e-07 <= 2.0e-05`) for one compared tensor."""
    ok = math.isfinite(err) and err <= tol
    return ok, f"{name}: error {fmt(err)} {'<=' if ok else '>'} {fmt(tol)}"


def verdict(exercise: str, facts: list[tuple[bool, str]], hint: str = "") -> Verdict:
    """A verdict from (holds, line) facts: it passes when every fact holds."""
    return Verdict(exercise, all(ok for ok, _ in facts), [line for _, line in facts], hint)


def verdict_from_errors(exercise: str, errors: dict[str, float], tol: float, hint: str = "",
                        extra: list[tuple[bool, str]] = ()) -> Verdict:
    """A verdict that passes when every error is finite and within `tol` and every extra claim holds."""
    return verdict(exercise, [error_fact(name, err, tol) for name, err in errors.items()] + list(extra), hint)


def not_a_jit_helper(exercise: str, candidate) -> Verdict | None:
    """NOT YET when the learner's Triton helper is not a `@triton.jit` function (the lesson kernel cannot call it)."""
    import triton

    if isinstance(candidate, triton.runtime.KernelInterface):  # JITFunction, or the interpreter's
        return None
    return Verdict(exercise, False, [f"{getattr(candidate, '__name__', candidate)} is not a @triton.jit function"],
                   "decorate the helper with @triton.jit")

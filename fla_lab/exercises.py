"""The learner writes the fix: one verdict format for every notebook's "your turn" exercise.

Each bug notebook has an exercise cell (tag `exercise`) where the learner writes the fixed code (a `@triton.jit`
helper that the shipped kernel calls through a `tl.constexpr` slot, or a PyTorch function for the layer bugs), a
check cell (tag `check`) that runs it against the float64 reference at once, and a solution cell (tag `solution`)
followed by the same check (tagged `solution` too). The tracked notebooks keep the solutions, so CI executes them
and a solution that stops working fails the notebook tests; the learner's edition (`fla_lab.edition`) removes
every `solution` cell.

A lesson module's `check_*` function measures and returns a `Verdict`; printing it gives a stable, rounded
pass / not-yet message (nbval compares it). A NOT YET verdict carries hints in tiers, following the mistake it
measured: `verdict.hint()` prints the next one (first where to look, then what is wrong, last the line).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

SOLUTION_TAG = "solution"   # removed from the learner's edition (the solution and the check after it)
EXERCISE_TAG = "exercise"   # the cell the learner edits
CHECK_TAG = "check"         # the cell that runs the learner's code and prints the verdict
PREDICT_TAG = "predict"     # a question asked before the cell that answers it
HINT_TIERS = ("where to look", "what is wrong", "the line")


@dataclass
class Verdict:
    """The outcome of one exercise check: a name, a pass flag, and the measured facts behind it."""

    exercise: str
    passed: bool
    facts: list[str] = field(default_factory=list)
    hints: tuple[str, ...] = ()  # tiers: where to look, what is wrong, the line (fewer when the mistake says more)
    shown: int = 0               # how many hints `hint()` has printed

    def __post_init__(self) -> None:
        self.hints = (self.hints,) if isinstance(self.hints, str) else tuple(h for h in self.hints if h)

    def __str__(self) -> str:
        head = f"PASS  {self.exercise}" if self.passed else f"NOT YET  {self.exercise}"
        lines = [head, *(f"  - {fact}" for fact in self.facts)]
        if not self.passed and self.hints:
            lines.append(f"  stuck? verdict.hint() prints a hint ({len(self.hints)} in tiers: "
                         f"{', '.join(self.tier_names())})")
        return "\n".join(lines)

    def __bool__(self) -> bool:
        return self.passed

    def tier_names(self) -> tuple[str, ...]:
        n = len(self.hints)
        return HINT_TIERS if n >= 3 else (HINT_TIERS[1:1 + n] if n else ())

    def hint(self) -> None:
        """Print the next hint tier (each call one more; the last tier is the line itself)."""
        if self.passed:
            print("PASS: no hint needed")
            return
        if not self.hints:
            print("no hint for this result: compare the facts above with the notebook's explanation")
            return
        tier = min(self.shown, len(self.hints) - 1)
        name = self.tier_names()[tier]
        print(f"hint {tier + 1} of {len(self.hints)} ({name}): {self.hints[tier]}")
        if tier == len(self.hints) - 1 and self.shown >= len(self.hints):
            print("(that was the last hint)")
        self.shown += 1


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


def hints(where: str = "", what: str = "", line: str = "") -> tuple[str, ...]:
    """Hint tiers for a NOT YET verdict: where to look, what is wrong, the line (leave out a tier you lack)."""
    return tuple(h for h in (where, what, line) if h)


def verdict(exercise: str, facts: list[tuple[bool, str]], hint: str | tuple[str, ...] = ()) -> Verdict:
    """A verdict from (holds, line) facts: it passes when every fact holds. `hint`: one string or tiers."""
    return Verdict(exercise, all(ok for ok, _ in facts), [line for _, line in facts], hint)


def verdict_from_errors(exercise: str, errors: dict[str, float], tol: float, hint: str | tuple[str, ...] = (),
                        extra: list[tuple[bool, str]] = ()) -> Verdict:
    """A verdict that passes when every error is finite and within `tol` and every extra claim holds."""
    return verdict(exercise, [error_fact(name, err, tol) for name, err in errors.items()] + list(extra), hint)


def not_a_jit_helper(exercise: str, candidate) -> Verdict | None:
    """NOT YET when the learner's Triton helper is not a `@triton.jit` function (the lesson kernel cannot call it)."""
    import triton

    if isinstance(candidate, triton.runtime.KernelInterface):  # JITFunction, or the interpreter's
        return None
    return Verdict(exercise, False, [f"{getattr(candidate, '__name__', candidate)} is not a @triton.jit function"],
                   ("decorate the helper with @triton.jit",))

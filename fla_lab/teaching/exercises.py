"""The learner writes the fix: one verdict format for every notebook's "your turn" exercise.

Each bug notebook has an exercise cell (tag `exercise`) where the learner writes the fixed code (a `@triton.jit`
helper that the shipped kernel calls through a `tl.constexpr` slot, or a PyTorch function for the layer bugs), a
check cell (tag `check`) that runs it against the float64 reference at once, and a solution cell (tag `solution`)
followed by the same check (tagged `solution` too). The tracked notebooks keep the solutions, so CI executes them
and a solution that stops working fails the notebook tests; the learner's edition (`fla_lab.teaching.edition`) removes
every `solution` cell.

A lesson module's `check_*` function measures and returns a `Verdict`; printing it gives a stable, rounded
pass / not-yet message (nbval compares it). A NOT YET verdict carries hints in tiers, following the mistake it
measured: `verdict.hint()` prints the next one (first where to look, then what is wrong, last the line).

Nothing on the learner's path states an answer before the attempt:
- a solution line lives in its lesson module as a `Sealed` text (base64 in the source; `print`, `str`, f-strings,
  `repr`, IPython's `x?` and `help(x)` show a placeholder), so Tab, `??` and `help()` on the lesson show no answer;
  only `.opened()` gives the text, and only a hint's last tier and the fix after a PASS call it;
- the cell that shows the shipped fix after a check starts with `verdict.reveal()`, which raises `NotRevealed`
  (stopping Run All there) until the check said PASS or `verdict.hint()` has printed its last tier; in the
  learner's edition the fix in words becomes such a gate too (`verdict.reveal(explain=...)`);
- the kernel records each exercise whose check said PASS or whose hints ran out (`is_open(name)`): the bug
  catalogue (`fla_lab.teaching.bugs`) shows an exercise's fixed line in a learner's session only once it is recorded.
"""
from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass, field

SOLUTION_TAG = "solution"   # removed from the learner's edition (the solution and the check after it)
EXERCISE_TAG = "exercise"   # the cell the learner edits
CHECK_TAG = "check"         # the cell that runs the learner's code and prints the verdict
PREDICT_TAG = "predict"     # a question asked before the cell that answers it
REVEAL_TAG = "reveal"       # shows the fix after a check: its code starts with verdict.reveal()
HINT_TIERS = ("where to look", "what is wrong", "the line")


class NotRevealed(Exception):
    """Raised by `Verdict.reveal()` before the exercise is solved or its hints are used up."""


PLACEHOLDER = "<sealed solution line: its exercise's last hint tier, or the fix after a PASS, shows it>"


class Sealed(str):
    """A solution line kept out of sight. The source holds it in base64 (`seal(text)` makes that form; `python -m
    fla_lab.teaching.exercises seal "TEXT"` prints it). As a `str` it is the line itself for the checks that compare with it
    (`==`, `in`, hashing, `len`, str methods), but every way of displaying it (`print`, `str`, `format` and
    f-strings, `%`-formatting, `repr`, IPython's display and `x?`, `help(x)`) shows a placeholder. `.opened()`
    returns the text: the hint's last tier and the fix after a PASS call it, nothing else. `Sealed.of(text)` seals a
    text built at run time (a hint tier that quotes a sealed line: `Sealed.of(f"... {line.opened()}")`).

    The cheap ways to turn it back into a plain `str` keep it sealed: slicing (`x[:]`, `x[:400]`, `x[3]`),
    concatenation (`x + ""`, `"" + x`), repetition (`x * 1`, `1 * x`), `x % args`, and iteration (each character
    comes out sealed). Not closed, on purpose (a `str` subclass must keep them to compare and search as its text):
    str's own methods that build a new string (`x.split()`, `x.upper()`, `x.replace(...)`, `x.encode()`; `strip`
    is the exception, for `help(x)`), `"".join(x)` (str.join copies its items' characters whatever their type),
    `str.__str__(x)` and the base64 in the lesson's source. Each of those is deliberate digging, not an
    accident of displaying the value."""

    def __new__(cls, encoded: str):
        return super().__new__(cls, base64.b64decode(encoded.encode()).decode())

    @classmethod
    def of(cls, text: str) -> "Sealed":
        """A sealed text from plain text (no base64): for a tier composed at run time from a sealed line."""
        return str.__new__(cls, text)

    def opened(self) -> str:
        """The text itself, as a plain `str`: for the code paths allowed to show it, and only those."""
        return str.__str__(self)

    def shown(self) -> bool:
        """Whether display paths show the text (never, for a solution line; `fla_lab.teaching.bugs` overrides it)."""
        return False

    def placeholder(self) -> str:
        return PLACEHOLDER

    def _display(self) -> str:
        return self.opened() if self.shown() else self.placeholder()

    def __str__(self) -> str:
        return self._display()

    def __format__(self, spec: str) -> str:
        return format(self._display(), spec)

    def __repr__(self) -> str:
        return repr(self.opened()) if self.shown() else self.placeholder()

    def _repr_pretty_(self, p, cycle) -> None:  # IPython's display (its pretty printer)
        p.text(repr(self))

    def strip(self, chars=None):
        """Stripped, still sealed: `help(x)` strips its argument, then names it in "No documentation found"."""
        return self._rewrap(str.strip(self, chars))

    def _rewrap(self, text: str) -> "Sealed":
        return type(self).of(text)

    # the cheap ways back to a plain str: each result stays sealed (see the class's docstring for what is left open)
    def __getitem__(self, key):
        return self._rewrap(str.__getitem__(self, key))

    def __iter__(self):
        return (self._rewrap(ch) for ch in str.__iter__(self))

    def __add__(self, other):
        if not isinstance(other, str):
            return NotImplemented
        return self._rewrap(str.__add__(self, other))

    def __radd__(self, other):  # `"" + x`: Python asks a str subclass's __radd__ first
        if not isinstance(other, str):
            return NotImplemented
        return self._rewrap(str.__add__(other, self))

    def __mul__(self, n):
        result = str.__mul__(self, n)
        return result if result is NotImplemented else self._rewrap(result)

    __rmul__ = __mul__

    def __mod__(self, args):  # `x % args`: the template is the text (`"%s" % x` formats through __str__ already)
        return self._rewrap(str.__mod__(self, args))

    def __getnewargs__(self) -> tuple[str]:  # copy, deepcopy and pickle rebuild it from the sealed form
        return (seal(self.opened()),)


def opened(text) -> str:
    """A hint tier or an explanation as text to print: a `Sealed` one opened, any other as it is."""
    return text.opened() if isinstance(text, Sealed) else text


_OPENED: set[str] = set()  # exercises whose check said PASS or whose last hint tier was printed, in this kernel


def record_open(exercise: str) -> None:
    """Record that `exercise`'s answer may be shown (its check said PASS, or its hints ran out)."""
    _OPENED.add(str.__str__(exercise))


def is_open(exercise: str) -> bool:
    """Whether this kernel has recorded a PASS or the last hint tier of `exercise` (`Verdict.exercise`)."""
    return exercise in _OPENED


def seal(text: str) -> str:
    """The base64 form that `Sealed(...)` takes in a lesson's source."""
    return base64.b64encode(text.encode()).decode()


# The learner's edition writes the fix in words into a code cell (`verdict.reveal(explain=...)`), a file the learner
# reads: there it is locked, not merely encoded, so no single obvious call (base64) gives it. `lock` XORs the text
# with a SHA-256 keystream keyed by this constant and a per-text nonce; `unlock` (what `reveal` calls) undoes it.
# Reading it early takes this module's key and algorithm: deliberate digging, not a glance.
LOCK_PREFIX = "fla-lock1:"
_LOCK_KEY = b"fla_lab.teaching.exercises: the fix in words stays behind verdict.reveal() until the check says PASS"


def _keystream(nonce: bytes, n: int) -> bytes:
    blocks = (hashlib.sha256(_LOCK_KEY + nonce + i.to_bytes(4, "big")).digest() for i in range(-(-n // 32)))
    return b"".join(blocks)[:n]


def lock(text: str) -> str:
    """`text` locked for a learner's file: `LOCK_PREFIX` + base64 of (nonce, text XOR a SHA-256 keystream). The
    nonce is derived from the text (keyed), so the same text locks the same way and a rebuilt edition is stable."""
    data = text.encode()
    nonce = hashlib.sha256(_LOCK_KEY + b"nonce" + data).digest()[:8]
    body = bytes(a ^ b for a, b in zip(data, _keystream(nonce, len(data))))
    return LOCK_PREFIX + base64.b64encode(nonce + body).decode()


def unlock(locked: str) -> str:
    """The text that `lock` locked. A text without `LOCK_PREFIX` is read as plain base64 (`seal`), the form a
    learner's copy built before locking holds."""
    if not locked.startswith(LOCK_PREFIX):
        return base64.b64decode(locked.encode()).decode()
    raw = base64.b64decode(locked[len(LOCK_PREFIX):].encode())
    nonce, body = raw[:8], raw[8:]
    return bytes(a ^ b for a, b in zip(body, _keystream(nonce, len(body)))).decode()


@dataclass
class Verdict:
    """The outcome of one exercise check: a name, a pass flag, and the measured facts behind it."""

    exercise: str
    passed: bool
    facts: list[str] = field(default_factory=list)
    hints: tuple[str, ...] = field(default=(), repr=False)  # tiers: where to look, what is wrong, the line
    shown: int = 0               # how many hints `hint()` has printed

    def __post_init__(self) -> None:
        self.hints = (self.hints,) if isinstance(self.hints, str) else tuple(h for h in self.hints if h)
        if self.passed:
            record_open(self.exercise)

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
        print(f"hint {tier + 1} of {len(self.hints)} ({name}): {opened(self.hints[tier])}")
        if tier == len(self.hints) - 1 and self.shown >= len(self.hints):
            print("(that was the last hint)")
        self.shown += 1
        if self.revealed():  # the line was printed: a recorded reveal
            record_open(self.exercise)

    def gives_the_line(self) -> bool:
        """Whether the last hint tier is the line (a `Sealed` text): only then do the hints, used up, reveal the fix
        (a verdict whose hints stop short of the line, such as "decorate the helper", opens nothing)."""
        return bool(self.hints) and isinstance(self.hints[-1], Sealed)

    def revealed(self) -> bool:
        """The fix may be shown: the check passed, or every hint tier, the line included, has been printed."""
        return self.passed or (self.gives_the_line() and self.shown >= len(self.hints))

    def reveal(self, explain: str | None = None) -> None:
        """The gate at the top of a cell that shows the shipped fix: returns once `revealed()`, else raises
        `NotRevealed`, so Run All stops here instead of printing the answer to an exercise not yet tried.
        `explain`: the fix in words, markdown locked (`lock`; plain base64, `seal`, is read too), displayed once
        the gate opens (the learner's edition turns each explanation after a check into such a cell)."""
        if self.revealed():
            record_open(self.exercise)
            if explain is not None:
                from IPython.display import Markdown, display

                display(Markdown(unlock(explain)))
            return
        left = len(self.hints) - self.shown
        hints = (f", or call verdict.hint() {left} more time(s) (its last tier is the line)" if self.gives_the_line()
                 else "")
        raise NotRevealed(f"{self.exercise}: not solved yet, so the fix stays hidden. Make the check above say "
                          f"PASS{hints}, then run this cell again.")


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


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["seal"] and len(sys.argv) == 3:
        print(seal(sys.argv[2]))
    else:
        print('usage: python -m fla_lab.teaching.exercises seal "TEXT"')

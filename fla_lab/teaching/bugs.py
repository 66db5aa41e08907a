"""The catalogue: every upstream bug fla_lab reproduces, in one place.

Each entry says where the switch is (`locate(name)` gives file:line of the historical line, the line that the
marker `# bug: <name>` marks, `fla_lab.spec.markers`), how to trigger it, what it does, and which notebook teaches
it. Tests reproduce every entry; notebooks read their headers from here. `python -m fla_lab bugs` (or `show()`)
prints every entry with its buggy and fixed lines.

Each entry belongs to the exercise whose answer its fixed line is (`Bug.exercise`, the name its check's verdict
carries). In a learner's session (`fla_lab.teaching.edition.learner_session()`: the lab that `workbook.py lab` starts, or a
kernel running in the learner's edition) an entry's cause (`fix`, `trigger`, `symptom`) and its switch lines stay
sealed until that exercise's check has said PASS or its last hint tier has been printed in this kernel
(`exercises.is_open`); everywhere else (the reference notebooks, tests, a facilitator's shell) everything shows.
Where a value would state the answer it is written sealed here too (base64, `exercises.Sealed`), so the module's
source gives nothing away either.
"""
from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass

from fla_lab import layers, ops
from fla_lab.ops.common.switches import Switch, check_switch
from fla_lab.spec import markers
from fla_lab.teaching import edition, exercises

UPSTREAM = "fla-org/flash-linear-attention"


class Held(exercises.Sealed):
    """A catalogue text that explains its bug (fix, trigger, symptom): shown as itself unless this is a learner's
    session whose kernel has not opened the entry's exercise (`Bug.answer_shown()`), then as a placeholder that
    says how to open it. Compares, hashes and splits as the text itself; slicing, `+`, `*`, `%` and iteration give
    `Held` texts again (`exercises.Sealed`'s docstring says which paths are left open, as deliberate digging)."""

    exercise: str
    notebook: str

    @classmethod
    def of(cls, text: str, exercise: str = "", notebook: str = "") -> "Held":
        held = str.__new__(cls, text)
        held.exercise, held.notebook = exercise, notebook
        return held

    def shown(self) -> bool:
        return answer_shown(self.exercise)

    def placeholder(self) -> str:
        return f"<sealed: notebook {self.notebook.split('_')[0]}'s exercise opens it>"

    def _rewrap(self, text: str) -> "Held":
        return Held.of(text, self.exercise, self.notebook)


def answer_shown(exercise: str) -> bool:
    """Whether the catalogue shows the fix of `exercise`'s bug here: outside a learner's session always; in one,
    once this kernel has recorded that exercise's PASS or its last hint tier."""
    return not exercise or exercises.is_open(exercise) or not edition.learner_session()


def sealed_note(notebook: str) -> str:
    """How a sealed entry opens, in words."""
    return (f"sealed until notebook {notebook.split('_')[0]}'s exercise says PASS or verdict.hint() has shown its last "
            "tier (then run this again)")


@dataclass(frozen=True)
class Bug:
    name: str          # the value of `bug=`: the switch (`op`, `issue`, `located`) is declared beside its op
    title: str         # the symptom as a user met it (what `index()` shows: it names no cause)
    component: str     # the kernel or code path that holds the historical line
    fix: str           # upstream fix commit(s)
    trigger: str       # what makes it show
    symptom: str       # what the user sees
    notebook: str
    switch_file: str   # the file (relative to the package) whose `# bug: <name>` marker marks the switch line
    exercise: str      # the exercise whose answer the fixed line is (its verdict's name): gates fix, trigger, symptom

    def __post_init__(self) -> None:
        for name in ("fix", "trigger", "symptom"):  # written sealed or plain above; held either way
            object.__setattr__(self, name, Held.of(exercises.opened(getattr(self, name)), self.exercise,
                                                   self.notebook))

    @property
    def switch(self) -> Switch:
        return next(s for s in layers.SWITCHES if s.name == self.name)

    @property
    def op(self) -> str:
        return self.switch.op

    @property
    def issue(self) -> int:
        return self.switch.issue

    @property
    def located(self) -> tuple[str, str | None, str]:
        """What `fla_lab.tools.hunt` must name: (op, first bad kernel or None, cause)."""
        return self.switch.located

    @property
    def issue_url(self) -> str:
        return f"https://github.com/{UPSTREAM}/issues/{self.issue}"

    def answer_shown(self) -> bool:
        """Whether this entry's cause and switch lines show here (`answer_shown(self.exercise)`)."""
        return answer_shown(self.exercise)

    def __repr__(self) -> str:
        """Every field; where the entry is sealed (`answer_shown`), its headline and how it opens (the other fields
        name the kernel, the cause and the fix commit)."""
        if self.answer_shown():
            names = [f.name for f in dataclasses.fields(self)] + ["op", "issue", "located"]
            fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
            return f"Bug({fields})"
        return (f"Bug(name={self.name!r}, title={self.title!r}, op={self.op!r}, issue={self.issue}, "
                f"notebook={self.notebook!r}, <the rest {sealed_note(self.notebook)}>)")


CATALOGUE: tuple[Bug, ...] = (
    Bug(name="uninitialized_params", title="the RWKV-7 layer returns all-NaN",
        component="RWKV7Attention.__init__ / _initialize_weights",
        fix="d49c52f6 (zeros), then 7497c8f7, fe157539, c90b3716 (official init)",
        trigger=exercises.Sealed(  # states 01's why
            "YW55IGZvcndhcmQgcGFzczogeF94LCBrX2ssIGtfYSwgcl9rIGNvbWUgZnJvbSB0b3JjaC5lbXB0eSBhbmQgTW9kdWxlLmFwcGx5IG5l"
            "dmVyIHZpc2l0cyB0aGVt"),
        symptom="all-NaN (or garbage) layer output, depending on what the uninitialised memory holds",
        notebook="01_all_nan_output", switch_file="layers/rwkv7.py",
        exercise="the initialisation #150 skipped"),
    Bug(name="sigmoid_decay", title="gradients grow uncontrollably (RWKV6 layer)",
        component="RWKV6Attention.forward (decay parametrisation)",
        fix="none needed in the kernel: pass log-space decays (logsigmoid / -exp)",
        trigger="sigmoid(w) passed where the kernel expects a log-decay",
        symptom="the state grows like exp(0.5 t); output and every gradient except du turn non-finite",
        notebook="02_gradients_blow_up", switch_file="layers/rwkv6.py",
        exercise="#11: the log of a sigmoid gate, as a @triton.jit helper"),
    Bug(name="exclusive_reference", title="NaN gradients of RWKV6 under strong decay",
        component="chunk intra-chunk scores and dq (RWKV6 path)",
        fix=exercises.Sealed(  # states 03a's answer
            "MGMxYzBiNjUgKHJlZmVyZW5jZSByb3cgZ2lbc3RhcnQtMV0pOyBlYXJsaWVyIGNmNjNhYzI4LCBsb3N0IGluIGRlNDIzNWZk"),
        trigger="per-step log-decay <= about -90 (w = -exp(w_raw), w_raw >= 4.5)",
        symptom="inf * 0 = NaN in the output and dq, starting at the first query row of a sub-chunk",
        notebook="03a_nan_under_strong_decay",
        switch_file="ops/common/chunk.py",
        exercise="the reference row gn of chunk_rwkv6"),
    Bug(name="unmasked_padding", title="NaN gradients of a GSA layer that come and go",
        component="GSA slot pass, backward intra-chunk dv kernel (slot_rows_kernel, BACKWARD)",
        fix=exercises.Sealed("NzM3NTUwZmYgKG1hc2sgcm93cyBwYXN0IFQgaW4gdGhlIGV4cG9uZW50KQ=="),  # 03b's
        trigger="a partial last chunk (T not a multiple of chunk_size) and a slot log-decay summed from the chunk's "
                "first row to a sub-chunk's last valid row below about -88.7 (fp32)",
        symptom="forward finite; NaN in the gradients of s and g (exp(0 - gn) = inf times a zero-padded do)",
        notebook="03b_nan_gradients_that_come_and_go",
        switch_file="ops/common/chunk.py",
        exercise="the exponent of the later rows in chunk_gsa's slot-gradient kernel"),
    Bug(name="transposed_h0_mask", title="the backward fails when an initial state is passed",
        component="fused_recurrent_bwd_dq_kernel",
        fix="1547448b",
        trigger="backward with an initial_state and non-square dq tiles (BK=16, BV=64)",
        symptom="Triton refuses the initial-state load: mask [16, 64] against pointers [64, 16]",
        notebook="04_backward_fails_with_initial_state",
        switch_file="ops/common/fused_recurrent.py",
        exercise="the mask of the initial-state load, in fused_recurrent_rwkv6's backward"),
    Bug(name="bf16_decay", title="a precision gap against the official RWKV-7 under AMP",
        component="RWKV7Attention.forward (decay LoRA sigmoid)",
        fix=exercises.Sealed(  # states 05's answer
            "OTY1YzM1NTMgKGZwMzIgc2lnbW9pZCksIHJldmVydGVkIGluIGQ5ZTg2ZDAwICh2MC4yLjApOyAwLjYuMC"
            "Bjb21wdXRlcyBpdCBpbiBiZjE2"),
        trigger="bf16 autocast (CUDA or CPU): the decay's sigmoid runs in bf16, and its rounding stays in the decay",
        symptom="a per-step rounding bias in the decay that compounds over the sequence",
        notebook="05_precision_gap_under_amp", switch_file="layers/rwkv7.py",
        exercise="RWKV-7 log-decay in fp32 under autocast"),
)

_PACKAGE = pathlib.Path(__file__).resolve().parents[1]


def get(name: str) -> Bug:
    for bug in CATALOGUE:
        if bug.name == name:
            return bug
    raise KeyError(f"no bug {name!r} in the catalogue; known: {[b.name for b in CATALOGUE]}")


def for_op(op: str) -> list[Bug]:
    return [b for b in CATALOGUE if b.op == op]


def check_bug(bug: str | None, op: str) -> None:
    """`bug=None` is the fixed code; anything else must be a switch of this op or layer (`layers.SWITCHES`, the
    ops' unlisted switches included)."""
    check_switch(bug, op, layers.SWITCHES, ops.UNLISTED)


def _sealed(bug: Bug, what: str) -> None:
    """Raise `exercises.NotRevealed` where `bug`'s answer does not show yet (`Bug.answer_shown`)."""
    if not bug.answer_shown():
        raise exercises.NotRevealed(f"{bug.name}: {what} {sealed_note(bug.notebook)}.")


def locate(name: str) -> str:
    """`fla_lab/<file>:<line>` of the switch that turns the bug on (in a learner's session, once the entry's exercise
    is opened: before, it raises `exercises.NotRevealed`)."""
    _sealed(get(name), "the switch's place is")
    return _locate(name)


def _locate(name: str) -> str:
    """`fla_lab/<file>:<line>` of the line that `# bug: <name>` marks in the file the entry names."""
    path = f"fla_lab/{get(name).switch_file}"
    return f"{path}:{markers.locate((_PACKAGE.parent / path).read_text(), 'bug', name, path)}"


def switch_lines(name: str, context: int = 4) -> list[str]:
    """The switch line and the `context` lines after it, without markers: the buggy line and the fixed one side by
    side. In a learner's session before the entry's exercise is opened it raises `exercises.NotRevealed` instead
    (`answer_shown`)."""
    _sealed(get(name), "the switch's lines are")
    number = int(_locate(name).rsplit(":", 1)[1])
    text = (_PACKAGE / get(name).switch_file).read_text()
    shown = [(n, line) for n, line in markers.visible_lines(text) if n >= number][:context + 1]
    return [f"{n:5d}  {line}" for n, line in shown]


def index() -> None:
    """One line per entry: upstream issue, op or layer, the symptom as reported, notebook. No switch name, cause,
    trigger or code: safe to print before the notebooks ask the learner to predict and to write the fix."""
    width = max(len(b.title) for b in CATALOGUE)
    for bug in CATALOGUE:
        print(f"#{bug.issue:<4} {bug.op:<22} {bug.title:<{width}}  notebook {bug.notebook}")


def show(names: list[str] | None = None, lines: bool = True) -> None:
    """Print the catalogue (or some entries): where to look, how to trigger it, what it does, and the switch's lines
    (buggy, then fixed). In a learner's session an entry whose exercise is not opened yet shows its headline and a
    note that says how to open the rest (`Bug.answer_shown`)."""
    for bug in CATALOGUE:
        if names and bug.name not in names:
            continue
        if not bug.answer_shown():
            print(f"{bug.name}  [{bug.op}]  upstream #{bug.issue}")
            print(f"  taught : notebook {bug.notebook}")
            print(f"  fix, switch, trigger, symptom: {sealed_note(bug.notebook)}")
            continue
        try:
            where = _locate(bug.name)
        except (LookupError, OSError):
            where = f"fla_lab/{bug.switch_file} (not built yet)"
        print(f"{bug.name}  [{bug.op}]  upstream #{bug.issue}, fix {bug.fix}")
        print(f"  switch : {where}")
        print(f"  trigger: {bug.trigger}")
        print(f"  symptom: {bug.symptom}")
        print(f"  taught : notebook {bug.notebook}")
        if lines and not where.endswith("(not built yet)"):
            print("\n".join("    " + line for line in switch_lines(bug.name)))

"""The catalogue: every upstream bug fla_lab reproduces, in one place.

Each entry says where the switch is (`locate(name)` gives file:line of the historical line), how to trigger
it, what it does, and which notebook teaches it. Tests reproduce every entry; notebooks read their headers
from here.
"""
from __future__ import annotations

import hashlib
import pathlib
from dataclasses import dataclass

UPSTREAM = "fla-org/flash-linear-attention"


@dataclass(frozen=True)
class Bug:
    name: str          # the value of `bug=`
    title: str         # the symptom as a user met it (what `index()` shows: it names no cause)
    op: str            # the op or layer that takes `bug=name`
    component: str     # the kernel or code path that holds the historical line
    issue: int         # upstream issue number
    fix: str           # upstream fix commit(s)
    trigger: str       # what makes it show
    symptom: str       # what the user sees
    notebook: str
    anchor: tuple[str, str]  # (file relative to the package, text on the switch line)
    located: tuple[str, str | None, str]  # what `fla_lab.hunt` must name: (op, first bad kernel or None, cause)

    @property
    def issue_url(self) -> str:
        return f"https://github.com/{UPSTREAM}/issues/{self.issue}"


CATALOGUE: tuple[Bug, ...] = (
    Bug(name="uninitialized_params", title="the RWKV-7 layer returns all-NaN",
        op="RWKV7Attention", component="RWKV7Attention.__init__ / _initialize_weights",
        issue=150, fix="d49c52f6 (zeros), then 7497c8f7, fe157539, c90b3716 (official init)",
        trigger="any forward pass: x_x, k_k, k_a, r_k come from torch.empty and Module.apply never visits them",
        symptom="all-NaN (or garbage) layer output, depending on what the uninitialised memory holds",
        notebook="01_all_nan_output", anchor=("layers/rwkv7.py", 'bug == "uninitialized_params"'),
        located=("chunk_rwkv7", "dplr_scores_kernel", "nonfinite_input")),
    Bug(name="sigmoid_decay", title="gradients grow uncontrollably (RWKV6 layer)",
        op="RWKV6Attention", component="RWKV6Attention.forward (decay parametrisation)",
        issue=11, fix="none needed in the kernel: pass log-space decays (logsigmoid / -exp)",
        trigger="sigmoid(w) passed where the kernel expects a log-decay",
        symptom="the state grows like exp(0.5 t); output and every gradient except du turn non-finite",
        notebook="02_gradients_blow_up", anchor=("layers/rwkv6.py", 'bug == "sigmoid_decay"'),
        located=("fused_recurrent_rwkv6", "fused_recurrent_fwd_kernel", "positive_decay")),
    Bug(name="exclusive_reference", title="NaN gradients of RWKV6 under strong decay",
        op="chunk_rwkv6", component="chunk intra-chunk scores and dq (RWKV6 path)",
        issue=77, fix="0c1c0b65 (reference row gi[start-1]); earlier cf63ac28, lost in de4235fd",
        trigger="per-step log-decay <= about -90 (w = -exp(w_raw), w_raw >= 4.5)",
        symptom="inf * 0 = NaN in the output and dq, starting at the first query row of a sub-chunk",
        notebook="03a_nan_under_strong_decay",
        anchor=("ops/common/chunk.py", "upstream #77 (de4235fd dropped the -1 of cf63ac28)"),
        located=("chunk_rwkv6", "gated_scores_kernel", "exp_overflow")),
    Bug(name="unmasked_padding", title="NaN gradients of a GSA layer that come and go",
        op="chunk_gsa",
        component="GSA slot pass, backward intra-chunk dv kernel (slot_rows_kernel, BACKWARD)",
        issue=77, fix="737550ff (mask rows past T in the exponent)",
        trigger="a partial last chunk (T not a multiple of chunk_size) and a slot log-decay summed from the chunk's "
                "first row to a sub-chunk's last valid row below about -88.7 (fp32)",
        symptom="forward finite; NaN in the gradients of s and g (exp(0 - gn) = inf times a zero-padded do)",
        notebook="03b_nan_gradients_that_come_and_go",
        anchor=("ops/common/chunk.py", "upstream #77, GSA (before 737550ff)"),
        located=("chunk_gsa", "slot_rows_kernel", "padded_rows")),
    Bug(name="transposed_h0_mask", title="the backward fails when an initial state is passed",
        op="fused_recurrent_rwkv6", component="fused_recurrent_bwd_dq_kernel",
        issue=18, fix="1547448b",
        trigger="backward with an initial_state and non-square dq tiles (BK=16, BV=64)",
        symptom="Triton refuses the initial-state load: mask [16, 64] against pointers [64, 16]",
        notebook="04_backward_fails_with_initial_state",
        anchor=("ops/common/fused_recurrent.py", "upstream #18 (before 1547448b)"),
        located=("fused_recurrent_rwkv6", "fused_recurrent_bwd_dq_kernel", "kernel_raised")),
    Bug(name="bf16_decay", title="a precision gap against the official RWKV-7 under AMP",
        op="RWKV7Attention", component="RWKV7Attention.forward (decay LoRA sigmoid)",
        issue=181, fix="965c3553 (fp32 sigmoid), reverted in d9e86d00 (v0.2.0); 0.6.0 computes it in bf16",
        trigger="bf16 autocast (CUDA or CPU): the decay's sigmoid runs in bf16, and its rounding stays in the decay",
        symptom="a per-step rounding bias in the decay that compounds over the sequence",
        notebook="05_precision_gap_under_amp", anchor=("layers/rwkv7.py", 'bug == "bf16_decay"'),
        located=("chunk_rwkv7", None, "rounded_decay")),
)

# Switches that are not catalogue entries (an exercise's material): `check_bug` accepts them by the digest of
# "op:value" (`_digest`), so that no file names them and `index()`, `show()` and `suspects()` never list them.
_UNLISTED = frozenset({"d22760284bc462fb"})

_PACKAGE = pathlib.Path(__file__).resolve().parent


def get(name: str) -> Bug:
    for bug in CATALOGUE:
        if bug.name == name:
            return bug
    raise KeyError(f"no bug {name!r} in the catalogue; known: {[b.name for b in CATALOGUE]}")


def for_op(op: str) -> list[Bug]:
    return [b for b in CATALOGUE if b.op == op]


def _digest(op: str, bug: str) -> str:
    return hashlib.sha256(f"{op}:{bug}".encode()).hexdigest()[:16]


def check_bug(bug: str | None, op: str) -> None:
    """`bug=None` is the fixed code; anything else must be a catalogue entry of this op or layer (or one of its
    unlisted switches)."""
    if bug is None or _digest(op, bug) in _UNLISTED:
        return
    names = [b.name for b in for_op(op)]
    if bug not in names:
        raise ValueError(f"{op}: unknown bug={bug!r}; this op has {names or 'no switchable bugs'} "
                         "(see fla_lab.bugs.show()).")


def locate(name: str) -> str:
    """`fla_lab/<file>:<line>` of the switch that turns the bug on."""
    bug = get(name)
    path = _PACKAGE / bug.anchor[0]
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if bug.anchor[1] in line:
            return f"fla_lab/{bug.anchor[0]}:{number}"
    raise LookupError(f"the switch of {name!r} ({bug.anchor[1]!r}) is not in fla_lab/{bug.anchor[0]}")


def switch_lines(name: str, context: int = 4) -> list[str]:
    """The switch line and the few after it: the buggy line and the fixed one side by side."""
    where = locate(name)
    number = int(where.rsplit(":", 1)[1])
    lines = (_PACKAGE / get(name).anchor[0]).read_text().splitlines()
    return [f"{n:5d}  {lines[n - 1]}" for n in range(number, min(number + context, len(lines)) + 1)]


def index() -> None:
    """One line per entry: upstream issue, op or layer, the symptom as reported, notebook. No switch name, cause,
    trigger or code: safe to print before the notebooks ask the learner to predict and to write the fix."""
    width = max(len(b.title) for b in CATALOGUE)
    for bug in CATALOGUE:
        print(f"#{bug.issue:<4} {bug.op:<22} {bug.title:<{width}}  notebook {bug.notebook}")


def show(names: list[str] | None = None, lines: bool = True) -> None:
    """Print the catalogue (or some entries): where to look, how to trigger it, what it does."""
    for bug in CATALOGUE:
        if names and bug.name not in names:
            continue
        try:
            where = locate(bug.name)
        except (LookupError, OSError):
            where = f"fla_lab/{bug.anchor[0]} (not built yet)"
        print(f"{bug.name}  [{bug.op}]  upstream #{bug.issue}, fix {bug.fix}")
        print(f"  switch : {where}")
        print(f"  trigger: {bug.trigger}")
        print(f"  symptom: {bug.symptom}")
        print(f"  taught : notebook {bug.notebook}")
        if lines and not where.endswith("(not built yet)"):
            print("\n".join("    " + line for line in switch_lines(bug.name)))

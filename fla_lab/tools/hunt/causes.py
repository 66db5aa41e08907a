"""What a diagnosis says: the cause classes (`CAUSES`), the fix line per exp-overflow mechanism (`OVERFLOW_ADVICE`)
and the `Diagnosis` of one op call with its printed lines.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fla_lab.tools.hunt.scores import ScoreBlocks


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


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)

"""The locator's report: the recorded op calls (`Call`, `spec_of`), the first non-finite event (`Event`), the
`Report` that prints them with the diagnosis, and the catalogue entries it matches (`Suspects`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fla_lab.spec import registry
from fla_lab.tools.hunt.causes import CAUSES, Diagnosis


@dataclass
class Call:
    index: int
    op: str
    module: str
    fn: object
    inputs: dict
    kwargs: dict
    do: torch.Tensor | None = None
    dht: object = None
    detached: tuple[str, ...] = ()  # outputs returned without a graph although an input required grad
    output_final_state: bool = True  # as called (replays ask for the final state; the audit also runs it as called)
    library: str = "fla_lab"  # or "fla": flash-linear-attention's op, `op` its FLA name (fla_lab.spec.upstream)

    @property
    def label(self) -> str:
        return self.op if self.library == "fla_lab" else f"{self.library}:{self.op}"


def spec_of(call: Call) -> registry.OpSpec:
    """The registry's spec for an fla_lab op call; for an FLA call, the adapter's (FLA's names, fla_lab's
    float64 reference through the mapping of `fla_lab.spec.upstream`)."""
    if call.library == "fla_lab":
        return registry.get(call.op)
    from fla_lab.spec import upstream

    return upstream.spec(call.op, call.fn)


@dataclass
class Event:
    call: Call
    phase: str
    what: str


@dataclass
class Report:
    calls: list[Call]
    event: Event | None
    diagnosis: Diagnosis | None
    modules: dict[str, str] = field(default_factory=dict)  # first module with a non-finite output / parameter

    def suspects(self) -> "Suspects":
        """Switches (`fla_lab.layers.SWITCHES`, the catalogue's entries) whose located (op, kernel, cause) is what this report found; printed empty, it says
        that nothing in the catalogue matches (a new bug) and what to compare next."""
        from fla_lab import layers

        d = self.diagnosis
        found = (d.op, d.kernel, d.cause) if d is not None else None
        return Suspects([s.name for s in layers.SWITCHES if s.located == found], found)

    def __str__(self) -> str:
        if self.diagnosis is None:
            return f"no non-finite value in {len(self.calls)} op call(s)"
        head = [f"module   : {self.event.call.module}",
                f"call     : #{self.event.call.index} of {len(self.calls)} ({self.event.what})"]
        head += [f"params   : {v}" for v in self.modules.values()]
        return "\n".join(head + self.diagnosis.lines())


class Suspects(list):
    """A list of catalogue names that says, when empty, that the failure matches no catalogue entry."""

    def __init__(self, names, located: tuple | None):
        super().__init__(names)
        self.located = located

    def __str__(self) -> str:
        if self or self.located is None:
            return list.__repr__(self) if self else "[] (nothing was located)"
        op, kernel, cause = self.located
        head = f"[] no catalogue entry matches (op={op}, kernel={kernel or '-'}, cause={cause}): a bug it does not know"
        if CAUSES[cause][1] == "input":
            return head + "; the op received it: look where the report's fix line points"
        return head + ("; compare the op with its float64 reference (fla_lab.spec.harness.compare) and with the "
                       "family's fused recurrent op on the same inputs (no chunks: if that one is right, the bug is "
                       "on the chunked path), and census where the bad values sit (the report's kernel and scores "
                       "lines)")

    __repr__ = __str__

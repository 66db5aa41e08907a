"""The `bug=` switches: each op (and layer) declares its own beside its code, as `SWITCHES`.

A switch names the historical line it turns on (the line carries a `# bug: <name>` marker) and what the locator
(`fla_lab.tools.hunt`) must find when it fires. The story around each one (symptom, trigger, fix commit, notebook)
is the teaching catalogue's, `fla_lab.teaching.bugs`, which reads these.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    name: str      # the value of `bug=`
    op: str        # the op or layer that takes it
    issue: int     # upstream issue number
    located: tuple[str, str | None, str]  # what the locator must name: (op, first bad kernel or None, cause)


def digest(op: str, bug: str) -> str:
    """An unlisted switch's name, hashed with its op: accepted without any file naming it (an exercise's material)."""
    return hashlib.sha256(f"{op}:{bug}".encode()).hexdigest()[:16]


def check_switch(bug: str | None, op: str, switches: tuple[Switch, ...] = (), unlisted: frozenset = frozenset()) -> None:
    """`bug=None` is the fixed code; anything else must be one of `op`'s `switches` (or an unlisted digest)."""
    if bug is None or digest(op, bug) in unlisted:
        return
    names = [s.name for s in switches if s.op == op]
    if bug not in names:
        raise ValueError(f"{op}: unknown bug={bug!r}; this op has {names or 'no switchable bugs'} "
                         "(see fla_lab.teaching.bugs.show()).")

"""Notebook 06, "Going further": remove a numerical safeguard of your choice and find which check notices.

`fla_lab.spec.safeguards.REGISTRY` lists the kernels' safeguards: each one's id (its line carries the marker
`# safeguard: <id>`), its naive form (the same number in exact arithmetic) and the atlas range where it matters
(`Safeguard.atlas`). `remove(safeguard, naive)` copies the installed fla_lab package into a temporary folder,
replaces the code of the safeguard's line with `naive` in the copy (its indentation kept; default: the registry's
naive form) and runs a small atlas sweep of the safeguard's first op in a subprocess that
imports the copy: at ordinary inputs (decay 1, query scale 1) and in the safeguard's range, at T = 33 (a padded last
chunk) and T = 64 (a full one), fp32, B = H = 1, K = V = M = 16, with an initial state and a final-state cotangent
(so every path of the backward runs). The shipped kernel runs in the same range here, as the control. Nothing in the
installed package changes.

The exercise: pick a safeguard, predict the atlas's status at ordinary inputs and in its range, run it.
`check_removal(prediction)` runs the removal only once both statuses are written (a prediction comes before its
run) and compares them with what the run found. This process holds to that rule: the first prediction of a
removal (a safeguard with one naive line) is recorded before its run and is the one graded; a different prediction
of the same removal, made once its statuses were shown (by that check, or by `remove()` called before any
prediction), does not count. Another safeguard is a new prediction.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fla_lab.teaching import exercises
from fla_lab.spec import markers, safeguards

LENGTHS = (33, 64)                 # a partial last chunk (rows past T padded) and one full 64-row chunk
SHAPE = dict(B=1, H=1, K=16, V=16, M=16)
ORDINARY = {"decays": (1.0,), "q_scales": (1.0,)}
SIDES = ("ordinary", "in_range")   # the prediction's keys: the two checks
PREDICTABLE = ("right", "wrong", "nonfinite")
RANK = {"right": 0, "wrong": 1, "nonfinite": 2, "raises": 3}  # the worst status of a side's settings wins
TIMEOUT_S = 600
EXERCISE = "remove a safeguard: which check notices"


# --- the choices ---------------------------------------------------------------------------------------------------

def kernel_safeguards() -> list[safeguards.Entry]:
    """The inventory's kernel lines (an atlas range): a layer's line acts before any op, where the atlas cannot
    see it."""
    return [e for e in safeguards.inventory() if e.guard.atlas is not None]


def choices() -> None:
    """Print the safeguards the exercise can remove: id, the op the run sweeps, what it protects against, its
    range."""
    guards = [e.guard for e in kernel_safeguards()]
    width, op_width = max(len(g.id) for g in guards), max(len(g.ops[0]) for g in guards)
    print(f"{'safeguard':<{width}}  {'op':<{op_width}}  {'protects against':<17} range")
    for g in guards:
        print(f"{g.id:<{width}}  {g.ops[0]:<{op_width}}  {g.protects:<17} {safeguards.range_text(g)}")


def show(safeguard: str) -> None:
    """Print one safeguard: where it is, what it protects against, its shipped line and the naive one (your `naive`
    replaces the shipped line's code; its indentation stays)."""
    entry = _entry(safeguard)
    if isinstance(entry, str):
        print(entry)
        return
    g = entry.guard
    where = safeguards.describe_range(g.atlas)
    print(f"{g.id}: {entry.path}, in {entry.function} ({', '.join(g.ops)}); matters at {where}")
    print(f"  protects against {g.protects}: {g.what}")
    print(f"  shipped line : {safeguards.shipped_line(entry)}")
    print(f"  naive line   : {g.naive}")


def _entry(safeguard) -> safeguards.Entry | str:
    """The inventory entry of a kernel safeguard, or why there is none (a message for the learner)."""
    guard = safeguards.get(safeguard) if isinstance(safeguard, str) else None
    if guard is None:
        return f"no safeguard {safeguard!r}: pick an id that safeguard_removal.choices() prints"
    entry = safeguards.locate(guard)
    if guard.atlas is None:
        where = ("a layer's line: it acts before any op" if "/layers/" in entry.path
                 else "on a path the atlas's inputs never take")
        return (f"{safeguard} is {where}, so the atlas cannot see it; pick a kernel safeguard from "
                f"safeguard_removal.choices()")
    return entry


# --- the run -------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Side:
    """One check of the run: the atlas at ordinary inputs, or in the safeguard's range."""
    name: str             # "ordinary" | "in_range" | "shipped" (the control: the shipped code in its range)
    where: str            # "decay 1, q scale 1"
    statuses: tuple       # (setting, status) per setting: "T=33", with the decay too when it varies
    tensors: tuple = ()   # non-finite or beyond tolerance, in any setting
    worst: float = 0.0    # the largest error over the settings (inf: non-finite)
    message: str = ""     # the first error message, when a setting raised

    @classmethod
    def from_json(cls, fields: dict) -> Side:
        return cls(**fields | {"statuses": tuple(map(tuple, fields["statuses"])), "tensors": tuple(fields["tensors"])})

    @property
    def status(self) -> str:
        return max((s for _, s in self.statuses), key=RANK.get)

    def line(self) -> str:
        per_length = ", ".join(f"{setting} {s}" for setting, s in self.statuses)
        if self.status == "right":  # a power of ten above it: two runs differ in the last digits of a BLAS sum
            return f"{per_length} (worst error < {10.0 ** math.ceil(math.log10(max(self.worst, 1e-300))):.0e})"
        if self.status == "raises":
            return f"{per_length} ({self.message})"
        what = "non-finite" if self.status == "nonfinite" else "beyond tolerance"
        return f"{per_length} ({what}: {', '.join(self.tensors)})"


LABELS = {"ordinary": "ordinary inputs", "in_range": "its range", "shipped": "the shipped code, its range"}


@dataclasses.dataclass(frozen=True)
class Removal:
    """What removing one safeguard did: the atlas at ordinary inputs and in its range, or why nothing ran."""
    safeguard: str
    naive: str
    op: str = ""
    problem: str = ""   # why nothing (or not all) ran: the learner's line is unchanged, not valid, or fails
    sides: tuple = ()   # Side per check: ordinary, in_range, shipped

    def side(self, name: str) -> Side | None:
        return next((s for s in self.sides if s.name == name), None)

    def status(self, name: str) -> str | None:
        side = self.side(name)
        return side.status if side else None

    def noticed_by(self) -> str:
        if self.status("ordinary") != "right":
            return "the atlas at ordinary inputs"
        if self.status("in_range") != "right":
            return "the atlas in the safeguard's range only"
        return "neither: no check of this run notices the removal"

    def lines(self) -> list[str]:
        head = [f"removed {self.safeguard}" + (f" from {self.op}" if self.op else "")]
        head += [f"your line: {' / '.join(self.naive.splitlines())}"] if self.naive else []
        if self.problem:
            return head + [self.problem]
        width = max(len(f"{LABELS[s.name]} ({s.where})") for s in self.sides)
        rows = [f"{f'{LABELS[s.name]} ({s.where})':<{width}}: {s.line()}" for s in self.sides]
        return head + rows + [f"noticed by: {self.noticed_by()}"]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def remove(safeguard: str, naive: str | None = None) -> Removal:
    """Remove `safeguard` from a copy of fla_lab (the code of its line replaced by `naive`, default the registry's
    naive form) and run the small atlas sweep on that copy. A line that changes nothing, is not valid Python, or breaks
    the copy gives a Removal whose `problem` says so; nothing here raises on the learner's input. A removal run here
    before any prediction of it has been checked can no longer be predicted (`check_removal`)."""
    removal = _removal(safeguard, naive)
    if removal.sides and _key(removal) not in _PREDICTED:
        _SHOWN_UNPREDICTED.add(_key(removal))
    return removal


def _removal(safeguard, naive) -> Removal:
    entry = _entry(safeguard)
    if isinstance(entry, str):
        return Removal(str(safeguard), str(naive or ""), problem=entry)
    naive = entry.guard.naive if naive in (None, "") else naive
    if not isinstance(naive, str):
        return Removal(safeguard, repr(naive), problem="your line must be a string: the code that replaces the line's")
    return _remove(safeguard, naive)


@functools.lru_cache(maxsize=16)
def _remove(safeguard: str, naive: str) -> Removal:
    """Cached: a check after a run, or the same removal twice, costs nothing."""
    entry = _entry(safeguard)
    g = entry.guard
    problem = line_problem(entry, naive)
    if problem:
        return Removal(safeguard, naive, g.ops[0], problem)
    with tempfile.TemporaryDirectory(prefix="fla_lab_removal_") as folder:
        copy = copy_package(Path(folder))
        target = copy / Path(entry.path).relative_to("fla_lab")
        target.write_text(markers.replace(target.read_text(), "safeguard", g.id, naive, entry.path))
        found = _run_copy(Path(folder), g.ops[0], g.atlas)
    if isinstance(found, str):
        return Removal(safeguard, naive, g.ops[0], found)
    sides = tuple(found) + (_shipped(g.ops[0], g.atlas),)
    raised = next((s for s in sides if s.status == "raises"), None)
    problem = f"the kernel with your line raises: {raised.message}" if raised else ""
    return Removal(safeguard, naive, g.ops[0], problem, sides)


def line_problem(entry: safeguards.Entry, naive: str) -> str:
    """Why `naive` cannot be run in place of the shipped line's code (empty when it can): it must parse and change
    the code."""
    text = safeguards.source(entry)
    try:
        tree = ast.parse(safeguards.with_naive(entry, naive))
    except SyntaxError as exc:
        return (f"your line is not valid Python there ({exc.msg}): it replaces the shipped line's code, and the "
                f"lines around it stay as they are")
    if ast.dump(tree) == ast.dump(ast.parse(text)):  # spacing and comments change nothing that runs
        return "your line is the shipped code (up to spacing and comments): it removes nothing"
    return ""


def copy_package(folder: Path) -> Path:
    """The installed fla_lab package (where `fla_lab.__file__` is: no git needed) copied into `folder`."""
    import fla_lab

    source = Path(fla_lab.__file__).resolve().parent
    return Path(shutil.copytree(source, folder / "fla_lab", ignore=shutil.ignore_patterns("__pycache__")))


WORKER = "from fla_lab.teaching.lessons import safeguard_removal as s; s.worker()"


def _run_copy(folder: Path, op: str, atlas_range: dict) -> list[Side] | str:
    """Run `worker` in a subprocess with the copy first on the path; its sides, or what went wrong, in words."""
    path = [str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONDONTWRITEBYTECODE="1")
    argument = json.dumps({"op": op, "range": atlas_range, "copy": str(folder / "fla_lab")})
    try:
        done = subprocess.run([sys.executable, "-c", WORKER, argument], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the run on the copy took longer than {TIMEOUT_S} s and was stopped"
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not result:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1].replace(str(folder), "<copy>")
        return f"the copy of fla_lab with your line fails before any kernel runs: {last[:200]}"
    return [Side.from_json(side) for side in json.loads(result[-1][len("RESULT "):])]


def _grid(side: str, atlas_range: dict) -> dict:
    """`atlas.settings` keywords of one side: ordinary inputs, or those with the safeguard's range on its axes."""
    grid = dict(ORDINARY, lengths=LENGTHS, dtypes=("fp32",), combinations=[(True, True)])
    return grid | (atlas_range if side != "ordinary" else {})


def measure_side(name: str, op: str, atlas_range: dict) -> Side:
    """The atlas of `op` (as the running fla_lab has it) on one side's settings, summed up."""
    from fla_lab.tools import atlas
    from fla_lab.spec import registry

    grid = _grid(name, atlas_range)
    records = atlas.sweep(atlas.settings([op], variants=[registry.FIXED], **grid, **SHAPE), progress=False)
    # in the atlas's order (o, final states, gradients), each once
    tensors = dict.fromkeys(n for r in records for n in [*r.get("nonfinite", {}), *r.get("beyond_tolerance", [])])
    message = next((r["message"] for r in records if r["status"] == "raises"), "")
    where = safeguards.describe_range({k: grid[k] for k in (ORDINARY if name == "ordinary" else atlas_range)})
    return Side(name, where, tuple((_setting(r, grid), r["status"]) for r in records), tuple(tensors),
                max(atlas.worst_error(r) for r in records), message[:160])


def _setting(record: dict, grid: dict) -> str:
    """"T=33", with each other axis the side sweeps more than one value of ("T=33 m=10")."""
    named = {"decays": ("decay", "m={:g}"), "q_scales": ("q_scale", "q x{:g}"), "dtypes": ("dtype", "{}")}
    return " ".join([f"T={record['T']}"] + [form.format(record[key]) for axis, (key, form) in named.items()
                                            if len(grid.get(axis, ())) > 1])


def worker() -> None:
    """The subprocess's side: assert it imported the copy, then print the two sides as one `RESULT` JSON line."""
    import fla_lab

    argument = json.loads(sys.argv[-1])
    imported = Path(fla_lab.__file__).resolve().parent
    assert imported == Path(argument["copy"]).resolve(), f"imported {imported}, not the copy"
    sides = [measure_side(name, argument["op"], argument["range"]) for name in SIDES]
    print("RESULT " + json.dumps([vars(s) for s in sides]))


@functools.lru_cache(maxsize=16)
def _shipped_cached(op: str, atlas_range: str) -> Side:
    return measure_side("in_range", op, json.loads(atlas_range))


def _shipped(op: str, atlas_range: dict) -> Side:
    """The control: the shipped code in the same range, in this process (the installed package)."""
    return dataclasses.replace(_shipped_cached(op, json.dumps(atlas_range, sort_keys=True)), name="shipped")


# --- the check -----------------------------------------------------------------------------------------------------
# A prediction comes before its run. Per removal (a safeguard and its naive line, up to spacing and comments), this
# process keeps the first prediction checked before its statuses were shown; a later, different one does not count.

_PREDICTED: dict[tuple, tuple[str, str]] = {}  # removal -> (ordinary, in_range) of its first prediction
_SHOWN_UNPREDICTED: set[tuple] = set()          # removals whose statuses `remove()` printed before any prediction


def _key(removal: Removal) -> tuple[str, str]:
    """The removal as the record knows it: the safeguard, and the digest of its file with the naive line in (so a
    line respaced, or with a comment added, is the same removal)."""
    tree = ast.dump(ast.parse(safeguards.with_naive(_entry(removal.safeguard), removal.naive)))
    return removal.safeguard, hashlib.sha256(tree.encode()).hexdigest()[:16]


def _forget_predictions() -> None:
    """Clear this process's record of predictions (a fresh kernel starts with none)."""
    _PREDICTED.clear()
    _SHOWN_UNPREDICTED.clear()


def check_removal(prediction: dict) -> exercises.Verdict:
    """PASS when the predicted statuses, `prediction["ordinary"]` (decay 1, q scale 1) and `prediction["in_range"]`
    (the safeguard's range), are what the atlas finds with `prediction["safeguard"]` removed (its code replaced by
    `prediction["naive"]`, default the registry's naive form). The removal runs only once both are written; the first
    prediction of a removal is the one graded (a different one, once its statuses were shown, gets NOT YET)."""
    if not isinstance(prediction, dict):
        return exercises.Verdict(EXERCISE, False, [f"the prediction is a {type(prediction).__name__}, not a dict"],
                                 ('prediction = {"safeguard": ..., "naive": None, "ordinary": ..., '
                                  '"in_range": ...}, as the exercise cell writes it',))
    unwritten = _unwritten(prediction)
    if unwritten is not None:  # a Verdict that did not pass is falsy
        return unwritten
    removal = _removal(prediction["safeguard"], prediction.get("naive"))
    if removal.problem:  # nothing was measured, so nothing is recorded
        return exercises.Verdict(EXERCISE, False, removal.lines(), _problem_hints(removal))
    key, mine = _key(removal), tuple(prediction[side] for side in SIDES)
    if key not in _PREDICTED and key not in _SHOWN_UNPREDICTED:
        _PREDICTED[key] = mine  # the first prediction of this removal, before anything of its run was shown
    first = _PREDICTED.get(key)
    if first != mine:
        return _late(removal, mine, first)
    facts = removal.lines() + [f"you predicted {side}: {prediction[side]} (the run: {removal.status(side)})"
                               for side in SIDES]
    wrong = [side for side in SIDES if prediction[side] != removal.status(side)]
    if wrong:
        facts.append("your prediction is recorded as this removal's, made before its run: the run's statuses are "
                     "shown only now, and a different prediction of this removal no longer counts")
        return exercises.Verdict(EXERCISE, False, facts, _prediction_hints(removal, wrong[0]))
    return exercises.Verdict(EXERCISE, True, facts)


def _late(removal: Removal, mine: tuple, first: tuple | None) -> exercises.Verdict:
    """NOT YET for a prediction of a removal whose statuses were already shown: it is not a prediction."""
    said = ", ".join(f"{side} {value}" for side, value in zip(SIDES, mine))
    if first is None:
        before = "its statuses were shown by safeguard_removal.remove() before any prediction of it"
    else:
        before = (f"your first prediction of it ({', '.join(f'{s} {v}' for s, v in zip(SIDES, first))}) was checked "
                  "and its statuses shown")
    facts = [f"removed {removal.safeguard}" + (f" from {removal.op}" if removal.op else ""),
             f"this prediction: {said}",
             f"it does not count: {before}, and a prediction made after the run is not one"]
    return exercises.Verdict(EXERCISE, False, facts, exercises.hints(
        "pick another safeguard from safeguard_removal.choices() (or write a naive line of your own) and predict it "
        "before its run: safeguard_removal.show(id) prints its code and what it protects against",
        "a removal is predicted once, before its statuses are shown: this one's run is already known to you, so it "
        "can explain, not test, your prediction",
        "read this removal's run (print(safeguard_removal.remove(...))) to see why your first prediction differed, "
        "then predict another"))


def _unwritten(prediction: dict) -> exercises.Verdict | None:
    """NOT YET, before any run, while the safeguard or a status is missing or not one of the words."""
    facts = []
    if not prediction.get("safeguard"):
        facts.append("safeguard: (empty) (an id that safeguard_removal.choices() prints)")
    for side in SIDES:
        value = prediction.get(side) or ""
        if value not in PREDICTABLE:
            facts.append(f"{side}: {value or '(empty)'} (choose one of {', '.join(PREDICTABLE)})")
    if not facts:
        return None
    facts.append("the removal runs once your prediction is written: a prediction made after the run is not one")
    return exercises.Verdict(EXERCISE, False, facts, exercises.hints(
        "safeguard_removal.show(id) prints a safeguard's shipped code, its naive form and what it protects against",
        "At decay 1 and q scale 1, does any number this line guards come near the limits of fp32 (exp overflows "
        "above 88)? In its range, what does exp give there, and what does that value make of the sums after it?",
        'Two of right, wrong and nonfinite, e.g. "ordinary": "right", "in_range": "wrong" if you expect only its '
        "range to notice, with finite values"))


def _problem_hints(removal: Removal) -> tuple[str, ...]:
    if removal.problem.startswith(("no safeguard", removal.safeguard + " is a layer")):
        return ("print the choices again: safeguard_removal.choices()",)
    return exercises.hints(
        f"safeguard_removal.show({removal.safeguard!r}) prints the shipped line that your line replaces",
        "your line replaces that line's code (its indentation stays) and nothing around it; it must change what the "
        "kernel computes, and use only names the kernel has there",
        'set "naive": None to run the registry\'s naive form')


def _prediction_hints(removal: Removal, side: str) -> tuple[str, ...]:
    """Tiers for the first side predicted wrong: where to look, why, the word."""
    found = removal.status(side)
    where = (f"Read the run's line for {LABELS[side]} above: it is measured, your prediction was not."
             if side == "ordinary" else f"Compare the run's line for {LABELS[side]} with the control's (the shipped "
                                        "code in the same range).")
    guard = _entry(removal.safeguard).guard
    if found == "right" and guard.gpu_only:
        why = ("This is a precision safeguard for compiled code: its naive form lets a GPU's dot round its inputs "
               "(to TF32's 10 mantissa bits, or to 16 bits). The interpreter computes every dot in IEEE fp32, so "
               "here both forms give the same numbers; only a run on a GPU can tell them apart.")
    elif found == "right" and guard.protects == "precision":
        why = ("This is a precision safeguard: its naive form keeps fewer bits, which costs accuracy only where the "
               "rounding is large against the tolerance (a 16-bit dtype, large values); at these inputs it stays "
               "within the tolerance.")
    elif found == "right":
        why = ("The naive form computes the same number in exact arithmetic: it only differs once a value leaves "
               "fp32's range, and these inputs never take it there.")
    elif found == "nonfinite":
        why = ("exp of a large positive number is inf in fp32; inf - inf, 0 * inf and inf / inf are NaN, and a "
               "NaN spreads to every sum it enters: non-finite, not merely wrong.")
    else:
        why = ("The values stay finite but differ from float64's beyond the tolerance (your line rounds differently, "
               "or computes another number): wrong, not non-finite.")
    return exercises.hints(where, why, f'"{side}": "{found}"')

"""Mutation check: does the toolkit catch kernel mistakes nobody has catalogued?

Each mutation below is one plausible one-line slip in a Triton kernel: the line that its marker `# mutation: <id>`
marks (`fla_lab.spec.markers`) gets the code `new` in place of its own. For each, one at a time, the script exports
HEAD's tracked files into a fresh temporary folder (`git archive HEAD`: the working tree is never touched), applies
the edit there, and runs, each in its own subprocess with the copy first on PYTHONPATH and under a timeout:

  1. tests   : `pytest -q -x` on a small selection of the op's test files (caught: a test failed; an import or
               collection error is reported as "error", not as caught);
  2. atlas   : one small sweep of the op (fp32 and bf16, decays 0.1 and 100, T 33 and 64, B=H=1, K=V=M=16, all four
               (initial state, final-state cotangent) combinations): flagged when any record is not "right";
  3. locator : the op under `hunt.locate()` on a small input with a backward, with an initial state and a final-state
               cotangent, then without an initial state: does the report name the op, and the mutated kernel?
     audit   : the same two steps under `audit.audit()`: is a call of the op flagged? (the audit names ops, not
               kernels: "op only").

Besides the slips listed here, `safeguard_mutations()` adds one 'naive form' per numerical safeguard of
`fla_lab.spec.safeguards` (the line its `# safeguard: <id>` marker marks, with the naive code). Its tests stage runs
the safeguard's own tests; its atlas sweep adds the safeguard's range (`Safeguard.atlas`: a strong decay, large
query scales) to the grid, and its locator/audit step uses that range's query scale. A layer's safeguard (no `atlas`
range) gets the tests only: the atlas and the audit compare an op with float64 on the op's own inputs, which that
line has already made.
The report has one section per kind: the slips, and the safeguards (per inventory entry: which tests, which atlas
settings, whether the audit flags it).

    .venv/bin/python -m dev.mutation_check --list
    .venv/bin/python -m dev.mutation_check --only gla_diag_mask_after_exp rwkv7_exclusive_pair_inclusive
    .venv/bin/python -m dev.mutation_check            # all (each takes minutes under the interpreter)
    .venv/bin/python -m dev.mutation_check --kind safeguard --jobs 14   # on a machine with the cores

Writes benchmarks/results/mutations.json and mutations.md (merged by id with what is already there).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fla_lab.spec import markers, safeguards

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
STAGES = ("tests", "atlas", "locate")
TIMEOUTS = {"tests": 420, "atlas": 600, "locate": 420}


@dataclass(frozen=True)
class Mutation:
    id: str
    op: str       # the registry op the check runs
    kernel: str   # the Triton kernel (as launched: the tracer's name) the edit lands in
    new: str      # the code that replaces the code of the marked line (its indentation kept)
    what: str
    tests: tuple = ()  # pytest arguments instead of the op's TESTS (a safeguard's own test)
    kind: str = "slip"  # "slip": an uncatalogued mistake; "safeguard": a safeguard's naive form
    atlas_range: dict | None = None  # a safeguard's range (`Safeguard.atlas`), added to the atlas grid
    op_level: bool = True  # False: upstream of the atlas's inputs (a layer's line, ABC's gates): tests only
    gpu_only: bool = False  # the naive form changes only compiled code: run it where CUDA is

    @property
    def marker(self) -> str:
        """The kind of the marker that names the line: a slip's own `# mutation: <id>`, or the safeguard's."""
        return "mutation" if self.kind == "slip" else "safeguard"

    @property
    def path(self) -> str:
        """The file of the marked line, relative to the repository root."""
        return markers.find(self.marker, self.id).path

    @property
    def q_scale(self) -> float:
        """The query scale of the locator/audit step: the largest of the safeguard's range, else 1."""
        return max((self.atlas_range or {}).get("q_scales", (1.0,)))

    @property
    def decay(self) -> float | None:
        """The decay of the locator/audit step: the largest of the safeguard's range, else the step's own."""
        decays = (self.atlas_range or {}).get("decays")
        return max(decays) if decays else None


MUTATIONS = [
    Mutation("gla_diag_mask_after_exp", "chunk_gla", "gated_scores_kernel",
             "return tl.exp(b_gq - b_gk) * causal.to(tl.float32)",
             "diagonal block: the causal mask multiplies after exp instead of zeroing the exponent "
             "(exp(+large) = inf above the diagonal, inf * 0 = NaN)"),
    Mutation("gsa_value_scores_strict_causal", "chunk_gsa", "plain_scores_kernel",
             "causal = o_c[:, None] > o_c[None, :]",
             "off-by-one causal mask in the value side's scores: `>` drops the diagonal"),
    Mutation("rwkv7_exclusive_pair_inclusive", "chunk_rwkv7", "dplr_scores_kernel",
             "b_a = tl.load(a + rows_t[:, None] * HK + o_k[None, :], mask=m_a, other=0).to(tl.float32)",
             "off-by-one in the exclusive scores: A_ab[t + 1, s] reads a_t, so row t sees its own removal term"),
    Mutation("gla_dht_dropped_without_h0", "chunk_gla", "chunk_bwd_dh_kernel", "if USE_DHT and STORE_DH0:",
             "the final-state cotangent is loaded only when dh0 is stored: without an initial state (truncated BPTT) "
             "dht is dropped"),
    Mutation("rwkv6_fused_h0_only_with_ht", "fused_recurrent_rwkv6", "fused_recurrent_fwd_kernel",
             "if USE_H0 and STORE_HT:",
             "the initial state is added only when the final state is requested (guard on the wrong flag)"),
    Mutation("gla_ht_before_last_decay", "chunk_gla", "chunk_fwd_h_kernel",
             "b_h = b_h * tl.exp(tl.where(i_t < NT - 1, b_glast, 0))[:, None] + mma(b_kt, b_v, DOT)",
             "the final state is stored before the last chunk's decay of the carried state"),
    Mutation("gla_dk_reference_row_past_subchunk", "chunk_gla", "chunk_bwd_dqk_kernel",
             "b_gn = tl.load(gi + tl.minimum(i_start + BC, T - 1) * HD + o_d, mask=m_d, other=0)",
             "wrong reference row in cols_from_later_subchunks: the first row of the next sub-chunk instead of this "
             "one's last"),
    Mutation("gsa_softmax_wrong_axis", "chunk_gsa", "slot_softmax_fwd_kernel",
             "b_p = b_e / tl.maximum(tl.sum(b_e, axis=0), 1e-30)[None, :]",
             "slot softmax normalised over the wrong axis (rows of the block instead of the M slots)"),
    Mutation("rwkv6_chunk_o_missing_scale", "chunk_rwkv6", "chunk_fwd_o_kernel",
             "tl.store(o + bos * V + o_t[:, None] * H * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_tv)",
             "the output forgets `scale`"),
    Mutation("rwkv7_dh_decay_sign", "chunk_rwkv7", "dplr_bwd_dh_kernel",
             "b_rt = load_cols(r, o_t, o_k, m_kt, HK) * tl.exp(-b_gt)",
             "wrong sign in a decay exponent of the state adjoint: exp(-G) grows instead of decaying"),
    Mutation("rwkv6_fused_bonus_dropped", "fused_recurrent_rwkv6", "fused_recurrent_fwd_kernel",
             "b_o = tl.sum(b_h * b_q[:, None], axis=0)",
             "the RWKV6 bonus `u` term is dropped from the output"),
    Mutation("rwkv6_chunk_key_load_no_other", "chunk_rwkv6", "chunk_fwd_h_kernel",
             "b_kt = tl.load(k + o_t[None, :] * H * K + o_k[:, None]).to(tl.float32)",
             "the key load of the state pass loses its mask and `other=0`: rows past T read whatever follows"),
    Mutation("rwkv7_fused_sa_wrong_axis", "fused_recurrent_rwkv7", "fused_recurrent_rwkv7_fwd_kernel",
             "b_sa = tl.sum(b_a[:, None] * b_h, axis=1)",
             "a^T S reduced over the wrong axis in the step transition (square tiles hide the shape error)"),
]


def safeguard_mutations() -> list[Mutation]:
    """One naive-form mutation per safeguard of `fla_lab.spec.safeguards` that no slip above already reverts: the
    marked line's code replaced by its naive form (for a bug switch's safeguard: the fixed path made the switch's
    line), caught first by the safeguard's own tests."""
    return [Mutation(e.guard.id, e.guard.ops[0], e.function, e.guard.naive, f"safeguard reverted: {e.guard.what}",
                     tests=e.guard.catching_tests(), kind="safeguard", atlas_range=e.guard.atlas,
                     op_level=e.guard.atlas is not None, gpu_only=e.guard.gpu_only)
            for e in safeguards.inventory() if e.guard.mutation is None]


def mutation_of(guard) -> str:
    """The id of the mutation that reverts a safeguard: its own, or the slip that already does."""
    return guard.mutation or guard.id


MUTATIONS += safeguard_mutations()

# --- tests per op: small and fast ---------------------------------------------------------------------------------
TESTS = {  # each op's tests, and its case of tests/test_final_state_flag.py (the output without the final state)
    "chunk_gla": ["tests/test_chunk.py", "tests/test_final_state_flag.py", "-k", "gla or agrees"],
    "chunk_rwkv6": ["tests/test_chunk.py", "tests/test_final_state_flag.py", "-k", "rwkv6 or agrees or scale"],
    "fused_recurrent_rwkv6": ["tests/test_recurrent.py", "tests/test_final_state_flag.py", "-k", "rwkv6 or scale"],
    "fused_recurrent_rwkv7": ["tests/test_rwkv7.py", "tests/test_final_state_flag.py", "-k", "fused"],
    "chunk_gsa": ["tests/test_gsa.py", "tests/test_final_state_flag.py", "-k",
                  "test_chunk_gsa or vanilla or fixed_path or (final_state and chunk_gsa)"],
    "fused_recurrent_gsa": ["tests/test_fused_recurrent_gsa.py", "tests/test_final_state_flag.py", "-k",
                            "not final_state or fused_recurrent_gsa"],
    "chunk_rwkv7": ["tests/test_chunk_rwkv7.py", "tests/test_final_state_flag.py", "-k",
                    "exact or agrees or (final_state and chunk_rwkv7)"],
}


def mutated(m: Mutation, text: str, path: str = "its file") -> str:
    """`text`, the file of the mutation's marked line, with the mutation applied. SystemExit when the marker does
    not mark exactly one line, or the edit is not valid Python or changes nothing that runs."""
    try:
        new = markers.replace(text, m.marker, m.id, m.new, path)
        changed = ast.dump(ast.parse(new)) != ast.dump(ast.parse(text))
    except (LookupError, SyntaxError) as exc:
        raise SystemExit(f"mutation {m.id}: {exc}") from None
    if not changed:
        raise SystemExit(f"mutation {m.id}: `new` is the marked line's code (up to spacing and comments)")
    return new


def head_text(path: str) -> str:
    return subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def export_head(prefix: str) -> Path:
    """HEAD's tracked files in a fresh temporary folder (the working tree is never touched)."""
    dest = Path(tempfile.mkdtemp(prefix=prefix))
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def export_copy(m: Mutation) -> Path:
    """HEAD's tracked files in a fresh folder, with the mutation applied to the line its marker marks there."""
    dest = export_head(f"mut-{m.id}-")
    path = markers.find(m.marker, m.id, dest / "fla_lab").path
    target = dest / path
    target.write_text(mutated(m, target.read_text(), path))
    return dest


def _run(cmd, copy: Path, timeout: int) -> tuple[int | None, str, float]:
    path = os.pathsep.join(p for p in (str(copy), os.environ.get("PYTHONPATH", "")) if p)  # the copy first
    env = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        return None, out.decode(errors="replace") if isinstance(out, bytes) else out, time.perf_counter() - start


def stage_tests(m: Mutation, copy: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
           *(m.tests or TESTS[m.op])]
    rc, out, secs = _run(cmd, copy, TIMEOUTS["tests"])
    first = next((line.split(" ", 1)[1].split(" - ")[0] for line in out.splitlines() if line.startswith("FAILED ")),
                 None)
    if rc is None:
        verdict = "timeout"
    elif rc == 1 and first:
        verdict = "caught"
    elif rc == 0:
        verdict = "missed"
    else:
        verdict = "error"  # collection/import error, usage error, interrupted: not a test catching it
    tail = "\n".join(out.strip().splitlines()[-3:])
    return {"verdict": verdict, "first_failing": first, "rc": rc, "seconds": round(secs, 1), "tail": tail[-600:]}


def stage_worker(stage: str, m: Mutation, copy: Path) -> dict:
    cmd = [sys.executable, "-m", "dev.mutation_check", "--worker", stage, "--only", m.id]  # the copy's
    rc, out, secs = _run(cmd, copy, TIMEOUTS[stage])
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if rc is None:
        return {"verdict": "timeout", "seconds": round(secs, 1)}
    if not lines:
        return {"verdict": "error", "rc": rc, "seconds": round(secs, 1), "tail": out.strip()[-800:]}
    return json.loads(lines[-1][7:]) | {"seconds": round(secs, 1)}


# --- workers: run inside the mutated copy ---------------------------------------------------------------------------

SHAPE = dict(B=1, H=1, K=16, V=16, M=16)


GRID = dict(dtypes=("fp32", "bf16"), decays=(0.1, 100.0), lengths=(33, 64), q_scales=(1.0,))
ORDINARY = dict(decay=0.1, q_scale=1.0)  # the grid's ordinary corner: weak decay, queries as drawn


def atlas_grid(m: Mutation) -> dict:
    """The sweep's grid: GRID, with the safeguard's range added to each axis it names."""
    grid = dict(GRID)
    for axis, values in (m.atlas_range or {}).items():
        grid[axis] = tuple(sorted(set(grid.get(axis, ())) | {float(v) if axis in ("decays", "q_scales") else v
                                                             for v in values}))
    return grid


def worker_atlas(m: Mutation) -> dict:
    from fla_lab.tools import atlas

    todo = atlas.settings([m.op], variants=["fixed"], **atlas_grid(m), **SHAPE)
    records = atlas.sweep(todo, cache=None, progress=False)
    bad = [{"dtype": r["dtype"], "decay": r["decay"], "T": r["T"], "q_scale": r.get("q_scale", 1.0),
            "combination": atlas.combination_name(r.get("h0", True), r.get("dht", True)), "status": r["status"],
            "tensors": sorted(set(r.get("beyond_tolerance") or []) | set(r.get("nonfinite") or {})),
            "message": r.get("message", "")[:160]} for r in records if r["status"] != "right"]
    ordinary = [b for b in bad if all(b[k] == v for k, v in ORDINARY.items())]
    return {"verdict": "flagged" if bad else "missed", "settings": len(records), "not_right": len(bad),
            "statuses": sorted({b["status"] for b in bad}), "at_ordinary_inputs": bool(ordinary), "bad": bad}


def _step(op, x: dict, final_state: bool = True):
    import torch

    o, ht = op(**x, output_final_state=final_state)
    loss = o.float().square().mean()
    for s in (ht if isinstance(ht, tuple) else (ht,)) if final_state else ():
        if s is not None:
            loss = loss + (s.float() * torch.linspace(-1, 1, s.numel()).view_as(s)).sum()
    loss.backward()


def _inputs(op: str, h0: bool, m: Mutation):
    from fla_lab.tools import atlas
    from fla_lab.spec import harness, registry
    from fla_lab import runtime

    spec = registry.get(op)
    decay = m.decay or (None if "rwkv7" in op else 30.0)  # RWKV-7's own range unless a safeguard names one
    x = spec.inputs(registry.Shape(1, 40, 1, 16, 16, 16), decay=decay, initial_state=h0, seed=1)
    return harness.leaves(atlas.scale_queries(x, m.q_scale), None, runtime.device())


def worker_locate(m: Mutation) -> dict:
    import warnings

    from fla_lab.tools import audit, hunt
    from fla_lab import ops
    from fla_lab.ops import contract

    warnings.simplefilter("ignore")
    out = {}
    # the third case: a model that never asks for the final state (output_final_state=False)
    for case, h0, final_state in (("h0,dht", True, True), ("no-h0,dht", False, True), ("h0,no-ht", True, False)):
        entry = {}
        try:
            with contract.value_checks(False):
                with hunt.locate() as found:
                    _step(lambda **kw: getattr(ops, m.op)(**kw), _inputs(m.op, h0, m), final_state)
            d = found.report.diagnosis
            entry["locator"] = {"event": found.report.event.what if found.report.event else None,
                                "op": d.op if d else None, "kernel": d.kernel if d else None,
                                "cause": d.cause if d else None}
        except Exception as exc:  # the locator itself failing is a result
            entry["locator"] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:160]}"}
        try:
            with contract.value_checks(False):
                with audit.audit() as rec:
                    _step(lambda **kw: getattr(ops, m.op)(**kw), _inputs(m.op, h0, m), final_state)
                wrong = rec.wrong()
            entry["audit"] = {"flagged_ops": [r.call.op for r in wrong],
                              "worst": [f"{r.worst} {r.errors[r.worst]:.2e}" for r in wrong]}
        except Exception as exc:
            entry["audit"] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:160]}"}
        out[case] = entry
    loc = [e["locator"] for e in out.values()]
    aud = [e["audit"] for e in out.values()]
    return {"cases": out,
            "locator_op": any(x.get("op") == m.op for x in loc),
            "locator_kernel": any(x.get("kernel") == m.kernel for x in loc),
            "locator_kernels": sorted({x.get("kernel") for x in loc if x.get("kernel")}),
            "audit_op": any(m.op in x.get("flagged_ops", []) for x in aud)}


# --- the table ------------------------------------------------------------------------------------------------------

def _yes(b) -> str:
    return "yes" if b else "no"


def _setting(b: dict) -> str:
    q = f" q x{b['q_scale']:g}" if b.get("q_scale", 1.0) != 1.0 else ""
    return f"{b['combination']} {b['dtype']} m={b['decay']:g}{q} T={b['T']}: {b['status']} {','.join(b['tensors'])}"


def atlas_cell(a: dict) -> str:
    if a.get("verdict") != "flagged":
        return a.get("verdict", "-") + (f" ({a['settings']} settings)" if "settings" in a else "")
    return (f"flagged {a['not_right']}/{a['settings']} ({', '.join(a['statuses'])}); e.g. "
            + "; ".join(_setting(b) for b in a["bad"][:2]))


def row(r: dict) -> str:
    t, a, loc = r.get("tests", {}), r.get("atlas", {}), r.get("locate", {})
    tests = t.get("verdict", "-") + (f" (`{t['first_failing']}`)" if t.get("first_failing") else "")
    atl = atlas_cell(a)
    if "locator_op" in loc:
        found = loc["locator_kernels"]
        locs = (f"op {_yes(loc['locator_op'])}, kernel {_yes(loc['locator_kernel'])}"
                + (f" ({', '.join(found)})" if found and not loc["locator_kernel"] else ""))
        aud = f"{_yes(loc['audit_op'])} (op only)"
    else:
        locs = aud = loc.get("verdict", "-")
    secs = "/".join(f"{r.get(s, {}).get('seconds', 0):.0f}" for s in STAGES)
    return f"| {r['id']} | {r['op']} | `{r['kernel']}` | {tests} | {atl} | {locs} | {aud} | {secs} |"


NOTES = (
    "Locator: it replays only on a non-finite value, so it names op and kernel only where a mutation makes one on "
    "its T=40 inputs (`gla_diag_mask_after_exp`: `gated_scores_kernel`, exp_overflow, diagonal sub-chunk blocks); a "
    "finite mutation is the audit's (it names the op, not the kernel) and the atlas's.",
    "`gla_dk_reference_row_past_subchunk` is an equivalent mutant, not a missed bug: the reference row cancels in "
    "exp(gq - gn) * exp(gn - gk), and the next sub-chunk's first row still lies between every query and key row of "
    "that block, so both factors stay <= 1 (notebook 00: any reference row between s and t is exact).",
    "`rwkv6_fused_h0_only_with_ht` was missed by every tool in the first run (2026-11-26): every test, atlas setting "
    "and replay asked for the final state. `tests/test_final_state_flag.py` (the output may not depend on "
    "`output_final_state`) and the audit's replay of a call as it was made (`output_final_state=False`) were added "
    "for it.",
    "`rwkv6_chunk_key_load_no_other`: whether the unmasked load reads NaN/inf depends on the memory after the "
    "tensor, so the tests and the atlas catch it on some shapes and the T=40 locator/audit step may not: a flaky "
    "catch, as such bugs are.",
)


def safeguard_cells(r: dict) -> tuple[str, str, str]:
    """(tests, atlas, audit) of one safeguard's naive form, for its row of the safeguards' table."""
    t, a, loc = r.get("tests", {}), r.get("atlas", {}), r.get("locate", {})
    tests = t.get("verdict", "-") + (f" (`{t['first_failing'].split('::')[-1]}`)" if t.get("first_failing") else "")
    if a.get("verdict") == "n/a":
        where = "a layer's line" if "/layers/" in r["path"] else "a path the atlas's inputs never take"
        return tests, f"n/a ({where})", "n/a"
    if a.get("verdict") == "flagged":
        where = "at ordinary inputs too" if a.get("at_ordinary_inputs") else "only in its range"
        atl = f"flagged {a['not_right']}/{a['settings']}, {where}; e.g. {_setting(a['bad'][0])}"
    else:
        atl = atlas_cell(a)
    aud = _yes(loc["audit_op"]) if "audit_op" in loc else loc.get("verdict", "-")
    return tests, atl, aud


def safeguard_summary(results: dict) -> dict:
    """Counts over the inventory: every entry's naive form, and who catches it."""
    entries = list(safeguards.REGISTRY)
    rows = {g.id: results.get(mutation_of(g)) for g in entries}
    ran = {i: r for i, r in rows.items() if r}
    op_level = {i: r for i, r in ran.items() if r.get("atlas", {}).get("verdict") != "n/a"}
    caught = {i for i, r in ran.items() if r["tests"]["verdict"] == "caught"
              or r.get("atlas", {}).get("verdict") == "flagged" or r.get("locate", {}).get("audit_op")}
    return {"entries": len(entries), "ran": len(ran), "tests": sum(r["tests"]["verdict"] == "caught"
                                                                   for r in ran.values()),
            "op_level": len(op_level), "atlas": sum(r["atlas"]["verdict"] == "flagged" for r in op_level.values()),
            "atlas_only_in_range": sum(r["atlas"]["verdict"] == "flagged" and not r["atlas"].get("at_ordinary_inputs")
                                       for r in op_level.values()),
            "audit": sum(bool(r.get("locate", {}).get("audit_op")) for r in op_level.values()),
            "caught_by_one": len(caught), "missed": sorted(set(ran) - caught), "not_run": sorted(set(rows) - set(ran)),
            "days": sorted({r["finished"][:10] for r in ran.values()})}


def safeguard_section(results: dict) -> list[str]:
    s = safeguard_summary(results)
    lines = ["## Safeguards: each naive form, and who catches it", "",
             f"One row per entry of `fla_lab.spec.safeguards` ({s['entries']}): its shipped line replaced by the naive "
             "form, on the CPU under the interpreter, or on a GPU for the naive forms that change only compiled "
             "code (16-bit or TF32 dots). Tests: the entry's own tests. Atlas: the grid above plus the entry's range (`Safeguard.atlas`); "
             "'at ordinary inputs' means flagged at m=0.1 with the queries as drawn, 'only in its range' means only "
             "at the strong decay or the large query scale. Audit: the T=40 step at the entry's query scale.", "",
             f"**{s['ran']} of {s['entries']} ran** ({', '.join(s['days'])}). The tests catch {s['tests']} of {s['ran']}; of the "
             f"{s['op_level']} kernel safeguards the atlas flags {s['atlas']} ({s['atlas_only_in_range']} only in "
             f"their range) and the audit {s['audit']}; caught by at least one: {s['caught_by_one']} of {s['ran']}"
             + (f"; missed: {', '.join(s['missed'])}" if s["missed"] else "")
             + (f"; not run: {', '.join(s['not_run'])}" if s["not_run"] else "") + ".", "",
             "| safeguard | protects | op | naive form reverted by | ran on | tests | atlas | audit |",
             "|---|---|---|---|---|---|---|---|"]
    for g in safeguards.REGISTRY:
        r = results.get(mutation_of(g))
        cells = safeguard_cells(r) if r else ("not run", "not run", "not run")
        where = "-" if not r else "CPU" if r["device"].startswith("CPU") else r["device"].removeprefix("NVIDIA ")
        lines.append(f"| `{g.id}` | {g.protects} | {g.ops[0]} | `{mutation_of(g)}` | {where} | " + " | ".join(cells)
                     + " |")
    return lines


KEPT = 4  # the not-right settings kept per record (the count and statuses cover the rest)


def write(results: dict) -> str:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for r in results.values():
        if len(r.get("atlas", {}).get("bad", ())) > KEPT:
            r["atlas"]["bad"] = r["atlas"]["bad"][:KEPT]
    (RESULTS / "mutations.json").write_text(json.dumps(list(results.values()), indent=1))
    order = [m.id for m in MUTATIONS if m.kind == "slip"]
    ran = [results[i] for i in order if i in results]
    missing = [i for i in order if i not in results]
    lines = ["# Mutation check: uncatalogued kernel mistakes, and who catches them", "",
             "`dev/mutation_check.py`: one mutation at a time on an export of HEAD, on the CPU under the "
             "Triton interpreter. Tests: a small selection per op (`pytest -x`). Atlas: fp32+bf16, decays 0.1 and "
             "100, T 33 and 64, B=H=1, K=V=M=16, all four (h0, dht) combinations. Locator/audit: T=40, one step with "
             "an initial state and one without, both with a final-state cotangent, and one with an initial state that never "
             "asks for the final state (`output_final_state=False`). Seconds: tests/atlas/locate.", ""]
    if missing:
        lines += [f"**PARTIAL**: {len(ran)} of {len(order)} mutations ran; not run: {', '.join(missing)}.", ""]
    lines += ["| id | op | kernel | tests | atlas | locator (op, kernel) | audit (op flagged) | s |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [row(r) for r in ran]
    lines += ["", "What each mutation is:", ""]
    lines += [f"- `{m.id}` ({m.path}): {m.what}" for m in MUTATIONS if m.id in results and m.kind == "slip"]
    lines += ["", "Notes:", ""] + [f"- {note}" for note in NOTES]
    lines += [""] + safeguard_section(results)
    text = "\n".join(lines) + "\n"
    (RESULTS / "mutations.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="ID")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="mutations run at once (each stage is one single-threaded "
                    "subprocess: at most one job per core)")
    ap.add_argument("--kind", choices=("slip", "safeguard"), help="only the slips, or only the safeguards' naive forms")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument("--fresh", action="store_true", help="do not merge with the existing mutations.json")
    ap.add_argument("--worker", choices=("atlas", "locate"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    by_id = {m.id: m for m in MUTATIONS}
    if len(by_id) != len(MUTATIONS):
        raise SystemExit("duplicate mutation ids")
    unknown = set(args.only or ()) - set(by_id)
    if unknown:
        raise SystemExit(f"unknown mutation id(s): {sorted(unknown)}; --list shows them")
    chosen = [by_id[i] for i in args.only] if args.only else MUTATIONS
    chosen = [m for m in chosen if args.kind in (None, m.kind)]
    if not cuda_visible():
        skipped = [m.id for m in chosen if m.gpu_only and not args.only]
        chosen = [m for m in chosen if m.id not in skipped]
        if skipped:
            print(f"GPU only, not run here: {', '.join(skipped)}")

    if args.worker:
        import fla_lab
        here = Path.cwd().resolve()
        assert Path(fla_lab.__file__).resolve().is_relative_to(here), f"fla_lab from {fla_lab.__file__}, not {here}"
        fn = {"atlas": worker_atlas, "locate": worker_locate}[args.worker]
        print("RESULT " + json.dumps(fn(chosen[0]), default=str))
        return 0
    if args.list:
        for m in MUTATIONS:
            print(f"{m.id:<36} {m.op:<22} {m.kernel:<34} {m.what}")
        return 0
    if args.jobs < 1:
        raise SystemExit("--jobs: at least 1")
    for m in chosen:  # fail loudly before anything runs
        mutated(m, head_text(m.path), m.path)

    path = RESULTS / "mutations.json"
    results = {} if args.fresh or not path.exists() else {r["id"]: r for r in json.loads(path.read_text())}
    lock = threading.Lock()
    start = time.perf_counter()

    def one(m: Mutation) -> None:
        r = run_mutation(m, args.stages)
        with lock:  # a run of some stages keeps the others' results
            results[m.id] = results.get(m.id, {}) | r
            write(results)

    with ThreadPoolExecutor(args.jobs) as pool:  # threads wait on subprocesses: the work is in those
        for future in [pool.submit(one, m) for m in chosen]:
            future.result()
    text = write(results)
    print(text)
    print(f"total {time.perf_counter() - start:.0f}s for {len(chosen)} mutation(s), {args.jobs} at a time")
    return 0


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def run_mutation(m: Mutation, stages) -> dict:
    """Every stage on an export of HEAD with `m` applied; a layer's safeguard gets the tests only."""
    import torch
    import triton

    t0 = time.perf_counter()
    copy = export_copy(m)
    try:
        r = {"id": m.id, "kind": m.kind, "op": m.op, "kernel": m.kernel, "path": m.path, "what": m.what}
        for stage in stages:
            if stage != "tests" and not m.op_level:
                r[stage] = {"verdict": "n/a", "seconds": 0.0}
            else:
                r[stage] = stage_tests(m, copy) if stage == "tests" else stage_worker(stage, m, copy)
            s = r[stage]
            verdict = s.get("verdict") or (f"locator op {_yes(s['locator_op'])} kernel {_yes(s['locator_kernel'])}"
                                           f", audit op {_yes(s['audit_op'])}")
            print(f"[{m.id}] {stage}: {verdict} ({s['seconds']:.0f}s)", flush=True)
        return r | {"seconds": round(time.perf_counter() - t0, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "device": torch.cuda.get_device_name() if cuda_visible() else "CPU (Triton interpreter)",
                    "torch": torch.__version__, "triton": triton.__version__,
                    "cores": os.cpu_count()}
    finally:
        shutil.rmtree(copy, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

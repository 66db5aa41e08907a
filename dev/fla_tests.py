#!/usr/bin/env python3
"""flash-linear-attention's own op tests, run against fla_lab on the CPU (Triton interpreter).

Copies FLA's `tests/ops` files (and the `fla` package of the same commit, for its naive references and
`fla.utils.assert_close`) into a temporary directory, adds a conftest that replaces FLA's ops by fla_lab's and
shrinks the parametrized sizes (`SHRINK` below; tolerances and assertions untouched), runs pytest in one
subprocess, and prints per file passed / failed / skipped with every failure's one-line reason. The table also
goes to `benchmarks/results/fla_tests.md`.

FLA's source is a checkout or a bare git directory of flash-linear-attention, given by `--fla DIR` or the
environment variable FLA_SOURCE:

    python -m dev.fla_tests --fla ~/flash-linear-attention        # a checkout (its tests/ops and fla/), FILES
    FLA_SOURCE=~/flash-linear-attention python -m dev.fla_tests   # the same
    python -m dev.fla_tests --fla ~/fla.git --commit bc3b101d     # a bare git directory at one commit
    python -m dev.fla_tests --files test_gla.py -k "varlen"       # a subset (-k as pytest's)
    python -m dev.fla_tests --junit a/junit.xml b/junit.xml       # the table from runs kept with --keep
    python -m dev.fla_tests --gpu --fla DIR --workers 4           # on a GPU, at FLA's own sizes (no shrink)
    python -m dev.fla_tests --gpu --upstream -k "..."             # FLA's own ops on the same tests (a failure's
                                                                  # comparison; FLA's autotuner compiles first)

`--gpu` runs the same tests where FLA wrote them to run: on the CUDA device, at FLA's own parametrized sizes, with
FLA's own shared-memory gate; the table goes to `benchmarks/results/fla_tests_gpu.md` (with `--out`, elsewhere).

Needs `einops` importable (FLA imports it): installed, or in `--site DIR`, which is put on the path after the
commit's `fla` (e.g. a `pip install --no-deps --target DIR .whl/*.whl einops`); `--fla-package site` uses DIR's
`fla` (0.6.0) instead.

What stands in for what (FLA name -> fla_lab), set before the test modules import them:
  chunk_gla, fused_recurrent_gla, chunk_rwkv6, fused_recurrent_rwkv6, chunk_gsa, fused_recurrent_gsa,
  chunk_rwkv7, fused_recurrent_rwkv7                   -> the fla_lab op of the same name
  chunk_dplr_delta_rule(q, k, v, a, b, gk, ...)         -> chunk_rwkv7(r=q, w=gk, ...) (scale None -> K**-0.5;
                                                           safe_gate / disable_recompute dropped: speed hints)
  fused_recurrent_dplr_delta_rule(...)                  -> fused_recurrent_rwkv7(r=q, w=gk, ...)
  fused_mul_recurrent_rwkv7(r, w, k, v, kk, a, ...)     -> fused_recurrent_rwkv7(r, w, k, v, a=-kk, b=kk * a)
In test_rwkv7.py the DPLR ops are the *reference* of chunk_rwkv7 / fused_mul_recurrent_rwkv7, so there they
become FLA's naive `dplr_recurrence` (else fla_lab would be compared with itself). `fla.utils.device` is set to
"cpu" (on a machine without a GPU FLA sets it to "cuda"), and `fla.utils.check_shared_mem` to True (else the CPU
would skip GSA's D > 64 or M > 64 cases as a GPU without enough shared memory). FLA's tests/conftest.py
(NaN-filled torch.empty for FLA's own kernels) is not used.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ENV = "FLA_SOURCE"  # FLA's checkout or bare git directory when --fla is not given
OUT = ROOT / "benchmarks" / "results" / "fla_tests.md"
GPU_OUT = ROOT / "benchmarks" / "results" / "fla_tests_gpu.md"
DEVICE_ENV = "FLA_TESTS_DEVICE"  # set by run_pytest for the pytest process: "cpu" (shrunk) or "cuda" (FLA's sizes)

# test file -> {test function prefix: why it is not run}; every other test in the file runs
FILES = {
    "test_gla.py": {},
    "test_rwkv6.py": {},
    "test_rwkv7.py": {
        "test_channel_mixing_gradients": "FLA's channel-mixing kernel, no fla_lab op",
        "test_channel_mixing_no_out_of_bounds_writes": "FLA's channel-mixing kernels, no fla_lab op",
        "test_fused_rwkv7_addcmul": "FLA's addcmul kernel, no fla_lab op",
        "test_fused_k_update": "FLA's k-update kernel, no fla_lab op",
        "test_gate_output_correction": "FLA's output-correction kernel, no fla_lab op",
    },
    "test_dplr_delta.py": {
        "test_recurrent_fwd": "FLA's two naive references against each other, no op",
        "test_chunk_safe_gate_multihead_gradients": "calls FLA's internal DPLR kernels (chunk_dplr_fwd_intra, ...)",
    },
    "test_gsa.py": {},
}


def shrink_length(n: int) -> int:
    """A length over 128 becomes 128 if it is a multiple of 64, else 64 + n % 64 (a partial last chunk stays one)."""
    if n <= 128:
        return n
    return 128 if n % 64 == 0 else 64 + n % 64


def shrink_cu_seqlens(cu: list[int]) -> list[int]:
    """Each sequence's length through `shrink_length`; empty and short sequences are kept."""
    out = [cu[0]]
    for a, b in zip(cu[:-1], cu[1:]):
        out.append(out[-1] + shrink_length(b - a))
    return out


# parameter name -> rule; a parameter not named here (dtype, scale, chunk_size, gate normalizer, ...) is unchanged
SHRINK = {
    "B": (lambda b: 1, "B -> 1 (the varlen cases still pack several sequences)"),
    "H": (lambda h: min(h, 2), "H -> min(H, 2) (GSA's HQ scaled with it, keeping HQ / H)"),
    "T": (shrink_length, "T -> T if T <= 128, else 128 if T % 64 == 0, else 64 + T % 64"),
    "cu_seqlens": (shrink_cu_seqlens, "cu_seqlens: each sequence's length by the T rule"),
    "D": (lambda d: 64 if d == 128 else d,
          "D 128 -> 64 (60, 64, 100, 256, 320, 512 kept; with D >= 256, T -> min(T, 64))"),
    "M": (lambda m: 64 if m == 128 else m, "M (GSA slots) 128 -> 64"),
}


def shrink_case(case: dict) -> dict:
    """One parameter set (name -> value) with SHRINK applied."""
    out = {name: SHRINK[name][0](value) if name in SHRINK else value for name, value in case.items()}
    if out.get("D", 0) >= 256 and "T" in out:
        out["T"] = min(out["T"], 64)
    if "HQ" in case and "H" in case:
        out["HQ"] = case["HQ"] * out["H"] // case["H"]
    return out


def argnames_of(spec) -> list[str]:
    if isinstance(spec, str):
        return [name.strip() for name in spec.split(",") if name.strip()]
    return list(spec)


def shrink_argvalues(argnames, argvalues) -> list:
    """A parametrize mark's argvalues with SHRINK applied; pytest.param ids and marks kept (FLA's case names)."""
    names = argnames_of(argnames)
    out = []
    for value in argvalues:
        values = getattr(value, "values", None)
        single = len(names) == 1
        raw = values if values is not None else ((value,) if single else tuple(value))
        new = tuple(shrink_case(dict(zip(names, raw)))[name] for name in names)
        if values is not None:
            out.append(value._replace(values=new))
        else:
            out.append(new[0] if single else new)
    return out


def parse_junit(text: str) -> dict[str, dict]:
    """JUnit XML -> {file: {"passed": [...], "failed": [(test, reason)], "skipped": [(test, reason)]}}."""
    results: dict[str, dict] = {}
    for case in ET.fromstring(text).iter("testcase"):
        file = (case.get("classname") or case.get("name", "")).split(".")[-1].removesuffix(".py") + ".py"
        row = results.setdefault(file, {"passed": [], "failed": [], "skipped": []})
        name = case.get("name", "")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            row["failed"].append((name, reason(bad.get("message") or bad.text or "", bad.text or "")))
        elif case.find("skipped") is not None:
            row["skipped"].append((name, (case.find("skipped").get("message") or "").splitlines()[0]))
        else:
            row["passed"].append(name)
    return results


def reason(message: str, traceback: str = "") -> str:
    """One line: an assert_close miss as 'name: ratio R > tol (max abs diff X)', else the message's first line
    (for pytest.warns' DID NOT WARN, with the error the call raised inside it, found in the traceback)."""
    raised = re.findall(r"^E\s+(\w+(?:Error|Exception): .*)$", traceback, re.M)
    if "DID NOT WARN" in message and raised:
        return f"DID NOT WARN; the call raised {raised[0][:250]}"
    hit = re.search(r"(\S+)\s+diff: ([\d.]+) ratio: ([\d.]+)", message)
    tol = (re.search(r"assert [\d.e+-]+ < ([\d.e+-]+)", message)  # else the test's failing assert_close line
           or re.search(r"^>\s+assert_close\(.*,\s*(?:ratio=)?([\d.e+-]+)\)\s*$", traceback, re.M))
    if hit and tol:
        name, diff, ratio = hit.groups()
        return f"{name}: error ratio {ratio} > {tol.group(1)} (max abs diff {diff})"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0][:300] if lines else "(no message)"


CONFTEST = '''"""Written by dev/fla_tests.py (see its docstring): FLA's ops -> fla_lab's{shrunk}."""
import pytest

from dev import fla_tests

fla_tests.install_shim()


def pytest_collection_modifyitems(items):
    fla_tests.check_ops_and_bind_references(items)
'''

SHRINK_HOOK = '''

@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    fla_tests.shrink_marks(metafunc.definition)
'''


REPLACED = "FLA's ops replaced by fla_lab's"
UPSTREAM_CONFTEST = '"""Written by dev/fla_tests.py --upstream: FLA\'s own ops, nothing replaced."""\n'


def conftest(gpu: bool, upstream: bool = False) -> str:
    """The shim, unless `upstream` (FLA's own ops, for a failure's comparison); the shrinking hook only for the
    interpreter (on a GPU the tests keep FLA's sizes)."""
    if upstream:
        return UPSTREAM_CONFTEST
    text = CONFTEST.format(shrunk="" if gpu else ", sizes shrunk")
    return text if gpu else text + SHRINK_HOOK


OP_NAMES = ("chunk_gla", "fused_recurrent_gla", "chunk_rwkv6", "fused_recurrent_rwkv6", "chunk_gsa",
            "fused_recurrent_gsa", "chunk_rwkv7", "fused_recurrent_rwkv7", "chunk_dplr_delta_rule",
            "fused_recurrent_dplr_delta_rule", "fused_mul_recurrent_rwkv7")


def install_shim() -> None:
    """Inside the pytest process: FLA's device -> cpu (or cuda with --gpu), FLA's op names -> fla_lab's (see the
    module docstring). On the CPU FLA's shared-memory gate is opened (no GPU to ask); on a GPU it stays FLA's."""
    import importlib
    import importlib.util

    import fla.utils

    import fla_lab.ops as lab

    device = os.environ.get(DEVICE_ENV, "cpu")
    fla.utils.device = device
    if device == "cpu":
        fla.utils.check_shared_mem = lambda *args, **kwargs: True  # FLA's GPU gate (GSA D > 64 or M > 64)
    for where in ("fla.utils._device", "fla.utils.hardware"):  # the commit's module, or 0.6.0's
        if importlib.util.find_spec(where) is not None:
            importlib.import_module(where).device = device
    names = {name: getattr(lab, name) for name in OP_NAMES[:8]}
    names.update(chunk_dplr_delta_rule=dplr_chunk_as_rwkv7, fused_recurrent_dplr_delta_rule=dplr_recurrent_as_rwkv7,
                 fused_mul_recurrent_rwkv7=fused_mul_as_rwkv7)
    for path in ("gla", "gla.chunk", "gla.fused_recurrent", "rwkv6", "rwkv6.chunk", "rwkv6.fused_recurrent", "gsa",
                 "gsa.chunk", "gsa.fused_recurrent", "rwkv7", "rwkv7.chunk", "rwkv7.fused_recurrent",
                 "generalized_delta_rule.dplr", "generalized_delta_rule.dplr.chunk",
                 "generalized_delta_rule.dplr.fused_recurrent"):
        module = importlib.import_module("fla.ops." + path)
        for name, fn in names.items():
            if hasattr(module, name):
                setattr(module, name, fn)


def dplr_chunk_as_rwkv7(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, chunk_size=None, safe_gate=False, disable_recompute=False, **kwargs):
    from fla_lab.ops import chunk_rwkv7

    scale = q.shape[-1] ** -0.5 if scale is None else scale  # chunk_dplr_delta_rule's default
    return chunk_rwkv7(r=q, w=gk, k=k, v=v, a=a, b=b, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size, **kwargs)


def dplr_recurrent_as_rwkv7(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False,
                            cu_seqlens=None, **kwargs):
    from fla_lab.ops import fused_recurrent_rwkv7

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return fused_recurrent_rwkv7(r=q, w=gk, k=k, v=v, a=a, b=b, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, **kwargs)


def fused_mul_as_rwkv7(r, w, k, v, kk, a, scale=1.0, initial_state=None, output_final_state=False,
                       cu_seqlens=None, **kwargs):
    """FLA's fused_mul_recurrent_rwkv7 is the DPLR recurrence with a = -kk, b = kk * a (its docstring and test)."""
    from fla_lab.ops import fused_recurrent_rwkv7

    scale = r.shape[-1] ** -0.5 if scale is None else scale
    return fused_recurrent_rwkv7(r=r, w=w, k=k, v=v, a=-kk, b=kk * a, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, **kwargs)


def naive_dplr(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False, **_):
    """FLA's `dplr_recurrence` ([B, H, T, D], scale K**-0.5 built in) in the ops' [B, T, H, D] form."""
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence

    K = q.shape[-1]
    q = q if scale is None else q * (scale * K ** 0.5)
    h0 = None if initial_state is None else initial_state.float()
    o, ht = dplr_recurrence(*(x.transpose(1, 2) for x in (q, k, v, a, b, gk)), initial_state=h0,
                            output_final_state=output_final_state)
    return o.transpose(1, 2), ht


def check_ops_and_bind_references(items) -> None:
    """Also checks that every op name a test module imported is fla_lab's (or this script's adapter)."""
    import fla_lab.ops as lab

    ours = {getattr(lab, name) for name in lab.__all__} | {dplr_chunk_as_rwkv7, dplr_recurrent_as_rwkv7,
                                                          fused_mul_as_rwkv7}
    for module in {item.module for item in items}:
        for name in OP_NAMES:
            if hasattr(module, name) and getattr(module, name) not in ours:
                raise RuntimeError(f"{module.__name__}.{name} is still FLA's")
    for module in {item.module for item in items if item.module.__name__.endswith("test_rwkv7")}:
        module.chunk_dplr_delta_rule = naive_dplr
        module.fused_recurrent_dplr_delta_rule = naive_dplr


def shrink_marks(definition) -> None:
    """Replace the parametrize marks pytest is about to expand with shrunk ones (`shrink_argvalues`)."""
    from _pytest.mark.structures import Mark

    for i, mark in enumerate(definition.own_markers):
        if mark.name == "parametrize":
            argnames, argvalues, *rest = mark.args
            args = (argnames, shrink_argvalues(argnames, argvalues), *rest)
            definition.own_markers[i] = Mark(mark.name, args, mark.kwargs, _ispytest=True)


def export(fla: Path, commit: str, files: list[str], dest: Path, with_package: bool) -> str:
    """Test files (flat) and, with_package, `fla/` into dest; returns the commit hash (or 'unknown')."""
    paths = [f"tests/ops/{f}" for f in files] + (["fla"] if with_package else [])
    if (fla / "tests" / "ops").is_dir():  # a checkout
        for p in paths:
            (dest / p).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (fla / p).is_dir() else shutil.copy)(fla / p, dest / p)
        git = ["git", "-C", str(fla)]
        commit = "HEAD"
    else:  # a bare git directory
        git = ["git", f"--git-dir={fla}"]
        archive = subprocess.run(git + ["archive", commit, *paths], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for f in files:
        shutil.move(dest / "tests" / "ops" / f, dest / f)
    head = subprocess.run(git + ["rev-parse", commit], capture_output=True, text=True)
    return head.stdout.strip() if head.returncode == 0 else "unknown"


def run_pytest(work: Path, files: list[str], site: Path | None, keyword: str | None, gpu: bool = False,
               workers: int = 0, log_path: Path | None = None) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLA_CI_ENV", "PYTEST_ADDOPTS", "TRITON_INTERPRET")}
    env.update({DEVICE_ENV: "cuda" if gpu else "cpu"},
               PYTHONPATH=os.pathsep.join(str(p) for p in (work, site, ROOT) if p is not None))
    if not gpu:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    deselect = [f"--deselect={f}::{test}" for f in files for test in FILES.get(f, {})]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "log_cli=false",
           "--junitxml=junit.xml", "--rootdir", str(work), *deselect, *files] + (["-k", keyword] if keyword else [])
    cmd += ["-n", str(workers)] if workers else []
    start = time.time()
    log_path = log_path or work / "pytest.log"
    with open(log_path, "w") as log:  # -v: each test's name as it finishes (`tail -f` it to follow the run)
        rc = subprocess.run(cmd + ["-v"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    return rc, log_path.read_text(), time.time() - start


def table(results: dict[str, dict], files: list[str]) -> list[str]:
    lines = ["| file | passed | failed | skipped | deselected |", "|---|---|---|---|---|"]
    total = [0, 0, 0, 0]
    for f in files:
        row = results.get(f, {"passed": [], "failed": [], "skipped": []})
        counts = [len(row["passed"]), len(row["failed"]), len(row["skipped"]), len(FILES.get(f, {}))]
        total = [a + b for a, b in zip(total, counts)]
        lines.append(f"| {f} | " + " | ".join(map(str, counts[:3])) + f" | {counts[3]} functions |")
    lines.append("| **total** | " + " | ".join(f"**{n}**" for n in total[:3]) + f" | {total[3]} functions |")
    return lines


def details(results: dict[str, dict], files: list[str]) -> list[str]:
    lines = []
    for kind in ("failed", "skipped"):
        rows = [(f, test, why) for f in files for test, why in results.get(f, {}).get(kind, [])]
        if rows:
            lines += ["", f"## {kind.capitalize()} ({len(rows)})", ""]
            lines += [f"- `{f}::{test}`: {why}" for f, test, why in rows]
    desel = [(f, test, why) for f in files for test, why in FILES.get(f, {}).items()]
    if desel:
        lines += ["", "## Not run (deselected)", ""] + [f"- `{f}::{test}`: {why}" for f, test, why in desel]
    return lines


def report(results, files, commit, package, seconds, keyword, gpu: str | None = None) -> str:
    """The markdown table; `gpu` names the card of a --gpu run (FLA's sizes), None for the shrunk CPU run."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    where = f"{gpu} (CUDA, FLA's own sizes)" if gpu else "CPU (Triton interpreter, one pytest process)"
    head = ["# flash-linear-attention's op tests against fla_lab", "",
            f"`python -m dev.fla_tests`, {date}, {where}, FLA commit "
            f"`{commit}` (tests; naive references and `assert_close` from {package}), {seconds:.0f} s"
            + (f", `-k {keyword}`" if keyword else "") + ".", ""]
    if gpu:
        head += ["FLA's ops replaced by fla_lab's; FLA's sizes, tolerances, assertions and shared-memory gate "
                 "unchanged.", ""]
    else:
        head += ["FLA's ops replaced by fla_lab's, FLA's tolerances and assertions unchanged; parametrized sizes "
                 "shrunk for the interpreter (FLA's case ids kept, they name the original sizes):", ""]
        head += [f"- {rule}" for _, rule in SHRINK.values()] + [""]
    return "\n".join(head + table(results, files) + details(results, files)) + "\n"


def gpu_name() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--gpu needs a CUDA device (torch.cuda.is_available() is False)")
    return torch.cuda.get_device_name()


def from_junit(args) -> int:
    results, times = {}, {}
    for path in args.junit:
        text = path.read_text()
        results.update(parse_junit(text))
        file_times = {}
        for case in ET.fromstring(text).iter("testcase"):
            file = case.get("classname", "").split(".")[-1] + ".py"
            file_times[file] = file_times.get(file, 0.0) + float(case.get("time", 0))
        times.update(file_times)
    seconds = sum(times.values())
    git = ["git", "-C", str(args.fla)] if (args.fla / "tests").is_dir() else ["git", f"--git-dir={args.fla}"]
    commit = subprocess.run(git + ["rev-parse", args.commit], capture_output=True, text=True).stdout.strip()
    package = f"`fla` of {commit[:8]}" if args.fla_package == "commit" else f"`fla` in {args.site}"
    files = [f for f in args.files if f in results]
    text = report(results, files, commit, package, seconds, args.keyword)
    text = text.replace(f"{seconds:.0f} s", f"{seconds:.0f} s of tests, from {len(args.junit)} runs' JUnit files")
    print(text)
    args.out.write_text(text)
    return 1 if any(r["failed"] for r in results.values()) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fla", type=Path, default=os.environ.get(SOURCE_ENV),
                        help=f"FLA checkout, or bare git directory (default: ${SOURCE_ENV})")
    parser.add_argument("--commit", default="HEAD", help="with a bare git directory: the commit to export")
    parser.add_argument("--site", type=Path, help="directory with einops (and FLA 0.6.0's fla), put on the path")
    parser.add_argument("--fla-package", choices=("commit", "site"), default="commit",
                        help="naive references from the tests' commit or from --site")
    parser.add_argument("--files", nargs="+", default=list(FILES))
    parser.add_argument("-k", dest="keyword")
    parser.add_argument("--out", type=Path, help=f"default {OUT.relative_to(ROOT)} ({GPU_OUT.name} with --gpu)")
    parser.add_argument("--gpu", action="store_true", help="on the CUDA device at FLA's own sizes (no shrink)")
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (0: one process)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--upstream", action="store_true", help="FLA's own ops: nothing replaced (comparison)")
    parser.add_argument("--log", type=Path, help="pytest's -v output here as it runs (default: the temporary directory)")
    parser.add_argument("--junit", type=Path, nargs="+",
                        help="no run: the table from these junit.xml files (a later file's test files replace)")
    args = parser.parse_args()
    if args.fla is None:
        parser.error(f"where is flash-linear-attention's source? --fla DIR or {SOURCE_ENV}=DIR")
    args.fla = Path(args.fla).expanduser()
    args.out = args.out or (GPU_OUT if args.gpu else OUT)
    if args.junit:
        return from_junit(args)

    work = Path(tempfile.mkdtemp(prefix="fla_tests_"))
    print(f"running in {work} (log: {work / 'pytest.log'})", flush=True)
    try:
        commit = export(args.fla, args.commit, args.files, work, args.fla_package == "commit")
        gpu = gpu_name() if args.gpu else None
        (work / "conftest.py").write_text(conftest(args.gpu, args.upstream))
        (work / "pytest.ini").write_text("[pytest]\n")
        rc, log, seconds = run_pytest(work, args.files, args.site, args.keyword, args.gpu, args.workers, args.log)
        junit = work / "junit.xml"
        if not junit.exists():
            print(log[-5000:])
            return 2
        results = parse_junit(junit.read_text())
        package = f"`fla` of {commit[:8]}" if args.fla_package == "commit" else f"`fla` in {args.site}"
        text = report(results, args.files, commit, package, seconds, args.keyword, gpu)
        if args.upstream:
            text = text.replace(REPLACED, "FLA's own ops (`--upstream`: nothing replaced)").replace(
                "against fla_lab", "with FLA's own ops")
        print(log[-3000:] if rc not in (0, 1) else log.splitlines()[-1])
        print(text)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        return 1 if any(r["failed"] for r in results.values()) else 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Show that the tests issue 17 listed fail when what they name breaks: each case edits one line of an export of
HEAD (the working tree is never touched), runs the one test, and expects it to fail; then the same test must pass
on the unedited export.

    python -m dev.break_listed_tests [--only NAME ...]      # prints a table; exit 1 if a break went unseen
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dev.mutation_check import export_head  # one way to copy HEAD for both tools

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Break:
    name: str
    test: str       # pytest node id
    path: str       # file edited, relative to the repository
    old: str        # must occur exactly once
    new: str
    what: str


BREAKS = (
    Break("fla adapter without a GPU", "tests/test_atlas.py::test_fla_adapter_is_empty_without_the_package_or_a_gpu",
          "fla_lab/spec/registry.py", 'return importlib.util.find_spec("fla") is not None and torch.cuda.is_available()',
          'return importlib.util.find_spec("fla") is not None',
          "the adapter registers FLA's ops without a GPU"),
    Break("H200 numbers the notebook quotes",
          "tests/test_lesson_gsa_padding.py::test_gpu_atlas_numbers_the_notebook_quotes",
          "fla_lab/teaching/lessons/gsa_padding.py", '{"scale-aware": r["errors"]["dg"], "plain": r["errors_unfloored"]["dg"]}',
          '{"scale-aware": r["errors"]["dq"], "plain": r["errors_unfloored"]["dg"]}',
          "the lesson reads another tensor's error from the json"),
    Break("CPU autocast table", "tests/test_lesson_amp.py::test_cpu_autocast_returns_bf16_for_every_op",
          "fla_lab/teaching/lessons/amp.py", '"sigmoid": torch.sigmoid, "tanh"', '"sigmoid": lambda t: torch.sigmoid(t.float()), "tanh"',
          "the table's sigmoid runs in fp32 under autocast"),
    Break("channel decays at init", "tests/test_lesson_amp.py::test_channel_decays_come_from_the_layer_at_init",
          "fla_lab/teaching/lessons/amp.py", 'out[key] = layer.log_decay(torch.zeros(1, 1, hidden_size, dtype=dtype))[0, 0].double()',
          'out[key] = 1.01 * layer.log_decay(torch.zeros(1, 1, hidden_size, dtype=dtype))[0, 0].double()',
          "the channel decays are 1% off the layer's"),
    Break("exercise check on the shipped fix",
          "tests/test_exercises.py::test_check_passes_the_shipped_fix_and_not_the_historical_bug",
          "fla_lab/ops/common/chunk.py", "return gi + (i_start - 1) * HK + o_k  # 0c1c0b65",
          "return gi + i_start * HK + o_k  # 0c1c0b65", "the shipped reference row is #77's"),
    Break("chunk_rwkv7 writes every output", "tests/test_poisoned_outputs.py",
          "fla_lab/ops/rwkv7/chunk.py",
          "tl.store(o + bos * V + o_t[:, None] * H * V + o_v[None, :], (scale * b_o).to(o.dtype.element_ty), mask=m_tv)",
          "tl.store(o + bos * V + o_t[:, None] * H * V + o_v[None, :], (scale * b_o).to(o.dtype.element_ty), "
          "mask=m_tv & (o_t < T - 1)[:, None])", "the output's last row is never stored"),
    Break("a zeroed gradient fails", "tests/test_check.py::test_a_zeroed_small_gradient_fails",
          "fla_lab/spec/check.py",
          "return not bool(got.detach().any()) and _norm(ref) > DROPPED_ABOVE * floor and bool(ref.detach().any())",
          "return False",
          "the zeroed-gradient rule is gone"),
    Break("the test extra", "tests/test_packaging.py", "pyproject.toml", '"hypothesis>=6", ', "",
          "hypothesis left out of the [test] extra"),
)


def run_test(copy: Path, test: str) -> tuple[bool, float, str]:
    """Run `test` on the export (its package first on the path); (passed, seconds, pytest's last line)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    extra = ["-k", "rwkv7"] if test.endswith("test_poisoned_outputs.py") else []  # the op the issue found left out
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test, *extra],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=900)
    tail = (done.stdout.strip().splitlines() or [""])[-1]
    return done.returncode == 0, time.perf_counter() - start, tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="names (prefixes) of the cases to run")
    args = parser.parse_args(argv)
    cases = [b for b in BREAKS if not args.only or any(b.name.startswith(o) for o in args.only)]
    rows, unseen = [], 0
    for b in cases:
        copy = export_head("break-")
        try:
            intact, t_intact, _ = run_test(copy, b.test)
            path = copy / b.path
            text = path.read_text()
            if text.count(b.old) != 1:
                raise SystemExit(f"{b.name}: the line to break occurs {text.count(b.old)} times in {b.path}")
            path.write_text(text.replace(b.old, b.new))
            passed, t_broken, tail = run_test(copy, b.test)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        seen = intact and not passed
        unseen += not seen
        rows.append(f"| {b.name} | `{b.test}` | {b.what} | {'pass' if intact else 'FAIL'} ({t_intact:.0f} s) | "
                    f"{'fails' if not passed else 'PASSES'} ({t_broken:.0f} s): {tail} | {'yes' if seen else 'NO'} |")
        print(rows[-1], flush=True)
    table = ("| case | test | what was broken | test at HEAD | test with the break | caught |\n|---|---|---|---|---|---|\n"
             + "\n".join(rows))
    print("\n" + table)
    if not args.only:
        head = (f"# The listed tests fail when what they name breaks\n\n`python -m dev.break_listed_tests`, "
                f"{time.strftime('%Y-%m-%d')}, CPU (Triton interpreter), on an export of commit "
                f"`{subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}`"
                ": one line broken per case, the one test run before and after.\n\n")
        (ROOT / "benchmarks" / "results" / "break_listed_tests.md").write_text(head + table + "\n")
    return 1 if unseen else 0


if __name__ == "__main__":
    sys.exit(main())

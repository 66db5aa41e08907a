#!/usr/bin/env bash
# The GPU test plan (issue 43): one device call per step, each under 9 minutes, in this order. A session has about
# 30 minutes of device time in calls of at most 10; the plan spends about 21 and leaves room for one lost call.
# Times measured 2026-12-05 (commit 35aafe0 and before; the card named), and what they predict after the cuts:
#
#   order  step          what                                                      measured / expected
#   1      unit          `workbook.py test --phase unit-cuda` (8 workers)          H100: 30 s setup + 448 s (1290 tests,
#                                                                                  2745 s of test time); after the cuts
#                                                                                  (test_launch per op, learner copies
#                                                                                  CPU only) about 2500 s / 8 workers
#   2      notebooks 00  notebooks 00-03b on the GPU, cold then warm Triton cache  H200 cold: 242 s; warm about 80 s
#   3      notebooks 04  notebooks 04-06 cold then warm, then FLA's own op tests   H200 cold: 149 s; warm about 50 s;
#          + fla_tests   at FLA's sizes (python -m dev.fla_tests --gpu, 8 workers) fla_tests 160 s
#   (plus about 1.5 minutes per call to start a machine that is not warm: about 21 minutes in all)
#
#     OUT=/some/folder bash benchmarks/gpu_plan.sh unit | notebooks 00 01 02 03a 03b | notebooks 04 05 06 fla_tests
#
# `fla_upstream` added to a step runs FLA's own ops on the tests FLA_UPSTREAM_K selects (in FLA_UPSTREAM_FILES,
# default test_gla.py) beside it, one process, for a failure's comparison on the same card. `repros` added to a step
# runs the open failures' reproductions first (about a minute): python -m benchmarks.repro.gsa_large_logits --stages
# and python -m benchmarks.repro.gla_d512_bf16. The next session's first call (2026-12-06 left it unrun: no machine
# lent):
#
#     FLA_UPSTREAM_K="test_chunk and D512 and gate_logit_normalizer1 and bfloat16" \
#       OUT=/some/folder bash benchmarks/gpu_plan.sh unit repros fla_upstream
#
# Each notebook group starts from an empty Triton cache (cold: what a learner meets first), then runs again on the
# filled cache in fresh kernels (warm: a second session); the exercises' checks must say NOT YET on the stub and
# PASS on the solution, and every explorer is driven (python -m dev.notebook_times --widgets, as the notebooks-gpu
# phase). Needs .whl/ (the Jupyter stack, pytest-xdist, pytest-timeout, hypothesis, tqdm, numpy 2.3.5, einops, FLA
# 0.6.0; carried to the machine) and, for fla_tests, .flasrc/ (FLA's fla/ and tests/ at one commit). Everything a
# step learns goes to $OUT as it happens: the -v log (each test's name as it finishes), per-test times
# (FLA_LAB_TEST_TIMES), JSON; a short table comes last. Each command runs under `timeout`. Run from the repository
# root; $OUT defaults to artifacts/gpu_plan/ there.
set -uo pipefail
OUT=${OUT:-$PWD/artifacts/gpu_plan}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=("$@")
[ ${#steps[@]} -gt 0 ] || { echo "usage: gpu_plan.sh unit | notebooks NAME... [fla_tests] [fla_upstream] [repros]"; exit 2; }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
start=$SECONDS
echo "card: $card; steps: ${steps[*]}; commit: ${COMMIT:-unknown}" | tee "$OUT/summary.txt"

source benchmarks/plan_steps.sh  # timed NAME SECONDS COMMAND..., carried_wheels LOG

setup() {  # the README's set-up, from the carried wheels (the machine's own torch and triton)
  PIP_FIND_LINKS=$PWD/.whl timed setup 150 python3 workbook.py setup
}

fla_site() {  # FLA's 0.6.0 wheels and einops for dev/fla_tests.py, once per machine
  carried_wheels "$OUT/install.log"
}

upstream_pid=
if [[ " ${steps[*]} " == *" fla_upstream "* ]]; then
  # beside the first step, one process (one core): FLA's own ops on the tests named by FLA_UPSTREAM_K, so a failure
  # of fla_lab's op at FLA's sizes has FLA's result on the same card (its autotuner compiles for minutes first)
  fla_site
  (PYTHONPATH=$PWD:/tmp/site timed fla_upstream "${FLA_UPSTREAM_S:-480}" python3 -m dev.fla_tests --gpu \
    --upstream --fla .flasrc --fla-package commit --site /tmp/site --files ${FLA_UPSTREAM_FILES:-test_gla.py} \
    -k "${FLA_UPSTREAM_K:?}" --log "$OUT/fla_upstream-v.log" --out "$OUT/fla_upstream.md") &
  upstream_pid=$!
fi

repros() {  # the open failures' reproductions, each under its own limit, before the step's own work
  [[ " ${steps[*]} " == *" repros "* ]] || return 0
  timed gsa_stages 90 .venv/bin/python -m benchmarks.repro.gsa_large_logits --stages
  timed gla_d512 60 .venv/bin/python -m benchmarks.repro.gla_d512_bf16
  cat "$OUT/gsa_stages.log" "$OUT/gla_d512.log" >> "$OUT/summary.txt"
}

case ${steps[0]} in
  unit)
    setup
    repros
    FLA_LAB_TEST_TIMES=$OUT/unit-cuda-times.tsv timed unit-cuda "${UNIT_S:-450}" \
      python3 workbook.py test --phase unit-cuda -v -p no:cacheprovider
    tail -3 "$OUT/unit-cuda.log" | tee -a "$OUT/summary.txt"
    echo "slowest tests (s):" >> "$OUT/summary.txt"
    sort -rn "$OUT/unit-cuda-times.tsv" 2>/dev/null | head -15 >> "$OUT/summary.txt"
    ;;
  notebooks)
    setup
    repros
    names=()
    for s in "${steps[@]:1}"; do [[ $s == fla_tests || $s == fla_upstream || $s == repros ]] || names+=("$s"); done
    group=nb-${names[0]}
    timed "$group" "${NOTEBOOKS_S:-330}" .venv/bin/python -m dev.notebook_times --device gpu --repeat 2 \
      --triton-cache "/tmp/$group-triton-cache" --widgets --timeout 300 --cells 3 --json "$OUT/$group.json" \
      "${names[@]}"
    grep -E "^[0-9][0-9][a-z]?_|NOT YET|PASS|FAIL|Error" "$OUT/$group.log" | tail -30 >> "$OUT/summary.txt"
    ;;
esac

if [[ " ${steps[*]} " == *" fla_tests "* ]]; then
  fla_site
  PYTHONPATH=$PWD:/tmp/site timed fla_tests "${FLA_TESTS_S:-300}" python3 -m dev.fla_tests --gpu \
    --fla .flasrc --fla-package commit --site /tmp/site --workers "${FLA_WORKERS:-8}" \
    --log "$OUT/fla_tests-v.log" --out "$OUT/fla_tests_gpu.md"
  grep -E "FAILED|passed|failed" "$OUT/fla_tests-v.log" | tail -8 >> "$OUT/summary.txt"
fi
if [ -n "$upstream_pid" ]; then
  wait "$upstream_pid"
  grep -E "FAILED|PASSED|passed|failed" "$OUT/fla_upstream-v.log" | tail -4 >> "$OUT/summary.txt"
fi
echo "steps ${steps[*]}: $((SECONDS - start)) s on $card" | tee -a "$OUT/summary.txt"
echo "==== summary ===="
cat "$OUT/summary.txt"

#!/usr/bin/env bash
# The GPU test plan (issue 43): one device call per step, each under 9 minutes, in this order. A session has about
# 30 minutes of device time in calls of at most 10; the plan spends about 22 and leaves room for one lost call.
#
#   order  step        what                                                         expected on a cold H100
#   1      unit        `workbook.py test --phase unit-cuda` (8 workers)             ~1 min setup + 6 min
#   2      notebooks   every notebook on the GPU, cold then warm Triton cache,      ~1 min setup + 6 min
#                      exercises NOT YET / PASS, explorers driven (notebook_times)
#   3      fla_tests   FLA's own op tests at FLA's sizes, fla_lab's ops swapped in  ~7 min
#                      (benchmarks/fla_tests.py --gpu, 8 workers)
#   (plus about 1 minute per call to start a machine that is not warm)
#
#     OUT=/some/folder bash benchmarks/gpu_plan.sh unit|notebooks|fla_tests
#
# Needs .whl/ (the Jupyter stack, pytest-xdist, pytest-timeout, hypothesis, tqdm, numpy 2.3.5, einops, FLA 0.6.0;
# carried to the machine) and, for fla_tests, .flasrc/ (FLA's fla/ and tests/ at one commit). Everything a step
# learns goes to $OUT as it happens: the -v log (each test's name as it finishes), per-test times
# (FLA_LAB_TEST_TIMES), JSON; a short table comes last. Each command runs under `timeout`.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step=${1:?usage: gpu_plan.sh unit|notebooks|fla_tests}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
start=$SECONDS
echo "card: $card; step: $step; commit: $(git rev-parse --short HEAD 2>/dev/null || echo tree)" | tee "$OUT/summary.txt"

timed() {  # name, seconds, command...: output to $OUT/name.log as it comes, "name rc seconds" to the summary
  local name=$1 seconds=$2 t0=$SECONDS
  shift 2
  timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}

setup() {  # the README's set-up, from the carried wheels (the machine's own torch and triton)
  PIP_FIND_LINKS=$PWD/.whl timed setup 150 python3 workbook.py setup
}

case $step in
  unit)
    setup
    FLA_LAB_TEST_TIMES=$OUT/unit-cuda-times.tsv timed unit-cuda "${UNIT_S:-450}" \
      python3 workbook.py test --phase unit-cuda -v -p no:cacheprovider
    tail -3 "$OUT/unit-cuda.log" | tee -a "$OUT/summary.txt"
    echo "slowest tests (s):" >> "$OUT/summary.txt"
    sort -rn "$OUT/unit-cuda-times.tsv" 2>/dev/null | head -15 >> "$OUT/summary.txt"
    ;;
  notebooks)
    setup
    export TRITON_CACHE_DIR=/tmp/notebook-triton-cache
    timed notebooks-gpu "${NOTEBOOKS_S:-480}" .venv/bin/python benchmarks/notebook_times.py --device gpu --repeat 2 \
      --triton-cache "$TRITON_CACHE_DIR" --widgets --timeout 300 --cells 3 --json "$OUT/notebook_times_gpu.json"
    grep -E "^(notebook|[0-9][0-9][a-z]?_)|total|NOT YET|PASS|FAIL" "$OUT/notebooks-gpu.log" | tail -30 \
      >> "$OUT/summary.txt"
    ;;
  fla_tests)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl > "$OUT/install.log" 2>&1
    PYTHONPATH=$PWD:/tmp/site timed fla_tests "${FLA_TESTS_S:-500}" python3 benchmarks/fla_tests.py --gpu \
      --fla .flasrc --fla-package commit --site /tmp/site --workers "${FLA_WORKERS:-8}" \
      --log "$OUT/fla_tests-v.log" --out "$OUT/fla_tests_gpu.md"
    grep -E "FAILED|passed|failed" "$OUT/fla_tests-v.log" | tail -8 >> "$OUT/summary.txt"
    ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
echo "step $step: $((SECONDS - start)) s on $card" | tee -a "$OUT/summary.txt"
echo "==== summary ===="
cat "$OUT/summary.txt"

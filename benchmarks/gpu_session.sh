#!/usr/bin/env bash
# Everything that belongs in one H200 call: doctor, kernel tests on CUDA, the references against
# flash-linear-attention 0.6.0, and (with `bench`) the benchmark. Logs go to $OUT; a short table comes last.
# Usage on the device machine:  bash benchmarks/gpu_session.sh [tests|agreement|bench]...  (default: all)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
steps=${*:-tests agreement bench}
summary=()
for step in $steps; do
  case $step in
    tests)
      python3 -m fla_lab doctor 2>&1 | tee "$OUT/doctor.log"; summary+=("doctor: rc=${PIPESTATUS[0]}")
      timeout ${STEP_TIMEOUT:-240} python3 -m pytest tests --ignore=tests/browser --ignore-glob='tests/test_lesson_*' -q -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
      summary+=("pytest (CUDA): $(tail -1 "$OUT/pytest_gpu.log")") ;;
    agreement)
      timeout ${STEP_TIMEOUT:-240} python3 benchmarks/upstream_agreement.py 2>&1 | tee "$OUT/agreement.log" | tail -12
      summary+=("agreement: $(grep -A12 'worst relative' "$OUT/agreement.log" | tr -s ' ' | paste -sd';')") ;;
    bench)
      timeout ${STEP_TIMEOUT:-240} python3 benchmarks/bench.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -20
      summary+=("bench: $(grep -A8 '^ratios' "$OUT/bench.log" | tr -s ' ' | paste -sd';')") ;;
  esac
done
echo; echo "==== summary ===="; printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# One card's scaling table beside FLA 0.6.0, and FLA's models audited (issue 46), each step under `timeout`:
#
#   check    the recurrent ops' tests and the in-kernel value checks, compiled (beside fill)
#   fill     one process per op compiles fla_lab's and FLA's kernels at B=64, T=1024 and B=1, T=65536 into a shared
#            TRITON_CACHE_DIR, all at once (their timings are thrown away: they share the GPU)
#   models   python -m fla_lab audit --fla rwkv7, gsa and gla --first-config (2 layers, bf16, T=2048, two
#            truncated-BPTT segments; benchmarks/fla_audit_gpu.sh), beside fill: an audit's verdict does not depend
#            on timing (on 2026-12-06, without --first-config and beside fill, each ran out of its 80 s)
#   tune     python -m benchmarks.tune fused_recurrent_rwkv6 over fwd_fallback_tiles
#   checks   the recurrent forwards with value checks off, deferred (in the kernel) and through the flag pass
#            (python -m benchmarks.scaling --checks --forward)
#   measure  python -m benchmarks.scaling in one process over SCALING_T (default 1024 4096 65536, plus B=8,
#            T=4096): FLA's autotuner benchmarks its configs again there, alone on the card, from compiled kernels
#   tests    tests/test_fla_audit_cuda.py and tests/test_upstream.py
#
#     OUT=/some/folder bash benchmarks/scaling_gpu.sh fill models checks measure   # one call, about 9.5 minutes
#     OUT=/some/folder bash benchmarks/scaling_gpu.sh tests                        # the next, same warm machine
#
# FILL_OPS: the ops of fill and measure (default all six); FAMILIES: the models audited (default rwkv7 gsa gla).
# The Triton cache lives in .triton_gpu_cache/ (ignored): a call on the same warm machine reuses it. The scaling rows
# go to $OUT/scaling.json as each finishes (merge them with `python -m benchmarks.scaling --merge`); logs to
# $OUT/logs.tgz at the end (few files come back from the machine). Needs .whl/ (FLA 0.6.0, einops, hypothesis,
# pytest-xdist; carried). Run from the repository root; $OUT defaults to artifacts/scaling_gpu/.
set -uo pipefail
OUT=${OUT:-$PWD/artifacts/scaling_gpu}
LOGS=$OUT/logs
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site TRITON_CACHE_DIR=$PWD/.triton_gpu_cache
unset TRITON_INTERPRET
steps=" $* "
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$card" in *H200*) hbm=4.8 ;; *H100*) hbm=3.35 ;; *) hbm=3.0 ;; esac  # spec-sheet HBM TB/s: the floor column
echo "card: $card; steps:$steps; commit: ${COMMIT:-unknown}" | tee -a "$OUT/summary.txt"
wants() { [[ "$steps" == *" $1 "* ]]; }

source benchmarks/plan_steps.sh  # timed NAME SECONDS COMMAND..., carried_wheels LOG

carried_wheels "$LOGS/install.log"
OPS=(chunk_gla chunk_rwkv6 fused_recurrent_rwkv6 chunk_gsa chunk_rwkv7 fused_recurrent_rwkv7)

if wants check; then
  timed check "${CHECK_S:-240}" python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_contract.py \
    tests/test_recurrent.py tests/test_rwkv7.py tests/test_launch.py -k "not small_cards" -rfE &
fi
if wants fill; then
  for op in ${FILL_OPS:-${OPS[@]}}; do
    timed "fill_$op" "${FILL_S:-250}" env OUT= python3 -m benchmarks.scaling --only "$op" --T 1024 65536 --no-ref \
      --rounds 1 --out-dir "/tmp/fill/$op" &
  done
fi
if wants models; then
  mkdir -p "$LOGS/audit"
  OUT=$LOGS/audit STEPS="models" FAMILIES="${FAMILIES:-rwkv7 gsa gla}" MODEL_S=${MODEL_S:-90} FIRST_CONFIG=1 \
    timed models "${MODELS_S:-280}" bash benchmarks/fla_audit_gpu.sh &
fi
wait
if wants tune; then  # the recurrent forward's launch knobs at four (B, T)
  timed tune "${TUNE_S:-90}" env OUT= python3 -m benchmarks.tune fused_recurrent_rwkv6 --knobs fwd_fallback_tiles \
    --shapes 8x4096 16x4096 64x1024 1x65536 --json "$OUT/tune_recurrent.json"
fi
if wants checks; then
  timed checks "${CHECKS_S:-60}" env OUT= python3 -m benchmarks.scaling --checks --forward --rounds 3 \
    --only fused_recurrent_rwkv6 fused_recurrent_rwkv7 --json "$OUT/checks_forward.json"
fi
if wants measure; then
  read -ra lengths <<< "${SCALING_T:-1024 4096 65536}"
  timed measure "${MEASURE_S:-240}" env OUT= python3 -m benchmarks.scaling --only ${FILL_OPS:-${OPS[@]}} \
    --T "${lengths[@]}" --hbm-tbps "$hbm" \
    --deadline-s "${DEADLINE_S:-210}" --json "$OUT/scaling.json" --md "$LOGS/scaling.md" --figure "$LOGS/scaling.png" \
    ${RESUME:+--resume}
fi
if wants tests; then
  timed tests "${TESTS_S:-200}" python3 -m pytest tests/test_fla_audit_cuda.py tests/test_upstream.py -v \
    -p no:cacheprovider -rs
fi

echo "==== summary ===="
cat "$OUT/summary.txt"
tail -3 "$LOGS/check.log" 2>/dev/null
grep -h "fwd " "$LOGS/tune.log" 2>/dev/null
cat "$LOGS/checks.log" 2>/dev/null | grep -v Warn | tail -4
grep -h "done in" "$LOGS/measure.log" 2>/dev/null | cut -c1-150
tail -8 "$LOGS/audit/audit.log" 2>/dev/null
tail -4 "$LOGS/tests.log" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"

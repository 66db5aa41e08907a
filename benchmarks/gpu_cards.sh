#!/usr/bin/env bash
# One device call per card (issue 35): the `unit-cuda` phase, the fused recurrent forwards beside FLA 0.6.0, the
# FLA audit (benchmarks/fla_audit_gpu.sh) and FLA's own op tests at FLA's sizes (python -m dev.fla_tests --gpu).
# With two GPUs the phase runs on the first while the rest runs on the second (their timings are each GPU's own; the
# CPU cores are shared); with one, one after the other. Logs and JSON go to $OUT as one archive plus a summary;
# the summary table comes last ($OUT defaults to artifacts/gpu_cards/; run from the repository root).
#     OUT=/some/folder FLA_SOURCE=.flasrc bash benchmarks/gpu_cards.sh \
#         [unit] [recurrent] [safeguards] [audit] [fla_tests]
# safeguards: tests/test_safeguards.py on the compiled kernels, then each naive form applied to an export of the tree
# (made a git repository first when it is not one) and its test run there (FLA_LAB_SAFEGUARD_MUTATIONS=1).
# Needs: .whl/ (the Jupyter stack, pytest-xdist, pytest-timeout, hypothesis, tqdm, numpy, FLA 0.6.0, einops) and,
# for fla_tests, FLA_SOURCE (default .flasrc): a directory holding FLA's tests/ops files and its fla/ package (one
# commit's).
set -uo pipefail
OUT=${OUT:-$PWD/artifacts/gpu_cards}
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1
steps=${*:-unit recurrent audit fla_tests}
gpus=$(nvidia-smi -L | wc -l)
other=$([ "$gpus" -ge 2 ] && echo 1 || echo 0)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card x$gpus; steps: $steps" | tee "$LOGS/summary.txt"

source benchmarks/plan_steps.sh  # carried_wheels LOG; its `timed` is replaced next (this plan's summary is in $LOGS)
timed() {  # name, seconds, command...: run under timeout, append "name rc seconds" to the summary
  local name=$1 seconds=$2 start=$SECONDS
  shift 2
  timeout "$seconds" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ${SECONDS}s-${start}s=$((SECONDS - start))s" | tee -a "$LOGS/summary.txt"
}

carried_wheels "$LOGS/install.log"
wants() { [[ " $steps " == *" $1 "* ]]; }

lane0() {  # the test phase (a venv of its own, as the README sets one up), then FLA's tests at FLA's sizes
  export CUDA_VISIBLE_DEVICES=0
  if wants unit; then
    PIP_FIND_LINKS=$PWD/.whl timed setup 120 python3 workbook.py setup
    timed unit-cuda "${UNIT_S:-330}" python3 workbook.py test --phase unit-cuda -v  # names as they finish
  fi
  if wants fla_tests; then
    PYTHONPATH=$PWD:/tmp/site timed fla_tests "${FLA_TESTS_S:-150}" python3 -m dev.fla_tests --gpu \
      --fla "${FLA_SOURCE:-.flasrc}" --fla-package commit --site /tmp/site --workers 4 --out "$LOGS/fla_tests_gpu.md"
  fi
}

lane1() {  # the fused recurrent forwards beside FLA, the safeguards on the card, then the FLA audit
  export CUDA_VISIBLE_DEVICES=$other PYTHONPATH=$PWD:/tmp/site
  if wants safeguards; then
    [ -e .git ] || {  # this folder a repository of its own (the mutation check exports its HEAD)
      git init -q && printf '.whl/\n.flasrc/\n.devsnap/\n' >> .git/info/exclude && git add -A &&
        git -c user.name=device -c user.email=device@localhost commit -qm "the tree as sent"; }
    timed safeguards-shipped "${SHIPPED_S:-90}" python3 -m pytest -q -p no:cacheprovider tests/test_safeguards.py -rs
    FLA_LAB_SAFEGUARD_MUTATIONS=1 timed safeguards-naive "${NAIVE_S:-300}" python3 -m pytest -q -p no:cacheprovider \
      -n 6 tests/test_safeguards.py -k naive_form_fails -rA
    # the GPU-only naive forms through the mutation check (tests, atlas over their range, locator/audit)
    ids=$(python3 -c 'from fla_lab.spec import safeguards as s; print(*[g.id for g in s.REGISTRY if g.gpu_only])')
    timed safeguards-mutations "${GPU_MUT_S:-240}" python3 -m dev.mutation_check --only $ids --jobs 4
    cp benchmarks/results/mutations.json "$LOGS/mutations_gpu.json"
  fi
  if wants recurrent; then
    OUT=$LOGS timed recurrent 150 python3 -m benchmarks.tune fused_recurrent_rwkv6 fused_recurrent_rwkv7 \
      --no-sweep --upstream --shapes 8x4096 64x1024 2x16384
  fi
  if wants audit; then
    mkdir -p "$LOGS/audit"
    OUT=$LOGS/audit timed audit "${AUDIT_S:-300}" bash benchmarks/fla_audit_gpu.sh
  fi
}

if [ "$other" = 1 ]; then
  lane0 & lane1 & wait
else
  lane0; lane1
fi

mkdir -p "$OUT"
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
cp "$LOGS/summary.txt" "$OUT/summary.txt"
echo "==== summary ===="
cat "$LOGS/summary.txt"
grep -h "passed\|failed" "$LOGS/unit-cuda.log" 2>/dev/null | tail -2
grep -h "passed\|failed" "$LOGS"/safeguards-*.log 2>/dev/null | tail -4
grep -h "FLA 0.6.0\|fla_lab" "$LOGS/recurrent.log" 2>/dev/null | tail -12
tail -8 "$LOGS/audit/audit.log" 2>/dev/null
grep -h "total" "$LOGS/fla_tests_gpu.md" 2>/dev/null

#!/bin/bash
# The audit on flash-linear-attention's own layers, on a CUDA machine, from the repository root:
#     OUT=/some/folder bash benchmarks/fla_audit_gpu.sh        ($OUT defaults to artifacts/fla_audit/)
# Installs the wheels in .whl/ (FLA, einops, pytest; no network), runs the CUDA and CPU tests of the FLA audit, the
# fused_recurrent_rwkv6 final-state repro, and `python -m fla_lab audit` on rwkv6, rwkv7 and GSA models (2 layers,
# bf16, two truncated-BPTT segments) plus rwkv6 in fused_recurrent mode (the op the repro is about). Eight files in
# $OUT; a table last. Every step under `timeout`; a step that fails does not stop the others.
# STEPS (default "repro models fused tests"; "controls": each model with `--control`, exit 0 when the swapped op is caught) and FAMILIES (default "rwkv6 rwkv7 gsa") choose; MODEL_S (default 90)
# is each model audit's limit: FLA's cold autotuning of its chunk kernels takes minutes on a fresh machine; with
# FIRST_CONFIG=1 the model audits pass --first-config (FLA's autotuners keep their first config: same verdicts).
set -u
OUT=${OUT:-$PWD/artifacts/fla_audit}
mkdir -p "$OUT"
source benchmarks/plan_steps.sh  # carried_wheels LOG: once per machine (scaling_gpu.sh runs this beside others)
carried_wheels "$OUT/install.log" || { echo "wheel install failed"; tail -5 "$OUT/install.log"; }
rm -f "$OUT/install.log"
export PYTHONPATH=$PWD:/tmp/site
unset TRITON_INTERPRET
LOG=$OUT/audit.log
: > "$LOG"

step() {  # name, seconds, command...: run it, log its exit status
    local name=$1 seconds=$2
    shift 2
    local start=$SECONDS
    timeout "$seconds" "$@"
    local rc=$?
    echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$OUT/steps.txt"
}

STEPS=" ${STEPS:-repro models fused tests} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
want repro && step repro 150 python3 -m benchmarks.repro.fused_recurrent_rwkv6_dht --json "$OUT/repro.json" >> "$LOG" 2>&1
for family in ${FAMILIES:-rwkv6 rwkv7 gsa}; do
    want models || break
    step "audit $family" "${MODEL_S:-90}" python3 -m fla_lab audit --fla "$family" --layers 2 --T 2048 --tbptt 2 --dtype bf16 \
        ${FIRST_CONFIG:+--first-config} --json "$OUT/audit_$family.json" >> "$LOG" 2>&1
done
for family in ${FAMILIES:-rwkv6 rwkv7 gsa}; do  # the audit's control: a wrong op swapped in must be flagged
    want controls || break
    step "control $family" "${MODEL_S:-90}" python3 -m fla_lab audit --fla "$family" --layers 2 --T 2048 --tbptt 2 \
        --dtype bf16 ${FIRST_CONFIG:+--first-config} --control --json "$OUT/control_$family.json" >> "$LOG" 2>&1
done
want fused && step "audit rwkv6 fused_recurrent" 75 python3 -m fla_lab audit --fla rwkv6 --mode fused_recurrent --layers 2 \
    --T 512 --tbptt 2 --dtype bf16 --json "$OUT/audit_rwkv6_fused.json" >> "$LOG" 2>&1

want tests && step tests 170 python3 -m pytest tests/test_fla_audit_cuda.py tests/test_upstream.py -q -p no:cacheprovider -rs \
    > "$OUT/tests.log" 2>&1
python3 - "$OUT" <<'PY' | tee -a "$LOG"
import glob, json, os, sys
out = sys.argv[1]
print(open(os.path.join(out, "steps.txt")).read().strip())
print(f"{'model':<26} {'calls':>5} {'wrong':>5} {'dht':>4} {'step ms':>8} {'replay s':>8} {'ms/replay':>9}  worst wrong")
for path in sorted(glob.glob(os.path.join(out, "audit_*.json")) + glob.glob(os.path.join(out, "control_*.json"))):
    r = json.load(open(path))
    bad = [c for c in r["calls"] if not c["ok"]]
    worst = ", ".join(f"#{c['index']} {c['op']} {c['worst']} {c['errors'][c['worst']]:.2g}" for c in bad[:3]) or "-"
    n = len(r["calls"])
    print(f"{os.path.basename(path)[:-5]:<26} {n:>5} {len(bad):>5} {r['calls_with_final_state_cotangent']:>4} "
          f"{r['step_s'] * 1e3:>8.1f} {r['replay_s']:>8.2f} {r['replay_s'] / max(n, 1) * 1e3:>9.0f}  {worst}")
if os.path.exists(os.path.join(out, "repro.json")):
    r = json.load(open(os.path.join(out, "repro.json")))
    print(f"repro: fla {r['fla']} ({r['fla_commit']}), {r['device']}")
    for row in r["rows"]:
        e = row["errors"]
        print(f"  {row['op']:<22} {row['case']:<9} " + " ".join(f"{n}={e[n]:.1e}" for n in ("dk", "dv", "dw", "dr")))
if os.path.exists(os.path.join(out, "tests.log")):
    print(open(os.path.join(out, "tests.log")).read().strip().splitlines()[-1])
PY

# Sourced by the GPU plans (gpu_plan.sh, gpu_cards.sh, scaling_gpu.sh, fla_audit_gpu.sh), from the repository root.

# `timed NAME SECONDS COMMAND...` runs the command under `timeout`, its output going to $LOGS/NAME.log as it comes
# ($LOGS defaults to $OUT), and appends "NAME rc=STATUS N s" to $OUT/summary.txt and stdout.
timed() {
  local name=$1 seconds=$2 t0=$SECONDS
  shift 2
  timeout "$seconds" "$@" > "${LOGS:-$OUT}/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}

# `carried_wheels LOG` installs the carried .whl/ (FLA, the Jupyter stack, test plugins) into /tmp/site, pip's output
# to LOG, once per machine: a later plan on the same machine, or a step beside others importing from /tmp/site,
# leaves it alone.
carried_wheels() {
  [ -d /tmp/site/fla ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$1" 2>&1
}

# Sourced by the GPU plans (gpu_plan.sh, scaling_gpu.sh). `timed NAME SECONDS COMMAND...` runs the command under
# `timeout`, its output going to $LOGS/NAME.log as it comes ($LOGS defaults to $OUT), and appends
# "NAME rc=STATUS N s" to $OUT/summary.txt and stdout.
timed() {
  local name=$1 seconds=$2 t0=$SECONDS
  shift 2
  timeout "$seconds" "$@" > "${LOGS:-$OUT}/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}

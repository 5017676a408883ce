#!/usr/bin/env bash
# The two calls of a GPU lease (docs/gpu.md, "How to run it"), run from the
# repository root on the GPU machine, the second at once after the first:
#
#   bash tools/gpu/lease.sh check   # install, then python -m tools.gpu.check
#   bash tools/gpu/lease.sh suite   # the GPU tests and the whole suite alone
#
# Each copies its report, its tests' log and its logs to $OUT (the device
# tool's folder; ./gpu_out elsewhere), and `check` a tarball of the hung
# compile cases' stacks and the refused compiles' pass dumps. Exits as the
# check did.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
out=${OUT:-gpu_out}
mkdir -p "$out"

install() {
  python3 -c "import host_callback.receiver._native" 2>/dev/null && return
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    >"$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
}

case "${1:-}" in
  check)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    install
    python3 -m tools.gpu.check --workers 12 2>&1 | tee "$out/check.log" |
      tail -c 9000
    status=${PIPESTATUS[0]}
    cp gpu_check_report.md gpu_check_report.md.suite.log "$out/" 2>/dev/null
    tar czf "$out/stacks_and_dumps.tgz" gpu_compile_stacks gpu_refusal_dumps \
      2>/dev/null
    ;;
  suite)
    install
    python3 -m tools.gpu.check --workers 14 --only gpu-tests,suite \
      --suite-seconds 330 --budget-seconds 400 \
      --report gpu_suite_report.md 2>&1 | tee "$out/suite_check.log" |
      tail -c 6000
    status=${PIPESTATUS[0]}
    cp gpu_suite_report.md gpu_suite_report.md.suite.log "$out/" 2>/dev/null
    ;;
  *)
    echo "usage: bash tools/gpu/lease.sh check|suite" >&2
    exit 2
    ;;
esac
ls -la "$out"
exit "$status"

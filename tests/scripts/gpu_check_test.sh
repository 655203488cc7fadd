#!/usr/bin/env bash
# scripts/gpu-check's own test, without a GPU: `gpu-check --dry-run` on stand-ins for every
# binary, once where all pass and once where some fail, skip or hang, each time checking the
# exit status and what the summary says against what the stand-ins were told to do.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
expect() { # expect <summary> <what> <extended regex>: the summary has a line matching it
  grep -Eq -- "$3" "$1" || { printf 'FAIL: %s: no line matches /%s/ in\n' "$2" "$3"; sed 's/^/  | /' "$1"; failures=$((failures + 1)); }
}
refuse() { # refuse <summary> <what> <extended regex>: no line matches it
  ! grep -Eq -- "$3" "$1" || { printf 'FAIL: %s: a line matches /%s/\n' "$2" "$3"; failures=$((failures + 1)); }
}

# 1. Everything passes: exit 0, every test binary passed, each benchmark and sample reported.
mkdir -p "$work/ok"
OUT="$work/ok" WEFT_GPU_CHECK_STUB='' bash "$root/scripts/gpu-check" --dry-run >"$work/ok.log" 2>&1
rc=$?
s="$work/ok/summary.txt"
((rc == 0)) || { echo "FAIL: all stand-ins pass, yet gpu-check exited $rc"; tail -20 "$work/ok.log"; failures=$((failures + 1)); }
tests=$(find "$root/tests/cuda" -name '*_test.cu' | wc -l)
expect "$s" "all pass" "^## tests \\($tests binaries"
expect "$s" "all pass" "^passed $tests, passed with skipped tests 0, failed 0$"
expect "$s" "all pass" "^reduce/float/268435456 .* of_memcpy 0\\.90$"
expect "$s" "all pass" "^block/gpt/1024 .*gemm_share 0\\.75$"
expect "$s" "all pass" "^passed: samples/10_device_gpt"
expect "$s" "all pass" "^passed: samples/11_two_level"
refuse "$s" "all pass" "NOT RUN|FAILED|CANNOT USE"

# 2. A failing test, one skipped for want of a second GPU, one skipped because CUDA sees no
# device (a failure of the run), a hanging test before the late steps, a hanging p2p test, a
# failing benchmark and a failing sample, in a 24 s budget of which 15 s (3 s a step) are kept for the late
# steps: the first hang is cut at the end of its part, the late steps still run, and each
# outcome is reported as what it was.
mkdir -p "$work/bad"
start=$SECONDS
OUT="$work/bad" WEFT_GPU_CHECK_SECONDS=24 WEFT_GPU_CHECK_LATE_SECONDS=15 \
  WEFT_GPU_CHECK_STUB="cuda_nccl_test=fail cuda_async_test=skip cuda_error_test=nodevice cuda_layer_gpt_test=hang cuda_p2p_test=hang cuda_p2p_bench=fail weft_device_gpt=fail" \
  bash "$root/scripts/gpu-check" --dry-run >"$work/bad.log" 2>&1
rc=$?
took=$((SECONDS - start))
s="$work/bad/summary.txt"
((rc != 0)) || { echo "FAIL: failing stand-ins, yet gpu-check exited 0"; failures=$((failures + 1)); }
((took < 50)) || { echo "FAIL: a 24 s budget took $took s"; failures=$((failures + 1)); }
expect "$s" "failing test" "^FAILED: cuda_nccl_test \\(exit 1\\)$"
expect "$s" "failing test" "^\\[  FAILED  \\] Stub\\.Computes$"
expect "$s" "skipped tests" "passed with skipped tests 2,"
expect "$s" "a device CUDA cannot use" "^CUDA CANNOT USE THE GPU: no CUDA device"
expect "$s" "hang before the late steps" "^FAILED: cuda_layer_gpt_test \\(killed after [0-9]+ s\\)$"
expect "$s" "hang in the late steps" "^FAILED: cuda_p2p_test \\(killed after [0-9]+ s\\)$"
expect "$s" "hang in the late steps" "^unfinished in .*: Stub\\.Hangs$"
expect "$s" "failing benchmark" "^cuda_p2p_bench exited with 1$"
expect "$s" "failing sample" "^FAILED: samples/10_device_gpt \\(exit 3"
expect "$s" "late step after a hang" "^passed: samples/11_two_level"
refuse "$s" "late step after a hang" "NOT RUN.*cuda_two_level_test|FAILED: cuda_two_level_test"

((failures == 0)) && echo "gpu-check --dry-run: every check passed (second run: $took s)"
exit $((failures > 0))

#!/bin/bash
# The checks that need a real NVIDIA GPU, in about four minutes on an H100 with 16 cores: this package's tests, the
# conformance kit on CUDA and CUDA:PTX, the op suite against torch on CUDA, and whole-program fuzzing on both; then
# bench/gpu.py (tiny vs torch on the GPU) on both, and the digits demo on CUDA.
# Usage (tiny-core, tiny-cuda and the test requirements installed): bash packages/tiny-cuda/hardware_check.sh [LOGDIR]
# Each check writes LOGDIR/<name>.log; the exit status is non-zero when any check failed.
set -u
cd "$(dirname "$0")/../.."
LOGS=$(realpath -m "${1:-gpu-check-logs}")
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
P="-q -p no:cacheprovider --timeout 120 -rfEs --tb=short"
run() { local name=$1; shift; ( "$@" > "$LOGS/$name.log" 2>&1; echo $? > "$LOGS/$name.rc" ) & }
run package timeout -s KILL 300 python3 -m pytest packages/tiny-cuda $P -n 3
run conformance_cuda bash -c "cd /tmp && timeout -s KILL 300 python3 -m pytest --tiny-device=CUDA --tiny-conformance $P -n 4"
run conformance_ptx bash -c "cd /tmp && timeout -s KILL 300 python3 -m pytest --tiny-device=CUDA:PTX --tiny-conformance $P -n 4"
run ops_cuda timeout -s KILL 300 python3 -m pytest --tiny-device=CUDA tests/test_ops.py $P -n 2
run fuzz_cuda timeout -s KILL 150 python3 -m tiny.testing.program_fuzz CUDA --seconds "${FUZZ_SECONDS:-90}"
run fuzz_ptx timeout -s KILL 150 python3 -m tiny.testing.program_fuzz CUDA:PTX --seconds "${FUZZ_SECONDS:-90}"
run digits env DEVICE=CUDA timeout -s KILL 120 python3 -m tiny_nn.examples.digits
wait
# then, alone on the GPU (timings): tiny against torch
run bench_cuda timeout -s KILL 90 python3 bench/gpu.py --device CUDA --repeat 5
wait
run bench_ptx timeout -s KILL 90 python3 bench/gpu.py --device CUDA:PTX --repeat 5
wait
status=0
for rc in "$LOGS"/*.rc; do
  name=$(basename "$rc" .rc)
  echo "== $name: exit $(cat "$rc")"; tail -3 "$LOGS/$name.log"
  [ "$(cat "$rc")" = 0 ] || status=1
done
exit $status

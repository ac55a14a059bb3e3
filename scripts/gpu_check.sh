#!/usr/bin/env bash
# Every CUDA test and benchmark in one run on a GPU machine, one table at the end (each op's
# error against its reference and its time; the whole-model checks; the speed goals of issue 31).
# Needs the NVIDIA driver, CUDA 13 (runtime and cuBLAS) and python3; nothing from Debian: the
# binaries and their other libraries come in gpu-bundle.tar.xz (scripts/gpu_bundle.sh, built on
# this project's machines). Run from the repository root:
#   bash scripts/gpu_check.sh [bundle.tar.xz]      results and logs in $OUT (else ./gpu-check-out)
# Each step has its own time limit (18.5 minutes if every one ran out; about 5 expected on an H200);
# a step that fails or times out is reported in the table and the rest still run.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE_TAR=${1:-gpu-bundle.tar.xz}
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT"
B=$(mktemp -d /tmp/k3-gpu-bundle.XXXXXX)
tar -C "$B" -xJf "$BUNDLE_TAR" || { echo "gpu_check: cannot unpack $BUNDLE_TAR" >&2; exit 1; }

# The machine's CUDA 13 runtime and cuBLAS (not on the default library path there), and NCCL.
find_lib_dir() {
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
           /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$1" ] && { echo "$d"; return; }
  done
  find / -xdev -name "$1" -print -quit 2>/dev/null | xargs -r dirname
}
LIBS=$B
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  d=$(find_lib_dir "$l")
  [ -n "$d" ] && LIBS="$LIBS:$d"
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
echo "gpu_check: bundle $B; LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/nvidia-smi.txt"
"$B/k3cpp" --version 2>&1 | tee "$OUT/version.txt"

step() {  # step NAME SECONDS COMMAND...: runs it with a limit, its output in $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name $rc $(( ($(date +%s%N) - t0) / 1000000 ))" >>"$OUT/steps.txt"
  echo "gpu_check: $name: exit $rc"
}
: >"$OUT/steps.txt"

# 1. The tests: the device, the plugin through the binary, whole models against the CPU.
step test_cuda 180 "$B/test_cuda" --gtest_output=json:"$OUT/test_cuda.json"
# 2. The op harness on the GPU (every case; the CPU and emulated backends are checked in CI).
step test_ops 120 "$B/test_ops" --gtest_filter='*_cuda' --gtest_output=json:"$OUT/test_ops.json"
# 3. The op harness's performance mode on the GPU, K3-sized cases included.
step bench_ops 150 "$B/bench_ops" --benchmark_filter='/cuda' --benchmark_min_time=0.05s \
  --benchmark_format=json --benchmark_out="$OUT/bench_ops.json"
# 4. The chunked KDA kernel at K3's shape, bounded and unbounded gates.
if [ -x "$B/bench_cuda_kda" ]; then
  step bench_cuda_kda 90 "$B/bench_cuda_kda"
fi
# 5. Whole models: peaks, the K3-width slice's decode and prefill, the engine at 1 and 64
#    sequences, and mid-1024's prefill on the checkpoint the PyTorch run reads too.
MID=$(mktemp -d /tmp/k3-mid.XXXXXX)
step init_mid 150 "$B/k3cpp" init configs/mid-1024.json "$MID/model" --seed 1 --experts mxfp4 --dtype bf16
step bench_gpu_model 300 env K3_MID_DIR="$MID/model" "$B/bench_gpu_model" --benchmark_format=json \
  --benchmark_out="$OUT/bench_gpu_model.json"
# 6. The project's PyTorch implementation on the same GPU and checkpoint (f32 with TF32).
step torch_prefill 120 python3 tools/k3_torch_prefill_bench.py --model "$MID/model" --device cuda --batch 4 \
  --seq 2048 --reps 3 --json "$OUT/torch_prefill.json"

python3 tools/gpu_check_table.py "$OUT" | tee "$OUT/table.txt"
rm -rf "$MID"

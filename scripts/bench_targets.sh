#!/usr/bin/env bash
# The SIMD-target table of docs/benchmarks.md: runs bench_kernels once per target this CPU
# supports (forced with K3_SIMD_TARGET, in one invocation of this script, so every row comes
# from the same machine state) and prints one markdown table: each kernel's rate per target
# and its ratio to the portable baseline. Single thread.
# usage: scripts/bench_targets.sh [BUILD_DIR]   (default build; builds bench_kernels if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
cmake --build "$BUILD" --target bench_kernels k3cpp >/dev/null
BIN="$BUILD/bench/bench_kernels"
targets=$("$BUILD/k3cpp" --version | sed -n 's/.*(supported: \(.*\)).*/\1/p' | tr 'A-Z' 'a-z')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for t in $targets; do
  K3_SIMD_TARGET=$t "$BIN" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/$t.json" --benchmark_out_format=json >"$out/$t.txt" 2>&1
  head -1 "$out/$t.txt"  # the machine line: CPU and the dispatched target
done
python3 - "$out" $targets <<'PY'
import json, sys
out, targets = sys.argv[1], sys.argv[2:]
rows = [("kernel/gemv_f32", "GB/s", "GB/s"), ("kernel/gemv_bf16", "GB/s", "GB/s"),
        ("kernel/mxfp4_linear/rows:1", "Gweights/s", "G weights/s"),
        ("kernel/mxfp4_linear/rows:4", "Gweights/s", "G weights/s"),
        ("kernel/expert_prefill/n:37", "GFLOP/s", "GFLOP/s"), ("kernel/expert_prefill/n:16", "GFLOP/s", "GFLOP/s"),
        ("kernel/mxfp4_dequantize", "Gweights/s", "G weights/s"),
        ("kernel/situ", "Gvalues/s", "G values/s"), ("kernel/mm_f32", "GFLOP/s", "GFLOP/s"),
        ("machine/fma_peak_1thread", "GFLOP/s", "GFLOP/s")]
res, ctx = {}, None
for t in targets:
    j = json.load(open(f"{out}/{t}.json"))
    ctx = j["context"]
    for b in j["benchmarks"]:
        if b.get("aggregate_name") != "median": continue
        name = b["run_name"].replace("/real_time", "")
        res[(t, name)] = b
base = targets[-1]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}, {ctx['num_cpus']} CPUs at {ctx['mhz_per_cpu']} MHz; one thread; median of 3 repetitions")
print("| kernel | unit | " + " | ".join(t.upper() for t in targets) + " | " +
      " | ".join(f"{t.upper()} / {base.upper()}" for t in targets[:-1]) + " |")
print("|" + "---|" * (2 + 2 * len(targets) - 1))
for name, key, unit in rows:
    vals = [res.get((t, name), {}).get(key) for t in targets]
    cells = [f"{v / 1e9:.2f}" if v else "-" for v in vals]
    ratios = [f"{v / vals[-1]:.1f}x" if v and vals[-1] else "-" for v in vals[:-1]]
    print(f"| {name.replace('kernel/', '')} | {unit} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
PY

#!/usr/bin/env bash
# The exposed gradient reduction with and without --dp-overlap (docs/distributed.md, "Gradient
# reduction overlapped with the backward"): 2 ranks x 1 thread train configs/demo-896.json
# (steps of 8192 tokens: 4 micro-batches of 16 sequences of 128, per-head Muon, qb-hist with
# 1000 bins, as the distributed figures there) with --dp-overlap off, on (16 buckets in flight,
# the default) and on with --dp-overlap-inflight 64 (every bucket of this model), from the
# same seed and data. Prints per step the seconds of the reduction left after the last
# backward (metrics.jsonl seconds_grad_reduce, rank 0), the forward + backward and the step,
# the per-collective bytes of rank 0 (comm_stats.json; they must be equal), how many buckets
# started during the backward, and whether the final checkpoints are identical (cmp).
# A measurement, not a test: on a shared 2-core machine the times are noisy.
#
# usage: scripts/dp_overlap_bench.sh [OUT]   (OUT: run directory, default runs/dp_overlap)
# Environment: K3_BUILD_DIR (default build; k3cpp must be built there), STEPS (default 4),
# BUCKET_MB (--bucket-mb, default 4).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/dp_overlap}
BUILD=${K3_BUILD_DIR:-build}
STEPS=${STEPS:-4}
BUCKET_MB=${BUCKET_MB:-4}
K3=$PWD/$BUILD/k3cpp
[ -x "$K3" ] || { echo "dp_overlap_bench: $K3 is not built (cmake --build $BUILD --target k3cpp)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# Any text will do as the corpus: the figures are communication and compute times.
cat docs/*.md README.md > "$OUT/corpus.txt"
cat > "$OUT/run.json" <<EOF
{"model": "$PWD/configs/demo-896.json", "data": "corpus.txt", "tokenizer": "bytes", "heldout_every": 40,
 "batch_tokens": 8192, "micro_batch_tokens": 2048,
 "stages": [{"name": "s1", "seq_len": 128, "tokens": $((8192 * STEPS)), "lr_peak": 0.01, "lr_end": 0.01, "warmup_steps": 1}],
 "optimizer": "muon", "balancer": "qb-hist", "qb_bins": 1000,
 "eval_every": 0, "eval_tokens": 1024, "checkpoint_every": 0, "log_every": 1,
 "seed": 7, "threads": 1, "samples": [], "sample_tokens": 0}
EOF
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
for mode in off on on64; do
  rm -rf "$OUT/$mode"
  echo "== $mode" >&2
  flags="--dp-overlap ${mode%64}"
  [ "$mode" = on64 ] && flags="$flags --dp-overlap-inflight 64"
  # shellcheck disable=SC2086
  mpirun -np 2 --oversubscribe --bind-to none "$K3" train --config "$OUT/run.json" --out "$OUT/$mode" --dp 2 \
    --threads 1 --bucket-mb "$BUCKET_MB" $flags --quiet 2> "$OUT/$mode.log" > /dev/null
done
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
"$PY" - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
def steps(mode):
    rows = []
    for line in open(f"{out}/{mode}/metrics.jsonl"):
        j = json.loads(line)
        if j.get("type") == "step":
            rows.append(j)
    return rows
def stats(mode):
    return json.load(open(f"{out}/{mode}/comm_stats.json"))["per_rank"][0]
M = ("off", "on", "on64")
s = {m: steps(m) for m in M}
print("step | reduce after backward off / on / on64 (s) | forward+backward (s) | step (s) | losses equal")
for a, b, e in zip(*(s[m] for m in M)):
    f = lambda k, p: " / ".join(f"{r[k]:.{p}f}" for r in (a, b, e))
    print(f"{a['step']} | {f('seconds_grad_reduce', 3)} | {f('seconds_fwd_bwd', 2)} | {f('seconds', 2)} | "
          f"{a['loss'] == b['loss'] == e['loss']}")
c = {m: stats(m) for m in M}
print("collective (rank 0) | bytes off / on / on64 | calls off / on / on64")
for label in sorted(set().union(*(c[m] for m in M))):
    if label == "grad.reduce.overlap":
        continue
    v = [c[m].get(label, {}) for m in M]
    print(f"{label} | {' / '.join(str(x.get('bytes_sent')) for x in v)} | {' / '.join(str(x.get('calls')) for x in v)}")
for m in ("on", "on64"):
    print(f"overlap {m} (rank 0):", json.dumps(c[m].get("grad.reduce.overlap")))
EOF
if cmp -s "$OUT/off/checkpoint/model.safetensors" "$OUT/on/checkpoint/model.safetensors" &&
   cmp -s "$OUT/off/checkpoint/model.safetensors" "$OUT/on64/checkpoint/model.safetensors"; then
  echo "final checkpoints: identical"
else
  echo "final checkpoints: DIFFERENT"
fi

#!/usr/bin/env bash
# Memory-limited inference benchmark (docs/memory-limited.md): writes a real-width K3 slice
# (configs/k3-slice.json: d 7168, the real KDA and MLA shapes, a dense first layer, 2 MoE
# layers of 896 MXFP4 experts of 3584 x 3072, 17.5 MB each: ~37 GB with the trunk) in the
# released layout, measures the disk's sequential O_DIRECT read bandwidth (dd), then runs
# `k3cpp generate` with a PROMPT-token prompt (512) and DECODE decode steps under each budget and cache
# policy, printing the plan line, prefill tokens/s, bytes read per token against the plan,
# seconds per token against the disk bound, hit rates and peak RssAnon (page cache apart).
# usage: scripts/bench_memory_limited.sh [SLICE_DIR] [BUDGETS...]
#   SLICE_DIR default /work/k3-slice (written if it has no config.json; KEEP=0 deletes it at the end)
#   BUDGETS   default "4 8 16" (GB); POLICIES default "s3fifo lru"; DECODE default 24; THREADS default 2;
#   PROMPT default 512 (a budget below the trunk streams it through a ring: the trunk lines);
#   a budget written B:N forces the trunk through a ring of N slots (--trunk-slots N);
#   SPECULATE default "0": one run per K in the list, K > 0 with `--speculate K` (greedy n-gram
#   drafts, infer/speculative.h), 0 plain greedy; the runs' token ids are compared (md5);
#   PROMPT_TEXT=FILE: the prompt is FILE's text (`--prompt`) instead of PROMPT synthetic ids,
#   encoded by a BPE vocabulary in the slice directory, trained there first if it has none
#   (`k3cpp tokenizer train --vocab-size 16384` on TOKENIZER_CORPUS, default the KJV from
#   Debian's `bible`; the slice's vocabulary is 16384 ids);
#   LOOKUP_IDS=1,2,3: with SPECULATE, drafts also looked up in these token ids (--lookup-ids);
#   K3CPP=PATH runs that k3cpp binary instead of building $BUILD/k3cpp (the slice must exist);
#   SLICE_CONFIG=FILE writes the slice from FILE instead (default configs/k3-slice.json). The
#   small form, configs/k3-slice-small.json (d 2048, 128 experts top-8 of 2.5 MB, ~1.1 GB on
#   disk, written in seconds), takes budgets in fractions of a GB; there DISK_GBPS=X skips the
#   dd measurement (the shards are smaller than its 4 x 2 GiB), e.g.
#     SLICE_CONFIG=configs/k3-slice-small.json DISK_GBPS=1 POLICIES=s3fifo DECODE=16 PROMPT=128 \
#       scripts/bench_memory_limited.sh /tmp/k3-slice-small 0.5 1.6
set -euo pipefail
cd "$(dirname "$0")/.."
SLICE=${1:-/work/k3-slice}
shift || true
BUDGETS=${*:-4 8 16}
POLICIES=${POLICIES:-s3fifo lru}
DECODE=${DECODE:-24}
PROMPT=${PROMPT:-512}
THREADS=${THREADS:-2}
SPECULATE=${SPECULATE:-0}
BUILD=${BUILD:-build}
if [ -n "${K3CPP:-}" ]; then  # a k3cpp built before (e.g. another commit's): no build
  K3=$K3CPP
else
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DK3_BUILD_BENCH=OFF >/dev/null
  nice cmake --build "$BUILD" -j2 --target k3cpp k3_make_slice >/dev/null
  K3="$BUILD/k3cpp"
fi
if [ ! -f "$SLICE/config.json" ]; then
  echo "== writing the slice to $SLICE"
  /usr/bin/time -f "slice written in %e s" "$BUILD/k3_make_slice" "${SLICE_CONFIG:-configs/k3-slice.json}" "$SLICE" --seed 1
fi
du -sh "$SLICE"
echo "== machine"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" || true
free -g | head -2
# On a virtual disk the host may cache what was read or written recently (O_DIRECT bypasses
# only the guest's page cache): read a large range once, in 2 GiB pieces, and take the
# slowest piece's rate (the closest to the device) for the plan.
if [ -n "${DISK_GBPS:-}" ]; then
  DISK=$DISK_GBPS
else
  echo "== disk: sequential O_DIRECT read (dd, 8 MiB blocks, 4 x 2 GiB of a MoE shard)"
  SHARD="$SLICE/model-00003-of-000004.safetensors"
  DISK=9999
  for skip in 0 256 512 768; do
    line=$(dd if="$SHARD" of=/dev/null bs=8M count=256 skip=$skip iflag=direct 2>&1 | tail -1)
    echo "$line"
    r=$(echo "$line" | python3 -c "import sys,re; l=sys.stdin.read(); m=re.search(r'(\d+) bytes.*?, ([\d.]+) s,', l); print(f'{int(m.group(1))/float(m.group(2))/1e9:.3f}')")
    DISK=$(python3 -c "print(min($DISK, $r))")
  done
fi
echo "disk bandwidth used for the plan: $DISK GB/s"
# External check: a memory cgroup (v1) nested under this script's own, with memory.limit_in_bytes
# = the budget (hard; page cache is charged too but reclaimed first), where it can be created.
CG_PARENT=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
cg_run() {  # cg_run BUDGET_GB cmd...: runs cmd in a fresh child cgroup limited to the budget
  local b=$1; shift
  local cg="$CG_PARENT/k3_mlb_$$"
  if [ "${CGROUP:-1}" = "1" ] && mkdir "$cg" 2>/dev/null; then
    local lim; lim=$(python3 -c "print(int($b*1e9))"); echo "$lim" > "$cg/memory.limit_in_bytes"
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$@"
    local rc=$?
    echo "cgroup $cg: limit $(cat $cg/memory.limit_in_bytes) B, max usage $(cat $cg/memory.max_usage_in_bytes) B (anonymous + page cache), failcnt $(cat $cg/memory.failcnt); $(grep -E '^(total_)?(rss|cache|mapped_file) ' $cg/memory.stat | tr '\n' ' ')" >&2
    rmdir "$cg" 2>/dev/null || true
    return $rc
  fi
  echo "no memory cgroup (could not create one under $CG_PARENT): RssAnon sampling only" >&2
  "$@"
}
if [ -n "${PROMPT_TEXT:-}" ]; then
  if [ ! -f "$SLICE/tiktoken.model" ]; then
    CORPUS=${TOKENIZER_CORPUS:-}
    if [ -z "$CORPUS" ]; then  # the KJV, one verse a line, without the references
      CORPUS=$(mktemp /tmp/k3_mlb_kjv.XXXXXX)
      bible -f Gen1:1-Rev22:21 | sed -E 's/^[A-Za-z0-9]+[0-9]+:[0-9]+ //' > "$CORPUS"
    fi
    echo "== training a BPE vocabulary on $CORPUS into $SLICE"
    "$K3" tokenizer train --corpus "$CORPUS" --vocab-size 16384 --out "$SLICE"
  fi
  PROMPT_ARGS=(--prompt "$(cat "$PROMPT_TEXT")")
  echo "== prompt: $PROMPT_TEXT, $("$K3" tokenize --vocab "$SLICE" --file "$PROMPT_TEXT" | tr ',' '\n' | wc -l) tokens"
else
  PROMPT_ARGS=(--ids "$(python3 -c "print(','.join(str((i*7919+13)%16384) for i in range($PROMPT)))")")
fi
for BN in $BUDGETS; do
  B=${BN%%:*}
  RING=""
  [ "$BN" != "$B" ] && RING="--trunk-slots ${BN#*:}"
  for P in $POLICIES; do
    for K in $SPECULATE; do
      SPEC=""
      [ "$K" != "0" ] && SPEC="--speculate $K${LOOKUP_IDS:+ --lookup-ids $LOOKUP_IDS}"
      echo "== budget $B GB, policy $P $RING ${SPEC:-(plain greedy)}"
      pc0=$(awk '/^Cached:/{print $2}' /proc/meminfo)
      set +e
      cg_run "$B" /usr/bin/time -f "wall %e s, user %U s, system %S s, max RSS (VmHWM, incl. file pages) %M kB" \
        "$K3" generate "$SLICE" "${PROMPT_ARGS[@]}" --max-tokens $((DECODE + 1)) --ids-out --threads "$THREADS" \
        --ram-budget "$B" $RING $SPEC --cache-policy "$P" --disk-gbps "$DISK" > /tmp/k3_mlb_out.txt 2> /tmp/k3_mlb_err.txt
      rc=$?
      set -e
      pc1=$(awk '/^Cached:/{print $2}' /proc/meminfo)
      grep -v "^k3cpp generate: CPU" /tmp/k3_mlb_err.txt || true
      echo "tokens: $(cat /tmp/k3_mlb_out.txt) (md5 $(md5sum < /tmp/k3_mlb_out.txt | cut -c1-12))"
      echo "exit $rc; system page cache $(( (pc1 - pc0) / 1024 )) MiB over the run"
      [ $rc -ne 0 ] && break 2  # the other runs refuse the same budget
    done
  done
done
if [ "${KEEP:-1}" = "0" ]; then rm -rf "$SLICE"; echo "deleted $SLICE"; fi

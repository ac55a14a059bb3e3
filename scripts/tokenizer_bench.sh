#!/usr/bin/env bash
# Tokenizer speed in one run on the same text: npm tiktoken (tools/oracle/bench.mjs) and
# k3cpp (bench_tokenizer: one thread per pattern, then encode_batch at 1..N threads).
# Needs the bench build: cmake -S . -B build -DK3_BUILD_BENCH=ON && cmake --build build --target bench_tokenizer
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=$(mktemp -d /tmp/k3_tok_bench.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
lscpu | grep -m1 'Model name' || true
node tools/oracle/oracle.mjs "$DIR" >/dev/null
node tools/oracle/bench.mjs "$DIR"
"$BUILD/bench/bench_tokenizer" --oracle-dir="$DIR" "$@"

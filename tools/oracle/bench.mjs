// Single-thread encode speed of npm tiktoken (WASM build of the Rust core) on the oracle's
// corpus, for scripts/tokenizer_bench.sh to set beside k3cpp's (bench/tokenizer.cpp).
// Usage: node bench.mjs DIR   (DIR as written by oracle.mjs: corpus.bin)
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { KIMI_PATTERN, kimiPieces } from "./oracle_lib.mjs";

const require = createRequire(import.meta.url);
const { Tiktoken } = require("tiktoken/lite");

function readCorpus(file) {
  const b = fs.readFileSync(file);
  let o = 0;
  const u32 = () => { const v = b.readUInt32LE(o); o += 4; return v; };
  const docs = [];
  for (let n = u32(); n > 0; --n) {
    const nl = u32(); const name = b.toString("utf8", o, o + nl); o += nl;
    const bl = u32(); docs.push({ name, bytes: b.subarray(o, o + bl) }); o += bl;
  }
  return docs;
}

const dir = process.argv[2];
if (!dir) { console.error("usage: node bench.mjs DIR"); process.exit(2); }
// Documents the reference encodes in quadratic time (single pieces of 25,000+ characters)
// are left out, as in bench/tokenizer.cpp, so the figure is about ordinary text.
const docs = readCorpus(path.join(dir, "corpus.bin")).filter((d) => !/^gen:(spaces|newlines|mixedspace|letters)/.test(d.name));
const dec = new TextDecoder("utf-8", { ignoreBOM: true });
const texts = docs.map((d) => dec.decode(d.bytes));
const bytes = docs.reduce((s, d) => s + d.bytes.length, 0);
for (const [mode, encName, kimi] of [["cl100k", "cl100k_base", false], ["o200k", "o200k_base", false], ["kimi_o200k", "o200k_base", true]]) {
  const e = require(`tiktoken/encoders/${encName}.json`);
  const enc = new Tiktoken(e.bpe_ranks, {}, kimi ? KIMI_PATTERN : e.pat_str);
  let best = Infinity, tokens = 0;
  for (let rep = 0; rep < 3; ++rep) {
    const t = process.hrtime.bigint();
    tokens = 0;
    for (const text of texts) {
      if (kimi) for (const p of kimiPieces(text)) tokens += enc.encode_ordinary(p).length;
      else tokens += enc.encode_ordinary(text).length;
    }
    best = Math.min(best, Number(process.hrtime.bigint() - t) / 1e9);
  }
  enc.free();
  console.log(`npm tiktoken ${mode}: ${(bytes / 1e6).toFixed(2)} MB, ${tokens} tokens, ${best.toFixed(3)} s, ${(bytes / 1e6 / best).toFixed(2)} MB/s (1 thread, best of 3)`);
}

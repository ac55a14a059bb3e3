// Reference token ids from the npm package `tiktoken` (the WebAssembly build of tiktoken's
// Rust core, pinned in package.json) for k3cpp's oracle test (tests/io/test_tiktoken_oracle.cpp).
// Usage: node oracle.mjs OUTDIR
// Writes OUTDIR/corpus.bin (corpus.mjs), OUTDIR/{cl100k_base,o200k_base}.tiktoken (the
// encoders' ranks as tiktoken.model files), OUTDIR/ids_<mode>.bin (per document: u32 count,
// then the u32 ids) for the modes cl100k (cl100k ranks + pattern), o200k (o200k ranks +
// pattern) and kimi_o200k (o200k ranks + the Kimi pattern, with the Kimi wrapper's
// long-input rule done here in JavaScript), and OUTDIR/oracle.json (patterns, timings).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { buildCorpus, writeCorpus } from "./corpus.mjs";
import { KIMI_PATTERN, kimiPieces } from "./oracle_lib.mjs";

const require = createRequire(import.meta.url);
let Tiktoken, pkg;
try {
  ({ Tiktoken } = require("tiktoken/lite"));
  // package.json is not among the package's exports: read it from the install directory.
  pkg = JSON.parse(fs.readFileSync(path.join(path.dirname(import.meta.url.replace("file://", "")),
                                             "node_modules/tiktoken/package.json"), "utf8"));
} catch (e) {
  console.error("oracle: the npm package tiktoken is not installed in tools/oracle/node_modules: run scripts/setup.sh");
  process.exit(3);
}

// The encoders' JSON holds ranks as "! <first rank> <base64> <base64> ..." lines.
function ranksToModel(bpeRanks) {
  const lines = [];
  for (const line of bpeRanks.split("\n")) {
    if (!line) continue;
    const parts = line.split(" ");
    if (parts[0] !== "!") throw new Error("oracle: unexpected ranks format");
    const first = Number(parts[1]);
    for (let k = 2; k < parts.length; ++k) lines.push(`${parts[k]} ${first + k - 2}`);
  }
  return lines.join("\n") + "\n";
}

function writeIds(file, all) {
  let total = 0;
  for (const ids of all) total += 1 + ids.length;
  const buf = Buffer.alloc(total * 4);
  let o = 0;
  for (const ids of all) {
    buf.writeUInt32LE(ids.length, o); o += 4;
    for (const id of ids) { buf.writeUInt32LE(id, o); o += 4; }
  }
  fs.writeFileSync(file, buf);
}

function main() {
  if (process.argv.length !== 3) { console.error("usage: node oracle.mjs OUTDIR"); process.exit(2); }
  const out = process.argv[2];
  fs.mkdirSync(out, { recursive: true });
  const t0 = Date.now();
  const docs = buildCorpus();
  writeCorpus(path.join(out, "corpus.bin"), docs);
  // ignoreBOM: keep a leading U+FEFF as Python's utf-8 decode does.
  const dec = new TextDecoder("utf-8", { ignoreBOM: true });
  const texts = docs.map((d) => dec.decode(d.bytes));
  const report = { tiktoken_version: pkg.version, documents: docs.length,
                   bytes: docs.reduce((s, d) => s + d.bytes.length, 0), modes: {} };
  const encoders = {};
  for (const name of ["cl100k_base", "o200k_base"]) {
    encoders[name] = require(`tiktoken/encoders/${name}.json`);
    fs.writeFileSync(path.join(out, `${name}.tiktoken`), ranksToModel(encoders[name].bpe_ranks));
  }
  const modes = [
    { mode: "cl100k", enc: "cl100k_base", pattern: encoders.cl100k_base.pat_str, kimi: false },
    { mode: "o200k", enc: "o200k_base", pattern: encoders.o200k_base.pat_str, kimi: false },
    { mode: "kimi_o200k", enc: "o200k_base", pattern: KIMI_PATTERN, kimi: true },
  ];
  for (const m of modes) {
    const t = Date.now();
    const enc = new Tiktoken(encoders[m.enc].bpe_ranks, {}, m.pattern);
    const all = texts.map((text) => {
      if (!m.kimi) return Array.from(enc.encode_ordinary(text));
      const ids = [];
      for (const piece of kimiPieces(text)) for (const id of enc.encode_ordinary(piece)) ids.push(id);
      return ids;
    });
    enc.free();
    writeIds(path.join(out, `ids_${m.mode}.bin`), all);
    report.modes[m.mode] = { pattern: m.pattern, seconds: (Date.now() - t) / 1000 };
  }
  report.seconds = (Date.now() - t0) / 1000;
  fs.writeFileSync(path.join(out, "oracle.json"), JSON.stringify(report, null, 2));
  console.log(`oracle: tiktoken ${pkg.version}, ${docs.length} documents, ${(report.bytes / 1e6).toFixed(2)} MB, ${report.seconds} s`);
}

main();

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

// The Kimi pre-tokenizer pattern exactly as tokenization_kimi.py gives it to tiktoken.
export const KIMI_PATTERN = [
  "[\\p{Han}]+",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "\\p{N}{1,3}",
  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*",
  "\\s*[\\r\\n]+",
  "\\s+(?!\\S)",
  "\\s+",
].join("|");

// Python's str.isspace over code points.
const PY_SPACE = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680,
  0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029,
  0x202f, 0x205f, 0x3000]);

// tokenization_kimi.py: 400,000-code-point chunks, each cut where a whitespace or
// non-whitespace run exceeds 25,000 code points.
export function kimiPieces(text) {
  const cps = Array.from(text);
  const out = [];
  for (let c = 0; c < cps.length; c += 400000) {
    const s = cps.slice(c, c + 400000);
    let runLen = 0, runSpace = s.length ? PY_SPACE.has(s[0].codePointAt(0)) : false, start = 0;
    for (let i = 0; i < s.length; ++i) {
      const sp = PY_SPACE.has(s[i].codePointAt(0));
      if (runSpace !== sp) { runLen = 1; runSpace = sp; }
      else if (++runLen > 25000) { out.push(s.slice(start, i).join("")); start = i; runLen = 1; }
    }
    out.push(s.slice(start).join(""));
  }
  return out;
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

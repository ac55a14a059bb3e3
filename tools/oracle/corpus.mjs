// Deterministic test corpus for the tokenizer oracle and benchmark: >= 10 MB of varied text
// from Debian packages the project installs (the KJV via `bible`, licenses, C++ headers,
// Python sources, package docs, translated man pages) plus generated text (many scripts,
// CJK, emoji, long whitespace / non-whitespace runs, numbers, invalid UTF-8). The same
// machine always gives the same corpus: files are taken in sorted order up to a budget and
// the generator uses a fixed-seed PRNG.
// Usage as a program: node corpus.mjs OUT.bin  (format: see writeCorpus).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";

function walk(dir, accept, out = []) {
  let entries;
  try { entries = fs.readdirSync(dir, { withFileTypes: true }); } catch { return out; }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, accept, out);
    else if (e.isFile() && accept(p)) out.push(p);
  }
  return out;
}

// Files under `dir` (sorted), each up to maxFile bytes, until `budget` bytes are taken.
function takeFiles(docs, tag, dir, accept, budget, maxFile = 200000) {
  let used = 0;
  for (const p of walk(dir, accept)) {
    if (used >= budget) break;
    let buf;
    try {
      buf = fs.readFileSync(p);
      if (p.endsWith(".gz")) buf = zlib.gunzipSync(buf);
    } catch { continue; }
    if (buf.length === 0) continue;
    buf = buf.subarray(0, Math.min(buf.length, maxFile, budget - used));
    docs.push({ name: `${tag}:${p}`, bytes: buf });
    used += buf.length;
  }
  // Trimmed images may lack docs or man pages: the generated fill below makes up the size.
  if (used === 0) console.error(`corpus: note: nothing readable under ${dir}`);
  return used;
}

// xorshift32: the same sequence everywhere.
function prng(seed) {
  let s = seed >>> 0 || 1;
  return () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; };
}

const SCRIPTS = {
  latin: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœŒÆ",
  greek: "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩάέήίόύώ",
  cyrillic: "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ",
  arabic: "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
  hebrew: "אבגדהוזחטיכלמנסעפצקרשת",
  devanagari: "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह्ािीुूेैोौं",
  thai: "กขคงจฉชซญดตถทนบปผพฟภมยรลวศษสหอฮะาำิีึืุู่้๊๋",
  hangul: "가나다라마바사아자차카타파하각난닫랄맘밥삿앙잦찿캌탙팦핳한국어",
  kana: "あいうえおかきくけこさしすせそたちつてとなにぬねのアイウエオカキクケコサシスセソーッ",
  han: "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坐集编宝谈府拉黑且随格尽剑讲布杀微怕母调局根曾准团段终乐切级克精哪官示冷域读㐀㐁㐂𠀀𠀁𠀂𪜀",
  cjkpunct: "、。「」『』【】〈〉《》〔〕・ー～！？，：；（）〃々〆〇",
  emoji: ["😀", "😂", "🥲", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🇯🇵", "🇺🇦", "❤️", "✨", "🔥", "🧑🏿‍🚀", "🏳️‍🌈", "☕", "🦀", "🐍"],
  marks: "\u0301\u0300\u0308\u0327\u0338\u20DD\u0E31\u0951",
  punct: "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~«»“”‘’—–…•§¶©®™°±×÷€£¥¢",
  spaces: [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00A0", "\u3000", "\u2028", "\u2029", "\u180E", "\u0085",
           "\u001C", "\u001F", "\u000B", "\u000C", "\u2003", "\u202F", "\u205F", "\u200B", "\r"],
};

function pick(r, s) { const a = typeof s === "string" ? Array.from(s) : s; return a[Math.floor(r() * a.length)]; }

function word(r, script, min, max) {
  const n = min + Math.floor(r() * (max - min + 1));
  let w = "";
  for (let i = 0; i < n; ++i) w += pick(r, SCRIPTS[script]);
  return w;
}

// Mixed-script prose: words, numbers, identifiers, contractions, punctuation, spaces.
function mixedText(r, approxChars) {
  const names = Object.keys(SCRIPTS).filter((k) => !["emoji", "marks", "punct", "spaces", "cjkpunct"].includes(k));
  const parts = [];
  let n = 0;
  while (n < approxChars) {
    const x = r();
    let t;
    if (x < 0.45) t = word(r, pick(r, names), 1, 9);
    else if (x < 0.52) t = String(Math.floor(r() * 10 ** (1 + Math.floor(r() * 12)))) + (r() < 0.3 ? "." + Math.floor(r() * 1000) : "");
    else if (x < 0.57) t = pick(r, ["get", "set", "is", "to", "HTTP", "parse", "XML", "my"]) + pick(r, ["User", "Name", "JSON", "Id", "URLs", "Value", "ABCDef"]) + pick(r, ["", "Name", "2", "_x", "ID"]);
    else if (x < 0.62) t = pick(r, ["don't", "I'M", "we'Re", "they'VE", "she'll", "IT'S", "you'd", "can'T", "o'clock", "ſ's", "'S"]);
    else if (x < 0.68) t = pick(r, SCRIPTS.emoji) + (r() < 0.3 ? pick(r, SCRIPTS.emoji) : "");
    else if (x < 0.74) t = pick(r, SCRIPTS.punct) + (r() < 0.4 ? pick(r, SCRIPTS.punct) : "");
    else if (x < 0.78) t = word(r, "han", 1, 6) + pick(r, SCRIPTS.cjkpunct);
    else if (x < 0.81) t = word(r, "latin", 1, 4) + pick(r, SCRIPTS.marks) + word(r, "latin", 0, 3);
    else if (x < 0.83) t = "<|endoftext|>" + pick(r, ["", "<|open|>", "[BOS]", "<|sep|>"]);
    else t = pick(r, SCRIPTS.spaces);
    parts.push(t);
    if (x < 0.83) parts.push(r() < 0.8 ? " " : pick(r, SCRIPTS.spaces));
    n += t.length + 1;
  }
  return parts.join("");
}

function generated(docs) {
  const r = prng(20260501);
  const enc = (s) => Buffer.from(s, "utf8");
  for (let i = 0; i < 120; ++i) docs.push({ name: `gen:mixed${i}`, bytes: enc(mixedText(r, 2000 + Math.floor(r() * 10000))) });
  // The Kimi long-input rule: runs just over 25,000 characters and a document past one
  // 400,000-character chunk.
  docs.push({ name: "gen:spaces25001", bytes: enc("x" + " ".repeat(25001) + "y") });
  docs.push({ name: "gen:newlines26000", bytes: enc("a\n" + "\n".repeat(26000) + "b c") });
  docs.push({ name: "gen:mixedspace27000", bytes: enc("q" + Array.from({ length: 27000 }, (_, k) => pick(r, [" ", "\t", "\u3000", "\u00A0", "\u001D"])).join("") + "z") });
  docs.push({ name: "gen:letters26000", bytes: enc("Hello " + word(r, "latin", 26000, 26000) + " end") });
  docs.push({ name: "gen:han3000", bytes: enc(word(r, "han", 3000, 3000)) });
  docs.push({ name: "gen:chunk450k", bytes: enc(mixedText(r, 450000)) });
  docs.push({ name: "gen:digits", bytes: enc(Array.from({ length: 200 }, () => String(Math.floor(r() * 1e15))).join(r() < 0.5 ? "" : " ")) });
  // Invalid UTF-8: stray continuation bytes, truncated sequences, surrogates, overlongs,
  // bytes that never occur in UTF-8, and random bytes.
  const bad = [0x80, 0xbf, 0xc0, 0xaf, 0xc1, 0xe2, 0x82, 0x20, 0xed, 0xa0, 0x80, 0xf0, 0x9f, 0x98, 0x41,
               0xf5, 0xff, 0xfe, 0xf4, 0x90, 0x80, 0x80, 0xe0, 0x80, 0xaf, 0xc3];
  docs.push({ name: "gen:invalid-utf8", bytes: Buffer.concat([enc("ok "), Buffer.from(bad), enc(" done"), Buffer.from([0xe4, 0xbd])]) });
  const rnd = Buffer.alloc(20000);
  for (let k = 0; k < rnd.length; ++k) rnd[k] = Math.floor(r() * 256);
  docs.push({ name: "gen:random-bytes", bytes: rnd });
  docs.push({ name: "gen:bom", bytes: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), enc("BOM first line\n")]) });
  // Characters newer than PCRE2 10.42's Unicode 14 tables: the one known difference,
  // pinned by name (see docs/tokenizer.md).
  docs.push({ name: "unicode15:cjk-ext-h-i", bytes: enc("中文\u{31350}\u{31351}字 \u{2EBF0}\u{2EBF1} ok") });
  docs.push({ name: "unicode15:kawi-nag-mundari", bytes: enc("x\u{11F04}\u{11F05}y \u{1E4D0}\u{1E4D1}z") });
}

export function buildCorpus() {
  const docs = [];
  let bible;
  try {
    bible = execFileSync("bible", ["Gen1:1-Rev22:21"], { env: { ...process.env, COLUMNS: "80" }, maxBuffer: 64 << 20 });
  } catch (e) {
    throw new Error("corpus: cannot run `bible` (Debian package bible-kjv; run scripts/setup.sh): " + e.message);
  }
  // Split the KJV into documents of ~100 KB at line ends.
  for (let start = 0, k = 0; start < bible.length; ++k) {
    let end = Math.min(bible.length, start + 100000);
    const nl = bible.indexOf(0x0a, end);
    end = nl < 0 ? bible.length : nl + 1;
    docs.push({ name: `kjv:${k}`, bytes: bible.subarray(start, end) });
    start = end;
  }
  takeFiles(docs, "license", "/usr/share/common-licenses", () => true, 600000);
  takeFiles(docs, "cxx", "/usr/include/c++", (p) => !p.includes("/pstl/"), 1500000, 60000);
  const py = fs.readdirSync("/usr/lib").filter((d) => /^python3\.\d+$/.test(d)).sort();
  if (!py.length) throw new Error("corpus: no /usr/lib/python3.X (run scripts/setup.sh)");
  takeFiles(docs, "python", `/usr/lib/${py[py.length - 1]}`, (p) => p.endsWith(".py"), 1500000, 60000);
  takeFiles(docs, "doc", "/usr/share/doc", (p) => /(changelog\.Debian\.gz|copyright|README[^/]*)$/.test(p), 1200000, 30000);
  takeFiles(docs, "man", "/usr/share/man", (p) => p.endsWith(".gz") && !p.includes("/man/man"), 1500000, 30000);
  generated(docs);
  // At least 10.5 MB in all, whatever the machine lacked of the files above.
  const r = prng(7);
  let total = docs.reduce((s, d) => s + d.bytes.length, 0);
  for (let k = 0; total < 10500000; ++k) {
    const bytes = Buffer.from(mixedText(r, 50000), "utf8");
    docs.push({ name: `gen:fill${k}`, bytes });
    total += bytes.length;
  }
  return docs;
}

// u32 doc count, then per doc: u32 name length, name (UTF-8), u32 byte length, bytes.
export function writeCorpus(file, docs) {
  const chunks = [];
  const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
  chunks.push(u32(docs.length));
  for (const d of docs) {
    const name = Buffer.from(d.name, "utf8");
    chunks.push(u32(name.length), name, u32(d.bytes.length), d.bytes);
  }
  fs.writeFileSync(file, Buffer.concat(chunks));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  if (process.argv.length !== 3) { console.error("usage: node corpus.mjs OUT.bin"); process.exit(2); }
  const docs = buildCorpus();
  writeCorpus(process.argv[2], docs);
  const bytes = docs.reduce((s, d) => s + d.bytes.length, 0);
  console.log(`corpus: ${docs.length} documents, ${(bytes / 1e6).toFixed(2)} MB -> ${process.argv[2]}`);
}

// Shared by oracle.mjs and bench.mjs: the Kimi pattern and the Kimi wrapper's long-input rule.
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

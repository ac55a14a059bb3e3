// A streaming load client for `k3cpp serve` (not part of ctest; scripts/serve_load.sh runs it):
//   node load.mjs <k3cpp> <model dir> [--requests N] [--levels 1,4,16] [--server-args "..."]
// Starts the server on loopback (port 0) itself, warms it up, then for each concurrency level
// sends N streaming chat requests (stream_options.include_usage) of mixed prompt lengths (short,
// medium, long; some sharing a system prompt, each with a unique user turn) and mixed output
// lengths (max_tokens 8..128), from that many concurrent workers. Per level it reports
// requests/s, generated tokens/s (usage.completion_tokens over the level's wall time), p50/p99
// time to first token (request sent -> first reasoning/content/tool-call delta) and inter-token
// latency (the gaps between later deltas, one delta per engine token event), and failed requests
// (anything but 200 + a finish + [DONE]); the server's RSS before and after. Exits 1 if any
// request failed. Output: a Markdown table.
import { startServer } from "./server.mjs";

const args = process.argv.slice(2);
const [k3cpp, model] = args;
const opt = (name, def) => {
  const i = args.indexOf("--" + name);
  return i >= 0 ? args[i + 1] : def;
};
if (!k3cpp || !model) {
  console.error('usage: node load.mjs <k3cpp> <model dir> [--requests N] [--levels 1,4,16] [--server-args "..."]');
  process.exit(2);
}
const perLevel = Number(opt("requests", "120"));
const levels = opt("levels", "1,4,16").split(",").map(Number);
const serverArgs = opt("server-args", "--parallel 16 --queue-limit 256").split(" ").filter(Boolean);
const srv = await startServer(k3cpp, model, serverArgs);

const words = "the quick brown fox jumps over a lazy dog while seven wizards quietly box jolly kings near the river".split(" ");
function text(n, seed) {
  let s = "";
  for (let i = 0; i < n; ++i) s += words[(seed * 31 + i * 7) % words.length] + " ";
  return s;
}
const system = "You are a helpful assistant. " + text(60, 1);
let counter = 0;
function makeRequest() {
  const k = counter++;
  const len = [4, 40, 300][k % 3];
  const messages = [];
  if (k % 2 === 0) messages.push({ role: "system", content: system });
  messages.push({ role: "user", content: `Request ${k}: ` + text(len, k) });
  return {
    messages,
    max_tokens: [8, 32, 64, 128][(k >> 1) % 4],
    temperature: 1.0,
    seed: k,
    stream: true,
    stream_options: { include_usage: true },
  };
}

async function one(body) {
  const t0 = performance.now();
  const r = { ok: false, ttft: null, gaps: [], tokens: 0, error: null };
  try {
    const res = await fetch(srv.base + "/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (res.status !== 200) {
      r.error = `HTTP ${res.status}: ${await res.text()}`;
      return r;
    }
    const dec = new TextDecoder();
    let buf = "", last = null, finished = false, done = false;
    for await (const chunk of res.body) {
      buf += dec.decode(chunk, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        if (!ev.startsWith("data: ")) continue;
        const data = ev.slice(6);
        if (data === "[DONE]") {
          done = true;
          continue;
        }
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) r.tokens = j.usage.completion_tokens;
        for (const c of j.choices) {
          const d = c.delta;
          if (d.reasoning_content || d.content || d.tool_calls) {
            const now = performance.now();
            if (r.ttft === null) r.ttft = now - t0;
            else r.gaps.push(now - last);
            last = now;
          }
          if (c.finish_reason) finished = true;
        }
      }
    }
    r.ok = finished && done;
    if (!r.ok) r.error = "stream ended without a finish or [DONE]";
  } catch (e) {
    r.error = String(e);
  }
  return r;
}

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

// warm-up (prefix cache, page faults), not measured
await Promise.all([0, 1, 2, 3].map(() => one(makeRequest())));
const rssBefore = srv.rssKiB();
const rows = [];
let failedTotal = 0;
for (const conc of levels) {
  const results = [];
  let next = 0;
  const cpu0 = srv.threadCpu();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: conc }, async () => {
      while (next < perLevel) {
        ++next;
        results.push(await one(makeRequest()));
      }
    }),
  );
  const wall = (performance.now() - t0) / 1000;
  const cpu1 = srv.threadCpu();
  // The HTTP layer's CPU time against the engine's: how much the server spends outside the model.
  const httpShare = (cpu1.other - cpu0.other) / Math.max(1e-9, cpu1.engine - cpu0.engine);
  const ok = results.filter((r) => r.ok);
  const failed = results.length - ok.length;
  failedTotal += failed;
  for (const r of results) if (!r.ok) console.error("failed:", r.error);
  const tokens = ok.reduce((a, r) => a + r.tokens, 0);
  const ttft = ok.map((r) => r.ttft).filter((x) => x !== null);
  const itl = ok.flatMap((r) => r.gaps);
  rows.push({ conc, n: results.length, failed, rps: results.length / wall, tps: tokens / wall,
              ttft50: pct(ttft, 50), ttft99: pct(ttft, 99), itl50: pct(itl, 50), itl99: pct(itl, 99), rss: srv.rssKiB(), httpShare });
}
const rssAfter = srv.rssKiB();
const metrics = await (await fetch(srv.base + "/metrics")).text();
const { code } = await srv.stop();

const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : "-");
console.log(`model ${model}; server ${serverArgs.join(" ")}; ${perLevel} streaming requests per level`);
console.log("| concurrency | requests | failed | requests/s | generated tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | server RSS MiB after | HTTP CPU / engine CPU |");
console.log("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
for (const r of rows)
  console.log(`| ${r.conc} | ${r.n} | ${r.failed} | ${f(r.rps, 2)} | ${f(r.tps)} | ${f(r.ttft50)} | ${f(r.ttft99)} | ${f(r.itl50, 2)} | ${f(r.itl99, 2)} | ${f(r.rss / 1024)} | ${f(100 * r.httpShare, 2)} % |`);
const hits = Number((metrics.match(/\nk3_prefix_cache_hits_total (\d+)/) || [])[1]);
const misses = Number((metrics.match(/\nk3_prefix_cache_misses_total (\d+)/) || [])[1]);
const gauge = (name) => Number((metrics.match(new RegExp("\n" + name + " (\\d+)")) || [])[1]);
console.log(`server RSS: ${f(rssBefore / 1024)} MiB after warm-up, ${f(rssAfter / 1024)} MiB after all levels ` +
            `(state memory in use ${f(gauge("k3_state_memory_bytes") / 1048576)} MiB, of which prefix-cache snapshots ` +
            `${f(gauge("k3_prefix_cache_memory_bytes") / 1048576)} MiB); prefix cache ${hits} hits / ${misses} misses; exit ${code} after SIGTERM`);
process.exit(failedTotal === 0 && code === 0 ? 0 : 1);

// Starts `k3cpp serve <model> --port 0 ...` as a child process, reads the port from its
// "listening on http://HOST:PORT" line, waits for GET /health to answer 200, and stops it with
// SIGTERM (resolving to the exit code). Shared by the checks in this folder.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";

export async function startServer(k3cpp, model, extra = [], { quiet = true } = {}) {
  const proc = spawn(k3cpp, ["serve", model, "--port", "0", ...extra], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => {
    stderr += d;
    if (!quiet) process.stderr.write(d);
  });
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    let out = "";
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    exited.then(({ code }) => reject(new Error(`k3cpp serve exited (${code}) before listening:\n${stderr}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; ++i) {
    const r = await fetch(base + "/health").catch(() => null);
    if (r && r.status === 200) break;
    if (i > 600) throw new Error("the server never became healthy:\n" + stderr);
    await new Promise((res) => setTimeout(res, 50));
  }
  return {
    proc,
    port,
    base,
    stderr: () => stderr,
    // CPU seconds of the server's threads so far, split by thread name: "k3-engine" is the
    // engine's scheduler and its OpenMP team (the model's compute), everything else the HTTP
    // workers, the main thread and loading (/proc/PID/task/TID/stat: utime + stime, in ticks of 100 Hz).
    threadCpu() {
      const out = { engine: 0, other: 0 };
      for (const tid of readdirSync(`/proc/${proc.pid}/task`)) {
        let stat;
        try {
          stat = readFileSync(`/proc/${proc.pid}/task/${tid}/stat`, "utf8");
        } catch {
          continue;  // the thread ended
        }
        const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
        const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        const s = (Number(f[11]) + Number(f[12])) / 100;  // fields 14, 15 of stat(5)
        if (name === "k3-engine") out.engine += s;
        else out.other += s;
      }
      return out;
    },
    rssKiB() {
      const m = readFileSync(`/proc/${proc.pid}/status`, "utf8").match(/VmRSS:\s+(\d+) kB/);
      return m ? Number(m[1]) : -1;
    },
    async stop(timeoutMs = 20000) {
      proc.kill("SIGTERM");
      const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
      const r = await exited;
      clearTimeout(timer);
      return r;
    },
  };
}

// A hard stop for the whole check: the process exits non-zero after `ms` whatever happens.
export function deadline(ms, cleanup) {
  const t = setTimeout(async () => {
    console.error(`FAIL: timed out after ${ms / 1000} s`);
    try {
      await cleanup?.();
    } finally {
      process.exit(1);
    }
  }, ms);
  t.unref();
}

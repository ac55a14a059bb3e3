// The embedded chat page (GET /) in a real browser: Debian's Chromium, headless, driven by
// puppeteer-core (pinned in package.json):
//   node browser_check.mjs <k3cpp> <model dir> <screenshot.png>
// Starts `k3cpp serve --port 0`, opens the page, sends a message, waits until the streamed reply
// has finished (the page marks it done), checks that reasoning and answer went to their own
// areas (reasoning dimmed, in a collapsible block) and that the page's state says the stream
// ended with a finish reason, sends a second turn (the history goes back with the reasoning)
// and a third with thinking off (the reply lands in the answer area),
// saves a screenshot, stops the browser and the server (SIGTERM, exit 0). It stops itself after
// 90 s whatever happens.
import puppeteer from "puppeteer-core";
import assert from "node:assert/strict";
import { startServer, deadline } from "./server.mjs";

const [k3cpp, model, shot] = process.argv.slice(2);
if (!k3cpp || !model || !shot) {
  console.error("usage: node browser_check.mjs <k3cpp> <model dir> <screenshot.png>");
  process.exit(2);
}
const srv = await startServer(k3cpp, model, ["--threads", "1"]);
let browser = null;
deadline(90000, async () => {
  srv.proc.kill("SIGKILL");
  if (browser) browser.process()?.kill("SIGKILL");
});
try {
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage"],
    timeout: 60000,
  });
  const page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 700 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(srv.base + "/", { waitUntil: "load", timeout: 30000 });
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0, { timeout: 10000 });

  async function turn(text, k) {
    await page.$eval("#max", (el) => (el.value = "40"));
    await page.type("#input", text);
    await page.click("#send");
    await page.waitForFunction(
      (k) => {
        const s = document.querySelectorAll(".msg.assistant .status")[k];
        return s && (s.dataset.state === "done" || s.dataset.state === "error");
      },
      { timeout: 30000 },
      k,
    );
    return page.evaluate((k) => {
      const box = document.querySelectorAll(".msg.assistant")[k];
      const r = box.querySelector(".reasoning");
      return {
        state: box.querySelector(".status").dataset.state,
        status: box.querySelector(".status").textContent,
        reasoning: r.textContent,
        reasoningColor: getComputedStyle(r).color,
        answerColor: getComputedStyle(box.querySelector(".answer")).color,
        inDetails: r.parentElement.tagName,
        answer: box.querySelector(".answer").textContent,
        users: document.querySelectorAll(".msg.user").length,
      };
    }, k);
  }

  const a = await turn("Hello! What can you do?", 0);
  assert.equal(a.state, "done", "the stream ended: " + a.status);
  assert.match(a.status, /done · (stop|length|tool_calls)/);
  assert.ok(a.reasoning.length + a.answer.length > 0, "the reply streamed into the page");
  assert.equal(a.inDetails, "DETAILS", "reasoning sits in a collapsible block");
  assert.notEqual(a.reasoningColor, a.answerColor, "reasoning is dimmed apart from the answer");
  for (const m of ["<|open|>", "<|close|>", "<|sep|>"]) assert.ok(!a.answer.includes(m) && !a.reasoning.includes(m));
  console.log(`ok - first reply: ${a.reasoning.length} reasoning chars, ${a.answer.length} answer chars (${a.status})`);
  const b = await turn("Tell me more.", 1);
  assert.equal(b.state, "done", b.status);
  assert.equal(b.users, 2);
  console.log(`ok - second turn: ${b.status}`);
  // Thinking off: the reply opens the response directly, so it lands in the answer area.
  await page.select("#effort", "none");
  const c = await turn("Answer without thinking.", 2);
  assert.equal(c.state, "done", c.status);
  assert.ok(c.answer.length > 0, "thinking off: the reply streamed into the answer area");
  assert.equal(c.reasoning, "");
  console.log(`ok - thinking off: ${c.answer.length} answer chars (${c.status})`);
  assert.deepEqual(errors, [], "no script errors in the page");
  await page.screenshot({ path: shot });
  console.log("ok - screenshot " + shot);
  await browser.close();
  browser = null;
} catch (e) {
  console.error("FAIL:", e);
  console.error(srv.stderr());
  if (browser) browser.process()?.kill("SIGKILL");
  srv.proc.kill("SIGKILL");
  process.exit(1);
}
const { code } = await srv.stop();
if (code !== 0) {
  console.error(`FAIL: k3cpp serve exited with ${code} after SIGTERM`);
  process.exit(1);
}
console.log("ok - SIGTERM: exit 0");

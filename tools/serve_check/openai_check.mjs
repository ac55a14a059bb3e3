// The real `openai` npm client (pinned in package.json) against `k3cpp serve`:
//   node openai_check.mjs <k3cpp> <model dir>
// Starts the server with an API key on port 0, then through the client: models.list; a plain
// chat completion; a streamed one with include_usage (iterated chunk by chunk, and again with the
// client's ChatCompletionStream helper, which accumulates and validates the deltas itself);
// tools (a declaration and a tool-result round trip); response_format json_object and
// json_schema; a completion; n = 2; errors (a bad request is the client's BadRequestError, a
// wrong key its AuthenticationError); an image content part (a 16 x 16 PPM as a base64 data URL,
// the tiny model's random encoder: 4 image tokens) and an http image URL refused. Greedy requests must agree streamed and not. Then SIGTERM:
// the server must exit 0. Any failed check exits 1.
import OpenAI from "openai";
import assert from "node:assert/strict";
import { startServer, deadline } from "./server.mjs";

const [k3cpp, model] = process.argv.slice(2);
if (!k3cpp || !model) {
  console.error("usage: node openai_check.mjs <k3cpp> <model dir>");
  process.exit(2);
}
const KEY = "check-key-" + process.pid;
const srv = await startServer(k3cpp, model, ["--api-key", KEY, "--parallel", "4", "--ctx", "2048", "--threads", "1"]);
deadline(120000, () => srv.proc.kill("SIGKILL"));
const client = new OpenAI({ baseURL: srv.base + "/v1", apiKey: KEY, maxRetries: 0, timeout: 60000 });
let checks = 0;
const ok = (what) => {
  ++checks;
  console.log("ok - " + what);
};
const messages = [
  { role: "system", content: "You are brief." },
  { role: "user", content: "Say hello." },
];

try {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  const id = models.data[0].id;
  assert.equal(typeof id, "string");
  ok(`models.list: ${id}`);

  const plain = await client.chat.completions.create({ model: id, messages, max_tokens: 24, temperature: 0 });
  assert.equal(plain.object, "chat.completion");
  const c0 = plain.choices[0];
  assert.equal(c0.message.role, "assistant");
  assert.ok(typeof c0.message.content === "string" || c0.message.tool_calls, "content or tool calls");
  assert.ok(["stop", "length", "tool_calls"].includes(c0.finish_reason), c0.finish_reason);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
  assert.ok(plain.usage.completion_tokens >= 1 && plain.usage.completion_tokens <= 24);
  assert.equal(typeof plain.usage.prompt_tokens_details.cached_tokens, "number");
  for (const m of ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]) assert.ok(!(c0.message.content ?? "").includes(m));
  ok(`chat.completions.create: ${plain.usage.completion_tokens} tokens, finish ${c0.finish_reason}`);

  const stream = await client.chat.completions.create({
    model: id, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let content = "", reasoning = "", finish = null, usage = null, n = 0, first = true;
  for await (const chunk of stream) {
    ++n;
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) {
      assert.equal(chunk.choices.length, 0, "the usage chunk has no choices");
      usage = chunk.usage;
      continue;
    }
    const d = chunk.choices[0].delta;
    if (first) assert.equal(d.role, "assistant", "the first delta carries the role");
    first = false;
    content += d.content ?? "";
    reasoning += d.reasoning_content ?? "";
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(content, c0.message.content ?? "");
  assert.equal(reasoning, c0.message.reasoning_content ?? "");
  assert.equal(finish, c0.finish_reason);
  assert.ok(usage, "include_usage sent a usage chunk");
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0, "the repeated prompt hit the prefix cache");
  ok(`streamed (${n} chunks) equals the plain reply; usage chunk; cached ${usage.prompt_tokens_details.cached_tokens}`);

  const runner = client.chat.completions.stream({ model: id, messages, max_tokens: 24, temperature: 0 });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content ?? "", c0.message.content ?? "");
  ok("ChatCompletionStream helper accumulates the same message");

  const tools = [{
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather for a city",
      parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] },
    },
  }];
  const withTools = await client.chat.completions.create({
    model: id, max_tokens: 32, temperature: 0, tools, tool_choice: "auto",
    messages: [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris","days":2}' } }] },
      { role: "tool", tool_call_id: "call_1", content: '{"temp_c":21}' },
      { role: "user", content: "And tomorrow?" },
    ],
  });
  for (const tc of withTools.choices[0].message.tool_calls ?? []) {
    assert.equal(tc.type, "function");
    assert.equal(typeof tc.id, "string");
    JSON.parse(tc.function.arguments);
  }
  assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens, "the tool declaration is in the prompt");
  const toolStream = client.chat.completions.stream({ model: id, max_tokens: 32, tools, messages: [{ role: "user", content: "Weather in Oslo?" }] });
  await toolStream.finalChatCompletion();
  ok(`tools: declaration + tool-result round trip (${withTools.usage.prompt_tokens} prompt tokens), streamed with tools`);

  for (const response_format of [
    { type: "json_object" },
    {
      type: "json_schema",
      json_schema: {
        name: "answer",
        schema: { type: "object", properties: { ok: { type: "boolean" }, colour: { enum: ["red", "green"] } }, required: ["ok", "colour"], additionalProperties: false },
      },
    },
  ]) {
    const r = await client.chat.completions.create({ model: id, messages, max_tokens: 300, temperature: 0, response_format });
    const ch = r.choices[0];
    assert.equal(typeof ch.message.content, "string");
    if (response_format.type === "json_schema") {
      assert.equal(ch.finish_reason, "stop", "a bounded schema always completes");
      const v = JSON.parse(ch.message.content);
      assert.equal(typeof v.ok, "boolean");
      assert.ok(["red", "green"].includes(v.colour));
    } else if (ch.finish_reason === "stop") {
      assert.equal(typeof JSON.parse(ch.message.content), "object");
    }
    // The client's own parse helper (zod-free form): chat.completions.parse returns message.parsed.
    if (response_format.type === "json_schema") {
      const p = await client.chat.completions.parse({ model: id, messages, max_tokens: 300, temperature: 0, response_format });
      assert.deepEqual(p.choices[0].message.parsed, JSON.parse(ch.message.content));
    }
    ok(`response_format ${response_format.type}: finish ${ch.finish_reason}, content ${ch.message.content.slice(0, 60)}`);
  }

  const cmpl = await client.completions.create({ model: id, prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
  assert.equal(cmpl.object, "text_completion");
  assert.equal(typeof cmpl.choices[0].text, "string");
  ok("completions.create");

  const two = await client.chat.completions.create({ model: id, messages, max_tokens: 6, n: 2, seed: 7 });
  assert.equal(two.choices.length, 2);
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  ok("n = 2");

  // An image part: the prompt grows by the image's tokens (one <|media_pad|> becomes 4).
  const px = Buffer.alloc(16 * 16 * 3);
  for (let i = 0; i < px.length; ++i) px[i] = (i * 37) % 256;
  const ppm = Buffer.concat([Buffer.from("P6\n16 16\n255\n"), px]);
  const imageMessages = (url) => [
    { role: "user", content: [{ type: "image_url", image_url: { url } }, { type: "text", text: "What is this?" }] },
  ];
  const textOnly = await client.chat.completions.create({
    model: id, messages: [{ role: "user", content: [{ type: "text", text: "What is this?" }] }], max_tokens: 4, temperature: 0,
  });
  const seen = await client.chat.completions.create({
    model: id, messages: imageMessages("data:image/x-portable-pixmap;base64," + ppm.toString("base64")), max_tokens: 4, temperature: 0,
  });
  assert.equal(seen.object, "chat.completion");
  assert.equal(seen.usage.prompt_tokens, textOnly.usage.prompt_tokens + 4);
  await assert.rejects(
    client.chat.completions.create({ model: id, messages: imageMessages("https://example.com/cat.png"), max_tokens: 4 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /not fetched/.test(e.message) && /image_url/.test(e.param),
  );
  ok("image_url part: a data URL read (+4 prompt tokens), an https URL refused");

  await assert.rejects(
    client.chat.completions.create({ model: id, messages: [{ role: "wizard", content: "x" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /role/.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({ model: id, messages, max_tokens: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "max_tokens",
  );
  const wrong = new OpenAI({ baseURL: srv.base + "/v1", apiKey: "nope", maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  ok("errors: BadRequestError (role, max_tokens param), AuthenticationError");
} catch (e) {
  console.error("FAIL:", e);
  console.error(srv.stderr());
  srv.proc.kill("SIGKILL");
  process.exit(1);
}

const { code, signal } = await srv.stop();
if (code !== 0) {
  console.error(`FAIL: k3cpp serve exited with ${code} (signal ${signal}) after SIGTERM\n` + srv.stderr());
  process.exit(1);
}
ok("SIGTERM: exit 0");
console.log(`all ${checks} checks passed`);

// Tool calls through a real OpenAI client (the `openai` npm package) against
// offgraph serve on a model whose chat template takes tools (Qwen3's):
// tool_choice "required" and a named function, streamed and not (a call
// streams as OpenAI streams it: a first delta naming it, then its arguments in
// pieces; the deltas put together by hand and by the client's own stream
// helper give the calls the plain response gives), a second turn that sends the calls and
// their results back (role "tool"), "auto" and "none" (text), and refusals
// the client raises as its own error type. Writes the calls it got to
// <out>/calls.json for the caller to validate against the tools' schemas.
// Usage: node openai_tools.mjs <port> <folder holding node_modules/openai> <out>
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [port, where, out] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(where), "package.json"));
const OpenAI = require("openai").default ?? require("openai");

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", timeout: 120000, maxRetries: 0 });
let failures = 0;
const check = (ok, what) => {
  if (!ok) {
    failures++;
    console.log(`FAIL: ${what}`);
  }
};

const tools = JSON.parse(fs.readFileSync(path.join(out, "tools.json"), "utf8"));
const messages = [{ role: "user", content: "What is the weather in Paris, and what is 2 + 40?" }];
const base = { model: "m", messages, tools, max_tokens: 300, temperature: 0 };
const got = []; // [tool name, arguments object] of every call, for the schema check

const callsOf = (m) => (m.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]);

// required, one call
const r = await client.chat.completions.create({ ...base, tool_choice: "required", parallel_tool_calls: false });
const msg = r.choices[0].message;
check(r.choices[0].finish_reason === "tool_calls", `required: finish_reason ${r.choices[0].finish_reason}`);
check(msg.tool_calls?.length === 1 && msg.content === null, `required: message ${JSON.stringify(msg)}`);
for (const c of msg.tool_calls ?? []) {
  check(c.type === "function" && /^call_[0-9a-f]+$/.test(c.id) && typeof c.function.arguments === "string",
        `required: call ${JSON.stringify(c)}`);
  got.push([c.function.name, JSON.parse(c.function.arguments)]);
}

// the same streamed: deltas put together by hand
const s = await client.chat.completions.create({ ...base, tool_choice: "required", parallel_tool_calls: false,
                                                 stream: true });
// As OpenAI streams a call: its first delta has its index, id, type, name and
// arguments "", the next ones only its index and pieces of its arguments.
const acc = [];
let finish = null, content = "";
for await (const chunk of s) {
  const d = chunk.choices[0]?.delta ?? {};
  content += d.content ?? "";
  for (const tc of d.tool_calls ?? []) {
    if (acc[tc.index] === undefined) {
      check(tc.index === acc.length && typeof tc.id === "string" && tc.type === "function" &&
            typeof tc.function?.name === "string" && tc.function?.arguments === "",
            `stream: a call's first delta ${JSON.stringify(tc)}`);
      acc[tc.index] = { id: "", name: "", arguments: "", pieces: 0 };
    } else {
      check(tc.id === undefined && tc.type === undefined && tc.function?.name === undefined &&
            typeof tc.function?.arguments === "string" && tc.function.arguments !== "",
            `stream: a delta of arguments ${JSON.stringify(tc)}`);
      acc[tc.index].pieces++;
    }
    acc[tc.index].id += tc.id ?? "";
    acc[tc.index].name += tc.function?.name ?? "";
    acc[tc.index].arguments += tc.function?.arguments ?? "";
  }
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
check(finish === "tool_calls" && content === "", `stream: finish ${finish}, content "${content}"`);
check(JSON.stringify(acc.map((c) => [c.name, c.arguments])) === JSON.stringify(callsOf(msg)),
      `stream: calls ${JSON.stringify(acc)} != ${JSON.stringify(callsOf(msg))}`);
// arguments of several tokens come in several deltas
for (const c of acc)
  check(c.arguments.length < 8 || c.pieces > 1, `stream: arguments ${c.arguments} in ${c.pieces} deltas`);
console.log(`openai tools: streamed arguments in ${JSON.stringify(acc.map((c) => c.pieces))} deltas`);

// streamed through the client's own helper, which joins the deltas itself
const runner = client.beta.chat.completions.stream({ ...base, tool_choice: "required", parallel_tool_calls: false });
const final = await runner.finalChatCompletion();
check(JSON.stringify(callsOf(final.choices[0].message)) === JSON.stringify(callsOf(msg)),
      `stream helper: ${JSON.stringify(final.choices[0].message)}`);

// a named function, sampled
for (const seed of [1, 2, 3]) {
  const n = await client.chat.completions.create({ ...base, temperature: 1, seed,
    tool_choice: { type: "function", function: { name: "add" } } });
  const m = n.choices[0].message;
  check(m.tool_calls?.length >= 1 && m.tool_calls.every((c) => c.function.name === "add"),
        `named: ${JSON.stringify(m)}`);
  for (const c of m.tool_calls ?? []) got.push([c.function.name, JSON.parse(c.function.arguments)]);
}

// the calls and their results sent back: a second turn
const turn2 = [...messages, msg, ...msg.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id,
                                                                  content: '{"temperature": 18}' }))];
const r2 = await client.chat.completions.create({ ...base, messages: turn2, max_tokens: 8, tool_choice: "auto" });
check(r2.usage.prompt_tokens > r.usage.prompt_tokens + 10, `second turn: usage ${JSON.stringify(r2.usage)}`);
check(["stop", "length", "tool_calls"].includes(r2.choices[0].finish_reason), `second turn: ${JSON.stringify(r2)}`);

// auto and none: this model (random weights) writes text
for (const tool_choice of ["auto", "none"]) {
  const a = await client.chat.completions.create({ ...base, max_tokens: 8, tool_choice });
  const m = a.choices[0].message;
  check(typeof m.content === "string" || m.tool_calls?.length, `${tool_choice}: ${JSON.stringify(m)}`);
  if (tool_choice === "none") check(!m.tool_calls && a.choices[0].finish_reason !== "tool_calls", `none: ${JSON.stringify(a)}`);
}
// none does not show the tools to the template: a shorter prompt
const none = await client.chat.completions.create({ ...base, max_tokens: 1, tool_choice: "none" });
check(none.usage.prompt_tokens < r.usage.prompt_tokens - 100, `none: prompt ${none.usage.prompt_tokens}`);

// refusals
const refused = async (what, body, param) => {
  try {
    await client.chat.completions.create({ ...base, max_tokens: 4, ...body });
    check(false, `${what}: accepted`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === 400 && e.param === param, `${what}: ${e} (param ${e.param})`);
  }
};
await refused("unknown function", { tool_choice: { type: "function", function: { name: "nope" } } }, "tool_choice");
await refused("required without tools", { tools: undefined, tool_choice: "required" }, "tool_choice");
await refused("a tool message without its call id", { messages: [...messages, { role: "tool", content: "1" }] },
              "messages[1].tool_call_id");
await refused("arguments that are not JSON", { messages: [...messages, { role: "assistant", content: null,
  tool_calls: [{ id: "c1", type: "function", function: { name: "add", arguments: "{a: 1" } }] }] },
  "messages[1].tool_calls[0]");

fs.writeFileSync(path.join(out, "calls.json"), JSON.stringify(got));
if (failures === 0) console.log(`openai tools: all passed (${got.length} calls)`);
process.exit(failures ? 1 : 0);

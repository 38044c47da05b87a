// A real OpenAI client (the `openai` npm package) against offgraph serve:
// streaming and non-streaming completions and chat completions, n > 1 with
// penalties, logit_bias and logprobs, a streamed prompt array, the models
// list, and errors the client raises as its own exception type.
// Usage: node openai_client.mjs <port> <folder holding node_modules/openai>
import { createRequire } from "node:module";
import path from "node:path";

const [port, where] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(where), "package.json"));
const OpenAI = require("openai").default ?? require("openai");

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "k3y", timeout: 60000, maxRetries: 0 });
let failures = 0;
const check = (ok, what) => {
  if (!ok) {
    failures++;
    console.log(`FAIL: ${what}`);
  }
};

const models = await client.models.list();
const id = models.data[0]?.id;
check(id === "kjv-tiny", `models.list: ${JSON.stringify(models.data)}`);

const c = await client.completions.create({ model: id, prompt: "In the beginning", max_tokens: 12, temperature: 0 });
check(c.object === "text_completion" && c.choices[0].text.length > 0, `completions: ${JSON.stringify(c)}`);
check(c.usage.completion_tokens > 0 && c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens,
      `completions usage: ${JSON.stringify(c.usage)}`);

let streamed = "";
let finish = null;
const cs = await client.completions.create({ model: id, prompt: "In the beginning", max_tokens: 12, temperature: 0,
                                             stream: true });
for await (const chunk of cs) {
  streamed += chunk.choices[0]?.text ?? "";
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
check(streamed === c.choices[0].text, `streamed completion "${streamed}" != "${c.choices[0].text}"`);
check(finish === c.choices[0].finish_reason, `stream finish_reason ${finish}`);

const chat = await client.chat.completions.create({ model: id, max_tokens: 10, temperature: 0,
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "And God said" }] });
check(chat.object === "chat.completion" && chat.choices[0].message.role === "assistant" &&
      typeof chat.choices[0].message.content === "string" && chat.usage.completion_tokens > 0,
      `chat: ${JSON.stringify(chat)}`);

let chatStreamed = "";
let usage = null;
const st = await client.chat.completions.create({ model: id, max_tokens: 10, temperature: 0, stream: true,
  stream_options: { include_usage: true },
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "And God said" }] });
for await (const chunk of st) {
  chatStreamed += chunk.choices[0]?.delta?.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
check(chatStreamed === chat.choices[0].message.content,
      `streamed chat "${chatStreamed}" != "${chat.choices[0].message.content}"`);
check(usage && usage.completion_tokens === chat.usage.completion_tokens, `stream usage ${JSON.stringify(usage)}`);

// n > 1, penalties, logit_bias and logprobs as the client sends them
const many = await client.chat.completions.create({ model: id, max_tokens: 8, temperature: 1, seed: 3, n: 3,
  presence_penalty: 0.5, frequency_penalty: 0.5, logit_bias: { "0": -100 }, logprobs: true, top_logprobs: 2,
  messages: [{ role: "user", content: "And God said" }] });
check(many.choices.length === 3 && many.choices.every((ch, i) => ch.index === i &&
      typeof ch.message.content === "string" && ch.logprobs.content.length > 0 &&
      ch.logprobs.content[0].top_logprobs.length === 2) &&
      many.usage.completion_tokens === many.choices.reduce((a, ch) => a + ch.logprobs.content.length, 0),
      `chat n=3: ${JSON.stringify(many)}`);
const seen = new Set();
let usageChunks = 0, lastUsage = null;
const ns = await client.completions.create({ model: id, prompt: ["In the beginning", "And God said"], n: 2,
  max_tokens: 6, temperature: 0.8, seed: 1, stream: true, stream_options: { include_usage: true } });
for await (const chunk of ns) {
  for (const ch of chunk.choices) seen.add(ch.index);
  if (chunk.usage) usageChunks++, lastUsage = chunk;
}
check(seen.size === 4 && [0, 1, 2, 3].every((i) => seen.has(i)), `streamed prompt array n=2: indices ${[...seen]}`);
check(usageChunks === 1 && lastUsage.choices.length === 0, `streamed usage: ${usageChunks} chunks`);

try {
  await client.chat.completions.create({ model: id, max_tokens: 2, messages: [{ role: "user", content: "x" }],
                                         audio: { voice: "alloy", format: "wav" } });
  check(false, "audio did not fail");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400 && e.param === "audio", `audio: ${e}`);
}

try {
  await client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 2 });
  check(false, "an unknown model did not fail");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 404, `unknown model: ${e}`);
}

if (failures === 0) console.log("openai client: all passed");
process.exit(failures ? 1 : 0);

#!/usr/bin/env node
// Measurement: how many of 20 varied tool-calling prompts yield a correct call on a real model, unguided vs guided.
// Prints a table; asserts nothing.
//
// For each configuration it starts `node bin/keel.mjs serve --model_path <MODEL> --tool_parser <PARSER>` (with and
// without --enable_tool_guided_generation true; --deterministic true so runs compare), sends the 20 prompts below
// one at a time (greedy, tool_choice auto, max_tokens 96; a third run asks tool_choice "required") with the same four
// tools, and counts a prompt as correct when the answer has at least one call, the first call names the expected
// tool, and its arguments validate against that tool's schema (ajv, JSON Schema 2020-12). Also reported: answers with no call, calls to the wrong tool,
// schema-invalid arguments, finish reasons, and the median time per request.
//
// Run (after a build; the model is fetched into the cache by `node scripts/prepare.mjs` or `keel fetch`):
//   node bench/tool-calls.mjs                                   # qwen2.5-coder-0.5b-instruct, hermes3
//   MODEL=/path/model.gguf PARSER=qwen3coder node bench/tool-calls.mjs
import { spawn } from "node:child_process";
import { Ajv2020 } from "ajv/dist/2020.js";

const MODEL = process.env.MODEL ?? "qwen2.5-coder-0.5b-instruct";
const PARSER = process.env.PARSER ?? "hermes3";
const MAX_TOKENS = Number(process.env.MAX_TOKENS ?? 96);

const fn = (name, description, properties, required) => ({
  type: "function",
  function: { name, description, parameters: { type: "object", properties, required, additionalProperties: false } },
});
const TOOLS = [
  fn("get_weather", "Get the current weather for a city", { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, ["city"]),
  fn("convert_currency", "Convert an amount of money between two currencies", { amount: { type: "number" }, from: { type: "string" }, to: { type: "string" } }, ["amount", "from", "to"]),
  fn("send_email", "Send an email", { to: { type: "string" }, subject: { type: "string" }, body: { type: "string" } }, ["to", "subject", "body"]),
  fn("search_flights", "Search flights between two airports on a date", { origin: { type: "string" }, destination: { type: "string" }, date: { type: "string" }, passengers: { type: "integer", minimum: 1, maximum: 9 } }, ["origin", "destination", "date"]),
];
const PROMPTS = [
  ["What's the weather in Paris?", "get_weather"],
  ["Is it raining in Tokyo right now? Use fahrenheit.", "get_weather"],
  ["Tell me the temperature in Cairo.", "get_weather"],
  ["How cold is it in Oslo today?", "get_weather"],
  ["Weather for Buenos Aires please", "get_weather"],
  ["Convert 100 US dollars to euros.", "convert_currency"],
  ["How many yen is 50 pounds?", "convert_currency"],
  ["I have 2500 INR, what is that in USD?", "convert_currency"],
  ["Change 12.5 CHF into SEK.", "convert_currency"],
  ["exchange 1000 EUR to GBP", "convert_currency"],
  ["Email bob@example.com that the meeting moved to 3pm.", "send_email"],
  ["Send alice@corp.io a message titled 'Report' saying the report is done.", "send_email"],
  ["Write to team@example.org: subject Lunch, body Pizza at noon.", "send_email"],
  ["Please notify ops@example.com that the deploy finished.", "send_email"],
  ["Mail my boss (boss@firm.com) that I'm sick today.", "send_email"],
  ["Find flights from JFK to LHR on 2026-12-24.", "search_flights"],
  ["Search flights SFO to NRT on March 3rd 2027 for 2 people.", "search_flights"],
  ["Any flights from Berlin (BER) to Madrid (MAD) on 2027-01-10?", "search_flights"],
  ["I need a flight from CDG to JFK on 2027-02-14 for 3 passengers.", "search_flights"],
  ["Look up flights LAX→SYD on 2027-05-01.", "search_flights"],
];

const ajv = new Ajv2020({ strict: false });
const validators = new Map(TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

function startServer(flags) {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, ["bin/keel.mjs", "serve", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", "--model_path", MODEL, "--model_name", "m", "--deterministic", "true", "--max_num_seqs", "1", "--max_model_len", "2048", ...flags], { stdio: ["ignore", "pipe", "pipe"] });
    let port = 0;
    let ready = false;
    let buf = "";
    const onData = (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        try {
          const j = JSON.parse(line);
          if (j.event === "listening") port = j.address.port;
          if (j.event === "engine_ready") ready = true;
        } catch {
          /* not JSON */
        }
        if (port && ready) resolve({ proc, base: `http://127.0.0.1:${port}` });
      }
    };
    proc.stdout.setEncoding("utf8").on("data", onData);
    proc.stderr.setEncoding("utf8").on("data", onData);
    proc.once("exit", (code) => reject(new Error(`server exited (${code})`)));
  });
}

async function run(label, flags, toolChoice = "auto") {
  const { proc, base } = await startServer(flags);
  const tally = { config: label, correct: 0, noCall: 0, wrongTool: 0, invalidArgs: 0, finish: {}, "median ms": 0 };
  const times = [];
  try {
    for (const [prompt, expected] of PROMPTS) {
      const t0 = Date.now();
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: prompt }], tools: TOOLS, tool_choice: toolChoice, temperature: 0, max_tokens: MAX_TOKENS }),
      });
      times.push(Date.now() - t0);
      const body = await res.json();
      const choice = body.choices?.[0];
      tally.finish[choice?.finish_reason ?? `http ${res.status}`] = (tally.finish[choice?.finish_reason ?? `http ${res.status}`] ?? 0) + 1;
      const call = choice?.message?.tool_calls?.[0];
      if (!call) {
        tally.noCall += 1;
        continue;
      }
      if (call.function.name !== expected) {
        tally.wrongTool += 1;
        continue;
      }
      let args;
      try {
        args = JSON.parse(call.function.arguments);
      } catch {
        args = undefined;
      }
      if (args === undefined || !validators.get(expected)(args)) tally.invalidArgs += 1;
      else tally.correct += 1;
    }
  } finally {
    proc.kill("SIGTERM");
  }
  times.sort((a, b) => a - b);
  tally["median ms"] = times[Math.floor(times.length / 2)];
  tally.finish = JSON.stringify(tally.finish);
  return tally;
}

// CONFIGS (env) picks some of the three runs, e.g. CONFIGS=required; each row is printed as soon as it is done.
const CONFIGS = {
  unguided: () => run(`${PARSER} unguided`, ["--tool_parser", PARSER]),
  "guided-auto": () => run(`${PARSER} guided auto`, ["--tool_parser", PARSER, "--enable_tool_guided_generation", "true"]),
  required: () => run(`${PARSER} required`, ["--tool_parser", PARSER], "required"),
};
const wanted = (process.env.CONFIGS ?? Object.keys(CONFIGS).join(",")).split(",");
console.log(`model ${MODEL}, ${PROMPTS.length} prompts, greedy, max_tokens ${MAX_TOKENS}`);
const rows = [];
for (const name of wanted) {
  if (!CONFIGS[name]) throw new Error(`CONFIGS: unknown run ${name} (known: ${Object.keys(CONFIGS).join(", ")})`);
  rows.push(await CONFIGS[name]());
  console.table(rows.slice(-1));
}
console.table(rows);

import { expect, it } from "vitest";
import { chat } from "../support/chat-client.js";
import { metrics, startServer } from "../support/server.js";
import { hybridModel } from "../support/openvino.js";
import { PROMPTS } from "../support/prompts.js";

it("smoke", { timeout: 300_000 }, async () => {
  const m = await hybridModel();
  const s = await startServer(["--model_path", m, "--model_name", "h", "--max_num_seqs", "4", "--max_num_batched_tokens", "16", "--num_kv_blocks", String(process.env.KVB ?? 8), "--enable_prefix_caching", "true", "--cache_interval_multiplier", process.env.CIM ?? "64"], {}, { engine: "openvino" });
  const body = (c: string) => ({ model: "h", messages: [{ role: "user", content: c }], temperature: 0, max_tokens: 60, ignore_eos: true, stream: true });
  const ps = PROMPTS.slice(0, 4);
  const solo: string[] = [];
  for (const p of ps) solo.push((await chat(s.baseUrl, body(p))).text);
  const t0 = Date.now();
  const batched = await Promise.all(ps.map((p) => chat(s.baseUrl, body(p))));
  console.log("batched ms", Date.now() - t0);
  const mm = await metrics(s.baseUrl);
  console.log([...mm].filter(([k]) => /preempt|linear|restarts/.test(k)));
  console.log(s.logs.filter((l) => /hybrid|rope|fatal|step_failed|interval/.test(l)).join("\n"));
  await s.stop();
  batched.forEach((b, i) => { console.log(i, b.done, b.text === solo[i], JSON.stringify(b.text.slice(0, 60)), JSON.stringify(solo[i]!.slice(0, 60))); });
  expect(batched.map((b) => b.text)).toEqual(solo);
});

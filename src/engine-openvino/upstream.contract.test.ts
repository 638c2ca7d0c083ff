/**
 * OpenVINO GenAI behaviours the worker works around (docs/upstream.md, "OpenVINO GenAI"), shown on the raw library
 * (src/engine-openvino/upstream_contract.py) with the embedded tiny model in F16. If a release fixes one, its test
 * fails here and the workaround in worker.py can be reconsidered.
 */
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { DEFAULT_MODEL_OPTIONS, ensureDefaultModel } from "../model/default-model.js";
import { openvinoPython } from "../../test/support/openvino.js";

const run = promisify(execFile);
const SCRIPT = path.join(path.dirname(new URL(import.meta.url).pathname), "upstream_contract.py");

async function check(name: string): Promise<Record<string, unknown>> {
  const model = await ensureDefaultModel({ model: { ...DEFAULT_MODEL_OPTIONS, f16: true } });
  const { stdout } = await run(await openvinoPython(), [SCRIPT, model, name], { timeout: 120_000 });
  return JSON.parse(stdout.trim().split("\n").pop()!) as Record<string, unknown>;
}

describe("OpenVINO GenAI upstream contracts (worked around in worker.py)", { timeout: 120_000 }, () => {
  it("a live request id added twice wedges the pipeline: every later step() raises (worker: ids from a counter)", async () => {
    const r = (await check("reused_id")) as { stepErrors: (string | null)[] };
    expect(r.stepErrors).toHaveLength(3);
    for (const e of r.stepErrors) expect(e).not.toBeNull();
  });

  it("a sequence outgrowing the pool ends IGNORED with no exception and a truncated answer (worker: refused at add)", async () => {
    const r = (await check("outgrow_pool")) as { statuses: string[]; generated: number[]; raised: string | null };
    expect(r.raised).toBeNull();
    expect(r.statuses[1]).toBe("IGNORED");
    expect(r.generated[1]).toBeLessThan(400);
  });

  it("ignore_eos also ignores custom stop_token_ids (worker: ends the request at a stop token itself)", async () => {
    const r = (await check("ignore_eos_stop_ids")) as { stopToken: number; generated: number[] };
    expect(r.generated[0]).toBe(r.stopToken);
    expect(r.generated).toHaveLength(4);
  });

  it("decode() drops a byte that is not valid UTF-8 instead of U+FFFD (worker: text from the GGUF's token bytes)", async () => {
    const r = (await check("detok_drops_invalid_utf8")) as { token: number; text: string };
    expect(r.text).toBe("");
  });

  it("get_vocab_vector() raises on byte tokens that are not UTF-8 (worker: vocabulary read from the GGUF)", async () => {
    expect((await check("vocab_vector_fails")).raised).toBe("UnicodeDecodeError");
  });
});

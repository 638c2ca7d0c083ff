/** rewired_ir.py on the tiny hybrid IR: the rotary is rewired once into the cache, later starts reuse that copy. */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { expect, it } from "vitest";
import { hybridModel, runPython } from "../../test/support/openvino.js";

const SCRIPT = `
import json, sys
sys.path.insert(0, "src/engine-openvino")
from rewired_ir import rewired_path
logs = []
first = rewired_path(sys.argv[1], sys.argv[2], lambda m, f: logs.append(m))
again = rewired_path(sys.argv[1], sys.argv[2], lambda m, f: logs.append(m))
print(json.dumps({"first": first, "again": again, "logs": logs}))
`;

it("a hybrid IR is rewired into <cache>/openvino/rope-<key>/ once; a second start loads the cached copy", { timeout: 300_000 }, async () => {
  const ir = await hybridModel();
  const cache = fs.mkdtempSync(path.join(os.tmpdir(), "keel-rope-"));
  const r = await runPython(["-c", SCRIPT, ir, cache]);
  expect(r.status, r.stderr).toBe(0);
  const out = JSON.parse(r.stdout.trim().split("\n").pop()!) as { first: [string, string[]]; again: [string, string[]]; logs: string[] };
  expect(out.first[0]).toMatch(new RegExp(`^${cache}/openvino/rope-[0-9a-f]{12}$`));
  expect(out.first[1]).toEqual(["__module.model.model/aten::expand/Broadcast"]);
  expect(out.again).toEqual(out.first);
  expect(out.logs[0]).toMatch(/^rotary positions rewired to position_ids/);
  expect(out.logs[1]).toMatch(/^loading the copy with rotary positions from position_ids/);
  // The copy is complete: model, tokenizer, detokenizer and configs, plus the marker written last.
  for (const f of ["openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml", "config.json", "rope_positions.json"]) expect(fs.existsSync(path.join(out.first[0], f)), f).toBe(true);
  fs.rmSync(cache, { recursive: true, force: true });
});

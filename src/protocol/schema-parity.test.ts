/**
 * The Python worker's validation (src/engine-openvino/messages.py, interpreting protocol.schema.json) classifies
 * gateway → engine messages exactly as the llama.cpp engine's (validate.ts, zod): every valid shape, the invalid
 * cases of validate.test.ts's kinds, and thousands of seeded mutations. It needs only a python3 on PATH (messages.py
 * imports nothing outside the standard library).
 */
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { GATEWAY_MESSAGES, mutations } from "../../test/support/protocol-mutations.js";
import { PROTOCOL_VERSION } from "./messages.js";
import { parseGatewayMessage } from "./validate.js";

const WORKER_DIR = fileURLToPath(new URL("../engine-openvino/", import.meta.url));

/** "ok", "protocol_error" or "refuse:<id>" for each message, by the Python worker's parse_message. */
function pythonVerdicts(messages: unknown[]): string[] {
  const driver = [
    "import json, sys",
    "from messages import parse_message",
    "for line in sys.stdin.buffer:",
    "    r = parse_message(json.loads(line.decode('utf-8')))",
    "    print(r[0] + (':' + r[1] if r[0] == 'refuse' else ''))",
  ].join("\n");
  const r = spawnSync("python3", ["-c", driver], { cwd: WORKER_DIR, input: messages.map((m) => JSON.stringify(m)).join("\n") + "\n", encoding: "utf8", maxBuffer: 64 * 1024 * 1024 });
  if (r.status !== 0) throw new Error(`python3 failed: ${r.stderr}`);
  return r.stdout.trimEnd().split("\n");
}

/** The same classification by the TypeScript validation. */
function tsVerdict(m: unknown): string {
  const r = parseGatewayMessage(m as Record<string, unknown>);
  if (r.ok) return "ok";
  return "refuse" in r ? `refuse:${r.refuse.id}` : "protocol_error";
}

const v = PROTOCOL_VERSION;
const add = GATEWAY_MESSAGES[0] as { params: Record<string, unknown> };
/** Hand-picked edge cases: each named rule, each cross-field check, lengths in UTF-16 units, a trailing newline. */
const EDGES: unknown[] = [
  { v: 2, type: "ping", nonce: 1 },
  { v: "1", type: "ping", nonce: 1 },
  { v, type: "reboot" },
  { v, nonce: 1 },
  { ...add, id: "x".repeat(256) },
  { ...add, id: "x".repeat(257) },
  { ...add, id: "😀".repeat(128) },
  { ...add, id: "😀".repeat(129) },
  { ...add, params: { ...add.params, minTokens: 9 } },
  { ...add, params: { ...add.params, maxTokens: null, minTokens: 9 } },
  { ...add, params: { ...add.params, logitBias: [[1, 1], [1, 2]] } },
  { ...add, params: { ...add.params, guide: { grammar: "root ::= [a-z]", start: { kind: "rule", rule: "root\n", then: "end" } } } },
  { ...add, params: { ...add.params, guide: { grammar: "root ::= [a-z]", start: { kind: "rule", rule: "keel-prefixed-root", then: "end" } } } },
  { ...add, params: { ...add.params, guide: { grammar: "root ::= [a-z]", start: { kind: "rule", rule: "keel-prefixed-rootx", then: "end" } } } },
  { ...add, params: { ...add.params, guide: { grammar: 'root ::= "a"\n  keel-prefixed-root ::= "b"', start: { kind: "free" } } } },
  { ...add, params: { ...add.params, guide: { grammar: "root ::= [a-z]", start: { kind: "reasoning" } } } },
  { ...add, params: { ...add.params, guide: { grammar: "root ::= [a-z]", start: { kind: "free" }, reasoning: { open: "<a>", close: "</a>", after: { kind: "reasoning" } } } } },
  { ...add, params: { ...add.params, guide: { grammar: `root ::= "${"é".repeat(2 * 1024 * 1024)}"`, start: { kind: "free" } } } },
  { ...add, params: { ...add.params, guide: { grammar: `root ::= "${"a".repeat(2 * 1024 * 1024)}"`, start: { kind: "free" } } } },
  { ...add, params: { ...add.params, temperature: true } },
  { ...add, params: { ...add.params, topK: 1.5 } },
  { ...add, params: [] },
  { v, type: "abort", ids: [] },
  { v, type: "tokenize", id: "t", text: "hi", addSpecialTokens: 1 },
];

describe("the Python worker's validation classifies like the TypeScript one", () => {
  it("on every valid message shape and the edge cases", () => {
    const cases = [...GATEWAY_MESSAGES, ...EDGES];
    const python = pythonVerdicts(cases);
    cases.forEach((m, i) => expect(python[i], JSON.stringify(m).slice(0, 300)).toBe(tsVerdict(m)));
    expect(python.slice(0, GATEWAY_MESSAGES.length).every((r) => r === "ok")).toBe(true);
  });

  it("on 4000 seeded mutations of them", { timeout: 60_000 }, () => {
    const cases = mutations(GATEWAY_MESSAGES, 4000, 18);
    const python = pythonVerdicts(cases);
    const verdicts = new Set<string>();
    cases.forEach((m, i) => {
      const ts = tsVerdict(m);
      verdicts.add(ts.split(":")[0]!);
      expect(python[i], JSON.stringify(m)).toBe(ts);
    });
    expect(verdicts).toEqual(new Set(["ok", "protocol_error", "refuse"]));
  });
});

describe("the Python worker's reading of the schema", () => {
  it("refuses a keyword, a type or a named check it does not implement (the worker would not start)", () => {
    const driver = [
      "import messages",
      "for bad in ({'type': 'string', 'format': 'email'}, {'type': 'date'}, {'type': 'object', 'x-keel-checks': ['noSuchCheck']}, {'propertyNames': {'pattern': 'a'}}):",
      "    try:",
      "        messages._audit(bad)",
      "        print('accepted')",
      "    except RuntimeError as err:",
      "        print('refused', str(err).split(': ', 1)[1])",
    ].join("\n");
    const r = spawnSync("python3", ["-c", driver], { cwd: WORKER_DIR, encoding: "utf8" });
    expect(r.stdout.trimEnd().split("\n")).toEqual([
      "refused keyword format is not supported by messages.py",
      "refused type date is not supported by messages.py",
      "refused check noSuchCheck is not implemented in messages.py",
      "refused propertyNames other than {type: string} is not supported",
    ]);
  });
});

/**
 * Both engines read the same fault-injection switches (docs/fault-injection.md): the OpenVINO worker's list
 * (faults.py SWITCHES) is the llama.cpp engine's (faulty-backend.ts FAULT_SWITCHES) plus its own `ignoreAtStep`.
 */
import fs from "node:fs";
import path from "node:path";
import { expect, it } from "vitest";
import { FAULT_SWITCHES } from "../engine/faulty-backend.js";

it("the OpenVINO worker's fault switches are the llama.cpp engine's, plus ignoreAtStep", () => {
  const source = fs.readFileSync(path.join(import.meta.dirname, "faults.py"), "utf8");
  const table = /^SWITCHES = \{\n([\s\S]*?)^\}/m.exec(source);
  expect(table, "faults.py defines SWITCHES").not.toBeNull();
  const names = [...table![1]!.matchAll(/^\s+"(\w+)":/gm)].map((m) => m[1]);
  expect(names.sort()).toEqual([...FAULT_SWITCHES, "ignoreAtStep"].sort());
});

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { checkModelFile } from "./model-check.js";

describe("checkModelFile", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-modelfile-"));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  it("a directory gets a clear message (not EISDIR)", () => {
    expect(checkModelFile(dir)).toBe(`${dir} is a directory; --model_path needs a GGUF model file`);
  });

  it("a missing file, a file that is not GGUF, and an empty file are named as such", () => {
    const missing = path.join(dir, "missing.gguf");
    expect(checkModelFile(missing)).toBe(`the model file ${missing} does not exist`);
    const text = path.join(dir, "text.gguf");
    fs.writeFileSync(text, "hello world");
    expect(checkModelFile(text)).toMatch(/is not a GGUF file/);
    const empty = path.join(dir, "empty.gguf");
    fs.writeFileSync(empty, "");
    expect(checkModelFile(empty)).toMatch(/is not a GGUF file/);
  });

  it("a file starting with the GGUF magic passes the cheap check (the engine's load decides the rest)", () => {
    const f = path.join(dir, "magic.gguf");
    fs.writeFileSync(f, Buffer.from("GGUF\x03\x00\x00\x00", "latin1"));
    expect(checkModelFile(f)).toBeNull();
  });
});

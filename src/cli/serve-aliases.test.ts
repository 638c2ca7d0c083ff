/** The names a request may use besides the served one (serve.ts `modelAliases`). */
import { describe, expect, it } from "vitest";
import { modelAliases } from "./serve.js";

const catalogue = { kind: "catalogue", name: "qwen2.5-coder-0.5b-instruct", path: "/m.gguf", servedName: "Qwen2.5-Coder-0.5B-Instruct", source: "cache", cached: true } as const;

describe("modelAliases", () => {
  it("a catalogue model answers to the name given to --model_path", () => {
    expect(modelAliases(catalogue, "Qwen2.5-Coder-0.5B-Instruct")).toEqual(["qwen2.5-coder-0.5b-instruct"]);
  });
  it("under --model_name, to the catalogue's display name too; never to the served name twice", () => {
    expect(modelAliases(catalogue, "coder")).toEqual(["qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct"]);
    expect(modelAliases({ ...catalogue, name: "Qwen2.5-Coder-0.5B-Instruct" }, "Qwen2.5-Coder-0.5B-Instruct")).toEqual([]);
  });
  it("other models (a file, a tiny model) have no alias", () => {
    expect(modelAliases({ kind: "file", path: "/x/m.gguf", servedName: "m", source: "file" }, "m")).toEqual([]);
    expect(modelAliases({ kind: "tiny", name: "keel-tiny", path: "/t.gguf", servedName: "keel-tiny", source: "generated" }, "keel-tiny")).toEqual([]);
  });
});

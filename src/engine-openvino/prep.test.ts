/**
 * src/engine-openvino/prep.py against the real OpenVINO GenAI (the venv's Python, $KEEL_OPENVINO_PYTHON): GGUFs
 * OpenVINO cannot load as shipped load after prep, a prepared folder is built once and reused, concurrent preparers
 * end with one complete folder, and the IR alone gives the GGUF's greedy tokens.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { check, prepCli, runPython, SYNTHETIC_GGUF_SCRIPT } from "../../test/support/openvino.js";
import { ensureTinyModel } from "../model/default-model.js";

interface Generated {
  ok: boolean;
  error?: string;
  ids: number[][];
  eos: number;
}
interface Manifest {
  format: number;
  source: { path: string; fingerprint: { size: number; sha256_head_tail: string } };
  reencoded: { name: string; from: string; to: string }[];
  files: Record<string, number>;
}
interface SameValues {
  compared: number;
  differing: string[];
  types_a: string[];
  types_b: string[];
  same_keys: boolean;
  file_type_b: number;
}
interface Published {
  returned: string;
  log: string[];
  temp_left: boolean;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "keel-ov-prep-"));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** A fresh cache directory for one test. */
const freshCache = (name: string): string => fs.mkdtempSync(path.join(tmp, `${name}-`));
const readManifest = (dir: string): Manifest => JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8")) as Manifest;
/** True if every file the manifest lists is there with its size, and the folder holds nothing else. */
function isComplete(dir: string): boolean {
  const m = readManifest(dir);
  const names = fs.readdirSync(dir).filter((n) => n !== "manifest.json").sort();
  return JSON.stringify(names) === JSON.stringify(Object.keys(m.files).sort()) && names.every((n) => fs.statSync(path.join(dir, n)).size === m.files[n]);
}

/** Writes a synthetic GGUF (test/support/synthetic_gguf.py) with all matrices in `type`; the tokenizer of keel-tiny-f16. */
async function synthetic(name: string, type: string, arch = "qwen2", extra: string[] = []): Promise<string> {
  const dir = path.join(tmp, "synthetic", name);
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${name}.gguf`);
  const r = await runPython([SYNTHETIC_GGUF_SCRIPT, file, tinyF16, "--arch", arch, "--matrix-type", type, ...extra]);
  if (r.status !== 0) throw new Error(`synthetic_gguf.py failed: ${r.stderr}`);
  return file;
}

let tinyF16: string;
let tinyF32: string;
beforeAll(async () => {
  const dir = path.join(tmp, "models");
  tinyF16 = await ensureTinyModel("keel-tiny-f16", { dir });
  tinyF32 = await ensureTinyModel("keel-tiny", { dir });
});

describe("prep.py: a GGUF OpenVINO loads as shipped (keel-tiny-f16)", () => {
  it("is prepared once into <cache>/openvino/<stem>-<key12>/ holding only the IR and a manifest; the second call reuses it untouched", async () => {
    const cache = freshCache("once");
    const first = await prepCli(tinyF16, cache);
    expect(first.status, first.stderr).toBe(0);
    const dir = first.path!;
    expect(path.dirname(dir)).toBe(path.join(cache, "openvino"));
    expect(path.basename(dir)).toMatch(new RegExp(`^${path.basename(tinyF16, ".gguf")}-[0-9a-f]{12}$`));
    expect(fs.readdirSync(dir).sort()).toEqual(["manifest.json", "openvino_detokenizer.bin", "openvino_detokenizer.xml", "openvino_model.bin", "openvino_model.xml", "openvino_tokenizer.bin", "openvino_tokenizer.xml"]);
    const manifest = readManifest(dir);
    expect(manifest.source.path).toBe(fs.realpathSync(tinyF16));
    expect(manifest.source.fingerprint.size).toBe(fs.statSync(tinyF16).size);
    expect(manifest.reencoded).toEqual([]);
    expect(isComplete(dir)).toBe(true);
    const before = fs.readdirSync(dir).map((n) => [n, fs.statSync(path.join(dir, n)).mtimeMs, fs.statSync(path.join(dir, n)).ino]);

    const second = await prepCli(tinyF16, cache);
    expect(second.status, second.stderr).toBe(0);
    expect(second.path).toBe(dir);
    expect(second.stderr).toContain(`using the prepared model in ${dir}`);
    expect(second.stderr).not.toContain("converting");
    expect(fs.readdirSync(dir).map((n) => [n, fs.statSync(path.join(dir, n)).mtimeMs, fs.statSync(path.join(dir, n)).ino])).toEqual(before);
    expect(fs.readdirSync(path.join(cache, "openvino"))).toEqual([path.basename(dir)]);
  }, 120_000);

  it("the prepared IR alone gives the GGUF's greedy tokens (why prep deletes the intermediate GGUF)", async () => {
    const dir = (await prepCli(tinyF16, freshCache("same-tokens"))).path!;
    const fromGguf = await check<Generated>("generate", tinyF16, "24");
    const fromIr = await check<Generated>("generate", dir, "24");
    expect(fromGguf.ok, fromGguf.error).toBe(true);
    expect(fromGguf.ids.map((ids) => ids.length)).toEqual([24, 24]);
    expect(fromIr).toEqual({ ...fromGguf, load_s: expect.any(Number) });
  }, 120_000);
});

describe("prep.py: tensor types OpenVINO cannot load", () => {
  it("Q5_0 matrices: the GGUF fails to load as shipped, loads after prep; the Q8_0 re-encoding is exact and the IR gives its tokens", async () => {
    const q5 = await synthetic("q5-0", "Q5_0");
    const raw = await check<Generated>("generate", q5, "8");
    expect(raw.ok).toBe(false);
    expect(raw.error).toContain("gguf_tensor_to_f16 failed");

    const prepared = await prepCli(q5, freshCache("q5"));
    expect(prepared.status, prepared.stderr).toBe(0);
    const manifest = readManifest(prepared.path!);
    expect(manifest.reencoded.length).toBe(2 * 7 + 2); // 7 matrices per layer, embedding, output
    expect(new Set(manifest.reencoded.map((r) => `${r.from}->${r.to}`))).toEqual(new Set(["Q5_0->Q8_0"]));
    expect(prepared.stderr).toContain(`re-encoded ${manifest.reencoded.length} tensors (${manifest.reencoded.length} Q5_0->Q8_0)`);
    expect(fs.readdirSync(prepared.path!)).not.toContain("model.gguf");

    // The same re-encoding, kept as a file: every value equal to the Q5_0 original (read with gguf's own reader).
    const reencoded = path.join(path.dirname(q5), "reencoded.gguf");
    await check("reencode", q5, reencoded);
    const same = await check<SameValues>("same-values", q5, reencoded);
    expect(same).toEqual({ compared: 2 * 12 + 3, differing: [], types_a: ["F32", "Q5_0"], types_b: ["F32", "Q8_0"], same_keys: true, file_type_b: 7 });

    const fromGguf = await check<Generated>("generate", reencoded, "16");
    const fromIr = await check<Generated>("generate", prepared.path!, "16");
    expect(fromGguf.ok, fromGguf.error).toBe(true);
    expect(fromIr.ids).toEqual(fromGguf.ids);
    expect(fromIr.ids.every((ids) => ids.length > 0)).toBe(true);
  }, 180_000);

  it("F32 matrices (keel-tiny itself) fail as shipped and become F16: the prepared model gives keel-tiny-f16's tokens", async () => {
    const raw = await check<Generated>("generate", tinyF32, "4");
    expect(raw.ok).toBe(false);
    expect(raw.error).toContain("Unsupported quantization type");
    const prepared = await prepCli(tinyF32, freshCache("f32"));
    expect(prepared.status, prepared.stderr).toBe(0);
    const manifest = readManifest(prepared.path!);
    expect(new Set(manifest.reencoded.map((r) => `${r.from}->${r.to}`))).toEqual(new Set(["F32->F16"]));
    expect(manifest.reencoded.map((r) => r.name)).not.toContain("output_norm.weight"); // vectors stay F32
    const twin = await check<Generated>("generate", tinyF16, "24");
    const fromIr = await check<Generated>("generate", prepared.path!, "24");
    expect(fromIr.ids).toEqual(twin.ids);
  }, 120_000);

  it.each([
    ["BF16", "BF16->F16", "Unsupported quantization type"],
    ["Q5_1", "Q5_1->Q8_0", "gguf_tensor_to_f16 failed"],
  ])("%s matrices fail as shipped and load after prep (%s)", async (type, conversion, failure) => {
    const file = await synthetic(type.toLowerCase(), type, "llama");
    const raw = await check<Generated>("generate", file, "4");
    expect(raw.ok).toBe(false);
    expect(raw.error).toContain(failure);
    const prepared = await prepCli(file, freshCache(type));
    expect(prepared.status, prepared.stderr).toBe(0);
    expect(new Set(readManifest(prepared.path!).reencoded.map((r) => `${r.from}->${r.to}`))).toEqual(new Set([conversion]));
    const fromIr = await check<Generated>("generate", prepared.path!, "8");
    expect(fromIr.ok, fromIr.error).toBe(true);
    expect(fromIr.ids.every((ids) => ids.length > 0)).toBe(true);
  }, 120_000);
  it("no general.file_type: fails as shipped, loads after prep, which sets it from the matrices (Q8_0 -> MOSTLY_Q8_0 = 7)", async () => {
    const file = await synthetic("no-file-type", "Q8_0", "llama", ["--no-file-type"]);
    const raw = await check<Generated>("generate", file, "4");
    expect(raw.ok).toBe(false);
    expect(raw.error).toContain("unordered_map::at");
    const prepared = await prepCli(file, freshCache("no-file-type"));
    expect(prepared.status, prepared.stderr).toBe(0);
    expect(prepared.stderr).toContain("re-encoding 0 tensors OpenVINO cannot load and setting general.file_type");
    expect(readManifest(prepared.path!).reencoded).toEqual([]);
    const rewritten = path.join(path.dirname(file), "rewritten.gguf");
    await check("reencode", file, rewritten);
    const same = await check<SameValues>("same-values", file, rewritten);
    expect(same.differing).toEqual([]);
    expect(same.same_keys).toBe(true);
    expect(same.file_type_b).toBe(7);
    const fromIr = await check<Generated>("generate", prepared.path!, "8");
    expect(fromIr.ok, fromIr.error).toBe(true);
    expect(fromIr.ids).toEqual((await check<Generated>("generate", rewritten, "8")).ids);
  }, 120_000);
});

describe("prep.py: the cache under concurrency and damage", () => {
  it("three preparers started at once all print the same folder, which is complete, with no temp folder left", async () => {
    const cache = freshCache("concurrent");
    const runs = await Promise.all([0, 1, 2].map(() => prepCli(tinyF16, cache)));
    for (const r of runs) expect(r.status, r.stderr).toBe(0);
    const dir = runs[0]!.path!;
    expect(runs.map((r) => r.path)).toEqual([dir, dir, dir]);
    expect(fs.readdirSync(path.join(cache, "openvino"))).toEqual([path.basename(dir)]); // no temp folder left
    expect(isComplete(dir)).toBe(true);
  }, 180_000);

  it("publishing: a preparer that loses the race uses the winner's folder; a damaged folder is replaced", async () => {
    const cache = freshCache("publish");
    const source = (await prepCli(tinyF16, cache)).path!;
    const final = path.join(cache, "openvino", "race-target");
    const first = await check<Published>("publish", source, final, "first");
    expect(first).toEqual({ returned: final, log: [], temp_left: false });
    const loser = await check<Published>("publish", source, final, "second");
    expect(loser).toEqual({ returned: final, log: [`prep: another process prepared ${final} first; using it`], temp_left: false });
    expect(fs.readFileSync(path.join(final, "owner.txt"), "utf8")).toBe("first");

    fs.unlinkSync(path.join(final, "openvino_model.bin")); // damaged: a listed file is missing
    const replacing = await check<Published>("publish", source, final, "third");
    expect(replacing).toEqual({ returned: final, log: [`prep: ${final} is incomplete; replacing it`], temp_left: false });
    expect(fs.readFileSync(path.join(final, "owner.txt"), "utf8")).toBe("third");
    expect(fs.readdirSync(path.join(cache, "openvino")).sort()).toEqual([path.basename(source), "race-target"]);
  }, 120_000);

  it("a damaged prepared folder is rebuilt in place, sweeping a temp folder its dead preparer left; a changed source gets a new folder and its old one goes", async () => {
    const cache = freshCache("damage");
    const model = path.join(tmp, "damage-model.gguf");
    fs.copyFileSync(tinyF16, model);
    const dir = (await prepCli(model, cache)).path!;
    fs.truncateSync(path.join(dir, "openvino_model.bin"), 100);
    const deadPid = spawnSync(process.execPath, ["-e", ""]).pid; // exited: no process has this id now
    const abandoned = path.join(cache, "openvino", `.${path.basename(dir)}.tmp-${os.hostname().replace(/[^A-Za-z0-9.-]/g, "_")}-${deadPid}-0badc0de`);
    fs.mkdirSync(abandoned);
    fs.writeFileSync(path.join(abandoned, "model.gguf"), "half");

    const rebuilt = await prepCli(model, cache);
    expect(rebuilt.status, rebuilt.stderr).toBe(0);
    expect(rebuilt.path).toBe(dir);
    expect(rebuilt.stderr).toContain(`removing ${path.basename(abandoned)}, left by process ${deadPid} that is gone`);
    expect(rebuilt.stderr).toContain(`${dir} is incomplete; replacing it`);
    expect(isComplete(dir)).toBe(true);
    expect(fs.readdirSync(path.join(cache, "openvino"))).toEqual([path.basename(dir)]);

    // Another source file whose stem is the same (same file name in another folder): a separate folder, kept.
    const elsewhere = path.join(tmp, "elsewhere");
    fs.mkdirSync(elsewhere, { recursive: true });
    fs.copyFileSync(tinyF16, path.join(elsewhere, "damage-model.gguf"));
    const other = (await prepCli(path.join(elsewhere, "damage-model.gguf"), cache)).path!;
    expect(path.basename(other)).toMatch(/^damage-model-[0-9a-f]{12}$/);
    expect(other).not.toBe(dir);

    const later = new Date(fs.statSync(model).mtimeMs + 5_000);
    fs.utimesSync(model, later, later);
    const changed = await prepCli(model, cache);
    expect(changed.status, changed.stderr).toBe(0);
    expect(changed.path).not.toBe(dir);
    expect(path.basename(changed.path!)).toMatch(/^damage-model-[0-9a-f]{12}$/);
    expect(isComplete(changed.path!)).toBe(true);
    // The earlier version's folder is gone; another model's folder with a similar name is not touched.
    expect(changed.stderr).toContain(`removing ${dir}, prepared from an earlier version of ${fs.realpathSync(model)}`);
    expect(fs.readdirSync(path.join(cache, "openvino")).sort()).toEqual([path.basename(changed.path!), path.basename(other)].sort());
  }, 180_000);
});

describe("prep.py: what it returns as is and what it refuses", () => {
  it("returns an IR directory as it is, without touching the cache", async () => {
    const ir = (await prepCli(tinyF16, freshCache("ir-src"))).path!;
    const cache = freshCache("ir");
    const r = await prepCli(ir, cache);
    expect(r.status, r.stderr).toBe(0);
    expect(r.path).toBe(ir);
    expect(fs.readdirSync(cache)).toEqual([]);
  }, 60_000);

  it("refuses a missing file, a file that is no GGUF, a directory without IR and an architecture OpenVINO cannot build, leaving nothing behind", async () => {
    const cache = freshCache("refuse");
    const text = path.join(tmp, "not-a-model.gguf");
    fs.writeFileSync(text, "hello, I am text\n");
    const phi3 = await synthetic("phi3", "F16", "phi3");
    const cases: [string, string][] = [
      [path.join(tmp, "missing.gguf"), `prep: ${path.join(tmp, "missing.gguf")} does not exist`],
      [text, `prep: ${text} is not a GGUF file`],
      [tmp, `prep: ${tmp} is a directory without openvino_model.xml: give an OpenVINO IR directory or a GGUF file`],
      [phi3, `prep: ${phi3}: OpenVINO GenAI builds only llama, qwen2, qwen3 models from a GGUF; this one is 'phi3'`],
    ];
    for (const [model, message] of cases) {
      const r = await prepCli(model, cache);
      expect(r.status, model).toBe(1);
      expect(r.stdout).toBe("");
      expect(r.stderr).toContain(message);
    }
    expect(fs.readdirSync(path.join(cache, "openvino"))).toEqual([]); // phi3 got as far as a temp folder: removed
  }, 120_000);
});

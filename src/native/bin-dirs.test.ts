/** The record of getLlama's binary directories (src/native/bin-dirs.ts): what a warm start reads instead of loading node-llama-cpp. */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { binDirsKey, readBinDirs, writeBinDirs } from "./bin-dirs.js";

let work: string;
beforeEach(() => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), "keel-bin-dirs-"));
});
afterEach(() => fs.rmSync(work, { recursive: true, force: true }));

describe("the record of getLlama's binary directories", () => {
  it("is read back for the same key, and not for another (another install, Node or GPU situation)", () => {
    const cpu = path.join(work, "bins", "linux-x64");
    fs.mkdirSync(cpu, { recursive: true });
    expect(readBinDirs(work, "k1")).toBeNull();
    writeBinDirs(work, [cpu], "k1");
    expect(readBinDirs(work, "k1")).toEqual([cpu]);
    expect(readBinDirs(work, "k2")).toBeNull();
  });

  it("is not used when one of its directories is gone (the package was removed)", () => {
    const cpu = path.join(work, "cpu");
    const cuda = path.join(work, "cuda");
    for (const d of [cpu, cuda]) fs.mkdirSync(d);
    writeBinDirs(work, [cpu, cuda], "k");
    fs.rmSync(cuda, { recursive: true });
    expect(readBinDirs(work, "k")).toBeNull();
  });

  it("a damaged record is no record", () => {
    writeBinDirs(work, [work], "k");
    fs.writeFileSync(path.join(work, "native", "bin-dirs-k.json"), "{half");
    expect(readBinDirs(work, "k")).toBeNull();
    fs.writeFileSync(path.join(work, "native", "bin-dirs-k.json"), JSON.stringify({ not: "a list" }));
    expect(readBinDirs(work, "k")).toBeNull();
  });

  it("the key of this install is stable from call to call (a warm start finds the record a cold one wrote)", () => {
    expect(binDirsKey()).toMatch(/^[0-9a-f]{24}$/);
    expect(binDirsKey()).toBe(binDirsKey());
  });
});

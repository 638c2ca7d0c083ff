import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { makeDirsSync } from "./make-dirs.js";

const base = fs.mkdtempSync(path.join(os.tmpdir(), "keel-make-dirs-"));
afterAll(() => fs.rmSync(base, { recursive: true, force: true }));

describe("makeDirsSync", () => {
  it("creates missing parents, and is a no-op on an existing directory", () => {
    const d = path.join(base, "a", "b", "c");
    makeDirsSync(d);
    expect(fs.statSync(d).isDirectory()).toBe(true);
    makeDirsSync(d);
    expect(fs.statSync(d).isDirectory()).toBe(true);
  });

  it("fails at once with the component's own error under a file or under /proc", () => {
    const file = path.join(base, "file");
    fs.writeFileSync(file, "x");
    expect(() => makeDirsSync(path.join(file, "sub"))).toThrow(/ENOTDIR/);
    if (fs.existsSync("/proc/self")) expect(() => makeDirsSync("/proc/keel-no-such-dir/x")).toThrow(/ENOENT/);
  });
});

// Contract: the upstream behaviour this module exists for. When Node's recursive mkdir stops looping under /proc, this
// fails, and makeDirsSync may go (docs/upstream.md, "Node 20: recursive mkdir loops for ever under /proc").
describe.runIf(fs.existsSync("/proc/self"))("contract: Node's recursive mkdir under /proc", () => {
  it("does not return within 3 s (it spins)", () => {
    const r = spawnSync(process.execPath, ["-e", 'try { require("fs").mkdirSync("/proc/keel-no-such-dir/x", { recursive: true }) } catch (e) { console.log(e.code) }'], { timeout: 3000, encoding: "utf8" });
    expect(r.signal).toBe("SIGTERM");
    expect(r.stdout).toBe("");
  });
});

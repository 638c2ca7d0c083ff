/**
 * The decisions scripts/prepare.mjs takes before anything slow (scripts/prepare-checks.mjs): whether dist/ is newer
 * than every input of the TypeScript build, and whether node_modules holds this lockfile's install. File times are
 * set explicitly (utimes), so nothing here waits for a clock to move.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BUILD_STAMP, INSTALL_STAMP, buildInputs, buildState, installState, lockHash, markBuilt, staleOutputs } from "../../scripts/prepare-checks.mjs";

let root: string;
/** A time well in the past: every file of the fixture is set to it unless a test moves one. */
const T0 = Date.parse("2026-01-01T00:00:00Z");

function write(rel: string, text = "x", mtimeMs = T0): void {
  const p = path.join(root, rel);
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, text);
  fs.utimesSync(p, mtimeMs / 1000, mtimeMs / 1000);
}
const touch = (rel: string, mtimeMs: number): void => fs.utimesSync(path.join(root, rel), mtimeMs / 1000, mtimeMs / 1000);

beforeEach(() => {
  root = fs.mkdtempSync(path.join(os.tmpdir(), "keel-prepare-checks-"));
  for (const f of ["package-lock.json", "tsconfig.json", "tsconfig.build.json"]) write(f, `{"f":"${f}"}`);
  for (const f of ["src/cli.ts", "src/gateway/server.ts", "src/gateway/server.test.ts", "src/types.d.ts"]) write(f);
  for (const f of ["dist/cli.js", "dist/gateway/server.js"]) write(f);
});
afterEach(() => fs.rmSync(root, { recursive: true, force: true }));

describe("is dist/ current?", () => {
  const built = (): void => markBuilt(root, buildInputs(root));

  it("not before a build was recorded; after one, yes while nothing changed", () => {
    expect(buildState(root)).toEqual({ current: false, reason: "no record of a build in dist/" });
    built();
    expect(buildState(root)).toEqual({ current: true, reason: "dist/ was built from these sources" });
  });

  it("a source or a build configuration whose content changed: rebuild, naming it; back as built: current again", () => {
    built();
    write("src/gateway/server.ts", "edited");
    expect(buildState(root)).toEqual({ current: false, reason: "src/gateway/server.ts changed since the last build" });
    write("src/gateway/server.ts", "x");
    for (const config of ["tsconfig.build.json", "tsconfig.json", "package-lock.json"]) {
      write(config, "{}");
      expect(buildState(root)).toEqual({ current: false, reason: `${config} changed since the last build` });
      write(config, `{"f":"${config}"}`);
    }
    expect(buildState(root).current).toBe(true);
  });

  it("times do not count, contents do: an edit given an old time, or an original put back after building an edit", () => {
    built();
    write("src/cli.ts", "edited in the past", T0 - 60_000);
    expect(buildState(root).current).toBe(false);
    built(); // dist/ now holds the edit
    write("src/cli.ts", "x", T0 - 60_000); // the original back from a copy, older than the build
    expect(buildState(root)).toEqual({ current: false, reason: "src/cli.ts changed since the last build" });
    touch("src/cli.ts", T0 + 9_000_000);
    built();
    touch("src/cli.ts", T0 + 99_000_000); // a touch alone changes nothing
    expect(buildState(root).current).toBe(true);
  });

  it("a test file is not a build input: editing one rebuilds nothing", () => {
    built();
    write("src/gateway/server.test.ts", "edited");
    expect(buildState(root).current).toBe(true);
  });

  it("a source added or removed: rebuild", () => {
    built();
    write("src/gateway/new.ts", "x", T0);
    expect(buildState(root)).toEqual({ current: false, reason: "sources were added, removed or renamed" });
    fs.rmSync(path.join(root, "src/gateway/new.ts"));
    expect(buildState(root).current).toBe(true);
    fs.rmSync(path.join(root, "src/cli.ts"));
    expect(buildState(root).current).toBe(false);
  });

  it("an output missing from dist/ (a declaration file has none): rebuild", () => {
    built();
    fs.rmSync(path.join(root, "dist/gateway/server.js"));
    expect(buildState(root)).toEqual({ current: false, reason: `${path.join("dist", "gateway", "server.js")} is missing` });
  });

  it("the stamp lives in dist/: removing dist/ forgets the build; a stamp of the older time-based form is no record", () => {
    built();
    expect(fs.existsSync(path.join(root, BUILD_STAMP))).toBe(true);
    fs.rmSync(path.join(root, "dist"), { recursive: true });
    expect(buildState(root).current).toBe(false);
    write(BUILD_STAMP, JSON.stringify({ startedAt: T0 + 1000, sources: "abc" }));
    expect(buildState(root)).toEqual({ current: false, reason: "no record of a build in dist/" });
  });
});

describe("outputs of deleted sources", () => {
  it("are listed with their maps (a .d.ts source has none to list); live outputs and the stamp are not", () => {
    write("dist/cli.js.map");
    write("dist/gateway/gone.js");
    write("dist/gateway/gone.js.map");
    write("dist/old.mjs");
    write(BUILD_STAMP, "{}");
    expect(staleOutputs(root)).toEqual(["dist/gateway/gone.js", "dist/gateway/gone.js.map", "dist/old.mjs"].map((p) => path.join(...p.split("/"))));
    fs.rmSync(path.join(root, "src", "cli.ts"));
    expect(staleOutputs(root)).toContain(path.join("dist", "cli.js"));
  });

  it("no dist/ at all: nothing", () => {
    fs.rmSync(path.join(root, "dist"), { recursive: true });
    expect(staleOutputs(root)).toEqual([]);
  });
});

describe("is node_modules installed from this lockfile?", () => {
  const stamp = (text: string): void => write(INSTALL_STAMP, text);
  const withDevTools = (): void => write("node_modules/vitest/package.json", "{}");

  it("nothing installed: install, the dev tools only when the tests need them", () => {
    expect(installState(root, { needDev: false })).toMatchObject({ action: "install", flavour: "serve", reason: "node_modules is missing or was not installed from this lockfile" });
    expect(installState(root, { needDev: true })).toMatchObject({ action: "install", flavour: "full" });
  });

  it("a serve-only install serves; the tests install the dev tools", () => {
    stamp(`${lockHash(root)} serve`);
    expect(installState(root, { needDev: false })).toMatchObject({ action: "ok", flavour: "serve" });
    expect(installState(root, { needDev: true })).toMatchObject({ action: "install", flavour: "full", reason: "the tests need the dev dependencies" });
  });

  it("a full install does both; an older prepare's stamp (the hash alone) was a full install", () => {
    withDevTools();
    stamp(`${lockHash(root)} full`);
    expect(installState(root, { needDev: true }).action).toBe("ok");
    stamp(lockHash(root));
    expect(installState(root, { needDev: true })).toMatchObject({ action: "ok", flavour: "full" });
    expect(installState(root, { needDev: false }).action).toBe("ok");
  });

  it("a changed lockfile reinstalls", () => {
    withDevTools();
    stamp(`${lockHash(root)} full`);
    write("package-lock.json", '{"changed":true}', T0 + 1000);
    expect(installState(root, { needDev: false })).toMatchObject({ action: "install", reason: "the lockfile changed since the last install" });
  });

  it("an install npm made by hand (its record newer than the lockfile, no stamp) is adopted, not redone", () => {
    write("node_modules/.package-lock.json", "{}", T0 + 1000);
    expect(installState(root, { needDev: false })).toMatchObject({ action: "adopt", flavour: "serve" });
    expect(installState(root, { needDev: true }).action).toBe("install"); // `npm ci --omit=dev`: no test tools
    withDevTools();
    expect(installState(root, { needDev: true })).toMatchObject({ action: "adopt", flavour: "full" });
    // npm's record older than the lockfile (a pull brought a new one): install.
    touch("node_modules/.package-lock.json", T0 - 1000);
    expect(installState(root, { needDev: false }).action).toBe("install");
  });
});

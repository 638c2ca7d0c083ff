import { afterEach, describe, expect, it, vi } from "vitest";
import { main } from "./main.js";

/** What `main` wrote on stderr and the code it exited with (process.exit stops the call, as it would the process). */
async function run(argv: string[]): Promise<{ code: number | undefined; stderr: string; stdout: string }> {
  let stderr = "";
  let stdout = "";
  vi.spyOn(process.stderr, "write").mockImplementation((s) => ((stderr += String(s)), true));
  vi.spyOn(process.stdout, "write").mockImplementation((s) => ((stdout += String(s)), true));
  class Exit extends Error {
    constructor(readonly code: number | undefined) {
      super("exit");
    }
  }
  vi.spyOn(process, "exit").mockImplementation((code) => {
    throw new Exit(code === undefined || code === null ? undefined : Number(code));
  });
  try {
    await main(argv);
    return { code: undefined, stderr, stdout };
  } catch (err) {
    if (err instanceof Exit) return { code: err.code, stderr, stdout };
    throw err;
  } finally {
    vi.restoreAllMocks();
  }
}

describe("main: the one place the process ends", () => {
  afterEach(() => vi.restoreAllMocks());

  it("a command line that cannot be served exits 2: one message, then where to read the flags", async () => {
    const r = await run(["serve", "--bogus", "--max_num_seqs", "0"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('keel serve: unknown flag --bogus; --max_num_seqs must be an integer between 1 and 256, got "0"\nRun "keel serve --help" for the list of flags.\n');
  });

  it("a CliError thrown while starting is printed and exits with its code", async () => {
    const before = process.env["KEEL_ENGINE_COMMAND"];
    process.env["KEEL_ENGINE_COMMAND"] = "not json";
    try {
      const r = await run(["serve", "--config_path", "/nonexistent/config.json"]);
      expect(r).toMatchObject({ code: 2, stderr: 'keel serve: KEEL_ENGINE_COMMAND must be JSON like {"command":"node","args":["dist/engine/main.js"]}\n' });
    } finally {
      if (before === undefined) delete process.env["KEEL_ENGINE_COMMAND"];
      else process.env["KEEL_ENGINE_COMMAND"] = before;
    }
  });

  it("serve --help prints the flags and ends without an exit code of its own; an unknown command exits 2, --help 0", async () => {
    const help = await run(["serve", "--help"]);
    expect(help.code).toBeUndefined();
    expect(help.stdout).toContain("--rest_port                    HTTP port (default: 8000)");
    const unknown = await run(["nope"]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^keel: unknown command "nope"\n\nUsage: keel serve/);
    expect((await run(["--help"])).code).toBe(0);
  });
});

import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["src/**/*.test.ts", "test/**/*.test.ts"],
    pool: "forks",
    // 2 cores: end-to-end suites each start a server with its own engine; run files one at a time.
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 120_000,
    allowOnly: false,
    passWithNoTests: false,
    // Every server the suites start runs its model check (a remembered pass would skip the lines tests assert on);
    // test/e2e/cli.test.ts turns the memory on where it tests it.
    env: { KEEL_MODEL_CHECK_CACHE: "off" },
  },
});

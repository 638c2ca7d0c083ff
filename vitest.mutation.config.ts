import { defineConfig } from "vitest/config";

// Unit tests only, for `npm run mutation` (StrykerJS): no end-to-end suites (they start servers and take minutes),
// no model/GGUF tests (they exercise nothing the mutated modules contain).
export default defineConfig({
  test: {
    include: ["src/gateway/**/*.test.ts", "src/engine/scheduler*.test.ts", "src/engine/step-loop.test.ts", "src/engine/step-loop.sampling.test.ts"],
    exclude: ["test/**", "node_modules/**", "**/*.contract.test.ts"],
    pool: "forks",
    testTimeout: 20_000,
    allowOnly: false,
  },
});

// Types of scripts/prepare-checks.mjs (for the tests, test/scripts/prepare-checks.test.ts).
export declare const INSTALL_STAMP: string;
export declare const BUILD_STAMP: string;
export declare function lockHash(root: string): string;
export declare function installState(root: string, opts: { needDev: boolean }): { action: "ok" | "adopt" | "install"; flavour: "full" | "serve"; reason: string };
export declare function buildSources(root: string): string[];
export declare function buildState(root: string): { current: boolean; reason: string };
export declare function buildInputs(root: string): Record<string, string | null>;
export declare function staleOutputs(root: string): string[];
export declare function markBuilt(root: string, inputs: Record<string, string | null>): void;

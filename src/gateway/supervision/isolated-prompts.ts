import { createHash } from "node:crypto";
import type { GuideSpec } from "../../protocol/messages.js";

/**
 * What identifies an isolated request: its rendered prompt and, when it had one, its guide (a grammar can be what
 * kills the engine — then a plain request with the same messages is innocent and must not be refused). Hashed, so a
 * large guide costs the memory nothing.
 */
export function isolationKey(prompt: string, guide?: GuideSpec): string {
  if (guide === undefined) return prompt;
  return `guided:${createHash("sha256").update(prompt).update("\u0000").update(JSON.stringify(guide)).digest("hex")}`;
}

/**
 * Memory of prompts isolated as engine killers (culprit isolation, registry.ts), so that a client resending one is
 * refused without another crash. A refusal must be earned and must not last forever: an entry expires `ttlMs`
 * after it was isolated (the engine may have been fixed, or the crash may have had another cause), and the memory
 * is bounded (oldest first out).
 */
export class IsolatedPrompts {
  /** Isolated prompt → when it was isolated (ms since epoch); insertion-ordered, oldest first. */
  private readonly isolatedAt = new Map<string, number>();

  constructor(
    /** How long a prompt stays refused after its isolation (ms). */
    private readonly ttlMs: number,
    /** Most prompts remembered. */
    private readonly capacity = 1000,
  ) {}

  /** Remember `prompt` as isolated at `now`. */
  add(prompt: string, now = Date.now()): void {
    this.isolatedAt.delete(prompt);
    this.isolatedAt.set(prompt, now);
    while (this.isolatedAt.size > this.capacity) this.isolatedAt.delete(this.isolatedAt.keys().next().value as string);
  }

  /** True when `prompt` was isolated less than `ttlMs` ago. An expired entry is forgotten. */
  has(prompt: string, now = Date.now()): boolean {
    const at = this.isolatedAt.get(prompt);
    if (at === undefined) return false;
    if (now - at < this.ttlMs) return true;
    this.isolatedAt.delete(prompt);
    return false;
  }

  /** Prompts remembered (expired ones included until looked up). */
  get size(): number {
    return this.isolatedAt.size;
  }
}

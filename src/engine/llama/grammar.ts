/**
 * llama.cpp grammars for guided generation: compiled GBNF (an LRU cache by text), evaluation states, and the checks
 * that keep the process-fatal hazards out of llama.cpp (an EOG or a refused token is never fed to a grammar; a state
 * that failed once is never touched natively again). The adapter exposes these as the port's GrammarBackend.
 */
import type { CompiledGrammar, GrammarState } from "../backend.js";
import type { Internals, NativeCallGuard, NativeGrammar, NativeGrammarState, NativeSampler } from "./internals.js";
import type { Vocabulary } from "./vocabulary.js";

/** Compiled grammars kept (LRU): a gateway sends the same tool grammar with every request of a conversation. */
const GRAMMAR_CACHE_SIZE = 32;
/** Total GBNF text the cache keeps (bytes, approximately: UTF-16 length); a guide may carry up to 4 MiB. */
const GRAMMAR_CACHE_BYTES = 16 * 1024 * 1024;

/** Root rule name of a compiled trigger/close variant: `literal prefix` then the phase's rule (reserved name). */
export const PREFIXED_ROOT_RULE = "keel-prefixed-root";

/** GBNF string literal of `text` (escapes quote, backslash and control characters; other characters verbatim). */
export function gbnfLiteral(text: string): string {
  let out = '"';
  for (const ch of text) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += "\\x" + c.toString(16).padStart(2, "0");
    else out += ch;
  }
  return out + '"';
}

export class LlamaGrammars {
  /** Compiled grammars by {@link CompiledGrammar.key}, least recently used first (Map order). */
  private readonly cache = new Map<string, { handle: CompiledGrammar; native: NativeGrammar }>();
  /** Sum of the cache keys' lengths (the GBNF texts dominate). */
  private cacheBytes = 0;
  /** Native grammar behind each compiled handle (a handle evicted from the cache stays usable). */
  private readonly nativeGrammars = new WeakMap<CompiledGrammar, NativeGrammar>();
  /** Native evaluation state behind each grammar state handle. */
  private readonly nativeStates = new WeakMap<GrammarState, NativeGrammarState>();
  /** Sampler used only to probe whether a grammar can continue (see {@link canContinue}). */
  private probeSampler: NativeSampler | null = null;

  /** @param addonExports node-llama-cpp's loaded bindings (AddonGrammar wants them). */
  constructor(
    private readonly native: Internals,
    private readonly addonExports: unknown,
    private readonly vocab: Vocabulary,
    private readonly guard: NativeCallGuard,
  ) {}

  /** The native state behind a handle (the sampler attaches it), or undefined for a foreign handle. */
  nativeStateOf(state: GrammarState): NativeGrammarState | undefined {
    return this.nativeStates.get(state);
  }

  /**
   * Compile GBNF `grammar` with root `rule`, or — with a non-empty `prefix` — with root `prefix-literal rule` (a
   * trigger matched inside a token: the token's text before the match is swallowed by the literal). Cached (LRU).
   * @throws Error when llama.cpp cannot parse the grammar or the rule is not defined.
   */
  compile(grammar: string, rule: string, prefix = ""): CompiledGrammar {
    const key = `${rule}\u0000${prefix}\u0000${grammar}`;
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit.handle;
    }
    const text = prefix === "" ? grammar : `${grammar}\n${PREFIXED_ROOT_RULE} ::= ${gbnfLiteral(prefix)} ${rule}\n`;
    const root = prefix === "" ? rule : PREFIXED_ROOT_RULE;
    const native = new this.native.grammar.Grammar(text, { addonExports: this.addonExports, rootRuleName: root });
    const handle: CompiledGrammar = { key };
    this.nativeGrammars.set(handle, native);
    this.cache.set(key, { handle, native });
    this.cacheBytes += key.length;
    // Evict least recently used entries beyond the count or size budget (never the one just added).
    while (this.cache.size > 1 && (this.cache.size > GRAMMAR_CACHE_SIZE || this.cacheBytes > GRAMMAR_CACHE_BYTES)) {
      const oldest = this.cache.keys().next().value!;
      this.cache.delete(oldest);
      this.cacheBytes -= oldest.length;
    }
    return handle;
  }

  /** A fresh evaluation state at the start of a compiled grammar's root. */
  createState(grammar: CompiledGrammar): GrammarState {
    const native = this.nativeGrammars.get(grammar);
    if (!native) throw new Error("grammar not compiled by this adapter");
    const state: GrammarState = { grammar, dead: false };
    this.nativeStates.set(state, new this.native.grammar.State(this.native.model, native));
    return state;
  }

  /** Whether `token` may come next in the grammar (an EOG: whether the rule is complete). False on a dead state. */
  canBeNext(state: GrammarState, token: number): boolean {
    const native = this.nativeStates.get(state);
    if (!native || state.dead || token < 0 || token >= this.vocab.size) return false;
    return this.native.grammar.canBeNext(native, token);
  }

  /** True when the rule is complete (an end-of-generation token may come next). */
  isComplete(state: GrammarState): boolean {
    const eog = this.vocab.eogTokens[0];
    return eog !== undefined && this.canBeNext(state, eog);
  }

  /**
   * Feed one token into a grammar state (a replayed token). Guards both process-fatal hazards by construction: an
   * EOG is never passed to llama.cpp (GGML_ABORT on an incomplete grammar), and a token is passed only after
   * canBeNext said yes (a rejected accept empties the state; the next use trips GGML_ASSERT). @throws Error when the
   * token is refused; the state is then dead.
   */
  accept(state: GrammarState, token: number): void {
    const native = this.nativeStates.get(state);
    if (!native || state.dead) throw new Error("grammar state is dead");
    if (this.vocab.eogSet.has(token)) throw new Error(`end-of-generation token ${token} is never fed to a grammar`);
    if (this.vocab.grammarInert.has(token) || !this.native.grammar.canBeNext(native, token)) {
      state.dead = true;
      throw new Error(`token ${token} cannot continue the grammar`);
    }
    try {
      this.native.grammar.accept(native, token);
    } catch (err) {
      state.dead = true;
      throw err;
    }
  }

  /**
   * Whether the grammar can continue with a token that is not end-of-generation and not banned by `bias` (-Infinity),
   * at a batch logit index of the current step. A probe on a clone of the state (llama.cpp applies the grammar to
   * the whole vocabulary: O(vocabulary), so the loop calls it only when the rule is complete): greedy over the masked
   * candidates; a NaN confidence, a failed accept, an EOG or an inert pick means nothing is allowed.
   */
  async canContinue(batchLogitIndex: number, state: GrammarState, bias: ReadonlyMap<number, number>): Promise<boolean> {
    this.guard.assertIdle("grammarCanContinue()");
    const native = this.nativeStates.get(state);
    if (!native || state.dead) return false;
    const clone = new this.native.grammar.State(native);
    const probe = (this.probeSampler ??= new this.native.SamplerClass(this.native.model));
    const banned = new Map(bias);
    for (const t of this.vocab.eogTokens) banned.set(t, -Infinity);
    probe.applyConfig({
      temperature: 0,
      grammarEvaluationState: clone,
      tokenBiasKeys: Uint32Array.from(banned.keys()),
      tokenBiasValues: Float32Array.from(banned.values()),
    });
    try {
      const [token, , confidence] = await this.native.ctx.sampleToken(batchLogitIndex, probe, false, true);
      return token >= 0 && !this.vocab.eogSet.has(token) && !this.vocab.grammarInert.has(token) && confidence !== undefined && confidence > 0;
    } catch {
      return false; // the clone rejected the forced pick: nothing was allowed
    } finally {
      probe.applyConfig({ temperature: 0 }); // detach the clone
    }
  }

  /** Free the probe sampler. */
  dispose(): void {
    this.probeSampler?.dispose();
    this.probeSampler = null;
  }
}

/**
 * How a guided request's sampler is set up for each sample: the guide decides what constrains it (guide-state.ts),
 * this file turns that into a sampler configuration (grammar state, rule-phase bans, EOG bans lifted while ending),
 * and checks at add that a guide can be applied at all.
 */
import type { GuidePhase, GuideSpec, SamplingParams } from "../../protocol/messages.js";
import type { GrammarBackend, ModelBackend } from "../backend.js";
import { samplerConfig, type RequestState } from "../request-state.js";
import type { SamplingState } from "../sampling-state.js";
import { GuideState, type GuideSampling } from "./guide-state.js";

/**
 * The guide of a new request, with its resumed tokens replayed (the guide's phase is a pure function of the
 * generated tokens; no grammar is compiled before a rule phase needs one).
 */
export function createGuide(
  backend: Pick<ModelBackend, "bytesOf" | "isEndOfGeneration">,
  grammar: GrammarBackend,
  params: SamplingParams & { guide: GuideSpec },
  sampling: SamplingState,
  generated: readonly number[],
): GuideState {
  const guide = new GuideState(
    params.guide,
    {
      compileGrammar: grammar.compileGrammar.bind(grammar),
      createGrammarState: grammar.createGrammarState.bind(grammar),
      grammarCanBeNext: grammar.grammarCanBeNext.bind(grammar),
      grammarAccept: grammar.grammarAccept.bind(grammar),
      grammarIsComplete: grammar.grammarIsComplete.bind(grammar),
      bytesOf: (t) => backend.bytesOf(t),
      isEndOfGeneration: (t) => backend.isEndOfGeneration(t),
    },
    GuideState.bansFor(params.guide, grammar.specialTokens()),
  );
  generated.forEach((t, i) => guide.onToken(t, { isBanned: (b) => sampling.bannedAt(i, b) }));
  return guide;
}

/** Ask the guide what constrains this sample; its continuation probe sees the bias the sample would get. */
export function prepareGuide(backend: ModelBackend, grammar: GrammarBackend, st: RequestState, batchLogitIndex: number): Promise<GuideSampling> {
  return st.guide!.prepare(async (state, then) => {
    const bias = guidedBias(backend, st, { grammar: state, bans: st.guide!.bansInRules, ending: false });
    // The probe applies the grammar to the whole vocabulary: skip it where its answer changes nothing (a
    // complete then:"end" rule with EOG allowed: the sampler picks EOG or a continuation by itself).
    if (then === "end" && !backend.eogTokens.some((t) => bias.get(t) === -Infinity)) return true;
    return grammar.grammarCanContinue(batchLogitIndex, state, bias);
  });
}

/**
 * Configure the sampler of a guided request when its grammar, bias or seed changed. Rule phases add the special
 * token bans; while the guide allows only EOG, the EOG bans (ignore_eos, min_tokens) are lifted so that the
 * grammar never faces an empty choice.
 */
export function configureGuided(backend: ModelBackend, st: RequestState, seed: number, g: GuideSampling): void {
  const bias = guidedBias(backend, st, g);
  const changed = st.configured === null || st.configured.grammar !== g.grammar || st.configured.bias !== bias;
  if (!changed && st.params.temperature === 0) return;
  st.configured = { grammar: g.grammar, bias };
  st.sampler.configure({ ...samplerConfig(st, seed), bias, grammar: g.grammar });
}

/** The bias of a guided sample: the request's own, plus rule-phase bans, minus EOG bans while ending. */
function guidedBias(backend: ModelBackend, st: RequestState, g: GuideSampling): ReadonlyMap<number, number> {
  const base = st.sampling.takeBias();
  if (!g.grammar) return base;
  const cached = st.guideBias;
  if (cached && cached.base === base && cached.ending === g.ending) return cached.merged;
  const merged = new Map(base);
  for (const t of g.bans) merged.set(t, -Infinity);
  if (g.ending) for (const t of backend.eogTokens) merged.delete(t);
  st.guideBias = { base, ending: g.ending, merged };
  return merged;
}

/**
 * Why a guide cannot be applied at all, or null: a rule it names is not defined, or its grammar does not compile.
 * Checked at add so that a client asking for structured output or a forced call never gets unconstrained text
 * instead (a 400 at the gateway); the text is compiled once (cached by text for the rule phases that follow).
 */
export function guideCompileError(grammar: Pick<GrammarBackend, "compileGrammar">, guide: GuideSpec): string | null {
  const named = new Set<string>();
  const add = (p: GuidePhase | undefined): void => {
    if (p?.kind === "rule") named.add(p.rule);
  };
  add(guide.start);
  add(guide.reasoning?.after);
  for (const t of guide.triggers ?? []) named.add(t.rule);
  if (named.size === 0) return null;
  // One pass over the grammar for its rule names (a qwen3coder guide names one trigger rule per tool).
  const defined = new Set([...guide.grammar.matchAll(/^([A-Za-z0-9_-]+)\s*::=/gm)].map((m) => m[1]!));
  const missing = [...named].filter((r) => !defined.has(r));
  if (missing.length > 0) return `the guide names undefined grammar rules: ${missing.join(", ")}`;
  try {
    grammar.compileGrammar(guide.grammar, [...named][0]!);
    return null;
  } catch (err) {
    return `the guide's grammar does not compile: ${(err as Error)?.message ?? String(err)}`;
  }
}

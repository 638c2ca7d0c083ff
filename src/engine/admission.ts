/**
 * An `add` command turned into a live request, or refused: tokenized (after a cheap bound on its length), checked
 * against the vocabulary, the resumed length and the sampling parameters, given its guide, sampler and decoder, and
 * handed to the scheduler. Runs at a step boundary, like every call into the model.
 */
import type { AddMessage, EngineErrorCode } from "../protocol/messages.js";
import { checkSamplingParams } from "../protocol/validate.js";
import { grammarSupport, type ModelBackend, type SamplerHandle } from "./backend.js";
import { createGuide, guideCompileError } from "./guides/guided-sampler.js";
import type { GuideState } from "./guides/guide-state.js";
import { samplerConfig, tokenSeed, type RequestState } from "./request-state.js";
import { SamplingState } from "./sampling-state.js";
import type { Scheduler } from "./scheduler.js";
import type { NgramSettings } from "./speculation/ngram.js";

/** Why an add was refused (the request never became live). */
export interface AddRefused {
  code: EngineErrorCode;
  message: string;
  /** The `params` field at fault, when the refusal is about one (protocol `request_error.param`). */
  param?: string;
}

/** What admission reads besides the command: the model, the scheduler, and what the engine announced it serves. */
export interface AdmissionContext {
  backend: ModelBackend;
  scheduler: Scheduler;
  /** Largest `params.logprobs` served (-1: none). */
  maxTopLogprobs: number;
  /** Whether guides are applied (capabilities.grammars). */
  grammars: boolean;
  /** Prompt-lookup settings of a request that sets none (`--prompt_lookup`), or null when off by default. */
  promptLookup?: NgramSettings | null;
}

/** Make `cmd` a live request (queued in the scheduler), or say why not. */
export function admitAdd(cmd: AddMessage, ctx: AdmissionContext): RequestState | AddRefused {
  const { backend, scheduler } = ctx;
  const refuse = (code: EngineErrorCode, message: string, param?: string): AddRefused => ({ code, message, ...(param ? { param } : {}) });
  let prompt: number[];
  if ("text" in cmd.prompt && backend.tokenLowerBound) {
    const atLeast = backend.tokenLowerBound(cmd.prompt.text);
    if (atLeast >= scheduler.config.maxModelLen) {
      return refuse(
        "context_length_exceeded",
        `This model's maximum context length is ${scheduler.config.maxModelLen} tokens. However, your messages resulted in at least ${atLeast} tokens.`,
      );
    }
  }
  try {
    prompt = "text" in cmd.prompt ? backend.tokenize(cmd.prompt.text) : [...cmd.prompt.tokens];
  } catch (err) {
    return refuse("invalid_prompt", `could not tokenize the prompt: ${(err as Error).message}`);
  }
  const generated = cmd.generated ?? [];
  const all = [...prompt, ...generated];
  const bad = all.find((t) => t >= backend.vocabSize);
  if (bad !== undefined) return refuse("invalid_prompt", `token id ${bad} is outside the vocabulary (${backend.vocabSize})`);
  const maxNew = cmd.params.maxTokens === null ? null : cmd.params.maxTokens - generated.length;
  if (maxNew !== null && maxNew < 1) return refuse("invalid_prompt", "the resumed generation already reached max_tokens");
  const invalid = checkSamplingParams(cmd.params, { vocabSize: backend.vocabSize, maxTopLogprobs: ctx.maxTopLogprobs, grammars: ctx.grammars });
  if (invalid) return refuse("invalid_params", invalid.message, invalid.param);
  const sampling = new SamplingState(cmd.params, backend.eogTokens, generated);
  const nothingLeft = sampling.unsatisfiable(backend.vocabSize, generated.length);
  if (nothingLeft) return refuse("invalid_params", `Invalid value for 'logit_bias': ${nothingLeft}`, "logitBias");
  let guide: GuideState | null = null;
  const spec = cmd.params.guide;
  if (spec) {
    const grammar = grammarSupport(backend)!;
    const uncompilable = guideCompileError(grammar, spec);
    if (uncompilable) return refuse("invalid_params", uncompilable, "guide");
    guide = createGuide(backend, grammar, { ...cmd.params, guide: spec }, sampling, generated);
  }
  // Engine-side state first: a sampler that cannot be created refuses this add only, before the scheduler
  // holds a request that nobody could sample.
  let sampler: SamplerHandle;
  try {
    const history = sampling.repetitionPenalty !== 1 ? all : [];
    sampler = backend.createSampler(samplerConfig({ params: cmd.params, sampling }, tokenSeed(cmd.params.seed, all.length)), history);
  } catch (err) {
    return refuse("engine_error", `could not create a sampler: ${(err as Error).message}`);
  }
  const refusal = scheduler.add({
    id: cmd.id,
    inputTokens: all,
    promptLength: prompt.length,
    maxNewTokens: maxNew,
    ignoreEos: cmd.params.ignoreEos,
    ...(sampling.stopTokens.size > 0 ? { stopTokens: sampling.stopTokens } : {}),
    ...(sampling.minTokens > 0 ? { minTokens: sampling.minTokens } : {}),
    speculation: speculationOf(cmd, ctx),
  });
  if (refusal) {
    sampler.dispose();
    return refuse(refusal.code, refusal.message);
  }
  const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  // Re-prime the decoder with resumed tokens so a character split across the resume point completes.
  for (const t of generated) if (!backend.isEndOfGeneration(t)) decoder.decode(backend.bytesOf(t), { stream: true });
  return { params: cmd.params, sampler, decoder, sampling, guide, configured: null, guideBias: null };
}

/**
 * The request's prompt-lookup settings when speculation can run for it, else null: its own (`numAssistantTokens` 0
 * turns it off), else the server's default. It is an optimisation that never changes the output, so it is left off
 * (not refused) where it could not stay exact or cheap: a guided request (its grammar state moves one token at a
 * time), log probabilities (read per sampled position), and memory that cannot drop rejected drafts (recurrent
 * state, a backend without partial trims).
 */
export function speculationOf(cmd: AddMessage, { backend, scheduler, promptLookup }: AdmissionContext): NgramSettings | null {
  const spec = cmd.params.speculation ?? promptLookup ?? null;
  if (!spec || spec.numAssistantTokens < 1 || cmd.params.guide || cmd.params.logprobs != null) return null;
  if (!backend.trimSequence || backend.canRollBack === false || scheduler.config.partialTrim === false) return null;
  return spec;
}

/** True for a refusal (a live request has a sampler). */
export function isRefused(r: RequestState | AddRefused): r is AddRefused {
  return "code" in r;
}

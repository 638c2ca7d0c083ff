/**
 * The engine protocol: the typed messages that the gateway and an engine process exchange.
 *
 * Language-neutral by design (docs/protocol.md is the normative description; a Python OpenVINO GenAI worker speaks
 * the same JSON). Every message is one JSON object with a protocol version `v` and a discriminant `type`. What a
 * message may hold is defined once, by the zod schemas of gateway-schema.ts and engine-schema.ts (from which
 * protocol.schema.json is generated); these declarations carry the documentation and are checked against those
 * schemas at compile time, so the two cannot drift apart.
 * Token ids are integers in the engine's vocabulary; all counts are in tokens.
 */

/** Protocol version carried by every message; a peer refuses messages of another major version. */
export const PROTOCOL_VERSION = 1;

/** A `logitBias` at or below this bans its token (OpenAI: "-100 should result in a ban"); engine and gateway read it. */
export const LOGIT_BIAS_BAN = -100;

/** Sampling parameters of one request, already validated by the gateway. */
export interface SamplingParams {
  /**
   * Maximum tokens to generate (≥ 1), or null for "until end of generation or the sequence capacity".
   * When set, prompt + maxTokens must fit the sequence capacity or the add is refused (as OVMS and vLLM do).
   */
  maxTokens: number | null;
  /** 0 = greedy; otherwise softmax temperature (0..2). */
  temperature: number;
  /** Nucleus sampling mass (0..1]; 1 disables it. */
  topP: number;
  /** Top-k cut; -1 disables it (the HTTP API accepts -1 or ≥ 1). */
  topK: number;
  /**
   * Seed of the request's randomness. The engine derives each token's seed from (seed, position of the token in
   * the sequence), so a generation resumed at position p samples exactly what the original run would have.
   */
  seed: number;
  /** When true the end-of-generation tokens are banned (logit bias -inf), as llama.cpp's `ignore_eos`. */
  ignoreEos: boolean;
  /**
   * OpenAI presence / frequency penalties (-2..2, 0 = off) and the multiplicative repetition penalty (> 0,
   * 1 = off; vLLM/llama.cpp semantics). The penalty window is the prompt plus every generated token, so the
   * state is a pure function of (prompt ids, generated ids) and a resumed generation is token-identical. Absent = off.
   */
  presencePenalty?: number;
  frequencyPenalty?: number;
  repetitionPenalty?: number;
  /** Min-p cut relative to the most likely token (0..1, 0 = off). Absent = off. */
  minP?: number;
  /** Additive logit bias per token id (-100..100; -100 bans the token), as OpenAI's `logit_bias`. */
  logitBias?: [token: number, bias: number][];
  /** Generated tokens (earlier engines' too) before EOG and `stopTokenIds` may end the request (banned until then); absent = 0. */
  minTokens?: number;
  /** Extra token ids that end the request with reason "stop" (the token is reported but contributes no text). */
  stopTokenIds?: number[];
  /**
   * Log probabilities: absent/null = none; N ≥ 0 = the sampled token's logprob plus the N most likely alternatives
   * (N ≤ the engine's `capabilities.maxTopLogprobs`). Computed from the model's raw distribution at that position
   * (softmax of the logits before temperature, penalties, bias and truncation — vLLM's default).
   */
  logprobs?: number | null;
  /**
   * Constrained generation (issue #9: tool-guided generation, structured output). Needs the engine capability
   * `grammars`; absent = unconstrained. See {@link GuideSpec}.
   */
  guide?: GuideSpec;
  /**
   * Prompt-lookup (n-gram) speculative decoding for this request (OVMS `num_assistant_tokens` / `max_ngram_size`;
   * docs/speculative.md): each decode step may verify up to `numAssistantTokens` draft tokens copied from the
   * request's own history after a match of its last ≤ `maxNgramSize` tokens (0 draft tokens: off for this request).
   * Exact: every emitted token is sampled at its own position with its own seed, as without it. Needs the engine
   * capability `promptLookup` (unless 0). Absent = the engine's default (EngineConfig.promptLookup).
   */
  speculation?: { numAssistantTokens: number; maxNgramSize: number };
}

/**
 * Where a guided request is: `free` (unconstrained; triggers armed), `reasoning` (unconstrained; no trigger armed;
 * ends when `GuideSpec.reasoning.close` is generated), or `rule` (every token must continue the grammar rule `rule`;
 * EOG only once the rule is complete). A rule phase ends when the rule is complete and cannot continue
 * (`then: "free"` re-arms the triggers, e.g. text after a tool call) or only at EOG (`then: "end"`).
 */
export type GuidePhase = { kind: "free" } | { kind: "reasoning" } | { kind: "rule"; rule: string; then: "free" | "end" };

/**
 * A free-phase trigger: when `text` appears in the text generated since the free phase began, the engine constrains
 * generation with `rule` from the first character of the match (text before it stays free; the tokens from the one
 * holding the match start on are replayed into the grammar). `atStart`: match only at the start of the free text,
 * after optional whitespace (a model that opens a bare JSON call). The first trigger in list order that matches wins.
 * A trigger whose replay the grammar rejects drops the constraint for the rest of the request (never a failure).
 */
export interface GuideTrigger {
  text: string;
  rule: string;
  atStart?: boolean;
  /** Phase after the rule completes; default "free". */
  then?: "free" | "end";
}

/**
 * Constrained generation of one request, built by the gateway from `tools`/`tool_choice`/`response_format`.
 * Engine-neutral: the grammar is GBNF (llama.cpp's dialect; code points and string literals, no token references),
 * and the phases are driven by generated text, so any engine with a GBNF-compatible grammar sampler can apply it.
 * Phase state is a pure function of the generated tokens: a resumed request (`generated`) replays them.
 */
export interface GuideSpec {
  /** GBNF text defining every rule named by the phases and triggers. */
  grammar: string;
  /**
   * Phase at the first generated token. A `rule` start phase with `reasoning` set switches to `reasoning` when the
   * generated text so far equals `reasoning.open` (the gateway's rule must allow it, e.g. `gate ::= "<think>" | body`);
   * a `free` start phase with `reasoning` set does so when its text, after leading whitespace, starts with
   * `reasoning.open` (no trigger is armed inside reasoning).
   */
  start: GuidePhase;
  /** Reasoning markers (e.g. `<think>` / `</think>`) and the phase after `close` is generated. */
  reasoning?: { open: string; close: string; after: GuidePhase };
  /** Armed in the `free` phase only. */
  triggers?: GuideTrigger[];
  /**
   * Texts of the special tokens the grammar itself uses (e.g. `<tool_call>`, `</tool_call>`). In a `rule` phase
   * every other special (control / user-defined, non-EOG) token is banned, so a JSON string cannot swallow
   * `<|im_start|>`.
   */
  specialTokens?: string[];
}

/** gateway → engine: queue a request. Applied at the next step boundary. */
export interface AddMessage {
  v: number;
  type: "add";
  /** Gateway-unique request id; never reused. */
  id: string;
  /** The prompt, as rendered text (the engine tokenizes it with special tokens parsed) or as token ids. */
  prompt: { text: string } | { tokens: number[] };
  params: SamplingParams;
  /**
   * Tokens this request already generated on an earlier engine (resume after an engine restart). They are
   * prefilled after the prompt and count towards `maxTokens`; their text is not emitted again.
   */
  generated?: number[];
}

/** gateway → engine: abort requests. Idempotent; unknown ids are ignored. Applied at the next step boundary. */
export interface AbortMessage {
  v: number;
  type: "abort";
  ids: string[];
}

/** gateway → engine: liveness probe; answered at once with a pong, even while a step is in flight. */
export interface PingMessage {
  v: number;
  type: "ping";
  nonce: number;
}

/** gateway → engine: stop stepping, free the model, exit 0. */
export interface ShutdownMessage {
  v: number;
  type: "shutdown";
}

/**
 * gateway → engine: tokenize text with the model's tokenizer (`/v3/tokenize`). Answered by one `tokenized` with the
 * same `id`, outside the step loop (it touches no sequence). Special-token text is parsed as in prompts;
 * `addSpecialTokens` prepends BOS when the model uses one.
 */
export interface TokenizeMessage {
  v: number;
  type: "tokenize";
  /** Gateway-chosen id echoed in the answer. */
  id: string;
  text: string;
  addSpecialTokens: boolean;
}

export type GatewayMessage = AddMessage | AbortMessage | PingMessage | ShutdownMessage | TokenizeMessage;

/** What an engine implementation can do; sent once in `ready`. The gateway refuses a request (400) that needs a
 * capability the current engine lacks instead of accepting and ignoring it. */
export interface EngineCapabilities {
  /** A continuation (prompt + `generated`, same seed) samples exactly what the uninterrupted run would have. */
  exactSeededResume: boolean;
  /** Largest `params.logprobs` the engine serves; -1 = no log probabilities at all. */
  maxTopLogprobs: number;
  /** presence/frequency/repetition penalties, min_p, logit_bias, min_tokens and stop_token_ids are applied. */
  extendedSampling: boolean;
  /** `params.guide` (GBNF, phases, triggers; issue #9 tool-guided generation and structured output) is applied. */
  grammars: boolean;
  /** Requests with the same prompt submitted together share one prefill (for `n` > 1); else the prefix cache. */
  sharedPrefill: boolean;
  /** `params.speculation` (prompt-lookup speculative decoding) is applied. Absent = false. */
  promptLookup?: boolean;
  /**
   * Without `extendedSampling`: the extended sampling fields this engine applies nonetheless (e.g. the OpenVINO
   * engine applies penalties, min_p, min_tokens and stop_token_ids but has no logit_bias). Absent = none.
   */
  samplingFields?: ("presencePenalty" | "frequencyPenalty" | "repetitionPenalty" | "minP" | "logitBias" | "minTokens" | "stopTokenIds")[];
}

/** What the engine serves, sent once in `ready`. */
export interface ModelMetadata {
  /** File path the engine loaded. */
  path: string;
  /** `general.name` of the model, if any. */
  name: string | null;
  /** `general.architecture`, e.g. "llama". */
  architecture: string;
  /** Context the model was trained with (tokens). */
  trainContextSize: number;
  /** Vocabulary size (tokens). */
  vocabSize: number;
  /** The model's own Jinja chat template, if it has one. */
  chatTemplate: string | null;
  /**
   * KV cache elements stored per token over all layers (K and V), from the GGUF hyperparameters, or null when
   * unknown. Multiply by the element size of the KV precision to get bytes per token.
   */
  kvElementsPerToken: number | null;
  /** Text of the BOS and EOS tokens, for chat templates. */
  bosToken: string;
  eosToken: string;
}

/** Scheduler limits the engine runs with (tokens / sequences). */
export interface EngineLimits {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  /** Capacity of one sequence: prompt + generated tokens (tokens). */
  maxModelLen: number;
  /**
   * KV cells (tokens) of one pool shared by all sequences, when the engine has one of fixed size (the OpenVINO
   * engine with a fixed pool). Optional: absent, the KV budget is maxNumSeqs × maxModelLen (llama.cpp's partitions).
   */
  kvPoolTokens?: number;
}

/** engine → gateway: the model is loaded and the step loop runs. */
export interface ReadyMessage {
  v: number;
  type: "ready";
  pid: number;
  model: ModelMetadata;
  limits: EngineLimits;
  /** Engine implementation, e.g. "node-llama-cpp@3.21.1". */
  engine: string;
  capabilities: EngineCapabilities;
  /** The compute backend actually loaded (optional: engines before issue #10 do not send it). */
  backend?: EngineBackend;
  /** Milliseconds from the engine's start to ready (model load + context + warm-up), optional. */
  loadMs?: number;
  /** Milliseconds of the warm-up decodes inside loadMs (llama.cpp engine); absent when none ran. */
  warmupMs?: number;
}

/** The compute backend an engine runs on: `gpu` is the GPU backend's name ("cuda", "vulkan", "metal") or false for CPU. */
export interface EngineBackend {
  gpu: string | false;
  /** Device names the backend uses (GPU names; empty on CPU). */
  devices: string[];
  /**
   * llama.cpp engine: the native addon it runs on, "keel" (Keel's build: one native call samples a step) or
   * "node-llama-cpp" (its own addon); optional (other engines leave it out).
   */
  addon?: "keel" | "node-llama-cpp";
}

/** engine → gateway: model load progress, sent while the model loads (before `ready`); `progress` is 0..1. */
export interface LoadingMessage {
  v: number;
  type: "loading";
  progress: number;
}

/** engine → gateway: reply to a ping. */
export interface PongMessage {
  v: number;
  type: "pong";
  nonce: number;
  /** Steps completed so far. */
  step: number;
}

/**
 * Why a request ended — the one definition for engine, registry, sessions and metrics. "stop": end of generation,
 * a stop token, or (gateway-side) a stop string; "length": max tokens or sequence capacity; "abort": cancelled;
 * "error": failed (see the error code).
 */
export type FinishReason = "stop" | "length" | "abort" | "error";

/**
 * The closed catalogue of engine error codes (request_error and finish.error). The gateway maps each to an HTTP
 * status once (gateway/http/errors.ts); an engine must not invent others (an unknown code is treated as engine_error).
 *   context_length_exceeded, invalid_prompt, invalid_params, duplicate_id → the client's fault (400/409-style)
 *   engine_error, invariant_violation → the engine failed the request (500)
 */
export const ENGINE_ERROR_CODES = [
  "context_length_exceeded",
  "invalid_prompt",
  "invalid_params",
  "duplicate_id",
  "engine_error",
  "invariant_violation",
] as const;
export type EngineErrorCode = (typeof ENGINE_ERROR_CODES)[number];

/** Log probability of one token. */
export interface TokenLogprob {
  token: number;
  logprob: number;
  /**
   * The token's raw bytes (its piece in the vocabulary; part of a multibyte character for some tokens). Optional so
   * that an engine without byte access stays valid; the gateway then shows the token as `token_id:<id>` with null
   * bytes. The llama.cpp engine always sends it.
   */
  bytes?: number[];
}

/** Log probabilities at one generated position: the sampled token and the `params.logprobs` most likely ones. */
export interface PositionLogprobs extends TokenLogprob {
  /** Most likely tokens first; length = params.logprobs (fewer only if the vocabulary is smaller). */
  top: TokenLogprob[];
}

/** Terminal record of one request in a step output. After it the engine never mentions the id again. */
export interface FinishInfo {
  reason: FinishReason;
  /** Prompt tokens (including resumed tokens) and tokens generated by this engine for the request. */
  promptTokens: number;
  completionTokens: number;
  /** Present when reason is "error". */
  error?: { code: EngineErrorCode; message: string };
  /**
   * For an abort: engine steps decoded between the abort's arrival and the release (0 when no step was in
   * flight, 1 when it arrived during a decode). Aborts are applied at the next step boundary.
   */
  stepsAfterAbort?: number;
}

/** What happened to one request in one step. */
export interface RequestOutput {
  id: string;
  /**
   * Set once, in the step where the request was admitted to a sequence (its prefill begins): the prompt's token
   * ids and how many leading tokens were reused from the prefix cache (not prefilled again). `queueMs`:
   * milliseconds from the `add`'s arrival in the engine to its admission, measured before the prefill runs; without
   * it the gateway can only measure queue time to this step output, which includes the first prefill chunk.
   */
  admitted?: { promptTokens: number[]; cachedTokens: number; queueMs?: number };
  /** Tokens sampled for the request in this step (several in a speculative step, or a resumed request's first). */
  tokens: number[];
  /** With `params.logprobs` set: one entry per token in `tokens`, same order. */
  logprobs?: PositionLogprobs[];
  /** Text that became complete in this step (UTF-8 held back until a character is whole). */
  text: string;
  /** With several tokens: where each one's text ends in `text` (UTF-16 offsets; docs/protocol.md §6). */
  textEnds?: number[];
  /**
   * Set once, in the step where the engine stopped constraining this request (a trigger replay the grammar
   * rejected, a grammar it could not build, a sampler error inside a rule): why. The request goes on unconstrained.
   */
  guideDropped?: string;
  finish?: FinishInfo;
}

/** engine → gateway: exactly one per step that did work. */
export interface StepMessage {
  v: number;
  type: "step";
  /** Steps that decoded a batch so far in this engine process (a step that only applied aborts repeats it). */
  step: number;
  /** Tokens decoded in this step (decode + prefill). */
  batchTokens: number;
  outputs: RequestOutput[];
  /**
   * Scheduler state after the step: requests waiting / running, sequences owned by live requests, idle sequences
   * holding reusable KV, and prefill tokens saved by prefix reuse since the engine started (cumulative).
   */
  stats: {
    waiting: number;
    running: number;
    activeSequences: number;
    cachedSequences: number;
    prefixCacheHitTokens: number;
    /**
     * KV cells (tokens) held by live requests' sequences (idle prefix-cache KV excluded). Optional: an engine that
     * does not report it shows 0 KV usage in the gateway gauges.
     */
    kvTokensInUse?: number;
    /**
     * Prompt-lookup draft tokens verified since the engine started, and those of them accepted (cumulative; vLLM's
     * num_draft_tokens / num_accepted_tokens). Optional: an engine without speculation omits them.
     */
    draftTokens?: number;
    acceptedDraftTokens?: number;
    /**
     * Preemptions since the engine started (cumulative): times a running request lost its KV to make room for
     * others and had to wait to be recomputed. Optional: an engine without preemption (llama.cpp) omits it.
     */
    preemptions?: number;
    /**
     * Linear-attention state blocks of a hybrid model (OpenVINO engine): held by live requests, and the pool.
     * Optional: engines or models without linear-attention state omit it.
     */
    linearAttentionBlocks?: { inUse: number; total: number };
    /**
     * Where this step's wall time went, in microseconds: the native decode, sampling (every sequence, with guide
     * probes and log probabilities), and the whole step (command snapshot to this message). Optional: an engine that
     * does not measure it leaves keel_engine_step_phase_seconds empty.
     */
    phaseUs?: { decode: number; sample: number; step: number };
  };
}

/** engine → gateway: an `add` was refused before it reached the scheduler (e.g. prompt too long). */
export interface RequestErrorMessage {
  v: number;
  type: "request_error";
  id: string;
  code: EngineErrorCode;
  message: string;
  /** The `add.params` field at fault (e.g. `logitBias`), when the refusal is about one: the client is told its field. */
  param?: string;
}

/** engine → gateway: a frame the engine could not understand; the engine keeps running. */
export interface ProtocolErrorMessage {
  v: number;
  type: "protocol_error";
  message: string;
}

/** engine → gateway: the engine cannot continue (it exits right after). */
export interface FatalMessage {
  v: number;
  type: "fatal";
  message: string;
}

/** engine → gateway: the answer to a `tokenize` — the token ids, or why the text could not be tokenized. */
export type TokenizedMessage = { v: number; type: "tokenized"; id: string } & ({ tokens: number[] } | { error: string });

export type EngineMessage =
  | LoadingMessage
  | TokenizedMessage
  | ReadyMessage
  | PongMessage
  | StepMessage
  | RequestErrorMessage
  | ProtocolErrorMessage
  | FatalMessage;

/**
 * A llama.cpp vocabulary read once at load: each token's raw bytes (what it adds to the output text), the
 * end-of-generation set, the special tokens, and the cheap token-count bound the loop checks before tokenizing.
 */
import type { NativeModel } from "./internals.js";

/** llama.cpp vocabulary types (llama.h `enum llama_vocab_type`). */
const VOCAB_SPM = 1;
const VOCAB_BPE = 2;

/** GPT-2's byte ↔ printable-character map, inverted: vocab character → byte. */
function gpt2UnicodeToByte(): Map<string, number> {
  const bytes: number[] = [];
  for (let b = 33; b <= 126; b++) bytes.push(b);
  for (let b = 161; b <= 172; b++) bytes.push(b);
  for (let b = 174; b <= 255; b++) bytes.push(b);
  const chars = bytes.map((b) => b);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    if (!bytes.includes(b)) {
      bytes.push(b);
      chars.push(256 + extra++);
    }
  }
  const map = new Map<string, number>();
  bytes.forEach((b, i) => map.set(String.fromCodePoint(chars[i]!), b));
  return map;
}

const CONTROL = 1 << 3; // llama.h LLAMA_TOKEN_ATTR_CONTROL
const USER_DEFINED = 1 << 4; // llama.h LLAMA_TOKEN_ATTR_USER_DEFINED

/** Raw bytes a token contributes to the output text (control tokens: none). */
function tokenBytesOf(model: NativeModel, t: number, vocabType: number, gpt2: Map<string, number> | null, enc: TextEncoder): Uint8Array {
  // Control tokens (ChatML markers, BOS/EOS) are not part of the output text.
  if (model.getTokenAttributes(t) & CONTROL) return new Uint8Array(0);
  const text = model.getTokenString(t) ?? "";
  if (gpt2) {
    const out: number[] = [];
    for (const ch of text) {
      const b = gpt2.get(ch);
      if (b === undefined) return enc.encode(text); // an added token stored verbatim
      out.push(b);
    }
    return Uint8Array.from(out);
  }
  if (vocabType === VOCAB_SPM) {
    const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(text);
    if (m) return Uint8Array.of(parseInt(m[1]!, 16));
    return enc.encode(text.replaceAll("\u2581", " "));
  }
  return enc.encode(text);
}

export class Vocabulary {
  /** Raw bytes each token contributes to the output text; control tokens contribute none. */
  private readonly tokenBytes: Uint8Array[];
  /** End-of-generation token ids. */
  readonly eogTokens: number[] = [];
  /** End-of-generation tokens as a set (checked per sampled token without a native call). */
  readonly eogSet: ReadonlySet<number>;
  /** Matches the text of any control token (ChatML markers, BOS/EOS), or null if the model has none. */
  private readonly controlPattern: RegExp | null;
  /** Longest byte length of a normal token's text. */
  private readonly maxTokenBytes: number;
  /**
   * Tokens llama.cpp's grammar can never accept and does not reject on accept either: their piece starts with a
   * NUL byte (byte-level vocabularies have one), so accept feeds nothing and returns. A sample under a grammar that
   * returns one means every token was masked (measured: greedy then picks candidate 0).
   */
  readonly grammarInert = new Set<number>();
  /** Control and user-defined tokens that are not end-of-generation, with their text (banned in rule phases). */
  readonly specials: { token: number; text: string }[] = [];

  constructor(model: NativeModel, readonly size: number) {
    this.tokenBytes = new Array<Uint8Array>(size);
    const vocabType = model.getVocabularyType();
    const gpt2 = vocabType === VOCAB_BPE ? gpt2UnicodeToByte() : null;
    const enc = new TextEncoder();
    const controls: string[] = [];
    let maxBytes = 1;
    for (let t = 0; t < size; t++) {
      const eog = model.isEogToken(t);
      if (eog) this.eogTokens.push(t);
      if (!eog && model.getTokenAttributes(t) & (CONTROL | USER_DEFINED)) this.specials.push({ token: t, text: model.getTokenString(t) ?? "" });
      const bytes = tokenBytesOf(model, t, vocabType, gpt2, enc);
      this.tokenBytes[t] = bytes;
      if (bytes.length > 0 && bytes[0] === 0) this.grammarInert.add(t);
      if (bytes.length === 0) {
        const text = model.getTokenString(t);
        if (text) controls.push(text);
      } else maxBytes = Math.max(maxBytes, bytes.length);
    }
    this.maxTokenBytes = maxBytes;
    this.eogSet = new Set(this.eogTokens);
    const escaped = controls.sort((a, b) => b.length - a.length).map((c) => c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    this.controlPattern = escaped.length > 0 ? new RegExp(escaped.join("|"), "g") : null;
  }

  /** Raw bytes of a token's text (empty for control tokens and ids outside the vocabulary). */
  bytesOf(token: number): Uint8Array {
    return this.tokenBytes[token] ?? new Uint8Array(0);
  }

  /**
   * Lower bound on the token count of `text` (see ModelBackend.tokenLowerBound): every control-token marker is one
   * token, and every other token covers at most `maxTokenBytes` bytes of the remaining text.
   */
  tokenLowerBound(text: string): number {
    let markers = 0;
    let markerBytes = 0;
    if (this.controlPattern) {
      for (const m of text.matchAll(this.controlPattern)) {
        markers += 1;
        markerBytes += Buffer.byteLength(m[0]);
      }
    }
    const rest = Buffer.byteLength(text) - markerBytes;
    return markers + Math.ceil(rest / Math.max(1, this.maxTokenBytes));
  }
}

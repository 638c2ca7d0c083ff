/**
 * GPT-2 style byte-level BPE: the byte <-> unicode mapping, the GPT-2 pre-tokenizer, a deterministic merge trainer
 * and a reference encoder. The output matches what llama.cpp expects for `tokenizer.ggml.model = "gpt2"` with
 * `tokenizer.ggml.pre = "gpt-2"`: token strings are written in the byte-unicode alphabet (space = "Ġ") and each
 * merge is the string `"<left> <right>"` (llama.cpp splits it at the first space after position 0).
 */

/**
 * GPT-2 `bytes_to_unicode()`: maps each of the 256 byte values to one printable code point. Printable Latin-1
 * bytes (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) map to themselves; the remaining 68 bytes map, in increasing byte order,
 * to U+0100, U+0101, ...
 * @returns an array of 256 one-character strings, indexed by byte value
 */
export function bytesToUnicode(): string[] {
    const keepsItself = (b: number): boolean => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    const out: string[] = [];
    let next = 0x100;
    for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(keepsItself(b) ? b : next++));
    return out;
}

/** Inverse of {@link bytesToUnicode}: code point -> byte value. */
export function unicodeToBytes(): Map<string, number> {
    return new Map(bytesToUnicode().map((ch, b) => [ch, b] as [string, number]));
}

/**
 * The GPT-2 pre-tokenizer pattern (the one llama.cpp uses for `pre = "gpt-2"`): English contractions, an optional
 * space followed by letters / digits / other symbols, and whitespace runs (a run followed by a non-space keeps its
 * last space for the next word).
 */
export const GPT2_PRETOKENIZER = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/** Splits text into GPT-2 pre-tokens ("words"). Concatenating the result gives back `text`. */
export function preTokenize(text: string): string[] {
    return Array.from(text.matchAll(GPT2_PRETOKENIZER), (m) => m[0]);
}

/** Result of {@link trainBpe}. */
export interface BpeVocab {
    /** The 256 byte tokens in byte order (token id = byte value). */
    byteTokens: string[];
    /** Merge rules in priority order, each `"left right"`. */
    merges: string[];
    /** The token created by each merge (`left + right`), same order as `merges`. */
    mergedTokens: string[];
}

/**
 * Trains byte-level BPE merges on `corpus`.
 *
 * Each step merges the most frequent adjacent symbol pair (counted over pre-tokens weighted by occurrence).
 * Ties are broken deterministically: the pair whose left symbol sorts first (JS code-unit order), then the one
 * whose right symbol sorts first. Training stops after `maxMerges` merges or when no pair occurs any more, so
 * fewer merges than requested may be returned for a small corpus. The result depends only on the arguments.
 * @param corpus training text
 * @param options.maxMerges upper bound on the number of merges (>= 0)
 * @throws Error if maxMerges is negative or not an integer
 */
export function trainBpe(corpus: string, options: {maxMerges: number}): BpeVocab {
    const {maxMerges} = options;
    if (!Number.isInteger(maxMerges) || maxMerges < 0) throw new Error(`maxMerges must be a non-negative integer, got ${maxMerges}`);
    const byteTokens = bytesToUnicode();
    const counts = new Map<string, number>();
    for (const w of preTokenize(corpus)) counts.set(w, (counts.get(w) ?? 0) + 1);
    // Sorted so that the iteration order (and therefore everything below) is independent of Map insertion details.
    const words = [...counts.keys()].sort().map((w) => ({
        syms: Array.from(Buffer.from(w, "utf8"), (b) => byteTokens[b]!),
        n: counts.get(w)!
    }));

    const merges: string[] = [];
    const mergedTokens: string[] = [];
    while (merges.length < maxMerges) {
        const pairs = new Map<string, {left: string; right: string; n: number}>();
        for (const w of words) {
            for (let i = 0; i + 1 < w.syms.length; i++) {
                const left = w.syms[i]!, right = w.syms[i + 1]!;
                const key = left + "\u0000" + right;
                const e = pairs.get(key);
                if (e) e.n += w.n;
                else pairs.set(key, {left, right, n: w.n});
            }
        }
        let best: {left: string; right: string; n: number} | undefined;
        for (const e of pairs.values()) {
            if (!best || e.n > best.n ||
                (e.n === best.n && (e.left < best.left || (e.left === best.left && e.right < best.right)))) best = e;
        }
        if (!best) break;
        const {left, right} = best;
        const joined = left + right;
        merges.push(`${left} ${right}`);
        mergedTokens.push(joined);
        for (const w of words) {
            if (w.syms.length < 2) continue;
            const next: string[] = [];
            for (let i = 0; i < w.syms.length; i++) {
                if (i + 1 < w.syms.length && w.syms[i] === left && w.syms[i + 1] === right) {
                    next.push(joined);
                    i++;
                } else next.push(w.syms[i]!);
            }
            w.syms = next;
        }
    }
    return {byteTokens, merges, mergedTokens};
}

/**
 * Reference BPE encoder: pre-tokenizes `text`, maps bytes to the byte-unicode alphabet and applies `merges`
 * lowest-rank first within each pre-token (the GPT-2 algorithm). Special tokens are not recognized.
 * @returns token strings (in the byte-unicode alphabet); map them to ids with the vocabulary
 */
export function bpeEncode(text: string, merges: readonly string[]): string[] {
    const rank = new Map(merges.map((m, i) => [m, i] as [string, number]));
    const b2u = bytesToUnicode();
    const out: string[] = [];
    for (const word of preTokenize(text)) {
        let syms = Array.from(Buffer.from(word, "utf8"), (b) => b2u[b]!);
        for (;;) {
            let bestRank = Infinity, at = -1;
            for (let i = 0; i + 1 < syms.length; i++) {
                const r = rank.get(`${syms[i]} ${syms[i + 1]}`);
                if (r !== undefined && r < bestRank) { bestRank = r; at = i; }
            }
            if (at < 0) break;
            const [l, r] = merges[bestRank]!.split(" ") as [string, string];
            const next: string[] = [];
            for (let i = 0; i < syms.length; i++) {
                if (i + 1 < syms.length && syms[i] === l && syms[i + 1] === r) { next.push(l + r); i++; }
                else next.push(syms[i]!);
            }
            syms = next;
        }
        out.push(...syms);
    }
    return out;
}

/** Longest generated token, in symbols (a leading "Ġ" included): real vocabularies rarely go beyond. */
const GENERATED_TOKEN_MAX_SYMBOLS = 10;

/**
 * Extends a trained vocabulary with `count` generated merges, so that a model can have a realistic vocabulary size
 * (150 k tokens, like Qwen's) without training BPE on a corpus that large.
 *
 * Each generated merge joins two existing word-like tokens: a left one of ASCII letters with an optional leading
 * space ("Ġ"), a right one of ASCII letters only; the result (at most {@link GENERATED_TOKEN_MAX_SYMBOLS} symbols,
 * not yet in the vocabulary) becomes a new token and joins the pools. Picks favour earlier, shorter tokens (index
 * = floor(u^3 * pool size)), which gives a length spread like a real vocabulary's instead of piling up at the
 * limit. Every merge refers to two tokens that exist before it (a well-formed rank order; whether the tokenizer
 * reaches a generated token on the text it spells depends on the merges ranked before, as in any BPE vocabulary).
 * Deterministic: the result depends only on the arguments (a fixed-seed xorshift PRNG).
 * @throws Error if `count` is negative or not an integer, or if no new token can be formed
 */
export function extendBpeVocab(base: BpeVocab, count: number): BpeVocab {
    if (!Number.isInteger(count) || count < 0) throw new Error(`count must be a non-negative integer, got ${count}`);
    const merges = [...base.merges];
    const mergedTokens = [...base.mergedTokens];
    const known = new Set<string>([...base.byteTokens, ...base.mergedTokens]);
    const isLeft = (t: string): boolean => /^Ġ?[a-zA-Z]+$/.test(t);
    const isRight = (t: string): boolean => /^[a-zA-Z]+$/.test(t);
    const all = [...base.byteTokens, ...base.mergedTokens];
    const lefts = all.filter(isLeft);
    const rights = all.filter(isRight);
    let x = 0x2545f491; // xorshift32 state; fixed so that the vocabulary depends on `count` only
    const uniform = (): number => {
        x ^= x << 13; x >>>= 0;
        x ^= x >>> 17;
        x ^= x << 5; x >>>= 0;
        return x / 4294967296;
    };
    const pick = (pool: readonly string[]): string => { const u = uniform(); return pool[Math.floor(u * u * u * pool.length)]!; };
    const maxAttempts = 1000 + 100 * count;
    for (let made = 0, attempts = 0; made < count; attempts++) {
        if (attempts > maxAttempts) throw new Error(`could not generate ${count} distinct tokens (made ${made})`);
        // 1. two existing tokens; 2. skip if too long or already known; 3. record the merge and grow the pools
        const left = pick(lefts), right = pick(rights);
        const joined = left + right;
        if ([...joined].length > GENERATED_TOKEN_MAX_SYMBOLS || known.has(joined)) continue;
        merges.push(`${left} ${right}`);
        mergedTokens.push(joined);
        known.add(joined);
        lefts.push(joined);
        if (isRight(joined)) rights.push(joined);
        made++;
    }
    return {byteTokens: base.byteTokens, merges, mergedTokens};
}

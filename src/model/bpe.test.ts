import {describe, expect, it} from "vitest";
import {bpeEncode, bytesToUnicode, extendBpeVocab, preTokenize, trainBpe, unicodeToBytes} from "./bpe.js";
import {TRAINING_CORPUS} from "./corpus.js";

describe("bytesToUnicode", () => {
    it("is a bijection onto printable single code points with GPT-2's known anchors", () => {
        const m = bytesToUnicode();
        expect(m).toHaveLength(256);
        expect(new Set(m).size).toBe(256);
        expect(m[0x41]).toBe("A");
        expect(m[0x20]).toBe("Ġ"); // space
        expect(m[0x0a]).toBe("Ċ"); // newline
        expect(m[0x00]).toBe("Ā");
        expect(m[0xad]).toBe("\u0143"); // soft hyphen is the 68th (last) remapped byte: U+0100 + 67
        for (const ch of m) expect(/\s/u.test(ch)).toBe(false);
        expect(unicodeToBytes().get("Ġ")).toBe(0x20);
    });
});

describe("preTokenize", () => {
    it("splits like GPT-2 and loses nothing", () => {
        expect(preTokenize("Hello world's  end!!\n\n 42x")).toEqual(["Hello", " world", "'s", " ", " end", "!!", "\n\n", " 42", "x"]);
        const s = "ünïcode 🙂 tabs\tand  spaces  \n";
        expect(preTokenize(s).join("")).toBe(s);
    });
});

describe("trainBpe", () => {
    it("is deterministic and yields the requested merges on the embedded corpus", () => {
        const a = trainBpe(TRAINING_CORPUS, {maxMerges: 760});
        const b = trainBpe(TRAINING_CORPUS, {maxMerges: 760});
        expect(a).toEqual(b);
        expect(a.merges).toHaveLength(760);
        expect(new Set(a.mergedTokens).size).toBe(760);
        for (const m of a.merges) expect(m.split(" ")).toHaveLength(2);
        // a shorter training run is a prefix of a longer one
        expect(trainBpe(TRAINING_CORPUS, {maxMerges: 100}).merges).toEqual(a.merges.slice(0, 100));
    });

    it("breaks ties by left then right symbol", () => {
        // "ab" and "cd" both occur twice; "a b" wins on the left symbol, then "c d".
        expect(trainBpe("cd ab cd ab", {maxMerges: 2}).merges).toEqual(["a b", "c d"]);
        expect(trainBpe("ba bc", {maxMerges: 1}).merges).toEqual(["b a"]);
    });

    it("stops early when nothing is left to merge", () => {
        expect(trainBpe("aaaa", {maxMerges: 50}).merges).toEqual(["a a", "aa aa"]);
        expect(() => trainBpe("x", {maxMerges: -1})).toThrow();
    });

    it("encodes text into merged tokens that concatenate back to the byte string", () => {
        const v = trainBpe(TRAINING_CORPUS, {maxMerges: 760});
        const u2b = unicodeToBytes();
        const text = "The server receives a request 🙂 and the weather is cold.\n";
        const toks = bpeEncode(text, v.merges);
        expect(toks.length).toBeLessThan(Buffer.byteLength(text) / 2);
        const bytes = Buffer.from(toks.join("").split("").map((c) => u2b.get(c)!));
        expect(bytes.toString("utf8")).toBe(text);
    });
});

describe("extendBpeVocab", () => {
    it("adds exactly `count` new word-like tokens, each the merge of two tokens that exist before it", () => {
        const base = trainBpe(TRAINING_CORPUS, {maxMerges: 100});
        const count = 20_000;
        const v = extendBpeVocab(base, count);
        expect(v.merges.slice(0, 100)).toEqual(base.merges);
        expect(v.mergedTokens.slice(0, 100)).toEqual(base.mergedTokens);
        expect(v.merges).toHaveLength(base.merges.length + count);
        expect(v.mergedTokens).toHaveLength(base.merges.length + count);
        const all = [...v.byteTokens, ...v.mergedTokens];
        expect(new Set(all).size).toBe(all.length);
        const seen = new Set([...v.byteTokens, ...base.mergedTokens]);
        const bad: string[] = []; // plain checks in the loop: 20k expect() calls would dominate the test's time
        for (let i = base.merges.length; i < v.merges.length; i++) {
            const [l, r, ...rest] = v.merges[i]!.split(" ");
            const t = v.mergedTokens[i]!;
            const ok = rest.length === 0 && seen.has(l!) && seen.has(r!) && l! + r! === t && /^Ġ?[a-zA-Z]+$/.test(t) && [...t].length <= 10;
            if (!ok) bad.push(`${i}: ${v.merges[i]} -> ${t}`);
            seen.add(t);
        }
        expect(bad).toEqual([]);
        // a spread of lengths like a real vocabulary's, not all at the limit
        const lengths = v.mergedTokens.slice(100).map((t) => [...t].length);
        const mean = lengths.reduce((a, b) => a + b, 0) / lengths.length;
        expect(mean).toBeGreaterThan(4);
        expect(mean).toBeLessThan(9);
        expect(lengths.filter((n) => n <= 5).length).toBeGreaterThan(count / 10);
    });

    it("is deterministic and refuses a bad count", () => {
        const base = trainBpe(TRAINING_CORPUS, {maxMerges: 50});
        expect(extendBpeVocab(base, 3000)).toEqual(extendBpeVocab(base, 3000));
        expect(extendBpeVocab(base, 0).merges).toEqual(base.merges);
        expect(() => extendBpeVocab(base, -1)).toThrow(/non-negative/);
        expect(() => extendBpeVocab(base, 1.5)).toThrow(/non-negative/);
    });
});

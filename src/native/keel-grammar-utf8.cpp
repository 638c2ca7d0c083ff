// Strict UTF-8 under a grammar: before a guided item is sampled, the tokens that would make its output invalid UTF-8
// are masked out of its logit row.
//
// Why: llama.cpp's grammar decodes a candidate token's bytes leniently (docs/upstream.md "Grammars accept invalid
// UTF-8"): it does not check the continuation bytes inside one token, and it accepts overlong forms, surrogates and
// values past U+10FFFF as code points. Byte tokens of a byte-level vocabulary can then spell a sequence the grammar
// counts as ONE character of a string with `maxLength` while any UTF-8 decoder reads it as up to four U+FFFD: the
// guided arguments the client gets break the schema the grammar was built from. The grammar still decides what may
// come next; this only removes candidates whose bytes no strict decoder accepts, given the bytes of an incomplete
// character the grammar holds from earlier tokens (its partial_utf8).
//
// The grammar's partial state is read through llama.cpp's internal headers of the exact release node-llama-cpp ships
// (llama-grammar.h) and the grammar sampler's context layout (llama-sampler.cpp, not in a header: mirrored below).
// Every read is checked first (the sampler's name, both vocabulary pointers); when a check fails nothing is masked
// and keelSamplingCounts().utf8Unchecked counts it (a contract test pins it at 0).
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "llama.h"
#include "llama-grammar.h"
#include "AddonModel.h"
#include "AddonSampler.h"
#include "AddonGrammarEvaluationState.h"

namespace {

/** llama.cpp's llama_sampler_grammar (llama-sampler.cpp) of the release node-llama-cpp ships. */
struct GrammarSamplerContext {
    const llama_vocab* vocab;
    std::string grammar_str;
    std::string grammar_root;
    llama_grammar* grammar;
};

/** A strict decoder's position inside one character: `remain` continuation bytes still due. */
struct Utf8State {
    /** Bits of the character so far (unshifted), as llama.cpp's partial_utf8.value. */
    uint32_t value = 0;
    /** Continuation bytes still due; 0 between characters. */
    int remain = 0;
    /** The character's length in bytes (2–4) while remain > 0. */
    int length = 0;
};

/**
 * Whether some completion of the character in progress is a Unicode scalar value of its length: not overlong, not a
 * surrogate, at most U+10FFFF.
 */
bool completable(const Utf8State& s) {
    static const uint32_t lowest[5] = {0, 0, 0x80, 0x800, 0x10000};
    static const uint32_t highest[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    const uint32_t spread = (1u << (6 * s.remain)) - 1;
    const uint64_t lo64 = static_cast<uint64_t>(s.value) << (6 * s.remain);
    const uint64_t lo = std::max<uint64_t>(lo64, lowest[s.length]);
    const uint64_t hi = std::min<uint64_t>(lo64 | spread, highest[s.length]);
    return lo <= hi && !(lo >= 0xD800 && hi <= 0xDFFF);
}

/** Feed one byte to the strict decoder; false when no valid UTF-8 continues with it. */
bool step(Utf8State& s, uint8_t b) {
    if (s.remain > 0) {
        if ((b >> 6) != 2) return false;
        s.value = (s.value << 6) | (b & 0x3F);
        s.remain--;
        return completable(s);
    }
    if (b < 0x80) return true;
    if (b >= 0xC2 && b <= 0xDF) s = {static_cast<uint32_t>(b & 0x1F), 1, 2};
    else if (b >= 0xE0 && b <= 0xEF) s = {static_cast<uint32_t>(b & 0x0F), 2, 3};
    else if (b >= 0xF0 && b <= 0xF4) s = {static_cast<uint32_t>(b & 0x07), 3, 4};
    else return false;  // a continuation byte with nothing to continue, C0/C1 (always overlong), F5–FF
    return completable(s);
}

/** Whether `bytes` decode strictly from `s` (ending inside a character is fine: the grammar holds it as partial). */
bool decodesStrictly(Utf8State s, const std::string& bytes) {
    for (char c : bytes) {
        if (!step(s, static_cast<uint8_t>(c))) return false;
    }
    return true;
}

/**
 * The strict state behind llama.cpp's partial_utf8 of a grammar that was only ever given strictly valid bytes: the
 * character's length follows from the bits so far (the ranges of valid prefixes of different lengths are disjoint).
 */
Utf8State fromPartial(const llama_partial_utf8& p) {
    Utf8State s;
    if (p.n_remain <= 0) return s;
    s.value = p.value;
    s.remain = p.n_remain;
    if (p.n_remain == 3) s.length = 4;
    else if (p.n_remain == 2) s.length = p.value < 0x10 ? 3 : 4;
    else s.length = p.value < 0x20 ? 2 : (p.value < 0x400 ? 3 : 4);
    return s;
}

/** What the mask needs of one vocabulary, built once (its pieces as the grammar sees them: special = true). */
struct VocabularyBytes {
    const llama_vocab* vocab = nullptr;
    /** Tokens (not end-of-generation, non-empty) whose bytes do not decode strictly between characters. */
    std::vector<llama_token> invalidBetweenCharacters;
    /** Tokens that start with a continuation byte, and their bytes: the only candidates inside a character. */
    std::vector<std::pair<llama_token, std::string>> continuations;
};

std::mutex vocabularyMutex;
/** One entry per vocabulary seen (an engine process serves one model). */
std::vector<VocabularyBytes*> vocabularies;

const VocabularyBytes& bytesOf(const llama_vocab* vocab) {
    std::lock_guard<std::mutex> lock(vocabularyMutex);
    for (const VocabularyBytes* v : vocabularies) {
        if (v->vocab == vocab) return *v;
    }
    auto* v = new VocabularyBytes();  // kept for the process's life, as the model's vocabulary is
    v->vocab = vocab;
    const int32_t n = llama_vocab_n_tokens(vocab);
    std::string piece;
    for (llama_token t = 0; t < n; t++) {
        if (llama_vocab_is_eog(vocab, t)) continue;
        piece.resize(64);
        int32_t len = llama_token_to_piece(vocab, t, piece.data(), static_cast<int32_t>(piece.size()), 0, true);
        if (len < 0) {
            piece.resize(static_cast<size_t>(-len));
            len = llama_token_to_piece(vocab, t, piece.data(), static_cast<int32_t>(piece.size()), 0, true);
        }
        if (len <= 0) continue;
        piece.resize(static_cast<size_t>(len));
        if (!decodesStrictly(Utf8State{}, piece)) v->invalidBetweenCharacters.push_back(t);
        if ((static_cast<uint8_t>(piece[0]) >> 6) == 2) v->continuations.emplace_back(t, piece);
    }
    vocabularies.push_back(v);
    return *v;
}

std::atomic<uint64_t> maskedSteps{0};
std::atomic<uint64_t> uncheckedSteps{0};

}  // namespace

/**
 * Mask (logit −∞ in the item's row) every token whose bytes would make a guided item's output invalid UTF-8, saving
 * each masked entry's logit in `saved` so the caller restores the row after sampling (log probabilities and a retry
 * read the raw logits). A grammar still waiting for its trigger (lazy) constrains nothing yet, so neither does this.
 */
void keelMaskInvalidUtf8(AddonSampler* sampler, float* row, std::vector<std::pair<llama_token, float>>& saved) {
    AddonGrammarEvaluationState* state = sampler->grammarEvaluationState;
    if (state == nullptr || state->sampler == nullptr || row == nullptr) return;
    const llama_vocab* vocab = llama_model_get_vocab(sampler->model->model);
    llama_sampler* grammarSampler = state->sampler;
    const char* name = llama_sampler_name(grammarSampler);
    auto* ctx = static_cast<GrammarSamplerContext*>(grammarSampler->ctx);
    if (name == nullptr || std::strcmp(name, "grammar") != 0 || ctx == nullptr || ctx->vocab != vocab || ctx->grammar == nullptr || ctx->grammar->vocab != vocab) {
        uncheckedSteps.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    if (ctx->grammar->awaiting_trigger) return;
    const VocabularyBytes& bytes = bytesOf(vocab);
    const Utf8State partial = fromPartial(ctx->grammar->partial_utf8);
    const auto mask = [&](llama_token t) {
        saved.emplace_back(t, row[t]);
        row[t] = -INFINITY;
    };
    if (partial.remain == 0) {
        for (llama_token t : bytes.invalidBetweenCharacters) mask(t);
    } else {
        // Inside a character the grammar itself refuses a token that does not start with a continuation byte.
        for (const auto& [t, piece] : bytes.continuations) {
            if (!decodesStrictly(partial, piece)) mask(t);
        }
    }
    maskedSteps.fetch_add(1, std::memory_order_relaxed);
}

/** Guided items masked, and guided items left unmasked because the grammar's layout did not check out. */
std::pair<uint64_t, uint64_t> keelUtf8MaskCounts() {
    return {maskedSteps.load(), uncheckedSteps.load()};
}

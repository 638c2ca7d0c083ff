// Keel's fused sampler for temperature > 0: the token node-llama-cpp's chain would pick, without building and sorting
// a candidate array of the whole vocabulary.
//
// Why: AddonSampler's chain (see AddonSampler::rebuildChainIfNeeded) is, for a sampled request,
//   [logit bias] → [repetition penalty] → top-k (k = the vocabulary when top_k is off) → top-p → [min-p] → temperature
//   → dist (a seeded draw). It copies every logit into (id, logit, p) candidates and top-k SORTS them (the whole
// vocabulary when top_k is off): per sequence per step most of the sampling time, and more the larger the vocabulary.
//
// How (exact, not approximate): only the values of the sorted candidates matter for every float operation of the chain
// (softmax sums, the top-p cut, the min-p cut, the draw), and those values are the same whatever sort produced them.
// With a small top-k the k + 1 largest values are selected in one pass (the chain uses no others). Otherwise the
// values ≥ a threshold t are gathered and radix-sorted (everything below t is provably irrelevant, checked per call:
// see below). The chain's arithmetic is replayed on them in the chain's order with the chain's float/double types,
// and the sampler's OWN dist sampler draws (the same RNG, advanced the same way). The tail below t cannot matter when
//   - it lies past the top-p / min-p cut found above t, or
//   - adding its largest possible term to a running sum leaves the sum unchanged (float for top-p's softmax, double
//     for the draw): round-to-nearest is monotone, so every smaller term leaves it unchanged too.
// Where these cannot be shown for t, t is lowered once; then the caller runs the chain (nothing was drawn yet).
// Ties: ids at tied positions depend on the sort's internals, so a draw that selects a value tied with a neighbour is
// left to the chain (with ties present the draw is made on a clone of the dist sampler first: the real RNG is untouched).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "llama.h"
#include "AddonSampler.h"
#include "AddonGrammarEvaluationState.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

/** Per-thread scratch (the sampling threads each keep their own; sized to the vocabulary once). */
struct FusedScratch {
    std::vector<float> values;              // logits + bias + penalty, when the sampler modifies any
    std::vector<int32_t> counts;            // penalty: occurrences per token in the window (zero between calls)
    std::vector<llama_token> touched;       // penalty: tokens whose count is non-zero
    std::vector<llama_token_data> pool;     // gathered candidates (id, value)
    std::vector<float> sorted;              // the gathered values, descending
    std::vector<uint32_t> keys, keysTmp;    // radix sort buffers
    std::vector<llama_token_data> reduced;  // what the dist sampler draws from
};
thread_local FusedScratch scratch;

/** Max of values[0..n) and whether any is NaN (SSE2 when available: this pass reads the whole vocabulary). */
void scanMax(const float* values, int32_t n, float& maxOut, bool& nanOut) {
    int32_t i = 0;
    float best = -INFINITY;
    bool nan = false;
#if defined(__SSE2__)
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, u = _mm_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m128 a = _mm_loadu_ps(values + i), b = _mm_loadu_ps(values + i + 4);
        m0 = _mm_max_ps(m0, a);
        m1 = _mm_max_ps(m1, b);
        u = _mm_or_ps(u, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_max_ps(m0, m1));
    for (float v : lanes) best = v > best ? v : best;
    nan = _mm_movemask_ps(u) != 0;
#endif
    for (; i < n; i++) {
        const float v = values[i];
        if (v != v) nan = true;
        best = v > best ? v : best;
    }
    maxOut = best;
    nanOut = nan;
}

/** Append every (id, value) with value ≥ t to pool. */
void gather(const float* values, int32_t n, float t, std::vector<llama_token_data>& pool) {
    pool.clear();
    int32_t i = 0;
#if defined(__SSE2__)
    const __m128 tv = _mm_set1_ps(t);
    for (; i + 4 <= n; i += 4) {
        int mask = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(values + i), tv));
        while (mask != 0) {
            const int bit = __builtin_ctz(mask);
            pool.push_back(llama_token_data{i + bit, values[i + bit], 0.0f});
            mask &= mask - 1;
        }
    }
#endif
    for (; i < n; i++) {
        if (values[i] >= t) pool.push_back(llama_token_data{i, values[i], 0.0f});
    }
}

/**
 * The logits as the chain's top-k sees them: the raw row, or (when the sampler has a bias or an active repetition
 * penalty) a copy with the logit-bias sampler's and the penalty sampler's arithmetic applied to the affected tokens.
 */
const float* chainInput(AddonSampler* sampler, const float* logits, int32_t n) {
    const bool bias = sampler->tokenBiasSampler != nullptr && !sampler->tokenBiasSampler_biases.empty();
    const bool penalty = sampler->repeatPenaltySampler != nullptr && sampler->repeatPenalty_maxTokens != 0 &&
        !(sampler->repeatPenalty_penalty == 1.0f && sampler->repeatPenalty_frequencyPenalty == 0.0f && sampler->repeatPenalty_presencePenalty == 0.0f);
    if (!bias && !penalty) return logits;
    auto& s = scratch;
    s.values.assign(logits, logits + n);
    // 1. llama_sampler_logit_bias: each entry, in order, adds its bias to its token's logit.
    if (bias) {
        for (const auto& lb : sampler->tokenBiasSampler_biases) {
            if (lb.token >= 0 && lb.token < n) s.values[lb.token] += lb.bias;
        }
    }
    // 2. llama_sampler_penalties: tokens of the window (the addon's mirror of the sampler's ring buffer), once each.
    if (penalty) {
        if ((int32_t)s.counts.size() < n) s.counts.assign(n, 0);
        s.touched.clear();
        const auto& window = sampler->repeatPenalty_lastTokens;
        for (size_t i = 0; i < window.size(); i++) {
            const llama_token tok = window.rat(i);
            if (tok < 0 || tok >= n) continue;
            if (s.counts[tok]++ == 0) s.touched.push_back(tok);
        }
        const float repeat = sampler->repeatPenalty_penalty, freq = sampler->repeatPenalty_frequencyPenalty, present = sampler->repeatPenalty_presencePenalty;
        for (const llama_token tok : s.touched) {
            const int count = s.counts[tok];
            float v = s.values[tok];
            if (v <= 0) v *= repeat;
            else v /= repeat;
            v -= float(count) * freq + float(count > 0) * present;
            s.values[tok] = v;
            s.counts[tok] = 0;
        }
    }
    return s.values.data();
}

/** Sort values descending: LSD radix (11/11/10 bits) on the order-preserving bit pattern; std::sort when few. */
void sortDescending(std::vector<float>& v) {
    const size_t m = v.size();
    if (m < 512) {
        std::sort(v.begin(), v.end(), [](float a, float b) { return a > b; });
        return;
    }
    auto& a = scratch.keys;
    auto& b = scratch.keysTmp;
    a.resize(m);
    b.resize(m);
    static thread_local uint32_t hist[3][2048];
    std::memset(hist, 0, sizeof(hist));
    for (size_t i = 0; i < m; i++) {
        uint32_t x;
        std::memcpy(&x, &v[i], 4);
        x = (x & 0x80000000u) ? ~x : (x | 0x80000000u);  // ascending key of the float
        a[i] = ~x;                                        // descending
        hist[0][a[i] & 0x7ff]++;
        hist[1][(a[i] >> 11) & 0x7ff]++;
        hist[2][a[i] >> 22]++;
    }
    for (int pass = 0; pass < 3; pass++) {
        uint32_t sum = 0;
        for (auto& h : hist[pass]) {
            const uint32_t c = h;
            h = sum;
            sum += c;
        }
        const int shift = pass * 11;
        for (size_t i = 0; i < m; i++) b[hist[pass][(a[i] >> shift) & 0x7ff]++] = a[i];
        a.swap(b);
    }
    for (size_t i = 0; i < m; i++) {
        uint32_t y = ~a[i];
        y = (y & 0x80000000u) ? (y & 0x7fffffffu) : ~y;
        std::memcpy(&v[i], &y, 4);
    }
}

/**
 * The `want` largest (id, value) of the row, sorted by value descending; false when fewer than `want` are > −∞ or
 * when the row holds a NaN (the chain's comparisons are then not a sort).
 */
bool selectTop(const float* values, int32_t n, size_t want, std::vector<llama_token_data>& out) {
    const auto desc = [](const llama_token_data& a, const llama_token_data& b) { return a.logit > b.logit; };
    const size_t cap = std::max<size_t>(4 * want, 512);
    out.clear();
    float thr = -INFINITY;
    // Keep a buffer of candidates above the running threshold; when it fills, trim it to the best `want` and raise
    // the threshold to the smallest of them (a value equal to it cannot change the top `want` values).
    auto trim = [&] {
        std::nth_element(out.begin(), out.begin() + (want - 1), out.end(), desc);
        out.resize(want);
        thr = out[want - 1].logit;
    };
    int32_t i = 0;
    bool nan = false;
#if defined(__SSE2__)
    __m128 unordered = _mm_setzero_ps();
    for (; i + 4 <= n; i += 4) {
        const __m128 v = _mm_loadu_ps(values + i);
        unordered = _mm_or_ps(unordered, _mm_cmpunord_ps(v, v));
        int mask = _mm_movemask_ps(_mm_cmpgt_ps(v, _mm_set1_ps(thr)));
        while (mask != 0) {
            const int bit = __builtin_ctz(mask);
            out.push_back(llama_token_data{i + bit, values[i + bit], 0.0f});
            mask &= mask - 1;
        }
        if (out.size() >= cap) trim();
    }
    nan = _mm_movemask_ps(unordered) != 0;
#endif
    for (; i < n; i++) {
        if (values[i] != values[i]) nan = true;
        if (values[i] > thr) out.push_back(llama_token_data{i, values[i], 0.0f});
        if (out.size() >= cap) trim();
    }
    if (nan || out.size() < want) return false;
    trim();
    std::sort(out.begin(), out.end(), desc);
    return true;
}

/** Outcome of one attempt. */
enum class Attempt { Sampled, LowerThreshold, UseChain };

/**
 * Replays top-k → top-p → min-p → temperature → dist on `vals`, the m largest values of the row in descending order
 * (every other value is < t; `complete` when they are the whole row). On success `token` is the id at the drawn
 * position, found by `idOf` (called only for a value no other candidate shares).
 */
template <typename IdOf>
Attempt replayChain(AddonSampler* sampler, const float* vals, size_t m, int32_t n, float t, bool complete, IdOf idOf, llama_token& token) {
    if (m == 0) return Attempt::LowerThreshold;
    const float maxv = vals[0];
    // 1. top-k: k (the vocabulary when off). `tailOpen`: the chain's array goes on past `vals` (values < t).
    const int32_t k = sampler->topKSampler_topK <= 0 ? n : std::min(sampler->topKSampler_topK, n);
    size_t size = std::min((size_t)k, m);
    bool tailOpen = (size_t)k > m && !complete;
    // 2. top-p (llama_sampler_top_p_apply on a sorted array): float softmax over the array, then the cumulative cut.
    if (sampler->topPSampler != nullptr && sampler->topPSampler_topP < 1.0f) {
        auto& e = scratch.reduced;
        e.resize(size);
        float sum = 0.0f;
        for (size_t i = 0; i < size; i++) {
            e[i].p = expf(vals[i] - maxv);
            sum += e[i].p;
        }
        if (tailOpen && sum + expf(t - maxv) != sum) return Attempt::LowerThreshold;  // the tail would still add
        const float p = sampler->topPSampler_topP;
        float cum = 0.0f;
        size_t last = size;
        bool found = false;
        for (size_t i = 0; i < size; i++) {
            cum += e[i].p / sum;
            if (cum >= p && i + 1 >= 1) {
                last = i + 1;
                found = true;
                break;
            }
        }
        if (!found && tailOpen) return Attempt::LowerThreshold;  // the cut lies in the tail
        size = last;
        tailOpen = tailOpen && !found;
    }
    // 3. min-p (llama_sampler_min_p_apply, sorted branch): keep while logit ≥ max + log(p).
    if (sampler->minPSampler != nullptr && sampler->minPSampler_minP > 0.0f) {
        const float minLogit = vals[0] + logf(sampler->minPSampler_minP);
        size_t i = 1;
        for (; i < size; ++i) {
            if (vals[i] < minLogit && i >= 1) break;
        }
        if (i == size && tailOpen) {
            if (!(t <= minLogit)) return Attempt::LowerThreshold;  // tail values (< t) may still pass
            tailOpen = false;  // the first tail value is < t ≤ minLogit: the cut is at the end of `vals`
        }
        size = i;
    }
    // 4. temperature (llama_sampler_temp_impl) into the array the draw reads (ids: positions); with an open tail the
    //    draw's double sum must be saturated.
    const float temp = sampler->temperatureSampler_temperature;
    auto& reduced = scratch.reduced;
    reduced.resize(size);
    for (size_t i = 0; i < size; i++) reduced[i] = llama_token_data{(llama_token)i, vals[i] / temp, 0.0f};
    if (tailOpen) {
        const float maxT = reduced[0].logit;
        double sum = 0.0;
        for (size_t i = 0; i < size; i++) sum += expf(reduced[i].logit - maxT);
        if (sum + (double)expf(t / temp - maxT) != sum) return Attempt::LowerThreshold;
    }
    // 5. The draw, by the sampler's own dist sampler. Ids at equal values are ordered by the chain's sort internals:
    //    when the kept values (or the first cut one) have ties, draw on a clone first; a draw on a tied value goes to
    //    the chain with the real RNG untouched, otherwise the real RNG makes its one draw (any array of size ≥ 1
    //    advances it by exactly one uniform draw).
    const auto tiedAt = [&](size_t s) { return (s > 0 && vals[s - 1] == vals[s]) || (s + 1 < m && vals[s + 1] == vals[s]); };
    bool ties = false;
    for (size_t i = 0; i + 1 < std::min(size + 1, m) && !ties; i++) ties = vals[i] == vals[i + 1];
    llama_token_data_array arr{reduced.data(), size, -1, true};
    if (ties) {
        llama_sampler* clone = llama_sampler_clone(sampler->seedSampler);
        llama_sampler_apply(clone, &arr);
        llama_sampler_free(clone);
        if (arr.selected < 0 || arr.selected >= (int64_t)size || tiedAt((size_t)arr.selected)) return Attempt::UseChain;
        llama_token_data one{0, 0.0f, 0.0f};
        llama_token_data_array advance{&one, 1, -1, true};
        llama_sampler_apply(sampler->seedSampler, &advance);
    } else {
        llama_sampler_apply(sampler->seedSampler, &arr);
        if (arr.selected < 0 || arr.selected >= (int64_t)size) {
            token = -1;
            return Attempt::Sampled;
        }
    }
    token = idOf((size_t)arr.selected, vals[arr.selected]);
    return Attempt::Sampled;
}

}  // namespace

/**
 * The first index of the maximum of values[0..n) — what a scan keeping the first strict maximum picks (the chain's
 * greedy) — in two SSE2 passes (the max, then its first position); false when the row holds a NaN (a NaN never wins
 * that scan but breaks the max: the caller scans itself).
 */
bool keelFirstMax(const float* values, int32_t n, int32_t& index) {
    float maxv;
    bool nan;
    scanMax(values, n, maxv, nan);
    if (nan || n <= 0) return false;
    int32_t i = 0;
#if defined(__SSE2__)
    const __m128 mv = _mm_set1_ps(maxv);
    for (; i + 4 <= n; i += 4) {
        const int mask = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(values + i), mv));
        if (mask != 0) {
            index = i + __builtin_ctz(mask);
            return true;
        }
    }
#endif
    for (; i < n; i++) {
        if (values[i] == maxv) {
            index = i;
            return true;
        }
    }
    return false;
}

/**
 * The fused sampling path (see the file comment) on the row `logits` of n values (the caller resolved it on the
 * engine's thread and passes null for backend-sampled rows; this function touches no llama_context, so the sampling
 * threads may call it for different samplers at once). True with `token` set (−1 when nothing was selected, as the
 * chain reports it) when it applied; false, with nothing drawn and no state touched, when the caller must run the
 * chain: a sampler not of the plain sampled shape (greedy, grammar, DRY, XTC, no top-k/dist stage), no row, NaN or
 * infinite logits, a drawn value tied with another, or a tail it could not rule out.
 */
bool keelSampleFused(const float* logits, int32_t n, AddonSampler* sampler, llama_token& token) {
    if (sampler->greedySampler != nullptr || sampler->temperatureSampler == nullptr || sampler->temperatureSampler_temperature <= 0.0f) return false;
    if (sampler->seedSampler == nullptr || sampler->topKSampler == nullptr) return false;
    if (sampler->xtcSampler != nullptr || sampler->dryRepeatPenaltySampler != nullptr) return false;
    if (sampler->grammarEvaluationState != nullptr && sampler->grammarEvaluationState->sampler != nullptr) return false;
    if (logits == nullptr || n <= 1) return false;
    const float* values = chainInput(sampler, logits, n);
    const int32_t topK = sampler->topKSampler_topK <= 0 ? n : std::min(sampler->topKSampler_topK, n);
    auto& pool = scratch.pool;
    auto& sorted = scratch.sorted;
    // 1. A small top-k: its k + 1 largest values (the one after the cut shows a tie across it) are all the chain uses
    //    (one pass over the row; it also refuses NaN).
    if ((size_t)topK + 1 <= 4096 && topK + 1 < n / 4) {
        if (!selectTop(values, n, (size_t)topK + 1, pool)) return false;
        // The bucket-sort overflow below concerns top-k > 128 only; an infinite maximum is left to the chain.
        if (!std::isfinite(pool[0].logit) || (topK > 128 && pool[0].logit >= 3.0e8f)) return false;
        sorted.resize(pool.size());
        for (size_t i = 0; i < pool.size(); i++) sorted[i] = pool[i].logit;
        const auto id = [&](size_t s, float) { return pool[s].id; };
        return replayChain(sampler, sorted.data(), sorted.size(), n, sorted.back(), false, id, token) == Attempt::Sampled;
    }
    float maxv;
    bool nan;
    scanMax(values, n, maxv, nan);
    if (nan || !std::isfinite(maxv)) return false;
    // llama.cpp's bucket sort (top-k above 128 candidates) puts a value whose bucket index overflows an int (above
    // ~3.3e8, only reachable with a huge bias) into the LOWEST bucket: that chain's order is not a sort, so leave it.
    if (topK > 128 && maxv >= 3.0e8f) return false;
    // 2. Otherwise the candidates ≥ t, where t starts at what the stage that ends the chain's array needs in the
    //    common case (top-p's float sum saturates ~17 below the max; min-p cuts at log(p) below it; the draw's double
    //    sum ~37 temperatures below it), lowered once when that does not suffice.
    const float temp = sampler->temperatureSampler_temperature;
    const bool topP = sampler->topPSampler != nullptr && sampler->topPSampler_topP < 1.0f;
    const bool minP = sampler->minPSampler != nullptr && sampler->minPSampler_minP > 0.0f;
    float depth = topP ? 17.5f : minP ? std::min(-logf(sampler->minPSampler_minP) + 0.5f, 38.0f * temp) : 38.0f * temp;
    for (int attempt = 0; attempt < 2; attempt++, depth *= 2.0f) {
        const float t = maxv - depth;
        gather(values, n, t, pool);
        sorted.resize(pool.size());
        for (size_t i = 0; i < pool.size(); i++) sorted[i] = pool[i].logit;
        sortDescending(sorted);
        // The drawn value is unique (checked): its id is the one pool entry with that value.
        const auto id = [&](size_t, float v) {
            for (const auto& c : pool) {
                if (c.logit == v) return c.id;
            }
            return (llama_token)-1;
        };
        switch (replayChain(sampler, sorted.data(), sorted.size(), n, t, pool.size() == (size_t)n, id, token)) {
            case Attempt::Sampled: return true;
            case Attempt::UseChain: return false;
            case Attempt::LowerThreshold: break;
        }
    }
    return false;
}

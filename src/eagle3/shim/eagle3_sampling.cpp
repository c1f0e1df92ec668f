// eagle3_sampling.cpp: see eagle3_sampling.hpp.
#include "eagle3_sampling.hpp"
#include "shim_util.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>

namespace e3 {

float distribution::prob(int32_t token) const {
    for (size_t i = 0; i < size; ++i) {
        if (cand[i].id == token) {
            return cand[i].p;
        }
    }
    return 0.0f;
}

int32_t distribution::argmax() const {
    size_t best = 0;
    for (size_t i = 1; i < size; ++i) {
        if (cand[i].logit > cand[best].logit) {
            best = i;
        }
    }
    return cand[best].id;
}

seq_sampler::~seq_sampler() {
    for (llama_sampler * smpl : stages_) {
        llama_sampler_free(smpl);
    }
    for (llama_sampler * smpl : draft_) {
        llama_sampler_free(smpl);
    }
}

int seq_sampler::init(const llama_vocab * vocab, int32_t n_vocab, int32_t n_ctx, const e3_sampling & s,
                      const int32_t * prompt, int32_t n_prompt, uint64_t seed, e3_error * err) {
    n_vocab_ = n_vocab;
    greedy_ = s.temperature <= 0.0f;
    rng_.seed(seed);
    draft_rng_.seed(seed ^ 0x5851f42d4c957f2dULL);

    std::vector<llama_logit_bias> bias;
    for (int32_t i = 0; i < s.n_logit_bias; ++i) {
        bias.push_back({s.logit_bias[i].token, s.logit_bias[i].bias});
    }
    auto add = [&](llama_sampler * smpl, bool for_draft) {
        stages_.push_back(smpl);
        if (for_draft) {  // a second instance: the draft's transforms keep no state of the target's
            draft_.push_back(llama_sampler_clone(smpl));
        }
        return smpl;
    };
    if (!bias.empty()) {
        add(llama_sampler_init_logit_bias(n_vocab, (int32_t) bias.size(), bias.data()), true);
    }
    const bool penalize = s.penalty_last_n != 0 && (s.repeat_penalty != 1.0f || s.frequency_penalty != 0.0f ||
                                                     s.presence_penalty != 0.0f);
    if (penalize) {
        const int32_t last_n = s.penalty_last_n < 0 ? n_ctx : s.penalty_last_n;
        llama_sampler * penalties = add(llama_sampler_init_penalties(n_vocab, last_n, s.repeat_penalty,
                                                                     s.frequency_penalty, s.presence_penalty), false);
        for (int32_t i = std::max(0, n_prompt - last_n); i < n_prompt; ++i) {
            llama_sampler_accept(penalties, prompt[i]);
        }
    }
    if (s.grammar && s.grammar[0]) {
        llama_sampler * grammar = llama_sampler_init_grammar(vocab, s.grammar, "root");
        if (!grammar) {
            return fail(err, E3_ERR_ARG, "the grammar does not parse (llama.cpp's message says where)");
        }
        add(grammar, false);
    }
    if (!greedy_) {  // (truncation and temperature cannot change a greedy pick)
        if (s.top_k > 0) {
            add(llama_sampler_init_top_k(s.top_k), true);
        }
        if (s.typical_p < 1.0f) {
            add(llama_sampler_init_typical(s.typical_p, 1), true);
        }
        if (s.top_p < 1.0f) {
            add(llama_sampler_init_top_p(s.top_p, 1), true);
        }
        if (s.min_p > 0.0f) {
            add(llama_sampler_init_min_p(s.min_p, 1), true);
        }
        add(llama_sampler_init_temp(s.temperature), true);
    }
    return E3_OK;
}

void seq_sampler::apply(std::vector<llama_sampler *> & chain, const float * logits, distribution & d) const {
    d.cand.resize(n_vocab_);
    for (int32_t i = 0; i < n_vocab_; ++i) {
        d.cand[i] = {i, logits[i], 0.0f};
    }
    llama_token_data_array cur = {d.cand.data(), d.cand.size(), -1, false};
    for (llama_sampler * smpl : chain) {
        llama_sampler_apply(smpl, &cur);
    }
    if (cur.data != d.cand.data()) {  // (a sampler may hand back its own buffer)
        std::vector<llama_token_data> kept(cur.data, cur.data + cur.size);
        d.cand.swap(kept);
    }
    d.size = cur.size;
    float max = -INFINITY;
    for (size_t i = 0; i < d.size; ++i) {
        max = std::max(max, d.cand[i].logit);
    }
    if (!(max > -INFINITY)) {
        d.size = 0;  // nothing left (a grammar that allows no token here)
        return;
    }
    double sum = 0.0;
    for (size_t i = 0; i < d.size; ++i) {
        sum += std::exp((double) d.cand[i].logit - max);
    }
    for (size_t i = 0; i < d.size; ++i) {
        d.cand[i].p = (float) (std::exp((double) d.cand[i].logit - max) / sum);
    }
}

double seq_sampler::uniform(std::mt19937_64 & rng) const {
    return (double) (rng() >> 11) * (1.0 / 9007199254740992.0);
}

const distribution & seq_sampler::target(const float * logits) {
    apply(stages_, logits, target_);
    return target_;
}

static int32_t inverse_cdf(const distribution & d, double u) {
    double left = u;
    for (size_t i = 0; i < d.size; ++i) {
        left -= d.cand[i].p;
        if (left < 0.0) {
            return d.cand[i].id;
        }
    }
    return d.cand[d.size - 1].id;
}

int32_t seq_sampler::pick(const distribution & d) {
    return inverse_cdf(d, uniform(rng_));
}

int32_t seq_sampler::verify(const distribution & p, const distribution & q, int32_t x) {
    const double px = p.prob(x);
    const double qx = q.prob(x);
    if (uniform(rng_) * qx < px) {
        return x;
    }
    // the residual max(0, p - q): positive only where p is
    q_dense_.resize(n_vocab_, 0.0f);
    for (size_t i = 0; i < q.size; ++i) {
        q_dense_[q.cand[i].id] = q.cand[i].p;
    }
    double total = 0.0;
    for (size_t i = 0; i < p.size; ++i) {
        total += std::max(0.0, (double) p.cand[i].p - q_dense_[p.cand[i].id]);
    }
    int32_t token = -1;
    double left = uniform(rng_) * total;
    for (size_t i = 0; i < p.size && token < 0; ++i) {
        const double r = std::max(0.0, (double) p.cand[i].p - q_dense_[p.cand[i].id]);
        left -= r;
        if (r > 0.0 && left < 0.0) {
            token = p.cand[i].id;
        }
    }
    if (token < 0) {  // (rounding: the last candidate with residual mass)
        for (size_t i = p.size; i-- > 0 && token < 0;) {
            if (p.cand[i].p > q_dense_[p.cand[i].id]) {
                token = p.cand[i].id;
            }
        }
    }
    for (size_t i = 0; i < q.size; ++i) {
        q_dense_[q.cand[i].id] = 0.0f;
    }
    return token >= 0 ? token : x;
}

void seq_sampler::accept(int32_t token) {
    for (llama_sampler * smpl : stages_) {
        llama_sampler_accept(smpl, token);
    }
}

// whether any of span logits is above floor (a row is nearly all below the 10th largest
// so far): four compares of four where the build has SSE2 (every x86-64)
constexpr int32_t span = 16;
static bool any_above(const float * x, float floor) {
#if defined(__SSE2__)
    const __m128 f = _mm_set1_ps(floor);
    const __m128 above = _mm_or_ps(_mm_or_ps(_mm_cmpgt_ps(_mm_loadu_ps(x), f), _mm_cmpgt_ps(_mm_loadu_ps(x + 4), f)),
                                   _mm_or_ps(_mm_cmpgt_ps(_mm_loadu_ps(x + 8), f), _mm_cmpgt_ps(_mm_loadu_ps(x + 12), f)));
    return _mm_movemask_ps(above) != 0;
#else
    bool any = false;
    for (int32_t i = 0; i < span; ++i) {
        any |= x[i] > floor;
    }
    return any;
#endif
}

int32_t greedy_draft_pick(const float * logits, int32_t n_vocab, const llama_token * suppressed, int32_t n_suppressed,
                          float * p) {
    constexpr int k = 10;
    float top[k];
    int32_t ids[k];
    int n = 0;
    const auto floor = [&] { return n == k ? top[k - 1] : -INFINITY; };  // what a logit must pass
    for (int32_t i0 = 0; i0 < n_vocab; i0 += span) {
        const int32_t i1 = std::min(i0 + span, n_vocab);
        if (i1 - i0 == span && !any_above(logits + i0, floor())) {
            continue;
        }
        for (int32_t i = i0; i < i1; ++i) {
            const float x = logits[i];
            if (!(x > floor()) ||
                std::find(suppressed, suppressed + n_suppressed, i) != suppressed + n_suppressed) {
                continue;
            }
            int j = n < k ? n++ : k - 1;
            for (; j > 0 && top[j - 1] < x; --j) {
                top[j] = top[j - 1];
                ids[j] = ids[j - 1];
            }
            top[j] = x;
            ids[j] = i;
        }
    }
    if (n == 0 || top[0] == INFINITY) {
        *p = -1.0f;
        return 0;
    }
    double sum = 0.0;
    for (int j = 0; j < n; ++j) {
        sum += expf(top[j] - top[0]);
    }
    *p = (float) (1.0 / sum);
    return ids[0];
}

int32_t seq_sampler::draft_pick(const float * logits, distribution & q, float * p) {
    if (!logits || e3_logits_argmax(logits, n_vocab_) < 0) {
        *p = -1.0f;
        return 0;
    }
    apply(draft_, logits, q);
    const int32_t token = inverse_cdf(q, uniform(draft_rng_));
    *p = q.prob(token);
    return token;
}

}  // namespace e3

// eagle3_sampling.hpp: what one sequence of a generation samples from, for the engine.
//
// llama.cpp's samplers change the logits (logit bias, penalties, grammar, top-k,
// typical-p, top-p, min-p, temperature, in that order, as common/sampling does), and the
// engine draws the token itself from what they leave: one uniform draw per token, from
// the sequence's own generator, so that a seed gives the same tokens with and without
// speculation. The draft's distribution for rejection verification takes the same
// stateless transforms (no penalties, no grammar) and its own generator.
#pragma once

#include "eagle3_engine.h"
#include "llama.h"

#include <cstdint>
#include <random>
#include <vector>

namespace e3 {

// The candidates a transform chain leaves, with probabilities that sum to 1.
struct distribution {
    std::vector<llama_token_data> cand;
    size_t size = 0;

    float prob(int32_t token) const;
    int32_t argmax() const;  // the first most probable candidate (in id order where unsorted)
};

// What llama.cpp's drafters pick greedily with their sampler chain (the logits less the
// vocabulary's suppressed tokens, top-k 10, a softmax summed in double from the largest
// down): the first token of the largest logit, and *p its probability among the 10
// largest. One pass over the row instead of the chain's n_vocab candidates and their
// sort. A row with no finite logit (or none but suppressed ones) gives *p = -1.
int32_t greedy_draft_pick(const float * logits, int32_t n_vocab, const llama_token * suppressed, int32_t n_suppressed,
                          float * p);

class seq_sampler {
  public:
    seq_sampler() = default;
    seq_sampler(const seq_sampler &) = delete;
    seq_sampler & operator=(const seq_sampler &) = delete;
    ~seq_sampler();

    // the chains for settings s (checked by the engine); the prompt feeds the penalties
    int init(const llama_vocab * vocab, int32_t n_vocab, int32_t n_ctx, const e3_sampling & s, const int32_t * prompt,
             int32_t n_prompt, uint64_t seed, e3_error * err);

    bool greedy() const { return greedy_; }
    // no transform at all: a greedy token is the logits' argmax
    bool plain_greedy() const { return greedy_ && stages_.empty(); }

    // the target's distribution at a logits row (greedy: at temperature 1, for logprobs)
    const distribution & target(const float * logits);
    // a token from d with one uniform draw of the target's generator
    int32_t pick(const distribution & d);
    // rejection verification of drafted token x, drawn from q: accepted with probability
    // min(1, p(x) / q(x)); else a token from the residual max(0, p - q), normalized
    int32_t verify(const distribution & p, const distribution & q, int32_t x);
    // an emitted token: the penalties and the grammar move on
    void accept(int32_t token);

    // the draft's distribution at a draft logits row and a token from it (its own
    // generator); q is kept for verify(). A row without usable logits gives *p = -1,
    // below any p_min, so the draft stops there.
    int32_t draft_pick(const float * logits, distribution & q, float * p);

  private:
    void apply(std::vector<llama_sampler *> & chain, const float * logits, distribution & d) const;
    double uniform(std::mt19937_64 & rng) const;

    int32_t n_vocab_ = 0;
    bool greedy_ = true;
    std::vector<llama_sampler *> stages_;  // the target's, in order
    std::vector<llama_sampler *> draft_;   // the draft's (stateless)
    std::mt19937_64 rng_, draft_rng_;
    distribution target_;
    std::vector<float> q_dense_;           // verify(): q by token id
};

}  // namespace e3

/*
 * eagle3_engine.h: the speculative generation loop, in C, without the GIL.
 *
 * An engine drives one target context and, optionally, a speculative session
 * (e3_spec): prefill, then rounds of draft -> verify (one target batch for
 * every live sequence) -> process -> accept -> KV trim, until each sequence
 * reaches its token budget, a stop token or string, or the end of the context.
 * Without a session it decodes one token per sequence per round (plain
 * decoding with the same sampler, for comparisons).
 *
 * Sampling is lossless. llama.cpp's samplers transform the target's logits
 * (logit bias, penalties, grammar, top-k, typical-p, top-p, min-p, temperature;
 * temperature <= 0 is greedy) and the engine draws from what they leave. Two
 * verifications: "match" keeps drafted tokens while they equal the target's own
 * samples (each output token costs one random draw, so a seed gives the same
 * stream with or without speculation); "rejection" draws the drafts from the
 * draft's distribution q under the same transforms and keeps each with
 * probability min(1, p/q), resampling a rejected position from max(0, p - q)
 * (the output follows the target's distribution; more drafts are kept).
 */
#ifndef EAGLE3_ENGINE_H
#define EAGLE3_ENGINE_H

#include "eagle3_shim.h"

#ifdef __cplusplus
extern "C" {
#endif

enum e3_verify {
    E3_VERIFY_MATCH     = 0,
    E3_VERIFY_REJECTION = 1,
};

typedef struct e3_logit_bias {
    int32_t token;
    float   bias;
} e3_logit_bias;

typedef struct e3_sampling {
    float    temperature;       /* <= 0: greedy */
    int32_t  top_k;             /* <= 0: off */
    float    top_p;             /* >= 1: off */
    float    min_p;             /* <= 0: off */
    float    typical_p;         /* >= 1: off */
    int32_t  penalty_last_n;    /* tokens the penalties look back over, the prompt's included; 0: off, -1: n_ctx */
    float    repeat_penalty;    /* 1: off */
    float    frequency_penalty; /* 0: off */
    float    presence_penalty;  /* 0: off */
    const e3_logit_bias * logit_bias;
    int32_t  n_logit_bias;
    const char * grammar;       /* GBNF with a rule "root"; NULL or "": none */
    int32_t  verify;            /* e3_verify */
    uint64_t seed;
} e3_sampling;

enum e3_finish {
    E3_RUNNING        = 0,
    E3_FINISH_LENGTH  = 1, /* max_new_tokens reached */
    E3_FINISH_STOP    = 2, /* end-of-generation token, stop token or stop string */
    E3_FINISH_CONTEXT = 3, /* the context is full */
    E3_FINISH_CANCELLED = 4, /* e3_engine_cancel() or SIGINT */
};

#define E3_DRAFT_AUTO (-1)

enum e3_reuse {
    E3_REUSE_NONE   = 0,
    E3_REUSE_SHARED = 1,
    E3_REUSE_ALL    = 2,
};

/* One generation: n_seq prompts, each on its own sequence, sampled alike. */
typedef struct e3_request {
    int32_t                 n_seq;
    const int32_t *         seq_ids;     /* < n_seq_max; < the session's n_seq with a session */
    const int32_t * const * prompts;
    const int32_t *         n_prompt;
    int32_t * const *       out;         /* room for min(max_new, n_ctx) tokens each; valid until the next start */
    int32_t                 max_new;
    e3_sampling             sampling;
    const int32_t *         stop_tokens;
    int32_t                 n_stop_tokens;
    const char * const *    stop_strings;
    int32_t                 n_stop_strings;
    /* 0: the session's n_draft_max; k > 0: at most k (>= the session's
     * n_min); E3_DRAFT_AUTO: the length that gives the most tokens per second
     * from the session's measured costs and acceptance, down to plain decoding */
    int32_t                 n_draft;
    /* > 0: each emitted token's log-probability under the target (after the
     * sampler's transforms; greedy: at temperature 1) into logprobs[i], and the
     * n_logprobs most probable alternatives into top_ids[i] / top_logprobs[i]
     * (n_logprobs per token, -1 / -inf where fewer are left); as large as out */
    int32_t                 n_logprobs;
    float * const *         logprobs;
    int32_t * const *       top_ids;
    float * const *         top_logprobs;
    int32_t                 trace;       /* nonzero: record every round (e3_engine_trace) */
    /* E3_REUSE_ALL: each sequence keeps the longest prefix of its prompt that its KV cache
     * (and the draft side) holds from this engine's last generation, and the prefix the
     * prompts share is decoded once (on one sequence, then copied to the others);
     * E3_REUSE_SHARED: only the latter (something else changed the contexts: the engine
     * forgets what they held); E3_REUSE_NONE: every prompt is decoded whole */
    int32_t                 reuse;
} e3_request;

/* One round of one request, as recorded with e3_request.trace. */
typedef struct e3_trace_round {
    int32_t round;       /* the generation's round (target pass) number, from 0 */
    int32_t n_drafted;
    int32_t n_accepted;
    double  t_draft_s;   /* this request's share of the round's draft call */
    double  t_verify_s;  /* the round's target pass */
} e3_trace_round;

typedef struct e3_engine e3_engine;

/* spec may be NULL (plain decoding). Neither context may be used by anything
 * else while the engine runs. cancel (may be NULL) is the target context's
 * cancel flag: once set, the running generation ends at its next check
 * (between rounds, and inside the target's decodes), every live sequence with
 * E3_FINISH_CANCELLED and the tokens it has. The caller clears it (and the
 * draft context's) before a start. */
e3_engine * e3_engine_create(struct llama_context * ctx_tgt, e3_spec * spec, e3_cancel * cancel, e3_error * err);
void e3_engine_free(e3_engine * engine);

/* Starts a generation: checks the request (every argument, and that each
 * sequence's grammar and logit biases leave a first token), then clears the
 * requests' KV cache, decodes the prompts and samples each sequence's first
 * token. A request the checks refuse leaves the engine and the contexts as
 * they were; e3_engine_setups() tells a later failure apart. */
int e3_engine_start(e3_engine * engine, const e3_request * request, e3_error * err);

/* The starts that went past the request's checks: when a failed start made it
 * grow, the contexts and the engine's previous generation were changed. */
uint64_t e3_engine_setups(const e3_engine * engine);

/* One round for every live sequence. Returns the live sequences left (0 when
 * all are done), or a negative e3_status. */
int e3_engine_step(e3_engine * engine, e3_error * err);

int32_t e3_engine_n_tokens(const e3_engine * engine, int32_t i);
int32_t e3_engine_finish(const e3_engine * engine, int32_t i);

/* Counters of request i of this generation, or of the whole generation when
 * i < 0 (n_rounds: target passes; for one request, the rounds it took part
 * in). hist may be NULL. */
void e3_engine_counters(const e3_engine * engine, int32_t i, e3_counters * out, const e3_histograms * hist);

/* The rounds request i took part in (their number, when rounds is NULL): up to cap
 * rounds into rounds, and their drafted tokens and the draft's probability of each
 * into drafted / draft_p (rows of the session's n_draft_max, padded with -1 / NaN). */
int32_t e3_engine_trace(const e3_engine * engine, int32_t i, e3_trace_round * rounds, int32_t * drafted,
                        float * draft_p, int32_t cap);

/* What the engine knows sequence seq_id's target KV cache holds: its tokens (up to cap into
 * tokens, which may be NULL) and whether the draft side is in step with them. Returns how
 * many it holds, or -1 when the engine does not know. */
int32_t e3_engine_held(const e3_engine * engine, int32_t seq_id, int32_t * tokens, int32_t cap, int32_t * in_step);

/* Tells the engine what seq_id's contexts hold (a restored state): n tokens (-1: unknown). */
int e3_engine_set_held(e3_engine * engine, int32_t seq_id, const int32_t * tokens, int32_t n, int32_t in_step,
                       e3_error * err);

/* The first largest of a row of n logits, or -1 when the row has no token to pick:
 * a NaN, a +inf, or nothing but -inf (what NaN or infinite weights give). One pass. */
int32_t e3_logits_argmax(const float * logits, int32_t n);

#ifdef __cplusplus
}
#endif

#endif /* EAGLE3_ENGINE_H */

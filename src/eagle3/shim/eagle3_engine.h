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
 * Sampling is lossless: at every verified position the target's own
 * distribution is sampled (top-k, then top-p, then min-p on the raw
 * distribution, then temperature; temperature <= 0 is greedy), and drafted
 * tokens are kept while they equal the sampled ones. Each output token costs
 * exactly one random draw, so a seed gives the same stream with or without
 * speculation.
 */
#ifndef EAGLE3_ENGINE_H
#define EAGLE3_ENGINE_H

#include "eagle3_shim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct e3_sampling {
    float    temperature; /* <= 0: greedy */
    int32_t  top_k;       /* <= 0: off */
    float    top_p;       /* >= 1: off */
    float    min_p;       /* <= 0: off */
    uint64_t seed;
} e3_sampling;

enum e3_finish {
    E3_RUNNING        = 0,
    E3_FINISH_LENGTH  = 1, /* max_new_tokens reached */
    E3_FINISH_STOP    = 2, /* end-of-generation token, stop token or stop string */
    E3_FINISH_CONTEXT = 3, /* the context is full */
};

typedef struct e3_gen_stats {
    int64_t n_prompt;        /* prompt tokens decoded */
    int64_t n_generated;     /* tokens generated */
    int64_t n_rounds;        /* target verify passes (rounds) */
    int64_t n_seq_rounds;    /* sum over rounds of the sequences verified */
    int64_t n_draft_calls;   /* sequences drafted for */
    int64_t n_drafted;       /* tokens drafted */
    int64_t n_accepted;      /* drafted tokens accepted */
    int64_t n_plain_rounds;  /* rounds decoded plainly (adaptive: speculation did not pay) */
    double  t_prefill_s;
    double  t_draft_s;
    double  t_verify_s;      /* target decodes of verify batches */
    double  t_process_s;
    double  t_sample_s;
    double  t_total_s;
} e3_gen_stats;

typedef struct e3_engine e3_engine;

/* spec may be NULL (plain decoding). Neither context may be used by anything
 * else while the engine runs. */
e3_engine * e3_engine_create(struct llama_context * ctx_tgt, e3_spec * spec, char * err, size_t n_err);
void e3_engine_free(e3_engine * engine);

/* Starts a generation of n_req sequences (seq_ids[i] < n_seq_max; < the
 * session's n_seq with a session): clears their KV cache, decodes the prompts
 * and samples each sequence's first token. Request i writes its tokens to
 * out[i] (room for max_new tokens), which must stay valid until the engine is
 * freed or restarted. n_draft > 0 caps the draft length (<= the session's
 * n_draft_max); adaptive != 0 picks the draft length that gives the most
 * tokens per second from the generation's own timings and acceptance, down
 * to plain decoding when no draft length beats it. */
int e3_engine_start(e3_engine * engine, int32_t n_req, const int32_t * seq_ids, const int32_t * const * prompts,
                    const int32_t * n_prompt, int32_t max_new, int32_t * const * out, const e3_sampling * sampling,
                    const int32_t * stop_tokens, int32_t n_stop_tokens, const char * const * stop_strings,
                    int32_t n_stop_strings, int32_t n_draft, int32_t adaptive, char * err, size_t n_err);

/* One round for every live sequence. Returns the live sequences left (0 when
 * all are done), or a negative e3_status. */
int e3_engine_step(e3_engine * engine, char * err, size_t n_err);

/* Rounds until every sequence is done. Returns 0 or a negative e3_status. */
int e3_engine_run(e3_engine * engine, char * err, size_t n_err);

int32_t e3_engine_n_tokens(const e3_engine * engine, int32_t i);
int32_t e3_engine_finish(const e3_engine * engine, int32_t i);
void e3_engine_stats(const e3_engine * engine, e3_gen_stats * out);
/* Accepted-length histogram of this generation (as e3_spec_accept_per_pos). */
void e3_engine_accept_per_pos(const e3_engine * engine, int64_t * out, int32_t n);
/* out[k]: sequence-rounds of this generation that verified a draft of k tokens
 * (k = 0: none, as in plain rounds), for k <= n_draft_max. */
void e3_engine_draft_lengths(const e3_engine * engine, int64_t * out, int32_t n);

#ifdef __cplusplus
}
#endif

#endif /* EAGLE3_ENGINE_H */

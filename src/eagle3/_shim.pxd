# Declarations from shim/eagle3_shim.h and shim/eagle3_engine.h: the C ABI
# over common/speculative.h and the generation loop.
from libc.stddef cimport size_t
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

from eagle3._llama cimport ggml_backend_dev_t, llama_batch_ext, llama_context, llama_model, llama_vocab


cdef extern from "eagle3_shim.h" nogil:
    enum:
        E3_SPEC_KIND_COUNT

    enum e3_status:
        E3_OK
        E3_ERR_INIT
        E3_ERR_PROCESS
        E3_ERR_SEQ
        E3_ERR_ARG
        E3_ERR_STATE
        E3_ERR_EXCEPTION
        E3_ERR_DECODE
        E3_ERR_CONFIG

    ctypedef struct e3_error:
        int status
        int32_t seq_id
        int32_t n_seq
        char message[1024]

    int32_t e3_max_seq()
    int32_t e3_max_layers()
    int32_t e3_max_experts()

    ctypedef struct e3_ngram_config:
        int32_t size_n
        int32_t size_m
        int32_t min_hits
        int32_t n_match
        int32_t mod_n_min
        int32_t mod_n_max
        const char * lookup_cache_static
        const char * lookup_cache_dynamic

    ctypedef struct e3_spec_config:
        uint32_t n_seq
        int32_t n_draft_max
        int32_t n_min
        float p_min
        int32_t kind
        e3_ngram_config ngram

    int e3_spec_check_config(const e3_spec_config * cfg, e3_error * err)
    const char * e3_spec_kind_key(int32_t kind)
    void e3_ngram_config_default(e3_ngram_config * out)
    int e3_vocab_compatible(const llama_model * target, const llama_model * draft, char * why, size_t why_len)

    ctypedef struct e3_counters:
        int64_t n_prompt
        int64_t n_reused
        int64_t n_generated
        int64_t n_rounds
        int64_t n_seq_rounds
        int64_t n_plain_rounds
        int64_t n_draft_calls
        int64_t n_drafted
        int64_t n_accepted
        int64_t n_process_calls
        double t_prefill_s
        double t_draft_s
        double t_verify_s
        double t_process_s
        double t_accept_s
        double t_sample_s
        double t_total_s

    ctypedef struct e3_histograms:
        int64_t * accepted_per_pos
        int64_t * draft_lengths
        int32_t n_hist

    ctypedef struct e3_spec

    ctypedef struct e3_spec_info:
        int32_t kind
        int32_t n_seq
        int32_t n_draft_max
        int32_t n_min
        int32_t need_embd
        int32_t need_embd_pre_norm

    e3_spec * e3_spec_create(llama_context * ctx_tgt, llama_context * ctx_dft, const e3_spec_config * cfg,
                             e3_error * err)
    void e3_spec_free(e3_spec * spec)
    void e3_spec_get_info(const e3_spec * spec, e3_spec_info * out)
    int e3_spec_begin(e3_spec * spec, int32_t seq_id, const int32_t * prompt, int32_t n_prompt, e3_error * err)
    int e3_spec_process(e3_spec * spec, int32_t n_tokens, const int32_t * tokens, const int32_t * pos,
                        const int32_t * seq_ids, e3_error * err)
    int e3_spec_draft(e3_spec * spec, int32_t n_req, const int32_t * seq_ids, const int32_t * n_past,
                      const int32_t * id_last, const int32_t * n_max, int32_t * out, int32_t out_stride,
                      int32_t * out_len, e3_error * err)
    int e3_spec_accept(e3_spec * spec, int32_t seq_id, int32_t n_accepted, e3_error * err)
    int e3_spec_counters(const e3_spec * spec, int32_t seq_id, e3_counters * out, const e3_histograms * hist,
                         e3_error * err)
    void e3_spec_reset_counters(e3_spec * spec)
    void e3_spec_print_upstream_stats(const e3_spec * spec)
    int e3_spec_reset_seq(e3_spec * spec, int32_t seq_id)
    int e3_spec_state_get(const e3_spec * spec, int32_t seq_id, uint8_t * out, size_t cap, size_t * n_out,
                          e3_error * err)
    int e3_spec_state_set(e3_spec * spec, int32_t seq_id, const uint8_t * data, size_t n, e3_error * err)

    int e3_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, int32_t * tokens,
                    int32_t n_tokens_max, int add_special, int parse_special, int32_t * n_out, e3_error * err)
    int e3_detokenize(const llama_vocab * vocab, const int32_t * tokens, int32_t n_tokens, char * text,
                      int32_t text_len_max, int remove_special, int unparse_special, int32_t * n_out, e3_error * err)

    char * e3_json_schema_to_grammar(const char * schema_json, e3_error * err)
    char * e3_chat_apply(const llama_model * model, const char * template_override, const char * const * roles,
                         const char * const * contents, int32_t n_messages, int add_generation_prompt, e3_error * err)
    void e3_free_string(char * s)

    ctypedef struct e3_cancel
    e3_cancel * e3_cancel_attach(llama_context * ctx)
    void e3_cancel_free(e3_cancel * cancel)
    void e3_cancel_set(e3_cancel * cancel, int value)
    int e3_cancel_get(const e3_cancel * cancel)
    void e3_cancel_watch_sigint(e3_cancel * cancel)
    void e3_cancel_unwatch_sigint()

    int e3_eagle3_target_support(const char * arch)
    int e3_multi_token_counts(uint64_t * products, uint64_t * row_loads)
    int e3_capture_layer_input(llama_context * ctx, int32_t lid, e3_error * err)
    const float * e3_layer_input(llama_context * ctx, int32_t lid)

    ctypedef void (*e3_log_callback)(int level, const char * text, void * user_data) noexcept
    void e3_log_set(e3_log_callback cb, void * user_data)
    void e3_log_set_common_verbosity(int verbosity)


cdef extern from "eagle3_engine.h" nogil:
    enum:
        E3_VERIFY_MATCH
        E3_VERIFY_REJECTION

    ctypedef struct e3_logit_bias:
        int32_t token
        float bias

    ctypedef struct e3_sampling:
        float temperature
        int32_t top_k
        float top_p
        float min_p
        float typical_p
        int32_t penalty_last_n
        float repeat_penalty
        float frequency_penalty
        float presence_penalty
        const e3_logit_bias * logit_bias
        int32_t n_logit_bias
        const char * grammar
        int32_t verify
        uint64_t seed

    enum:
        E3_RUNNING
        E3_FINISH_LENGTH
        E3_FINISH_STOP
        E3_FINISH_CONTEXT
        E3_FINISH_CANCELLED
        E3_DRAFT_AUTO
        E3_REUSE_NONE
        E3_REUSE_SHARED
        E3_REUSE_ALL

    ctypedef struct e3_request:
        int32_t n_seq
        const int32_t * seq_ids
        const int32_t * const * prompts
        const int32_t * n_prompt
        int32_t * const * out
        int32_t max_new
        e3_sampling sampling
        const int32_t * stop_tokens
        int32_t n_stop_tokens
        const char * const * stop_strings
        int32_t n_stop_strings
        int32_t n_draft
        int32_t n_logprobs
        float * const * logprobs
        int32_t * const * top_ids
        float * const * top_logprobs
        int32_t trace
        int32_t reuse

    ctypedef struct e3_trace_round:
        int32_t round
        int32_t n_drafted
        int32_t n_accepted
        double t_draft_s
        double t_verify_s

    ctypedef struct e3_engine

    e3_engine * e3_engine_create(llama_context * ctx_tgt, e3_spec * spec, e3_cancel * cancel, e3_error * err)
    void e3_engine_free(e3_engine * engine)
    int e3_engine_start(e3_engine * engine, const e3_request * request, e3_error * err)
    uint64_t e3_engine_setups(const e3_engine * engine)
    int e3_engine_step(e3_engine * engine, e3_error * err)
    int32_t e3_engine_n_tokens(const e3_engine * engine, int32_t i)
    int32_t e3_engine_finish(const e3_engine * engine, int32_t i)
    void e3_engine_counters(const e3_engine * engine, int32_t i, e3_counters * out, const e3_histograms * hist)
    int32_t e3_engine_trace(const e3_engine * engine, int32_t i, e3_trace_round * rounds, int32_t * drafted,
                            float * draft_p, int32_t cap)
    int32_t e3_engine_held(const e3_engine * engine, int32_t seq_id, int32_t * tokens, int32_t cap, int32_t * in_step)
    int e3_engine_set_held(e3_engine * engine, int32_t seq_id, const int32_t * tokens, int32_t n, int32_t in_step,
                           e3_error * err)
    int32_t e3_logits_argmax(const float * logits, int32_t n)


cdef extern from "eagle3_shim.h" nogil:
    int e3_state_get(llama_context * ctx, int32_t seq_id, uint8_t * out, size_t cap, size_t * n_out, e3_error * err)
    int e3_state_set(llama_context * ctx, int32_t seq_id, const uint8_t * data, size_t n, e3_error * err)
    int e3_decode(llama_context * ctx, llama_batch_ext * batch, int32_t * rc, e3_error * err)
    int e3_rpc_available()
    int32_t e3_rpc_devices(const char * endpoint, ggml_backend_dev_t * out, int32_t cap, e3_error * err)
    int e3_rpc_failed(const char * endpoint, e3_error * err)
    int e3_rpc_serve(const char * endpoint, const char * cache_dir, int32_t n_threads, e3_error * err)
    void e3_rpc_stop()
    int e3_model_layer_device(const llama_model * model, int32_t il, const char ** name, const char ** description)
    int32_t e3_model_device_bytes(const llama_model * model, const char ** names, uint64_t * bytes, int32_t cap)

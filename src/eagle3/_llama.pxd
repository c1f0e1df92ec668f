# Declarations from llama.h and gguf.h: only what eagle3 uses, nothing else.
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdio cimport FILE


cdef extern from "llama.h" nogil:
    ctypedef int32_t llama_token
    ctypedef int32_t llama_pos
    ctypedef int32_t llama_seq_id

    cdef struct llama_model
    cdef struct llama_context
    cdef struct llama_vocab
    cdef struct llama_memory_i
    ctypedef llama_memory_i * llama_memory_t
    cdef struct llama_batch_ext
    cdef struct ggml_backend_device
    ctypedef ggml_backend_device * ggml_backend_dev_t

    ctypedef bint (*llama_progress_callback)(float progress, void * user_data) noexcept

    enum llama_context_type:
        LLAMA_CONTEXT_TYPE_DEFAULT
        LLAMA_CONTEXT_TYPE_MTP

    enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO
        LLAMA_FLASH_ATTN_TYPE_DISABLED
        LLAMA_FLASH_ATTN_TYPE_ENABLED

    enum:  # enum llama_vocab_type (its name is also a function's)
        LLAMA_VOCAB_TYPE_NONE

    enum:  # enum llama_load_mode
        LLAMA_LOAD_MODE_AUTO
        LLAMA_LOAD_MODE_NONE
        LLAMA_LOAD_MODE_MMAP
        LLAMA_LOAD_MODE_MLOCK
        LLAMA_LOAD_MODE_MMAP_MLOCK

    cdef struct llama_model_params:
        ggml_backend_dev_t * devices  # NULL-terminated; NULL: every device llama.cpp knows
        const float * tensor_split    # llama_max_devices() shares, one per device
        int32_t n_gpu_layers
        int load_mode  # enum llama_load_mode
        llama_progress_callback progress_callback
        void * progress_callback_user_data
        bint vocab_only
        bint check_tensors
        bint load_mtp
        bint use_extra_bufts  # repacked weight layouts (ggml-cpu/repack.cpp)

    cdef struct llama_context_params:
        uint32_t n_ctx
        uint32_t n_batch
        uint32_t n_ubatch
        uint32_t n_seq_max
        uint32_t n_outputs_max
        int32_t n_threads
        int32_t n_threads_batch
        llama_context_type ctx_type
        llama_flash_attn_type flash_attn_type
        bint embeddings
        bint no_perf
        llama_context * ctx_other

    cdef struct llama_model_quantize_params:
        int32_t nthread
        int ftype  # enum llama_ftype
        bint allow_requantize
        bint quantize_output_tensor
        bint pure

    llama_model_params llama_model_default_params()
    llama_context_params llama_context_default_params()
    llama_model_quantize_params llama_model_quantize_default_params()
    uint32_t llama_model_quantize(const char * fname_inp, const char * fname_out,
                                  const llama_model_quantize_params * params)

    void llama_backend_init()
    size_t llama_max_devices()
    void llama_synchronize(llama_context * ctx)

    llama_model * llama_model_load_from_file(const char * path_model, llama_model_params params)
    void llama_model_free(llama_model * model)
    llama_context * llama_init_from_model(llama_model * model, llama_context_params params)
    void llama_free(llama_context * ctx)

    uint32_t llama_n_ctx(const llama_context * ctx)
    uint32_t llama_n_batch(const llama_context * ctx)
    uint32_t llama_n_ubatch(const llama_context * ctx)
    uint32_t llama_n_seq_max(const llama_context * ctx)
    int32_t llama_n_threads(llama_context * ctx)
    int32_t llama_n_threads_batch(llama_context * ctx)

    llama_memory_t llama_get_memory(const llama_context * ctx)
    const llama_vocab * llama_model_get_vocab(const llama_model * model)

    int32_t llama_model_n_ctx_train(const llama_model * model)
    int32_t llama_model_n_embd(const llama_model * model)
    const char * llama_model_chat_template(const llama_model * model, const char * name)
    int32_t llama_model_n_layer(const llama_model * model)
    int32_t llama_model_n_layer_nextn(const llama_model * model)
    int32_t llama_model_n_head(const llama_model * model)
    int32_t llama_model_n_head_kv(const llama_model * model)
    uint64_t llama_model_size(const llama_model * model)
    uint64_t llama_model_n_params(const llama_model * model)
    int32_t llama_model_desc(const llama_model * model, char * buf, size_t buf_size)

    int llama_vocab_type(const llama_vocab * vocab)
    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)
    bint llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)
    llama_token llama_vocab_bos(const llama_vocab * vocab)
    llama_token llama_vocab_eos(const llama_vocab * vocab)
    bint llama_vocab_get_add_bos(const llama_vocab * vocab)

    void llama_memory_clear(llama_memory_t mem, bint data)
    bint llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1)
    llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id)
    llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id)

    llama_batch_ext * llama_batch_ext_init(llama_context * ctx)
    void llama_batch_ext_free(llama_batch_ext * batch)
    void llama_batch_ext_clear(llama_batch_ext * batch)
    int32_t llama_batch_ext_add_token(llama_batch_ext * batch, llama_seq_id seq_id, llama_token id)
    bint llama_batch_ext_add_seq(llama_batch_ext * batch, int32_t idx, llama_seq_id seq_id)
    bint llama_batch_ext_set_output_logits(llama_batch_ext * batch, int32_t idx, bint value)
    bint llama_batch_ext_set_pos(llama_batch_ext * batch, int32_t idx, const llama_pos * pos)

    float * llama_get_logits_ith(llama_context * ctx, int32_t i)

    cdef struct llama_perf_context_data:
        int32_t n_p_eval
        int32_t n_eval
    llama_perf_context_data llama_perf_context(const llama_context * ctx)

    const char * llama_print_system_info()


cdef extern from "gguf.h" nogil:
    cdef struct gguf_context
    cdef struct ggml_context

    cdef struct gguf_init_params:
        bint no_alloc
        ggml_context ** ctx

    enum gguf_type:
        GGUF_TYPE_UINT8
        GGUF_TYPE_INT8
        GGUF_TYPE_UINT16
        GGUF_TYPE_INT16
        GGUF_TYPE_UINT32
        GGUF_TYPE_INT32
        GGUF_TYPE_FLOAT32
        GGUF_TYPE_BOOL
        GGUF_TYPE_STRING
        GGUF_TYPE_ARRAY
        GGUF_TYPE_UINT64
        GGUF_TYPE_INT64
        GGUF_TYPE_FLOAT64

    gguf_context * gguf_init_from_file(const char * fname, gguf_init_params params)
    void gguf_free(gguf_context * ctx)
    int64_t gguf_get_n_kv(const gguf_context * ctx)
    const char * gguf_get_key(const gguf_context * ctx, int64_t key_id)
    gguf_type gguf_get_kv_type(const gguf_context * ctx, int64_t key_id)
    gguf_type gguf_get_arr_type(const gguf_context * ctx, int64_t key_id)
    const void * gguf_get_val_data(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_val_str(const gguf_context * ctx, int64_t key_id)
    size_t gguf_get_arr_n(const gguf_context * ctx, int64_t key_id)
    const void * gguf_get_arr_data(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_arr_str(const gguf_context * ctx, int64_t key_id, size_t i)
    size_t gguf_get_data_offset(const gguf_context * ctx)
    int64_t gguf_get_n_tensors(const gguf_context * ctx)
    size_t gguf_get_tensor_offset(const gguf_context * ctx, int64_t tensor_id)
    const char * gguf_get_tensor_name(const gguf_context * ctx, int64_t tensor_id)
    const int64_t * gguf_get_tensor_ne(const gguf_context * ctx, int64_t tensor_id)
    int gguf_get_tensor_type(const gguf_context * ctx, int64_t tensor_id)
    size_t gguf_get_tensor_size(const gguf_context * ctx, int64_t tensor_id)


cdef extern from "ggml.h" nogil:
    const char * ggml_type_name(int type)
    enum: GGML_MAX_DIMS

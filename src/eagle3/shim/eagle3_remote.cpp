// Remote devices through llama.cpp's RPC backend, and where a model's parts went.
//
// The build's ggml-rpc patch turns every failure of a connection into a kept
// error (see ggml-rpc.h); this file connects, reports those errors, and runs
// the server. Without the RPC backend the calls say it is not built in.
#include "eagle3_shim.h"
#include "shim_util.hpp"

#include "ggml-backend.h"
#include "llama-model.h"

#ifdef E3_HAVE_RPC
#include "ggml-rpc.h"
#endif

#include <exception>
#include <map>
#include <string>

#ifndef E3_HAVE_RPC
namespace {

int not_built(e3_error * err) {
    return e3::fail(err, E3_ERR_ARG, "this eagle3 was built without llama.cpp's RPC backend (meson option rpc)");
}

}  // namespace
#endif

extern "C" {

int e3_rpc_available(void) {
#ifdef E3_HAVE_RPC
    return 1;
#else
    return 0;
#endif
}

int32_t e3_rpc_devices(const char * endpoint, e3_device * out, int32_t cap, e3_error * err) {
#ifdef E3_HAVE_RPC
    try {
        ggml_backend_rpc_clear_error(endpoint);  // a load: what failed before it is not its failure
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint);
        char why[512] = "";
        if (reg == nullptr) {
            if (!ggml_backend_rpc_get_error(endpoint, why, sizeof(why))) {
                std::snprintf(why, sizeof(why), "it has no devices");
            }
            return e3::fail(err, E3_ERR_ARG, "RPC server %s: %s", endpoint, why);
        }
        const size_t n = ggml_backend_reg_dev_count(reg);
        if (n > (size_t) cap) {
            return e3::fail(err, E3_ERR_ARG, "RPC server %s: it has %zu devices, more than %d", endpoint, n, (int) cap);
        }
        for (size_t i = 0; i < n; ++i) {
            out[i] = ggml_backend_reg_dev_get(reg, i);
        }
        return (int32_t) n;
    } catch (const std::exception & e) {
        return e3::fail(err, E3_ERR_EXCEPTION, "RPC server %s: %s", endpoint, e.what());
    }
#else
    (void) endpoint; (void) out; (void) cap;
    return not_built(err);
#endif
}

int e3_rpc_failed(const char * endpoint, e3_error * err) {
#ifdef E3_HAVE_RPC
    char why[512];
    if (!ggml_backend_rpc_get_error(endpoint, why, sizeof(why))) {
        return 0;
    }
    e3::fail(err, E3_ERR_DECODE, "RPC server %s: %s", endpoint, why);
    return 1;
#else
    (void) endpoint; (void) err;
    return 0;
#endif
}

int e3_rpc_serve(const char * endpoint, const char * cache_dir, int32_t n_threads, e3_error * err) {
#ifdef E3_HAVE_RPC
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) {
        return e3::fail(err, E3_ERR_ARG, "no CPU device to serve");
    }
    if (ggml_backend_rpc_serve(endpoint, cache_dir, (size_t) n_threads, 1, &cpu) != 0) {
        return e3::fail(err, E3_ERR_ARG, "the RPC server at %s could not start or stopped accepting clients "
                        "(is the address this machine's, and the port free?)", endpoint);
    }
    return E3_OK;
#else
    (void) endpoint; (void) cache_dir; (void) n_threads;
    return not_built(err);
#endif
}

void e3_rpc_stop(void) {
#ifdef E3_HAVE_RPC
    ggml_backend_rpc_stop_server();
#endif
}

int e3_model_layer_device(const llama_model * model, int32_t il, const char ** name, const char ** description) {
    if (il < -1 || il >= (int32_t) model->hparams.n_layer()) {
        return E3_ERR_ARG;
    }
    try {
        ggml_backend_dev_t dev = il == -1 ? model->dev_output() : model->dev_layer(il);
        *name = dev ? ggml_backend_dev_name(dev) : "CPU";
        *description = dev ? ggml_backend_dev_description(dev) : "";
        return E3_OK;
    } catch (const std::exception &) {
        return E3_ERR_ARG;
    }
}

int32_t e3_model_device_bytes(const llama_model * model, const char ** names, uint64_t * bytes, int32_t cap) {
    std::map<std::string, std::pair<const char *, uint64_t>> per_device;
    for (const auto & [buft, size] : model->memory_breakdown()) {
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        const char * name = dev ? ggml_backend_dev_name(dev) : "CPU";
        auto & entry = per_device[name];
        entry.first = name;
        entry.second += size;
    }
    int32_t n = 0;
    for (const auto & [key, entry] : per_device) {
        if (n < cap) {
            names[n] = entry.first;
            bytes[n] = entry.second;
        }
        ++n;
    }
    return n;
}

}  // extern "C"

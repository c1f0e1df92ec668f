// eagle3_chat.cpp: common/'s chat templates and JSON-schema grammars behind a C ABI.
#include "eagle3_shim.h"
#include "shim_util.hpp"

#include "chat.h"
#include "json-schema-to-grammar.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using e3::fail;

static char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out) {
        std::memcpy(out, s.c_str(), s.size() + 1);
    }
    return out;
}

extern "C" void e3_free_string(char * s) {
    std::free(s);
}

extern "C" char * e3_json_schema_to_grammar(const char * schema, e3_error * err) {
    if (!schema) {
        fail(err, E3_ERR_ARG, "no JSON schema");
        return nullptr;
    }
    try {
        return dup_string(json_schema_to_grammar(common_json::parse(schema)));
    } catch (const std::exception & e) {
        fail(err, E3_ERR_ARG, "the JSON schema cannot become a grammar: %s", e.what());
    } catch (...) {
        fail(err, E3_ERR_ARG, "the JSON schema cannot become a grammar");
    }
    return nullptr;
}

extern "C" char * e3_chat_apply(const struct llama_model * model, const char * template_override,
                                const char * const * roles, const char * const * contents, int32_t n_messages,
                                int add_generation_prompt, e3_error * err) {
    if (!model || n_messages < 0 || (n_messages > 0 && (!roles || !contents))) {
        fail(err, E3_ERR_ARG, "a chat needs a model and messages");
        return nullptr;
    }
    try {
        auto templates = common_chat_templates_init(model, template_override ? template_override : "");
        common_chat_templates_inputs inputs;
        for (int32_t i = 0; i < n_messages; ++i) {
            common_chat_msg msg;
            msg.role = roles[i];
            msg.content = contents[i];
            inputs.messages.push_back(std::move(msg));
        }
        inputs.add_generation_prompt = add_generation_prompt != 0;
        inputs.use_jinja = true;
        return dup_string(common_chat_templates_apply(templates.get(), inputs).prompt);
    } catch (const std::exception & e) {
        fail(err, E3_ERR_ARG, "the chat template failed: %s", e.what());
    } catch (...) {
        fail(err, E3_ERR_ARG, "the chat template failed");
    }
    return nullptr;
}

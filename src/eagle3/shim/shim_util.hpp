// Helpers shared by the shim's translation units (not part of the C ABI).
#pragma once

#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdio>

namespace e3 {

// Writes a message into err (when given) and returns code.
inline int fail(char * err, size_t n_err, int code, const char * fmt, ...) {
    if (err && n_err > 0) {
        va_list args;
        va_start(args, fmt);
        std::vsnprintf(err, n_err, fmt, args);
        va_end(args);
    }
    return code;
}

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace e3

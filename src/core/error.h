// Errors in three tiers (docs/errors.md):
//  1. Broken internal invariants: K3_ASSERT aborts with file and line (a bug in k3cpp).
//  2. Bad user input (config, checkpoint, options): throw k3::Error with one sentence that
//     names the file and the field or tensor; the CLI prints it and exits non-zero.
//  3. System calls (I/O, BLAS): k3::Error carrying the call, the path and strerror(errno).
#pragma once
#include <stdexcept>
#include <string>

namespace k3 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Bad user input: "<file>: <field>: <what is wrong>".
[[noreturn]] void fail_input(const std::string& file, const std::string& field,
                             const std::string& what);
// A failed system call: "<what> '<path>': <strerror(errno)>".
[[noreturn]] void fail_system(const std::string& what, const std::string& path);
// Generic user-facing failure with a ready-made message.
[[noreturn]] void fail(const std::string& msg);

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace k3

#define K3_ASSERT(cond, ...)                                                          \
  do {                                                                                \
    if (!(cond)) ::k3::assert_fail(#cond, __FILE__, __LINE__, std::string(__VA_ARGS__)); \
  } while (0)

#include "core/error.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace k3 {

void fail_input(const std::string& file, const std::string& field, const std::string& what) {
  // (appended piece by piece: GCC 12's -Wrestrict misfires on `": " + field` at -O3)
  std::string msg = file;
  if (!field.empty()) msg.append(": ").append(field);
  msg.append(": ").append(what);
  throw Error(msg);
}

void fail_system(const std::string& what, const std::string& path) {
  int e = errno;
  throw Error(what + " '" + path + "': " + std::strerror(e));
}

void fail(const std::string& msg) { throw Error(msg); }

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "k3cpp internal error: %s:%d: assertion '%s' failed%s%s\n", file, line,
               expr, msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace k3

// Atomic file replacement: the body is written to `<path>.tmp.<pid>`, flushed and fsync'ed,
// then renamed over `path` and the directory is fsync'ed. On any failure (the body throws,
// a write/flush/fsync/rename fails) the temporary file is removed and a k3::Error naming
// `path` is thrown; whatever was at `path` before is never touched, so a reader sees either
// the old file or the complete new one. Checkpoints and training state are written this way.
#pragma once
#include <cstdio>
#include <functional>
#include <string>

namespace k3 {

// Calls write_body with a FILE* opened for binary writing; write errors are detected from
// the stream state afterwards, so the body may use plain fwrite/fputs without checks.
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write_body);
void write_text_file_atomic(const std::string& path, const std::string& text);

// The temporary name write_file_atomic uses for `path` in this process.
std::string atomic_temp_path(const std::string& path);

// The whole file as bytes; `what` names it in the k3::Error ("cannot open <what> '<path>'").
std::string read_file_bytes(const std::string& path, const std::string& what);

// Creates `dir` and any missing parents (like mkdir -p); k3::Error naming the path on failure.
void make_directories(const std::string& dir);

}  // namespace k3

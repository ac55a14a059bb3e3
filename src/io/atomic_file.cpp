// See atomic_file.h. POSIX only: fsync, rename(2) (atomic within one file system) and an
// fsync of the containing directory so that the rename itself survives a crash.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace k3 {

std::string atomic_temp_path(const std::string& path) {
  return path + ".tmp." + std::to_string(long(::getpid()));
}

static std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// fsync of the directory entry after a rename; some file systems refuse fsync on a
// directory (EINVAL): the rename has happened, so that is not an error for the caller.
static void fsync_dir(const std::string& dir, const std::string& path) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_system("cannot open the directory of", path);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0 && e != EINVAL && e != EROFS) {
    errno = e;
    fail_system("cannot fsync the directory of", path);
  }
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write_body) {
  const std::string tmp = atomic_temp_path(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail_system("cannot create temporary file for", path);
  // Every failure after this point closes (if still open) and removes the temp file.
  auto abandon = [&](const std::string& why) {
    if (f) std::fclose(f);
    ::unlink(tmp.c_str());
    fail("cannot write '" + path + "': " + why);
  };
  try {
    write_body(f);
  } catch (const std::exception& e) {
    abandon(e.what());
  } catch (...) {
    abandon("unknown exception while writing");
  }
  if (std::ferror(f)) abandon(std::string("write error: ") + std::strerror(errno));
  if (std::fflush(f) != 0) abandon(std::string("fflush: ") + std::strerror(errno));
  if (::fsync(::fileno(f)) != 0) abandon(std::string("fsync: ") + std::strerror(errno));
  int rc = std::fclose(f);
  f = nullptr;
  if (rc != 0) abandon(std::string("fclose: ") + std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    abandon(std::string("rename from '") + tmp + "': " + std::strerror(errno));
  fsync_dir(parent_dir(path), path);
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
}

std::string read_file_bytes(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_system("cannot open " + what, path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail_system("cannot read " + what, path);
  return ss.str();
}

void make_directories(const std::string& dir) {
  if (dir.empty()) return;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) fail_input(dir, "", "exists and is not a directory");
    return;
  }
  std::string parent = parent_dir(dir);
  if (parent != dir && parent != "." && parent != "/") make_directories(parent);
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) fail_system("cannot create directory", dir);
}

}  // namespace k3

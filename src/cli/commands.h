// Subcommand table and a small argument parser shared by all subcommands.
#pragma once
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace k3::cli {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

const Command* find_command(const std::string& name);
// The first line of a computing command's log (stderr), once its inputs are validated:
// "k3cpp <command>: CPU ...; kernels AVX2 (supported: ...)" (core/simd_target.h).
void announce_machine(const char* command);
void print_usage(FILE* out);

// "1,0.5,2" -> {1, 0.5, 2}: the comma-separated numbers of option `option` (named, with the
// entry, in the k3::Error thrown for an empty or non-numeric entry).
std::vector<double> parse_number_list(const std::string& option, const std::string& s);

// The vocabulary files a model directory may hold (tiktoken.model, tokenizer_config.json,
// tokenizer.json), and a copy of those present in `from_dir` into `to_dir` (k3::Error naming
// the file that cannot be copied). convert and average carry them into the models they write.
const std::vector<std::string>& vocabulary_file_names();
void copy_vocabulary_files(const std::string& from_dir, const std::string& to_dir);

// Parses "--key value", "--key=value" and "--flag" options plus positionals. Unknown
// options or missing values throw k3::Error naming the option.
class Args {
 public:
  // `flags`: options without a value; `options`: options taking a value.
  Args(const std::vector<std::string>& argv, const std::vector<std::string>& options,
       const std::vector<std::string>& flags, const char* command);
  const std::vector<std::string>& positional() const { return positional_; }
  std::string positional_at(size_t i, const char* what) const;  // throws if missing
  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& def) const;
  long long get_int(const std::string& name, long long def) const;
  double get_double(const std::string& name, double def) const;

 private:
  std::string command_;
  std::vector<std::string> positional_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> flags_;
};

}  // namespace k3::cli

#include "cli/commands.h"

#include "core/simd_target.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "kernels/blas_core.h"

namespace k3::cli {

// Each subcommand lives in its own cmd_<name>.cpp.
int cmd_plan(const std::vector<std::string>& args);
int cmd_inspect(const std::vector<std::string>& args);
int cmd_init(const std::vector<std::string>& args);
int cmd_convert(const std::vector<std::string>& args);
int cmd_average(const std::vector<std::string>& args);
int cmd_forward(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_chat(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_train(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_detokenize(const std::vector<std::string>& args);
int cmd_tokenizer(const std::vector<std::string>& args);
int cmd_sft(const std::vector<std::string>& args);
int cmd_rl(const std::vector<std::string>& args);
int cmd_arith_corpus(const std::vector<std::string>& args);
int cmd_distill(const std::vector<std::string>& args);

static const Command kCommands[] = {
    {"plan", "parameter counts, memory, FLOPs and placement for a config", cmd_plan},
    {"inspect", "list a checkpoint's tensors; check them against a config", cmd_inspect},
    {"init", "write a randomly initialised checkpoint for a config", cmd_init},
    {"convert", "rewrite a model directory with MXFP4 / plain experts and bf16 / f32 dense tensors", cmd_convert},
    {"average", "the weighted mean of checkpoints of one model (snapshots of a run)", cmd_average},
    {"forward", "float32 logits of every position for given token ids", cmd_forward},
    {"generate", "generate tokens from a prompt (greedy or sampled), streaming", cmd_generate},
    {"chat", "chat in K3's XTML format (reasoning, tools), the session kept between turns", cmd_chat},
    {"serve", "OpenAI-compatible HTTP server (continuous batching, streaming, tools, a chat page)", cmd_serve},
    {"train", "train a model from a run file (stages, checkpoints, resume)", cmd_train},
    {"sft", "supervised fine-tuning on XTML conversations (loss on assistant tokens only)", cmd_sft},
    {"rl", "RL with verifiable rewards (group sampling, DAPO / mirror descent, effort budgets)", cmd_rl},
    {"distill", "on-policy distillation of specialised policies into one student (reverse KL)", cmd_distill},
    {"arith-corpus", "write the arithmetic pretraining corpus (worked traces) of the post-training demo", cmd_arith_corpus},
    {"eval", "held-out loss, bits/byte and MoE routing balance of a model", cmd_eval},
    {"tokenize", "encode text with a tiktoken vocabulary (K3's tokenizer), print the ids", cmd_tokenize},
    {"detokenize", "decode token ids with a tiktoken vocabulary", cmd_detokenize},
    {"tokenizer", "tokenizer train: learn a BPE vocabulary in tiktoken's format", cmd_tokenizer},
};

const Command* find_command(const std::string& name) {
  for (const auto& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

void announce_machine(const char* command) {
  blas_choose_core();  // before any product, so that the line names the set the run uses
  std::fprintf(stderr, "k3cpp %s: %s; OpenBLAS %s\n", command, machine_summary().c_str(), blas_core_name().c_str());
}

std::vector<double> parse_number_list(const std::string& option, const std::string& s) {
  std::vector<double> out;
  size_t p = 0;
  while (p <= s.size()) {
    const size_t q = std::min(s.find(',', p), s.size());
    const std::string t = s.substr(p, q - p);
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0')
      fail(option + ": entry " + std::to_string(out.size() + 1) + " '" + t + "' is not a number (in '" + s + "')");
    out.push_back(v);
    p = q + 1;
  }
  return out;
}

const std::vector<std::string>& vocabulary_file_names() {
  static const std::vector<std::string> names = {"tiktoken.model", "tokenizer_config.json", "tokenizer.json"};
  return names;
}

void copy_vocabulary_files(const std::string& from_dir, const std::string& to_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& f : vocabulary_file_names()) {
    const fs::path src = fs::path(from_dir) / f;
    if (fs::exists(src, ec) && !fs::copy_file(src, fs::path(to_dir) / f, fs::copy_options::overwrite_existing, ec))
      fail_input(src.string(), "", "cannot be copied into the new directory: " + ec.message());
  }
}

void print_usage(FILE* out) {
  std::fprintf(out, "usage: k3cpp <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\nglobal options: --version (version, CPU, SIMD target), --simd-target NAME (force a lower\n"
                   "SIMD target: avx3, avx2, sse4, baseline; or set K3_SIMD_TARGET)\n");
  std::fprintf(out, "\nrun 'k3cpp <command> --help' for a command's options\n");
}

Args::Args(const std::vector<std::string>& argv, const std::vector<std::string>& options,
           const std::vector<std::string>& flags, const char* command)
    : command_(command) {
  auto is_in = [](const std::vector<std::string>& v, const std::string& s) {
    for (auto& x : v) if (x == s) return true;
    return false;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() > 2 && a.rfind("--", 0) == 0) {
      std::string key = a.substr(2), val;
      bool has_val = false;
      if (auto eq = key.find('='); eq != std::string::npos) {
        val = key.substr(eq + 1);
        key = key.substr(0, eq);
        has_val = true;
      }
      if (is_in(flags, key)) {
        if (has_val) fail("option --" + key + " takes no value");
        flags_[key] = true;
      } else if (is_in(options, key)) {
        if (!has_val) {
          if (i + 1 >= argv.size()) fail("option --" + key + " needs a value");
          val = argv[++i];
        }
        values_[key] = val;
      } else {
        fail("unknown option --" + key);
      }
    } else {
      positional_.push_back(a);
    }
  }
}

std::string Args::positional_at(size_t i, const char* what) const {
  if (i >= positional_.size()) fail(std::string("missing argument <") + what + ">");
  return positional_[i];
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& name, const std::string& def) const {
  auto v = get(name);
  return v ? *v : def;
}

long long Args::get_int(const std::string& name, long long def) const {
  auto v = get(name);
  if (!v) return def;
  char* end = nullptr;
  long long r = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end) fail("--" + name + ": expected an integer, got '" + *v + "'");
  return r;
}

double Args::get_double(const std::string& name, double def) const {
  auto v = get(name);
  if (!v) return def;
  char* end = nullptr;
  double r = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end) fail("--" + name + ": expected a number, got '" + *v + "'");
  return r;
}

}  // namespace k3::cli

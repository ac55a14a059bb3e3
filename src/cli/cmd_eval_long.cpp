// `k3cpp eval <model dir> --task passkey|mqar|vartrack|mixed|loss-by-position ...`: long-context
// evaluation (train/long_tasks.h, train/long_eval.h). Generated tasks are scored exactly over
// a depth x length grid; loss-by-position runs held-out text longer than the training length.
// Every length also reports the decode state's bytes against the formula, the process's
// resident memory growth, and prefill tokens/s. JSON for tools/plot_long_context.py.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "infer/mem_probe.h"
#include "io/vocabulary.h"
#include "model/checkpoint.h"
#include "train/data.h"
#include "train/long_eval.h"
#include "train/long_tasks.h"

namespace k3::cli {
namespace {

using json = nlohmann::json;

const char* kEvalLongUsage =
    "usage: k3cpp eval <model dir> --task passkey|mqar|vartrack|mixed|loss-by-position\n"
    "                  [--lengths 1K,2K,...] [--depths 0,0.25,0.5,0.75,1] [--samples N] [--pairs N]\n"
    "                  [--queries N] [--hops N] [--chunk N] [--bucket N] [--data SPEC] [--seed N] [--threads N]\n"
    "                  [--attn-logn N] [--device cpu|cuda[:N]] [--json out.json]\n"
    "  --lengths   sample lengths in tokens (K = 1024), default 1K,2K,4K\n"
    "  --device    cpu (default) or cuda[:N]: the backend the model runs on (also K3_DEVICE)\n"
    "  --depths    passkey: where the key sits; vartrack: where the chain starts (default 0,0.25,0.5,0.75,1)\n"
    "  --samples   samples per grid cell (default 5)\n"
    "  --pairs     mqar, mixed: key-value pairs (default 16); vartrack: chain hops (default 4)\n"
    "  --queries   mqar, mixed: pairs asked (default 8)\n"
    "  --hops      mixed: hops of its variable chain (default 2); mixed scores every query\n"
    "              (pass key, pairs, chain) and shuffles the evidence over the window (no depths)\n"
    "  --chunk     prefill chunk (default 512): memory is the decode state plus one chunk\n"
    "  --bucket    loss-by-position: positions per bucket (default 256)\n"
    "  --data      loss-by-position: corpus of held-out text ('bible' or a path; default bible)\n"
    "  --attn-logn MLA queries past N tokens scaled by ln(p + 1) / ln(N) (log-length attention\n"
    "              scaling; N usually the training length). Not part of K3; default 0: off\n";

std::vector<int64_t> parse_lengths(const std::string& s) {
  std::vector<int64_t> out;
  size_t p = 0;
  while (p <= s.size()) {
    const size_t q = std::min(s.find(',', p), s.size());
    std::string t = s.substr(p, q - p);
    int64_t mul = 1;
    if (!t.empty() && (t.back() == 'K' || t.back() == 'k')) mul = 1024, t.pop_back();
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || v <= 0) fail("--lengths: expected positive integers (K = 1024), got '" + s + "'");
    out.push_back(v * mul);
    p = q + 1;
  }
  return out;
}

std::vector<double> parse_depths(const std::string& s) {
  const std::vector<double> out = parse_number_list("--depths", s);
  for (double v : out)
    if (!(v >= 0 && v <= 1)) fail("--depths: expected numbers in [0, 1], got '" + s + "'");
  return out;
}

struct LengthFigures {
  int64_t state_bytes = 0, formula_bytes = 0;
  double rss_growth = 0, prefill_tok_s = 0;
};

json figures_json(const std::vector<int64_t>& lengths, const std::vector<LengthFigures>& f) {
  json a = json::array();
  for (size_t i = 0; i < lengths.size(); ++i)
    a.push_back({{"length", lengths[i]},
                 {"state_bytes", f[i].state_bytes},
                 {"state_formula_bytes", f[i].formula_bytes},
                 {"peak_rss_growth_bytes", f[i].rss_growth},
                 {"prefill_tok_s", f[i].prefill_tok_s}});
  return a;
}

}  // namespace

int cmd_eval_long(const std::vector<std::string>& args) {
  Args a(args,
         {"task", "lengths", "depths", "samples", "pairs", "queries", "hops", "chunk", "bucket", "data", "seed", "threads",
          "json", "attn-logn", "device"},
         {"help"}, "eval");
  if (a.flag("help")) {
    std::fputs(kEvalLongUsage, stdout);
    return 0;
  }
  if (a.positional().size() != 1) fail("expected one <model dir>, got " + std::to_string(a.positional().size()));
  const std::string dir = a.positional_at(0, "model dir");
  const std::string task_name = a.get_or("task", "");
  const bool by_position = task_name == "loss-by-position";
  const LongTask task = by_position ? LongTask::passkey : parse_long_task(task_name);
  const std::vector<int64_t> lengths = parse_lengths(a.get_or("lengths", "1K,2K,4K"));
  const bool no_depth = task == LongTask::mqar || task == LongTask::mixed || by_position;
  const std::vector<double> depths = no_depth ? std::vector<double>{0.0}
                                                                           : parse_depths(a.get_or("depths", "0,0.25,0.5,0.75,1"));
  const int64_t samples = a.get_int("samples", 5), chunk = a.get_int("chunk", 512), bucket = a.get_int("bucket", 256);
  const int64_t pairs = a.get_int("pairs", task == LongTask::vartrack ? 4 : 16), queries = a.get_int("queries", 8);
  const int64_t hops = a.get_int("hops", 2);
  if (samples < 1 || chunk < 1 || bucket < 1 || pairs < 1 || queries < 1 || hops < 1)
    fail("--samples, --chunk, --bucket, --pairs, --queries and --hops must be positive");
  set_num_threads(int(a.get_int("threads", 0)));

  const ModelDir md = open_model_dir(dir);
  // The model's own vocabulary: the K3 tokenizer when the directory has one, else bytes.
  const Vocabulary voc = Vocabulary::load_dir(dir);
  const TextEncoder enc = [&](const std::string& s) { return voc.encode(s); };
  const std::string vocab = voc.describe();
  LoadOptions lo;
  lo.dense_as_stored = true;
  lo.backend = backend_from(a, "eval");
  K3Model model = load_model(md, lo);
  const int64_t logn = a.get_int("attn-logn", 0);
  if (logn < 0 || logn == 1) fail("--attn-logn: expected 0 (off) or a length of at least 2, got " + std::to_string(logn));
  model.set_mla_logn_base(logn);
  announce_machine("eval");
  std::fprintf(stderr, "eval: task %s, vocabulary %s, chunk %lld\n", task_name.c_str(), vocab.c_str(),
               (long long)chunk);

  json out = {{"model", dir}, {"task", task_name}, {"vocabulary", vocab}, {"chunk", chunk}, {"lengths", lengths}};
  if (logn > 0) out["attn_logn"] = logn;
  std::vector<LengthFigures> figs(lengths.size());
  const double rss0 = double(read_proc_mem().vm_rss);
  if (by_position) {
    // Held-out documents (the training split's rule: every 40th, offset 20), concatenated.
    const Corpus c = load_corpus(a.get_or("data", "bible"));
    const int64_t want = *std::max_element(lengths.begin(), lengths.end()) + 1;
    std::vector<int32_t> ids;
    for (size_t d = 0; d < c.documents.size() && int64_t(ids.size()) < want; ++d)
      if (d % 40 == 20) {
        const std::vector<int32_t> t = enc(c.documents[d]);
        ids.insert(ids.end(), t.begin(), t.end());
      }
    if (int64_t(ids.size()) < want)
      fail("--data: the held-out text has " + std::to_string(ids.size()) + " tokens, fewer than the longest length + 1");
    json curves = json::array();
    for (size_t li = 0; li < lengths.size(); ++li) {
      reset_peak_rss();
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<int32_t> part(ids.begin(), ids.begin() + lengths[li] + 1);
      const std::vector<double> loss = loss_by_position(model, part, bucket, chunk);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      figs[li].prefill_tok_s = double(lengths[li]) / s;
      figs[li].formula_bytes = decode_state_formula_bytes(model.dims(), lengths[li]);
      figs[li].state_bytes = figs[li].formula_bytes;  // loss_by_position's state is internal: the formula
      figs[li].rss_growth = double(read_proc_mem().vm_hwm) - rss0;
      curves.push_back({{"length", lengths[li]}, {"bucket", bucket}, {"loss_nats", loss}});
      std::printf("length %7lld: mean loss %.4f nats, last bucket %.4f, %.0f tok/s\n", (long long)lengths[li],
                  [&] {
                    double m = 0;
                    for (double v : loss) m += v;
                    return m / double(loss.size());
                  }(),
                  loss.back(), figs[li].prefill_tok_s);
    }
    out["curves"] = curves;
  } else {
    json grid = json::array();
    std::printf("%s accuracy (%lld samples per cell), rows: depth, columns: length\n", task_name.c_str(),
                (long long)samples);
    std::printf("%8s", "depth");
    for (int64_t L : lengths) std::printf(" %8lld", (long long)L);
    std::printf("\n");
    std::vector<std::vector<double>> acc(depths.size(), std::vector<double>(lengths.size()));
    for (size_t li = 0; li < lengths.size(); ++li) {
      reset_peak_rss();
      double pre_s = 0;
      int64_t pre_tok = 0;
      for (size_t di = 0; di < depths.size(); ++di) {
        int64_t right = 0, total = 0;
        for (int64_t k = 0; k < samples; ++k) {
          LongTaskOptions o;
          o.task = task;
          o.length = lengths[li];
          o.depth = depths[di];
          o.pairs = pairs;
          o.queries = std::min(queries, pairs);
          o.hops = hops;
          o.seed = uint64_t(a.get_int("seed", 0)) * 1000003u + uint64_t(k) * 7919u + li * 131u + di;
          const LongSample s = make_long_sample(enc, o);
          const LongScore r = score_long_sample(model, s, chunk);
          right += r.correct;
          total += r.queries;
          pre_s += r.prefill_seconds;
          pre_tok += r.prefill_tokens;
          if (r.state_bytes > figs[li].state_bytes) {
            figs[li].state_bytes = r.state_bytes;
            figs[li].formula_bytes = decode_state_formula_bytes(model.dims(), r.state_tokens);
          }
        }
        acc[di][li] = double(right) / double(total);
      }
      figs[li].prefill_tok_s = double(pre_tok) / pre_s;
      figs[li].rss_growth = double(read_proc_mem().vm_hwm) - rss0;
      std::fprintf(stderr, "eval: length %lld done\n", (long long)lengths[li]);
    }
    for (size_t di = 0; di < depths.size(); ++di) {
      std::printf("%8.2f", depths[di]);
      for (size_t li = 0; li < lengths.size(); ++li) std::printf(" %8.3f", acc[di][li]);
      std::printf("\n");
      grid.push_back(acc[di]);
    }
    out["depths"] = depths;
    out["accuracy"] = grid;
    out["samples"] = samples;
  }
  std::printf("%8s %14s %14s %16s %12s\n", "length", "state bytes", "formula", "peak RSS growth", "prefill tok/s");
  for (size_t li = 0; li < lengths.size(); ++li)
    std::printf("%8lld %14lld %14lld %16.0f %12.1f\n", (long long)lengths[li], (long long)figs[li].state_bytes,
                (long long)figs[li].formula_bytes, figs[li].rss_growth, figs[li].prefill_tok_s);
  out["memory"] = figures_json(lengths, figs);
  if (const auto j = a.get("json")) write_text_file_atomic(*j, out.dump(2) + "\n");
  return 0;
}

}  // namespace k3::cli

// `k3cpp generate <model dir> (--ids 1,2,3 | --prompt TEXT) [--max-tokens N] [--temperature T]
//                  [--top-k K] [--top-p P] [--seed S] [--stop ID,...] [--speculate K] [--ids-out]
//                  [--threads N]`
// Prefills the prompt (infer/session.h), then samples (infer/sampler.h) and decodes one token
// at a time, streaming to stdout as tokens are produced: text through io/stream_decoder.h (a
// character split across tokens is printed once complete, never as partial UTF-8), or ids
// (space-separated) with --ids-out. The model directory's vocabulary (io/vocabulary.h) encodes
// --prompt and decodes: tiktoken.model (+ tokenizer_config.json) when present, else the k3cpp
// byte tokenizer (tokenizer.json); a line on stderr says which. Generation ends at a stop token
// (not printed; default: the vocabulary's EOS, [EOS] or <|eos|>) or after --max-tokens. Prefill
// and decode speeds go to stderr. --speculate K (greedy only): n-gram drafts of up to K tokens
// verified by the model (infer/speculative.h), the same tokens in fewer passes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "infer/sampler.h"
#include "infer/session.h"
#include "infer/speculative.h"
#include "infer/image_prompt.h"
#include "io/image.h"
#include "model/vision_encoder.h"
#include "cli/ram_budget.h"
#include "io/stream_decoder.h"
#include "io/vocabulary.h"
#include "dist/comm.h"
#include "dist/expert_parallel.h"
#include "dist/runtime.h"
#include "kernels/moe_exchange.h"
#include "model/checkpoint.h"

namespace k3::cli {

// Defined in cmd_forward.cpp.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);
void check_ids_in_vocab(const std::vector<int32_t>& ids, const ModelDir& md, const std::string& what);

namespace {

const char* kGenerateUsage =
    "usage: k3cpp generate <model dir> (--ids 1,2,3 | --prompt TEXT) [--max-tokens N]\n"
    "                      [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop ID,...]\n"
    "                      [--speculate K [--ngram N] [--lookup-ids 1,2,3]] [--ids-out] [--threads N]\n"
    "                      [--ram-budget GB ...]\n"
    "                      [--ep R]\n"
    "  --ids          prompt as comma-separated token ids\n"
    "  --prompt       prompt as text (the model dir's tiktoken.model, else its byte tokenizer.json)\n"
    "  --image FILE   a PNG or PGM/PPM image, encoded by the model's vision encoder; its tokens replace the\n"
    "                 prompt's <|media_pad|> id (with --ids), else they come before the prompt\n"
    "  --max-tokens   tokens to generate (default 64)\n"
    "  --temperature  0 (default) is greedy; > 0 samples\n"
    "  --top-k        keep the K most likely tokens (0: all)\n"
    "  --top-p        keep the smallest set with probability >= P (1: all)\n"
    "  --seed         sampling seed (default 0)\n"
    "  --stop         stop token ids (default: the tokenizer's EOS, if any)\n"
    "  --speculate    greedy only: draft up to K tokens from the text so far (n-gram lookup) and\n"
    "                 verify them in one pass; the output is greedy's (default 0: off)\n"
    "  --ngram        longest suffix the draft looks up (default 3)\n"
    "  --lookup-ids   token ids the draft also looks the suffix up in, after the text so far (a\n"
    "                 reference document; with --speculate)\n"
    "  --ids-out      print token ids instead of text\n"
    "  --ep R         expert parallel, under mpirun -np R: each rank computes 1/R of every layer's\n"
    "                 routed experts (the trunk on every rank); logits equal one process's\n";

std::string generate_usage() { return std::string(kGenerateUsage) + kRamBudgetUsage; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Text may hold NUL bytes: written by length.
void print(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  Args a(args,
         with_ram_budget_options({"ids", "prompt", "image", "max-tokens", "temperature", "top-k", "top-p", "seed", "stop",
                                  "threads", "speculate", "ngram", "lookup-ids", "ep"}),
         {"ids-out", "help"}, "generate");
  if (a.flag("help")) {
    std::fputs(generate_usage().c_str(), stdout);
    return 0;
  }
  if (a.positional().size() != 1) fail("expected one <model dir>, got " + std::to_string(a.positional().size()));
  const std::string dir = a.positional_at(0, "model dir");
  const auto ids_arg = a.get("ids"), prompt = a.get("prompt");
  if (bool(ids_arg) == bool(prompt)) fail("give exactly one of --ids and --prompt");
  const long long max_tokens = a.get_int("max-tokens", 64);
  if (max_tokens < 0) fail("--max-tokens: expected a non-negative integer, got " + std::to_string(max_tokens));
  SamplerOptions so;
  so.temperature = a.get_double("temperature", 0.0);
  so.top_k = a.get_int("top-k", 0);
  so.top_p = a.get_double("top-p", 1.0);
  const long long seed = a.get_int("seed", 0);
  if (seed < 0) fail("--seed: expected a non-negative integer, got " + std::to_string(seed));
  so.seed = uint64_t(seed);
  Sampler sampler(so);  // validates the sampling options
  SpeculativeOptions spec;
  spec.draft_tokens = a.get_int("speculate", 0);
  spec.ngram_max = a.get_int("ngram", 3);
  if (spec.draft_tokens < 0) fail("--speculate: expected a non-negative number of draft tokens");
  if (spec.ngram_max < 1) fail("--ngram: expected a positive suffix length");
  if (auto l = a.get("lookup-ids")) {
    if (spec.draft_tokens == 0) fail("--lookup-ids: drafts are only made with --speculate K");
    spec.lookup = parse_ids(*l, "--lookup-ids");
  }
  if (spec.draft_tokens > 0 && so.temperature != 0.0)
    fail("--speculate: verifies greedy drafts only; it needs --temperature 0 (got " + std::to_string(so.temperature) + ")");
  const bool ids_out = a.flag("ids-out");
  set_num_threads(int(a.get_int("threads", 0)));
  // Expert parallelism (src/dist/expert_parallel.h): under mpirun with --ep R, every rank runs
  // the trunk and 1/R of each layer's experts; rank 0 alone prints.
  const long long ep = a.get_int("ep", 0);
  if (a.get("ep") && ep < 1) fail("--ep: expected a positive integer, got " + std::to_string(ep));
  std::unique_ptr<dist::Runtime> rt;
  std::unique_ptr<dist::Comm> comm;
  std::unique_ptr<dist::CommExpertExchange> exchange;
  if (ep > 0 || dist::launched_by_mpirun()) {
    rt = std::make_unique<dist::Runtime>();
    if (ep == 0 && rt->size() > 1)
      fail("started by mpirun with " + std::to_string(rt->size()) + " ranks but without --ep: pass --ep " +
           std::to_string(rt->size()));
    if (ep > 0 && rt->size() != ep)
      fail("--ep " + std::to_string(ep) + " but the job has " + std::to_string(rt->size()) +
           " MPI rank(s): start it with mpirun -np " + std::to_string(ep));
    if (rt->size() > 1 && a.get("ram-budget")) fail("--ep and --ram-budget cannot be combined");
    if (rt->rank() != 0 && !std::freopen("/dev/null", "w", stdout)) fail_system("cannot reopen stdout", "/dev/null");
  }

  // Config, tokenizer and prompt are checked before any weight is read.
  const ModelDir md = open_model_dir(dir);
  std::optional<Vocabulary> tok;
  if (prompt || !ids_out) {
    if (!Vocabulary::dir_has_tiktoken(dir) && !Vocabulary::dir_has_byte_tokenizer(dir))
      fail_input(dir, "tiktoken.model",
                 "missing, and no tokenizer.json either: text needs the model's vocabulary (use --ids, and --ids-out "
                 "for output)");
    tok = Vocabulary::load_dir(dir);
    if (tok->vocab_size() > md.config.vocab_size)
      fail_input(md.config_path, "vocab_size",
                 std::to_string(md.config.vocab_size) + " is smaller than the " + tok->describe() + "'s " +
                     std::to_string(tok->vocab_size()) + " ids");
    std::fprintf(stderr, "generate: tokenizer: %s\n", tok->describe().c_str());
  }
  std::vector<int32_t> ids = ids_arg ? parse_ids(*ids_arg, "--ids") : tok->encode(*prompt);
  if (ids.empty()) fail("--prompt: the prompt is empty");
  // --image: the encoder runs before the text model is loaded, so a bad image or a model
  // without vision fails early; its tokens take the placeholder's place (expanded).
  std::optional<VisionModel> vis;
  std::vector<float> image_rows;
  int64_t image_tokens = 0;
  if (auto img_path = a.get("image")) {
    vis = load_vision_model(dir, md.config, md.config_path);
    const Image img = load_image(*img_path);
    const ImageGrid grid = image_grid(vis->dims, img.height, img.width);
    const auto tv = std::chrono::steady_clock::now();
    image_rows = encode_image(*vis, img);  // infer/image_prompt.h: the path chat and serve share
    image_tokens = int64_t(image_rows.size()) / vis->dims.text_width;
    std::fprintf(stderr, "generate: image %s: %lldx%lld pixels -> %lldx%lld patches -> %lld tokens (encoder %.3f s)\n",
                 img_path->c_str(), (long long)img.height, (long long)img.width, (long long)grid.h, (long long)grid.w,
                 (long long)image_tokens, seconds_since(tv));
    std::vector<int32_t> expanded;
    int placeholders = 0;
    for (int32_t t : ids) placeholders += t == vis->media_id;
    if (placeholders > 1) fail("--ids: " + std::to_string(placeholders) + " media placeholders for one --image");
    if (placeholders == 0) expanded.assign(size_t(image_tokens), vis->media_id);
    for (int32_t t : ids)
      if (t == vis->media_id) expanded.insert(expanded.end(), size_t(image_tokens), t);
      else expanded.push_back(t);
    ids = std::move(expanded);
  }
  check_ids_in_vocab(ids, md, ids_arg ? "--ids" : "--prompt");
  check_ids_in_vocab(spec.lookup, md, "--lookup-ids");
  std::vector<int32_t> stop;
  if (auto s = a.get("stop")) {
    stop = parse_ids(*s, "--stop");
  } else if (tok) {
    stop = {tok->eos()};
  }

  LoadOptions lo;
  lo.dense_as_stored = true;  // bf16 dense weights read as stored
  if (rt && rt->size() > 1) {
    if (md.config.num_experts % rt->size() != 0)
      fail_input(md.config_path, "num_experts",
                 std::to_string(md.config.num_experts) + " experts cannot be split over " +
                     std::to_string(rt->size()) + " expert-parallel ranks (--ep must divide it)");
    // Only this rank's experts are converted and kept in memory (dist/expert_parallel.h).
    const int64_t per = md.config.num_experts / rt->size(), me = rt->rank();
    lo.keep_expert = [per, me](int64_t e) { return e / per == me; };
    const int ranks = rt->size();
    lo.log = [me, ranks](const std::string& line) {  // the load's other notices: rank 0 alone
      if (line.rfind("released ", 0) == 0)
        std::fprintf(stderr, "generate: rank %d of %d: %s\n", int(me), ranks, line.c_str());
      else if (me == 0)
        std::fprintf(stderr, "%s\n", line.c_str());
    };
  }
  BudgetedModel bm = load_budgeted(a, md, lo, "generate", int64_t(ids.size()),
                                   speculative_working_bytes(md.config, spec.draft_tokens));
  const K3Model& model = bm.im->model;
  if (rt && rt->size() > 1) {
    comm = dist::make_comm("mpi", 600);
    exchange = std::make_unique<dist::CommExpertExchange>(*comm);
    set_expert_exchange(exchange.get());
  }
  announce_machine("generate");
  SessionOptions sess_opt;
  sess_opt.reserve_tokens = int64_t(ids.size()) + max_tokens;
  Session session(model, sess_opt);
  const int64_t V = model.dims().V;

  auto t0 = std::chrono::steady_clock::now();
  const EmbedSpliceT<float> splice{vis ? vis->media_id : -1, image_rows.data(), image_tokens, nullptr};
  const float* logits = session.prefill(ids.data(), int64_t(ids.size()), vis ? &splice : nullptr);
  const double prefill_s = seconds_since(t0);
  report_phase(bm, "generate", "prefill", int64_t(ids.size()), prefill_s);
  t0 = std::chrono::steady_clock::now();
  int64_t produced = 0;
  const char* reason = "max tokens";
  std::optional<StreamDecoder> text;
  if (!ids_out) text.emplace(tok->decoder());
  int32_t last = -1;
  auto emit = [&](int32_t next) {
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) {
      reason = "stop token";
      return false;
    }
    if (ids_out) std::printf(produced ? " %d" : "%d", next);
    else print(text->push(next));
    std::fflush(stdout);
    ++produced, last = next;
    return true;
  };
  SpeculativeStats sst;
  if (spec.draft_tokens > 0) {
    sst = generate_greedy_speculative(session, ids, logits, max_tokens, spec, emit);
  } else {
    while (produced < max_tokens) {
      if (!emit(sampler.sample(logits, V)) || produced == max_tokens) break;
      logits = session.step(last);
    }
  }
  const double decode_s = seconds_since(t0);
  if (text) print(text->flush());  // an incomplete last character: U+FFFD
  // Decode tokens: the first came from the prefill, the rest from the decode passes (per token
  // figures: speculative decoding's passes read once for several tokens).
  report_phase(bm, "generate", "decode", std::max<int64_t>(produced - 1, 0), decode_s);
  if (ids_out || produced) std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "generate: prefill %zu tokens in %.3f s (%.1f tok/s); decode %lld tokens in %.3f s (%.1f tok/s); stopped: %s\n",
               ids.size(), prefill_s, double(ids.size()) / std::max(prefill_s, 1e-9), (long long)produced, decode_s,
               double(produced) / std::max(decode_s, 1e-9), reason);
  if (spec.draft_tokens > 0)
    std::fprintf(stderr,
                 "generate: speculative: %lld passes for %lld tokens (%.2f tokens per pass), %lld drafts, %lld of %lld "
                 "drafted tokens accepted (%.1f %%), %lld rejected tails cut back (%lld of them by re-appending the kept "
                 "tokens)\n",
                 (long long)sst.passes, (long long)produced, double(std::max<int64_t>(produced - 1, 0)) / std::max<int64_t>(sst.passes, 1),
                 (long long)sst.verifies, (long long)sst.accepted, (long long)sst.drafted, 100.0 * sst.acceptance(),
                 (long long)sst.cuts, (long long)sst.reappends);
  report_budgeted(bm, "generate");
  set_expert_exchange(nullptr);
  return 0;
}

}  // namespace k3::cli

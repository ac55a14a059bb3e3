// Token-level JSON constraints (infer/json_constraint.h, infer/chat_json_constraint.h):
//  - the trie walk (and its plain-string fast path) allows exactly the tokens whose bytes the
//    automaton takes, checked token by token at states along sampled outputs;
//  - sampling from random logits (a vocabulary of all single bytes, thousands of random
//    multi-byte merges incl. UTF-8 fragments, and byte-less special ids) always ends with a
//    terminal after a value that nlohmann parses: an object for json_object, and one that
//    validates for schemas; terminals only once the value is complete;
//  - the K3 chat wrapper forces the close after the reasoning cap, the transition and suffix;
//  - end to end: the tiny random model (tests/data/k3-release-tiny) sampled at temperature 1
//    through Session + Sampler under the chat constraint gives a reply whose content parses
//    and validates (chat_parse as the server would read it);
//  - mask() time on the o200k_base vocabulary (npm tiktoken in tools/oracle, as the tokenizer
//    oracle test uses; a missing install fails the test).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/fixture.h"
#include "common/json_schema_check.h"
#include "core/error.h"
#include "infer/chat_json_constraint.h"
#include "infer/json_constraint.h"
#include "infer/json_schema.h"
#include "infer/sampler.h"
#include "infer/session.h"
#include "io/chat_parse.h"
#include "io/tiktoken_file.h"
#include "model/checkpoint.h"

using namespace k3;
using nlohmann::json;

namespace {

// 256 single bytes, then `merges` random multi-byte tokens (some duplicated), then `specials`
// byte-less ids.
std::vector<std::string> random_vocab(uint32_t seed, int merges, int specials) {
  static const std::vector<std::string> pieces = {
      "{", "}", "[", "]", "\"", ":", ",", " ", "  ", "\n", "\t", "a", "b", "key", "x", "0", "1", "9", "-", ".", "e",
      "E", "+", "\\", "\\n", "\\u", "00", "e9", "D8", "DC", "true", "false", "null", "\xC3\xA9", "\xE2\x82\xAC",
      "\xE2\x82", "\xAC", "\xF0\x9F", "\x98\x80", "\xC3", "\x01", "\x7F", "\xFF", "ok", "name"};
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
  std::mt19937 r(seed);
  for (int i = 0; i < merges; ++i) {
    if (i % 50 == 49) {  // a duplicate of an earlier merge: several ids with the same bytes
      v.push_back(v[256 + r() % size_t(i)]);
      continue;
    }
    std::string s;
    for (int n = 2 + int(r() % 4); n-- > 0;) s += pieces[r() % pieces.size()];
    v.push_back(s);
  }
  for (int i = 0; i < specials; ++i) v.push_back("");
  return v;
}

struct Sampled {
  std::vector<int32_t> ids;
  std::string text;  // bytes of the ids, decoded from the vocabulary (not from the constraint)
  bool ended = false;
};

// Random logits every step (uniform in [-4, 4]), masked, sampled at temperature 1.
Sampled sample(LogitConstraint& c, const JsonVocab& vocab, int64_t V, uint64_t seed, int max_steps,
               const std::vector<int32_t>& stop) {
  Sampler s({1.0, 0, 1.0, seed});
  std::mt19937 r(uint32_t(seed * 7919 + 1));
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  std::vector<float> logits(static_cast<size_t>(V));
  Sampled out;
  for (int step = 0; step < max_steps; ++step) {
    for (float& x : logits) x = u(r);
    c.mask(logits.data(), V);
    const int32_t id = s.sample(logits.data(), V);
    EXPECT_TRUE(std::isfinite(logits[size_t(id)])) << "sampled a masked id " << id;
    c.accept(id);
    out.ids.push_back(id);
    if (std::find(stop.begin(), stop.end(), id) != stop.end()) {
      out.ended = true;
      return out;
    }
    if (vocab.has_bytes(id)) out.text += vocab.bytes(id);
  }
  return out;
}

// The allowed set by brute force: every token's bytes fed on its own copy of the state.
std::vector<uint8_t> brute_allowed(const JsonMachine& m, const JsonVocab& vocab, int64_t V,
                                   const std::vector<int32_t>& terminals) {
  std::vector<uint8_t> a(size_t(V), 0);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (!vocab.has_bytes(id)) continue;
    JsonMachine t = m;
    a[size_t(id)] = t.feed(vocab.bytes(id));
  }
  if (m.complete())
    for (int32_t t : terminals) a[size_t(t)] = 1;
  return a;
}

const std::vector<std::string> kSchemas = {
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"score":{"type":"number"},
        "tags":{"type":"array","items":{"type":"string"},"maxItems":3},"ok":{"type":"boolean"},"none":{"type":"null"}},
        "required":["name","age","ok"],"additionalProperties":false})",
    R"({"type":"object","properties":{"color":{"enum":["red","green","bl\u00e9"]},"n":{"const":10},
        "pt":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]},
        "alt":{"anyOf":[{"type":"string"},{"type":"null"},{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2}]}},
        "required":["color","n","pt","alt"]})",
    R"({"type":"object","additionalProperties":{"type":"array","items":{"type":["integer","boolean"]}}})",
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
        "$ref":"#/$defs/node"})",
};

std::string show(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

std::string oracle_o200k() {
  return std::string(K3_SOURCE_DIR) + "/tools/oracle/node_modules/tiktoken/encoders/o200k_base.json";
}

// The o200k ranks from the npm encoder file ("! <first rank> <base64> ..." lines).
std::vector<std::string> o200k_tokens() {
  std::ifstream f(oracle_o200k());
  const json j = json::parse(f);
  std::vector<std::string> v;
  std::istringstream lines(j.at("bpe_ranks").get<std::string>());
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    std::istringstream parts(line);
    std::string bang, b64;
    int64_t first = 0;
    parts >> bang >> first;
    for (int64_t k = first; parts >> b64; ++k) {
      if (int64_t(v.size()) <= k) v.resize(size_t(k + 1));
      EXPECT_TRUE(base64_decode(b64, v[size_t(k)])) << b64;
    }
  }
  return v;
}

}  // namespace

TEST(JsonConstraint, TrieWalkAllowsExactlyTheTokensTheAutomatonTakes) {
  const auto vocab = std::make_shared<JsonVocab>(random_vocab(1, 3000, 3));
  const int64_t V = vocab->size() + 5;  // padding rows beyond the vocabulary
  const int32_t end = vocab->size() - 1;
  int checked_strings = 0, checked = 0;
  for (size_t si = 0; si <= kSchemas.size(); ++si) {
    const auto g = si < kSchemas.size() ? compile_json_schema_text(kSchemas[si]) : json_object_grammar();
    for (uint64_t seed = 0; seed < 6; ++seed) {
      JsonConstraint c(vocab, g, {end});
      JsonMachine m(*g);  // the state, followed independently of the constraint
      Sampler s({1.0, 0, 1.0, seed});
      std::mt19937 r{uint32_t(seed)};
      std::vector<float> logits(static_cast<size_t>(V));
      std::vector<uint8_t> allowed;
      for (int step = 0; step < 400 && !c.finished(); ++step) {
        const int64_t n = c.allowed_ids(allowed, V);
        const std::vector<uint8_t> want = brute_allowed(m, *vocab, V, {end});
        ASSERT_EQ(allowed, want) << "after '" << c.text() << "'";
        ASSERT_EQ(n, std::count(want.begin(), want.end(), 1));
        checked_strings += m.in_plain_string();
        ++checked;
        for (float& x : logits) x = float(r() % 1000) / 100.f;
        c.mask(logits.data(), V);
        const int32_t id = s.sample(logits.data(), V);
        c.accept(id);
        if (vocab->has_bytes(id)) {
          ASSERT_TRUE(m.feed(vocab->bytes(id)));
        }
      }
    }
  }
  EXPECT_GT(checked_strings, 200);  // the fast path was compared too
  EXPECT_GT(checked, 2000);
}

TEST(JsonConstraint, RandomLogitsJsonObjectAlwaysParsesAsAnObject) {
  const auto vocab = std::make_shared<JsonVocab>(random_vocab(2, 1500, 4));
  const int32_t end = vocab->size() - 2;  // one special is the terminal, the others never appear
  const auto g = json_object_grammar();
  int nontrivial = 0;
  for (uint64_t seed = 0; seed < 80; ++seed) {
    JsonConstraint c(vocab, g, {end});
    const Sampled out = sample(c, *vocab, vocab->size(), seed, 20000, {end});
    ASSERT_TRUE(out.ended) << "seed " << seed << ": no terminal after " << out.ids.size() << " tokens";
    ASSERT_TRUE(json::accept(out.text)) << "seed " << seed << ": " << show(out.text);
    const json v = json::parse(out.text);
    ASSERT_TRUE(v.is_object()) << out.text;
    ASSERT_EQ(out.text, c.text());
    nontrivial += !v.empty();
    for (size_t i = 0; i + 1 < out.ids.size(); ++i) ASSERT_TRUE(vocab->has_bytes(out.ids[i]));
  }
  EXPECT_GT(nontrivial, 30);
}

TEST(JsonConstraint, RandomLogitsSchemaOutputsValidate) {
  const auto vocab = std::make_shared<JsonVocab>(random_vocab(3, 1500, 3));
  const int32_t end = vocab->size() - 1;
  for (const std::string& s : kSchemas) {
    const auto g = compile_json_schema_text(s);
    const json schema = json::parse(s);
    for (uint64_t seed = 0; seed < 40; ++seed) {
      JsonConstraint c(vocab, g, {end});
      const Sampled out = sample(c, *vocab, vocab->size(), seed, 20000, {end});
      ASSERT_TRUE(out.ended) << s << " seed " << seed;
      ASSERT_TRUE(json::accept(out.text)) << s << " seed " << seed << ": " << show(out.text);
      const std::string why = test::schema_violation(json::parse(out.text), schema, schema);
      ASSERT_EQ(why, "") << out.text << " against " << s;
    }
  }
}

TEST(JsonConstraint, TerminalsExactlyWhenCompleteAndNumbersMayGoOn) {
  std::vector<std::string> bytes = {"1", "2", "}", "{", "{}", " ", "", ""};
  const auto vocab = std::make_shared<JsonVocab>(bytes);
  const int32_t end = 6;
  std::vector<uint8_t> a;
  // A top-level integer: complete after a digit, yet more digits may follow.
  JsonConstraint num(vocab, compile_json_schema_text(R"({"type":"integer"})"), {end});
  num.allowed_ids(a, 8);
  EXPECT_EQ(a, (std::vector<uint8_t>{1, 1, 0, 0, 0, 1, 0, 0}));
  num.accept(0);
  num.allowed_ids(a, 8);
  EXPECT_EQ(a, (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 1, 0}));
  num.accept(end);
  EXPECT_TRUE(num.finished());
  num.allowed_ids(a, 8);
  EXPECT_EQ(a, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1, 0}));
  EXPECT_THROW(num.accept(0), Error);
  // An object: terminals only after the closing brace, and then nothing else.
  JsonConstraint obj(vocab, json_object_grammar(), {end});
  EXPECT_THROW(obj.accept(end), Error);  // not complete
  EXPECT_THROW(obj.accept(2), Error);    // '}' cannot start
  obj.accept(4);
  obj.allowed_ids(a, 8);
  EXPECT_EQ(a, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1, 0}));
  // Logits shorter than the vocabulary are a setup error.
  std::vector<float> l(4);
  EXPECT_THROW(obj.mask(l.data(), 4), Error);
}

TEST(ChatJsonConstraint, ForcesCloseTransitionAndSuffix) {
  std::vector<std::string> bytes = random_vocab(4, 2000, 0);
  const int32_t think = int32_t(bytes.size()), response = think + 1, message = think + 2;
  bytes.push_back("think"), bytes.push_back("response"), bytes.push_back("message");
  const int32_t open = int32_t(bytes.size()), close = open + 1, sep = open + 2, eom = open + 3, other = open + 4;
  for (int i = 0; i < 5; ++i) bytes.push_back("");
  const auto vocab = std::make_shared<JsonVocab>(bytes);
  const std::vector<int32_t> transition = {think, sep, open, response, sep};
  const std::vector<int32_t> suffix = {close, response, sep, close, message, sep, eom};
  const auto g = compile_json_schema_text(kSchemas[0]);
  const int64_t V = vocab->size();
  for (int64_t max_reason : {0, 5, 40}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      const bool thinking = seed % 4 != 3;
      ChatJsonConstraint c(thinking, close, thinking ? transition : std::vector<int32_t>{},
                           std::make_shared<JsonConstraint>(vocab, g, std::vector<int32_t>{close}), suffix, max_reason);
      const Sampled out = sample(c, *vocab, V, seed, 20000, {eom});
      ASSERT_TRUE(out.ended);
      EXPECT_EQ(c.phase(), ChatJsonConstraint::Phase::done);
      const std::vector<int32_t>& ids = out.ids;
      size_t i = 0;
      if (thinking) {
        while (i < ids.size() && ids[i] != close) {
          ASSERT_TRUE(vocab->has_bytes(ids[i])) << "control id " << ids[i] << " in the reasoning";
          ++i;
        }
        EXPECT_LE(int64_t(i), max_reason);
        ASSERT_LT(i, ids.size());
        ++i;  // the close
        ASSERT_TRUE(std::equal(transition.begin(), transition.end(), ids.begin() + long(i)));
        i += transition.size();
      }
      std::string content;
      for (; i < ids.size() && ids[i] != close; ++i) {
        ASSERT_TRUE(vocab->has_bytes(ids[i]));
        content += vocab->bytes(ids[i]);
      }
      ASSERT_EQ(ids.size() - i, suffix.size());
      EXPECT_TRUE(std::equal(suffix.begin(), suffix.end(), ids.begin() + long(i)));
      const json schema = json::parse(kSchemas[0]);
      ASSERT_TRUE(json::accept(content)) << content;
      EXPECT_EQ(test::schema_violation(json::parse(content), schema, schema), "");
      EXPECT_EQ(std::count(ids.begin(), ids.end(), other), 0);
    }
  }
  // A close that the random logits would almost never pick is forced at the cap.
  ChatJsonConstraint c(true, close, transition, std::make_shared<JsonConstraint>(vocab, g, std::vector<int32_t>{close}),
                       suffix, 7);
  std::vector<float> l(static_cast<size_t>(V));
  for (int step = 0; step < 7; ++step) {
    std::fill(l.begin(), l.end(), 0.f);
    l[size_t(close)] = -1e9f;
    c.mask(l.data(), V);
    EXPECT_EQ(l[size_t(eom)], -INFINITY);  // control ids other than the close stay out
    c.accept(int32_t('a'));
  }
  std::fill(l.begin(), l.end(), 0.f);
  c.mask(l.data(), V);
  EXPECT_EQ(std::count_if(l.begin(), l.end(), [](float x) { return std::isfinite(x); }), 1);
  EXPECT_EQ(l[size_t(close)], 0.f);
  EXPECT_THROW(c.accept(int32_t('a')), Error);
  c.accept(close);
  EXPECT_THROW(c.accept(sep), Error);  // "think" is forced first
  // The JSON constraint must end at the suffix's first id.
  EXPECT_THROW(ChatJsonConstraint(true, close, transition,
                                  std::make_shared<JsonConstraint>(vocab, g, std::vector<int32_t>{eom}), suffix, 7),
               Error);
}

TEST(ChatJsonConstraint, TinyRandomModelEndToEnd) {
  const std::string dir = test::data_path("k3-release-tiny");
  const K3Model model = load_model(dir);
  const Tiktoken tok = Tiktoken::load(dir);
  const auto vocab = std::make_shared<JsonVocab>(token_byte_table(tok));
  const K3ChatJsonIds k3 = k3_chat_json_ids(tok);
  ASSERT_EQ(tok.decode_bytes(k3.transition), "think<|sep|><|open|>response<|sep|>");
  ASSERT_EQ(tok.decode_bytes(k3.suffix), "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>");
  const std::string schema_text =
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"},"c":{"enum":["red","green"]},
          "v":{"type":["array","null"],"items":{"type":"number"},"maxItems":3}},"required":["ok","n","c","v"],"additionalProperties":false})";
  const auto g = compile_json_schema_text(schema_text);
  const json schema = json::parse(schema_text);
  const int32_t eom = tok.special_id("<|end_of_msg|>");
  const std::vector<int32_t> prompt = tok.encode("Reply in JSON please.");
  for (uint64_t seed = 0; seed < 4; ++seed) {
    ChatJsonConstraint c(true, k3.close, k3.transition, std::make_shared<JsonConstraint>(vocab, g, std::vector<int32_t>{k3.close}),
                         k3.suffix, 8);
    Session sess(model);
    Sampler sampler({1.0, 0, 1.0, seed});
    std::vector<float> logits(size_t(sess.vocab()));
    const float* l = sess.prefill(prompt);
    std::vector<int32_t> out;
    for (int step = 0; step < 160; ++step) {
      std::copy(l, l + sess.vocab(), logits.begin());
      c.mask(logits.data(), sess.vocab());
      const int32_t id = sampler.sample(logits.data(), sess.vocab());
      c.accept(id);
      out.push_back(id);
      if (id == eom) break;
      l = sess.step(id);
    }
    ASSERT_EQ(out.back(), eom) << "seed " << seed << ": no end of message in " << out.size() << " tokens";
    const chat::ParsedOutput p = chat::parse_output(tok.decode_bytes(out), {chat::StartIn::think, {}});
    EXPECT_EQ(p.finish_reason, "stop");
    ASSERT_TRUE(json::accept(p.content)) << p.content;
    EXPECT_EQ(test::schema_violation(json::parse(p.content), schema, schema), "") << p.content;
    std::printf("[ e2e ] seed %d: %zu tokens, reasoning %zu bytes, content %s\n", int(seed), out.size(),
                p.reasoning.size(), show(p.content).c_str());
  }
}

TEST(JsonConstraint, MaskTimeOnO200k) {
  ASSERT_TRUE(std::filesystem::exists(oracle_o200k()))
      << "npm tiktoken is not installed in tools/oracle/node_modules: run scripts/setup.sh";
  std::vector<std::string> bytes = o200k_tokens();
  ASSERT_GT(bytes.size(), 199000u);
  bytes.resize(bytes.size() + 2);  // two byte-less ids (the terminal and one other special)
  const int32_t end = int32_t(bytes.size()) - 2;
  const auto t0 = std::chrono::steady_clock::now();
  const auto vocab = std::make_shared<JsonVocab>(bytes);
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto g = json_object_grammar();
  const int64_t V = vocab->size();
  std::vector<float> logits(static_cast<size_t>(V));
  std::printf("[ mask ] o200k_base: %d ids, JsonVocab built in %.0f ms\n", vocab->size(), build_ms);
  double worst = 0;
  for (const char* prefix : {"", "{\"name\": \"", "{\"name\": \"caf\xC3", "{\"a\": ", "{\"a\": 12", "{\"a\": [1, {\"b\"",
                             "{\"a\": \"x\\", "{\"a\": 1, "}) {
    JsonConstraint c(vocab, g, {end});
    // The prefix byte by byte through single-byte tokens (o200k has them all).
    for (char ch : std::string(prefix)) {
      const auto it = std::find(bytes.begin(), bytes.end(), std::string(1, ch));
      ASSERT_NE(it, bytes.end());
      c.accept(int32_t(it - bytes.begin()));
    }
    std::vector<double> ms;
    int64_t n = 0;
    for (int rep = 0; rep < 7; ++rep) {
      const auto a = std::chrono::steady_clock::now();
      c.mask(logits.data(), V);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    std::vector<uint8_t> allowed;
    n = c.allowed_ids(allowed, V);
    std::sort(ms.begin(), ms.end());
    worst = std::max(worst, ms[3]);
    std::printf("[ mask ] after %s: %lld allowed, median %.2f ms\n", show(prefix).c_str(), (long long)n, ms[3]);
    EXPECT_GT(n, 0);
  }
  // Generous (a shared CI machine); the figure itself is printed above.
  EXPECT_LT(worst, 250.0);
}

// The byte-level JSON automaton (infer/json_grammar.h) and the schema compiler
// (infer/json_schema.h):
//  - a corpus of valid documents: every prefix accepted, complete at the end; invalid ones
//    rejected at the first byte that makes them invalid (UTF-8, escapes, surrogates, numbers);
//  - property test against nlohmann::json::accept on random and mutated documents (within the
//    whitespace and depth caps): complete after all bytes <=> nlohmann accepts;
//  - the caps themselves (whitespace runs, depth) and the top level of json_object;
//  - random byte walks never reach a state with no byte and no completion (dead end), for
//    plain JSON and schemas with small depth limits, and what they produce validates;
//  - schema errors name the unsupported keyword.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/json_schema_check.h"
#include "core/error.h"
#include "infer/json_schema.h"

using namespace k3;
using nlohmann::json;

namespace {

std::string printable(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

JsonLimits loose() {
  JsonLimits l;
  l.max_depth = kJsonMaxDepth;
  l.max_ws_run = 4;
  l.trailing_ws = true;  // as nlohmann::json::accept
  return l;
}

// Index of the first rejected byte, or -1; `complete` after all bytes when none was rejected.
long first_reject(const JsonGrammar& g, const std::string& s, bool* complete = nullptr) {
  JsonMachine m(g);
  for (size_t i = 0; i < s.size(); ++i)
    if (!m.step(uint8_t(s[i]))) return long(i);
  if (complete) *complete = m.complete();
  return -1;
}

bool recognizes(const JsonGrammar& g, const std::string& s) {
  bool c = false;
  return first_reject(g, s, &c) < 0 && c;
}

const std::vector<std::string> kValid = {
    "{}", "[]", "0", "-0", "12", "-12.5e+3", "1E-7", "0.0", "1e5", "\"\"", "true", "false", "null",
    "{\"a\":1}", " { \"a\" : [ 1 , 2.5 , \"x\" ] } ", "[[[[]]]]", "{\"a\":{\"b\":{\"c\":null}}}",
    "\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", "\"\\u0041\\u00e9\\u20AC\\uD83D\\uDE00\"", "\"\\u0000\"",
    "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xED\x9F\xBF \xEF\xBF\xBF \xF4\x8F\xBF\xBF\"", "\"\x7F\"",
    "[1,-1,0.5,1e10,true,false,null,\"s\",{},[]]", "{\"\":\"\",\"a\":{},\"a\":[]}", "\t\r\n[1]\n",
};

struct Bad {
  std::string doc;
  long at;  // first invalid byte
};
const std::vector<Bad> kInvalid = {
    {"{\"a\":01}", 6},     {"[1,]", 3},           {"{\"a\" 1}", 5},       {"\"\x01\"", 1},
    {"\"\\uDC00\"", 4},     {"\"\\uD800x\"", 7},    {"\"\\uD800\\u0041\"", 9}, {"\"\xC0\x80\"", 1},
    {"\"\xC1\xBF\"", 1},    {"\"\xE0\x80\x80\"", 2}, {"\"\xED\xA0\x80\"", 2}, {"\"\xF0\x80\x80\x80\"", 2},
    {"\"\xF4\x90\x80\x80\"", 2}, {"\"\xF5\"", 1},    {"\"\x80\"", 1},        {"\"\xC3(\"", 2},
    {"tru e", 3},           {"[1 2]", 3},          {"{\"a\":1,}", 7},       {"[-]", 2},
    {"[1.]", 3},            {"[1e]", 3},           {"[1e+]", 4},           {"{,}", 1},
    {"[01]", 2},            {"\"\\x\"", 2},         {"\"\\u12G4\"", 5},      {"[1]]", 3},
    {"{\"a\":1}}", 7},      {"nulll", 4},          {"+1", 0},              {".5", 0},
    {"[1,,2]", 3},          {"{\"a\":}", 5},        {"{1:2}", 1},           {"'a'", 0},
};

// A random valid document: nesting below `depth`, whitespace runs of at most 2 on each side
// of a structural byte (so at most 4 in a row), random strings with escapes and UTF-8.
std::string random_ws(std::mt19937& r) {
  static const char ws[] = {' ', '\t', '\n', '\r'};
  std::string s;
  for (int n = int(r() % 3); n-- > 0;) s += ws[r() % 4];
  return s;
}
std::string random_string(std::mt19937& r) {
  static const std::vector<std::string> pieces = {"a", "Z", " ", "0", "\\n", "\\\"", "\\\\", "\\u00e9", "\\uD83D\\uDE00",
                                                  "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "/", "\\/", "{", "]",
                                                  "\\uDE00", "\\uD83D"};  // lone surrogates: invalid
  std::string s = "\"";
  for (int n = int(r() % 6); n-- > 0;) s += pieces[r() % pieces.size()];
  return s + "\"";
}
std::string random_doc(std::mt19937& r, int depth) {
  const int k = int(r() % (depth > 0 ? 7 : 5));
  switch (k) {
    case 0: return random_string(r);
    case 1: {
      static const char* nums[] = {"0", "-0", "7", "-12", "3.25", "1e9", "-2.5E-3", "10", "0.0e+0"};
      return nums[r() % 9];
    }
    case 2: return r() % 2 ? "true" : "false";
    case 3: return "null";
    case 4: return random_string(r);
    case 5: {
      std::string s = "[" + random_ws(r);
      for (int n = int(r() % 4), i = 0; i < n; ++i)
        s += (i ? "," + random_ws(r) : "") + random_doc(r, depth - 1) + random_ws(r);
      return s + "]";
    }
    default: {
      std::string s = "{" + random_ws(r);
      for (int n = int(r() % 4), i = 0; i < n; ++i)
        s += (i ? "," + random_ws(r) : "") + random_string(r) + random_ws(r) + ":" + random_ws(r) +
             random_doc(r, depth - 1) + random_ws(r);
      return s + "}";
    }
  }
}

std::string mutate(std::mt19937& r, std::string s) {
  static const std::string alphabet = "{}[]\",:\\ \t\n0123456789-+.eEtrunlfasUu\x01\x7F\xC3\xA9\xE2\x82\xF0\x9F\xED\xA0\xFF";
  for (int n = 1 + int(r() % 3); n-- > 0;) {
    const size_t at = s.empty() ? 0 : r() % (s.size() + 1);
    const char c = alphabet[r() % alphabet.size()];
    switch (r() % 3) {
      case 0: s.insert(s.begin() + long(at), c); break;
      case 1:
        if (at < s.size()) s.erase(at, 1);
        break;
      default:
        if (at < s.size()) s[at] = c;
    }
  }
  return s;
}

// Within the automaton's caps: whitespace runs of at most `cap` and digit runs that fit the
// number caps (counted anywhere, so conservatively).
bool within_caps(const std::string& s, int cap) {
  int run = 0, digits = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    run = (c == ' ' || c == '\t' || c == '\n' || c == '\r') ? run + 1 : 0;
    digits = (c >= '0' && c <= '9') ? digits + 1 : 0;
    if (run > cap || digits > 2) return false;
  }
  return true;
}

// A byte walk choosing uniformly among the accepted bytes; after `budget` steps it prefers
// closing bytes. Returns the text; fails the test on a dead end.
std::string byte_walk(const JsonGrammar& g, std::mt19937& r, int budget) {
  JsonMachine m(g);
  std::string out;
  for (int step = 0; step < 100000; ++step) {
    if (m.complete() && (step > budget || r() % 8 == 0)) return out;
    std::vector<uint8_t> ok;
    for (int c = 0; c < 256; ++c) {
      JsonMachine t = m;
      if (t.step(uint8_t(c))) ok.push_back(uint8_t(c));
    }
    if (ok.empty()) {
      EXPECT_TRUE(m.complete()) << "dead end after '" << out << "'";
      return out;
    }
    uint8_t pick = ok[r() % ok.size()];
    if (step > budget)
      for (uint8_t want : std::string(m.in_plain_string() ? "\"" : "}]0\"")) {
        if (std::find(ok.begin(), ok.end(), want) != ok.end()) {
          pick = want;
          break;
        }
      }
    m.step(pick);
    out += char(pick);
  }
  ADD_FAILURE() << "byte walk did not end: " << printable(out.substr(0, 300)) << " ... " << printable(out.substr(out.size() - 300));
  return out;
}

void expect_error(const std::string& schema, const std::string& needle) {
  try {
    compile_json_schema_text(schema);
    ADD_FAILURE() << "no error for " << schema;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(JsonGrammar, ValidCorpusEveryPrefixAcceptedAndComplete) {
  const auto g = json_any_grammar(loose());
  for (const std::string& d : kValid) {
    ASSERT_TRUE(json::accept(d)) << d;  // the corpus itself
    bool complete = false;
    EXPECT_EQ(first_reject(*g, d, &complete), -1) << d;
    EXPECT_TRUE(complete) << d;
    for (size_t n = 0; n + 1 < d.size(); ++n) {  // proper prefixes: accepted; complete only if valid
      bool c = false;
      ASSERT_EQ(first_reject(*g, d.substr(0, n), &c), -1) << d << " prefix " << n;
      EXPECT_EQ(c, json::accept(d.substr(0, n))) << d << " prefix " << n;
    }
  }
}

TEST(JsonGrammar, InvalidCorpusRejectedAtTheFirstBadByte) {
  const auto g = json_any_grammar(loose());
  for (const Bad& b : kInvalid) {
    EXPECT_FALSE(json::accept(b.doc)) << b.doc;
    EXPECT_EQ(first_reject(*g, b.doc), b.at) << b.doc;
  }
  // Incomplete documents are accepted as prefixes but not complete.
  for (const char* d : {"nul", "[1", "\"abc", "{\"a\":", "-", "1.", "\"\\u12", "\"\xE2\x82", "\"\\uD83D"}) {
    bool c = true;
    EXPECT_EQ(first_reject(*g, d, &c), -1) << d;
    EXPECT_FALSE(c) << d;
  }
}

TEST(JsonGrammar, AgreesWithNlohmannOnRandomAndMutatedDocuments) {
  const auto g = json_any_grammar(loose());
  std::mt19937 r(12345);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string d = random_doc(r, 6);
    if (i % 2) d = mutate(r, d);
    if (!within_caps(d, 4)) continue;  // the caps are a deliberate difference
    const bool want = json::accept(d);
    ASSERT_EQ(recognizes(*g, d), want) << (want ? "rejected valid: " : "accepted invalid: ") << printable(d);
    (want ? accepted : rejected)++;
  }
  EXPECT_GT(accepted, 5000);  // both sides are exercised
  EXPECT_GT(rejected, 3000);
}

TEST(JsonGrammar, CapsOnWhitespaceDepthAndNumberDigits) {
  JsonLimits l;
  l.max_ws_run = 3;
  l.max_depth = 3;
  const auto g = json_any_grammar(l);
  EXPECT_TRUE(recognizes(*g, "[   1]"));
  EXPECT_EQ(first_reject(*g, "[    1]"), 4);
  EXPECT_TRUE(recognizes(*g, "{\"s\":\"        \"}"));  // inside strings whitespace is text
  EXPECT_TRUE(recognizes(*g, "[[1]]"));             // three frames: two arrays and the number
  EXPECT_EQ(first_reject(*g, "[[[1]]]"), 3);         // a third array could hold nothing but []
  EXPECT_TRUE(recognizes(*g, "[[[]]]"));
  EXPECT_EQ(first_reject(*g, "[1] "), 3);            // no trailing whitespace by default
  // Numbers: 20 integer digits, 20 fraction digits, 2 exponent digits (a finite double).
  const std::string d20(20, '9');
  EXPECT_TRUE(recognizes(*g, "-" + d20 + "." + d20 + "e-99"));
  EXPECT_EQ(first_reject(*g, d20 + "9"), 20);
  EXPECT_EQ(first_reject(*g, "0." + d20 + "1"), 22);
  EXPECT_EQ(first_reject(*g, "1e100"), 4);
  EXPECT_EQ(first_reject(*g, "1E+007"), 5);
  EXPECT_FALSE(json::accept("1e400"));  // why the cap: nlohmann rejects what overflows a double
}

TEST(JsonGrammar, JsonObjectGrammarWantsAnObjectAtTheTop) {
  const auto g = json_object_grammar();
  EXPECT_TRUE(recognizes(*g, "{\"a\":[1,{\"b\":null}]}"));
  EXPECT_TRUE(recognizes(*g, "  {}"));
  EXPECT_EQ(first_reject(*g, "[1]"), 0);
  EXPECT_EQ(first_reject(*g, "\"a\""), 0);
  EXPECT_EQ(first_reject(*g, "1"), 0);
}

TEST(JsonGrammar, SchemaObjectsForceRequiredKeysInOrder) {
  const auto g = compile_json_schema_text(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2},
      "ok":{"type":["boolean","null"]}},"required":["name","ok"],"additionalProperties":false})");
  EXPECT_TRUE(recognizes(*g, R"({"name":"x","ok":true})"));
  EXPECT_TRUE(recognizes(*g, R"({"name":"x","age":-3,"tags":["a","b"],"ok":null})"));
  EXPECT_TRUE(recognizes(*g, R"({"name":"x","tags":[],"ok":false})"));
  EXPECT_EQ(first_reject(*g, R"({"name":"x"})"), 11);            // ok is required
  EXPECT_EQ(first_reject(*g, R"({"age":1})"), 2);                 // name comes first (required)
  EXPECT_EQ(first_reject(*g, R"({"name":"x","ok":true,"age":1})"), 21);  // declaration order
  EXPECT_EQ(first_reject(*g, R"({"name":"x","age":1.5})"), 19);   // integer
  EXPECT_EQ(first_reject(*g, R"({"name":"x","tags":["c"])"), 21); // enum
  EXPECT_EQ(first_reject(*g, R"({"name":"x","tags":["a","a","b"])"), 27);  // maxItems
  EXPECT_EQ(first_reject(*g, R"({"nam":1})"), 5);
  EXPECT_EQ(first_reject(*g, R"([])"), 0);
}

TEST(JsonGrammar, SchemaKeywords) {
  // const, enum of mixed values (numbers that prefix each other), anyOf, minItems, $ref recursion.
  const auto g = compile_json_schema_text(R"({"type":"object","properties":{
      "v":{"const":"x"},"n":{"enum":[1,10,1.5,null,{"k":[true]}]},"u":{"anyOf":[{"type":"string"},{"type":"array","items":{"$ref":"#/$defs/t"},"minItems":1}]}},
      "required":["v","n","u"],"$defs":{"t":{"type":"object","properties":{"c":{"$ref":"#/$defs/t"}}}}})");
  EXPECT_TRUE(recognizes(*g, R"({"v":"x","n":1,"u":"s"})"));
  EXPECT_TRUE(recognizes(*g, R"({"v":"x","n":10,"u":[{}]})"));
  EXPECT_TRUE(recognizes(*g, R"({"v":"x","n":1.5,"u":[{"c":{"c":{}}},{}]})"));
  EXPECT_TRUE(recognizes(*g, R"({"v":"x","n":{"k":[true]},"u":"s"})"));
  EXPECT_EQ(first_reject(*g, R"({"v":"y")"), 6);
  EXPECT_EQ(first_reject(*g, R"({"v":"x","n":100)"), 15);
  EXPECT_EQ(first_reject(*g, R"({"v":"x","n":1,"u":[])"), 20);  // minItems 1
  EXPECT_EQ(first_reject(*g, R"({"v":"x","n":1,"u":1})"), 19);   // neither branch
  EXPECT_EQ(first_reject(*g, R"({"v":"x","n":1,"u":[{"d":1}]})"), 22);
}

TEST(JsonGrammar, RandomByteWalksNeverDeadEndAndValidate) {
  const std::vector<std::string> schemas = {
      R"({"type":"object"})",
      R"({"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"array","items":{"type":"array"},"minItems":2}},"required":["b"]},"opt":{"type":"array","items":{"type":"object","properties":{"x":{"type":"object","properties":{"y":{"type":"object"}},"required":["y"]}}}}},"required":["a"]})",
      R"({"$defs":{"n":{"type":"object","properties":{"k":{"$ref":"#/$defs/n"},"v":{"type":"integer"}},"required":["v"]}},"$ref":"#/$defs/n"})",
      // Values that need several frames, started near the depth limit (array items, free-key values).
      R"({"type":"array","items":{"type":"array","items":{"type":"object","properties":{"k":{"type":"array","items":{"type":"integer"},"minItems":1}},"required":["k"]}}})",
      R"({"type":"object","additionalProperties":{"type":"object","additionalProperties":{"type":"object","properties":{"r":{"type":"array","items":{"type":"null"},"minItems":2}},"required":["r"]}}})",
      R"({"type":["array","string","null","number"],"items":{"anyOf":[{"type":"object","properties":{"q":{"enum":["a\u00e9\"",2]}},"required":["q"],"additionalProperties":false},{"type":"boolean"}]},"maxItems":3})",
  };
  for (int depth : {4, 5, 8}) {
    JsonLimits l;
    l.max_depth = depth;
    l.max_ws_run = 2;
    for (const std::string& s : schemas) {
      const auto g = compile_json_schema_text(s, l);
      const json schema = json::parse(s);
      std::mt19937 r(uint32_t(depth * 100 + s.size()));
      for (int i = 0; i < 60; ++i) {
        const std::string out = byte_walk(*g, r, 40);
        if (::testing::Test::HasFailure()) return;
        ASSERT_TRUE(json::accept(out)) << out;
        const std::string why = test::schema_violation(json::parse(out), schema, schema);
        ASSERT_EQ(why, "") << out << " against " << s;
      }
    }
  }
  // And plain JSON at the top.
  JsonLimits l;
  l.max_depth = 3;
  const auto g = json_any_grammar(l);
  std::mt19937 r(5);
  for (int i = 0; i < 200; ++i) {
    const std::string out = byte_walk(*g, r, 30);
    ASSERT_TRUE(json::accept(out)) << out;
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  expect_error(R"({"type":"string","pattern":"^a"})", "unsupported keyword 'pattern'");
  expect_error(R"({"type":"string","format":"date-time"})", "unsupported keyword 'format'");
  expect_error(R"({"type":"object","properties":{"a":{"type":"string","minLength":2}}})",
               "/properties/a: unsupported keyword 'minLength'");
  expect_error(R"({"type":"number","minimum":0})", "unsupported keyword 'minimum'");
  expect_error(R"({"allOf":[{"type":"string"}]})", "unsupported keyword 'allOf'");
  expect_error(R"({"type":"array","prefixItems":[{"type":"string"}]})", "unsupported keyword 'prefixItems'");
  expect_error(R"({"type":"array","items":[{"type":"string"}]})", "tuple form");
  expect_error(R"({"type":"object","patternProperties":{"a":{}}})", "unsupported keyword 'patternProperties'");
  expect_error(R"({"type":"date"})", "unsupported type 'date'");
  expect_error(R"({"type":"object","properties":{"a":{}},"required":["b"]})", "'b' is not in properties");
  expect_error(R"({"anyOf":[{"type":"string"},{"enum":["a"]}]})", "two branches can start with '\"'");
  expect_error(R"({"anyOf":[{"type":"integer"},{"type":"number"}]})", "two branches can start with");
  expect_error(R"({"type":"array","minItems":3,"maxItems":2})", "minItems is greater than maxItems");
  expect_error(R"({"$ref":"https://example.com/s.json"})", "only local $ref");
  expect_error(R"({"$ref":"#/$defs/missing"})", "does not resolve");
  expect_error(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "$ref");
  expect_error(R"({"$defs":{"n":{"type":"object","properties":{"k":{"$ref":"#/$defs/n"}},"required":["k"]}},"$ref":"#/$defs/n"})",
               "no value satisfies the schema");
  expect_error(R"({"type":"string","enum":[1,2]})", "no enum/const value is of the given type");
  expect_error(R"({"enum":["a"],"properties":{}})", "'properties' alongside 'enum'");
  expect_error(R"(false)", "admits no value");
  expect_error(R"({"type":)", "not valid JSON");
}

#include "infer/json_schema.h"

#include <algorithm>
#include <bitset>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "core/error.h"

namespace k3 {

namespace {

using ojson = nlohmann::ordered_json;
constexpr int32_t kInf = 1 << 20;         // min_depth of a node no value can complete
constexpr size_t kMaxNodes = 1 << 16;     // a request's schema is user input: bound its size
constexpr size_t kMaxLitNodes = 1 << 20;

const std::set<std::string> kAnnotations = {"title",   "description", "default",    "examples",  "$schema",
                                            "$id",     "$comment",    "deprecated", "readOnly",  "writeOnly",
                                            "$defs",   "definitions"};
const std::set<std::string> kKeywords = {"type",  "enum",     "const",    "properties", "required", "additionalProperties",
                                         "items", "minItems", "maxItems", "anyOf",      "oneOf",    "$ref"};
const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

std::string byte_name(int c) {
  if (c >= 0x21 && c < 0x7F) return std::string("'") + char(c) + "'";
  return "byte " + std::to_string(c);
}

class Compiler {
 public:
  explicit Compiler(const JsonLimits& limits, const ojson* doc = nullptr) : doc_(doc) {
    if (limits.max_depth < 1 || limits.max_depth > kJsonMaxDepth)
      fail("json grammar: max_depth must be in 1.." + std::to_string(kJsonMaxDepth));
    if (limits.max_ws_run < 0 || limits.max_ws_run > 255) fail("json grammar: max_ws_run must be in 0..255");
    g_->limits = limits;
    JsonNode s;
    s.kind = JsonKind::String;
    g_->string_node = add(std::move(s), "");
  }

  // Any JSON value (the schema `true`); built once, recursive through its containers.
  int32_t any() {
    if (any_ >= 0) return any_;
    any_ = add(JsonNode{}, "");
    JsonNode o, a, num;
    o.kind = JsonKind::Object, o.values = any_, o.next_required = {0};
    a.kind = JsonKind::Array, a.items = any_;
    num.kind = JsonKind::Number;
    const int32_t oi = add(std::move(o), ""), ai = add(std::move(a), ""), ni = add(std::move(num), "");
    const int32_t li = literal({"true", "false", "null"}, "");
    g_->nodes[size_t(any_)].branches = {oi, ai, g_->string_node, ni, li};
    return any_;
  }

  int32_t free_object() {
    JsonNode o;
    o.kind = JsonKind::Object, o.values = any(), o.next_required = {0};
    return add(std::move(o), "");
  }

  int32_t compile(const ojson& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return any();
      error(path, "the schema false admits no value");
    }
    if (!s.is_object()) error(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items())
      if (!kAnnotations.count(k) && !kKeywords.count(k)) error(path, "unsupported keyword '" + k + "'");
    auto only = [&](const std::string& kw, std::initializer_list<const char*> with) {
      for (const auto& [k, v] : s.items()) {
        if (k == kw || kAnnotations.count(k)) continue;
        if (std::find(with.begin(), with.end(), k) == with.end())
          error(path, "'" + k + "' alongside '" + kw + "' is not supported");
      }
    };
    if (s.contains("$ref")) {
      only("$ref", {});
      return ref(s["$ref"], path);
    }
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (!s.contains(kw)) continue;
      only(kw, {});
      const ojson& alts = s[kw];
      if (!alts.is_array() || alts.empty()) error(path, std::string(kw) + " must be a non-empty array");
      JsonNode u;
      for (size_t i = 0; i < alts.size(); ++i)
        u.branches.push_back(compile(alts[i], path + "/" + kw + "/" + std::to_string(i)));
      return add(std::move(u), path + " (" + kw + ")");
    }
    std::vector<std::string> types = type_list(s, path);
    if (s.contains("enum") || s.contains("const")) {
      only(s.contains("enum") ? "enum" : "const", {"type", "const"});
      return enum_node(s, types, path);
    }
    if (types.empty()) {
      bool obj = false, arr = false;
      for (const char* k : {"properties", "required", "additionalProperties"}) obj |= s.contains(k);
      for (const char* k : {"items", "minItems", "maxItems"}) arr |= s.contains(k);
      if (obj) types.push_back("object");
      if (arr) types.push_back("array");
      if (types.empty()) return any();
    }
    // integer values are numbers: with both, number alone (the two would share first bytes).
    if (std::count(types.begin(), types.end(), "number"))
      types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
    JsonNode u;
    for (const std::string& t : types) u.branches.push_back(type_node(s, t, path));
    if (u.branches.size() == 1) return u.branches[0];
    return add(std::move(u), path + " (type)");
  }

  std::shared_ptr<const JsonGrammar> finish(int32_t root) {
    g_->root = root;
    for (size_t i = 0; i < g_->nodes.size(); ++i)
      if (g_->nodes[i].kind == JsonKind::Union && g_->nodes[i].branches.empty())
        error(paths_[i], "$ref cycle with no value in between");
    firsts_.assign(g_->nodes.size(), {});
    state_.assign(g_->nodes.size(), 0);
    for (size_t i = 0; i < g_->nodes.size(); ++i) first_set(int32_t(i));
    min_depths();
    if (g_->nodes[size_t(root)].min_depth > g_->limits.max_depth)
      error("", "no value satisfies the schema within the nesting limit of " + std::to_string(g_->limits.max_depth));
    return g_;
  }

 private:
  [[noreturn]] void error(const std::string& path, const std::string& what) {
    fail("response_format schema: " + (path.empty() ? std::string("/") : path) + ": " + what);
  }

  int32_t add(JsonNode n, const std::string& path) {
    if (g_->nodes.size() >= kMaxNodes) error(path, "the schema is too large");
    g_->nodes.push_back(std::move(n));
    paths_.push_back(path);
    return int32_t(g_->nodes.size() - 1);
  }

  // A Literal node matching exactly the given texts (tag: index into alts).
  int32_t literal(const std::vector<std::string>& alts, const std::string& path, int32_t key_of = -1) {
    auto& lits = g_->lits;
    const int32_t root = int32_t(lits.size());
    lits.emplace_back();
    for (size_t k = 0; k < alts.size(); ++k) {
      int32_t t = root;
      lits[size_t(t)].below.push_back(int32_t(k));
      for (char ch : alts[k]) {
        int32_t next = g_->lit_child(t, uint8_t(ch));
        if (next < 0) {
          if (lits.size() >= kMaxLitNodes) error(path, "the schema's enum/const values are too large");
          next = int32_t(lits.size());
          lits.emplace_back();
          lits[size_t(t)].next.emplace_back(uint8_t(ch), next);
        }
        t = next;
        lits[size_t(t)].below.push_back(int32_t(k));
      }
      if (lits[size_t(t)].tag < 0) lits[size_t(t)].tag = int32_t(k);
    }
    JsonNode n;
    n.kind = JsonKind::Literal, n.lit_root = root, n.key_of = key_of;
    return add(std::move(n), path);
  }

  std::vector<std::string> type_list(const ojson& s, const std::string& path) {
    std::vector<std::string> out;
    if (!s.contains("type")) return out;
    const ojson& t = s["type"];
    if (t.is_string()) out.push_back(t.get<std::string>());
    else if (t.is_array() && !t.empty()) {
      for (const ojson& x : t) {
        if (!x.is_string()) error(path, "type must be a string or an array of strings");
        out.push_back(x.get<std::string>());
      }
    } else error(path, "type must be a string or an array of strings");
    for (const std::string& x : out)
      if (!kTypes.count(x)) error(path, "unsupported type '" + x + "'");
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  static bool of_type(const ojson& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "boolean") return v.is_boolean();
    return v.is_null();
  }

  int32_t enum_node(const ojson& s, const std::vector<std::string>& types, const std::string& path) {
    std::vector<ojson> vals;
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) error(path, "enum must be a non-empty array");
      for (const ojson& v : s["enum"])
        if (!s.contains("const") || v == s["const"]) vals.push_back(v);
    } else vals.push_back(s["const"]);
    std::vector<std::string> alts;
    for (const ojson& v : vals) {
      bool ok = types.empty();
      for (const std::string& t : types) ok |= of_type(v, t);
      if (!ok) continue;
      try {
        alts.push_back(v.dump());
      } catch (const nlohmann::json::exception& e) {
        error(path, std::string("enum/const value cannot be written as JSON: ") + e.what());
      }
    }
    if (alts.empty()) error(path, "no enum/const value is of the given type");
    return literal(alts, path);
  }

  int32_t type_node(const ojson& s, const std::string& t, const std::string& path) {
    if (t == "object") return object_node(s, path);
    if (t == "array") return array_node(s, path);
    if (t == "string") return g_->string_node;
    if (t == "boolean") return literal({"true", "false"}, path);
    if (t == "null") return literal({"null"}, path);
    JsonNode n;
    n.kind = JsonKind::Number, n.integer = t == "integer";
    return add(std::move(n), path);
  }

  int32_t object_node(const ojson& s, const std::string& path) {
    JsonNode n;
    n.kind = JsonKind::Object;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) error(path, "properties must be an object");
      for (const auto& [name, sub] : s["properties"].items())
        n.props.push_back({name, compile(sub, path + "/properties/" + name), false});
    }
    if (s.contains("required")) {
      const ojson& r = s["required"];
      if (!r.is_array()) error(path, "required must be an array of strings");
      for (const ojson& x : r) {
        if (!x.is_string()) error(path, "required must be an array of strings");
        auto it = std::find_if(n.props.begin(), n.props.end(), [&](const JsonProperty& p) { return p.name == x; });
        if (it == n.props.end()) error(path, "required: '" + x.get<std::string>() + "' is not in properties");
        it->required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const ojson& a = s["additionalProperties"];
      if (!a.is_boolean() && !a.is_object()) error(path, "additionalProperties must be a boolean or a schema");
      // With declared properties only those are emitted, so the extra-key schema is unused.
      if (n.props.empty()) n.values = a.is_boolean() ? (a.get<bool>() ? any() : -1) : compile(a, path + "/additionalProperties");
    } else if (n.props.empty()) {
      n.values = any();
    }
    const size_t np = n.props.size();
    n.next_required.assign(np + 1, int32_t(np));
    for (size_t i = np; i-- > 0;) n.next_required[i] = n.props[i].required ? int32_t(i) : n.next_required[i + 1];
    std::vector<std::string> keys;
    for (const JsonProperty& p : n.props) keys.push_back(ojson(p.name).dump());
    const int32_t idx = add(std::move(n), path);
    if (np > 0) {
      const int32_t key = literal(keys, path + " (keys)", idx);
      g_->nodes[size_t(idx)].key_node = key;
    }
    return idx;
  }

  int32_t array_node(const ojson& s, const std::string& path) {
    JsonNode n;
    n.kind = JsonKind::Array;
    if (s.contains("items")) {
      if (s["items"].is_array()) error(path, "items as an array (tuple form) is not supported");
      n.items = compile(s["items"], path + "/items");
    } else {
      n.items = any();
    }
    auto count = [&](const char* k, int64_t& out) {
      if (!s.contains(k)) return;
      const ojson& v = s[k];
      if (!v.is_number_integer() || v.get<int64_t>() < 0) error(path, std::string(k) + " must be a non-negative integer");
      out = v.get<int64_t>();
    };
    count("minItems", n.min_items);
    count("maxItems", n.max_items);
    if (n.min_items > n.max_items) error(path, "minItems is greater than maxItems");
    return add(std::move(n), path);
  }

  int32_t ref(const ojson& r, const std::string& path) {
    if (!r.is_string()) error(path, "$ref must be a string");
    const std::string s = r.get<std::string>();
    if (auto it = refs_.find(s); it != refs_.end()) return it->second;
    if (s.empty() || s[0] != '#' || !doc_) error(path, "only local $ref ('#', '#/$defs/...') is supported, not '" + s + "'");
    const ojson* target = nullptr;
    try {
      const ojson::json_pointer ptr(s.substr(1));
      if (doc_->contains(ptr)) target = &doc_->at(ptr);
    } catch (const nlohmann::json::exception&) {
    }
    if (!target) error(path, "$ref '" + s + "' does not resolve in the schema");
    // Reserve the node first so that recursive references resolve to it.
    const int32_t idx = add(JsonNode{}, s);
    refs_[s] = idx;
    const int32_t k = compile(*target, s.substr(1));
    if (k != idx) g_->nodes[size_t(idx)] = JsonNode(g_->nodes[size_t(k)]);
    return idx;
  }

  // The bytes a value of node i can start with; for unions also the byte -> branch table.
  const std::bitset<256>& first_set(int32_t i) {
    if (state_[size_t(i)] == 2) return firsts_[size_t(i)];
    if (state_[size_t(i)] == 1) error(paths_[size_t(i)], "anyOf/oneOf/$ref refers back to itself with no value in between");
    state_[size_t(i)] = 1;
    std::bitset<256> f;
    JsonNode& n = g_->nodes[size_t(i)];
    switch (n.kind) {
      case JsonKind::Object: f.set('{'); break;
      case JsonKind::Array: f.set('['); break;
      case JsonKind::String: f.set('"'); break;
      case JsonKind::Number:
        f.set('-');
        for (int c = '0'; c <= '9'; ++c) f.set(size_t(c));
        break;
      case JsonKind::Literal:
        for (const auto& [b, t] : g_->lits[size_t(n.lit_root)].next) f.set(b);
        break;
      case JsonKind::Union: {
        std::vector<int32_t> first(256, -1);
        for (size_t b = 0; b < n.branches.size(); ++b) {
          const int32_t br = g_->nodes[size_t(i)].branches[b];
          const std::bitset<256> fb = first_set(br);
          for (int c = 0; c < 256; ++c) {
            if (!fb[size_t(c)]) continue;
            if (first[size_t(c)] >= 0)
              error(paths_[size_t(i)], "two branches can start with " + byte_name(c) +
                                           " (k3cpp supports only branches that begin with different characters)");
            first[size_t(c)] = br;
          }
          f |= fb;
        }
        g_->nodes[size_t(i)].first = std::move(first);
        break;
      }
    }
    firsts_[size_t(i)] = f;
    state_[size_t(i)] = 2;
    return firsts_[size_t(i)];
  }

  // Fixpoint of the frames each node needs to complete (kInf: none can complete).
  void min_depths() {
    for (JsonNode& n : g_->nodes) n.min_depth = kInf;
    for (bool changed = true; changed;) {
      changed = false;
      for (JsonNode& n : g_->nodes) {
        auto md = [&](int32_t j) { return g_->nodes[size_t(j)].min_depth; };
        int32_t d = 1;
        if (n.kind == JsonKind::Object) {
          for (const JsonProperty& p : n.props)
            if (p.required) d = std::max(d, 1 + md(p.node));
        } else if (n.kind == JsonKind::Array) {
          if (n.min_items > 0) d = 1 + md(n.items);
        } else if (n.kind == JsonKind::Union) {
          d = kInf;
          for (int32_t b : n.branches) d = std::min(d, md(b));
        }
        d = std::min(d, kInf);
        if (d < n.min_depth) n.min_depth = d, changed = true;
      }
    }
  }

  std::shared_ptr<JsonGrammar> g_ = std::make_shared<JsonGrammar>();
  const ojson* doc_;
  std::vector<std::string> paths_;  // per node, for error messages
  std::map<std::string, int32_t> refs_;
  int32_t any_ = -1;
  std::vector<std::bitset<256>> firsts_;
  std::vector<uint8_t> state_;  // first_set: 0 unvisited, 1 in progress, 2 done
};

}  // namespace

std::shared_ptr<const JsonGrammar> json_any_grammar(const JsonLimits& limits) {
  Compiler c(limits);
  const int32_t root = c.any();
  return c.finish(root);
}

std::shared_ptr<const JsonGrammar> json_object_grammar(const JsonLimits& limits) {
  Compiler c(limits);
  const int32_t root = c.free_object();
  return c.finish(root);
}

std::shared_ptr<const JsonGrammar> compile_json_schema(const nlohmann::ordered_json& schema, const JsonLimits& limits) {
  Compiler c(limits, &schema);
  const int32_t root = c.compile(schema, "");
  return c.finish(root);
}

std::shared_ptr<const JsonGrammar> compile_json_schema_text(std::string_view schema_text, const JsonLimits& limits) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("response_format schema: not valid JSON: ") + e.what());
  }
  return compile_json_schema(j, limits);
}

}  // namespace k3

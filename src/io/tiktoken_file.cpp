#include "io/tiktoken_file.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace k3 {
namespace {

const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
  }
  if (size_t rest = in.size() - i) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

bool base64_decode(std::string_view t, std::string& out) {
  out.clear();
  if (t.empty() || t.size() % 4) return false;
  for (size_t i = 0; i < t.size(); i += 4) {
    const bool last = i + 4 == t.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = t[i + k];
      if (c == '=' && last && k >= 2) { v[k] = 0; ++pad; continue; }
      if (pad) return false;  // data after padding
      v[k] = b64_value(c);
      if (v[k] < 0) return false;
    }
    uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    // Non-canonical encodings (stray low bits before the padding) are refused, as the
    // reference's base64 decoder does.
    if ((pad == 1 && (w & 0xFF)) || (pad == 2 && (w & 0xFFFF))) return false;
    out.push_back(char(w >> 16));
    if (pad < 2) out.push_back(char((w >> 8) & 0xFF));
    if (pad < 1) out.push_back(char(w & 0xFF));
  }
  return true;
}

BpeRanks parse_tiktoken_model(std::string_view text, const std::string& path) {
  struct Line {
    int64_t rank;
    size_t line_no;
    std::string bytes;
  };
  std::vector<Line> lines;
  size_t pos = 0, line_no = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(line_no);
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
      fail_input(path, where, "expected '<base64> <rank>'");
    if (!base64_decode(line.substr(0, sp), bytes))
      fail_input(path, where, "bad base64 '" + std::string(line.substr(0, std::min<size_t>(sp, 40))) + "'");
    std::string_view num = line.substr(sp + 1);
    int64_t rank = 0;
    if (num.empty() || num.size() > 10) fail_input(path, where, "bad rank '" + std::string(num) + "'");
    for (char c : num) {
      if (c < '0' || c > '9') fail_input(path, where, "bad rank '" + std::string(num) + "'");
      rank = rank * 10 + (c - '0');
    }
    if (rank > INT32_MAX - 1024) fail_input(path, where, "rank " + std::to_string(rank) + " is too large");
    lines.push_back({rank, line_no, bytes});
  }
  if (lines.empty()) fail_input(path, "contents", "no tokens (empty vocabulary file)");
  std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) { return a.rank < b.rank; });
  BpeRanks ranks;
  std::vector<size_t> line_of;  // line number of each rank, for duplicate-bytes errors
  for (size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    if (i > 0 && l.rank == lines[i - 1].rank)
      fail_input(path, "line " + std::to_string(l.line_no),
                 "duplicate rank " + std::to_string(l.rank) + " (also on line " + std::to_string(lines[i - 1].line_no) + ")");
    if (l.rank != int64_t(i))
      fail_input(path, "line " + std::to_string(l.line_no),
                 "rank " + std::to_string(l.rank) + " leaves a gap: rank " + std::to_string(i) +
                     " is missing (ranks must be 0..N-1)");
    if (!ranks.add(l.bytes)) {
      int32_t other = ranks.find(l.bytes);
      fail_input(path, "line " + std::to_string(l.line_no),
                 "duplicate token bytes (rank " + std::to_string(l.rank) + " repeats rank " + std::to_string(other) +
                     " from line " + std::to_string(line_of[other]) + ")");
    }
    line_of.push_back(l.line_no);
  }
  return ranks;
}

BpeRanks read_tiktoken_model(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_system("cannot open the vocabulary file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail_system("cannot read the vocabulary file", path);
  return parse_tiktoken_model(ss.str(), path);
}

std::string format_tiktoken_model(const BpeRanks& ranks) {
  std::string out;
  for (int32_t r = 0; r < ranks.size(); ++r) {
    out += base64_encode(ranks.bytes(r));
    out += ' ';
    out += std::to_string(r);
    out += '\n';
  }
  return out;
}

}  // namespace k3

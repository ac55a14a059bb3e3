// Token events -> client deltas (see choice.h).
#include "serve/choice.h"

namespace k3::serve {

std::string finish_reason(const std::string& engine_finish, const std::string& parsed_finish, bool stop_matched) {
  if (stop_matched) return "stop";
  if (engine_finish == "error" || engine_finish == "cancelled") return engine_finish;
  if (engine_finish == "length") return "length";
  return parsed_finish.empty() ? engine_finish : parsed_finish;
}

ChatChoice::ChatChoice(const ChatVocab& vocab, chat::StartIn start, std::vector<std::string> stop,
                       const std::string& call_id_prefix)
    : vocab_(&vocab),
      parser_([&] {
        chat::ParserOptions po;
        po.start = start;
        po.make_call_id = [call_id_prefix](int index) { return call_id_prefix + std::to_string(index); };
        return po;
      }()),
      dec_(vocab.tok),
      stop_(std::move(stop)) {}

std::vector<chat::Delta> ChatChoice::pass(std::vector<chat::Delta> ds) {
  std::vector<chat::Delta> out;
  for (chat::Delta& d : ds) {
    if (stop_.matched()) break;  // everything after a stop string is dropped
    if (d.kind == chat::Delta::Kind::finish) {
      parsed_finish_ = d.text;
      continue;
    }
    const bool text_kind = d.kind == chat::Delta::Kind::reasoning || d.kind == chat::Delta::Kind::content ||
                           d.kind == chat::Delta::Kind::tool_call_arguments;
    if (d.kind == chat::Delta::Kind::content) d.text = stop_.push(d.text);
    if (text_kind && d.text.empty()) continue;  // nothing to send
    if (d.kind != chat::Delta::Kind::content && d.kind != chat::Delta::Kind::reasoning && stop_.held() > 0) {
      // content is over (a tool call follows): what it held back can no longer become a stop string
      chat::Delta c;
      c.kind = chat::Delta::Kind::content;
      c.text = stop_.flush();
      chat::apply_delta(out_, c);
      out.push_back(std::move(c));
    }
    chat::apply_delta(out_, d);
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<chat::Delta> ChatChoice::feed(int32_t id) {
  std::vector<chat::Delta> ds;
  const bool ends = id == vocab_->markers.end_of_msg || (vocab_->eos && id == *vocab_->eos);
  if (vocab_->is_marker(id) || ends) {
    ds = parser_.feed_literal(dec_.flush());
    std::vector<chat::Delta> m =
        chat::feed_token(parser_, vocab_->markers, ends ? vocab_->markers.end_of_msg : id,
                         [](int32_t) { return std::string(); });
    ds.insert(ds.end(), m.begin(), m.end());
  } else if (vocab_->is_text(id)) {
    ds = chat::feed_token(parser_, vocab_->markers, id, [&](int32_t t) { return dec_.push(t); });
  }  // other special ids (media, reserved) and ids outside the vocabulary: no text
  return pass(std::move(ds));
}

std::vector<chat::Delta> ChatChoice::finish(const std::string& engine_finish) {
  std::vector<chat::Delta> ds = parser_.feed_literal(dec_.flush());
  std::vector<chat::Delta> tail = parser_.finish();
  ds.insert(ds.end(), tail.begin(), tail.end());
  std::vector<chat::Delta> out = pass(std::move(ds));
  if (const std::string rest = stop_.flush(); !rest.empty()) {
    chat::Delta c;
    c.kind = chat::Delta::Kind::content;
    c.text = rest;
    chat::apply_delta(out_, c);
    out.push_back(std::move(c));
  }
  out_.finish_reason = finish_reason(engine_finish, parsed_finish_, stop_.matched());
  return out;
}

TextChoice::TextChoice(const ChatVocab& vocab, std::vector<std::string> stop)
    : vocab_(&vocab), dec_(vocab.tok), stop_(std::move(stop)) {}

std::string TextChoice::feed(int32_t id) {
  if (ended_ || stop_.matched()) return {};
  const bool ends = id == vocab_->markers.end_of_msg || (vocab_->eos && id == *vocab_->eos);
  if (ends) {
    ended_ = true;
    std::string t = stop_.push(dec_.flush());
    text_ += t;
    return t;
  }
  if (id < 0 || id >= vocab_->tok.vocab_size()) return {};
  std::string t = stop_.push(dec_.push(id));
  text_ += t;
  return t;
}

std::string TextChoice::finish(const std::string& engine_finish) {
  std::string t = stop_.push(dec_.flush());
  t += stop_.flush();
  text_ += t;
  finish_ = serve::finish_reason(engine_finish, ended_ ? "stop" : "", stop_.matched());
  return t;
}

std::string token_text(const ChatVocab& vocab, int32_t id) {
  if (id < 0 || id >= vocab.tok.vocab_size()) return "";
  return vocab.tok.decode({id});
}

Json chat_logprob_entry(const ChatVocab& vocab, const GenerationEvent& ev) {
  auto one = [&](int32_t id, float lp) {
    Json j = Json::object();
    j["token"] = token_text(vocab, id);
    j["logprob"] = lp;
    Json bytes = Json::array();
    if (id >= 0 && id < vocab.tok.vocab_size())
      for (unsigned char c : vocab.tok.token_bytes(id)) bytes.push_back(int(c));
    j["bytes"] = bytes;
    return j;
  };
  Json e = one(ev.id, ev.logprob);
  Json top = Json::array();
  for (const TokenLogprob& t : ev.top) top.push_back(one(t.id, t.logprob));
  e["top_logprobs"] = top;
  return e;
}

}  // namespace k3::serve

// One choice of a completion: the engine's token events -> what the client is sent.
//  - ChatChoice: token-level truth (io/chat_parse.h feed_token): the four XTML control ids
//    are markers, every other ordinary id is decoded text (StreamDecoder, so a character split
//    across tokens comes out whole), any other special id is dropped; <|end_of_msg|> and [EOS]
//    end the message. Content deltas go through the stop strings (stop_matcher.h); reasoning
//    and tool calls do not. Markers never reach reasoning or content (the parser's rule), and
//    reasoning never reaches content.
//  - TextChoice (/v1/completions): raw decoded text (control ids as their names), no chat
//    parsing; the ending stop id itself is not text.
// Both keep what they emitted (result()), so the non-streamed response and the concatenated
// stream are the same by construction, and the logprob entries of every generated token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "infer/chat_vocab.h"
#include "infer/engine.h"
#include "io/chat_parse.h"
#include "io/stream_decoder.h"
#include "serve/api_error.h"
#include "serve/stop_matcher.h"

namespace k3::serve {

// finish_reason for the client from the engine's final event and what the choice saw.
// "error" and "cancelled" are passed on (the caller turns them into an error / nothing).
std::string finish_reason(const std::string& engine_finish, const std::string& parsed_finish, bool stop_matched);

class ChatChoice {
 public:
  ChatChoice(const ChatVocab& vocab, chat::StartIn start, std::vector<std::string> stop,
             const std::string& call_id_prefix);
  // A token event (not the final one): the deltas it completes, in order.
  std::vector<chat::Delta> feed(int32_t id);
  // The final event: the last deltas (the parser's closing, held-back content); sets finish.
  std::vector<chat::Delta> finish(const std::string& engine_finish);
  bool stop_matched() const { return stop_.matched(); }
  const chat::ParsedOutput& result() const { return out_; }  // finish_reason set by finish()

 private:
  std::vector<chat::Delta> pass(std::vector<chat::Delta> ds);
  const ChatVocab* vocab_;
  chat::OutputParser parser_;
  StreamDecoder dec_;
  StopMatcher stop_;
  chat::ParsedOutput out_;
  std::string parsed_finish_;
};

class TextChoice {
 public:
  TextChoice(const ChatVocab& vocab, std::vector<std::string> stop);
  std::string feed(int32_t id);
  std::string finish(const std::string& engine_finish);
  bool stop_matched() const { return stop_.matched(); }
  const std::string& text() const { return text_; }
  const std::string& finish_reason() const { return finish_; }

 private:
  const ChatVocab* vocab_;
  StreamDecoder dec_;
  StopMatcher stop_;
  std::string text_, finish_;
  bool ended_ = false;
};

// OpenAI chat logprobs entry of one generated token: {token, logprob, bytes, top_logprobs}.
Json chat_logprob_entry(const ChatVocab& vocab, const GenerationEvent& ev);
// The token's text as the API shows it (its bytes; invalid UTF-8 as U+FFFD; specials by name).
std::string token_text(const ChatVocab& vocab, int32_t id);

}  // namespace k3::serve

// Conversations as masked training sequences (see chat_tokens.h).
#include "posttrain/chat_tokens.h"

#include "core/error.h"
#include "io/chat_render.h"

namespace k3 {

int64_t ChatSequence::trained() const {
  int64_t n = 0;
  for (uint8_t m : loss) n += m;
  return n;
}

std::vector<chat::Segment> segment_suffix(const std::vector<chat::Segment>& prefix,
                                          const std::vector<chat::Segment>& longer, const std::string& what) {
  if (prefix.size() > longer.size() || !std::equal(prefix.begin(), prefix.end(), longer.begin()))
    fail(what + ": the rendering up to this point is not a prefix of the longer rendering");
  return {longer.begin() + std::ptrdiff_t(prefix.size()), longer.end()};
}

ChatSequence tokenize_conversation(const chat::Conversation& conv, const ChatVocab& vocab, const std::string& source,
                                   bool images) {
  // Image parts would render as bare placeholders with no encoder behind them, unless the
  // caller expands and encodes them (posttrain/image_task.h).
  for (const chat::Message& m : conv.messages)
    if (!images && !m.images.empty())
      fail_input(source, m.images[0].field, "image parts are not supported in post-training conversations (text only)");
  chat::Conversation full = conv;
  full.options.add_generation_prompt = false;
  const std::vector<chat::Segment> all = chat::render(full);
  // Segment -> [start, end) flag: trained or not.
  std::vector<uint8_t> seg_loss(all.size(), 0);
  bool any = false;
  for (size_t i = 0; i < conv.messages.size(); ++i) {
    if (conv.messages[i].role != chat::Role::assistant) continue;
    chat::Conversation pre = full, upto = full;
    pre.messages.assign(conv.messages.begin(), conv.messages.begin() + std::ptrdiff_t(i));
    pre.options.add_generation_prompt = true;
    upto.messages.assign(conv.messages.begin(), conv.messages.begin() + std::ptrdiff_t(i + 1));
    const std::string what = source + ": messages[" + std::to_string(i) + "]";
    const std::vector<chat::Segment> p = chat::render(pre), u = chat::render(upto);
    segment_suffix(p, u, what);
    segment_suffix(u, all, what);
    for (size_t k = p.size(); k < u.size(); ++k) seg_loss[k] = 1;
    any = true;
  }
  if (!any) fail(source + ": the conversation has no assistant message to train on");
  ChatSequence out;
  for (size_t k = 0; k < all.size(); ++k) {
    const std::vector<int32_t> ids = vocab.encode({all[k]});
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.loss.insert(out.loss.end(), ids.size(), seg_loss[k]);
  }
  return out;
}

}  // namespace k3

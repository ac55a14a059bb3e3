// The chat vocabulary of the released-layout fixture (tests/data/k3-release-tiny), loaded once
// and shared by the tests that render or parse XTML over it.
#pragma once
#include "common/fixture.h"
#include "infer/chat_vocab.h"
#include "model/checkpoint.h"

namespace k3::test {

inline const ChatVocab& tiny_vocab() {
  static const ChatVocab v = load_chat_vocab(open_model_dir(kReleaseTiny));
  return v;
}

}  // namespace k3::test

// The message of loading `text` as an rl.json (rl) or sft.json, written to DIR/c.json, or
// "no error": the bad-config tests of the post-training runs share it.
#pragma once
#include <string>

#include "common/fixture.h"
#include "core/error.h"
#include "posttrain/rl.h"
#include "posttrain/sft.h"

namespace k3::test {

inline std::string posttrain_config_error(const std::string& dir, const std::string& text, bool rl) {
  const std::string p = write_text(dir, "c.json", text);
  try {
    if (rl) load_rl_config(p);
    else load_sft_config(p);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

}  // namespace k3::test

// Helpers the post-training run tests share: the message of a bad config, and the first two
// legs of a resume test.
#pragma once
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/fixture.h"
#include "core/error.h"
#include "posttrain/rl.h"
#include "posttrain/sft.h"

namespace k3::test {

// The message of loading `text` as an rl.json (rl) or sft.json, written to DIR/c.json, or
// "no error".

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

// Runs `c` straight through into DIR/whole, then again into DIR/split stopped after step 1
// (which must leave trajectories buffered); returns the options that resume DIR/split.
inline RLOptions run_whole_then_stop_after_step_1(const RLConfig& c, const std::string& dir) {
  RLOptions o;
  o.quiet = true;
  o.out_dir = dir + "/whole";
  run_rl(c, o);
  o.out_dir = dir + "/split";
  o.stop_at_step = 1;
  run_rl(c, o);
  const nlohmann::json st = nlohmann::json::parse(file_bytes(dir + "/split/checkpoint/posttrain_state.json"));
  EXPECT_GT(st["state"]["buffered"].get<int64_t>(), 0) << "the stop left no trajectory mid-decode";
  o.resume = true;
  o.stop_at_step = -1;
  return o;
}

}  // namespace k3::test

// serve/stop_matcher.h: stop strings on streamed text, over every chunking of each case:
//  - the output is the text cut before the earliest stop string (the stop string never shown);
//  - a tail that could start a stop string is held back, and released when it cannot;
//  - overlapping and prefix-sharing stop strings; a match spanning many chunks; no stop strings.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "serve/stop_matcher.h"

using k3::serve::StopMatcher;

namespace {

std::string cut_reference(const std::string& text, const std::vector<std::string>& stops, bool* hit) {
  size_t best = std::string::npos;
  for (const auto& s : stops) best = std::min(best, text.find(s));
  *hit = best != std::string::npos;
  return *hit ? text.substr(0, best) : text;
}

// Every way to cut `text` into chunks at most 3 split points (and random ones), fed in order.
void check_all_chunkings(const std::string& text, const std::vector<std::string>& stops) {
  bool hit = false;
  const std::string want = cut_reference(text, stops, &hit);
  auto run = [&](const std::vector<size_t>& cuts) {
    StopMatcher m(stops);
    std::string got;
    size_t at = 0;
    for (size_t c : cuts) {
      got += m.push(text.substr(at, c - at));
      // what is shown is always a prefix of the answer
      ASSERT_EQ(want.compare(0, got.size(), got), 0) << "shown text is not a prefix: " << got;
      at = c;
    }
    got += m.push(text.substr(at));
    got += m.flush();
    EXPECT_EQ(got, want) << "text '" << text << "'";
    EXPECT_EQ(m.matched(), hit);
  };
  const size_t n = text.size();
  run({});
  for (size_t a = 0; a <= n; ++a) {
    run({a});
    for (size_t b = a; b <= n; ++b) run({a, b});
  }
  std::mt19937 rng(7);
  for (int t = 0; t < 200; ++t) {
    std::vector<size_t> cuts;
    size_t at = 0;
    while (at < n) {
      at += 1 + rng() % 3;
      if (at < n) cuts.push_back(at);
    }
    run(cuts);
  }
}

}  // namespace

TEST(StopMatcher, EveryChunkingCutsBeforeTheFirstStopString) {
  check_all_chunkings("Hello world, goodbye world", {"goodbye"});
  check_all_chunkings("abcabcabd tail", {"abcabd"});          // the held tail must restart inside itself
  check_all_chunkings("one two three", {"two", "one two"});    // earliest start wins
  check_all_chunkings("xx END yy END", {"END", "ND y"});
  check_all_chunkings("no stop here at all", {"STOP"});
  check_all_chunkings("ends with a partial ST", {"STOP"});     // held, then released by flush
  check_all_chunkings("caf\xc3\xa9 \xe2\x82\xac stop", {"\xe2\x82\xac s"});  // multi-byte stop string
  check_all_chunkings("\n\nUser:", {"\n\n"});
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldStartAStopString) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abc S"), "abc ");
  EXPECT_EQ(m.held(), 1u);
  EXPECT_EQ(m.push("T"), "");
  EXPECT_EQ(m.push("x"), "STx");  // "STx" cannot start STOP: released
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.push("OP and more"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.which(), "STOP");
  EXPECT_EQ(m.push("after"), "");  // nothing after a match
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, NoStopStringsPassesEverythingAtOnce) {
  StopMatcher m({});
  EXPECT_EQ(m.push("a"), "a");
  EXPECT_EQ(m.held(), 0u);
  EXPECT_FALSE(m.matched());
  StopMatcher e({""});  // an empty stop string is ignored, not a match everywhere
  EXPECT_EQ(e.push("abc"), "abc");
  EXPECT_FALSE(e.matched());
}

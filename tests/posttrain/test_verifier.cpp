// The arithmetic verifier on adversarial answers (posttrain/verifier.h), the reward table, and
// the calculator tool (posttrain/calculator.h).
#include <gtest/gtest.h>

#include "core/error.h"
#include "posttrain/calculator.h"
#include "posttrain/verifier.h"

using namespace k3;

TEST(Verifier, ExactCanonicalIntegersOnly) {
  EXPECT_EQ(verify_answer("132", "132"), Verdict::correct);
  EXPECT_EQ(verify_answer("  132\n", "132"), Verdict::correct);  // ASCII whitespace around is fine
  EXPECT_EQ(verify_answer("133", "132"), Verdict::wrong);
  EXPECT_EQ(verify_answer("-5", "-5"), Verdict::correct);
  EXPECT_EQ(verify_answer("5", "-5"), Verdict::wrong);
  EXPECT_EQ(verify_answer("0", "0"), Verdict::correct);
}

TEST(Verifier, AdversarialAnswersAreMalformed) {
  const char* bad[] = {
      "",                       // empty
      "   \n",                  // whitespace only
      "The answer is 132",      // extra text before
      "132.",                   // trailing punctuation
      "132 apples",             // extra text after
      "132 133",                // several answers
      "132\n132",               // the same answer twice
      "131 or 132",             // hedging
      "\xef\xbc\x91\xef\xbc\x93\xef\xbc\x92",  // fullwidth digits U+FF11 U+FF13 U+FF12
      "\xd9\xa1\xd9\xa3\xd9\xa2",              // Arabic-Indic digits U+0661 U+0663 U+0662
      "13\xc2\xb2",                            // a superscript two
      "1\xe2\x80\x8b" "32",                    // a zero-width space inside
      "\xc2\xa0" "132",                        // a no-break space is not ASCII whitespace
      "+132", "0132", "-0", "-", "132.0", "1,32", "1_32", "0x84", "1e2", "--132", "13-2",
      "<|close|>response<|sep|>132",  // marker text leaked into the content
  };
  for (const char* b : bad) EXPECT_EQ(verify_answer(b, "132"), Verdict::malformed) << "'" << b << "'";
  // The same adversarial forms of the right answer never count as correct.
  EXPECT_EQ(verify_answer("132 132", "132"), Verdict::malformed);
}

TEST(Verifier, ExpectedAnswerMustBeCanonical) {
  EXPECT_THROW(verify_answer("12", "012"), Error);
  EXPECT_THROW(verify_answer("12", ""), Error);
}

TEST(Verifier, RewardTable) {
  const RewardOptions o;  // format penalty 0.5, over budget -1
  EXPECT_EQ(reward_of(Verdict::correct, false, o), 1.0);
  EXPECT_EQ(reward_of(Verdict::wrong, false, o), 0.0);
  EXPECT_EQ(reward_of(Verdict::malformed, false, o), -0.5);
  // Over budget is -1 whatever the answer says (a correct answer too).
  EXPECT_EQ(reward_of(Verdict::correct, true, o), -1.0);
  EXPECT_EQ(reward_of(Verdict::malformed, true, o), -1.0);
}

TEST(Calculator, EvaluatesAndRefuses) {
  EXPECT_EQ(calculate("47*85").text, "3995");
  EXPECT_EQ(calculate(" 2 + 3 * (4 - 6) ").text, "-4");
  EXPECT_EQ(calculate("-3*-3").text, "9");
  EXPECT_TRUE(calculate("12").ok);
  for (const char* b : {"", "2+", "(2", "2)", "2/3", "abc", "9999999999*9999999999", "1 2"}) {
    const CalcResult r = calculate(b);
    EXPECT_FALSE(r.ok) << b;
    EXPECT_EQ(r.text.rfind("error: ", 0), 0u) << b;
  }
}

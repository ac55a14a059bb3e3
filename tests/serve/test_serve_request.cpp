// serve/request.h: request bodies -> engine requests.
//  - a valid chat body gives the conversation, sampling, limits, stop strings, n, logprobs,
//    stream options as sent (and the documented defaults when absent);
//  - each bad body (malformed JSON, invalid UTF-8, huge numbers, wrong types, unknown roles,
//    out-of-range values, a tools array that is not JSON schema, n < 1) is an ApiError with
//    the expected status and the field named as param;
//  - max_tokens against the context: default = the rest; a full or overflowing prompt fails;
//  - n choices are seeded seed + i.
#include <gtest/gtest.h>

#include <string>

#include "serve/request.h"

using k3::serve::ApiError;
using k3::serve::Json;

namespace {

struct Failure {
  int status = 0;
  std::string param, message;
};

Failure fails(const std::string& body, bool chat = true) {
  try {
    const Json j = k3::serve::parse_body(body);
    if (chat) k3::serve::parse_chat(j, 1);
    else k3::serve::parse_completion(j, 1);
  } catch (const ApiError& e) {
    return {e.status, e.param, e.what()};
  }
  return {};
}

const char* kMsg = R"("messages":[{"role":"user","content":"hi"}])";

}  // namespace

TEST(ServeRequest, ValidChatBody) {
  const Json body = k3::serve::parse_body(std::string("{") + kMsg + R"(,
    "model":"k3","temperature":0.5,"top_p":0.9,"top_k":40,"seed":42,"max_completion_tokens":77,
    "stop":["\n\n","END","END"],"n":3,"logprobs":true,"top_logprobs":2,"stream":true,
    "stream_options":{"include_usage":true},"reasoning_effort":"low","user":"ignored"})");
  const auto plan = k3::serve::parse_chat(body, 1);
  const auto& p = plan.params;
  EXPECT_EQ(p.model, "k3");
  EXPECT_DOUBLE_EQ(p.sampling.temperature, 0.5);
  EXPECT_DOUBLE_EQ(p.sampling.top_p, 0.9);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(p.max_tokens, 77);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n\n", "END"}));  // duplicates dropped
  EXPECT_EQ(p.n, 3);
  EXPECT_EQ(p.top_logprobs, 2);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  ASSERT_EQ(plan.conv.messages.size(), 1u);
  EXPECT_EQ(plan.conv.options.effort, k3::chat::Effort::low);
  EXPECT_TRUE(plan.conv.options.thinking);

  const auto reqs = k3::serve::make_requests(p, {1, 2, 3}, 50, {9});
  ASSERT_EQ(reqs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(reqs[i].sampling.seed, 42u + uint64_t(i));
    EXPECT_EQ(reqs[i].max_tokens, 50);
    EXPECT_EQ(reqs[i].top_logprobs, 2);
    EXPECT_EQ(reqs[i].stop_tokens, std::vector<int32_t>{9});
    EXPECT_EQ(reqs[i].prompt, (std::vector<int32_t>{1, 2, 3}));
  }
}

TEST(ServeRequest, Defaults) {
  const auto plan = k3::serve::parse_chat(k3::serve::parse_body(std::string("{") + kMsg + R"(,"reasoning_effort":"none"})"), 99);
  const auto& p = plan.params;
  EXPECT_DOUBLE_EQ(p.sampling.temperature, 1.0);
  EXPECT_DOUBLE_EQ(p.sampling.top_p, 1.0);
  EXPECT_EQ(p.sampling.top_k, 0);
  EXPECT_EQ(p.sampling.seed, 99u);  // the caller's draw
  EXPECT_FALSE(p.max_tokens);
  EXPECT_EQ(p.n, 1);
  EXPECT_EQ(p.top_logprobs, -1);
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(plan.conv.options.thinking);  // "none" turns thinking off
}

TEST(ServeRequest, BadBodiesNameTheField) {
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  const std::string m = kMsg;
  const std::vector<Case> cases = {
      {"{", 400, ""},
      {"[1,2]", 400, ""},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, ""},  // invalid UTF-8
      {"{" + m + ",\"max_tokens\":1e400}", 400, ""},                                  // overflow
      {"{}", 400, "messages"},
      {"{\"messages\":\"hi\"}", 400, "messages"},
      {"{\"messages\":[]}", 400, "messages"},
      {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content"},
      {"{" + m + ",\"max_tokens\":-1}", 400, "max_tokens"},
      {"{" + m + ",\"max_tokens\":0}", 400, "max_tokens"},
      {"{" + m + ",\"max_tokens\":\"10\"}", 400, "max_tokens"},
      {"{" + m + ",\"max_tokens\":2.5}", 400, "max_tokens"},
      {"{" + m + ",\"max_tokens\":99999999999999999999}", 400, "max_tokens"},
      {"{" + m + ",\"temperature\":-0.1}", 400, "temperature"},
      {"{" + m + ",\"temperature\":\"hot\"}", 400, "temperature"},
      {"{" + m + ",\"top_p\":0}", 400, "top_p"},
      {"{" + m + ",\"top_k\":-5}", 400, "top_k"},
      {"{" + m + ",\"seed\":1.5}", 400, "seed"},
      {"{" + m + ",\"n\":0}", 400, "n"},
      {"{" + m + ",\"n\":-3}", 400, "n"},
      {"{" + m + ",\"n\":1000}", 400, "n"},
      {"{" + m + ",\"stop\":5}", 400, "stop"},
      {"{" + m + ",\"stop\":[\"a\",1]}", 400, "stop[1]"},
      {"{" + m + ",\"stop\":\"\"}", 400, "stop"},
      {"{" + m + ",\"top_logprobs\":3}", 400, "top_logprobs"},
      {"{" + m + ",\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs"},
      {"{" + m + ",\"stream\":\"yes\"}", 400, "stream"},
      {"{" + m + ",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options"},
      {"{" + m + ",\"reasoning_effort\":\"extreme\"}", 400, "reasoning_effort"},
      {"{" + m + ",\"tool_choice\":\"sometimes\"}", 400, "tool_choice"},
      {"{" + m + ",\"response_format\":{\"type\":\"yaml\"}}", 400, "response_format.type"},
      {"{" + m + ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":5}}}", 422,
       "response_format.json_schema.schema"},
      {"{" + m + ",\"tools\":{}}", 400, "tools"},
      {"{" + m + ",\"tools\":[5]}", 400, "tools[0]"},
      {"{" + m + ",\"tools\":[{\"type\":\"function\"}]}", 422, "tools[0].function"},
      {"{" + m + ",\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}]}", 422, "tools[0].type"},
      {"{" + m + ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]}", 422, "tools[0].function.name"},
      {"{" + m + ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":\"object\"}}]}", 422,
       "tools[0].function.parameters"},
      {"{" + m + ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"obj\"}}}]}", 422,
       "tools[0].function.parameters.type"},
      {"{" + m + ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                 "\"properties\":{\"x\":{\"type\":5}}}}}]}",
       422, "tools[0].function.parameters.properties.x.type"},
      {"{" + m + ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"required\":\"x\"}}}]}", 422,
       "tools[0].function.parameters.required"},
  };
  for (const Case& c : cases) {
    const Failure f = fails(c.body);
    EXPECT_EQ(f.status, c.status) << c.body << " -> " << f.message;
    EXPECT_EQ(f.param, c.param) << c.body << " -> " << f.message;
    EXPECT_FALSE(f.message.empty()) << c.body;
  }
  // A valid tools array passes.
  EXPECT_EQ(fails("{" + m +
                  ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\","
                  "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"n\":{\"type\":[\"integer\","
                  "\"null\"]}},\"required\":[\"city\"]}}}]}")
                .status,
            0);
}

TEST(ServeRequest, Completions) {
  auto p = k3::serve::parse_completion(k3::serve::parse_body(R"({"prompt":"Once upon","logprobs":2,"max_tokens":5})"), 1);
  EXPECT_EQ(p.prompt, "Once upon");
  EXPECT_FALSE(p.prompt_is_ids);
  EXPECT_EQ(p.params.top_logprobs, 2);
  p = k3::serve::parse_completion(k3::serve::parse_body(R"({"prompt":[5,6,7]})"), 1);
  EXPECT_TRUE(p.prompt_is_ids);
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(fails(R"({"prompt":5})", false).param, "prompt");
  EXPECT_EQ(fails(R"({})", false).param, "prompt");
  EXPECT_EQ(fails(R"({"prompt":""})", false).param, "prompt");
  EXPECT_EQ(fails(R"({"prompt":[1,-2]})", false).param, "prompt[1]");
  EXPECT_EQ(fails(R"({"prompt":"x","echo":true})", false).param, "echo");
}

TEST(ServeRequest, MaxTokensAgainstTheContext) {
  k3::serve::CommonParams p;
  EXPECT_EQ(k3::serve::resolve_max_tokens(p, 100, 4096), 3996);
  p.max_tokens = 3996;
  EXPECT_EQ(k3::serve::resolve_max_tokens(p, 100, 4096), 3996);
  p.max_tokens = 3997;
  try {
    k3::serve::resolve_max_tokens(p, 100, 4096);
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_EQ(e.param, "max_tokens");
  }
  p.max_tokens.reset();
  EXPECT_THROW(k3::serve::resolve_max_tokens(p, 4096, 4096), ApiError);
}

TEST(ServeRequest, ErrorJsonShape) {
  const Json e = k3::serve::error_json(ApiError(429, "queue full", "", "queue_full"));
  EXPECT_EQ(e.dump(), R"({"error":{"message":"queue full","type":"rate_limit_error","param":null,"code":"queue_full"}})");
  EXPECT_EQ(k3::serve::error_json(401, "no").at("error").at("type"), "authentication_error");
  EXPECT_EQ(k3::serve::error_json(400, "x", "n").at("error").at("param"), "n");
}

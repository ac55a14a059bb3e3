// Image content parts over HTTP (serve/image_parts.h): the real server in process on
// 127.0.0.1, port 0, over the tiny released-layout model with its random vision encoder
// (tests/data/k3-release-tiny), queried with httplib's client:
//  - a greedy chat request with a PNG data URL gives token for token what `k3cpp generate
//    --image` gives on the same rendered prompt ids and the same file, and the same image as
//    a PPM gives the same reply;
//  - the prefix cache: the same image again is served from the cache past the image, another
//    image behind the same text only up to the image;
//  - bad input, each an OpenAI error object and the server keeps serving: an http(s) URL
//    (not fetched), a data URL without base64, bad base64, bytes that are no image, an image
//    over the pixel limit (413), a body over 8 MiB (413), a model without vision_config (400);
//  - n = 2 with an image: both choices give the greedy reply.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/cli_run.h"
#include "common/fixture.h"
#include "common/tiny_vocab.h"
#include "infer/chat_vocab.h"
#include "io/chat_json.h"
#include "io/chat_render.h"
#include "io/image.h"
#include "io/tiktoken_file.h"
#include "serve/choice.h"
#include "serve/server.h"

using k3::serve::Json;
namespace fs = std::filesystem;

namespace {

using k3::test::kReleaseTiny;

using k3::test::tiny_vocab;

struct VisionLive {
  std::unique_ptr<k3::serve::Server> server;
  std::thread thread;
  std::unique_ptr<httplib::Client> cli;

  explicit VisionLive(const std::string& dir, int64_t max_pixels = 1000) {
    k3::serve::ServerOptions so;
    so.port = 0;
    so.max_image_pixels = max_pixels;
    k3::EngineOptions eo;
    eo.ctx = 512;
    eo.state_budget_mb = 64;
    eo.prefill_chunk = 8;
    server = std::make_unique<k3::serve::Server>(so, eo);
    const int port = server->bind();
    thread = std::thread([this] { server->run(); });
    cli = std::make_unique<httplib::Client>("127.0.0.1", port);
    cli->set_read_timeout(60, 0);
    k3::LoadOptions lo;
    lo.dense_as_stored = true;
    lo.log = [](const std::string&) {};
    server->load(dir, lo);
  }
  ~VisionLive() {
    cli.reset();
    server->shutdown(std::chrono::milliseconds(2000));
    thread.join();
  }
  std::pair<int, Json> post(const Json& body) {
    auto r = cli->Post("/v1/chat/completions", body.dump(), "application/json");
    if (!r) return {-1, Json()};
    return {r->status, Json::parse(r->body, nullptr, false)};
  }
};

k3::Image random_image(int64_t h, int64_t w, uint64_t seed) {
  k3::Image img;
  img.height = h, img.width = w;
  img.rgb.resize(size_t(3 * h * w));
  std::mt19937_64 rng(seed);
  for (float& v : img.rgb) v = float(rng() % 256) / 255.0f;  // exact in 8 bits: PNG and PPM agree
  return img;
}

using k3::test::file_bytes;

Json image_request(const std::string& url, const std::string& text = "what is this?") {
  return Json{{"messages", Json::array({Json{{"role", "user"},
                                             {"content", Json::array({Json{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                                                      Json{{"type", "text"}, {"text", text}}})}}})},
              {"max_tokens", 8},
              {"temperature", 0},
              {"logprobs", true}};
}

std::string data_url(const std::string& bytes, const char* mime = "image/png") {
  return std::string("data:") + mime + ";base64," + k3::base64_encode(bytes);
}

// The tokens of a reply, from its logprobs entries.
std::vector<std::string> reply_tokens(const Json& r) {
  std::vector<std::string> t;
  for (const Json& e : r["choices"][0]["logprobs"]["content"]) t.push_back(e["token"].get<std::string>());
  return t;
}

void expect_error(const std::pair<int, Json>& r, int status, const std::string& code, const std::string& in_message) {
  EXPECT_EQ(r.first, status) << r.second.dump();
  ASSERT_TRUE(r.second.contains("error")) << r.second.dump();
  EXPECT_EQ(r.second["error"]["code"], code) << r.second.dump();
  EXPECT_NE(r.second["error"]["message"].get<std::string>().find(in_message), std::string::npos) << r.second.dump();
  EXPECT_TRUE(r.second["error"]["param"].is_string()) << r.second.dump();
}

}  // namespace

TEST(ServeVision, ImagePartReplyEqualsGenerateImage) {
  k3::test::TempDir tmp("k3_serve_vision");
  const k3::Image img = random_image(24, 24, 7);
  k3::save_image(tmp.sub("a.png"), img);
  k3::save_image(tmp.sub("a.ppm"), img);
  VisionLive live(kReleaseTiny);
  const Json body = image_request(data_url(file_bytes(tmp.sub("a.png"))));
  const auto [status, reply] = live.post(body);
  ASSERT_EQ(status, 200) << reply.dump();
  EXPECT_EQ(reply["usage"]["prompt_tokens"].get<int64_t>(),
            int64_t(tiny_vocab().encode(k3::chat::render(k3::chat::parse_request(body))).size()) + 8);  // 9 image tokens for 1 pad
  const std::vector<std::string> served = reply_tokens(reply);
  ASSERT_FALSE(served.empty());

  // generate --image on the same rendered prompt ids (one <|media_pad|>, which it expands).
  const std::vector<int32_t> ids = tiny_vocab().encode(k3::chat::render(k3::chat::parse_request(body)));
  auto join = [](const std::vector<int32_t>& v) {  // appended piece by piece (GCC 12's -Wrestrict misfires on a + b)
    std::string s;
    for (int32_t t : v) s.append(s.empty() ? "" : ",").append(std::to_string(t));
    return s;
  };
  const std::string ids_arg = join(ids), stop_arg = join(tiny_vocab().stop_ids());
  const k3::test::RunResult g =
      k3::test::run_k3cpp("generate " + kReleaseTiny + " --ids " + ids_arg + " --image " + tmp.sub("a.png") +
                          " --max-tokens 8 --ids-out --stop " + stop_arg);
  ASSERT_EQ(g.rc, 0) << g.err;
  std::vector<std::string> generated;
  std::stringstream ss(g.out);
  for (int32_t id; ss >> id;) generated.push_back(k3::serve::token_text(tiny_vocab(), id));
  // The server also reports the stop token it ended on; generate does not print it.
  std::vector<std::string> served_text = served;
  if (served_text.size() > generated.size()) served_text.resize(generated.size());
  EXPECT_EQ(served_text, generated) << g.err;
  EXPECT_GE(generated.size(), 4u) << g.out;  // not vacuous: several tokens compared
  EXPECT_GE(served.size(), generated.size());
  EXPECT_LE(served.size(), generated.size() + 1);

  // n = 2: both choices share the image rows and give the greedy reply.
  Json two = body;
  two["n"] = 2;
  const auto pair = live.post(two);
  ASSERT_EQ(pair.first, 200) << pair.second.dump();
  ASSERT_EQ(pair.second["choices"].size(), 2u);
  EXPECT_EQ(pair.second["choices"][0]["message"], reply["choices"][0]["message"]);
  EXPECT_EQ(pair.second["choices"][1]["message"], reply["choices"][0]["message"]);

  // The same pixels as a PPM: the same reply.
  const auto ppm = live.post(image_request(data_url(file_bytes(tmp.sub("a.ppm")), "image/x-portable-pixmap")));
  ASSERT_EQ(ppm.first, 200) << ppm.second.dump();
  EXPECT_EQ(reply_tokens(ppm.second), served);
  // The repeat was served from the prefix cache past the image (it starts at token 9 or so);
  // another image behind the same text only up to the image.
  const int64_t image_at = int64_t(std::find(ids.begin(), ids.end(), *tiny_vocab().control(k3::chat::kMediaPad)) - ids.begin());
  EXPECT_GT(ppm.second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), image_at + 9);
  k3::save_image(tmp.sub("b.png"), random_image(24, 24, 8));
  const auto other = live.post(image_request(data_url(file_bytes(tmp.sub("b.png")))));
  ASSERT_EQ(other.first, 200) << other.second.dump();
  EXPECT_LE(other.second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), image_at);
}

TEST(ServeVision, BadImagesAreOpenAIErrorsAndTheServerKeepsServing) {
  k3::test::TempDir tmp("k3_serve_vision");
  k3::save_image(tmp.sub("big.png"), random_image(40, 40, 1));  // 1600 pixels, over the limit of 1000
  k3::save_image(tmp.sub("ok.png"), random_image(16, 16, 2));
  VisionLive live(kReleaseTiny);
  expect_error(live.post(image_request("https://example.com/cat.png")), 400, "image_url_not_supported", "not fetched");
  expect_error(live.post(image_request("data:image/png,rawbytes")), 400, "invalid_image_url", "only base64");
  expect_error(live.post(image_request("file:///etc/passwd")), 400, "invalid_image_url", "expected a data URL");
  expect_error(live.post(image_request("data:image/png;base64,@@@@")), 400, "invalid_base64", "not valid base64");
  expect_error(live.post(image_request(data_url("hello, not an image"))), 400, "invalid_image",
               "not a PNG or binary PGM/PPM");
  expect_error(live.post(image_request(data_url(file_bytes(tmp.sub("ok.png")).substr(0, 60)))), 400, "invalid_image",
               "PNG");
  expect_error(live.post(image_request(data_url(file_bytes(tmp.sub("big.png"))))), 413, "image_too_large",
               "more than the limit of 1000");
  // A body over the 8 MiB limit (a 9 MiB data URL): 413 before anything is parsed.
  const auto huge = live.post(image_request("data:image/png;base64," + std::string(9 << 20, 'A')));
  EXPECT_EQ(huge.first, 413) << huge.second.dump();
  EXPECT_TRUE(huge.second.contains("error")) << huge.second.dump();
  const auto ok = live.post(image_request(data_url(file_bytes(tmp.sub("ok.png")))));
  EXPECT_EQ(ok.first, 200) << ok.second.dump();
}

TEST(ServeVision, ModelWithoutVisionRefusesImageParts) {
  // The tiny model with its config's vision_config removed (weights linked, not copied).
  k3::test::TempDir tmp("k3_serve_novision");
  for (const auto& e : fs::directory_iterator(kReleaseTiny))
    if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), tmp.sub(e.path().filename()));
  Json cfg = Json::parse(file_bytes(kReleaseTiny + "/config.json"));
  cfg.erase("vision_config");
  std::ofstream(tmp.sub("config.json")) << cfg.dump(2);
  k3::test::TempDir img("k3_serve_novision_img");
  k3::save_image(img.sub("a.png"), random_image(16, 16, 3));
  VisionLive live(tmp.path);
  expect_error(live.post(image_request(data_url(file_bytes(img.sub("a.png"))))), 400, "model_has_no_vision",
               "no vision_config");
  const auto text = live.post(Json{{"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 2}});
  EXPECT_EQ(text.first, 200) << text.second.dump();
}

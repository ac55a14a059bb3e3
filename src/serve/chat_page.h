// GET /: a small chat page embedded in the binary (no files to install, no external assets).
// It keeps the conversation in the page, posts it to /v1/chat/completions with stream: true,
// reads the SSE stream with fetch + a ReadableStream reader (events split on blank lines,
// `data:` lines joined, `[DONE]` ends), and shows reasoning_content dimmed in a collapsible
// block apart from the answer; tool calls are shown as name(arguments). Elements the browser
// test drives: #input, #send, #effort, #log; each reply is .msg.assistant with .reasoning
// (inside a <details>), .answer and .status ("done" when the stream ended).
#pragma once
#include <string_view>

namespace k3::serve {

std::string_view chat_page_html();

}  // namespace k3::serve

#include "io/long_text.h"

#include "io/utf8.h"

namespace k3 {

std::vector<std::pair<size_t, size_t>> split_long_text(std::string_view text, LongTextLimits lim) {
  std::vector<std::pair<size_t, size_t>> out;
  // A text of at most max_run_chars bytes has at most that many code points: nothing to cut.
  if (text.size() <= lim.max_run_chars && text.size() <= lim.chunk_chars) {
    if (!text.empty()) out.emplace_back(0, text.size());
    return out;
  }
  size_t i = 0;
  while (i < text.size()) {
    // One chunk of up to chunk_chars code points, split by runs as the reference's
    // _split_whitespaces_or_nonwhitespaces does (its run counter restarts on each change of
    // kind; only a run that exceeds the limit cuts).
    size_t slice_begin = i, chars = 0, run = 0;
    bool run_space = false;
    while (i < text.size() && chars < lim.chunk_chars) {
      const size_t at = i;
      const bool space = utf8::is_python_space(utf8::next(text, i));
      if (chars == 0) {
        run_space = space;
        run = 1;
      } else if (space != run_space) {
        run_space = space;
        run = 1;
      } else if (++run > lim.max_run_chars) {
        out.emplace_back(slice_begin, at);
        slice_begin = at;
        run = 1;
      }
      ++chars;
    }
    out.emplace_back(slice_begin, i);
  }
  return out;
}

}  // namespace k3

// libFuzzer target: the pipeline layout parser (weft::pipeline::parse_layout). Any input either
// parses to blocks per virtual stage, at least one stage and at most 100,000 of them, each
// holding 0 to 1,000,000 blocks (the parser's caps), or is refused with a weft::error that says
// it is about the pipeline layout. Anything else (another exception, a crash, a leak, a sanitizer
// report, a hang on a short input that expands to a long one) is a bug.
#include <weft/core/error.hpp>
#include <weft/pipeline/layout.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string& what, std::string_view input) {
  std::fprintf(stderr, "pipeline_layout_fuzz: %s; input (%zu bytes): \"%.*s\"\n", what.c_str(),
               input.size(), static_cast<int>(input.size() < 300 ? input.size() : 300),
               input.data());
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<std::vector<int>> parsed;
  try {
    parsed.emplace(weft::pipeline::parse_layout(text));
  } catch (const weft::error& e) {
    if (std::string_view(e.what()).find("pipeline layout") == std::string_view::npos) {
      fail("an error that does not say it is about the pipeline layout: " + std::string(e.what()),
           text);
    }
    return 0;
  }
  const std::vector<int>& layout = *parsed;
  if (layout.empty()) fail("a parsed layout without stages", text);
  if (layout.size() > 100'000)
    fail(std::to_string(layout.size()) + " stages (at most 100,000)", text);
  for (std::size_t v = 0; v < layout.size(); ++v) {
    if (layout[v] < 0 || layout[v] > 1'000'000) {
      fail("stage " + std::to_string(v) + " holds " + std::to_string(layout[v]) + " blocks", text);
    }
  }
  return 0;
}

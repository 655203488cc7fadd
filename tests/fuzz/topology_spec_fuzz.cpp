// libFuzzer target: the topology spec parser. Any input either parses to a cluster that
// to_string() writes back as a spec which parses to the same cluster, bit for bit, or is
// refused with a weft::error quoting the spec. Anything else (another exception, a crash, a
// leak, a sanitizer report, a hang) is a bug.
#include <weft/topology/topology.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "topology_spec_fuzz: %s\n", what.c_str());
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view spec(reinterpret_cast<const char*>(data), size);
  std::optional<weft::topology::cluster> parsed;
  try {
    parsed.emplace(weft::topology::parse(spec));
  } catch (const weft::error& e) {
    if (std::string_view(e.what()).find("topology") == std::string_view::npos) {
      fail("an error that does not say it is about the topology spec: " + std::string(e.what()));
    }
    return 0;
  }
  const auto& c = *parsed;
  if (c.size() < 1 || c.nodes() < 1)
    fail("a parsed cluster without devices: \"" + std::string(spec) + "\"");
  int devices = 0;
  for (int n = 0; n < c.nodes(); ++n)
    devices += c.devices_on(n);
  if (devices != c.size())
    fail("node sizes do not add up to the size: \"" + std::string(spec) + "\"");
  const std::string written = c.to_string();
  std::optional<weft::topology::cluster> again;
  try {
    again.emplace(weft::topology::parse(written));
  } catch (const weft::error& e) {
    fail("to_string() wrote \"" + written + "\" for \"" + std::string(spec) +
         "\", which parse() refuses: " + e.what());
  }
  if (!(*again == c))
    fail("\"" + std::string(spec) + "\" -> \"" + written +
         "\" does not read back to the same cluster");
  return 0;
}

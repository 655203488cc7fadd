// libFuzzer target: the checkpoint readers, which read files a crash or a disk may have
// damaged. An input is read as index.json (parse_index) and as a rank file (parse_header,
// then every byte of every entry it lists): each must either succeed or throw weft::error;
// any other exception, crash, out-of-bounds read, leak or undefined behaviour is a bug.
#include <weft/optim/checkpoint/format.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace ck = weft::optim::checkpoint;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const ck::index x = ck::parse_index(bytes, "fuzz/index.json");
    if (x.world < 1 || x.files.size() != static_cast<std::size_t>(x.world)) {
      std::fprintf(stderr,
                   "checkpoint_index_fuzz: parse_index accepted %zu files for a world of %d\n",
                   x.files.size(), x.world);
      std::abort();
    }
  } catch (const weft::error&) {
  }
  try {
    const ck::header h = ck::parse_header(bytes, "fuzz/rank.weft");
    // parse_header promises every entry lies inside the file: read each entry's bytes (an
    // out-of-bounds read is an ASan report) as verify() would.
    unsigned sum = 0;
    for (const auto& e : h.entries) {
      if (h.data_start + e.offset + e.bytes > size) {
        std::fprintf(stderr, "checkpoint_index_fuzz: entry %s ends past the file\n",
                     e.name.c_str());
        std::abort();
      }
      for (std::uint64_t i = 0; i < e.bytes; ++i)
        sum += data[h.data_start + e.offset + i];
    }
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const weft::error&) {
  }
  return 0;
}

// safetensors files: read as the test's own byte-level writer lays them out; written in blocks
// by four "ranks" at once and checked byte for byte by the test's own parser; cross-checked
// with the reference implementation (Python) where it is installed; every kind of damaged or
// lying file refused with an error that names the file, the problem and the tensor.
#include <weft/io/safetensors.hpp>
#include <weft/layer/matrix.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace st = weft::safetensors;
namespace fs = std::filesystem;

static_assert(st::element_size(st::dtype::bf16) == 2 && st::element_size(st::dtype::f64) == 8 &&
              st::element_size(st::dtype::boolean) == 1 && st::element_size(st::dtype::i32) == 4);
static_assert(st::dtype_name(st::dtype::bf16) == "BF16" &&
              st::dtype_name(st::dtype::boolean) == "BOOL");
static_assert(st::parse_dtype("F16") == st::dtype::f16 && st::parse_dtype("U8") == st::dtype::u8 &&
              !st::parse_dtype("F17") && !st::parse_dtype("f32"));

// --- the test's own encoding of the format: no weft code ---------------------------------------

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::uint64_t from_le64(const std::string& b, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}
template <class T>
std::string le_bytes(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v); // x86 and arm64 hosts are little-endian
  return s;
}
std::string f32(float v) { return le_bytes(v); }
std::string f64(double v) { return le_bytes(v); }
// bfloat16 of a value it holds exactly: the top half of the float.
std::string bf16_exact(float v) {
  const auto bits = std::bit_cast<std::uint32_t>(v);
  EXPECT_EQ(bits & 0xffffu, 0u) << v << " is not a bfloat16";
  return le_bytes(static_cast<std::uint16_t>(bits >> 16));
}
// binary16 of a normal value it holds exactly, from frexp: |v| = 1.f * 2^(E - 15).
std::string f16_exact(double v) {
  if (v == 0) return le_bytes(std::uint16_t{0});
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e); // m in [0.5, 1)
  const int biased = e - 1 + 15;
  const double frac = (2 * m - 1) * 1024;
  EXPECT_TRUE(biased >= 1 && biased <= 30 && frac == std::floor(frac))
      << v << " is not a normal half";
  const auto bits =
      static_cast<std::uint16_t>((v < 0 ? 0x8000 : 0) | (biased << 10) | static_cast<int>(frac));
  return le_bytes(bits);
}

// A whole file: the length field (len, or the JSON's own length), the JSON, the buffer.
void write_raw(const fs::path& p, const std::string& json, const std::string& buffer,
               std::uint64_t len = std::numeric_limits<std::uint64_t>::max()) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  const std::string bytes =
      le64(len == std::numeric_limits<std::uint64_t>::max() ? json.size() : len) + json + buffer;
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good());
}
std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The test's own reading of a compact header (as weft and the reference write it): finds a
// tensor's entry by its quoted name and takes the fields out of it.
struct raw_entry {
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;
};
struct raw_file {
  std::string bytes;
  std::uint64_t n = 0;
  std::string json;

  explicit raw_file(const fs::path& p) : bytes(slurp(p)) {
    n = from_le64(bytes, 0);
    json = bytes.substr(8, n);
  }
  static std::vector<std::uint64_t> numbers(const std::string& s) {
    std::vector<std::uint64_t> out;
    const char* p = s.c_str();
    while (*p != '\0') {
      char* next = nullptr;
      out.push_back(std::strtoull(p, &next, 10));
      p = *next == ',' ? next + 1 : next;
      if (next == p && *p != '\0') break;
    }
    return out;
  }
  [[nodiscard]] raw_entry entry(const std::string& name) const {
    const std::size_t at = json.find("\"" + name + "\":{");
    EXPECT_NE(at, std::string::npos) << name << " in " << json;
    if (at == std::string::npos) return {};
    const std::string e = json.substr(at, json.find('}', at) - at);
    auto field = [&](const std::string& key, char open, char close) {
      const std::size_t k = e.find("\"" + key + "\":" + open);
      EXPECT_NE(k, std::string::npos) << key << " in " << e;
      const std::size_t from = k + key.size() + 4;
      return e.substr(from, e.find(close, from) - from);
    };
    raw_entry r;
    r.dtype = field("dtype", '"', '"');
    r.shape = numbers(field("shape", '[', ']'));
    const std::vector<std::uint64_t> off = numbers(field("data_offsets", '[', ']'));
    EXPECT_EQ(off.size(), 2u) << e;
    if (off.size() == 2) r.begin = off[0], r.end = off[1];
    return r;
  }
  [[nodiscard]] std::string data(const std::string& name) const {
    const raw_entry e = entry(name);
    return bytes.substr(8 + n + e.begin, e.end - e.begin);
  }
};

template <class F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected a weft::error containing \"" << *needles.begin() << "\"";
  } catch (const weft::error& e) {
    for (const std::string& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

class safetensors_test : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("weft_safetensors_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// The test's values: exact in every float type (quarters up to 2^6).
double value(int k, std::size_t r, std::size_t c, std::size_t cols) {
  return static_cast<double>(r * cols + c) * 0.25 - 2 + k;
}

// --- reading what another writer wrote ---------------------------------------------------------

TEST_F(safetensors_test, ReadsTheFilesOfAnIndependentWriter) {
  // Entries out of offset order, metadata among them, spaces and newlines, no padding: all legal.
  const std::string json = R"({
  "proj": {"dtype": "F64", "shape": [3, 2], "data_offsets": [64, 112]},
  "emb": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
  "__metadata__": {"format": "pt", "step": "1200"},
  "ln.bias": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
  "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [64, 64]},
  "h16": {"dtype": "F16", "shape": [2, 2], "data_offsets": [32, 40]},
  "ids": {"dtype": "I64", "shape": [3], "data_offsets": [40, 64]}
})";
  const std::vector<float> emb{1.5f, -2.0f, 0.1f, 3.0f, 1e-3f, 100.0f};
  const std::vector<float> bias{1.0f, -0.5f, 3.25f, 256.0f};
  const std::vector<double> h16{1.0, -2.0, 0.5, 65504.0};
  const std::vector<double> proj{0.1, -1e10, 2.0, 3.0, 4.0, 1.0 / 3.0};
  std::string buffer;
  for (const float v : emb)
    buffer += f32(v);
  for (const float v : bias)
    buffer += bf16_exact(v);
  for (const double v : h16)
    buffer += f16_exact(v);
  for (const std::int64_t v : {7, -1, 50256})
    buffer += le_bytes(static_cast<std::int64_t>(v));
  for (const double v : proj)
    buffer += f64(v);
  ASSERT_EQ(buffer.size(), 112u);
  const std::string p = path("model.safetensors");
  write_raw(p, json, buffer);

  const st::header h = st::read_header(p);
  std::vector<std::string> names;
  for (const st::tensor_info& t : h.tensors)
    names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"emb", "ln.bias", "h16", "ids", "empty",
                                             "proj"})); // by offset
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"step", "1200"}}));
  EXPECT_EQ(h.data_start, 8 + json.size());
  EXPECT_EQ(h.file_size, 8 + json.size() + 112);
  const st::tensor_info& pr = h.at("proj");
  EXPECT_EQ(pr.type, st::dtype::f64);
  EXPECT_EQ(pr.shape, (std::vector<std::size_t>{3, 2}));
  EXPECT_EQ(pr.begin, 64u);
  EXPECT_EQ(pr.end, 112u);
  EXPECT_EQ(h.at("ids").type, st::dtype::i64);
  EXPECT_EQ(h.at("empty").elements(), 0u);
  expect_error([&] { (void)h.at("nope"); }, {"no tensor 'nope'"});

  std::vector<float> out(6, -99.0f);
  st::read_block(p, h, "emb", 0, 0, 2, 3, out.data(), 3);
  EXPECT_EQ(out, emb);
  out.assign(4, -99.0f);
  st::read_block(p, h, "ln.bias", 0, 0, 1, 4, out.data(), 4);
  EXPECT_EQ(out, bias);
  st::read_block(p, h, "h16", 0, 0, 2, 2, out.data(), 2);
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_EQ(out[i], static_cast<float>(h16[i]));
  out.assign(6, -99.0f);
  st::read_block(p, h, "proj", 0, 0, 3, 2, out.data(), 2);
  for (std::size_t i = 0; i < 6; ++i)
    EXPECT_EQ(out[i], static_cast<float>(proj[i])) << i;

  // A block inside: rows [1, 3) of column 1, into a buffer of leading dimension 3; the rest of
  // the buffer stays as it was.
  out.assign(6, -99.0f);
  st::read_block(p, h, "proj", 1, 1, 2, 1, out.data(), 3);
  EXPECT_EQ(out, (std::vector<float>{static_cast<float>(proj[3]), -99, -99,
                                     static_cast<float>(proj[5]), -99, -99}));
  st::read_block(p, h, "empty", 0, 0, 0, 5, nullptr, 5); // nothing to read
  expect_error([&] { st::read_block(p, h, "ids", 0, 0, 1, 3, out.data(), 3); },
               {"model.safetensors", "tensor 'ids'", "F32, F64, F16 and BF16 only, not I64"});
}

// --- writing in blocks, as four ranks do -------------------------------------------------------

struct block {
  std::string tensor;
  std::size_t row0, col0, rows, cols;
};

TEST_F(safetensors_test, FourRanksWriteBlocksThatReadBackByteForByte) {
  const std::vector<st::tensor_spec> specs{
      {"w", st::dtype::f32, {6, 10}},  // row splits
      {"h", st::dtype::f16, {5, 7}},   // column splits
      {"d", st::dtype::f64, {4, 6}},   // quadrants
      {"b", st::dtype::bf16, {10}},    // a 1-D tensor, split as one row
      {"ids", st::dtype::i32, {3}},    // never written: reads as zeros
      {"round", st::dtype::bf16, {2}}, // values bfloat16 must round
  };
  const std::map<std::string, std::string> meta{{"format", "pt"},
                                                {"note", "a \"quote\"\nand a line"}};
  const st::header h = st::plan(specs, meta);
  EXPECT_EQ(h.data_start % 8, 0u);
  EXPECT_EQ(h.file_size, h.data_start + 240 + 70 + 192 + 20 + 12 + 4);
  const std::string p = path("sharded.safetensors");
  st::create(p, h);

  const std::vector<std::vector<block>> ranks{
      {{"w", 0, 0, 2, 10},
       {"h", 0, 0, 5, 2},
       {"d", 0, 0, 2, 3},
       {"b", 0, 0, 1, 3},
       {"round", 0, 0, 1, 2}},
      {{"w", 2, 0, 2, 10}, {"h", 0, 2, 5, 2}, {"d", 0, 3, 2, 3}, {"b", 0, 3, 1, 3}},
      {{"w", 4, 0, 1, 10}, {"h", 0, 4, 5, 2}, {"d", 2, 0, 2, 3}, {"b", 0, 6, 1, 2}},
      {{"w", 5, 0, 1, 10}, {"h", 0, 6, 5, 1}, {"d", 2, 3, 2, 3}, {"b", 0, 8, 1, 2}},
  };
  auto kind = [](const std::string& t) { return t == "w" ? 0 : t == "h" ? 1 : t == "d" ? 2 : 3; };
  auto cols_of = [&](const std::string& t) {
    const st::tensor_info& i = h.at(t);
    return i.shape.size() == 2 ? i.shape[1] : i.shape[0];
  };
  // 1 + 3/512 is 3/4 of a bfloat16 step above 1: rounds up; 1 + 1/512 is 1/4: rounds down.
  const std::vector<float> round_values{1.0f + 3.0f / 512, 1.0f + 1.0f / 512};

  std::mutex failures_mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (const std::vector<block>& mine : ranks) {
    threads.emplace_back([&, mine] {
      try {
        for (const block& b : mine) {
          // The rank's copy has a leading dimension wider than the block, its padding NaN.
          const std::size_t ld = b.cols + 3;
          std::vector<float> src(b.rows * ld, std::numeric_limits<float>::quiet_NaN());
          for (std::size_t r = 0; r < b.rows; ++r) {
            for (std::size_t c = 0; c < b.cols; ++c) {
              src[r * ld + c] = b.tensor == "round"
                                    ? round_values[c]
                                    : static_cast<float>(value(kind(b.tensor), b.row0 + r,
                                                               b.col0 + c, cols_of(b.tensor)));
            }
          }
          st::write_block(p, h, b.tensor, b.row0, b.col0, b.rows, b.cols, src.data(), ld);
        }
      } catch (const std::exception& e) {
        const std::lock_guard lock(failures_mutex);
        failures.emplace_back(e.what());
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  ASSERT_TRUE(failures.empty()) << failures.front();

  // The bytes, by the test's own parser and encoders.
  const raw_file raw(dir_ / "sharded.safetensors");
  EXPECT_EQ(raw.n % 8, 0u);
  EXPECT_EQ(raw.json.find_last_not_of(' '), raw.json.find_last_of('}')); // padded with spaces
  EXPECT_EQ(raw.bytes.size(), h.file_size);
  EXPECT_EQ(raw.n + 8, h.data_start);
  for (const st::tensor_info& t : h.tensors) {
    const raw_entry e = raw.entry(t.name);
    EXPECT_EQ(e.dtype, st::dtype_name(t.type)) << t.name;
    EXPECT_EQ(e.shape, std::vector<std::uint64_t>(t.shape.begin(), t.shape.end())) << t.name;
    EXPECT_EQ(e.begin, t.begin) << t.name;
    EXPECT_EQ(e.end, t.end) << t.name;
  }
  auto expected = [&](const std::string& t, std::string (*enc)(double)) {
    const st::tensor_info& i = h.at(t);
    const std::size_t rows = i.shape.size() == 2 ? i.shape[0] : 1;
    const std::size_t cols = cols_of(t);
    std::string s;
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < cols; ++c)
        s += enc(value(kind(t), r, c, cols));
    }
    return s;
  };
  EXPECT_EQ(raw.data("w"), expected("w", [](double v) { return f32(static_cast<float>(v)); }));
  EXPECT_EQ(raw.data("h"), expected("h", [](double v) { return f16_exact(v); }));
  EXPECT_EQ(raw.data("d"), expected("d", [](double v) { return f64(v); }));
  EXPECT_EQ(raw.data("b"),
            expected("b", [](double v) { return bf16_exact(static_cast<float>(v)); }));
  EXPECT_EQ(raw.data("ids"), std::string(12, '\0'));
  EXPECT_EQ(raw.data("round"), le_bytes(std::uint16_t{0x3f81}) + le_bytes(std::uint16_t{0x3f80}));

  // The header as read equals the plan.
  const st::header g = st::read_header(p);
  ASSERT_EQ(g.tensors.size(), h.tensors.size());
  for (std::size_t i = 0; i < g.tensors.size(); ++i) {
    EXPECT_EQ(g.tensors[i].name, h.tensors[i].name);
    EXPECT_EQ(g.tensors[i].type, h.tensors[i].type);
    EXPECT_EQ(g.tensors[i].shape, h.tensors[i].shape);
    EXPECT_EQ(g.tensors[i].begin, h.tensors[i].begin);
    EXPECT_EQ(g.tensors[i].end, h.tensors[i].end);
  }
  EXPECT_EQ(g.metadata, meta);
  EXPECT_EQ(g.data_start, h.data_start);
  EXPECT_EQ(g.file_size, h.file_size);

  // Blocks of other shapes than were written: column splits of "w", row splits of "h" (whole
  // rows: one read), a column of "d", an inner block; each compared with the values.
  const std::vector<block> reads{{"w", 0, 0, 6, 4}, {"w", 0, 4, 6, 4}, {"w", 0, 8, 6, 2},
                                 {"w", 2, 5, 3, 3}, {"h", 1, 0, 3, 7}, {"h", 4, 6, 1, 1},
                                 {"d", 0, 5, 4, 1}, {"d", 1, 1, 2, 4}, {"b", 0, 0, 1, 10},
                                 {"b", 0, 2, 1, 5}};
  for (const block& b : reads) {
    const std::size_t ld = b.cols + 2;
    std::vector<float> out(b.rows * ld, -99.0f);
    st::read_block(p, g, b.tensor, b.row0, b.col0, b.rows, b.cols, out.data(), ld);
    for (std::size_t r = 0; r < b.rows; ++r) {
      for (std::size_t c = 0; c < ld; ++c) {
        const float want = c < b.cols ? static_cast<float>(value(kind(b.tensor), b.row0 + r,
                                                                 b.col0 + c, cols_of(b.tensor)))
                                      : -99.0f;
        EXPECT_EQ(out[r * ld + c], want)
            << b.tensor << " block at " << b.row0 << "," << b.col0 << ": " << r << "," << c;
      }
    }
  }
  std::vector<float> rounded(2);
  st::read_block(p, g, "round", 0, 0, 1, 2, rounded.data(), 2);
  EXPECT_EQ(rounded, (std::vector<float>{1.0f + 1.0f / 128, 1.0f}));
}

TEST_F(safetensors_test, MatrixViewsAndChunkedRuns) {
  // 1100 x 2000 F32 is 8.8 MB: whole-row blocks go in runs of the staging size, so one block
  // takes two writes; another tensor after it shows no run spills past its own.
  const st::header h =
      st::plan({{"big", st::dtype::f32, {1100, 2000}}, {"tail", st::dtype::f32, {2, 2}}});
  const std::string p = path("big.safetensors");
  st::create(p, h);
  weft::matrix<float> m(1100, 2000);
  for (std::size_t r = 0; r < m.rows(); ++r) {
    for (std::size_t c = 0; c < m.cols(); ++c)
      m.view()(r, c) = static_cast<float>(r * 2000 + c);
  }
  st::write_block(p, h, "big", 0, 0, weft::matrix_view<const float>(m.view()));
  weft::matrix<float> t(2, 2);
  for (std::size_t i = 0; i < 4; ++i)
    t.view()(i / 2, i % 2) = -1.0f - static_cast<float>(i);
  st::write_block(p, h, "tail", 0, 0, t.view());

  const raw_file raw(dir_ / "big.safetensors");
  const std::string big = raw.data("big");
  ASSERT_EQ(big.size(), 1100u * 2000 * 4);
  EXPECT_EQ(std::memcmp(big.data(), m.view().data(), big.size()), 0);
  EXPECT_EQ(raw.data("tail"), f32(-1) + f32(-2) + f32(-3) + f32(-4));

  weft::matrix<float> back(1100, 2000);
  st::read_block(p, st::read_header(p), "big", 0, 0, back.view());
  EXPECT_EQ(std::memcmp(back.view().data(), m.view().data(), big.size()), 0);
  // A block of columns: one read a row.
  weft::matrix<float> cols(1100, 3);
  st::read_block(p, h, "big", 0, 1997, cols.view());
  for (std::size_t r = 0; r < 1100; r += 99)
    EXPECT_EQ(cols.view()(r, 2), static_cast<float>(r * 2000 + 1999));
}

// --- the reference implementation ---------------------------------------------------------------

TEST_F(safetensors_test, AgreesWithThePythonReference) {
  if (std::system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";
  }
  const st::header h = st::plan(
      {{"w", st::dtype::f32, {3, 4}}, {"h", st::dtype::f16, {5}}, {"d", st::dtype::f64, {2, 2}}},
      {{"format", "pt"}, {"who", "weft"}});
  const std::string ours = path("weft.safetensors");
  const std::string theirs = path("python.safetensors");
  st::create(ours, h);
  auto fill = [&](const std::string& name, int k, std::size_t rows, std::size_t cols) {
    std::vector<float> v(rows * cols);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(value(k, i / cols, i % cols, cols));
    st::write_block(ours, h, name, 0, 0, rows, cols, v.data(), cols);
  };
  fill("w", 0, 3, 4);
  fill("h", 1, 1, 5);
  fill("d", 2, 2, 2);

  const std::string script = path("check.py");
  std::ofstream(script) << R"(import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
def grid(r, c, k):
    return np.arange(r * c, dtype=np.float64).reshape(r, c) * 0.25 - 2 + k
t = load_file(src)
assert t["w"].dtype == np.float32 and np.array_equal(
    t["w"], grid(3, 4, 0).astype(np.float32)), t["w"]
assert t["h"].dtype == np.float16 and np.array_equal(
    t["h"], grid(1, 5, 1).reshape(5).astype(np.float16)), t["h"]
assert t["d"].dtype == np.float64 and np.array_equal(t["d"], grid(2, 2, 2)), t["d"]
with safe_open(src, framework="numpy") as f:
    assert f.metadata() == {"format": "pt", "who": "weft"}, f.metadata()
save_file({"x": grid(2, 3, 3).astype(np.float32), "y": grid(1, 4, 4).reshape(4).astype(np.float16),
           "z": grid(3, 1, 5), "n": np.arange(5, dtype=np.int64) - 2},
          dst, metadata={"from": "python"})
)";
  ASSERT_EQ(std::system(("python3 '" + script + "' '" + ours + "' '" + theirs + "'").c_str()), 0)
      << "the reference refused or misread weft's file";

  const st::header g = st::read_header(theirs);
  EXPECT_EQ(g.metadata, (std::map<std::string, std::string>{{"from", "python"}}));
  EXPECT_EQ(g.at("x").type, st::dtype::f32);
  EXPECT_EQ(g.at("y").type, st::dtype::f16);
  EXPECT_EQ(g.at("z").type, st::dtype::f64);
  EXPECT_EQ(g.at("n").type, st::dtype::i64);
  EXPECT_EQ(g.at("z").shape, (std::vector<std::size_t>{3, 1}));
  auto check = [&](const std::string& name, int k, std::size_t rows, std::size_t cols) {
    std::vector<float> v(rows * cols);
    st::read_block(theirs, g, name, 0, 0, rows, cols, v.data(), cols);
    for (std::size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(v[i], static_cast<float>(value(k, i / cols, i % cols, cols))) << name << i;
  };
  check("x", 3, 2, 3);
  check("y", 4, 1, 4);
  check("z", 5, 3, 1);
  std::string n;
  for (std::int64_t i = -2; i < 3; ++i)
    n += le_bytes(i);
  EXPECT_EQ(raw_file(theirs).data("n"), n);
  const st::tensor_info& ni = g.at("n");
  EXPECT_EQ(raw_file(theirs).bytes.substr(g.data_start + ni.begin, ni.end - ni.begin), n);
}

// --- damaged and lying files -------------------------------------------------------------------

struct bad_case {
  const char* what;
  std::string json;
  std::size_t buffer_bytes;
  std::vector<std::string> needles;
  std::uint64_t length = std::numeric_limits<std::uint64_t>::max(); // else the length field's value
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  std::size_t b, std::size_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

TEST_F(safetensors_test, RefusesEveryDamagedOrLyingFile) {
  const std::string a = entry("a", "F32", "[2,3]", 0, 24);
  const std::string b = entry("b", "F32", "[4]", 24, 40);
  const std::string good = "{" + a + "," + b + "}";
  const std::vector<bad_case> cases{
      {"truncated by a byte",
       good,
       39,
       {"tensor 'b'", "[24, 40) reach past the end of the 39-byte", "truncated"}},
      {"extra trailing bytes",
       good,
       41,
       {"41 bytes", "tensors end at byte 40", "bytes [40, 41) belong to no tensor",
        "trailing bytes after tensor 'b'"}},
      {"header length past the file",
       good,
       40,
       {"header length " + std::to_string(good.size() + 41),
        "runs past the end of the file (" + std::to_string(good.size() + 40) + " bytes follow"},
       good.size() + 41},
      {"invalid JSON",
       "{" + a + "," + b,
       40,
       {"header JSON, byte " + std::to_string(good.size() - 1), "unexpected end"}},
      {"invalid JSON in an entry",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3,],\"data_offsets\":[0,24]}}",
       24,
       {"(in the entry of 'a')", "expected a value"}},
      {"end beyond the buffer",
       "{" + a + "," + entry("b", "F32", "[244]", 24, 1000) + "}",
       40,
       {"tensor 'b'", "data_offsets [24, 1000) reach past the end of the 40-byte data buffer"}},
      {"size and shape disagree",
       "{" + entry("a", "F32", "[5,6]", 0, 100) + "}",
       100,
       {"tensor 'a'", "data_offsets [0, 100) hold 100 bytes, but F32 [5, 6] needs 120"}},
      {"overlap",
       "{" + a + "," + entry("b", "F32", "[4]", 16, 32) + "}",
       32,
       {"tensor 'b'", "[16, 32) overlap tensor 'a' [0, 24)"}},
      {"hole",
       "{" + a + "," + entry("b", "F32", "[4]", 32, 48) + "}",
       48,
       {"bytes [24, 32)", "between tensor 'a' and tensor 'b'", "hole"}},
      {"hole at the start",
       "{" + entry("a", "F32", "[2,3]", 8, 32) + "}",
       32,
       {"bytes [0, 8)", "before tensor 'a'"}},
      {"unknown dtype",
       "{" + entry("a", "F17", "[2,3]", 0, 24) + "}",
       24,
       {"tensor 'a'", "unknown dtype 'F17'"}},
      {"dtype not a string",
       "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}",
       4,
       {"tensor 'a'", "\"dtype\" is the number 4, not a string"}},
      {"missing key",
       "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}}",
       24,
       {"tensor 'a'", "missing key \"shape\""}},
      {"unexpected key",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"foo\":1}}",
       4,
       {"tensor 'a'", "unexpected key 'foo'"}},
      {"key twice in an entry",
       "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       4,
       {"(in the entry of 'a')", "key 'dtype' appears twice"}},
      {"duplicate name",
       "{" + a + "," + entry("a", "F32", "[4]", 24, 40) + "}",
       40,
       {"tensor 'a' appears twice"}},
      {"shape not an array",
       "{" + entry("a", "F32", "\"2x3\"", 0, 24) + "}",
       24,
       {"tensor 'a'", "\"shape\" is a string"}},
      {"negative dimension",
       "{" + entry("a", "F32", "[-1]", 0, 24) + "}",
       24,
       {"tensor 'a'", "\"shape\" holds the number -1, not an integer"}},
      {"fractional offset",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}",
       4,
       {"tensor 'a'", "\"data_offsets\" holds the number 4.0"}},
      {"offset past 2^64",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}",
       4,
       {"tensor 'a'", "18446744073709551616, not an integer in [0, 2^64)"}},
      {"three offsets",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",
       4,
       {"tensor 'a'", "\"data_offsets\" is an array of 3, not [begin, end]"}},
      {"offsets backwards",
       "{" + entry("a", "F32", "[0]", 8, 4) + "}",
       8,
       {"tensor 'a'", "[8, 4] end before they begin"}},
      {"more than 2^64 bytes",
       "{" + entry("a", "F32", "[4294967296,4294967296]", 0, 4) + "}",
       4,
       {"tensor 'a'", "holds more than 2^64 bytes"}},
      {"metadata value not a string",
       "{\"__metadata__\":{\"k\":1}," + a + "}",
       24,
       {"\"__metadata__\" maps 'k' to the number 1, not a string"}},
      {"metadata not an object",
       "{\"__metadata__\":[]," + a + "}",
       24,
       {"\"__metadata__\" is an array"}},
      {"entry not an object",
       "{\"a\":[1]}",
       0,
       {"tensor 'a'", "the entry is an array, not an object"}},
      {"not UTF-8", "{" + entry("a\xff", "F32", "[2,3]", 0, 24) + "}", 24, {"not UTF-8 (byte 3)"}},
      {"lone surrogate",
       "{" + entry("a\\ud800", "F32", "[2,3]", 0, 24) + "}",
       24,
       {"lone high surrogate"}},
      {"not an object", "[1,2]", 0, {"does not start with '{'"}},
      {"leading space", " " + good, 40, {"does not start with '{'"}},
      {"empty header", "", 0, {"does not start with '{'"}},
      {"trailing text after the object", good + "x", 40, {"trailing characters"}},
  };
  const std::string p = path("bad.safetensors");
  for (const bad_case& c : cases) {
    SCOPED_TRACE(c.what);
    write_raw(p, c.json, std::string(c.buffer_bytes, '\x01'), c.length);
    try {
      (void)st::read_header(p);
      ADD_FAILURE() << "read_header accepted a file with " << c.what;
    } catch (const weft::error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("safetensors: " + p + ": "), std::string::npos) << m; // names the file
      for (const std::string& n : c.needles)
        EXPECT_NE(m.find(n), std::string::npos) << m;
    }
  }
  // The good file reads, so the cases above fail for their own reason.
  write_raw(p, good, std::string(40, '\x01'));
  EXPECT_EQ(st::read_header(p).tensors.size(), 2u);
  // Escaped and raw UTF-8 names read alike; unicode escapes decode to UTF-8.
  write_raw(p, "{" + entry("caf\\u00e9 \\ud83d\\ude00 \xc3\xa9", "U8", "[1]", 0, 1) + "}", "x");
  EXPECT_EQ(st::read_header(p).tensors.at(0).name, "caf\xc3\xa9 \xf0\x9f\x98\x80 \xc3\xa9");

  // Files too short for a length, and missing.
  std::ofstream(p, std::ios::binary | std::ios::trunc) << "abc";
  expect_error([&] { (void)st::read_header(p); },
               {p, "the file is 3 bytes, too short for the header length"});
  expect_error([&] { (void)st::read_header(path("missing.safetensors")); },
               {"missing.safetensors", "cannot open", "No such file or directory"});
}

// --- misuse of the writer and of blocks --------------------------------------------------------

TEST_F(safetensors_test, RefusesBadPlansAndBlocks) {
  expect_error(
      [] {
        (void)st::plan({{"a", st::dtype::f32, {2}}, {"a", st::dtype::f16, {2}}});
      },
      {"plan", "tensor 'a'", "named twice"});
  expect_error(
      [] {
        (void)st::plan({{"__metadata__", st::dtype::f32, {2}}});
      },
      {"\"__metadata__\" is reserved"});
  expect_error(
      [] {
        (void)st::plan({{"bad\xff", st::dtype::f32, {2}}});
      },
      {"a tensor name is not UTF-8"});

  const st::header h = st::plan({{"w", st::dtype::f32, {4, 5}},
                                 {"ids", st::dtype::i32, {3}},
                                 {"cube", st::dtype::f32, {2, 2, 2}}});
  const std::string p = path("w.safetensors");
  std::vector<float> buf(40);
  expect_error([&] { st::write_block(p, h, "w", 0, 0, 1, 5, buf.data(), 5); },
               {"w.safetensors", "cannot open", "No such file or directory"});
  st::create(p, h);
  expect_error([&] { st::write_block(p, h, "w", 3, 0, 2, 5, buf.data(), 5); },
               {"w.safetensors", "tensor 'w'",
                "write_block rows [3, 5), cols [0, 5) lie outside its 4 x 5"});
  expect_error([&] { st::read_block(p, h, "w", 0, 4, 1, 2, buf.data(), 2); },
               {"tensor 'w'", "read_block rows [0, 1), cols [4, 6) lie outside its 4 x 5"});
  expect_error([&] { st::write_block(p, h, "w", 0, 0, 2, 5, buf.data(), 4); },
               {"tensor 'w'", "leading dimension 4 < 5"});
  expect_error([&] { st::write_block(p, h, "nope", 0, 0, 1, 1, buf.data(), 1); },
               {"w.safetensors", "no tensor 'nope'"});
  expect_error([&] { st::write_block(p, h, "ids", 0, 0, 1, 3, buf.data(), 3); },
               {"tensor 'ids'", "write_block converts F32, F64, F16 and BF16 only, not I32"});
  expect_error([&] { st::read_block(p, h, "cube", 0, 0, 1, 1, buf.data(), 1); },
               {"tensor 'cube'", "shape [2, 2, 2] has 3 dimensions"});
  expect_error([&] { st::write_block(p, h, "w", 0, 0, 1, 5, nullptr, 5); },
               {"tensor 'w'", "null data"});

  // A header that is not this file's.
  const st::header other = st::plan({{"w", st::dtype::f32, {4, 6}}});
  expect_error([&] { st::read_block(p, other, "w", 0, 0, 1, 1, buf.data(), 1); },
               {"w.safetensors", "header describes"});
  // A header edited out of step with its JSON, or with a hole, is not written (moving offsets
  // may change the JSON's length too: either refusal will do).
  st::header moved = h;
  moved.data_start += 8;
  moved.file_size += 8;
  expect_error([&] { st::create(path("x.safetensors"), moved); },
               {"x.safetensors", "do not match its JSON"});
  st::header holed = h;
  holed.tensors[1].begin += 4;
  holed.tensors[1].end += 4;
  holed.tensors[2].begin += 4;
  holed.tensors[2].end += 4;
  holed.file_size += 4;
  try {
    st::create(path("x.safetensors"), holed);
    ADD_FAILURE() << "create wrote a header with a hole";
  } catch (const weft::error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.find("hole") != std::string::npos || m.find("do not match") != std::string::npos)
        << m;
  }
}

} // namespace

#pragma once
// safetensors blocks between memory and a file: an owned POSIX file descriptor, a tensor's
// block checked against its bounds, element conversions to and from float, and the runs of
// rows a block moves in, through bounded staging memory.
#include <weft/core/error.hpp>
#include <weft/core/half.hpp>
#include <weft/io/safetensors/header_rules.hpp>
#include <weft/io/safetensors/types.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace weft::detail::safetensors {

namespace st = weft::safetensors;

/// An open file descriptor, closed on scope exit; every failure names the file and errno.
class file {
public:
  file(const std::string& path, int flags, mode_t mode = 0) : path_(path) {
    do {
      fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) fail_errno("cannot open");
  }
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() {
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] std::uint64_t size() const {
    struct stat sb {};
    if (::fstat(fd_, &sb) != 0) fail_errno("cannot stat");
    return static_cast<std::uint64_t>(sb.st_size);
  }
  void read_at(void* buf, std::size_t n, std::uint64_t offset) const {
    auto* p = static_cast<char*>(buf);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, checked_offset(offset, n));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        fail_errno("cannot read " + std::to_string(n) + " bytes at byte " + std::to_string(offset));
      if (got == 0) fail(path_, "unexpected end of file at byte " + std::to_string(offset));
      p += got, n -= static_cast<std::size_t>(got), offset += static_cast<std::uint64_t>(got);
    }
  }
  void write_at(const void* buf, std::size_t n, std::uint64_t offset) const {
    const auto* p = static_cast<const char*>(buf);
    while (n > 0) {
      const ssize_t put = ::pwrite(fd_, p, n, checked_offset(offset, n));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0)
        fail_errno("cannot write " + std::to_string(n) + " bytes at byte " +
                   std::to_string(offset));
      p += put, n -= static_cast<std::size_t>(put), offset += static_cast<std::uint64_t>(put);
    }
  }
  void resize(std::uint64_t size) const {
    int rc = 0;
    do {
      rc = ::ftruncate(fd_, checked_offset(size, 0));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) fail_errno("cannot size the file to " + std::to_string(size) + " bytes");
  }
  /// Closes now, reporting what the kernel defers to close (on NFS, write errors).
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) fail_errno("cannot close");
  }

private:
  [[noreturn]] void fail_errno(const std::string& what) const {
    const int e = errno;
    fail(path_, what + ": " + std::generic_category().message(e));
  }
  [[nodiscard]] off_t checked_offset(std::uint64_t offset, std::size_t n) const {
    if (offset > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) - n) {
      fail(path_, "byte " + std::to_string(offset) + " is beyond what off_t addresses");
    }
    return static_cast<off_t>(offset);
  }

  std::string path_;
  int fd_ = -1;
};

/// A 1-D or 2-D tensor seen as rows x cols (1-D as one row, a scalar as 1 x 1).
struct grid {
  std::size_t rows = 1;
  std::size_t cols = 1;
};
inline grid as_grid(const st::tensor_info& t, std::string_view source) {
  if (t.shape.size() > 2) {
    fail(source, t.name,
         "shape " + shape_text(t.shape) + " has " + std::to_string(t.shape.size()) +
             " dimensions; blocks address 1-D and 2-D tensors");
  }
  if (t.shape.size() == 2) return {t.shape[0], t.shape[1]};
  return {1, t.shape.empty() ? 1 : t.shape[0]};
}

/// The tensor a block names, checked: a float type, the block inside its bounds, a file of
/// the header's size. Returns the tensor's grid.
inline grid check_block(const st::header& h, const st::tensor_info*& t, const std::string& path,
                        std::string_view tensor, std::size_t row0, std::size_t col0,
                        std::size_t rows, std::size_t cols, const void* data, std::size_t ld,
                        std::string_view what) {
  t = h.find(tensor);
  if (t == nullptr) fail(path, "no tensor '" + std::string(tensor) + "' in the header");
  if (!st::converts_to_float(t->type)) {
    fail(path, t->name,
         std::string(what) + " converts F32, F64, F16 and BF16 only, not " +
             std::string(st::dtype_name(t->type)));
  }
  const grid g = as_grid(*t, path);
  if (row0 > g.rows || rows > g.rows - row0 || col0 > g.cols || cols > g.cols - col0) {
    fail(path, t->name,
         std::string(what) + " rows " + range(row0, row0 + rows) + ", cols " +
             range(col0, col0 + cols) + " lie outside its " + std::to_string(g.rows) + " x " +
             std::to_string(g.cols));
  }
  if (rows > 1 && ld < cols) {
    fail(path, t->name,
         std::string(what) + ": leading dimension " + std::to_string(ld) + " < " +
             std::to_string(cols) + " columns");
  }
  if (rows > 0 && cols > 0 && data == nullptr)
    fail(path, t->name, std::string(what) + ": null data");
  return g;
}

inline void check_file_size(const file& f, const st::header& h, const std::string& path) {
  const std::uint64_t size = f.size();
  if (size != h.file_size) {
    fail(path, "the file is " + std::to_string(size) + " bytes, but the header describes " +
                   std::to_string(h.file_size) +
                   " (create() it with this header, or read_header() it)");
  }
}

inline void to_bytes(st::dtype type, const float* src, std::size_t n, unsigned char* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    switch (type) {
      case st::dtype::f32: std::memcpy(dst + 4 * i, &src[i], 4); break;
      case st::dtype::f64: {
        const double d = src[i];
        std::memcpy(dst + 8 * i, &d, 8);
        break;
      }
      case st::dtype::f16: {
        const std::uint16_t b = half(src[i]).bits();
        std::memcpy(dst + 2 * i, &b, 2);
        break;
      }
      default: {
        const std::uint16_t b = bfloat16(src[i]).bits();
        std::memcpy(dst + 2 * i, &b, 2);
        break;
      }
    }
  }
}

inline void from_bytes(st::dtype type, const unsigned char* src, std::size_t n, float* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    switch (type) {
      case st::dtype::f32: std::memcpy(&dst[i], src + 4 * i, 4); break;
      case st::dtype::f64: {
        double d = 0;
        std::memcpy(&d, src + 8 * i, 8);
        dst[i] = static_cast<float>(d);
        break;
      }
      case st::dtype::f16: {
        std::uint16_t b = 0;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = half::from_bits(b);
        break;
      }
      default: {
        std::uint16_t b = 0;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = bfloat16::from_bits(b);
        break;
      }
    }
  }
}

/// Calls io(first_row, row_count, file_offset) over the block in runs of rows that lie back to
/// back in the file (all of them when the block spans whole rows), each run at most
/// staging_bytes long (one row at least).
template <class F>
void for_each_run(const st::header& h, const st::tensor_info& t, grid g, std::size_t row0,
                  std::size_t col0, std::size_t rows, std::size_t cols, F&& io) {
  const std::size_t es = st::element_size(t.type);
  const std::size_t per_run =
      cols == g.cols ? std::max<std::size_t>(1, staging_bytes / (cols * es)) : 1;
  for (std::size_t r = 0; r < rows; r += per_run) {
    const std::size_t n = std::min(per_run, rows - r);
    io(r, n, h.data_start + t.begin + ((row0 + r) * g.cols + col0) * es);
  }
}

} // namespace weft::detail::safetensors

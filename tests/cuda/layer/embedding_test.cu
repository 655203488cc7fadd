// vocab_parallel_embedding on the device (weft::layer::cublas on emulated ranks' streams) at TP 1
// and 2, against a lookup and a token-order gradient computed here on the host from the device's
// own table and dy: the output and the table gradient bit for bit (the device groups tokens by id
// and adds each id's rows in token order, the host's order), over two steps that accumulate, the
// second's activations stashed and restored between forward and backward. Ids repeat heavily and
// the vocabulary (37) divides by neither TP size. Skipped, with the reason, without a GPU.
#include <weft/cuda/emulated.cuh>
#include <weft/layer/cuda/cublas.cuh>
#include <weft/layer/cuda/matrix.cuh>
#include <weft/layer/embedding.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/cuda.cuh"

namespace {

namespace wl = weft::layer;
namespace emulated = weft::cuda::emulated;

/// A device view's elements on the host (waits for s).
weft::matrix<float> download(weft::matrix_view<const float> d, cudaStream_t s) {
  weft::matrix<float> h(d.rows(), d.cols());
  if (h.size() != 0) {
    WEFT_CUDA_TRY(cudaMemcpy2DAsync(h.data(), d.cols() * sizeof(float), d.data(),
                                    d.ld() * sizeof(float), d.cols() * sizeof(float), d.rows(),
                                    cudaMemcpyDeviceToHost, s));
  }
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  return h;
}

TEST(DeviceEmbedding, LookupAndGradientBitForBitInTokenOrder) {
  WEFT_REQUIRE_DEVICE();
  constexpr std::size_t vocab = 37, hidden = 24, tokens = 96;
  std::vector<std::int32_t> ids(tokens);
  std::uint32_t x = 99;
  for (auto& id : ids) { // mostly a few ids, some anywhere in the vocabulary
    x = x * 1664525u + 1013904223u;
    id = static_cast<std::int32_t>((x >> 8) % ((x & 3) == 0 ? vocab : 5));
  }
  weft::matrix<float> dy(tokens, hidden);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t c = 0; c < hidden; ++c)
      dy(t, c) = 1.0f / static_cast<float>(3 + (t * hidden + c) % 113);
  for (const int tp : {1, 2}) {
    emulated::run(tp, [&](emulated::communicator& c) {
      const cudaStream_t s = c.stream();
      wl::vocab_parallel_embedding<float, emulated::communicator, wl::no_sequence_parallel,
                                   wl::cublas>
          emb(c, vocab, hidden, 5, 1, 0.02, wl::cublas(s));
      const wl::range vr = emb.vocab_range();
      const auto table = download(emb.weight(), s);
      weft::matrix<float, weft::device_space> y(tokens, hidden, s);
      auto ddy = weft::to_device(weft::matrix_view<const float>(dy.view()), s);
      weft::matrix<float> want_dw(vr.size(), hidden);
      for (int step = 1; step <= 2; ++step) {
        emb.forward(ids, y.view());
        if (step == 2) emb.restore(emb.stash());
        emb.backward(ddy.cview());
        for (std::size_t t = 0; t < tokens; ++t) {
          const auto id = static_cast<std::size_t>(ids[t]);
          if (id < vr.begin || id >= vr.begin + vr.size()) continue;
          for (std::size_t col = 0; col < hidden; ++col)
            want_dw(id - vr.begin, col) += dy(t, col);
        }
        const auto got_y = download(y.cview(), s);
        const auto got_dw = download(emb.parameters()[0].grad, s);
        std::size_t y_off = 0, dw_off = 0;
        for (std::size_t t = 0; t < tokens; ++t) {
          // The rows of this rank's ids (the others' come from their ranks in the all-reduce).
          const auto id = static_cast<std::size_t>(ids[t]);
          for (std::size_t col = 0; col < hidden; ++col) {
            if (id >= vr.begin && id < vr.begin + vr.size())
              y_off += got_y(t, col) != table(id - vr.begin, col);
          }
        }
        for (std::size_t r = 0; r < vr.size(); ++r)
          for (std::size_t col = 0; col < hidden; ++col)
            dw_off += got_dw(r, col) != want_dw(r, col);
        EXPECT_EQ(y_off, 0u) << "TP " << tp << ", rank " << c.rank() << ", step " << step;
        EXPECT_EQ(dw_off, 0u) << "TP " << tp << ", rank " << c.rank() << ", step " << step;
      }
      c.barrier(); // no rank frees its buffers while a peer's queued copy may read them
    });
  }
}

} // namespace

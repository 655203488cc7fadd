// weft demo: all-reduce across in-process ranks grouped into emulated nodes, with every
// algorithm, printed as an nccl-tests-style table.
//
//   weft_all_reduce [--topology SPEC] [--min-bytes B] [--max-bytes B] [--iters N] [--no-emulation]
//
// The topology groups the ranks (threads of this process) into nodes, which decides what
// hierarchical and automatic do; the local transport paces every transfer at its links
// (local::options::emulate_links), so the times show what that fabric would do, and the cost
// model prices each plan on the same links (column "model"). The default links are slow
// enough for this machine's memory to keep up with them when 8 ranks share 2 cores, and the
// reduce figure is roughly what each of them then gets; with --no-emulation the bytes move
// at memory speed and only the model follows the links.
#include <weft/weft.hpp>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct settings {
  std::string topology = "2x4,intra=shm:2GB/s:5us,inter=net:0.25GB/s:20us,reduce=3GB/s";
  bool emulate = true;
  std::size_t min_bytes = 4 << 10;
  std::size_t max_bytes = 16 << 20;
  int iters = 10;
};

// A whole number written with digits only: std::stoull took "-1" for 2^64 - 1 and "12abc" for 12.
template <class T>
bool whole_number(std::string_view v, T& n) {
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  return !v.empty() && ec == std::errc{} && end == v.data() + v.size();
}

// --min-bytes, --max-bytes: a whole number of floats, and at most 2^40, so that the sweep's
// `bytes *= 4` cannot overflow.
std::size_t bytes_arg(std::string_view flag, std::string_view v) {
  std::uint64_t n = 0;
  if (!whole_number(v, n) || n > (std::uint64_t{1} << 40)) {
    throw weft::error("weft_all_reduce: " + std::string(flag) +
                      " takes a number of bytes up to 2^40, not '" + std::string(v) + "'");
  }
  if (n % sizeof(float) != 0) {
    throw weft::error("weft_all_reduce: " + std::string(flag) + " " + std::string(v) +
                      " is not a whole number of floats: give a multiple of 4 bytes");
  }
  return static_cast<std::size_t>(n);
}

settings parse_args(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw weft::error("weft_all_reduce: " + std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--topology")
      s.topology = value();
    else if (a == "--min-bytes")
      s.min_bytes = bytes_arg(a, value());
    else if (a == "--max-bytes")
      s.max_bytes = bytes_arg(a, value());
    else if (a == "--iters") {
      const std::string v = value();
      if (!whole_number(v, s.iters) || s.iters < 1) {
        throw weft::error("weft_all_reduce: --iters takes a whole number from 1, not '" + v + "'");
      }
    } else if (a == "--no-emulation")
      s.emulate = false;
    else if (a == "--help" || a == "-h") {
      std::puts(
          "usage: weft_all_reduce [--topology SPEC] [--min-bytes B] [--max-bytes B] [--iters N] "
          "[--no-emulation]");
      std::exit(0);
    } else {
      throw weft::error("weft_all_reduce: unknown argument '" + std::string(a) + "' (try --help)");
    }
  }
  if (s.min_bytes < sizeof(float) || s.max_bytes < s.min_bytes || s.iters < 1) {
    throw weft::error("weft_all_reduce: need 4 <= --min-bytes <= --max-bytes and --iters >= 1");
  }
  return s;
}

struct algorithm_row {
  std::string_view name;
  std::function<void(weft::local::communicator&, std::span<const float>, std::span<float>)> run;
  weft::plan (*make_plan)(const weft::plan_request&); // null: automatic (asks the cost model)
};

template <class Algo>
algorithm_row row() {
  return {Algo::name,
          [](weft::local::communicator& c, std::span<const float> in, std::span<float> out) {
            weft::all_reduce<Algo>(c, in, out);
          },
          std::is_same_v<Algo, weft::algo::automatic> ? nullptr : &Algo::make_plan};
}

// Input of rank r: small integers, so every order of summation gives the exact answer.
float input(int r, std::size_t i) {
  return static_cast<float>(static_cast<int>((r * 7 + i * 13) % 11) - 5);
}

} // namespace

int main(int argc, char** argv) try {
  const settings s = parse_args(argc, argv);
  const auto cluster = weft::topology::parse(s.topology);
  const int p = cluster.size();
  const std::vector<algorithm_row> rows = {
      row<weft::algo::ring>(),
      row<weft::algo::tree>(),
      row<weft::algo::halving_doubling>(),
      row<weft::algo::direct>(),
      row<weft::algo::hierarchical<weft::algo::ring, weft::algo::ring>>(),
      row<weft::algo::hierarchical<weft::algo::direct, weft::algo::ring>>(),
      row<weft::algo::automatic>(),
  };
  std::vector<int> devices(static_cast<std::size_t>(p));
  std::vector<int> node_of(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    devices[static_cast<std::size_t>(r)] = r;
    node_of[static_cast<std::size_t>(r)] = cluster.node_of(r);
  }

  std::printf("# weft demo: all_reduce, float sum, %d in-process ranks\n", p);
  std::printf("# topology %s (%d nodes)\n", cluster.to_string().c_str(), cluster.nodes());
  std::printf("# time: measured here, %s; model: the cost model's price of the same plan\n",
              s.emulate ? "every transfer paced at the topology's links"
                        : "at memory speed (--no-emulation)");
  std::printf("# on those links; busbw = algbw * 2(n-1)/n as in nccl-tests; out of place\n#\n");
  std::printf("# %10s %12s %6s %6s %-38s %10s %8s %8s %7s %10s\n", "size", "count", "type", "redop",
              "algorithm", "time", "algbw", "busbw", "#wrong", "model");
  std::printf("# %10s %12s %6s %6s %-38s %10s %8s %8s %7s %10s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(us)");

  long long total_wrong = 0;
  double busbw_sum = 0;
  int busbw_n = 0;
  for (std::size_t bytes = s.min_bytes; bytes <= s.max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float);
    for (const auto& a : rows) {
      double seconds = 0;
      long long wrong = 0;
      std::string chosen(a.name);
      weft::local::run(
          cluster,
          [&](weft::local::communicator& c) {
            std::vector<float> in(count), out(count);
            for (std::size_t i = 0; i < count; ++i)
              in[i] = input(c.rank(), i);
            a.run(c, in, out); // warm-up, and the call that is checked
            std::int64_t bad = 0;
            for (std::size_t i = 0; i < count; ++i) {
              float want = 0;
              for (int r = 0; r < p; ++r)
                want += input(r, i);
              bad += out[i] == want ? 0 : 1;
            }
            weft::all_reduce<weft::algo::ring>(c, std::span(&bad, 1));
            c.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            for (int k = 0; k < s.iters; ++k)
              a.run(c, in, out);
            c.barrier();
            if (c.rank() == 0) {
              seconds =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                  s.iters;
              wrong = bad;
            }
          },
          weft::local::options{.emulate_links = s.emulate});
      weft::plan_request q{weft::collective::all_reduce, p, 0, count, 0, node_of, sizeof(float)};
      auto make = a.make_plan;
      if (make == nullptr) {
        const auto& pick =
            weft::algo::choose(q, cluster, devices, weft::local::communicator::peer_access);
        make = pick.make_plan;
        chosen = "automatic=" + std::string(pick.name);
      }
      const double model = weft::cost_model::price(weft::cost_model::plans_of(make, q), cluster,
                                                   devices, sizeof(float));
      const double algbw = static_cast<double>(bytes) / seconds / 1e9;
      const double busbw = algbw * (p > 1 ? 2.0 * (p - 1) / p : 1.0);
      busbw_sum += busbw;
      ++busbw_n;
      total_wrong += wrong;
      std::printf("  %10zu %12zu %6s %6s %-38s %10.1f %8.2f %8.2f %7lld %10.1f\n", bytes, count,
                  "float", "sum", chosen.c_str(), seconds * 1e6, algbw, busbw, wrong, model * 1e6);
    }
  }
  std::printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong == 0 ? "OK" : "WRONG");
  std::printf("# Avg bus bandwidth    : %.3f GB/s\n", busbw_n > 0 ? busbw_sum / busbw_n : 0.0);
  return total_wrong == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}

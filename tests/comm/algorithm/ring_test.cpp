#include <weft/comm/algorithm/ring.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;
using weft::algo::ring;

constexpr collective served[] = {collective::all_reduce, collective::reduce_scatter,
                                 collective::all_gather, collective::broadcast, collective::reduce};
static_assert(serves_exactly<ring>(served));

constexpr planner<ring> make{};

TEST(ring, serves_every_collective_but_all_to_all) {
  for (collective c : served)
    EXPECT_TRUE(ring::serves(c)) << weft::name_of(c);
  EXPECT_FALSE(ring::serves(collective::all_to_all));
  EXPECT_EQ(ring::name, "ring");
}

TEST(ring, every_collective_every_size) {
  for (collective c : served) {
    for (int p : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(p - 1), std::size_t(p + 3),
                            std::size_t{3000}}) {
        check_plans<ring, std::int32_t>(c, p, n, p - 1);
        check_plans<ring, float, weft::op::max>(c, p, n, 0);
        check_plans<ring, float, weft::op::min>(c, p, n, p / 3);
        check_plans<ring, double>(c, p, n, p / 2, pattern::random);
        check_plans<ring, std::int64_t, weft::op::prod>(c, p, n, (p + 1) / 2 % p);
        check_plans<ring, weft::half>(c, p, n, 0);
        check_plans<ring, weft::bfloat16>(c, p, n, p - 1);
      }
    }
  }
}

TEST(ring, every_root) {
  for (collective c : {collective::broadcast, collective::reduce}) {
    for (int p : {2, 3, 4, 5, 7, 9}) {
      for (int root = 0; root < p; ++root) {
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
          check_plans<ring, std::int32_t>(c, p, n, root);
          check_plans<ring, double>(c, p, n, root, pattern::random);
        }
      }
    }
  }
}

// Sizes past the chunk thresholds, so the default plans (4-byte elements) are pipelined.
TEST(ring, large) {
  constexpr std::size_t mib_floats = std::size_t{1} << 18;
  check_plans<ring, float>(collective::all_reduce, 2, 4 * mib_floats, 0,
                           pattern::random); // 2 chunks a block
  check_plans<ring, std::int32_t>(collective::all_reduce, 3, 4 * mib_floats + 5,
                                  0); // 2 chunks a block
  check_plans<ring, std::int32_t>(collective::reduce_scatter, 3, mib_floats + 3,
                                  0); // 2 chunks a block
  check_plans<ring, std::int32_t>(collective::all_gather, 2, 2 * mib_floats + 1,
                                  0);                                           // 3 chunks a block
  check_plans<ring, std::int32_t>(collective::broadcast, 5, mib_floats + 7, 3); // 5 chunks
  check_plans<ring, std::int32_t, weft::op::max>(collective::reduce, 4, mib_floats + 7,
                                                 1); // 5 chunks
}

// Many chunks on small counts: 4-element chunks, down to fewer elements than chunks.
TEST(ring, many_chunks) {
  for (collective c : served) {
    const std::size_t es = c == collective::broadcast || c == collective::reduce
                               ? ring::chain_chunk_bytes / 4
                               : ring::chunk_bytes / 4;
    for (int p : {1, 2, 3, 4, 5, 7, 9}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(p + 3), std::size_t{37},
                            std::size_t{4 * 9 * 6}}) {
        check_chunked<ring, std::int32_t>(c, p, n, p - 1, es);
        check_chunked<ring, double>(c, p, n, p / 2, es, pattern::random);
        check_chunked<ring, std::int64_t, weft::op::prod>(c, p, n, 0, es);
      }
    }
  }
}

TEST(ring, rejects_bad_rank_root_and_all_to_all) {
  EXPECT_THROW(make(collective::all_reduce, 4, 4, 10), weft::error);
  EXPECT_THROW(make(collective::all_reduce, 4, -1, 10), weft::error);
  EXPECT_THROW(make(collective::all_reduce, 0, 0, 10), weft::error);
  EXPECT_THROW(make(collective::broadcast, 4, 0, 10, 4), weft::error);
  EXPECT_THROW(make(collective::reduce, 4, 0, 10, -1), weft::error);
  EXPECT_THROW(make(collective::all_to_all, 4, 0, 10), weft::error);
}

// Ring all-reduce is bandwidth-optimal: a rank sends every block but the one it finishes in
// the reduce-scatter, then every block but the one it receives last, 2(p-1)/p n in all.
TEST(ring, all_reduce_sends_two_p_minus_one_over_p) {
  // n = 10 on 4 ranks: blocks of 3, 3, 2, 2. Rank r finishes block r and last receives block
  // r+1: rank 0 sends (10-3)+(10-3), rank 1 (10-3)+(10-2), rank 2 (10-2)+(10-2), rank 3
  // (10-2)+(10-3). The mean is 2*3/4*10 = 15.
  const std::size_t want[] = {14, 15, 16, 15};
  for (int r = 0; r < 4; ++r) {
    const plan pl = make(collective::all_reduce, 4, r, 10);
    EXPECT_EQ(elements_sent(pl), want[r]) << pl.to_string();
    EXPECT_EQ(elements_received(pl), want[(r + 3) % 4]) << pl.to_string();
  }
  // n = 7 on 3 ranks: blocks 3, 2, 2; 2*2/3*7 = 9.33 on average.
  const std::size_t want3[] = {(7 - 3) + (7 - 2), (7 - 2) + (7 - 2), (7 - 2) + (7 - 3)};
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(elements_sent(make(collective::all_reduce, 3, r, 7)), want3[r]);
  // 2^20 elements on 8 ranks divide evenly: exactly 2*7/8 * 2^20 = 1835008 each, whole
  // blocks (4-byte elements) or cut into chunks (64-byte elements: 8 MiB blocks).
  for (std::size_t es : {std::size_t{4}, std::size_t{64}}) {
    for (int r = 0; r < 8; ++r) {
      const plan pl = make(collective::all_reduce, 8, r, std::size_t{1} << 20, 0, es);
      EXPECT_EQ(elements_sent(pl), std::size_t{1835008});
      EXPECT_EQ(elements_received(pl), std::size_t{1835008});
    }
  }
  // Every count on 5 ranks: the total is 2(p-1) n, and no rank is more than two elements
  // (one per phase, of block rounding) off the mean.
  for (std::size_t n = 0; n < 40; ++n) {
    std::size_t total = 0;
    for (int r = 0; r < 5; ++r) {
      const std::size_t sent = elements_sent(make(collective::all_reduce, 5, r, n));
      total += sent;
      EXPECT_LE(sent * 5, 8 * n + 2 * 5) << "n " << n << " rank " << r;
      EXPECT_GE(sent * 5 + 2 * 5, 8 * n) << "n " << n << " rank " << r;
    }
    EXPECT_EQ(total, 8 * n);
  }
}

// Rounds are synchronisations: small messages take the minimum, and chunking adds one round
// per extra chunk, not one per chunk and step.
TEST(ring, rounds) {
  // Unchunked: 2(p-1) rounds of one send each for all-reduce, p-1 for the others.
  for (int r = 0; r < 5; ++r) {
    const plan pl = make(collective::all_reduce, 5, r, 1000);
    EXPECT_EQ(pl.rounds(), 8u) << pl.to_string();
    EXPECT_EQ(pl.steps().size(), 16u) << pl.to_string(); // a send and a receive per round
    EXPECT_EQ(make(collective::reduce_scatter, 5, r, 1000).rounds(), 4u);
    EXPECT_EQ(make(collective::all_gather, 5, r, 1000).rounds(), 4u);
  }
  // 2^20 elements of 64 bytes on 8 ranks: 8 MiB blocks, 8 chunks of 1 MiB: 14 + 7 rounds.
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(make(collective::all_reduce, 8, r, std::size_t{1} << 20, 0, 64).rounds(), 21u);
  // Blocks of 10 elements, 4 to a chunk: 3 chunks, 6 + 2 rounds; at most 3 sends a round.
  for (int r = 0; r < 4; ++r) {
    const plan pl = make(collective::all_reduce, 4, r, 40, 0, ring::chunk_bytes / 4);
    EXPECT_EQ(pl.rounds(), 8u) << pl.to_string();
    std::vector<int> sends(pl.rounds(), 0);
    for (const auto& s : pl.steps())
      sends[s.round] += s.kind == step_kind::send ? 1 : 0;
    const std::vector<int> want{1, 2, 3, 3, 3, 3, 2, 1};
    EXPECT_EQ(sends, want) << pl.to_string();
  }
  // Chains: 10 elements, 4 to a chunk, 3 chunks down 5 ranks, 3 + 5 - 2 = 6 rounds in all.
  // The chain's first rank only sends (rounds 0..2) and its last only receives (rounds
  // 3..5); a rank at position i in between receives in rounds i-1..i+1 and sends in rounds
  // i..i+2: 4 rounds of its own (plans number only the rounds a rank takes part in).
  const std::size_t es = ring::chain_chunk_bytes / 4;
  for (collective c : {collective::broadcast, collective::reduce}) {
    for (int r = 0; r < 5; ++r) {
      const int root = 2;
      const plan pl = make(c, 5, r, 10, root, es);
      const int pos = c == collective::broadcast ? (r - root + 5) % 5 : (r - root - 1 + 5) % 5;
      EXPECT_EQ(elements_sent(pl), pos < 4 ? 10u : 0u) << pl.to_string();
      EXPECT_EQ(elements_received(pl), pos > 0 ? 10u : 0u) << pl.to_string();
      EXPECT_EQ(pl.rounds(), pos == 0 ? 3u : (pos < 4 ? 4u : 3u)) << pl.to_string();
    }
  }
}

// The execution model requires that a send's source stays unchanged for its round. Check
// it on the plans themselves, independently of the values (a max reduction may write the
// same value back, which the serial model cannot see): within a round, no range a rank
// sends overlaps a range it writes. Where input and output may alias, they count as one.
TEST(ring, no_round_writes_what_it_sends) {
  struct range {
    int buf;
    std::size_t begin, end;
  };
  for (collective c : served) {
    const bool may_alias =
        c == collective::all_reduce || c == collective::broadcast || c == collective::reduce;
    const auto buf_of = [&](buffer b) {
      return static_cast<int>(b == buffer::input && may_alias ? buffer::output : b);
    };
    for (int p : {2, 3, 4, 5, 8}) {
      for (std::size_t es : {std::size_t{4}, ring::chain_chunk_bytes / 4, ring::chunk_bytes / 4}) {
        for (std::size_t n : {std::size_t{1}, std::size_t{10}, std::size_t{53}}) {
          for (int r = 0; r < p; ++r) {
            const plan pl = make(c, p, r, n, 1 % p, es);
            std::vector<std::vector<range>> sent(pl.rounds()), written(pl.rounds());
            for (const auto& s : pl.steps()) {
              if (s.kind == step_kind::send) {
                EXPECT_EQ(s.peer, (r + 1) % p) << "ring sends only to the right";
                sent[s.round].push_back({buf_of(s.src), s.src_offset, s.src_offset + s.count});
              } else {
                if (s.kind == step_kind::recv || s.kind == step_kind::recv_reduce) {
                  EXPECT_EQ(s.peer, (r + p - 1) % p) << "ring receives only from the left";
                }
                written[s.round].push_back({buf_of(s.dst), s.dst_offset, s.dst_offset + s.count});
              }
            }
            for (std::size_t t = 0; t < sent.size(); ++t) {
              for (const range& a : sent[t]) {
                for (const range& b : written[t]) {
                  EXPECT_FALSE(a.buf == b.buf && a.begin < b.end && b.begin < a.end)
                      << weft::name_of(c) << " p=" << p << " n=" << n << " round " << t << "\n"
                      << pl.to_string();
                }
              }
            }
          }
        }
      }
    }
  }
}

} // namespace

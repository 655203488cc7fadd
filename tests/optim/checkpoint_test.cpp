// Checkpoints: saved at DP=4 under zero<2>, loaded at DP=2 under zero<1> and at DP=8 under
// zero<3>, training continues bitwise as if uninterrupted (AdamW on integer-valued gradients,
// whose sums are exact on any number of ranks); a save that crashes leaves the previous
// checkpoint loadable; damaged files are reported with the file and the tensor.
#include <weft/optim/checkpoint.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "optim/support.hpp"

namespace {

using namespace weft;
using namespace weft::test::optim;
namespace wo = weft::optim;
namespace ck = weft::optim::checkpoint;
namespace fs = std::filesystem;

constexpr int batch = 24; // divides by 1, 2, 3, 4, 8
const wo::adamw rule{.lr = 0.01f, .weight_decay = 0.1f};
const wo::data_parallel_options opts{.bucket_elements = 5};

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& tag)
      : path(fs::temp_directory_path() / ("weft_ckpt_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Trains `steps` steps from the checkpoint in dir (or from the start) on dp ranks; optionally
// saves at the end; returns the parameters.
template <class Policy>
std::vector<float> resume(const l1_linear& m, int dp, const fs::path& dir, bool load, int steps,
                          bool save_after, ck::save_options so = {}) {
  std::vector<float> out;
  local::run(dp, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<Policy, float>(c, m.params, rule, opts);
    opt->set_parameters(m.initial());
    if (load) ck::load(*opt, c, dir);
    train_steps(*opt, m, batch * c.rank() / dp, batch * (c.rank() + 1) / dp, steps, 1.0f / batch);
    if (save_after) ck::save(*opt, c, dir, so);
    auto p = opt->gather_parameters();
    if (c.rank() == 0) out = p;
  });
  return out;
}

TEST(checkpoint, reshards_across_dp_sizes_and_stages_bitwise) {
  const l1_linear m(batch);
  const auto uninterrupted = train_parallel<wo::zero<2>>(m, batch, 4, rule, 10, 1.0f / batch, opts);
  temp_dir d("reshard");
  (void)resume<wo::zero<2>>(m, 4, d.path, false, 5, true);
  EXPECT_EQ(resume<wo::zero<1>>(m, 2, d.path, true, 5, false), uninterrupted);
  EXPECT_EQ(resume<wo::zero<3>>(m, 8, d.path, true, 5, false), uninterrupted);
  EXPECT_EQ((resume<wo::hybrid<wo::zero<2>, wo::zero<0>>>(m, 4, d.path, true, 5, false)),
            uninterrupted);
  EXPECT_EQ(resume<wo::zero<0>>(m, 3, d.path, true, 5, false), uninterrupted);
  // Without the checkpoint the continuation differs (the test can fail).
  EXPECT_NE(resume<wo::zero<1>>(m, 2, d.path, false, 5, false), uninterrupted);
}

TEST(checkpoint, a_crashed_save_leaves_the_previous_checkpoint_loadable) {
  const l1_linear m(batch);
  const auto uninterrupted = train_parallel<wo::zero<2>>(m, batch, 4, rule, 10, 1.0f / batch, opts);
  temp_dir d("crash");
  (void)resume<wo::zero<2>>(m, 4, d.path, false, 5, true); // the good checkpoint, step 5
  EXPECT_THROW(resume<wo::zero<2>>(m, 4, d.path, false, 7, true,
                                   {.crash = ck::simulated_crash::while_writing_rank_files}),
               error);
  EXPECT_THROW(resume<wo::zero<2>>(m, 4, d.path, false, 7, true,
                                   {.crash = ck::simulated_crash::before_index}),
               error);
  std::size_t leftovers = 0;
  for (const auto& f : fs::directory_iterator(d.path))
    leftovers += f.path().filename().string().find("g2-") == 0;
  EXPECT_GT(leftovers, 0u); // the crashed saves did leave files behind
  EXPECT_EQ(resume<wo::zero<1>>(m, 2, d.path, true, 5, false), uninterrupted);
  // A later good save cleans up what the crashes left, and only that: a user's files that
  // look alike stay.
  const std::vector<std::string> users = {"gpt-rank0.log", "grads-rank1.npy",
                                          "g2-rank0-of4.weft.bak", "g-rank0-of4.weft"};
  for (const auto& u : users)
    std::ofstream(d.path / u) << "mine";
  (void)resume<wo::zero<1>>(m, 2, d.path, true, 0, true);
  for (const auto& f : fs::directory_iterator(d.path)) {
    const auto name = f.path().filename().string();
    const bool user = std::find(users.begin(), users.end(), name) != users.end();
    EXPECT_TRUE(user || name == "index.json" || name.find("-of2.weft") != std::string::npos)
        << name;
  }
  for (const auto& u : users)
    EXPECT_TRUE(fs::exists(d.path / u)) << u << " was deleted";
}

std::vector<std::byte> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}
void spit(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// This rank's weights and state, all of it.
template <class Opt>
std::vector<float> shard_snapshot(Opt& opt) {
  std::vector<float> v;
  for (const auto& b : opt.buckets().buckets()) {
    const auto w = opt.shard_weights(b);
    v.insert(v.end(), w.begin(), w.end());
    for (std::size_t j = 0; j < opt.slots(); ++j) {
      const auto s = opt.shard_state(b, j);
      v.insert(v.end(), s.begin(), s.end());
    }
  }
  return v;
}

// What a load on 2 ranks says, every rank's message one after the other ("" if it loads).
std::string load_error(const l1_linear& m, const fs::path& dir) {
  std::vector<std::string> what(2);
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<1>, float>(c, m.params, rule, opts);
    opt->set_parameters(m.initial());
    try {
      ck::load(*opt, c, dir);
    } catch (const error& e) {
      what[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  return what[0] + (what[0].empty() || what[1].empty() ? "" : "\n") + what[1];
}

TEST(checkpoint, damage_is_reported_with_file_and_tensor) {
  const l1_linear m(batch);
  temp_dir d("damage");
  (void)resume<wo::zero<2>>(m, 4, d.path, false, 3, true);
  const auto idx = ck::parse_index(slurp(d.path / "index.json"));
  const fs::path victim = d.path / idx.files[1];
  const auto good = slurp(victim);
  const auto h = ck::parse_header(good, victim.string());
  ASSERT_FALSE(h.entries.empty());
  const auto& e = h.entries.back();

  auto flipped = good;
  flipped[static_cast<std::size_t>(h.data_start + e.offset + 1)] ^= std::byte{0x10};
  spit(victim, flipped);
  auto what = load_error(m, d.path);
  EXPECT_NE(what.find(victim.string()), std::string::npos) << what;
  EXPECT_NE(what.find(e.name), std::string::npos) << what;
  EXPECT_NE(what.find("checksum"), std::string::npos) << what;

  auto truncated = good;
  truncated.resize(static_cast<std::size_t>(h.data_start + e.offset + 2));
  spit(victim, truncated);
  what = load_error(m, d.path);
  EXPECT_NE(what.find(victim.string()), std::string::npos) << what;
  EXPECT_NE(what.find(e.name), std::string::npos) << what;
  EXPECT_NE(what.find("truncated"), std::string::npos) << what;

  // A load that fails leaves the optimizer as it was: the weights it was set to, no state.
  spit(victim, flipped);
  local::run(1, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<1>, float>(c, m.params, rule, opts);
    opt->set_parameters(m.initial());
    EXPECT_THROW(ck::load(*opt, c, d.path), error);
    EXPECT_EQ(opt->gather_parameters(), m.initial());
    EXPECT_EQ(opt->steps(), 0);
    for (const auto& b : opt->buckets().buckets()) {
      for (std::size_t j = 0; j < opt->slots(); ++j) {
        for (float x : opt->shard_state(b, j))
          EXPECT_EQ(x, 0.0f);
      }
    }
  });

  // Across ranks too: only the ranks whose shard holds the damaged part find it, and no rank
  // copies in what it read (not even the ranks whose own part is intact, which would otherwise
  // go on alone).
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<1>, float>(c, m.params, rule, opts);
    opt->set_parameters(m.initial());
    const auto before = shard_snapshot(*opt);
    std::string said;
    try {
      ck::load(*opt, c, d.path);
    } catch (const error& e) {
      said = e.what();
    }
    EXPECT_EQ(shard_snapshot(*opt), before) << "rank " << c.rank();
    EXPECT_EQ(opt->steps(), 0);
    // The test's damage lies in one rank's shard: that rank names it, the other the failure.
    EXPECT_NE(said.find(c.rank() == 0 ? "checksum" : "rank 0 could not load"), std::string::npos)
        << "rank " << c.rank() << ": " << said;
  });

  // A file in another's place: the header's rank and world must match the index.
  spit(victim, slurp(d.path / idx.files[0]));
  what = load_error(m, d.path);
  EXPECT_NE(what.find("holds rank 0 of 4, but"), std::string::npos) << what;
  EXPECT_NE(what.find("lists it as rank 1 of 4"), std::string::npos) << what;

  // An index that names one rank's file twice and another's not at all.
  spit(victim, good);
  const auto index_text = slurp(d.path / "index.json");
  std::string text(reinterpret_cast<const char*>(index_text.data()), index_text.size());
  const auto at = text.find("\"" + idx.files[1] + "\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at + 1, idx.files[1].size(), idx.files[0]);
  std::vector<std::byte> edited(text.size());
  std::memcpy(edited.data(), text.data(), text.size());
  spit(d.path / "index.json", edited);
  what = load_error(m, d.path);
  EXPECT_NE(what.find("lists it as rank 1 of 4"), std::string::npos) << what;
  spit(d.path / "index.json", index_text);
  EXPECT_EQ(load_error(m, d.path), "");
}

// What a fuzzer will do: every prefix and every single-byte change of a real file's header
// either parses or throws weft::error (never crashes, never reads outside the span).
TEST(checkpoint, parse_header_survives_truncation_and_flips) {
  const l1_linear m(batch);
  temp_dir d("fuzz");
  (void)resume<wo::zero<2>>(m, 2, d.path, false, 1, true);
  const auto idx = ck::parse_index(slurp(d.path / "index.json"));
  const auto good = slurp(d.path / idx.files[0]);
  const auto h = ck::parse_header(good);
  for (std::size_t n = 0; n < good.size(); ++n) {
    bool rejected = false;
    try {
      (void)ck::parse_header(std::span(good.data(), n));
    } catch (const error&) {
      rejected = true;
    }
    // No header is complete before data_start; from there on it may parse.
    if (n < h.data_start) {
      EXPECT_TRUE(rejected) << "a prefix of " << n << " bytes parsed";
    }
  }
  for (std::size_t i = 0; i < h.data_start; ++i) {
    for (std::byte x : {std::byte{0x01}, std::byte{0x20}, std::byte{0x80}}) {
      auto bad = good;
      bad[i] ^= x;
      try {
        (void)ck::parse_header(bad);
      } catch (const error&) {
      }
    }
  }
  EXPECT_THROW((void)ck::parse_index(std::span<const std::byte>()), error);
  const auto index_bytes = slurp(d.path / "index.json");
  for (std::size_t n = 0; n + 2 < index_bytes.size();
       ++n) { // (the last two bytes: "}" and a newline)
    EXPECT_THROW((void)ck::parse_index(std::span(index_bytes.data(), n)), error) << n;
  }
  // Counts kept in an int must fit one (a world of 2^32 + 1 must not wrap to 1).
  const std::string wraps =
      R"({"format": "weft-checkpoint-index", "generation": 1, "world": 4294967297, "step": 3, )"
      R"("rule": "sgd", )"
      R"("loss_scale": 1, "good_steps": 0, "slots": [], "files": ["a"], "tensors": []})";
  EXPECT_THROW((void)ck::parse_index(std::as_bytes(std::span(wraps.data(), wraps.size()))), error);
  std::string deep(100, '[');
  EXPECT_THROW((void)ck::parse_index(std::as_bytes(std::span(deep.data(), deep.size()))), error);
}

// Half parameters: the fp32 master weights and the loss scaler's state travel; the half
// copies are rebuilt from the masters.
TEST(checkpoint, half_parameters_keep_master_weights_and_loss_scale) {
  const l1_linear m(batch);
  temp_dir d("half");
  std::vector<float> saved;
  wo::data_parallel_options o = opts;
  o.scaling = {.initial = 1024.0f, .interval = 2};
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<2>, half>(c, m.params, rule, o);
    opt->set_parameters(m.initial());
    // Three good steps: the scale grew once (interval 2).
    train_steps(*opt, m, batch * c.rank() / 2, batch * (c.rank() + 1) / 2, 3, 1.0f / batch);
    EXPECT_EQ(opt->loss_scale(), 2048.0f);
    ck::save(*opt, c, d.path);
    auto p = opt->gather_parameters();
    if (c.rank() == 0) saved = p;
  });
  local::run(4, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<3>, half>(c, m.params, rule, o);
    ck::load(*opt, c, d.path);
    EXPECT_EQ(opt->loss_scale(), 2048.0f);
    EXPECT_EQ(opt->steps(), 3);
    EXPECT_EQ(opt->gather_parameters(), saved);
    // One more good step: the second of the interval.
    train_steps(*opt, m, batch * c.rank() / 4, batch * (c.rank() + 1) / 4, 1, 1.0f / batch);
    EXPECT_EQ(opt->loss_scale(), 4096.0f);
  });
}

// A half run's checkpoint resumed in float (or bf16) does not carry its loss scale over: the
// float run does not scale its loss and would multiply its gradients by 2048 unasked. And a
// float run's checkpoint resumed in half keeps the half run's own initial scale, not 1.
TEST(checkpoint, the_loss_scale_follows_the_optimizer_that_scales) {
  const l1_linear m(batch);
  temp_dir d("scale");
  wo::data_parallel_options o = opts;
  o.scaling = {.initial = 1024.0f, .interval = 2};
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<1>, half>(c, m.params, rule, o);
    opt->set_parameters(m.initial());
    train_steps(*opt, m, batch * c.rank() / 2, batch * (c.rank() + 1) / 2, 3, 1.0f / batch);
    EXPECT_EQ(opt->loss_scale(), 2048.0f);
    ck::save(*opt, c, d.path);
  });
  local::run(2, [&](local::communicator& c) {
    auto f = wo::make_data_parallel<wo::zero<1>, float>(c, m.params, rule, o);
    ck::load(*f, c, d.path);
    EXPECT_EQ(f->loss_scale(), 1.0f);
    EXPECT_EQ(f->steps(), 3);
    auto b = wo::make_data_parallel<wo::zero<1>, bfloat16>(c, m.params, rule, o);
    ck::load(*b, c, d.path);
    EXPECT_EQ(b->loss_scale(), 1.0f);
    ck::save(*f, c, d.path);
  });
  local::run(2, [&](local::communicator& c) {
    auto h = wo::make_data_parallel<wo::zero<1>, half>(c, m.params, rule, o);
    ck::load(*h, c, d.path);
    EXPECT_EQ(h->loss_scale(), 1024.0f);
    EXPECT_EQ(h->steps(), 3);
  });
}

TEST(checkpoint, rejects_another_rule_or_model) {
  const l1_linear m(batch);
  temp_dir d("mismatch");
  (void)resume<wo::zero<2>>(m, 2, d.path, false, 1, true);
  EXPECT_THROW(local::run(2,
                          [&](local::communicator& c) {
                            auto opt = wo::make_data_parallel<wo::zero<1>, float>(c, m.params,
                                                                                  sgd_rule(), opts);
                            ck::load(*opt, c, d.path);
                          }),
               error);
  const mlp other(batch);
  EXPECT_THROW(local::run(2,
                          [&](local::communicator& c) {
                            auto opt = wo::make_data_parallel<wo::zero<1>, float>(c, other.params,
                                                                                  rule, opts);
                            ck::load(*opt, c, d.path);
                          }),
               error);
}

} // namespace

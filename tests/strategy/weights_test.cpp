// The strategy's weights in and out (save_weights / load_weights, safetensors under Hugging
// Face's names): saved at 2x2x2 under zero<3>, loaded at 1x4x2 under zero<1> and at one rank,
// every parameter bitwise the saved one; a trainer that loads another's initial weights trains
// exactly as that one does (bitwise at the same mesh); a GPT-2 file written here by the test's
// own writer, in Hugging Face's layout (Conv1D weights transposed, c_attn's outputs [q | k | v]),
// loads with every tensor where weft keeps it; Llama's round trip with replicated key/value
// heads; and every damaged or mismatched file is refused, naming the tensor, the trainer as it was.
#include <weft/comm/transport/local.hpp>
#include <weft/layer/llama.hpp>
#include <weft/strategy.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "strategy/strategy_support.hpp"

namespace {

namespace ts = weft::test::strategy;
namespace wl = weft::layer;
namespace fs = std::filesystem;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;
namespace recompute = wl::recompute;
namespace pipeline = weft::pipeline;
namespace optim = weft::optim;

template <class Mesh, class Sharding, class Model = wl::gpt_model>
using strategy_of = weft::strategy<Mesh, pipeline::one_f_one_b, Sharding, recompute::none,
                                   wl::no_sequence_parallel, Model>;

using full_tensors =
    std::map<std::string, std::vector<float>>; // weft name -> full_rows x full_cols

fs::path scratch(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("weft_weights_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// Every rank's slices put together into the full tensors (and checked to agree where ranks
// overlap).
template <class Trainer>
void collect(Trainer& t, full_tensors& into, std::mutex& mu) {
  const auto& values = t.parameter_values(); // collective: before the lock
  std::lock_guard lock(mu);
  for (const auto& q : values) {
    auto& full = into[q.name];
    full.resize(q.full_rows * q.full_cols);
    for (std::size_t r = 0; r < q.value.rows(); ++r)
      for (std::size_t c = 0; c < q.value.cols(); ++c)
        full[(q.row0 + r) * q.full_cols + q.col0 + c] = q.value(r, c);
  }
}

// Whether every slice of every rank equals `want` bit for bit.
template <class Trainer>
void expect_holds(Trainer& t, const full_tensors& want, const std::string& what) {
  for (const auto& q : t.parameter_values()) {
    ASSERT_TRUE(want.count(q.name)) << what << ": " << q.name;
    const auto& full = want.at(q.name);
    std::size_t differ = 0;
    for (std::size_t r = 0; r < q.value.rows(); ++r)
      for (std::size_t c = 0; c < q.value.cols(); ++c) {
        const float a = q.value(r, c), b = full[(q.row0 + r) * q.full_cols + q.col0 + c];
        differ += std::memcmp(&a, &b, sizeof a) != 0;
      }
    EXPECT_EQ(differ, 0u) << what << ": " << q.name;
  }
}

template <class S, class Model = wl::gpt_model>
full_tensors train_and_save(const typename Model::config& model, int steps, const std::string& path,
                            std::uint64_t seed = 1) {
  full_tensors saved;
  std::mutex mu;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(
        world, {.model = model, .micro_batch = 1, .global_batch = ts::global_batch, .seed = seed},
        ts::adamw_rule);
    for (int s = 0; s < steps; ++s) {
      const auto b = ts::batch_of(s);
      (void)t->train_step(b.ids, b.targets);
    }
    t->save_weights(path);
    collect(*t, saved, mu);
  });
  return saved;
}

template <class S, class Model = wl::gpt_model>
std::vector<double> load_and_train(const typename Model::config& model, const std::string& path,
                                   int steps, const full_tensors* expect, std::uint64_t seed = 5) {
  std::vector<double> losses;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(
        world, {.model = model, .micro_batch = 1, .global_batch = ts::global_batch, .seed = seed},
        ts::adamw_rule);
    t->load_weights(path);
    if (expect) expect_holds(*t, *expect, "rank " + std::to_string(world.rank()));
    std::vector<double> mine;
    for (int s = 0; s < steps; ++s) {
      const auto b = ts::batch_of(s);
      mine.push_back(t->train_step(b.ids, b.targets));
    }
    if (world.rank() == 0) losses = mine;
  });
  return losses;
}

TEST(weights, saved_at_2x2x2_zero3_load_bitwise_at_1x4x2_zero1_and_one_rank) {
  const std::string path = scratch("gpt.safetensors");
  const full_tensors saved =
      train_and_save<strategy_of<mesh<tp<2>, pp<2>, dp<2>>, optim::zero<3>>>(ts::shape, 3, path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  (void)load_and_train<strategy_of<mesh<tp<1>, pp<4>, dp<2>>, optim::zero<1>>>(ts::shape, path, 0,
                                                                               &saved);
  (void)load_and_train<strategy_of<mesh<tp<1>, pp<1>, dp<1>>, optim::zero<0>>>(ts::shape, path, 0,
                                                                               &saved);
  (void)load_and_train<strategy_of<mesh<tp<2>, pp<1>, dp<2>>, optim::zero<2>>>(ts::shape, path, 0,
                                                                               &saved);
}

// Loading another seed's initial weights makes a trainer the other one: the same losses bit for
// bit at the same mesh, and within float's reordering at another.
TEST(weights, a_trainer_that_loads_initial_weights_trains_as_the_one_that_saved_them) {
  using S = strategy_of<mesh<tp<2>, pp<2>, dp<2>>, optim::zero<3>>;
  const std::string path = scratch("initial.safetensors");
  (void)train_and_save<S>(ts::shape, 0, path, 1);
  std::vector<double> straight;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(
        world, {.model = ts::shape, .micro_batch = 1, .global_batch = ts::global_batch, .seed = 1},
        ts::adamw_rule);
    std::vector<double> mine;
    for (int s = 0; s < 6; ++s) {
      const auto b = ts::batch_of(s);
      mine.push_back(t->train_step(b.ids, b.targets));
    }
    if (world.rank() == 0) straight = mine;
  });
  const auto loaded = load_and_train<S>(ts::shape, path, 6, nullptr, 9);
  ASSERT_EQ(loaded.size(), straight.size());
  for (std::size_t s = 0; s < straight.size(); ++s)
    EXPECT_EQ(loaded[s], straight[s]) << "step " << s;
  const auto other = load_and_train<strategy_of<mesh<tp<1>, pp<4>, dp<2>>, optim::zero<1>>>(
      ts::shape, path, 6, nullptr, 9);
  ts::expect_same_losses(other, straight, "loaded at 1x4x2");
}

// --- a file of the test's own writer, in Hugging Face's GPT-2 layout --------------------------

struct raw_tensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<float> data;
};

// safetensors written by hand: the u64 length, a JSON header, the bytes (little-endian hosts).
void write_raw(const std::string& path, const std::vector<raw_tensor>& ts_,
               const std::string& dtype = "F32") {
  std::string json = "{";
  std::size_t at = 0;
  for (const auto& t : ts_) {
    const std::size_t bytes = t.data.size() * 4;
    json += (json.size() > 1 ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" + dtype +
            "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i)
      json += (i ? "," : "") + std::to_string(t.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + bytes) + "]}";
    at += bytes;
  }
  json += "}";
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t n = json.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << json;
  for (const auto& t : ts_)
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size() * 4));
}

// A GPT-2 checkpoint of random values as Hugging Face lays it out, and the tensors weft must hold
// after loading it (written from the layouts' definitions, not through weft's mapping).
struct hf_gpt2 {
  std::vector<raw_tensor> file;
  full_tensors weft;
};

hf_gpt2 make_hf_gpt2(const wl::gpt_config& c) {
  std::mt19937 g(42);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  hf_gpt2 m;
  const std::size_t h = c.hidden, f = c.ffn, d = c.hidden / c.heads;
  auto add = [&](const std::string& name, std::vector<std::size_t> shape) -> std::vector<float>& {
    std::size_t n = 1;
    for (auto s : shape)
      n *= s;
    raw_tensor t{name, shape, std::vector<float>(n)};
    for (auto& x : t.data)
      x = u(g);
    m.file.push_back(std::move(t));
    return m.file.back().data;
  };
  // a file tensor that weft keeps as it is / transposed (Conv1D: in x out in the file)
  auto same = [&](const std::string& hf, const std::string& w, std::vector<std::size_t> shape) {
    m.weft[w] = add(hf, shape);
  };
  auto transposed = [&](const std::string& hf, const std::string& w, std::size_t in,
                        std::size_t out) {
    const auto& t = add(hf, {in, out});
    auto& full = m.weft[w];
    full.resize(out * in);
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t i = 0; i < in; ++i)
        full[o * in + i] = t[i * out + o];
  };
  same("transformer.wte.weight", "embedding.wte.weight", {c.vocab, h});
  same("transformer.wpe.weight", "embedding.wpe.weight", {c.seq, h});
  for (std::size_t l = 0; l < c.layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".",
                      w = "block" + std::to_string(l) + ".";
    same(p + "ln_1.weight", w + "ln1.gamma", {h});
    same(p + "ln_1.bias", w + "ln1.beta", {h});
    // c_attn: in x 3h, output column j = part * h + head * d + i; weft's QKV row =
    // head * 3d + part * d + i.
    const auto& qkv = add(p + "attn.c_attn.weight", {h, 3 * h});
    const auto& qkv_b = add(p + "attn.c_attn.bias", {3 * h});
    auto& wq = m.weft[w + "attention.qkv.weight"];
    auto& wb = m.weft[w + "attention.qkv.bias"];
    wq.resize(3 * h * h);
    wb.resize(3 * h);
    for (std::size_t head = 0; head < c.heads; ++head)
      for (std::size_t part = 0; part < 3; ++part)
        for (std::size_t i = 0; i < d; ++i) {
          const std::size_t j = part * h + head * d + i, r = head * 3 * d + part * d + i;
          for (std::size_t in = 0; in < h; ++in)
            wq[r * h + in] = qkv[in * 3 * h + j];
          wb[r] = qkv_b[j];
        }
    transposed(p + "attn.c_proj.weight", w + "attention.out.weight", h, h);
    same(p + "attn.c_proj.bias", w + "attention.out.bias", {h});
    same(p + "ln_2.weight", w + "ln2.gamma", {h});
    same(p + "ln_2.bias", w + "ln2.beta", {h});
    transposed(p + "mlp.c_fc.weight", w + "mlp.fc1.weight", h, f);
    same(p + "mlp.c_fc.bias", w + "mlp.fc1.bias", {f});
    transposed(p + "mlp.c_proj.weight", w + "mlp.fc2.weight", f, h);
    same(p + "mlp.c_proj.bias", w + "mlp.fc2.bias", {h});
  }
  same("transformer.ln_f.weight", "head.norm.gamma", {h});
  same("transformer.ln_f.bias", "head.norm.beta", {h});
  same("lm_head.weight", "head.output.weight", {c.vocab, h});
  return m;
}

TEST(weights, a_hugging_face_gpt2_file_of_an_independent_writer_loads) {
  const hf_gpt2 m = make_hf_gpt2(ts::shape);
  const std::string path = scratch("hf_gpt2.safetensors");
  write_raw(path, m.file);
  (void)load_and_train<strategy_of<mesh<tp<1>, pp<1>, dp<1>>, optim::zero<0>>>(ts::shape, path, 0,
                                                                               &m.weft);
  (void)load_and_train<strategy_of<mesh<tp<2>, pp<2>, dp<2>>, optim::zero<3>>>(ts::shape, path, 0,
                                                                               &m.weft);
  // ... and weft writes it back as Hugging Face lays it out, byte for byte the same tensors.
  const std::string again = scratch("hf_gpt2_again.safetensors");
  weft::local::run(4, [&](weft::local::communicator& world) {
    auto t = strategy_of<mesh<tp<2>, pp<2>, dp<1>>, optim::zero<1>>::make(
        world, {.model = ts::shape, .micro_batch = 1, .global_batch = ts::global_batch},
        ts::adamw_rule);
    t->load_weights(path);
    t->save_weights(again);
  });
  const auto h = weft::safetensors::read_header(again);
  for (const auto& t : m.file) {
    std::size_t rows = t.shape.size() == 1 ? 1 : t.shape[0], cols = t.shape.back();
    std::vector<float> got(rows * cols);
    weft::safetensors::read_block(again, h, t.name, 0, 0, rows, cols, got.data(), cols);
    EXPECT_EQ(std::memcmp(got.data(), t.data.data(), got.size() * 4), 0) << t.name;
  }
  // A tied model's file has no lm_head; the output layer loads the token table.
  auto tied = ts::shape;
  tied.tie_embeddings = true;
  auto file = m.file;
  file.pop_back();
  write_raw(path, file);
  auto want = m.weft;
  want["head.output.weight"] = want["embedding.wte.weight"];
  (void)load_and_train<strategy_of<mesh<tp<2>, pp<2>, dp<1>>, optim::zero<1>>>(tied, path, 0,
                                                                               &want);
}

// GPT-2 files may carry each block's causal mask as a tensor: not a parameter, skipped.
TEST(weights, gpt2_causal_mask_buffers_are_skipped) {
  hf_gpt2 m = make_hf_gpt2(ts::shape);
  for (std::size_t l = 0; l < ts::shape.layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".attn.";
    m.file.push_back({p + "bias",
                      {1, 1, ts::shape.seq, ts::shape.seq},
                      std::vector<float>(ts::shape.seq * ts::shape.seq, 1.0f)});
    m.file.push_back({p + "masked_bias", {}, {-1e4f}});
  }
  const std::string path = scratch("hf_gpt2_buffers.safetensors");
  write_raw(path, m.file);
  (void)load_and_train<strategy_of<mesh<tp<2>, pp<1>, dp<1>>, optim::zero<1>>>(ts::shape, path, 0,
                                                                               &m.weft);
}

// The same shapes with another head count would reorder the fused QKV without any shape telling:
// the file's recorded configuration refuses it.
TEST(weights, a_file_of_another_configuration_is_refused) {
  const std::string path = scratch("heads4.safetensors");
  (void)train_and_save<strategy_of<mesh<tp<1>, pp<1>, dp<1>>, optim::zero<0>>>(ts::shape, 0, path);
  EXPECT_EQ(weft::safetensors::read_header(path).metadata.at("weft.heads"), "4");
  auto two_heads = ts::shape;
  two_heads.heads = 2;
  weft::local::run(2, [&](weft::local::communicator& world) {
    auto t = strategy_of<mesh<tp<2>, pp<1>, dp<1>>, optim::zero<1>>::make(
        world, {.model = two_heads, .micro_batch = 1, .global_batch = ts::global_batch},
        ts::adamw_rule);
    try {
      t->load_weights(path);
      ADD_FAILURE() << "loaded a 4-head file into a 2-head model";
    } catch (const weft::error& e) {
      EXPECT_NE(std::string(e.what()).find("the file's model has heads 4, this one 2"),
                std::string::npos)
          << e.what();
    }
  });
}

// A tied table exempt from weight decay: the head's copy on the last stage is exempt too, so the
// two stay one matrix through AdamW's decoupled decay.
TEST(weights, a_tied_table_and_its_copy_stay_equal_under_weight_decay) {
  auto tied = ts::shape;
  tied.tie_embeddings = true;
  tied.decay_embeddings = false;
  full_tensors table, copy;
  std::mutex mu;
  using S = strategy_of<mesh<tp<2>, pp<2>, dp<1>>, optim::zero<1>>;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(world, {.model = tied, .micro_batch = 1, .global_batch = ts::global_batch},
                     ts::adamw_rule);
    for (int s = 0; s < 5; ++s) {
      const auto b = ts::batch_of(s);
      (void)t->train_step(b.ids, b.targets);
    }
    full_tensors mine;
    std::mutex local;
    collect(*t, mine, local);
    std::lock_guard lock(mu);
    for (auto& [name, v] : mine) {
      if (name == "embedding.wte.weight") table[std::to_string(world.rank() % 2)] = v;
      if (name == "head.output.weight") copy[std::to_string(world.rank() % 2)] = v;
    }
  });
  ASSERT_EQ(table.size(), 2u);
  ASSERT_EQ(copy.size(), 2u);
  for (const auto& [tp_rank, v] : table) {
    // each TP rank's slice of the table, in its place of the full matrix (zeros elsewhere)
    EXPECT_EQ(std::memcmp(v.data(), copy.at(tp_rank).data(), v.size() * sizeof(float)), 0)
        << "TP rank " << tp_rank;
  }
}

TEST(weights, llama_with_replicated_key_value_heads_round_trips) {
  const wl::llama_config c{
      .vocab = 53, .hidden = 16, .heads = 4, .kv_heads = 2, .ffn = 24, .seq = 8, .layers = 4};
  const std::string path = scratch("llama.safetensors");
  const full_tensors saved =
      train_and_save<strategy_of<mesh<tp<4>, pp<1>, dp<2>>, optim::zero<2>, wl::llama_model>,
                     wl::llama_model>(c, 2, path);
  const auto h = weft::safetensors::read_header(path);
  ASSERT_NE(h.find("model.layers.3.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(h.at("model.layers.3.self_attn.k_proj.weight").shape,
            (std::vector<std::size_t>{8, 16}));
  EXPECT_EQ(h.at("model.layers.0.mlp.gate_proj.weight").shape, (std::vector<std::size_t>{24, 16}));
  EXPECT_EQ(h.tensors.size(), 1 + 4 * 9 + 2u);
  (void)load_and_train<strategy_of<mesh<tp<1>, pp<1>, dp<1>>, optim::zero<0>, wl::llama_model>,
                       wl::llama_model>(c, path, 0, &saved);
  (void)load_and_train<strategy_of<mesh<tp<2>, pp<2>, dp<2>>, optim::zero<3>, wl::llama_model>,
                       wl::llama_model>(c, path, 0, &saved);
}

// --- bad files ---------------------------------------------------------------------------------

// Loading `path` fails on every rank with a message containing `needle`, and the trainer goes on
// exactly as one that never tried.
void expect_refused(const std::string& path, const std::string& needle) {
  using S = strategy_of<mesh<tp<2>, pp<2>, dp<1>>, optim::zero<1>>;
  std::vector<double> after(2), untouched(2);
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t =
        S::make(world, {.model = ts::shape, .micro_batch = 1, .global_batch = ts::global_batch},
                ts::adamw_rule);
    try {
      t->load_weights(path);
      ADD_FAILURE() << "loaded " << path;
    } catch (const weft::error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    for (int s = 0; s < 2; ++s) {
      const auto b = ts::batch_of(s);
      const double l = t->train_step(b.ids, b.targets);
      if (world.rank() == 0) after[static_cast<std::size_t>(s)] = l;
    }
  });
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t =
        S::make(world, {.model = ts::shape, .micro_batch = 1, .global_batch = ts::global_batch},
                ts::adamw_rule);
    for (int s = 0; s < 2; ++s) {
      const auto b = ts::batch_of(s);
      const double l = t->train_step(b.ids, b.targets);
      if (world.rank() == 0) untouched[static_cast<std::size_t>(s)] = l;
    }
  });
  EXPECT_EQ(after, untouched) << "a refused load changed the trainer";
}

TEST(weights, bad_files_are_refused_naming_the_tensor_and_change_nothing) {
  const hf_gpt2 m = make_hf_gpt2(ts::shape);
  const std::string path = scratch("bad.safetensors");
  write_raw(path, m.file);
  fs::resize_file(path, fs::file_size(path) - 1);
  expect_refused(path, "lm_head.weight"); // the last tensor ends past the shortened file

  auto missing = m.file;
  missing.erase(missing.begin() + 3);
  write_raw(path, missing);
  expect_refused(path, "tensor '" + m.file[3].name + "' of the model is not in the file");

  auto extra = m.file;
  extra.push_back({"transformer.h.0.mlp.c_gate.weight", {1}, {0.0f}});
  write_raw(path, extra);
  expect_refused(path,
                 "tensor 'transformer.h.0.mlp.c_gate.weight' is not a parameter of the model");

  auto wrong_shape = m.file;
  wrong_shape[1].shape = {ts::shape.hidden, ts::shape.seq}; // wpe transposed
  write_raw(path, wrong_shape);
  expect_refused(path, "tensor 'transformer.wpe.weight' is [16, 8], the model's is [8, 16]");

  write_raw(path, m.file, "I32");
  expect_refused(path, "is I32; weights load from F32, F64, F16 or BF16");

  // A header whose offsets lie: the first tensor claims more bytes than its shape holds.
  write_raw(path, m.file);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    std::uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string json(n, ' ');
    f.read(json.data(), static_cast<std::streamsize>(n));
    const std::string from =
        "\"data_offsets\":[0," + std::to_string(ts::shape.vocab * ts::shape.hidden * 4) + "]";
    const auto at = json.find(from);
    ASSERT_NE(at, std::string::npos);
    const std::string to =
        "\"data_offsets\":[0," + std::to_string(ts::shape.vocab * ts::shape.hidden * 4 + 4) + "]";
    ASSERT_EQ(to.size(), from.size()); // the header keeps its length
    json.replace(at, from.size(), to);
    f.seekp(8);
    f.write(json.data(), static_cast<std::streamsize>(n));
  }
  expect_refused(path, "transformer.wte.weight");
  expect_refused(scratch("no_such_file.safetensors").string(), "no_such_file.safetensors");
}

} // namespace

// weft-plan: predicts the step time, throughput and memory of a TP x PP x DP layout of a
// transformer on a GPU cluster, or searches all layouts and explains the best; with --host, the
// memory of each rank of weft's own host trainer (sim/host.hpp) for such a layout.
//
//   weft-plan --model mt-nlg-530b --gpu a100-80gb --nodes 280 --global-batch 1920 --search
//   weft-plan --layers 80 --hidden 8192 --heads 64 --seq 4096 --vocab 32000 --gpu h100-sxm
//             --nodes 8 --global-batch 128 --tp 8 --pp 1 --zero 1 --json
//   weft-plan --model gpt-1t --gpu a100-80gb --nodes 384 --global-batch 3072 --tp 8 --pp 64
//             --schedule interleaved --chunks 2 --recompute full --trace step.json
//   weft-plan --host llama --layers 8 --hidden 256 --heads 8 --kv-heads 2 --seq 64 --vocab 1000
//             --global-batch 16 --tp 2 --pp 2 --dp 2 --zero 1
//
// Exit status: 0; 2 for bad arguments (the message says which and what it takes); 1 when the
// layout cannot be simulated or nothing fits.
#include <weft/sim.hpp>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

namespace sim = weft::sim;
namespace pl = weft::pipeline;

constexpr std::string_view usage_text =
    R"(usage: weft-plan MODEL CLUSTER --global-batch B (LAYOUT | --search) [output]

model, by preset or by shape:
  --model NAME         gpt3-175b | mt-nlg-530b | gpt-1t | bloom-176b | llama2-70b | llama3-405b
                       | nemotron4-340b
  --layers L --hidden H --heads A --seq S --vocab V
  --family F           gpt (default: learned positions, tied output layer, GELU MLP, dropout,
                       attention core unfused) | llama (rotary, SwiGLU, own output layer, no
                       dropout, attention core fused)
  --ffn F              FFN size (default 4H; with --family llama, Llama's: 8H/3 rounded up to
                       a multiple of 256)          --kv-heads G   grouped-query attention
  --gated              SwiGLU MLP                  --flash        fused attention
cluster (DGX nodes of the GPU: NVLink/NVSwitch inside, InfiniBand NICs between):
  --gpu NAME           a100-80gb | h100-sxm | h200
  --nodes N            nodes (default: enough for the layout)
  --gpus-per-node G    default 8, with a NIC per GPU
  --global-batch B     sequences per step
layout (one simulation):
  --tp T --pp P --dp D D defaults to the GPUs left: nodes * G / (T * C * P)
  --cp C               context parallelism (default 1): each sequence split over C ranks
                       (Megatron-core's --context-parallel-size; ring attention), gradients
                       reduced over D * C; with --search, every mesh takes it
  --schedule NAME      1f1b (default) | gpipe | interleaved | zb-h1
  --chunks V           model chunks per rank (interleaved; default 2 there)
  --micro-batch b      sequences per micro-batch (default 1)
  --zero Z             ZeRO stage 0..3 over the DP group (default 0; with --cp, DP x CP)
  --recompute R        none (default) | selective | full
  --sequence-parallel  split layer norms and dropout over TP
  --tp-across-nodes    place the TP group one rank per node (the mistake, to measure it)
  --tp-overlap         the backward's TP collectives overlap GEMMs (Megatron-LM since 2021)
  --tp-comm-overlap    every TP collective of forward and backward pipelined with its GEMM
                       (Megatron-core with Transformer Engine; needs --sequence-parallel; one
                       layout, not --search)
  --precision P        bf16 (default) | fp8 | fp8_cs | fp8_linear: the transformer Linears' GEMMs
                       in FP8 on the GPU's FP8 peak (h100-sxm, h200), each operand cast from bf16
                       at HBM speed; fp8: Transformer Engine with delayed scaling (Megatron-core,
                       NeMo), fp8_cs: its current scaling, fp8_linear: torchao's float8 Linear
  --grad-accum A       fused (default: the weight-gradient GEMMs accumulate, Megatron-LM since
                       2022) | fp16 (a separate 16-bit add per micro-batch) | fp32 (into fp32)
  --engine E           the pipeline engine: megatron (default: 1/tp of an activation per TP rank,
                       sends overlap compute, DP reduction behind the backward) | deepspeed
                       (DeepSpeed's: whole activations, blocking sends, DP reduction after the
                       last micro-batch; 1F1B and ZeRO 0-1 only; with --search, for PP > 1)
  --overlap-param-gather
                       with --zero 1: Megatron-LM's distributed optimizer, the updated weights'
                       all-gather behind the next step's first forward (one layout)
  --sharding S         the ZeRO stage as an engine runs it: fsdp (PyTorch FSDP FULL_SHARD) | fsdp2
                       (fully_shard) | deepspeed-zero3: ZeRO-3, each layer gathered before its
                       forward and backward one layer ahead, its gradient reduce-scattered after
                       its backward | megatron-distopt: ZeRO-1, Megatron-core's distributed
                       optimizer
  --shard-group N      with a ZeRO-3 --sharding: shard over groups of N DP ranks, replicated
                       across them (HSDP; N divides DP)
  --backward-prefetch P
                       with --sharding fsdp: pre (default, PyTorch's BACKWARD_PRE: the next
                       layer's gather runs beside this one's gradients) | post (BACKWARD_POST:
                       issued after them, so no compute hides it)
  --reshard-after-forward R
                       with --zero 3 or --sharding fsdp or fsdp2: yes (default: the backward
                       gathers each layer again) | no (the forward's gathered weights stay until
                       the backward: FSDP's SHARD_GRAD_OP, fully_shard(reshard_after_forward=False))
  --micro-batch-sync S with --zero 3 or --sharding fsdp or fsdp2: every (default: each micro-batch
                       gathers and reduce-scatters) | last (each gathers, only the step's last
                       reduce-scatters, the others accumulate whole gradients: no_sync(),
                       set_requires_gradient_sync(False)) | once (gathered by the step's first
                       forward, weights and gradients whole until its last backward);
                       weft::optim::zero<3> runs every and last (config.gradient_sync)
  --reduce-dtype T     bf16 (default: gradients reduced over DP in 16 bits) | fp32 (PyTorch FSDP's
                       MixedPrecision reduce_dtype=float32, Megatron-LM's
                       --accumulate-allreduce-grads-in-fp32): twice the gradients' bytes on the
                       wire and in memory; FSDP2 also accumulates whole gradients in it
  --optimizer-state S  bytes of optimizer state per weight: fp32 (default, 12: Adam's fp32 master
                       weights and moments) | remainders (10: 16-bit remainders of bf16 weights for
                       the master, fp32 moments; Apex's DistributedFusedAdam) | bf16 (4: bf16
                       moments, no master copy; NeMo's distributed_fused_adam with dtype bf16)
search:
  --search             rank every mesh that fits, each by its fastest micro-batch, schedule,
                       recompute and ZeRO stage (ZeRO-1 with or without the overlapped parameter
                       gather; ZeRO-3 as FULL_SHARD or SHARD_GRAD_OP, under no_sync, or gathered
                       once a step, over the DP group or as HSDP over the DP ranks of a node);
                       with --tp and --pp, say where that one ranks
  --top N              layouts to explain (default 5)
  --runnable           only layouts weft::strategy runs as is (each ranked layout says whether
                       it does, and why not; the best that does is printed as a
                       weft::strategy<...> type, its configuration and its launch line)
  --memory-limit GIB   per GPU (default: the GPU's memory)
output:
  --json               machine-readable: tflops_per_gpu (SC21 Eq. 3), step_time_s, bubble,
                       memory_gib, communication per axis
  --trace FILE         the simulated step as a Chrome trace (one layout)
  -h, --help           this text
weft's host trainer (weft::strategy in float32 on the CPU; memory only, no timing):
  --host FAMILY        gpt | llama: each rank's bytes by category, as the trainer reports them,
                       for the model and --tp --pp --dp (default 1 each) --global-batch
                       --micro-batch --schedule (1f1b, gpipe, interleaved) --chunks --zero
                       --recompute --sequence-parallel; --ffn defaults to the family's width
  --tied               the output layer is the token table (the head keeps a copy of it)
  --optimizer O        adamw (default) | adam | sgd | sgd-momentum
  --bucket-elements N  gradient bucket size (default: the optimizer's)
  --prefetch N         ZeRO 3: units gathered ahead of the one in use (default 1)
  --pipeline-layout S  blocks per virtual stage, as "Et*3|t*2|t*2|tL" (default: even)
)";

// The usage text names every preset, as sim::model_presets has them.
constexpr bool usage_names_every_preset() {
  for (const sim::model_preset& p : sim::model_presets)
    if (usage_text.find(p.name) == std::string_view::npos) return false;
  return true;
}
static_assert(usage_names_every_preset(), "list every sim::model_presets name under --model");

struct config {
  sim::model_spec model;
  std::string gpu = "a100-80gb";
  int nodes = 0;
  int gpus_per_node = 8;
  int global_batch = 0;
  sim::layout layout;
  sim::pipeline_engine engine = sim::pipeline_engine::megatron;
  std::optional<sim::shard_engine> sharding;
  std::optional<int> tp, pp, dp, chunks;
  int cp = 1;
  std::optional<int> ffn, kv_heads;        // applied after --model, wherever they come
  std::optional<sim::model_family> family; // a shape's architecture
  bool gated = false, flash = false;       // switched on over the preset or the family
  bool backward_post = false;              // --backward-prefetch post
  std::optional<bool> reshard;             // --reshard-after-forward
  std::optional<sim::shard_sync> sync;     // --micro-batch-sync
  bool search = false;
  bool runnable = false;
  int top = 5;
  double memory_limit_gib = 0;
  bool json = false;
  std::string trace;
  bool help = false;
  // --host
  std::optional<sim::host_family> host;
  bool tied = false;
  std::string optimizer = "adamw";
  std::size_t bucket_elements = 0;
  int prefetch = 1;
  std::vector<int> stage_blocks;
};

[[noreturn]] void bad(const std::string& what) { throw weft::error("weft-plan: " + what); }

// `most` keeps the products the simulator forms (GPUs, tokens per micro-batch) far from
// overflow, and a search's loops bounded.
int whole(std::string_view flag, std::string_view text, int least, int most = 1 << 24) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    bad(std::string(flag) + " takes a whole number, not '" + std::string(text) + "'");
  if (v < least)
    bad(std::string(flag) + " must be at least " + std::to_string(least) + ", not " +
        std::string(text));
  if (v > most)
    bad(std::string(flag) + " must be at most " + std::to_string(most) + ", not " +
        std::string(text));
  return v;
}

double real(std::string_view flag, std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v > 0) || v > 1e300)
    bad(std::string(flag) + " takes a positive number, not '" + std::string(text) + "'");
  return v;
}

config parse(const std::vector<std::string_view>& args) {
  config c;
  c.model.name = "model";
  bool has_preset = false, has_shape = false;
  std::vector<std::string_view> seen;  // the options with values given so far
  std::vector<std::string_view> flags; // every option given
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view flag = args[i];
    std::optional<std::string_view> inline_value;
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (flag == "-h" || flag == "--help") {
      c.help = true;
      continue;
    }
    flags.push_back(flag);
    // Switches.
    if (flag == "--gated") {
      c.gated = true;
      continue;
    }
    if (flag == "--flash") {
      c.flash = true;
      continue;
    }
    if (flag == "--sequence-parallel") {
      c.layout.sequence_parallel = true;
      continue;
    }
    if (flag == "--tp-across-nodes") {
      c.layout.tp_across_nodes = true;
      continue;
    }
    if (flag == "--tp-overlap") {
      c.layout.tp_overlap = true;
      continue;
    }
    if (flag == "--tp-comm-overlap") {
      c.layout.tp_comm_overlap = true;
      continue;
    }
    if (flag == "--overlap-param-gather") {
      c.layout.overlap_param_gather = true;
      continue;
    }
    if (flag == "--search") {
      c.search = true;
      continue;
    }
    if (flag == "--runnable") {
      c.runnable = true;
      continue;
    }
    if (flag == "--json") {
      c.json = true;
      continue;
    }
    if (flag == "--tied") {
      c.tied = true;
      continue;
    }
    static constexpr std::string_view valued[] = {"--model",
                                                  "--layers",
                                                  "--hidden",
                                                  "--heads",
                                                  "--seq",
                                                  "--vocab",
                                                  "--ffn",
                                                  "--kv-heads",
                                                  "--family",
                                                  "--gpu",
                                                  "--nodes",
                                                  "--gpus-per-node",
                                                  "--global-batch",
                                                  "--tp",
                                                  "--cp",
                                                  "--pp",
                                                  "--dp",
                                                  "--schedule",
                                                  "--chunks",
                                                  "--micro-batch",
                                                  "--zero",
                                                  "--recompute",
                                                  "--top",
                                                  "--memory-limit",
                                                  "--trace",
                                                  "--grad-accum",
                                                  "--precision",
                                                  "--engine",
                                                  "--sharding",
                                                  "--shard-group",
                                                  "--backward-prefetch",
                                                  "--reshard-after-forward",
                                                  "--micro-batch-sync",
                                                  "--optimizer-state",
                                                  "--reduce-dtype",
                                                  "--host",
                                                  "--optimizer",
                                                  "--bucket-elements",
                                                  "--prefetch",
                                                  "--pipeline-layout"};
    bool known = false;
    for (std::string_view k : valued)
      known = known || flag == k;
    if (!known) bad("unknown option '" + std::string(args[i]) + "' (see weft-plan --help)");
    // A second value would silently replace the first: say so instead.
    if (std::find(seen.begin(), seen.end(), flag) != seen.end())
      bad(std::string(flag) + " is given twice");
    seen.push_back(flag);
    if (!inline_value && i + 1 == args.size()) bad(std::string(flag) + " needs a value");
    const std::string_view v = inline_value ? *inline_value : args[++i];
    if (flag == "--model") {
      c.model = sim::model_named(v);
      has_preset = true;
    } else if (flag == "--family")
      c.family = sim::model_family_named(v);
    else if (flag == "--layers") {
      c.model.layers = whole(flag, v, 1);
      has_shape = true;
    } else if (flag == "--hidden") {
      c.model.hidden = whole(flag, v, 1);
      has_shape = true;
    } else if (flag == "--heads") {
      c.model.heads = whole(flag, v, 1);
      has_shape = true;
    } else if (flag == "--seq") {
      c.model.seq = whole(flag, v, 1);
      has_shape = true;
    } else if (flag == "--vocab") {
      c.model.vocab = whole(flag, v, 1);
      has_shape = true;
    } else if (flag == "--ffn")
      c.ffn = whole(flag, v, 1);
    else if (flag == "--kv-heads")
      c.kv_heads = whole(flag, v, 1);
    else if (flag == "--gpu")
      c.gpu = std::string(v);
    else if (flag == "--nodes")
      c.nodes = whole(flag, v, 1, 65536);
    else if (flag == "--gpus-per-node")
      c.gpus_per_node = whole(flag, v, 1, 1024);
    else if (flag == "--global-batch")
      c.global_batch = whole(flag, v, 1);
    else if (flag == "--tp")
      c.tp = whole(flag, v, 1);
    else if (flag == "--cp")
      c.cp = whole(flag, v, 1);
    else if (flag == "--pp")
      c.pp = whole(flag, v, 1);
    else if (flag == "--dp")
      c.dp = whole(flag, v, 1);
    else if (flag == "--chunks")
      c.chunks = whole(flag, v, 1, 1024);
    else if (flag == "--micro-batch")
      c.layout.micro_batch = whole(flag, v, 1);
    else if (flag == "--zero") {
      c.layout.zero = whole(flag, v, 0);
      if (c.layout.zero > 3) bad("--zero takes a stage 0..3, not " + std::string(v));
    } else if (flag == "--recompute") {
      c.layout.recomputation = sim::recompute_named(v);
    } else if (flag == "--precision") {
      c.layout.gemm_precision = sim::precision_named(v);
    } else if (flag == "--grad-accum") {
      c.layout.grad_accumulation_bytes = sim::grad_accumulation_named(v);
    } else if (flag == "--engine") {
      c.engine = sim::pipeline_engine_named(v);
    } else if (flag == "--sharding") {
      c.sharding = sim::shard_engine_named(v);
    } else if (flag == "--shard-group") {
      c.layout.shard_group = whole(flag, v, 1);
    } else if (flag == "--backward-prefetch") {
      if (v != "pre" && v != "post")
        bad("unknown --backward-prefetch '" + std::string(v) + "' (pre or post)");
      c.backward_post = v == "post";
    } else if (flag == "--reshard-after-forward") {
      if (v != "yes" && v != "no")
        bad("unknown --reshard-after-forward '" + std::string(v) + "' (yes or no)");
      c.reshard = v == "yes";
    } else if (flag == "--micro-batch-sync") {
      if (v != "every" && v != "last" && v != "once")
        bad("unknown --micro-batch-sync '" + std::string(v) + "' (every, last or once)");
      c.sync = sim::shard_sync_named(v);
    } else if (flag == "--optimizer-state") {
      c.layout.optimizer_bytes = sim::optimizer_state_named(v);
    } else if (flag == "--reduce-dtype") {
      if (v != "bf16" && v != "fp32")
        bad("unknown --reduce-dtype '" + std::string(v) + "' (bf16 or fp32)");
      c.layout.grad_bytes = v == "fp32" ? 4 : 2;
    } else if (flag == "--schedule") {
      if (v == "1f1b")
        c.layout.schedule = pl::schedule_kind::one_f_one_b;
      else if (v == "gpipe")
        c.layout.schedule = pl::schedule_kind::gpipe;
      else if (v == "interleaved")
        c.layout.schedule = pl::schedule_kind::interleaved;
      else if (v == "zb-h1")
        c.layout.schedule = pl::schedule_kind::zero_bubble_h1;
      else
        bad("unknown schedule '" + std::string(v) + "' (1f1b, gpipe, interleaved or zb-h1)");
    } else if (flag == "--top")
      c.top = whole(flag, v, 1);
    else if (flag == "--memory-limit")
      c.memory_limit_gib = real(flag, v);
    else if (flag == "--trace")
      c.trace = std::string(v);
    else if (flag == "--host")
      c.host = sim::model_family_named(v);
    else if (flag == "--optimizer") {
      if (v != "adamw" && v != "adam" && v != "sgd" && v != "sgd-momentum")
        bad("unknown optimizer '" + std::string(v) + "' (adamw, adam, sgd or sgd-momentum)");
      c.optimizer = std::string(v);
    } else if (flag == "--bucket-elements")
      c.bucket_elements = static_cast<std::size_t>(whole(flag, v, 1, INT_MAX));
    else if (flag == "--prefetch")
      c.prefetch = whole(flag, v, 0, 1024);
    else if (flag == "--pipeline-layout")
      c.stage_blocks = pl::parse_layout(v);
  }
  if (c.help) return c;
  if (c.ffn) c.model.ffn = *c.ffn;
  if (c.kv_heads) c.model.kv_heads = *c.kv_heads;
  if (has_preset && has_shape) bad("--model and shape flags (--layers ...) exclude each other");
  if (c.family) {
    if (has_preset) bad("--family gives a shape its architecture; --model names a whole model");
    if (c.host) bad("--family prices a GPU cluster's model; --host names the family itself");
    c.model = sim::with_architecture(c.model, *c.family);
    if (*c.family == sim::model_family::llama && !c.ffn)
      c.model.ffn = sim::llama_ffn(c.model.hidden);
  }
  if (c.gated) c.model.gated = true;
  if (c.flash) c.model.flash_attention = true;
  if (!has_preset && !has_shape)
    bad("a model is required: --model NAME or --layers --hidden --heads --seq --vocab");
  if (c.global_batch == 0) bad("--global-batch is required");
  const auto given = [&](std::string_view f) {
    return std::find(flags.begin(), flags.end(), f) != flags.end();
  };
  const auto take_chunks = [&] {
    if (c.chunks && c.layout.schedule != pl::schedule_kind::interleaved)
      bad("--chunks applies to --schedule interleaved only");
    c.layout.chunks =
        c.chunks.value_or(c.layout.schedule == pl::schedule_kind::interleaved ? 2 : 1);
    c.layout.global_batch = c.global_batch;
  };
  if (c.host) {
    // What prices a GPU cluster has no meaning for the host trainer: refused, not ignored.
    for (std::string_view f : {"--gpu",
                               "--nodes",
                               "--gpus-per-node",
                               "--engine",
                               "--grad-accum",
                               "--precision",
                               "--top",
                               "--memory-limit",
                               "--trace",
                               "--search",
                               "--gated",
                               "--flash",
                               "--tp-across-nodes",
                               "--tp-overlap",
                               "--tp-comm-overlap",
                               "--overlap-param-gather",
                               "--sharding",
                               "--shard-group",
                               "--backward-prefetch",
                               "--reshard-after-forward",
                               "--micro-batch-sync",
                               "--optimizer-state",
                               "--reduce-dtype",
                               "--runnable",
                               "--cp"})
      if (given(f))
        bad(std::string(f) +
            " prices a GPU cluster; --host predicts the host trainer's memory (leave it out)");
    take_chunks();
    return c;
  }
  for (std::string_view f :
       {"--tied", "--optimizer", "--bucket-elements", "--prefetch", "--pipeline-layout"})
    if (given(f)) bad(std::string(f) + " applies to --host only");
  if (!c.search && (!c.tp || !c.pp)) bad("give a layout (--tp and --pp) or --search");
  if (c.search && !c.trace.empty()) bad("--trace draws one layout; leave out --search");
  if (c.search && c.nodes == 0) bad("--search needs --nodes");
  if (c.runnable && !c.search) bad("--runnable restricts --search: give --search too");
  if (c.search) {
    // The search chooses these itself: given, they would be ignored without a word.
    for (std::string_view f :
         {"--micro-batch", "--zero", "--recompute", "--schedule", "--chunks", "--sharding",
          "--shard-group", "--reshard-after-forward", "--micro-batch-sync"})
      if (std::find(seen.begin(), seen.end(), f) != seen.end())
        bad(std::string(f) +
            " sets one layout; --search chooses it (leave it out, or drop --search)");
    if (given("--backward-prefetch"))
      bad("--backward-prefetch sets one layout; the search does not vary it (leave it out)");
    if (c.layout.tp_across_nodes)
      bad("--tp-across-nodes sets one layout; --search keeps TP inside nodes");
    if (c.layout.tp_comm_overlap)
      bad("--tp-comm-overlap sets one layout; the search does not vary it (leave it out)");
    if (c.layout.overlap_param_gather)
      bad("--overlap-param-gather sets one layout; --search chooses it (leave it out, or drop "
          "--search)");
  }
  take_chunks();
  if (c.sharding) {
    if (given("--zero")) bad("--sharding sets the ZeRO stage its engine runs; leave out --zero");
    sim::use_shard_engine(c.layout, *c.sharding);
  } else if (given("--shard-group")) {
    bad("--shard-group (HSDP) needs --sharding");
  }
  if (given("--backward-prefetch")) {
    if (c.sharding != sim::shard_engine::fsdp)
      bad("--backward-prefetch is FSDP1's backward_prefetch: it needs --sharding fsdp");
    c.layout.backward_prefetch = c.backward_post ? 0 : 1;
  }
  // How ZeRO-3 gathers: FSDP's settings, or those of ZeRO-3 named by its stage alone (weft's own
  // optim::zero<3> runs --micro-batch-sync every and last).
  const bool zero3_modes = c.sharding == sim::shard_engine::fsdp ||
                           c.sharding == sim::shard_engine::fsdp2 ||
                           (!c.sharding && c.layout.zero == 3);
  for (std::string_view f : {"--reshard-after-forward", "--micro-batch-sync"}) {
    if (given(f) && !zero3_modes)
      bad(std::string(f) +
          " sets how ZeRO-3 gathers: it needs --zero 3 or --sharding fsdp or fsdp2");
  }
  if (c.reshard) c.layout.reshard_after_forward = *c.reshard;
  if (c.sync) c.layout.sync = *c.sync;
  c.layout.cp = c.cp;
  if (!c.search) { // the engine's limits are the layout's: say so before simulating
    sim::layout l = c.layout;
    l.pp = *c.pp;
    if (const std::string why = sim::engine_refusal(l, c.engine); !why.empty()) bad(why);
  }
  return c;
}

sim::machine make_machine(const config& c, int gpus_needed) {
  const sim::gpu g = sim::gpu_named(c.gpu);
  const int nodes = c.nodes > 0 ? c.nodes : (gpus_needed + c.gpus_per_node - 1) / c.gpus_per_node;
  const sim::machine dgx = sim::dgx(g, 1);
  const auto& k = dgx.cluster;
  // A DGX node has a NIC per GPU: a node of G GPUs has G (the preset's 8 used to stay for any G,
  // so 16 GPUs of a node shared 8 NICs).
  const int nics = std::max(1, k.nics_per_node() * c.gpus_per_node / k.devices_on(0));
  return {
      g, weft::topology::cluster(std::vector<int>(static_cast<std::size_t>(nodes), c.gpus_per_node),
                                 k.intra(), k.inter(), nics, k.reduce_bandwidth())};
}

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string q(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string json(const sim::model_spec& m, const sim::layout& l, const sim::step_result& r,
                 const sim::machine& mc) {
  const std::string_view gpu = mc.device.name;
  const double gib = 1024.0 * 1024 * 1024;
  const auto axis = [&](const sim::axis_time& a) {
    return "{\"seconds\": " + num(a.seconds) + ", \"per_call_s\": " + num(a.per_call_s) +
           ", \"link\": " + q(a.link) + "}";
  };
  std::string o = "{\n";
  char parameters[32];
  std::snprintf(parameters, sizeof parameters, "%.0f", m.parameters());
  o += "  \"model\": " + q(m.name) + ", \"parameters\": " + parameters + ", \"gpu\": " + q(gpu) +
       ",\n";
  o += "  \"cluster\": {\"nodes\": " + std::to_string(mc.cluster.nodes()) +
       ", \"gpus_per_node\": " + std::to_string(mc.cluster.devices_on(0)) +
       ", \"nics_per_node\": " + std::to_string(mc.cluster.nics_per_node()) + "},\n";
  o += "  \"layout\": {\"tp\": " + std::to_string(l.tp) + ", \"cp\": " + std::to_string(l.cp) +
       ", \"pp\": " + std::to_string(l.pp) + ", \"dp\": " + std::to_string(l.dp) +
       ", \"chunks\": " + std::to_string(l.chunks) +
       ", \"micro_batch\": " + std::to_string(l.micro_batch) +
       ", \"global_batch\": " + std::to_string(l.batch()) +
       ", \"schedule\": " + q(pl::name_of(l.schedule)) + ", \"zero\": " + std::to_string(l.zero) +
       ", \"recompute\": " + q(sim::name_of(l.recomputation)) +
       ", \"sequence_parallel\": " + (l.sequence_parallel ? "true" : "false") +
       ", \"tp_across_nodes\": " + (l.tp_across_nodes ? "true" : "false") +
       ", \"tp_overlap\": " + (l.tp_overlap ? "true" : "false") +
       ", \"tp_comm_overlap\": " + (l.tp_comm_overlap ? "true" : "false") +
       ", \"overlap_param_gather\": " + (l.overlap_param_gather ? "true" : "false") +
       ", \"engine\": " + q(sim::name_of(sim::engine_of(l))) +
       ", \"sharding\": " + q(sim::name_of(l.sharding)) +
       ", \"shard_group\": " + std::to_string(l.zero > 0 ? l.shards() : 1) +
       ", \"prefetch\": " + (l.zero == 3 ? std::to_string(l.prefetch) : "null") +
       ", \"backward_prefetch\": " + (l.zero == 3 ? std::to_string(l.backward_prefetch) : "null") +
       ", \"reshard_after_forward\": " +
       (l.zero == 3 ? (l.reshard_after_forward ? "true" : "false") : "null") +
       ", \"micro_batch_sync\": " + (l.zero == 3 ? q(sim::name_of(l.sync)) : "null") +
       ", \"grad_accumulation_bytes\": " + num(l.grad_accumulation_bytes) +
       ", \"precision\": " + q(sim::name_of(l.gemm_precision)) +
       ", \"optimizer_bytes\": " + num(l.optimizer_bytes) +
       ", \"grad_bytes\": " + num(l.grad_bytes) + "},\n";
  o += "  \"microbatches\": " + std::to_string(r.microbatches) + ",\n";
  o += "  \"step_time_s\": " + num(r.step_time_s) + ",\n";
  o += "  \"tflops_per_gpu\": " + num(r.tflops_per_gpu) + ",\n";
  o += "  \"model_tflops_per_gpu\": " + num(r.model_tflops_per_gpu) + ",\n";
  o += "  \"mfu\": " + num(r.mfu) + ",\n";
  o += "  \"bubble\": " + num(r.bubble) + ",\n";
  o += "  \"memory_gib\": {\"weights\": " + num(r.states.weights / gib) +
       ", \"gradients\": " + num(r.states.gradients / gib) +
       ", \"optimizer\": " + num(r.states.optimizer / gib) +
       ", \"activations\": " + num(r.activation_bytes / gib) +
       ", \"total\": " + num(r.memory_bytes() / gib) + "},\n";
  o += "  \"forward_s\": " + num(r.forward_s) + ", \"backward_s\": " + num(r.backward_s) +
       ", \"weight_s\": " + num(r.weight_s) + ",\n";
  o += "  \"communication\": {\"tp\": " + axis(r.tp) + ", \"cp\": " + axis(r.cp) +
       ", \"pp\": " + axis(r.pp) + ", \"dp\": " + axis(r.dp) +
       ", \"dp_exposed_s\": " + num(r.dp_exposed_s + r.shard_exposed_s) + "},\n";
  o += "  \"optimizer_s\": " + num(r.optimizer_s) + ",\n";
  // Whether weft::strategy runs the layout (the reasons and the type hold no '"' or '\\').
  const std::string refusal = sim::strategy_refusal(m, mc, l);
  o += "  \"weft_strategy\": " +
       (refusal.empty() ? "{\"runs\": true, \"type\": " + q(sim::strategy_type(m, mc, l)) + "}"
                        : "{\"runs\": false, \"why\": " + q(refusal) + "}") +
       "\n}\n";
  return o;
}

std::string text(const sim::model_spec& m, const sim::layout& l, const sim::step_result& r,
                 const sim::machine& mc, double memory_limit_gib) {
  const double gib = 1024.0 * 1024 * 1024;
  const double limit = memory_limit_gib > 0 ? memory_limit_gib * gib : mc.device.hbm_bytes;
  char buf[512];
  std::string o =
      m.name + " (" + num(m.parameters() / 1e9) + "B parameters) on " +
      std::to_string(mc.cluster.size()) + " " + std::string(mc.device.name) +
      (l.gpus() < mc.cluster.size() ? " (" + std::to_string(l.gpus()) + " of them used)" : "") +
      ": " + sim::describe(l) + "\n";
  // ZeRO-3's gathered weights (and whole gradients), apart from the activations they sit with.
  char buffers[64] = "";
  if (r.buffer_bytes > 0)
    std::snprintf(buffers, sizeof buffers, ", ZeRO-3 buffers %.1f", r.buffer_bytes / gib);
  std::snprintf(buf, sizeof buf,
                "  step %.3f s, %d micro-batches; %.1f TFLOP/s per GPU (SC21 Eq. 3), %.1f model "
                "TFLOP/s (MFU %.1f%%)\n"
                "  bubble %.1f%% of ideal compute; per micro-batch on the busiest rank: forward "
                "%.4f s, backward %.4f s%s\n"
                "  memory per GPU %.1f GiB: weights %.1f, gradients %.1f, optimizer %.1f, "
                "activations %.1f%s (of %.1f GiB usable)\n",
                r.step_time_s, r.microbatches, r.tflops_per_gpu, r.model_tflops_per_gpu,
                100 * r.mfu, 100 * r.bubble, r.forward_s, r.backward_s,
                r.weight_s > 0 ? (", weight gradients " + num(r.weight_s) + " s").c_str() : "",
                r.memory_bytes() / gib, r.states.weights / gib, r.states.gradients / gib,
                r.states.optimizer / gib, (r.activation_bytes - r.buffer_bytes) / gib, buffers,
                limit / gib);
  o += buf;
  std::snprintf(buf, sizeof buf,
                "  communication per step: TP %.3f s on %s, PP %.3f s on %s, DP %.3f s on %s (%.3f "
                "s exposed)\n",
                r.tp.seconds, std::string(r.tp.link).c_str(), r.pp.seconds,
                std::string(r.pp.link).c_str(), r.dp.seconds, std::string(r.dp.link).c_str(),
                r.dp_exposed_s + r.shard_exposed_s);
  o += buf;
  if (l.cp > 1) {
    std::snprintf(buf, sizeof buf, "  CP %d on %s: %.3f s of key-value ring messages per step\n",
                  l.cp, std::string(r.cp.link).c_str(), r.cp.seconds);
    o += buf;
  }
  if (r.memory_bytes() > limit)
    o += memory_limit_gib > 0 ? "  warning: this layout does not fit the memory limit\n"
                              : "  warning: this layout does not fit the GPU's memory\n";
  const int per_node = mc.cluster.devices_on(0);
  if (!l.tp_across_nodes && l.tp > 1 && l.tp < per_node && per_node % l.tp != 0) {
    std::snprintf(buf, sizeof buf,
                  "  warning: tp %d does not divide the %d GPUs of a node: some TP groups straddle "
                  "two nodes, "
                  "and their collectives (priced above) cross %s\n",
                  l.tp, per_node,
                  std::string(weft::topology::name_of(mc.cluster.inter().kind)).c_str());
    o += buf;
  }
  const std::string refusal = sim::strategy_refusal(m, mc, l);
  o += refusal.empty() ? "  weft::strategy runs it: " + sim::strategy_type(m, mc, l) + "\n"
                       : "  weft::strategy runs it: no, " + refusal + "\n";
  return o;
}

sim::host_model host_model_of(const config& c) {
  const sim::model_spec& m = c.model;
  const auto z = [](int v) { return static_cast<std::size_t>(v); };
  return {.family = *c.host,
          .vocab = z(m.vocab),
          .hidden = z(m.hidden),
          .heads = z(m.heads),
          .kv_heads = z(m.kv_heads),
          .ffn = z(m.ffn),
          .seq = z(m.seq),
          .layers = z(m.layers),
          .tied = c.tied};
}

sim::host_layout host_layout_of(const config& c) {
  const sim::layout& l = c.layout;
  return {.tp = c.tp.value_or(1),
          .pp = c.pp.value_or(1),
          .dp = c.dp.value_or(1),
          .chunks = l.chunks,
          .schedule = l.schedule,
          .micro_batch = l.micro_batch,
          .global_batch = l.global_batch,
          .zero = l.zero,
          .recomputation = l.recomputation,
          .sequence_parallel = l.sequence_parallel,
          .bucket_elements = c.bucket_elements,
          .prefetch = c.prefetch,
          .slots = c.optimizer == "sgd"            ? 0
                   : c.optimizer == "sgd-momentum" ? 1
                                                   : 2,
          .blocks_per_stage = c.stage_blocks};
}

// Every rank's memory, pp rank by pp rank, as a table of bytes (or JSON).
std::string host_report(const config& c) {
  const sim::host_model m = host_model_of(c);
  const sim::host_layout l = host_layout_of(c);
  std::vector<std::vector<sim::host_memory>> ranks(static_cast<std::size_t>(l.pp));
  for (int p = 0; p < l.pp; ++p)
    for (int t = 0; t < l.tp; ++t)
      ranks[static_cast<std::size_t>(p)].push_back(sim::host_memory_of(m, l, p, t));
  const std::string family(sim::name_of(m.family));
  const std::string schedule(pl::name_of(l.schedule));
  if (c.json) {
    std::string o =
        "{\n  \"host\": {\"family\": " + q(family) + ", \"vocab\": " + std::to_string(m.vocab) +
        ", \"hidden\": " + std::to_string(m.hidden) + ", \"heads\": " + std::to_string(m.heads) +
        ", \"kv_heads\": " + std::to_string(m.kv()) + ", \"ffn\": " + std::to_string(m.ffn_size()) +
        ", \"seq\": " + std::to_string(m.seq) + ", \"layers\": " + std::to_string(m.layers) +
        ", \"tied\": " + (m.tied ? "true" : "false") + "},\n";
    o += "  \"layout\": {\"tp\": " + std::to_string(l.tp) + ", \"pp\": " + std::to_string(l.pp) +
         ", \"dp\": " + std::to_string(l.dp) + ", \"chunks\": " + std::to_string(l.chunks) +
         ", \"schedule\": " + q(schedule) + ", \"micro_batch\": " + std::to_string(l.micro_batch) +
         ", \"global_batch\": " + std::to_string(l.batch()) +
         ", \"zero\": " + std::to_string(l.zero) +
         ", \"recompute\": " + q(sim::name_of(l.recomputation)) +
         ", \"sequence_parallel\": " + (l.sequence_parallel ? "true" : "false") +
         ", \"optimizer\": " + q(c.optimizer) +
         "},\n  \"microbatches\": " + std::to_string(l.microbatches()) + ",\n  \"ranks\": [";
    for (int p = 0; p < l.pp; ++p) {
      for (int t = 0; t < l.tp; ++t) {
        const sim::host_memory& r = ranks[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)];
        o += std::string(p + t > 0 ? ",\n" : "\n") + "    {\"pp\": " + std::to_string(p) +
             ", \"tp\": " + std::to_string(t) + ", \"weights\": " + std::to_string(r.weights) +
             ", \"gathered_weights\": " + std::to_string(r.gathered_weights) +
             ", \"gradients\": " + std::to_string(r.gradients) +
             ", \"gradient_buckets\": " + std::to_string(r.gradient_buckets) +
             ", \"optimizer_state\": " + std::to_string(r.optimizer_state) +
             ", \"master_weights\": " + std::to_string(r.master_weights) +
             ", \"activations\": " + std::to_string(r.activations) +
             ", \"total\": " + std::to_string(r.total()) + "}";
      }
    }
    return o + "\n  ]\n}\n";
  }
  std::string o = "weft's host trainer, float32 on the CPU (memory only, no timing): " + family +
                  ", " + std::to_string(m.layers) + " layers, hidden " + std::to_string(m.hidden) +
                  ", " + std::to_string(m.heads) + " heads" +
                  (m.kv() != m.heads ? " (" + std::to_string(m.kv()) + " key/value)" : "") +
                  ", FFN " + std::to_string(m.ffn_size()) + ", seq " + std::to_string(m.seq) +
                  ", vocab " + std::to_string(m.vocab) + (m.tied ? ", tied" : "") + "\n";
  o += "  tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp) + " dp " +
       std::to_string(l.dp) + ", " + schedule +
       (l.chunks > 1 ? " of " + std::to_string(l.chunks) + " chunks" : "") + ", micro-batch " +
       std::to_string(l.micro_batch) + ", " + std::to_string(l.microbatches()) +
       " micro-batches, ZeRO-" + std::to_string(l.zero) + ", recompute " +
       std::string(sim::name_of(l.recomputation)) +
       (l.sequence_parallel ? ", sequence parallel" : "") + ", " + c.optimizer + "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-12s%13s%13s%13s%13s%13s%13s%13s%13s\n", "bytes", "weights",
                "gathered", "gradients", "grad buckets", "optimizer", "master", "activations",
                "total");
  o += buf;
  for (int p = 0; p < l.pp; ++p) {
    for (int t = 0; t < l.tp; ++t) {
      const sim::host_memory& r = ranks[static_cast<std::size_t>(p)][static_cast<std::size_t>(t)];
      const std::string who = "pp " + std::to_string(p) + " tp " + std::to_string(t);
      std::snprintf(buf, sizeof buf, "  %-12s%13zu%13zu%13zu%13zu%13zu%13zu%13zu%13zu\n",
                    who.c_str(), r.weights, r.gathered_weights, r.gradients, r.gradient_buckets,
                    r.optimizer_state, r.master_weights, r.activations, r.total());
      o += buf;
    }
  }
  return o;
}

// The best layout weft::strategy runs (the search keeps it, restricted or not): its type,
// configuration and launch line.
std::string runnable_report(const config& c, const sim::machine& mc, const sim::search_result& s) {
  if (!s.best_runnable) return "No layout that weft::strategy runs as is fits.\n";
  const sim::ranked_layout& best = *s.best_runnable;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "The best layout weft::strategy runs as is: %s, step %.2f s (%.1f%% slower than "
                "#1)\n",
                sim::describe(best.l).c_str(), best.r.step_time_s,
                100 * (best.r.step_time_s / s.ranked.front().r.step_time_s - 1));
  return buf + std::string("  using S = ") + sim::strategy_type(c.model, mc, best.l) +
         ";\n  auto trainer = S::make(world, " + sim::strategy_config_of(c.model, best.l) +
         ");  // world: a weft::mpi::communicator over MPI_COMM_WORLD\n  " +
         sim::launch_line(mc, best.l, "./train") +
         "\n  where ./train is your program that makes S's trainer as above and calls "
         "trainer->train_step(ids, targets) each step (samples/07_train_3d/main.cpp, with its "
         "strategy and model replaced, is one). weft::strategy computes in float32 with host "
         "BLAS: it runs this composition, not the mixed-precision GPU step simulated here.\n";
}

} // namespace

int main(int argc, char** argv) {
  config c;
  try {
    c = parse(std::vector<std::string_view>(argv + 1, argv + argc));
    if (c.help) {
      std::fputs(usage_text.data(), stdout);
      return 0;
    }
    c.model.check();
    (void)sim::gpu_named(c.gpu);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  try {
    if (c.host) {
      std::fputs(host_report(c).c_str(), stdout);
      return 0;
    }
    if (c.search) {
      const sim::machine mc = make_machine(c, 0);
      sim::search_options o;
      o.global_batch = c.global_batch;
      o.memory_limit = c.memory_limit_gib * 1024.0 * 1024 * 1024;
      o.tp_overlap = c.layout.tp_overlap;
      o.grad_accumulation_bytes = c.layout.grad_accumulation_bytes;
      o.gemm_precision = c.layout.gemm_precision;
      o.optimizer_bytes = c.layout.optimizer_bytes;
      o.grad_bytes = c.layout.grad_bytes;
      o.engine = c.engine;
      o.runnable_only = c.runnable;
      o.cp = c.cp;
      const sim::search_result s = sim::search(c.model, mc, o);
      std::string out;
      if (c.json) {
        out = "{\"ranked\": [\n";
        for (std::size_t i = 0; i < s.ranked.size() && i < static_cast<std::size_t>(c.top); ++i)
          out += (i ? ",\n" : "") + json(c.model, s.ranked[i].l, s.ranked[i].r, mc);
        out += "], \"meshes\": " + std::to_string(s.meshes) +
               ", \"out_of_memory\": " + std::to_string(s.out_of_memory) +
               ", \"unschedulable\": " + std::to_string(s.unschedulable) +
               ", \"simulated\": " + std::to_string(s.simulated) + ",\n\"best_runnable\": " +
               (s.best_runnable ? json(c.model, s.best_runnable->l, s.best_runnable->r, mc)
                                : std::string("null")) +
               "}\n";
      } else {
        out = c.model.name + " on " + std::to_string(mc.cluster.size()) + " " + c.gpu + " (" +
              std::to_string(c.nodes) + " nodes), global batch " + std::to_string(c.global_batch) +
              ":\n";
        out += sim::explain(s, mc, static_cast<std::size_t>(c.top));
        std::size_t rank = 0;
        if (c.tp && c.pp) {
          const int dp = c.dp.value_or(mc.cluster.size() / (*c.tp * c.cp * *c.pp));
          for (std::size_t i = 0; i < s.ranked.size() && rank == 0; ++i)
            if (s.ranked[i].l.tp == *c.tp && s.ranked[i].l.pp == *c.pp && s.ranked[i].l.dp == dp)
              rank = i + 1;
          out += "The layout tp " + std::to_string(*c.tp) + " pp " + std::to_string(*c.pp) +
                 " dp " + std::to_string(dp) +
                 (rank ? " ranks #" + std::to_string(rank) + " of " +
                             std::to_string(s.ranked.size()) + ".\n"
                       : " is not among the " + std::to_string(s.ranked.size()) +
                             " layouts that fit.\n");
          if (rank > static_cast<std::size_t>(c.top)) {
            const auto& x = s.ranked[rank - 1];
            char buf[256];
            std::snprintf(buf, sizeof buf,
                          "  as %s: step %.2f s, %.1f TFLOP/s per GPU, %.1f%% slower than #1\n",
                          sim::describe(x.l).c_str(), x.r.step_time_s, x.r.tflops_per_gpu,
                          100 * (x.r.step_time_s / s.ranked.front().r.step_time_s - 1));
            out += buf;
          }
        }
        // The given mesh as a column of its own unless it is #1 or #2 already.
        out += sim::explain_winner(s, rank > 2 ? &s.ranked[rank - 1] : nullptr, "given");
        out += runnable_report(c, mc, s);
      }
      std::fputs(out.c_str(), stdout);
      return 0;
    }
    sim::layout l = c.layout;
    l.tp = *c.tp;
    l.pp = *c.pp;
    sim::use_engine(l, c.engine);
    int gpus = 0;
    const std::int64_t tp_pp = std::int64_t{l.tp} * l.cp * l.pp;
    const std::string tp_pp_name = l.cp > 1 ? "tp * cp * pp" : "tp * pp";
    if (c.dp) {
      l.dp = *c.dp;
      const std::int64_t want = tp_pp * l.dp, most = std::int64_t{65536} * c.gpus_per_node;
      if (want > most)
        throw weft::error("weft-plan: " + tp_pp_name + " * dp = " + std::to_string(want) +
                          " GPUs, more than 65536 nodes of " + std::to_string(c.gpus_per_node));
      gpus = static_cast<int>(want);
    } else {
      if (c.nodes == 0) throw weft::error("weft-plan: give --dp or --nodes");
      const int all = c.nodes * c.gpus_per_node;
      if (all % tp_pp != 0)
        throw weft::error("weft-plan: " + tp_pp_name + " = " + std::to_string(tp_pp) +
                          " does not divide the " + std::to_string(all) + " GPUs; give --dp");
      l.dp = static_cast<int>(all / tp_pp);
      gpus = all;
    }
    const sim::machine mc = make_machine(c, gpus);
    const sim::step_result r = sim::simulate_step(c.model, mc, l);
    std::fputs(
        (c.json ? json(c.model, l, r, mc) : text(c.model, l, r, mc, c.memory_limit_gib)).c_str(),
        stdout);
    if (!c.trace.empty()) {
      std::ofstream f(c.trace);
      if (!f) throw weft::error("weft-plan: cannot write " + c.trace);
      f << sim::to_chrome_trace(r, c.model.name + " " + sim::describe(l));
      if (!f) throw weft::error("weft-plan: cannot write " + c.trace);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

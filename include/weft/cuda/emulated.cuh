#pragma once
// weft::cuda::emulated: N ranks on one GPU, so that every algorithm's device path (plans run
// with device kernels, stream ordering between ranks) is checked on a single device.
//
//   namespace emulated = weft::cuda::emulated;
//   emulated::run(4, [](emulated::communicator& c) {
//     weft::all_reduce<weft::algo::ring>(c, std::span(d_grad, n));  // device memory, c.stream()
//   });
//   emulated::run(weft::topology::parse("2x2"), f);  // 4 ranks in 2 emulated nodes
//
// Each rank is a host thread of weft::local::run, with its own stream on the caller's device
// and its own device buffers. The host threads never touch device data: they only trade small
// host messages over the local communicator (eager sends; receives that wait with its
// deadline, so a stalled or failed peer is a weft::error naming it), carrying device
// addresses and events, and every transfer is queued on a stream. One round of rank r's plan:
//
//   1. each send to q:     record e; post q {ready, e, &src, n}
//   2. each recv from s:   take s's next {ready, e', &src', n}; wait e'; copy src' -> dst (or a
//                          temporary); record f; post s {consumed, f}
//   3. local steps in plan order: copy, reduce, a temporary's copy or reduction, load,
//      load_reduce, sync
//   4. each send to q:     take q's next {consumed, f'}; wait f', so that no later step
//                          overwrites src while q's copy may still read it
//
// Messages between two ranks match in order, as the plan model says, but the rounds of two
// ranks need not line up, so one rank's {ready} and {consumed} may reach a peer in another
// order than the peer asks for them: messages of another kind than the one awaited are put
// aside until they are asked for.
//
// A receive lands straight in its destination unless an earlier step of the round reads or
// writes an overlapping range; then, like every recv_reduce, it lands in a temporary and is
// copied or reduced when its turn comes. Peer access (algo::direct): at the start of a
// peer-access plan each rank posts its {input, output, scratch} addresses to the members of
// the plan's groups; `sync` records an event for each member and waits on theirs; `load` and
// `load_reduce` read the peers' memory directly (all ranks share one device). A staged plan
// reads only its peers' staging areas, two per rank, fixed for the communicator's life.
//
// Events: one waiter each; the waiter returns an event to the run's pool once it has queued
// its wait, so no event is recorded again before its waiter has used it. Device memory
// (scratch, temporaries, staging areas) is kept by the run and freed when run() returns: a
// peer's queued copy may read a rank's memory after that rank has moved on, grown its scratch
// or, after a failure, left. Streams never wait on an event that has not been recorded, so
// the device cannot deadlock, whatever the host threads do.
//
// After a weft::error the ranks no longer agree on where they are: end the run. Device
// buffers of the caller that a peer may still read must then outlive run().
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/check.hpp>
#include <weft/comm/plan/engine.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/cuda/detail/device_alignment.hpp>
#include <weft/cuda/detail/emulated_world.cuh>
#include <weft/cuda/detail/receive_landing.hpp>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/topology/topology.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::cuda::emulated {

struct options {
  /// Deadline of every host-side wait for a peer (local::options::timeout).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

class communicator {
public:
  /// All ranks share one device's memory: plans may load from peers (algo::direct).
  static constexpr bool peer_access = true;
  static constexpr std::string_view transport_name = "emulated";

  /// Rank `host.rank()` on the current device, with a new stream. Collective over `host`
  /// (the ranks trade their staging areas' addresses). `host` must outlive this object.
  communicator(local::communicator& host, std::shared_ptr<detail::emulated_world> world)
      : host_(&host), world_(std::move(world)) {
    exchange_staging("emulated::communicator");
  }

  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() = default;

  [[nodiscard]] int rank() const noexcept { return host_->rank(); }
  [[nodiscard]] int size() const noexcept { return host_->size(); }
  [[nodiscard]] int world_rank(int r) const { return host_->world_rank(r); }
  [[nodiscard]] const std::vector<int>& devices() const noexcept { return host_->devices(); }
  [[nodiscard]] const std::vector<int>& node_of() const noexcept { return host_->node_of(); }
  [[nodiscard]] const topology::cluster& cluster() const noexcept { return host_->cluster(); }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return host_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) { host_->set_timeout(t); }

  /// The CUDA device every rank of the run uses.
  [[nodiscard]] int device() const noexcept { return world_->device(); }
  /// The stream this rank's collectives are queued on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }
  /// Queues later collectives on s, the caller's stream (never destroyed here), after the
  /// work already queued on the current one.
  void set_stream(cudaStream_t s) {
    order_after(s, stream_.get());
    stream_ = cuda::stream::borrow(s);
  }
  /// Waits until this rank's queued work is done (nothing on a moved-from communicator, whose
  /// work went with it: emulated::run calls this after fn, which may have moved it away).
  void synchronize() const {
    if (world_ != nullptr) stream_.synchronize();
  }

  // --- point to point on host memory (WEFT_CHECK_CALLS uses them): the local transport's --
  template <element T>
  void send(std::span<const T> data, int peer, int tag = 0) {
    host_->send(data, peer, tag);
  }
  template <element T>
  void send(std::span<T> data, int peer, int tag = 0) {
    host_->send(std::span<const T>(data), peer, tag);
  }
  template <element T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    host_->recv(data, peer, tag);
  }
  template <element T>
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) {
    host_->sendrecv(out, to, in, from, tag);
  }

  /// Host-side: returns once every rank has entered it; queued device work is not waited for.
  void barrier() { host_->barrier(); }

  /// The ranks with the same color (>= 0), ordered by (key, rank), on the same device with a
  /// new stream that starts after the work queued on this one. Collective.
  communicator split(int color, int key) {
    return communicator(std::make_unique<local::communicator>(host_->split(color, key)), world_,
                        stream_.get());
  }

  /// avg's last step, on this rank's stream.
  template <element T>
  void divide(T* data, std::size_t n) {
    cuda::divide(data, n, size(), stream_.get());
  }

  /// avg's first step on half: in's n elements times 1/size(), on this rank's stream, in memory
  /// freed on it after the work queued meanwhile.
  template <element T>
  stream_buffer<T> scaled_by_ranks(const T* in, std::size_t n, std::string_view) {
    return cuda::scaled_by_ranks(in, n, size(), stream_.get());
  }

  /// Queues one rank's plan over device buffers on stream(); returns once it is queued (the
  /// host has traded its messages with the peers). `in`/`out` hold in_count/out_count
  /// elements (in may equal out: in place; buffers that overlap otherwise are an error).
  template <element T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view operation) {
    const bool staged = pl.staged();
    if (staged && pl.scratch_count() * sizeof(T) > max_staged_scratch_bytes) {
      throw error(operation, rank(), error::unknown,
                  "a staged plan needs " + std::to_string(pl.scratch_count() * sizeof(T)) +
                      " bytes of staging; the emulated transport has " +
                      std::to_string(max_staged_scratch_bytes));
    }
    const std::size_t sizes[3] = {in_count, out_count, pl.scratch_count()};
    detail::check_plan(pl, sizes, rank(), size(), operation);
    (void)plan_runs_in_place(in, in_count * sizeof(T), out, out_count * sizeof(T), operation,
                             rank()); // the receives land by buffer: one buffer, or two apart
    try {
      if (staged) ++staged_calls_; // the same count on every rank: they make the same calls
      T* scratch = static_cast<T*>(staged ? staging_of(rank())
                                          : scratch_.get(pl.scratch_count() * sizeof(T), *world_));
      T* const bufs[3] = {const_cast<T*>(in), out, scratch}; // input is only ever read
      if (pl.peer_access() && !staged) publish(pl, bufs, sizes, operation);
      run_rounds(pl, bufs, staged, op, operation);
    } catch (const error& e) {
      if (!e.operation().empty()) throw;
      throw error(operation, rank(), error::unknown,
                  detail::without_prefix(e.what())); // a CUDA call's failure
    }
  }

private:
  using message = detail::emulated_message;
  static constexpr int message_tag = -2; // the local transport's plans use -1, users >= 0

  communicator(std::unique_ptr<local::communicator> host,
               std::shared_ptr<detail::emulated_world> world, cudaStream_t after)
      : owned_host_(std::move(host)), host_(owned_host_.get()), world_(std::move(world)) {
    order_after(stream_.get(), after);
    exchange_staging("split");
  }

  // Work queued on `later` from now on runs after the work already queued on `earlier`.
  void order_after(cudaStream_t later, cudaStream_t earlier) {
    if (later == earlier) return;
    cudaEvent_t e = world_->events().take();
    WEFT_CUDA_TRY(cudaEventRecord(e, earlier));
    WEFT_CUDA_TRY(cudaStreamWaitEvent(later, e, 0));
    world_->events().give_back(e);
  }

  void exchange_staging(std::string_view operation) {
    staging_ = world_->allocate(2 * max_staged_scratch_bytes);
    stash_.assign(static_cast<std::size_t>(size()), {});
    peer_staging_.assign(static_cast<std::size_t>(size()), nullptr);
    peer_staging_[static_cast<std::size_t>(rank())] = staging_;
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) post(q, message::staging, 0, detail::word_of(staging_), 0, operation);
    }
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) {
        peer_staging_[static_cast<std::size_t>(q)] =
            detail::pointer_from<void*>(fetch(q, message::staging, operation).address());
      }
    }
  }

  // Rank q's staging area of the current staged call (the parity of the call count).
  [[nodiscard]] void* staging_of(int q) const {
    return static_cast<std::byte*>(peer_staging_[static_cast<std::size_t>(q)]) +
           (staged_calls_ & 1) * max_staged_scratch_bytes;
  }

  void post(int peer, message kind, std::int64_t event, std::int64_t address, std::int64_t count,
            std::string_view operation) {
    const std::int64_t words[4] = {static_cast<std::int64_t>(kind), event, address, count};
    try {
      host_->send(std::span<const std::int64_t>(words), peer, message_tag);
    } catch (const error& e) {
      throw error(operation, rank(), peer,
                  "posting a message: " + std::string(detail::without_prefix(e.what())));
    }
  }

  // The next message of `kind` from `peer`: set aside earlier, or received now, setting aside
  // those of other kinds that come first.
  detail::emulated_note fetch(int peer, message kind, std::string_view operation) {
    auto& aside = stash_[static_cast<std::size_t>(peer)];
    for (auto it = aside.begin(); it != aside.end(); ++it) {
      if (it->kind() == kind) {
        const detail::emulated_note n = *it;
        aside.erase(it);
        return n;
      }
    }
    for (;;) {
      detail::emulated_note n;
      try {
        host_->recv(std::span<std::int64_t>(n.words), peer, message_tag);
      } catch (const error& e) {
        throw error(operation, rank(), peer,
                    "waiting for its " + std::string(detail::name_of(kind)) +
                        " message: " + std::string(detail::without_prefix(e.what())));
      }
      if (n.kind() == kind) return n;
      aside.push_back(n);
    }
  }

  // An event marking the work queued on this rank's stream so far, as a message word.
  std::int64_t record() {
    cudaEvent_t e = world_->events().take();
    WEFT_CUDA_TRY(cudaEventRecord(e, stream_.get()));
    return detail::word_of(e);
  }

  // This rank's stream waits for a peer's event; the event goes back to the pool.
  void wait(std::int64_t event_word) {
    cudaEvent_t e = detail::pointer_from<cudaEvent_t>(event_word);
    WEFT_CUDA_TRY(cudaStreamWaitEvent(stream_.get(), e, 0));
    world_->events().give_back(e);
  }

  template <class T>
  void publish(const plan& pl, T* const (&bufs)[3], const std::size_t (&sizes)[3],
               std::string_view operation) {
    members_.clear();
    for (const auto& g : pl.groups()) {
      for (int q : g) {
        if (q != rank()) members_.push_back(q);
      }
    }
    std::sort(members_.begin(), members_.end());
    members_.erase(std::unique(members_.begin(), members_.end()), members_.end());
    for (int q : members_) {
      for (std::int64_t b = 0; b < 3; ++b) {
        post(q, message::buffers, b, detail::word_of(bufs[b]), static_cast<std::int64_t>(sizes[b]),
             operation);
      }
    }
    peer_buffers_.assign(static_cast<std::size_t>(size()), peer_buffers{});
    for (int q : members_) {
      auto& pb = peer_buffers_[static_cast<std::size_t>(q)];
      for (std::size_t b = 0; b < 3; ++b) {
        const detail::emulated_note n = fetch(q, message::buffers, operation);
        pb.data[b] = detail::pointer_from<const void*>(n.address());
        pb.sizes[b] = static_cast<std::size_t>(n.count());
      }
    }
  }

  // Elements [off, off + n) of rank q's buffer b, for a load.
  template <class T>
  const T* peer_range(int q, buffer b, std::size_t off, std::size_t n, bool staged,
                      T* const (&bufs)[3], std::string_view operation) const {
    if (staged) { // the peer's staging area of this call, the only buffer a staged plan reads
      check_staged_load(
          b == buffer::scratch && step_range_fits(off, n, max_staged_scratch_bytes / sizeof(T)),
          operation, rank(), q);
      return static_cast<const T*>(staging_of(q)) + off;
    }
    if (q == rank()) return bufs[static_cast<std::size_t>(b)] + off; // check_plan checked it
    const auto& pb = peer_buffers_[static_cast<std::size_t>(q)];
    const auto i = static_cast<std::size_t>(b);
    check_peer_range(off, n, pb.sizes[i], "a peer buffer", operation, rank(), q);
    return static_cast<const T*>(pb.data[i]) + off;
  }

  // The emulated transport's hooks for run_plan. A round's receives are queued on the stream
  // before its local steps, each landing in place or in a temporary of the round
  // (detail/receive_landing.hpp); its sends wait, at the round's end, for their receivers'
  // copies.
  template <class T, class Op>
  struct plan_run : plan_hooks {
    communicator& c;
    const plan& pl;
    T* const (&bufs)[3];
    bool staged;
    const Op& op;
    std::string_view operation;
    cudaStream_t s = nullptr;
    std::byte* temps = nullptr; // the current round's temporaries
    std::size_t first = 0;      // the current round's first step

    T* at(buffer b, std::size_t off) const { return bufs[static_cast<std::size_t>(b)] + off; }
    T* temporary(std::size_t k) const { return reinterpret_cast<T*>(temps + c.landing_[k]); }
    [[nodiscard]] std::span<const step> round(const plan_round& r) const {
      return {pl.steps().data() + r.begin, r.end - r.begin};
    }

    void at_step(const plan_round&, std::size_t, const step&) {} // no progress records
    void begin_round(const plan_round& r) {
      first = r.begin;
      const std::uintptr_t base[3] = {reinterpret_cast<std::uintptr_t>(bufs[0]),
                                      reinterpret_cast<std::uintptr_t>(bufs[1]),
                                      reinterpret_cast<std::uintptr_t>(bufs[2])};
      temps = static_cast<std::byte*>(
          c.temps_.get(detail::place_receives(round(r), base, sizeof(T), c.landing_), *c.world_));
    }
    // Sends: every source of the round is ready at this point of the stream.
    void send(std::size_t, const step& st) {
      c.post(st.peer, message::ready, c.record(), detail::word_of(at(st.src, st.src_offset)),
             static_cast<std::int64_t>(st.count), operation);
    }
    // Receives, queued before the local steps; each sender learns when its copy is queued.
    void sends_posted(const plan_round& r) {
      const std::span<const step> steps = round(r);
      for (std::size_t k = 0; k < steps.size(); ++k) {
        const step& st = steps[k];
        if (st.kind != step_kind::recv && st.kind != step_kind::recv_reduce) continue;
        const detail::emulated_note n = c.fetch(st.peer, message::ready, operation);
        if (static_cast<std::size_t>(n.count()) != st.count) {
          throw error(
              operation, c.rank(), st.peer,
              "the peer sends " + std::to_string(n.count()) +
                  " elements where this rank receives " + std::to_string(st.count) +
                  ": the ranks disagree on the call (set WEFT_CHECK_CALLS=1 to find where)");
        }
        c.wait(n.event());
        T* dst = c.landing_[k] == detail::lands_in_place ? at(st.dst, st.dst_offset) : temporary(k);
        WEFT_CUDA_TRY(cudaMemcpyAsync(dst, detail::pointer_from<const T*>(n.address()),
                                      st.count * sizeof(T), cudaMemcpyDeviceToDevice, s));
        c.post(st.peer, message::consumed, c.record(), 0, 0, operation);
      }
    }
    // Local steps, in plan order (k - first: the step's place in its round).
    void recv(std::size_t k, const step& st) {
      if (c.landing_[k - first] != detail::lands_in_place)
        cuda::copy(at(st.dst, st.dst_offset), temporary(k - first), st.count, s);
    }
    void recv_reduce(std::size_t k, const step& st) {
      cuda::reduce(at(st.dst, st.dst_offset), at(st.src, st.src_offset), temporary(k - first),
                   st.count, op, s);
    }
    void copy(std::size_t, const step& st) {
      cuda::copy(at(st.dst, st.dst_offset), at(st.src, st.src_offset), st.count, s);
    }
    void reduce(std::size_t, const step& st) {
      T* d = at(st.dst, st.dst_offset);
      cuda::reduce(d, d, at(st.src, st.src_offset), st.count, op, s);
    }
    void load(std::size_t, const step& st) {
      WEFT_CUDA_TRY(cudaMemcpyAsync(
          at(st.dst, st.dst_offset),
          c.peer_range(st.peer, st.src, st.src_offset, st.count, staged, bufs, operation),
          st.count * sizeof(T), cudaMemcpyDeviceToDevice, s));
    }
    void load_reduce(std::size_t, const step& st) {
      const auto& g = pl.group(st.peer);
      c.sources_.clear();
      for (int q : g)
        c.sources_.push_back(
            c.peer_range(q, st.src, st.src_offset, st.count, staged, bufs, operation));
      cuda::reduce(at(st.dst, st.dst_offset), reinterpret_cast<const T* const*>(c.sources_.data()),
                   static_cast<int>(c.sources_.size()), st.count, op, s);
    }
    void sync(std::size_t, const step& st) { c.sync_with(pl.group(st.peer), operation); }
    // Round end: no later step may overwrite a source before its receiver's copy has run.
    void end_round(const plan_round& r) {
      for (const step& st : round(r)) {
        if (st.kind == step_kind::send)
          c.wait(c.fetch(st.peer, message::consumed, operation).event());
      }
    }
  };

  template <class T, class Op>
  void run_rounds(const plan& pl, T* const (&bufs)[3], bool staged, const Op& op,
                  std::string_view operation) {
    plan_run<T, Op> hooks{{}, *this, pl, bufs, staged, op, operation, stream_.get(), nullptr, 0};
    run_plan(pl.steps(), hooks);
  }

  // Every member's stream waits for every other member's to reach this point.
  void sync_with(const std::vector<int>& members, std::string_view operation) {
    for (int q : members) {
      if (q != rank()) post(q, message::sync, record(), 0, 0, operation);
    }
    for (int q : members) {
      if (q != rank()) wait(fetch(q, message::sync, operation).event());
    }
  }

  struct peer_buffers {
    const void* data[3] = {nullptr, nullptr, nullptr};
    std::size_t sizes[3] = {0, 0, 0};
  };

  std::unique_ptr<local::communicator> owned_host_; // split's; the top level borrows run's
  local::communicator* host_;
  std::shared_ptr<detail::emulated_world> world_;
  cuda::stream stream_;
  void* staging_ = nullptr;         // two staging areas, parity 0 then 1
  std::vector<void*> peer_staging_; // every rank's, this one's included
  std::uint64_t staged_calls_ = 0;  // staged plans run: its parity picks the staging area
  detail::device_area scratch_;
  detail::device_area temps_;
  std::vector<peer_buffers> peer_buffers_; // published at the start of the current plan
  std::vector<std::deque<detail::emulated_note>>
      stash_; // per peer: messages received before asked for
  // Reused host scratch of run_rounds.
  std::vector<std::size_t> landing_;
  std::vector<int> members_;
  std::vector<const void*> sources_;
};

/// Runs fn(communicator&) on one rank per device of `cluster`, every rank a thread with its
/// own stream on the current device; ranks are grouped into the cluster's nodes. Returns when
/// all have returned and their streams are idle; rethrows the first failure. A weft::error,
/// before any thread starts, where there is no CUDA device.
template <class F>
void run(const topology::cluster& cluster, F&& fn, options opt = {}) {
  const int device = detail::current_device("cuda::emulated::run");
  auto world = std::make_shared<detail::emulated_world>(device);
  local::run(
      cluster,
      [&](local::communicator& host) {
        WEFT_CUDA_TRY(cudaSetDevice(device)); // each thread starts on device 0
        communicator c(host, world);
        fn(c);
        c.synchronize();
      },
      local::options{.timeout = opt.timeout});
}

/// Runs fn on n ranks, all on one node.
template <class F>
void run(int n, F&& fn, options opt = {}) {
  WEFT_EXPECTS(n >= 1, "cuda::emulated::run: the number of ranks must be at least 1");
  run(topology::host(n), std::forward<F>(fn), opt);
}

} // namespace weft::cuda::emulated

#pragma once
// weft::cuda::nccl: ranks as GPUs joined by an NCCL communicator. Collectives take device
// buffers and run stream-ordered on the communicator's stream, with weft's plans (NCCL's
// send and receive between the ranks, weft's kernels for the local copies and reductions)
// or, with algo::vendor, with NCCL's own collective. The default, algo::automatic, prices
// NCCL's own collective with a model of NCCL's tuning (comm/plan/nccl_model.hpp, fed with
// this communicator's links and its GPU's LL128 and NVLink SHARP support: vendor_price) beside
// weft's plans, and takes NCCL's unless a plan of weft's is priced lower;
// weft::automatic_choice says which, without running the call.
//
//   ncclComm_t comm = ...;  cudaStream_t stream = ...;               // the program's own
//   auto c = weft::cuda::nccl::communicator::borrow(comm, stream);   // weft never destroys them
//   weft::all_reduce(c, std::span(grad, n));                         // grad: device memory
//   weft::all_reduce<weft::algo::vendor>(c, std::span(grad, n));     // ncclAllReduce itself
//   // non-blocking, weft's own
//   auto owned = weft::cuda::nccl::communicator::init_rank(id, rank, size);
//
// Plan execution. Each round is one ncclGroupStart/ncclGroupEnd holding all of its sends
// and receives, followed by its local steps in plan order as kernels on the stream (the
// device execution rule): a receive lands straight in its destination unless an earlier
// step of its round reads or writes an overlapping range of that buffer (in place, input
// and output are one buffer); then, like every recv_reduce, it lands in a temporary, copied
// or reduced into place when its turn comes. Nothing waits on the host for the data, so a
// collective can be captured into a CUDA graph; only a non-blocking NCCL call that answers
// ncclInProgress (ncclGroupEnd while NCCL connects two ranks) is polled until it settles. NCCL
// ranks cannot load from each other (peer_access is false): a plan with peer-access steps
// (algo::direct, hierarchical<direct, ...>) is refused with a weft::error before anything is
// queued, and automatic never picks one.
//
// Device memory. The plan's scratch and the temporaries live in one device buffer the
// communicator keeps and grows to the largest call. It grows stream-ordered: cudaMallocAsync
// for the new block, cudaFreeAsync for the old one on the same stream, so the old block is
// released only after the work already queued (which may still use it) and the host never
// waits. A block that a captured call used is not freed when a later, larger call grows the
// scratch: the graph points into it, so it is kept until release_graph_scratch() (once those
// graphs are destroyed and their last launches have finished: a destroyed graph still in
// flight completes) or until the communicator goes, which graphs must not outlive. Inside a
// CUDA graph capture it cannot grow (the graph would free memory it did not allocate): run the
// call once before capturing, or reserve() the bytes first. The memory comes from weft's pool
// (cuda/memory.cuh).
//
// Blocking calls. barrier(), split(), synchronize() and the host-span send/recv/sendrecv
// (what WEFT_CHECK_CALLS uses) wait on the host until the stream is idle, polling with the
// communicator's deadline (set_timeout, default 5 minutes); they cannot run while the
// stream is being captured. send/recv stage through a small device buffer and first send a
// header (tag, count, type), so a receiver that expects another message gets a weft::error,
// not a hang or truncated data. NCCL has no tags: messages between two ranks match in order,
// and the tag is only checked.
//
// Threads. One host thread or process per rank: a plan's rounds are separate NCCL groups
// with kernels between them, so one thread cannot drive several ranks (their groups would
// wait on each other). A communicator is used by one thread at a time; it makes its device
// current around each call. The communicators weft makes (init_rank, init_all, split) are
// non-blocking (ncclConfig_t::blocking = 0); a borrowed or adopted one may be either, and weft
// polls every answer of ncclInProgress (a blocking one's calls wait without weft's deadline).
// Never call weft inside your own ncclGroupStart/ncclGroupEnd: NCCL would hold a plan's sends
// and receives until your ncclGroupEnd, while the kernels between its rounds run at once.
//
// Node locality, which hierarchical<> and automatic use, comes from the first of:
//   options::topology   a weft::topology::cluster: emulated nodes, rank r on its device r
//   WEFT_TOPOLOGY       a topology spec in the environment: emulated likewise
//   options::node_of    a node label per rank (from_mpi fills it with the real nodes)
//   one node            every rank on one node
// Links are NVLink within a node and InfiniBand across, at the topology defaults, unless a
// topology gives them. devices()[r] is rank r's device in cluster(), numbered node-major.
//
// Failure. CUDA and NCCL errors become weft::error naming the call, the operation, the
// rank and, where there is one, the peer. Every host wait (the blocking calls, synchronize,
// an NCCL call's ncclInProgress) polls ncclCommGetAsyncError, where a peer's failure shows,
// and ends at the deadline. Then the ranks no longer agree on where they are, so the
// communicator fails (detail/comm_state.hpp): an owned NCCL communicator is aborted at once
// (ncclCommAbort, which ends its kernels), and every later call on the communicator, or on any
// communicator split from it or that it was split from, throws at once with the first
// failure's message. Before the error leaves the call, an aborted communicator's stream drains:
// the abort ends NCCL's kernels, and weft's copy and reduce kernels queued behind them, which
// write the call's buffers, then finish; the wait is bounded (by the deadline, and at least
// 10 s: the stream may hold the program's own kernels too), and a stream still busy then ends
// the job (weft's message, then options::end_job or std::abort: MPI_Abort under
// from_mpi), whatever on_failure says, since returning would leave work queued that writes the
// caller's buffers (detail/comm_state.hpp). So once a call has thrown, its buffers are the
// caller's. A borrowed one is not aborted (it is the program's, which aborts it and waits for the
// stream before reusing the call's buffers). options::on_failure chooses between throwing (the
// default) and ending the job (weft/comm/failure.hpp). Errors found before anything is queued (a
// bad buffer, a plan for another rank) leave the communicator usable. Destruction is bounded by
// the deadline: ncclCommFinalize polled until NCCL is quiet, then ncclCommDestroy, or else
// ncclCommAbort. NCCL connects two ranks inside the first call that joins them; with a
// non-blocking communicator that handshake answers ncclInProgress and so has the deadline too.
#include <weft/comm/failure.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/check.hpp>
#include <weft/comm/plan/engine.hpp>
#include <weft/comm/plan/nccl_model.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>
#include <weft/cuda/detail/comm_state.hpp>
#include <weft/cuda/detail/device_alignment.hpp>
#include <weft/cuda/detail/device_plan_layout.hpp>
#include <weft/cuda/detail/nccl_handle.cuh>
#include <weft/cuda/detail/rank_placement.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/detail/stream_memory.cuh>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/cuda/types.cuh>
#include <weft/topology/topology.hpp>

#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::cuda {

/// The operators NCCL's own collectives have: weft's sum, prod, min, max and avg.
template <class Op>
concept nccl_reduction = std::same_as<Op, op::sum> || std::same_as<Op, op::prod> ||
    std::same_as<Op, op::min> || std::same_as<Op, op::max> || std::same_as<Op, op::avg>;

/// NCCL's name for a weft operator.
template <nccl_reduction Op>
inline constexpr ncclRedOp_t nccl_op_of = [] {
  if constexpr (std::same_as<Op, op::sum>)
    return ncclSum;
  else if constexpr (std::same_as<Op, op::prod>)
    return ncclProd;
  else if constexpr (std::same_as<Op, op::min>)
    return ncclMin;
  else if constexpr (std::same_as<Op, op::max>)
    return ncclMax;
  else
    return ncclAvg;
}();

namespace nccl {

struct options {
  /// Deadline of every host-side wait (barrier, split, synchronize, send/recv), of every NCCL
  /// call that answers ncclInProgress, and of destruction.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// Emulated nodes: ranks grouped as this cluster's nodes, rank r on its device r; its size
  /// must equal the communicator's.
  std::optional<topology::cluster> topology;
  /// node_of[r]: a label of rank r's node (ranks with equal labels share one), e.g. from the
  /// launcher. Empty: one node. Used when neither topology nor WEFT_TOPOLOGY is given.
  std::vector<int> node_of;
  /// What a failure (a deadline, NCCL's asynchronous error, a peer's failure) does besides
  /// failing the communicator: throw (the default: the caller decides, and every later call
  /// throws at once), or print and end the job (weft/comm/failure.hpp).
  weft::on_failure on_failure = weft::on_failure::throw_error;
  /// How the job ends (on_failure::abort_job, or a stream that does not drain after an abort),
  /// after weft's message: nullptr is std::abort(); from_mpi gives MPI_Abort.
  void (*end_job)() noexcept = nullptr;
};

class communicator {
public:
  /// NCCL ranks cannot load from each other's buffers: plans of algo::direct are refused.
  static constexpr bool peer_access = false;
  static constexpr std::string_view transport_name = "nccl";

  /// Wraps the program's communicator and stream; weft destroys neither, and both keep
  /// working after this object is gone. Both must outlive it. `stream` runs everything
  /// weft queues (nullptr: the legacy default stream); it must belong to comm's device.
  static communicator borrow(ncclComm_t comm, cudaStream_t stream, const options& opt = {}) {
    return communicator(detail::nccl_comm_handle(comm, false), stream, false, opt);
  }
  /// Takes `comm` over: it is destroyed with this object (also when this call throws). A
  /// non-null `stream` is borrowed; nullptr makes a stream of its own on comm's device.
  static communicator adopt(ncclComm_t comm, cudaStream_t stream = nullptr,
                            const options& opt = {}) {
    return communicator(detail::nccl_comm_handle(comm, true), stream, stream == nullptr, opt);
  }
  /// A new communicator (ncclCommInitRank) on the current device, as rank `rank` of `size`
  /// ranks that share `id` (made by ncclGetUniqueId on one rank and given to all). Collective:
  /// every rank calls it, from its own thread or process. `stream` as for adopt().
  static communicator init_rank(const ncclUniqueId& id, int rank, int size,
                                cudaStream_t stream = nullptr, const options& opt = {}) {
    constexpr std::string_view operation = "nccl::communicator";
    ncclComm_t comm = nullptr;
    ncclConfig_t config = detail::nonblocking_config();
    const auto deadline = std::chrono::steady_clock::now() + opt.timeout;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    if (const std::string why =
            detail::nccl_settle_new(comm, r, "ncclCommInitRankConfig", deadline, opt.timeout);
        !why.empty()) {
      throw error(operation, rank, error::unknown, why);
    }
    return adopt(comm, stream, opt);
  }
  /// One communicator per device of `cuda_devices` (rank r on cuda_devices[r], initialized in
  /// one NCCL group as ncclCommInitAll does, non-blocking), each owning a stream on its device.
  /// Drive each from its own thread.
  static std::vector<communicator> init_all(const std::vector<int>& cuda_devices,
                                            const options& opt = {}) {
    constexpr std::string_view operation = "nccl::communicator";
    const int n = static_cast<int>(cuda_devices.size());
    ncclUniqueId id{};
    detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", operation, error::unknown);
    std::vector<ncclComm_t> comms(cuda_devices.size(), nullptr);
    std::vector<detail::nccl_comm_handle> owned; // so that all are aborted if one step throws
    owned.reserve(comms.size());
    ncclResult_t group_end = ncclSuccess;
    {
      detail::nccl_check(ncclGroupStart(), "ncclGroupStart", operation, error::unknown);
      ncclResult_t r = ncclSuccess;
      int failed_rank = error::unknown;
      for (int q = 0; q < n && r == ncclSuccess; ++q) {
        ncclConfig_t config = detail::nonblocking_config();
        const detail::device_scope on(cuda_devices[static_cast<std::size_t>(q)]);
        r = ncclCommInitRankConfig(&comms[static_cast<std::size_t>(q)], n, id, q, &config);
        if (r != ncclSuccess && r != ncclInProgress) failed_rank = q;
        if (r == ncclInProgress) r = ncclSuccess;
      }
      group_end = ncclGroupEnd();
      for (ncclComm_t c : comms) {
        if (c != nullptr) owned.emplace_back(c, true);
      }
      detail::nccl_check(r, "ncclCommInitRankConfig", operation, failed_rank);
    }
    const auto deadline = std::chrono::steady_clock::now() + opt.timeout;
    for (int q = 0; q < n; ++q) {
      ncclComm_t c = owned[static_cast<std::size_t>(q)].get();
      const ncclResult_t r = group_end == ncclSuccess ? detail::nccl_async_state(c) : group_end;
      owned[static_cast<std::size_t>(q)].forget(); // nccl_settle_new aborts it if it fails
      if (const std::string why =
              detail::nccl_settle_new(c, r, "ncclCommInitRankConfig", deadline, opt.timeout);
          !why.empty()) {
        throw error(operation, q, error::unknown, why);
      }
      owned[static_cast<std::size_t>(q)] = detail::nccl_comm_handle(c, true);
    }
    std::vector<communicator> all;
    for (auto& c : owned)
      all.push_back(communicator(std::move(c), nullptr, true, opt));
    return all;
  }

  communicator(communicator&&) noexcept = default;
  /// What this one owned goes as in the destructor (finalized or aborted, in member order).
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      std::destroy_at(this);
      std::construct_at(this, std::move(o));
    }
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// Releases what it owns, within timeout(): an owned NCCL communicator is finalized
  /// (ncclCommFinalize, polled until NCCL is quiet) and destroyed once the stream's work is
  /// done; it is aborted instead (ncclCommAbort, which waits for no peer) when the work or the
  /// finalize takes longer than timeout(), when NCCL reports an error, when the family failed,
  /// or after abort_on_destroy(). A borrowed one is left as it is. Never hangs on a dead peer
  /// (a blocking communicator that was adopted finalizes as NCCL's blocking calls do).
  ~communicator() {
    if (comm_.get() != nullptr) close();
  }

  /// Raises NCCL's asynchronous error of this communicator (ncclCommGetAsyncError), if any:
  /// the communicator fails (aborted, when owned) and this throws weft::error naming
  /// `operation`, or ends the job under on_failure::abort_job. Throws the family's failure at
  /// once if it has failed. For a caller that polls its own work on the stream
  /// (weft::cuda::work::wait does).
  void check_async_error(std::string_view operation, int peer = error::unknown) {
    enter(operation);
    poll_async_error(operation, peer);
  }

  /// An owned NCCL communicator is then aborted (ncclCommAbort) when this goes, not finalized:
  /// for a caller that knows a peer is gone. No effect on a borrowed one.
  void abort_on_destroy() noexcept { abort_on_destroy_ = true; }

  /// Fails the communicator and its family now, with `why` as the failure every later call
  /// quotes, and aborts the NCCL communicator if it is owned (at once, waiting for no peer),
  /// then waits (at most timeout(), and at least 10 s) for its stream to drain, so that no queued
  /// work writes a call's buffers once this returns: for a program that learned of a failure
  /// elsewhere. Does not throw; ends the job only when the stream does not drain (see the header
  /// comment).
  void abort(std::string_view why = "aborted by the program") {
    if (comm_.get() == nullptr) return;
    const error e("abort", rank_, error::unknown, why);
    if (state_.fail(e.what()) == detail::comm_action::abort) abort_and_drain(e.what());
  }

  /// Whether the communicator (or one of its family) has failed: every call then throws.
  [[nodiscard]] bool failed() const noexcept { return state_.family()->failed(); }
  /// The first failure of the family ("" while there is none).
  [[nodiscard]] std::string failure() const { return state_.family()->what(); }
  [[nodiscard]] weft::on_failure failure_policy() const noexcept { return state_.policy(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The CUDA device of this rank (ncclCommCuDevice).
  [[nodiscard]] int cuda_device() const noexcept { return device_; }
  [[nodiscard]] ncclComm_t native() const noexcept { return comm_.get(); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_->get(); }
  [[nodiscard]] bool owns_comm() const noexcept { return comm_.owned(); }
  [[nodiscard]] bool owns_stream() const noexcept { return stream_->owned(); }
  /// devices()[r]: rank r's device in cluster() (node-major numbering).
  [[nodiscard]] const std::vector<int>& devices() const noexcept { return place_.devices; }
  /// node_of()[r]: the node of rank r, an index into cluster()'s nodes.
  [[nodiscard]] const std::vector<int>& node_of() const noexcept { return place_.node_of; }
  [[nodiscard]] const topology::cluster& cluster() const noexcept { return *place_.cluster; }
  /// Whether the nodes are emulated (options::topology or WEFT_TOPOLOGY).
  [[nodiscard]] bool emulated_nodes() const noexcept { return place_.emulated; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  /// Grows the device scratch to at least `bytes` now (stream-ordered), so that calls up to
  /// that size can be captured into a CUDA graph.
  void reserve(std::size_t bytes) {
    enter("reserve");
    const detail::device_scope on(device_);
    scratch_.reserve(bytes, "reserve", rank_);
  }

  /// Frees the superseded scratch kept for CUDA graphs that captured calls of this communicator
  /// (after the work queued so far): call once those graphs are destroyed and their last
  /// launches have finished (synchronize the streams they ran on: a destroyed graph still in
  /// flight runs to its end, reading this memory). Without it the memory goes with the
  /// communicator.
  void release_graph_scratch() noexcept {
    scratch_.release_retired(); // stream-ordered on the communicator's stream: no device switch
    staging_.release_retired();
  }
  /// Bytes of superseded scratch kept for CUDA graphs (release_graph_scratch frees them).
  [[nodiscard]] std::size_t graph_scratch_bytes() const noexcept {
    return scratch_.retired_bytes() + staging_.retired_bytes();
  }

  /// Waits until the work queued on the stream is done, at most timeout(): a peer that
  /// never joins gives a weft::error instead of a hang (and fails the communicator).
  void synchronize() {
    constexpr std::string_view operation = "synchronize";
    enter(operation);
    const detail::device_scope on(device_);
    wait_idle(operation, error::unknown, "finish the work queued on the stream");
  }

  // --- point to point: blocking host calls on host spans (see the header comment) ------

  template <element T>
  void send(std::span<const T> data, int peer, int tag = 0) {
    check_peer(peer, "send");
    exchange<T>(data.data(), data.size(), peer, nullptr, 0, -1, tag, "send");
  }
  template <element T>
  void send(std::span<T> data, int peer, int tag = 0) {
    send(std::span<const T>(data), peer, tag);
  }
  template <element T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    check_peer(peer, "recv");
    exchange<T>(nullptr, 0, -1, data.data(), data.size(), peer, tag, "recv");
  }
  /// Sends `out` to `to` and receives `in` from `from` at once (no deadlock when two ranks
  /// exchange).
  template <element T>
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) {
    check_peer(to, "sendrecv");
    check_peer(from, "sendrecv");
    exchange<T>(out.data(), out.size(), to, in.data(), in.size(), from, tag, "sendrecv");
  }

  /// An all-reduce of one int on the device, then a wait for it: every rank has entered
  /// when it returns. Blocking (see the header comment).
  void barrier() {
    constexpr std::string_view operation = "barrier";
    const detail::device_scope on(device_);
    begin_host_call(operation, error::unknown);
    auto* word = reinterpret_cast<int*>(staging_.reserve(sizeof(int), operation, rank_));
    detail::cuda_check(cudaMemsetAsync(word, 0, sizeof(int), stream()), "cudaMemsetAsync",
                       operation, rank_);
    check_nccl(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm_.get(), stream()),
               "ncclAllReduce", operation);
    wait_idle(operation, error::unknown, "have every rank enter the barrier");
  }

  /// Splits into communicators of the ranks with the same color (>= 0), ordered by (key,
  /// rank), with ncclCommSplit. Collective and blocking. The result owns its NCCL
  /// communicator, shares this one's stream (so their work stays in order) and keeps its
  /// cluster: its rank r sits on the same device as before.
  /// As split(), but the child queues on a stream of its own (made on this communicator's
  /// device) that starts after the work queued on this one so far: a side stream whose
  /// collectives overlap this one's work (weft::cuda::async_communicator). Collective.
  communicator split_with_stream(int color, int key) {
    communicator c = split(color, key);
    const detail::device_scope on(device_);
    auto own = std::make_shared<const cuda::stream>();
    const cuda::event after;
    after.record(stream());
    detail::cuda_check(cudaStreamWaitEvent(own->get(), after.get(), 0), "cudaStreamWaitEvent",
                       "split", rank_);
    c.stream_ = own;
    c.scratch_ = detail::stream_memory(own);
    c.staging_ = detail::stream_memory(own);
    return c;
  }

  communicator split(int color, int key) {
    WEFT_EXPECTS(color >= 0, "nccl::communicator::split: color must be >= 0");
    constexpr std::string_view operation = "split";
    const detail::device_scope on(device_);
    // Gathering first, with a deadline, means ncclCommSplit (which has none) starts only
    // when every rank has arrived; the table also gives the children's placement.
    const int mine[2] = {color, key};
    const std::vector<int> table = all_gather_ints(mine, operation);
    std::vector<std::pair<int, int>> members; // (key, rank) of my color
    for (int r = 0; r < size_; ++r) {
      if (table[static_cast<std::size_t>(2 * r)] == color)
        members.emplace_back(table[static_cast<std::size_t>(2 * r + 1)], r);
    }
    std::sort(members.begin(), members.end());
    detail::rank_placement child_place;
    child_place.cluster = place_.cluster;
    child_place.emulated = place_.emulated;
    int expected_rank = -1;
    for (const auto& [k, r] : members) {
      if (r == rank_) expected_rank = static_cast<int>(child_place.devices.size());
      child_place.devices.push_back(place_.devices[static_cast<std::size_t>(r)]);
      child_place.node_of.push_back(place_.node_of[static_cast<std::size_t>(r)]);
    }
    ncclComm_t child = nullptr;
    ncclConfig_t config = detail::nonblocking_config();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    const ncclResult_t r = ncclCommSplit(comm_.get(), color, key, &child, &config);
    {
      detail::nccl_comm_handle held(child, true); // aborted if the parent fails
      check_nccl(r, "ncclCommSplit", operation);  // the parent settles first, then the child
      held.forget();
    }
    const std::string why = detail::nccl_settle_new(child, detail::nccl_async_state(child),
                                                    "ncclCommSplit", deadline, timeout_);
    if (!why.empty()) fail_now(why, operation, error::unknown); // the ranks are out of step
    communicator c(detail::nccl_comm_handle(child, true), stream_, std::move(child_place), timeout_,
                   *this);
    if (c.rank_ != expected_rank || c.size_ != static_cast<int>(members.size())) {
      throw error(operation, rank_, error::unknown,
                  "ncclCommSplit placed this rank at " + std::to_string(c.rank_) + " of " +
                      std::to_string(c.size_) + ", weft expected " + std::to_string(expected_rank) +
                      " of " + std::to_string(members.size()));
    }
    return c;
  }

  /// Queues one rank's plan over its device buffers on the stream (no host wait). `in`/`out`
  /// hold in_count/out_count elements (in may equal out: in place).
  template <element T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view operation) {
    enter(operation);
    if (pl.peer_access()) {
      throw error(
          operation, rank_, error::unknown,
          "the plan loads from peers' buffers (algo::direct, alone or inside hierarchical<>), and "
          "NCCL ranks "
          "cannot: use ring, tree, halving_doubling, hierarchical<ring, ...>, automatic or vendor");
    }
    check_plan_rank(pl, rank_, size_, operation);
    // Everything is checked before anything is queued: a bad call leaves the stream as it was.
    const std::size_t sizes[3] = {in_count, out_count, pl.scratch_count()};
    const bool in_place =
        plan_runs_in_place(in, in_count * sizeof(T), out, out_count * sizeof(T), operation, rank_);
    // The plan's scratch starts the device scratch, on a boundary of device_alignment.
    const std::size_t phase[3] = {reinterpret_cast<std::uintptr_t>(in) % detail::pack_bytes,
                                  reinterpret_cast<std::uintptr_t>(out) % detail::pack_bytes, 0};
    detail::lay_out(pl, rank_, size_, sizes, sizeof(T), in_place, phase, operation, layout_);
    const detail::device_scope on(device_);
    check_buffers(in, in_count, out, out_count, operation);
    std::byte* const base = scratch_.reserve(layout_.bytes(), operation, rank_);
    std::byte* const temps = base + layout_.scratch_bytes;
    T* const bufs[3] = {const_cast<T*>(in), out,
                        reinterpret_cast<T*>(base)}; // input is only ever read
    plan_run<T, Op> hooks{{}, *this, pl, bufs, temps, op, operation, stream(), {}};
    run_plan(pl.steps(), hooks);
  }

  /// NCCL's own collective C (algo::vendor), on the same buffers and counts as execute's
  /// plans use (plan.hpp's table). op::avg is NCCL's ncclAvg, so the caller does not divide.
  template <collective C, element T, class Op>
  void vendor(const T* in, std::size_t in_count, T* out, std::size_t out_count, std::size_t count,
              int root, const Op&) {
    static_assert(
        nccl_reduction<Op>,
        "weft: algo::vendor runs NCCL's own collectives, whose operators are weft::op::sum, prod, "
        "min, max "
        "and avg; for a user functor use one of weft's algorithms (algo::ring, algo::tree, "
        "algo::automatic, ...)");
    if constexpr (nccl_reduction<Op>)
      vendor_run<C>(in, in_count, out, out_count, count, root, nccl_op_of<Op>);
  }

  /// What automatic reads to weigh NCCL's own collective C against weft's plans: NCCL's time
  /// for q as comm/plan/nccl_model.hpp models it on this communicator's links and GPU. Only
  /// for NCCL's operators (for a user functor automatic picks among weft's plans). Every rank
  /// must see the same features (one GPU type, as NCCL's own tuning assumes), so that all
  /// ranks choose alike.
  template <collective C, class T, class Op>
  requires nccl_reduction<Op>
  [[nodiscard]] std::optional<double> vendor_price(const plan_request& q) const {
    return cost_model::nccl_price(q, cluster(), features_).seconds;
  }
  /// What automatic adds to a plan's price per round: each round is an NCCL group, an NCCL
  /// kernel launch of its own (comm/plan/nccl_model.hpp).
  [[nodiscard]] static constexpr double plan_round_seconds() noexcept {
    return cost_model::nccl_plan_round_seconds;
  }
  /// The GPU's support for NCCL's LL128 protocol and NVLink SHARP, as vendor_price uses it.
  [[nodiscard]] const cost_model::nccl_features& features() const noexcept { return features_; }

  /// out[i] /= size() on the stream: avg's last step after a plan (device buffers).
  template <element T>
  void divide(T* out, std::size_t n) {
    enter("divide");
    const detail::device_scope on(device_);
    cuda::divide(out, n, size_, stream());
  }

  /// in's n elements times 1/size() on the stream, in memory freed on it after the work queued
  /// meanwhile: avg's first step on half before a plan (device buffers). The input is checked
  /// before anything is queued.
  template <element T>
  stream_buffer<T> scaled_by_ranks(const T* in, std::size_t n, std::string_view operation) {
    enter(operation);
    const detail::device_scope on(device_);
    if (!detail::capturing(stream())) check_device_memory(in, n, "input", operation);
    return cuda::scaled_by_ranks(in, n, size_, stream());
  }

private:
  template <collective C, element T>
  void vendor_run(const T* in, std::size_t in_count, T* out, std::size_t out_count,
                  std::size_t count, int root, ncclRedOp_t op) {
    constexpr std::string_view operation = name_of(C);
    enter(operation);
    const auto p = static_cast<std::size_t>(size_);
    const bool blocks_in = input_per_rank(C);
    const bool blocks_out = output_per_rank(C);
    const std::size_t want_in = blocks_in ? count * p : count;
    const std::size_t want_out = blocks_out ? count * p : count;
    const bool output_used = C != collective::reduce || rank_ == root;
    if (in_count != want_in || (output_used && out_count != want_out)) {
      throw error(operation, rank_, error::unknown,
                  "vendor " + std::string(operation) + " of " + std::to_string(count) + " on " +
                      std::to_string(size_) + " ranks needs an input of " +
                      std::to_string(want_in) + " elements and an output of " +
                      std::to_string(output_used ? want_out : 0) + ", not " +
                      std::to_string(in_count) + " and " + std::to_string(out_count));
    }
    if (count == 0) return; // the same on every rank: nobody calls NCCL
    const detail::device_scope on(device_);
    check_buffers(in, in_count, out, output_used ? out_count : 0, operation);
    constexpr ncclDataType_t type = nccl_type_of<T>;
    const cudaStream_t s = stream();
    ncclComm_t c = comm_.get();
    if constexpr (C == collective::all_reduce) {
      check_nccl(ncclAllReduce(in, out, count, type, op, c, s), "ncclAllReduce", operation);
    } else if constexpr (C == collective::reduce_scatter) {
      check_nccl(ncclReduceScatter(in, out, count, type, op, c, s), "ncclReduceScatter", operation);
    } else if constexpr (C == collective::all_gather) {
      check_nccl(ncclAllGather(in, out, count, type, c, s), "ncclAllGather", operation);
    } else if constexpr (C == collective::broadcast) {
      check_nccl(ncclBroadcast(in, out, count, type, root, c, s), "ncclBroadcast", operation);
    } else if constexpr (C == collective::reduce) {
      check_nccl(ncclReduce(in, out, count, type, op, root, c, s), "ncclReduce", operation);
    } else {
      if (size_ > 1) {
        group g(*this, operation);
        for (int q = 0; q < size_; ++q) {
          if (q == rank_) continue;
          const std::size_t at = static_cast<std::size_t>(q) * count;
          check_nccl(ncclSend(in + at, count, type, q, c, s), "ncclSend", operation, q);
          check_nccl(ncclRecv(out + at, count, type, q, c, s), "ncclRecv", operation, q);
        }
        g.end();
      }
      const std::size_t mine = static_cast<std::size_t>(rank_) * count;
      cuda::copy(out + mine, in + mine, count, s);
    }
  }

  // One ncclGroupStart/ncclGroupEnd; closed on the way out by an exception too, so the
  // thread's NCCL group state stays balanced. A failure inside the group closes it before it
  // aborts the NCCL communicator (fail_now): the group still holds its calls.
  class group {
  public:
    group(communicator& c, std::string_view operation) : c_(c), operation_(operation) {
      c_.check_nccl(ncclGroupStart(), "ncclGroupStart", operation_);
      c_.group_open_ = true;
    }
    group(const group&) = delete;
    group& operator=(const group&) = delete;
    ~group() {
      if (!c_.group_open_) return;
      c_.group_open_ = false;
      (void)ncclGroupEnd();
    }
    void end() {
      c_.group_open_ = false;
      c_.check_nccl(ncclGroupEnd(), "ncclGroupEnd", operation_); // polled while NCCL connects
    }

  private:
    communicator& c_;
    std::string_view operation_;
    bool open_ = true;
  };

  // The NCCL transport's hooks for run_plan: a round with messages is one NCCL group of its
  // sends and then its receives, each receive landing where layout_ says; the local steps
  // follow on the stream. (lay_out refused peer-access steps.)
  template <class T, class Op>
  struct plan_run : plan_hooks_without_peer_access {
    communicator& c;
    const plan& pl;
    T* const (&bufs)[3];
    std::byte* temps;
    const Op& op;
    std::string_view operation;
    cudaStream_t s;
    std::optional<group> g; // the current round's, while it is open

    static constexpr ncclDataType_t type = nccl_type_of<T>;
    T* src(const step& st) const { return bufs[static_cast<std::size_t>(st.src)] + st.src_offset; }
    T* dst(const step& st) const { return bufs[static_cast<std::size_t>(st.dst)] + st.dst_offset; }
    T* landing(std::size_t k) const {
      const std::size_t t = c.layout_.temp[k];
      return t == detail::device_plan_layout::direct ? dst(pl.steps()[k])
                                                     : reinterpret_cast<T*>(temps + t);
    }
    static bool message(step_kind kind) {
      return kind == step_kind::send || kind == step_kind::recv || kind == step_kind::recv_reduce;
    }

    void at_step(const plan_round&, std::size_t, const step&) {} // no progress records
    void end_round(const plan_round&) {} // the stream orders the next round after this one
    void begin_round(const plan_round& r) {
      const auto& steps = pl.steps();
      for (std::size_t k = r.begin; k < r.end; ++k) {
        if (message(steps[k].kind)) {
          g.emplace(c, operation);
          return;
        }
      }
    }
    void send(std::size_t, const step& st) {
      c.check_nccl(ncclSend(src(st), st.count, type, st.peer, c.comm_.get(), s), "ncclSend",
                   operation, st.peer);
    }
    void sends_posted(const plan_round& r) {
      if (!g) return;
      const auto& steps = pl.steps();
      for (std::size_t k = r.begin; k < r.end; ++k) {
        const step& st = steps[k];
        if (st.kind == step_kind::recv || st.kind == step_kind::recv_reduce) {
          c.check_nccl(ncclRecv(landing(k), st.count, type, st.peer, c.comm_.get(), s), "ncclRecv",
                       operation, st.peer);
        }
      }
      g->end();
      g.reset();
    }
    void recv(std::size_t k, const step& st) {
      if (c.layout_.temp[k] != detail::device_plan_layout::direct)
        cuda::copy(dst(st), landing(k), st.count, s);
    }
    void recv_reduce(std::size_t k, const step& st) {
      cuda::reduce(dst(st), src(st), landing(k), st.count, op, s);
    }
    void copy(std::size_t, const step& st) { cuda::copy(dst(st), src(st), st.count, s); }
    void reduce(std::size_t, const step& st) {
      cuda::reduce(dst(st), dst(st), src(st), st.count, op, s);
    }
  };

  // What a host-span message announces before its data.
  struct message_header {
    std::int64_t tag = 0;
    std::int64_t count = 0;
    std::int64_t type = 0;
    friend bool operator==(const message_header&, const message_header&) = default;
  };
  static constexpr std::size_t header_words = sizeof(message_header) / sizeof(std::int64_t);

  communicator(detail::nccl_comm_handle comm, cudaStream_t s, bool own_stream, const options& opt)
      : comm_(std::move(comm)),
        state_(detail::nccl_codes, comm_.owned(), nullptr, opt.on_failure),
        timeout_(opt.timeout),
        end_job_(opt.end_job) {
    constexpr std::string_view operation = "nccl::communicator";
    WEFT_EXPECTS(comm_.get() != nullptr, "nccl::communicator: the ncclComm_t is null");
    read_comm(operation);
    if (own_stream) {
      const detail::device_scope on(device_);
      stream_ = std::make_shared<const cuda::stream>();
    } else {
      if (s != nullptr) {
        int d = -1;
        detail::cuda_check(cudaStreamGetDevice(s, &d), "cudaStreamGetDevice", operation, rank_);
        if (d != device_) {
          throw error(operation, rank_, error::unknown,
                      "the stream belongs to device " + std::to_string(d) +
                          " and the NCCL communicator to device " + std::to_string(device_) +
                          ": give a stream of the communicator's device");
        }
      }
      stream_ = std::make_shared<const cuda::stream>(cuda::stream::borrow(s));
    }
    place_ = detail::place_ranks(size_, opt.topology, std::getenv("WEFT_TOPOLOGY"), opt.node_of);
    scratch_ = detail::stream_memory(stream_);
    staging_ = detail::stream_memory(stream_);
  }

  // A communicator made by split: owns `comm`, shares the parent's stream, cluster, failure
  // policy and family (a failure of either fails both).
  communicator(detail::nccl_comm_handle comm, std::shared_ptr<const cuda::stream> s,
               detail::rank_placement place, std::chrono::milliseconds timeout,
               const communicator& parent)
      : stream_(std::move(s)),
        comm_(std::move(comm)),
        state_(detail::nccl_codes, true, parent.state_.family(), parent.state_.policy()),
        place_(std::move(place)),
        timeout_(timeout),
        scratch_(stream_),
        staging_(stream_),
        end_job_(parent.end_job_) {
    read_comm("split");
  }

  void read_comm(std::string_view operation) {
    check_nccl(ncclCommUserRank(comm_.get(), &rank_), "ncclCommUserRank", operation);
    check_nccl(ncclCommCount(comm_.get(), &size_), "ncclCommCount", operation);
    check_nccl(ncclCommCuDevice(comm_.get(), &device_), "ncclCommCuDevice", operation);
    // NCCL runs LL128 on sm_70, sm_80 and sm_90, and NVLS where the GPU (sm_90 and later)
    // supports multicast objects, which only an NVSwitch system gives.
    int major = 0;
    int minor = 0;
    detail::cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_),
                       "cudaDeviceGetAttribute", operation, rank_);
    detail::cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_),
                       "cudaDeviceGetAttribute", operation, rank_);
    features_.ll128 = minor == 0 && major >= 7 && major <= 9;
    features_.nvls = major >= 9 && multicast_supported(device_);
  }

  // Whether the device supports multicast objects (NVSwitch), which the runtime API does not
  // report: the driver's attribute, through the runtime's entry point (no link to libcuda).
  // Unknown (CUDA before 12.5, an old driver) counts as no.
  static bool multicast_supported(int device) {
#if CUDART_VERSION >= 12050
    using get_attribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == nullptr) {
      (void)cudaGetLastError();
      return false;
    }
    int multicast = 0;
    return reinterpret_cast<get_attribute>(fn)(&multicast, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
                                               device) == CUDA_SUCCESS &&
           multicast != 0;
#else
    (void)device;
    return false;
#endif
  }

  // A host call starts: throws at once (aborting this one's NCCL communicator if it still
  // holds it) when the family has failed.
  void enter(std::string_view operation) {
    switch (state_.enter()) {
      case detail::comm_action::proceed: return;
      case detail::comm_action::abort: abort_and_drain(state_.family()->what()); break;
      default: break;
    }
    state_.family()->rethrow(operation, rank_);
  }

  // An NCCL call answered `r`: an answer of ncclInProgress is polled (ncclCommGetAsyncError)
  // until it settles, at most timeout(); an error, an asynchronous error or the deadline fails
  // the communicator.
  void check_nccl(ncclResult_t r, std::string_view call, std::string_view operation,
                  int peer = error::unknown) {
    detail::comm_action a = state_.returned(static_cast<int>(r));
    if (a == detail::comm_action::proceed) return;
    if (a == detail::comm_action::record_failure)
      fail_now(nccl_failure_text(r, call), operation, peer);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    ncclResult_t async = ncclInProgress;
    (void)detail::poll_until(
        [&] {
          async = detail::nccl_async_state(comm_.get());
          a = state_.polled(static_cast<int>(async), true, false);
          return a == detail::comm_action::poll ? cudaErrorNotReady : cudaSuccess;
        },
        deadline, [] {});
    if (a == detail::comm_action::poll) a = state_.polled(static_cast<int>(async), true, true);
    if (a == detail::comm_action::proceed) return;
    if (state_.last_verdict() == detail::poll_verdict::timed_out) {
      fail_now("timed out after " + std::to_string(timeout_.count()) + " ms waiting for " +
                   std::string(call) +
                   " to complete (NCCL answered ncclInProgress; is every rank alive and making the "
                   "same calls "
                   "in the same order?)",
               operation, peer);
    }
    fail_now(nccl_failure_text(async, std::string(call) + " (asynchronously)"), operation, peer);
  }

  std::string nccl_failure_text(ncclResult_t r, std::string_view call) const {
    return detail::nccl_failure_text(r, call, comm_.get());
  }

  // The communicator fails with `what`: recorded as the family's failure (the first one
  // stays), the NCCL communicator aborted if owned (the open group, if any, closed first: it
  // holds its calls); then the job ended under on_failure::abort_job, or else the aborted
  // one's stream drained and the error thrown.
  [[noreturn]] WEFT_COLD void fail_now(const std::string& what, std::string_view operation,
                                       int peer) {
    const error e(operation, rank_, peer, what + fate());
    const bool abort = state_.fail(e.what()) == detail::comm_action::abort;
    if (abort) {
      if (group_open_) {
        group_open_ = false;
        (void)ncclGroupEnd();
      }
      abort_native();
    }
    if (state_.ends_job()) detail::end_job(e.what(), end_job_);
    if (abort) drain(e.what());
    throw e;
  }

  // What becomes of the NCCL communicator after a failure, for the message.
  std::string fate() const {
    if (state_.holds_native()) return "; the NCCL communicator is aborted and cannot be used again";
    if (comm_.get() != nullptr && !comm_.owned()) {
      return "; the NCCL communicator (the program's own) cannot be used again: abort it "
             "(ncclCommAbort) and wait "
             "for the stream before reusing the call's buffers";
    }
    return "";
  }

  void abort_native() noexcept {
    if (comm_.get() != nullptr && comm_.owned()) (void)ncclCommAbort(comm_.get());
    comm_.forget();
    state_.aborted();
  }

  void abort_and_drain(const std::string& what) noexcept {
    abort_native();
    drain(what);
  }

  // After an abort: waits, at most detail::drain_bound(timeout()), until nothing queued on the
  // stream runs any more (the abort ended NCCL's kernels, and weft's kernels behind them, which
  // write the failed call's buffers, finish). A stream still busy then ends the job: returning
  // into the program with that work queued would break the promise that a call that threw holds
  // no buffer of the caller's (detail/comm_state.hpp). `what`: the failure, for that message.
  void drain(const std::string& what) noexcept {
    detail::comm_action a = detail::comm_action::poll;
    const auto look = [&](bool bound_passed) {
      const cudaError_t e = cudaStreamQuery(stream());
      const detail::stream_poll p = e == cudaSuccess         ? detail::stream_poll::idle
                                    : e == cudaErrorNotReady ? detail::stream_poll::busy
                                                             : detail::stream_poll::broken;
      a = detail::judge_drain(p, bound_passed);
    };
    int previous = -1; // the device, made current without throwing
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    (void)detail::poll_until(
        [&] {
          look(false);
          return a == detail::comm_action::poll ? cudaErrorNotReady : cudaSuccess;
        },
        std::chrono::steady_clock::now() + detail::drain_bound(timeout_), [] {});
    if (a == detail::comm_action::poll) look(true);
    if (switched) (void)cudaSetDevice(previous);
    if (a == detail::comm_action::end_job) {
      detail::end_job(
          what + "\nweft: the stream of rank " + std::to_string(rank_) +
              " did not go idle within " + std::to_string(detail::drain_bound(timeout_).count()) +
              " ms after the NCCL communicator was aborted, and the work still queued on it may "
              "write the failed call's buffers: weft ends the job rather than return into the "
              "program (whatever options::on_failure says)",
          end_job_, "the stream did not drain");
    }
  }

  // Polls NCCL's asynchronous error once: an error fails the communicator.
  void poll_async_error(std::string_view operation, int peer) {
    const ncclResult_t async = detail::nccl_async_state(comm_.get());
    if (state_.polled(static_cast<int>(async), false, false) ==
        detail::comm_action::record_failure) {
      fail_now(nccl_failure_text(async,
                                 "an NCCL operation (asynchronous error: a peer may have failed)"),
               operation, peer);
    }
  }

  // Destruction, bounded by timeout() (see ~communicator). Never throws.
  void close() noexcept {
    try {
      const detail::device_scope on(device_);
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      bool abort_now = abort_on_destroy_;
      if (state_.holds_native() && !abort_now && !state_.family()->failed()) {
        // The stream's work first: NCCL's asynchronous error ends the wait early.
        const cudaError_t e = detail::poll_until(
            [this] {
              const ncclResult_t async = detail::nccl_async_state(comm_.get());
              if (async != ncclSuccess && async != ncclInProgress) return cudaErrorUnknown;
              return cudaStreamQuery(stream());
            },
            deadline, [] {});
        abort_now = e != cudaSuccess;
      }
      detail::comm_action a = state_.destroy_begin(abort_now);
      if (a == detail::comm_action::finalize) {
        a = state_.finalize_returned(static_cast<int>(ncclCommFinalize(comm_.get())));
        if (a == detail::comm_action::poll) {
          (void)detail::poll_until(
              [&] {
                a = state_.finalize_polled(static_cast<int>(detail::nccl_async_state(comm_.get())),
                                           false);
                return a == detail::comm_action::poll ? cudaErrorNotReady : cudaSuccess;
              },
              deadline, [] {});
          if (a == detail::comm_action::poll) {
            a = state_.finalize_polled(static_cast<int>(detail::nccl_async_state(comm_.get())),
                                       true);
          }
        }
      }
      if (a == detail::comm_action::destroy) (void)ncclCommDestroy(comm_.get());
      if (a == detail::comm_action::abort) (void)ncclCommAbort(comm_.get());
      comm_.forget();
      state_.destroyed();
    } catch (...) {
      // comm_ still holds an owned communicator: its handle aborts it.
    }
  }

  void check_peer(int peer, std::string_view operation) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw error(operation, rank_, peer,
                  "peer outside the communicator of " + std::to_string(size_) + " ranks");
    }
  }

  // Plain host memory would reach NCCL or a kernel as an invalid address: say so instead.
  // Skipped while the stream is captured, where weft makes no calls beyond the capture's.
  template <class T>
  void check_buffers(const T* in, std::size_t in_count, const T* out, std::size_t out_count,
                     std::string_view operation) const {
    if (detail::capturing(stream())) return;
    check_device_memory(in, in_count, "input", operation);
    check_device_memory(out, out_count, "output", operation);
  }
  void check_device_memory(const void* p, std::size_t n, std::string_view which,
                           std::string_view operation) const {
    if (n == 0) return;
    cudaPointerAttributes a{};
    const cudaError_t e = p == nullptr ? cudaErrorInvalidValue : cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw error(operation, rank_, error::unknown,
                  "the " + std::string(which) + " (" + std::to_string(n) +
                      " elements) is not a valid device buffer: " + detail::cuda_error_text(e));
    }
    if (a.type == cudaMemoryTypeUnregistered) {
      throw error(operation, rank_, error::unknown,
                  "the " + std::string(which) +
                      " is host memory, and the NCCL transport runs on device buffers "
                      "(cudaMalloc, cudaMallocAsync or managed memory)");
    }
    if (a.type == cudaMemoryTypeDevice && a.device != device_) {
      throw error(operation, rank_, error::unknown,
                  "the " + std::string(which) + " is on device " + std::to_string(a.device) +
                      ", and this rank's NCCL communicator on device " + std::to_string(device_));
    }
  }

  // A host-visible call starts from an idle stream: the earlier work must not be waited
  // for without a deadline (a pageable copy would), and a capture cannot be waited for.
  void begin_host_call(std::string_view operation, int peer) {
    enter(operation);
    if (detail::capturing(stream())) {
      throw error(operation, rank_, peer,
                  "a blocking call cannot run while the stream is being captured into a CUDA graph "
                  "(turn WEFT_CHECK_CALLS off around captures)");
    }
    wait_idle(operation, peer, "finish the work queued on the stream before it");
  }

  // Polls the stream until it is idle, at most timeout(), and NCCL's asynchronous error
  // between polls; an error, an asynchronous error or the deadline fails the communicator.
  void wait_idle(std::string_view operation, int peer, std::string_view what) {
    const cudaError_t e = detail::poll_until([this] { return cudaStreamQuery(stream()); },
                                             std::chrono::steady_clock::now() + timeout_,
                                             [&] { poll_async_error(operation, peer); });
    if (e == cudaSuccess) {
      poll_async_error(operation, peer); // an error NCCL raised as the work ended
      return;
    }
    if (e != cudaErrorNotReady) {
      fail_now("cudaStreamQuery failed: " + detail::cuda_error_text(e), operation, peer);
    }
    fail_now("timed out after " + std::to_string(timeout_.count()) + " ms waiting to " +
                 std::string(what) +
                 " (is every rank alive and making the same calls in the same order?)",
             operation, peer);
  }

  void to_device(void* dst, const void* src, std::size_t bytes, std::string_view operation) {
    if (bytes == 0) return;
    detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()),
                       "cudaMemcpyAsync", operation, rank_);
  }
  // The stream is idle when this is called, so the copy neither waits for a peer nor blocks.
  void to_host(void* dst, const void* src, std::size_t bytes, std::string_view operation) {
    if (bytes == 0) return;
    detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()),
                       "cudaMemcpyAsync", operation, rank_);
    wait_idle(operation, error::unknown, "copy a message to the host");
  }

  // Sends out[0, out_n) to `to` and receives in[0, in_n) from `from` (-1: none), headers
  // first: both directions' headers, checked, then both directions' data, each exchange one
  // NCCL group so that two ranks that send to each other do not deadlock.
  template <element T>
  void exchange(const T* out, std::size_t out_n, int to, T* in, std::size_t in_n, int from, int tag,
                std::string_view operation) {
    const int peer = from >= 0 ? from : to;
    const detail::device_scope on(device_);
    begin_host_call(operation, peer);
    constexpr std::size_t a = detail::device_alignment;
    const std::size_t out_at = 2 * a;
    const std::size_t in_at = out_at + detail::device_aligned(out_n * sizeof(T));
    std::byte* const base = staging_.reserve(in_at + in_n * sizeof(T), operation, rank_);
    const auto describe = [](const message_header& h) {
      const auto type = static_cast<dtype>(h.type);
      return std::to_string(h.count) + " x " + std::string(name_of(type)) + " tag " +
             std::to_string(h.tag);
    };
    const message_header mine{tag, static_cast<std::int64_t>(out_n),
                              static_cast<std::int64_t>(dtype_of<T>)};
    const message_header expected{tag, static_cast<std::int64_t>(in_n),
                                  static_cast<std::int64_t>(dtype_of<T>)};
    if (to >= 0) {
      to_device(base, &mine, sizeof mine, operation);
      to_device(base + out_at, out, out_n * sizeof(T), operation);
    }
    {
      group g(*this, operation);
      if (to >= 0)
        check_nccl(ncclSend(base, header_words, ncclInt64, to, comm_.get(), stream()), "ncclSend",
                   operation, to);
      if (from >= 0) {
        check_nccl(ncclRecv(base + a, header_words, ncclInt64, from, comm_.get(), stream()),
                   "ncclRecv", operation, from);
      }
      g.end();
    }
    wait_idle(operation, peer, "exchange message headers with it");
    if (from >= 0) {
      message_header theirs;
      to_host(&theirs, base + a, sizeof theirs, operation);
      if (!(theirs == expected)) {
        // The sender's data will never be received: the ranks are out of step.
        fail_now("expected " + describe(expected) + " but the peer sent " + describe(theirs) +
                     ": the ranks disagree on the call (set WEFT_CHECK_CALLS=1 to find where)",
                 operation, from);
      }
    }
    const bool sending = to >= 0 && out_n != 0;
    const bool receiving = from >= 0 && in_n != 0;
    if (!sending && !receiving) return;
    {
      group g(*this, operation);
      if (sending) {
        check_nccl(ncclSend(base + out_at, out_n, nccl_type_of<T>, to, comm_.get(), stream()),
                   "ncclSend", operation, to);
      }
      if (receiving) {
        check_nccl(ncclRecv(base + in_at, in_n, nccl_type_of<T>, from, comm_.get(), stream()),
                   "ncclRecv", operation, from);
      }
      g.end();
    }
    wait_idle(operation, peer,
              sending && receiving ? "exchange a message with it"
                                   : (sending ? "send to it" : "receive from it"));
    if (receiving) to_host(in, base + in_at, in_n * sizeof(T), operation);
  }

  // Every rank's n ints, rank-major. Blocking, with the deadline.
  template <std::size_t N>
  std::vector<int> all_gather_ints(const int (&mine)[N], std::string_view operation) {
    begin_host_call(operation, error::unknown);
    const std::size_t all_at = detail::device_alignment;
    std::byte* const base = staging_.reserve(
        all_at + N * sizeof(int) * static_cast<std::size_t>(size_), operation, rank_);
    to_device(base, mine, sizeof mine, operation);
    check_nccl(ncclAllGather(base, base + all_at, N, ncclInt32, comm_.get(), stream()),
               "ncclAllGather", operation);
    wait_idle(operation, error::unknown, "gather from every rank");
    std::vector<int> all(N * static_cast<std::size_t>(size_));
    to_host(all.data(), base + all_at, all.size() * sizeof(int), operation);
    return all;
  }

  // The destructor releases the NCCL communicator first (close()); then, in declaration order
  // reversed, the memory (which keeps the stream alive itself), then the stream.
  std::shared_ptr<const cuda::stream> stream_;
  detail::nccl_comm_handle comm_;
  detail::comm_state state_; // after comm_, whose ownership it is made from
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  cost_model::nccl_features features_; // read with the communicator's device
  detail::rank_placement place_;
  std::chrono::milliseconds timeout_;
  detail::stream_memory scratch_{nullptr}; // the plan's scratch, then the temporaries
  detail::stream_memory staging_{nullptr}; // barrier, split and send/recv
  detail::device_plan_layout layout_;      // of the current call; a member so its storage is reused
  void (*end_job_)() noexcept = nullptr;   // on_failure::abort_job's end; nullptr: std::abort()
  bool abort_on_destroy_ = false;
  bool group_open_ = false; // inside a group: a failure closes it before it aborts
};

} // namespace nccl
} // namespace weft::cuda

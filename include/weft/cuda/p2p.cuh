#pragma once
// weft::cuda::p2p: ranks on the GPUs of one node that load from and store to each other's
// memory (peer access over NVLink or PCIe, or several ranks on one GPU), running weft's
// peer-access plans (algo::direct) entirely on the device: no host wait inside a call, so a
// call can be captured into a CUDA graph. This is the small-message regime, where a one-shot
// all-reduce (copy to a staging area, one sync, every rank reduces every peer's staging) or a
// two-shot one (reduce-scatter by loads, sync, gather by loads) beats a ring of messages.
//
//   weft::cuda::p2p::run({0, 1, 2, 3}, [](weft::cuda::p2p::communicator& c) {   // rank r on GPU r
//     weft::all_reduce<weft::algo::direct>(c, std::span(d_grad, n));            // on c.stream()
//   });
//   weft::cuda::p2p::run({0, 0, 0}, f);                  // three ranks sharing GPU 0
//   auto c = weft::cuda::p2p::from_mpi(node_comm);        // processes (weft/cuda/p2p_mpi.cuh)
//
// Registered workspace. At creation each rank allocates one workspace (options::workspace_bytes
// of data, plus its flags and staging areas, detail/p2p_plan.hpp) and learns every peer's
// address once: plain pointers between threads (peer access enabled between distinct devices,
// else weft::error), CUDA IPC handles between processes. Peers never touch the caller's
// buffers. A call copies its input into its workspace's input region, runs the plan with the
// input, output and scratch buffers mapped to workspace regions (a load from rank q's buffer b
// reads q's region of b), then copies the output region to the caller's output; a call whose
// regions do not fit is a weft::error naming the sizes (max_count() says the largest call that
// fits; weft::two_level cuts its calls to it). A staged plan (direct's small all-reduce) skips
// both copies: its peers load only its scratch, which is a staging area, two of them
// alternated by the staged calls as in weft::local.
//
// Fused all-reduce. direct's one-shot all-reduce (its staged plan) and its two-shot one on 2 to
// 8 ranks (and its copy on one rank) run as one kernel each (detail/p2p_fused.hpp, .cuh), the
// copy in, the syncs, the reduction in group order, avg's scaling (half) or division and the
// gather inside it, where the plan step by step is 3 launches (4 with avg) one-shot and
// 4 + (p - 1) two-shot. Which calls
// take it is read from the plan (detail::p2p_fused_shape_of) with buffers of the plan's count;
// its barriers are the syncs of detail/p2p_sync.cuh, counted once per call per pair as the plan's
// syncs are, so fused and step-by-step calls mix in any order. Its blocks wait for each other,
// so the grid is at most the device's SMs divided by the communicator's ranks on it. Through
// weft::all_reduce the whole call is fused (execute_whole); execute() fuses the plan and leaves
// avg's steps to its caller. Not run on a GPU yet: the index math, the shape, the avg arithmetic
// and the barrier's epochs are host-tested (comm_detail_p2p_fused_test).
//
// Steps of every other plan, all queued on the rank's stream in plan order: copy and reduce are
// weft::cuda's kernels; load is a copy kernel reading the peer's memory; load_reduce reduces the
// group's regions in group order (so every rank gets the same bits); sync is the flag kernel of
// detail/p2p_sync.cuh. send, recv and recv_reduce are refused (weft::error): p2p runs
// peer-access plans only, so algo::ring and the other message-passing algorithms need another
// transport, and algo::automatic works here only where it picks direct.
//
// CUDA graphs. Syncs count on the device, so a captured call stays right when it is replayed.
// A captured staged call uses a third staging area and ends with a sync (a replay cannot
// alternate), so captured and direct calls mix in any order. A captured fused call is one
// kernel node whose parameters (addresses, sync numbers) hold at every replay: its epochs are
// the device's counters, its grid barrier waits for the generation word to move from the value
// each block reads at run time, and a captured one-shot call ends with a second barrier.
// Capture the same calls on every rank, in thread-local or relaxed mode (global mode forbids
// the peers' threads the calls they make meanwhile). barrier(), synchronize() and split() wait
// for the stream: not during a capture. send/recv (and so WEFT_CHECK_CALLS) use the host
// communicator only, so they may.
//
// Failure. A sync waits for its peers at most options::sync_timeout on the device; then it
// writes the rank and the missing peer into a host-mapped word and returns. The host reads
// that word when it next looks (every call, barrier(), synchronize(), check()) and throws
// weft::error naming the operation whose sync timed out, the rank and the peer. Host waits
// have options::timeout as their deadline. Either failure fails the communicator for good,
// and the communicators split from it (or that it was split from) with it: every later call
// throws at once with the first failure's message, and nothing more is queued. On the device
// the failure invalidates the rank's sync epochs (detail/p2p_epoch.hpp): its later syncs give
// up without publishing an epoch, and its peers find its flags abandoned, so none of them
// passes a sync on a flag of the failed call; each fails at its next sync with it instead. The
// rank's copy, reduce and load kernels after a sync that gave up do nothing (each block reads
// the rank's failed mark first), so no data moves past it, into the workspace or the caller's
// output. Results of the failed call are garbage. options::on_failure chooses between throwing
// (the default) and printing the error and ending the job (weft/comm/failure.hpp; MPI_Abort
// under from_mpi). Ranks that share a device rely on their streams
// running at once and on no kernel loading late: call configure_shared_device() first.
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/failure.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/engine.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>
#include <weft/cuda/detail/p2p_endpoint.cuh>
#include <weft/cuda/detail/p2p_fused.cuh>
#include <weft/cuda/detail/p2p_fused.hpp>
#include <weft/cuda/detail/p2p_plan.hpp>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/topology/topology.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::cuda::p2p {

struct options {
  /// Bytes of each rank's data area: a call's input, output and scratch regions must fit in
  /// it (staged all-reduces need none of it). Every rank must give the same.
  std::size_t workspace_bytes = std::size_t{64} << 20;
  /// How long a sync waits on the device for its peers before it reports a timeout: the most
  /// that ranks may drift apart between two syncs.
  std::chrono::milliseconds sync_timeout = std::chrono::seconds(30);
  /// Deadline of every host-side wait (creation, barrier, synchronize, split, send/recv).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// What a failure (a sync that gave up, a host deadline, a launch that failed part-way) does
  /// besides failing the communicator: throw (the default: every later call throws at once), or
  /// print and end the job (weft/comm/failure.hpp). Splits inherit it.
  weft::on_failure on_failure = weft::on_failure::throw_error;
  /// How on_failure::abort_job ends the job, after weft's message: nullptr is std::abort();
  /// from_mpi gives MPI_Abort.
  void (*end_job)() noexcept = nullptr;
};

template <class Host>
class basic_communicator;

/// For ranks that share one device (threads of one process, p2p::run with a device repeated):
/// call before the process's first CUDA call. It gives each stream a hardware queue of its own
/// (CUDA_DEVICE_MAX_CONNECTIONS=32, detail/p2p_sync.cuh) and loads every kernel when the
/// process starts (CUDA_MODULE_LOADING=EAGER): a kernel loaded lazily at its first launch may
/// wait for the device, and so for a peer's sync that spins until this rank arrives. It
/// overrides values already set (some images set CUDA_DEVICE_MAX_CONNECTIONS=1). Ranks on
/// devices of their own need neither.
inline void configure_shared_device() {
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
}

} // namespace weft::cuda::p2p

namespace weft::cuda::detail {

/// Ranks whose host communicator is weft::local are threads of one process: they trade plain
/// pointers. Any other (weft::mpi) trades CUDA IPC handles.
template <class Host>
inline constexpr bool p2p_same_process = std::is_same_v<Host, local::communicator>;

/// run()'s check that ranks sharing a device have what configure_shared_device() sets, read from
/// the environment, where CUDA reads it when the process's context is made.
inline void p2p_check_shared_device(const std::vector<int>& devices, std::string_view who) {
  int most = 0;
  int device = -1;
  for (int d : devices) {
    const auto n = static_cast<int>(std::count(devices.begin(), devices.end(), d));
    if (n > most) {
      most = n;
      device = d;
    }
  }
  if (most < 2) return;
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const int queues = connections != nullptr ? std::atoi(connections) : 8; // CUDA's default: 8
  if (loading != nullptr && std::string_view(loading) == "EAGER" && queues >= most) return;
  throw error("weft: " + std::string(who) + ": " + std::to_string(most) + " ranks share device " +
              std::to_string(device) + ", which needs CUDA_MODULE_LOADING=EAGER (it is " +
              (loading != nullptr ? std::string(loading) : std::string("unset")) +
              ") and CUDA_DEVICE_MAX_CONNECTIONS of at least the ranks (it is " +
              (connections != nullptr ? std::string(connections) : std::string("unset: 8")) +
              "): call cuda::p2p::configure_shared_device() before the program's first CUDA call, "
              "or set both in "
              "the environment; otherwise a rank's kernels can wait behind another rank's spinning "
              "sync until it "
              "times out");
}

/// Makes communicators for run() and from_mpi(), whose constructor takes internals.
struct p2p_factory {
  template <class Host, class... Args>
  static p2p::basic_communicator<Host> make(Args&&... args) {
    return p2p::basic_communicator<Host>(std::forward<Args>(args)...);
  }
};

/// What a rank tells its peers about its workspace at creation, as int64 words.
struct p2p_address {
  static constexpr std::size_t ipc_words = (sizeof(cudaIpcMemHandle_t) + 7) / 8;
  static constexpr std::size_t words = 3 + ipc_words; // pointer, device, bytes, IPC handle
};

} // namespace weft::cuda::detail

namespace weft::cuda::p2p {

/// A rank of a p2p communicator whose host-side traffic (creation, split, send/recv) goes
/// over Host: weft::local::communicator for threads (p2p::communicator, made by run()),
/// weft::mpi::communicator for processes (p2p::mpi_communicator, made by from_mpi()).
template <class Host>
class basic_communicator {
public:
  /// Ranks load from each other's workspaces: what algo::direct needs.
  static constexpr bool peer_access = true;
  /// Loads only: no sends or receives, so algo::automatic offers only algo::direct here and
  /// an explicit message-passing algorithm is a compile-time error.
  static constexpr bool messages = false;
  static constexpr std::string_view transport_name = "p2p";

  basic_communicator(basic_communicator&&) noexcept = default;
  /// Lets go of this communicator's memory first, as the destructor does.
  basic_communicator& operator=(basic_communicator&& other) noexcept {
    if (this == &other) return *this;
    tear_down();
    owned_host_ = std::move(other.owned_host_);
    host_ = other.host_;
    world_ = std::move(other.world_);
    cluster_ = std::move(other.cluster_);
    ep_ = std::move(other.ep_);
    staged_calls_ = other.staged_calls_;
    ranks_on_device_ = other.ranks_on_device_;
    return *this;
  }
  basic_communicator(const basic_communicator&) = delete;
  basic_communicator& operator=(const basic_communicator&) = delete;
  /// Collective between processes: the ranks sync, close their mappings of each other's
  /// workspaces, meet at a barrier of the host communicator, then free their own
  /// (detail/p2p_teardown.hpp). Threads leave their memory to their run. Never throws.
  ~basic_communicator() { tear_down(); }

  [[nodiscard]] int rank() const noexcept { return ep_->rank(); }
  [[nodiscard]] int size() const noexcept { return ep_->size(); }
  /// The CUDA device of this rank.
  [[nodiscard]] int device() const noexcept { return ep_->device(); }
  /// The stream this rank's collectives are queued on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return ep_->stream(); }
  /// devices()[r]: rank r's device in cluster(), which is one node of NVLink-joined devices.
  [[nodiscard]] const std::vector<int>& devices() const noexcept { return host_->devices(); }
  [[nodiscard]] const std::vector<int>& node_of() const noexcept { return host_->node_of(); }
  [[nodiscard]] const topology::cluster& cluster() const noexcept { return *cluster_; }
  /// Bytes of this rank's data area (options::workspace_bytes, rounded up).
  [[nodiscard]] std::size_t workspace_bytes() const noexcept { return ep_->layout().data_bytes; }
  /// The largest count of one call of collective c, of elements of element_size bytes, whose
  /// input and output regions fit the workspace (direct's plans; a staged all-reduce needs none
  /// of it). weft::two_level cuts its calls on this level to it.
  [[nodiscard]] std::size_t max_count(collective c, std::size_t element_size) const noexcept {
    return detail::p2p_max_count(c, size(), element_size, workspace_bytes());
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return ep_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) {
    WEFT_EXPECTS(t.count() > 0,
                 "cuda::p2p::communicator::set_timeout: the timeout must be positive");
    ep_->set_timeout(t);
    host_->set_timeout(t);
  }
  /// How long a sync queued from now on waits for its peers on the device.
  [[nodiscard]] std::chrono::milliseconds sync_timeout() const noexcept {
    return ep_->sync_timeout();
  }
  void set_sync_timeout(std::chrono::milliseconds t) {
    WEFT_EXPECTS(t.count() > 0,
                 "cuda::p2p::communicator::set_sync_timeout: the timeout must be positive");
    ep_->set_sync_timeout(t);
  }
  /// The host communicator that creation, split and send/recv use.
  [[nodiscard]] Host& host() noexcept { return *host_; }

  /// Queues later collectives on s, the caller's stream (of this rank's device; never
  /// destroyed here), after the work already queued on the current one.
  void set_stream(cudaStream_t s) {
    const detail::device_scope on(device());
    ep_->set_stream(s);
  }
  /// Waits until this rank's queued work is done (at most timeout()); throws weft::error if
  /// a sync timed out.
  void synchronize() {
    const detail::device_scope on(device());
    ep_->wait_idle("synchronize", "finish the work queued on the stream");
  }
  /// Throws weft::error if the communicator has failed: a sync of this rank gave up so far (it
  /// reads a host word, and waits for nothing: what the device has not finished yet shows
  /// later), or an earlier call failed, here or in a communicator of its family.
  void check() const { ep_->check("check"); }
  /// Whether the communicator (or one of its family) has failed: every call then throws.
  [[nodiscard]] bool failed() const noexcept { return ep_->family()->failed(); }
  /// The first failure of the family ("" while there is none).
  [[nodiscard]] std::string failure() const { return ep_->family()->what(); }
  [[nodiscard]] weft::on_failure failure_policy() const noexcept { return ep_->policy(); }

  // --- point to point on host memory, what WEFT_CHECK_CALLS uses: the host communicator's ----
  // (threads: weft::local's mailbox; processes: MPI). They never touch the device or stream.
  template <element T>
  void send(std::span<const T> data, int peer, int tag = 0) {
    ep_->check("send");
    host_->send(data, peer, tag);
  }
  template <element T>
  void send(std::span<T> data, int peer, int tag = 0) {
    send(std::span<const T>(data), peer, tag);
  }
  template <element T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    ep_->check("recv");
    host_->recv(data, peer, tag);
  }
  template <element T>
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) {
    ep_->check("sendrecv");
    host_->sendrecv(out, to, in, from, tag);
  }

  /// A sync of every rank on the stream, then a wait for it: every rank has entered when it
  /// returns. Blocking.
  void barrier() {
    constexpr std::string_view operation = "barrier";
    const detail::device_scope on(device());
    not_capturing(operation);
    ep_->check(operation);
    ep_->sync(ep_->everyone(), operation);
    ep_->wait_idle(operation, "have every rank enter the barrier");
  }

  /// The ranks with the same color (>= 0), ordered by (key, rank), with workspaces of their
  /// own (this one's options) and a new stream that starts after the work queued on this one.
  /// Collective over this communicator; blocking.
  basic_communicator split(int color, int key) {
    WEFT_EXPECTS(color >= 0, "cuda::p2p::communicator::split: color must be >= 0");
    constexpr std::string_view operation = "split";
    const detail::device_scope on(device());
    not_capturing(operation);
    ep_->check(operation);
    auto child = std::make_unique<Host>(host_->split(color, key));
    options opt{.workspace_bytes = ep_->layout().data_bytes,
                .sync_timeout = sync_timeout(),
                .timeout = timeout(),
                .on_failure = ep_->policy(),
                .end_job = ep_->end_job()};
    return basic_communicator(nullptr, std::move(child), device(), opt, world_, stream(), operation,
                              ep_->family());
  }

  /// avg's last step, on this rank's stream.
  template <element T>
  void divide(T* data, std::size_t n) {
    ep_->check("divide");
    const detail::device_scope on(device());
    cuda::divide(data, n, size(), stream(), ep_->data_gate());
  }

  /// avg's first step on half: in's n elements times 1/size(), on this rank's stream, in memory
  /// freed on it after the work queued meanwhile. The input is checked before anything is queued.
  template <element T>
  stream_buffer<T> scaled_by_ranks(const T* in, std::size_t n, std::string_view operation) {
    ep_->check(operation);
    const detail::device_scope on(device());
    if (!detail::capturing(stream())) check_device_buffer(in, n, "input", operation);
    return cuda::scaled_by_ranks(in, n, size(), stream(), ep_->data_gate());
  }

  /// Queues one rank's plan over device buffers on stream() and returns: nothing waits on the
  /// host. `in`/`out` hold in_count/out_count elements (in may equal out: in place). Every
  /// check comes before anything is queued, so a refused call leaves the stream as it was.
  template <element T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view operation) {
    run_call(pl, in, in_count, out, out_count, op, operation, detail::p2p_average::none);
  }

  /// The whole call where a fused kernel runs the plan (detail/p2p_fused.hpp: direct's one-shot
  /// and two-shot all-reduce), op::avg's scaling or division inside it, and true; false, with
  /// nothing queued, for any other plan, which the caller runs by execute() and avg's own steps.
  template <element T, class Op>
  bool execute_whole(const plan& pl, const T* in, std::size_t in_count, T* out,
                     std::size_t out_count, const Op& op, std::string_view operation) {
    if (fused_shape(pl, in_count, out_count) == detail::p2p_fused_shape::none) return false;
    run_call(pl, in, in_count, out, out_count, op, operation, detail::p2p_average_of<T, Op>(true));
    return true;
  }

private:
  template <element T, class Op>
  void run_call(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
                const Op& op, std::string_view operation, detail::p2p_average average) {
    ep_->check(operation);
    const std::size_t sizes[3] = {in_count, out_count, pl.scratch_count()};
    const detail::p2p_call_layout lay = detail::p2p_lay_out_call(
        pl, rank(), size(), sizes, sizeof(T), ep_->layout().data_bytes, operation);
    const detail::device_scope on(device());
    const cudaStream_t s = stream();
    const bool capturing = detail::capturing(s);
    if (!capturing) { // weft makes no calls beyond the capture's while capturing
      check_device_buffer(in, in_count, "input", operation);
      check_device_buffer(out, out_count, "output", operation);
    }
    // A replayed graph cannot alternate staging areas: captured staged calls have their own.
    int area = 0;
    if (lay.staged)
      area = capturing ? detail::p2p_captured_staging : static_cast<int>(++staged_calls_ % 2);
    T* const mine[3] = {
        lay.staged ? const_cast<T*>(in) : region<T>(lay, area, rank(), buffer::input), // only read
        lay.staged ? out : region<T>(lay, area, rank(), buffer::output),
        region<T>(lay, area, rank(), buffer::scratch)};
    // Every data kernel asks the rank's failed mark first: none moves data past a sync that gave
    // up (detail/p2p_epoch.hpp).
    const detail::p2p_data_gate gate = ep_->data_gate();
    plan_run<T, Op> hooks{{}, *this, pl, lay, area, mine, op, operation, s, gate};
    const detail::p2p_fused_shape shape = fused_shape(pl, in_count, out_count);
    try {
      if (shape != detail::p2p_fused_shape::none) {
        run_fused(shape, pl, lay, area, in, out, op, operation, capturing, average);
        return;
      }
      // A broadcast's input region is its output region (the layout gives both offset 0).
      if (!lay.staged) cuda::copy(mine[0], in, in_count, s, gate);
      run_plan(pl.steps(), hooks); // message steps: refused by p2p_lay_out_call
      // Its peers load a staged plan's staging area after the call; a captured call, whose
      // area is the same at every replay, waits for them instead.
      if (lay.staged && capturing) {
        for (const auto& group : pl.groups())
          ep_->sync(group, operation);
      }
      if (!lay.staged) cuda::copy(out, mine[1], out_count, s, gate);
    } catch (const error& e) {
      // Part of the call is queued and part is not (a kernel launch failed): the ranks' epochs
      // no longer agree, so the communicator fails.
      if (!e.operation().empty()) ep_->fail_with(e);
      ep_->fail_with(
          error(operation, rank(), error::unknown, detail::p2p_without_prefix(e.what())));
    }
  }

  friend struct detail::p2p_factory;

  // The fused kernel of a call, where one runs it: the plan's shape, with buffers of the plan's
  // count (the kernel copies and writes all of it; other sizes go step by step, whose checks
  // name them).
  [[nodiscard]] detail::p2p_fused_shape fused_shape(const plan& pl, std::size_t in_count,
                                                    std::size_t out_count) const {
    if (in_count != pl.count() || out_count != pl.count()) return detail::p2p_fused_shape::none;
    return detail::p2p_fused_shape_of(pl, size());
  }

  // One fused kernel for the whole call (detail/p2p_fused.cuh), on the stream: the staging areas
  // (one-shot) or the workspace regions (two-shot) are those the step-by-step plan uses, and its
  // barriers count the same syncs per pair.
  template <class T, class Op>
  void run_fused(detail::p2p_fused_shape shape, const plan& pl, const detail::p2p_call_layout& lay,
                 int area, const T* in, T* out, const Op& op, std::string_view operation,
                 bool capturing, detail::p2p_average average) {
    const int p = size();
    const int r = rank();
    const std::size_t n = pl.count();
    const bool one_shot = shape == detail::p2p_fused_shape::one_shot;
    std::uintptr_t stage[detail::p2p_fused_max_ranks] = {};
    std::uintptr_t reduced[detail::p2p_fused_max_ranks] = {};
    for (int q = 0; q < p; ++q) {
      stage[q] = reinterpret_cast<std::uintptr_t>(
          one_shot ? static_cast<void*>(ep_->staging(q, area))
                   : static_cast<void*>(region<T>(lay, area, q, buffer::input)));
      if (!one_shot)
        reduced[q] = reinterpret_cast<std::uintptr_t>(region<T>(lay, area, q, buffer::output));
    }
    const detail::p2p_fused_work w =
        detail::p2p_fused_ranges(shape, p, r, n, sizeof(T), reinterpret_cast<std::uintptr_t>(in),
                                 reinterpret_cast<std::uintptr_t>(out), stage, reduced);
    const auto at = [](std::uintptr_t a, std::size_t offset) {
      return reinterpret_cast<T*>(a) + offset;
    };
    detail::p2p_fused_args<T, Op> a{};
    a.barriers = detail::p2p_fused_barriers(shape, capturing);
    a.sync = ep_->sync_args(ep_->everyone(), operation, a.barriers);
    a.arrive = ep_->grid_words();
    a.generation = a.arrive + 1;
    const bool alone = shape == detail::p2p_fused_shape::one_rank;
    a.copy = {{alone ? out : at(stage[r], 0), in, average == detail::p2p_average::prescale,
               weft::detail::average_scale<T>(p),
               alone && average == detail::p2p_average::divide ? p : 0},
              w.copy.cut};
    weft::detail::reduce_sources<T, Op> sum{
        one_shot ? out : at(reduced[r], w.reduce.offset), {}, p, op};
    for (int q = 0; q < p; ++q)
      sum.src[q] = at(stage[q], w.reduce.offset);
    a.reduce = {{sum, average == detail::p2p_average::divide ? p : 0}, w.reduce.cut};
    a.gathers = w.gathers;
    for (int k = 0; k < w.gathers; ++k) {
      const int src = (r + k) % p;
      a.gather[k] = {{out + w.gather[k].offset, at(reduced[src], w.gather[k].offset)},
                     w.gather[k].cut};
    }
    std::size_t most = std::max(w.copy.cut.indices(), w.reduce.cut.indices());
    for (int k = 0; k < w.gathers; ++k)
      most = std::max(most, w.gather[k].cut.indices());
    const unsigned blocks =
        detail::p2p_fused_blocks(most, detail::block_threads, detail::sm_count(), ranks_on_device_);
    detail::p2p_fused_kernel<T, Op><<<blocks, detail::block_threads, 0, stream()>>>(a);
    detail::cuda_check(cudaGetLastError(), "launching the fused all-reduce kernel", operation, r);
  }

  // Rank q's buffer b in a call laid out as `lay`: its staging area `area` for a staged plan's
  // scratch, else its region of b in its workspace.
  template <class T>
  T* region(const detail::p2p_call_layout& lay, int area, int q, buffer b) const {
    if (lay.staged) return reinterpret_cast<T*>(ep_->staging(q, area));
    return reinterpret_cast<T*>(ep_->data(q) + lay.offset[static_cast<std::size_t>(b)]);
  }

  // The p2p transport's hooks for run_plan: every step a kernel on the stream, loads reading
  // the peers' regions (or their staging areas, for a staged plan).
  template <class T, class Op>
  struct plan_run : plan_hooks_without_messages {
    basic_communicator& c;
    const plan& pl;
    const detail::p2p_call_layout& lay;
    int area;
    T* const (&mine)[3];
    const Op& op;
    std::string_view operation;
    cudaStream_t s;
    detail::p2p_data_gate gate;

    T* at(buffer b, std::size_t off) const { return mine[static_cast<std::size_t>(b)] + off; }
    T* region(int q, buffer b) const { return c.template region<T>(lay, area, q, b); }

    // Every step is a kernel on the stream, which orders them: nothing to do around a round.
    void begin_round(const plan_round&) {}
    void at_step(const plan_round&, std::size_t, const step&) {}
    void sends_posted(const plan_round&) {}
    void end_round(const plan_round&) {}
    void copy(std::size_t, const step& st) {
      cuda::copy(at(st.dst, st.dst_offset), at(st.src, st.src_offset), st.count, s, gate);
    }
    void reduce(std::size_t, const step& st) {
      T* const d = at(st.dst, st.dst_offset);
      cuda::reduce(d, d, at(st.src, st.src_offset), st.count, op, s, gate);
    }
    void load(std::size_t, const step& st) {
      cuda::copy(at(st.dst, st.dst_offset), region(st.peer, st.src) + st.src_offset, st.count, s,
                 gate);
    }
    void load_reduce(std::size_t, const step& st) {
      const auto& group = pl.group(st.peer);
      std::array<const T*, detail::p2p_max_ranks> sources{};
      for (std::size_t j = 0; j < group.size(); ++j)
        sources[j] = region(group[j], st.src) + st.src_offset;
      cuda::reduce(at(st.dst, st.dst_offset), sources.data(), static_cast<int>(group.size()),
                   st.count, op, s, gate);
    }
    void sync(std::size_t, const step& st) { c.ep_->sync(pl.group(st.peer), operation); }
  };

  // Collective over the host communicator: allocates this rank's workspace and trades
  // addresses with every peer. `borrowed` or else `owned` is the host communicator; `world`
  // (threads) keeps the memory until the run ends; `after`: a stream the new one starts after;
  // `family`: the failure state of the communicator this one is split from (null: a new one).
  basic_communicator(Host* borrowed, std::unique_ptr<Host> owned, int device, const options& opt,
                     std::shared_ptr<detail::p2p_world> world, cudaStream_t after,
                     std::string_view operation,
                     std::shared_ptr<weft::detail::failure_state> family = nullptr)
      : owned_host_(std::move(owned)),
        host_(borrowed != nullptr ? borrowed : owned_host_.get()),
        world_(std::move(world)) {
    const int r = host_->rank();
    const int n = host_->size();
    if (n > detail::p2p_max_ranks) {
      throw error(operation, r, error::unknown,
                  std::to_string(n) + " ranks; a p2p communicator has at most " +
                      std::to_string(detail::p2p_max_ranks));
    }
    cluster_ = std::make_shared<const topology::cluster>(
        host_->cluster().devices_per_node(), topology::default_link(topology::link_kind::nvlink),
        topology::default_link(topology::link_kind::infiniband));
    ep_ = std::make_unique<detail::p2p_endpoint>(device, r, n, opt.workspace_bytes,
                                                 opt.sync_timeout, opt.timeout,
                                                 !detail::p2p_same_process<Host>, after, operation,
                                                 std::move(family), opt.on_failure, opt.end_job);
    if (world_) world_->keep(ep_->memory());
    connect(operation);
  }

  // Every rank learns every workspace's address in its own address space.
  void connect(std::string_view operation) {
    using address = detail::p2p_address;
    const int r = rank();
    const int n = size();
    const detail::device_scope on(device());
    std::array<std::int64_t, address::words> mine{};
    mine[0] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(ep_->workspace()));
    mine[1] = device();
    mine[2] = static_cast<std::int64_t>(ep_->layout().total);
    if constexpr (!detail::p2p_same_process<Host>) {
      cudaIpcMemHandle_t handle{};
      detail::cuda_check(cudaIpcGetMemHandle(&handle, ep_->workspace()), "cudaIpcGetMemHandle",
                         operation, r);
      std::memcpy(mine.data() + 3, &handle, sizeof handle);
    }
    std::vector<std::int64_t> table(address::words * static_cast<std::size_t>(n));
    try {
      all_gather<algo::ring>(*host_, std::span<const std::int64_t>(mine), std::span(table));
    } catch (const error& e) {
      throw error(
          operation, r, e.peer(),
          "trading workspace addresses: " + std::string(detail::p2p_without_prefix(e.what())));
    }
    // Ranks whose device has this rank's ordinal: their fused kernels may spin on it at once.
    // (Processes that see different devices under one ordinal count too: fewer blocks, no harm.)
    ranks_on_device_ = 0;
    for (int q = 0; q < n; ++q)
      ranks_on_device_ +=
          table[address::words * static_cast<std::size_t>(q) + 1] == mine[1] ? 1 : 0;
    std::vector<std::byte*> bases(static_cast<std::size_t>(n), nullptr);
    std::vector<void*> imported;
    try {
      for (int q = 0; q < n; ++q) {
        const std::int64_t* theirs = table.data() + address::words * static_cast<std::size_t>(q);
        if (theirs[2] != mine[2]) {
          throw error(operation, r, q,
                      "that rank's workspace has " + std::to_string(theirs[2]) +
                          " bytes and this rank's " + std::to_string(mine[2]) +
                          ": every rank must give the same p2p::options::workspace_bytes");
        }
        if (q == r) {
          bases[static_cast<std::size_t>(q)] = ep_->workspace();
          continue;
        }
        if constexpr (detail::p2p_same_process<Host>) {
          enable_peer_access(static_cast<int>(theirs[1]), q, operation);
          bases[static_cast<std::size_t>(q)] =
              reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(theirs[0]));
        } else {
          cudaIpcMemHandle_t handle{};
          std::memcpy(&handle, theirs + 3, sizeof handle);
          void* p = nullptr;
          const cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
          if (e != cudaSuccess) {
            (void)cudaGetLastError();
            throw error(
                operation, r, q,
                "cudaIpcOpenMemHandle of that rank's workspace failed: " +
                    detail::cuda_error_text(e) +
                    " (the processes must share a node, and their devices must have peer access)");
          }
          imported.push_back(p);
          bases[static_cast<std::size_t>(q)] = static_cast<std::byte*>(p);
        }
      }
    } catch (...) {
      for (void* p : imported)
        (void)cudaIpcCloseMemHandle(p);
      throw;
    }
    ep_->connect(std::move(bases), std::move(imported));
  }

  // This rank's device reads and writes the memory of `peer_device` (threads only; IPC
  // handles enable it themselves).
  void enable_peer_access(int peer_device, int peer, std::string_view operation) {
    if (peer_device == device()) return;
    int can = 0;
    detail::cuda_check(cudaDeviceCanAccessPeer(&can, device(), peer_device),
                       "cudaDeviceCanAccessPeer", operation, rank(), peer);
    if (can == 0) {
      throw error(operation, rank(), peer,
                  "device " + std::to_string(device()) + " cannot access the memory of device " +
                      std::to_string(peer_device) +
                      " (cudaDeviceCanAccessPeer): put the ranks on devices with peer access, or "
                      "use the nccl "
                      "transport");
    }
    const cudaError_t e = cudaDeviceEnablePeerAccess(peer_device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError(); // another rank on this device enabled it: fine
      return;
    }
    detail::cuda_check(e, "cudaDeviceEnablePeerAccess", operation, rank(), peer);
  }

  void not_capturing(std::string_view operation) const {
    if (detail::capturing(stream())) {
      throw error(
          operation, rank(), error::unknown,
          "a blocking call cannot run while the stream is being captured into a CUDA graph");
    }
  }

  // Host memory, or another device's, would reach a kernel as a bad address: say so instead.
  void check_device_buffer(const void* p, std::size_t n, std::string_view which,
                           std::string_view operation) const {
    if (n == 0) return;
    cudaPointerAttributes a{};
    const cudaError_t e = p == nullptr ? cudaErrorInvalidValue : cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw error(operation, rank(), error::unknown,
                  "the " + std::string(which) + " (" + std::to_string(n) +
                      " elements) is not a valid device buffer: " + detail::cuda_error_text(e));
    }
    if (a.type == cudaMemoryTypeUnregistered) {
      throw error(operation, rank(), error::unknown,
                  "the " + std::string(which) +
                      " is host memory, and the p2p transport runs on device buffers (cudaMalloc, "
                      "cudaMallocAsync or "
                      "managed memory)");
    }
    if (a.type == cudaMemoryTypeDevice && a.device != device()) {
      throw error(operation, rank(), error::unknown,
                  "the " + std::string(which) + " is on device " + std::to_string(a.device) +
                      ", and this rank on device " + std::to_string(device()));
    }
  }

  // The endpoint's memory goes (tear_down) while the host communicator its barrier needs is
  // here; declaration order is destruction order reversed, so the endpoint goes before it too.
  void tear_down() noexcept {
    if (!ep_) return; // moved from
    ep_->close([this] { host_->barrier(); });
    ep_.reset();
  }

  // Declaration order is destruction order reversed: the endpoint goes before the host
  // communicator.
  std::unique_ptr<Host> owned_host_; // split's and from_mpi's; run() lends its own
  Host* host_;
  std::shared_ptr<detail::p2p_world> world_;
  std::shared_ptr<const topology::cluster> cluster_;
  std::unique_ptr<detail::p2p_endpoint> ep_;
  std::uint64_t staged_calls_ =
      0; // staged plans run outside captures: its parity picks the staging area
  int ranks_on_device_ =
      1; // ranks of this communicator on this rank's device (fused kernels' grid)
};

/// Ranks as threads of one process (made by run()).
using communicator = basic_communicator<local::communicator>;

/// Runs fn(communicator&) on one rank per entry of `devices`, each a thread with its own stream
/// on its device (rank r on devices[r]; a device may repeat, after configure_shared_device()).
/// Returns when all have returned
/// and their streams are idle; rethrows the first failure. Checks its arguments and that the
/// devices exist (weft::error) before any thread starts. The communicators (and their splits)
/// must not outlive the run: their workspaces are freed when it ends, once every device is idle.
template <class F>
void run(std::vector<int> devices, F&& fn, options opt = {}) {
  constexpr std::string_view who = "cuda::p2p::run";
  detail::p2p_check_device_list(devices, who);
  detail::p2p_check_options(opt.workspace_bytes, opt.sync_timeout, opt.timeout, who);
  detail::p2p_check_shared_device(devices, who);
  if (const std::string why = no_device_reason(); !why.empty())
    throw error("weft: " + std::string(who) + ": " + why);
  const int visible = device_count();
  for (std::size_t r = 0; r < devices.size(); ++r) {
    if (devices[r] >= visible) {
      throw error("weft: " + std::string(who) + ": rank " + std::to_string(r) +
                  " is given device " + std::to_string(devices[r]) + ", and this process sees " +
                  std::to_string(visible));
    }
  }
  auto world =
      std::make_shared<detail::p2p_world>(); // declared first: freed after every rank is done
  local::run(
      static_cast<int>(devices.size()),
      [&](local::communicator& host) {
        const int device = devices[static_cast<std::size_t>(host.rank())];
        WEFT_CUDA_TRY(cudaSetDevice(device));
        communicator c = detail::p2p_factory::make<local::communicator>(
            &host, std::unique_ptr<local::communicator>(), device, opt, world, cudaStream_t{}, who);
        fn(c);
        c.synchronize();
      },
      local::options{.timeout = opt.timeout});
}

} // namespace weft::cuda::p2p

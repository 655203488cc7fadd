#pragma once
// weft::mpi: ranks as MPI processes, on one machine or many. The plans that run on threads
// (weft::local) run here on processes, launched by mpirun or srun.
//
//   weft::mpi::environment env(argc, argv);               // MPI_Init_thread ... MPI_Finalize
//   auto world = weft::mpi::world();                      // MPI_COMM_WORLD, borrowed
//   weft::all_reduce(world, std::span(grad));             // automatic, over real or emulated nodes
//   auto c = weft::mpi::communicator::borrow(my_comm);    // the user's MPI_Comm, never freed by
//   weft
//
// Traffic. A communicator wraps an MPI_Comm (borrowed, or owned and then freed by weft) and
// keeps a private duplicate of it (MPI_Comm_idup) for all of weft's messages, so messages the
// program sends on its own communicator never match weft's. Plans use one tag of their own
// (MPI_TAG_UB); point-to-point messages use the caller's tags, below it.
//
// Plan execution. Each round posts MPI_Isend for all of its sends straight from the
// caller's buffers, then runs the other steps in order: a recv posts MPI_Irecv into its
// destination; a recv_reduce receives into a small staging area, a few pieces in flight,
// and reduces each piece with weft's own kernel as it lands (so half and bfloat16 need no
// MPI_Op, and every rank reduces in the same order). The round ends when its sends are
// done. A step's message goes as pieces of at most message_bytes, cut the same way on both
// sides; the MPI datatype is the element's own (half and bfloat16: 2-byte integers).
// There is no peer access between processes: algo::direct does not compile with this
// communicator, hierarchical<direct, ...> is refused when it runs (weft::error), and
// automatic picks neither.
//
// MPI's own collectives (algo::vendor). vendor<C> runs MPI_Iallreduce, MPI_Ireduce_scatter_block,
// MPI_Iallgather, MPI_Ibcast, MPI_Ireduce or MPI_Ialltoall on the private duplicate, for the
// types and operators MPI reduces itself (transport/detail/mpi_vendor.hpp: float, double,
// int32, int64; sum, prod, min, max, and avg as MPI_SUM then a division by the ranks); for
// half, bfloat16 or a user functor algo::vendor does not compile, and automatic runs weft's
// plans. Its results follow MPI's reduction order, not weft's fixed one. The request is polled
// with MPI_Test under the communicator's deadline, as every wait is. A nonblocking collective
// cannot be cancelled, so under on_failure::throw_error it runs on a copy in weft's memory
// (kept for good if the call fails); under abort_job on the caller's buffers.
//
// automatic. By default automatic prices weft's plans by the cost model over the cluster's
// links. With options::measured_automatic = mpi::measured_automatic() (and nodes that are
// real, not emulated) it picks by measurement instead (comm/measured_prices.hpp): at its first
// call of a collective on a group shape, every rank measures weft's candidates and MPI's own
// collective at 4 KiB .. 4 MiB, and at 16 and 64 MiB at the first call past 4 MiB (each once per
// process and shape), and each call takes MPI's collective unless a plan of weft's is measured
// cheaper at its size. On 4 processes of an idle 2-core machine that first call costs about
// 0.2 s for all_reduce (1.5-1.8 s loaded), the first broadcast past 4 MiB about 0.9 s; every
// rank of the group must make both.
//
// Threads. A communicator is used by one thread at a time. MPI_THREAD_SERIALIZED (what
// environment asks for) is enough for that; MPI_THREAD_MULTIPLE lets different
// communicators run collectives from different threads at once.
//
// Node locality, which hierarchical<> and automatic use, comes from the first of:
//   options::topology    a weft::topology::cluster given in code: emulated nodes
//   WEFT_TOPOLOGY        a topology spec in the environment ("2x4", "3+5,ib=50GB/s"): emulated
//   the real nodes       MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)
// An emulated topology's size must equal the communicator's (else weft::error); rank r is
// its device r. Real nodes are numbered by their lowest rank and their processes
// node-major, so devices()[r] is rank r's device in cluster(), as topology::cluster numbers
// them, whatever order the launcher placed the processes in.
//
// Failure (docs/reliability.md says what a program may do after each kind of error). Every
// wait has a deadline (set_timeout, default 5 minutes). While a rank waits it reads its
// family's control channel (transport/detail/mpi_family.hpp: the communicator and all its
// splits share one); at a deadline it asks the ranks it waits on where they are, follows
// "waits on" to the rank that holds everyone up, and tells every rank. So every rank's
// weft::error names the operation, itself, its peer, its position (sequence number, plan
// round and step) and the culprit: "world rank 2 stalled: it did not answer within 750 ms".
// A rank whose call fails part-way for another reason (a reduction that throws, a receive of
// the wrong size) tells the others the same way, and they fail at once instead of at their
// deadline.
//
// A failed call leaves nothing behind in the caller's buffers: receives still pending are
// cancelled, and what MPI cannot cancel is given a bounded time to complete. MPI cannot
// cancel a send, so under on_failure::throw_error a plan's large step goes only once its
// receiver has posted the receive and sent a credit for it (a sender never hands MPI a buffer
// for a receiver that is not there); under abort_job the job ends at a failure, and sends go
// at once. Should a request on the caller's buffer still be live after that, weft ends the
// job (the process must not return into the program while MPI may still read or write that
// buffer). Messages are never taken from or written into the buffers after the call threw.
//
// A failed communicator stays failed, with every communicator split from it (and the one it
// was split from): each later call throws at once with the first failure's message, and its
// MPI communicators are never freed, so a message of the failed call still in flight cannot
// match another call. What happens at the failure is options::on_failure: abort_job (the
// default) prints weft's error and calls MPI_Abort, ending every process of the job;
// throw_error throws, for a program that ends the job its own way (MPI cannot continue
// without the failed rank: there is no shrink()). Errors found before any data moves (a bad
// peer or tag, a plan for another rank, WEFT_CHECK_CALLS) throw and leave the communicator
// usable. MPI errors become weft::error (WEFT_MPI_TRY) naming the MPI call, its error and
// where.
//
// A process that dies (a signal, exit without MPI_Finalize) is noticed by the launcher,
// which ends the job (Open MPI's mpirun: "exited on signal"/"exiting improperly"); if it
// does not, the peers' deadlines pass and the verdict names the dead rank. An exception that
// leaves the environment's scope uncaught ends the job too (see environment).
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/detail/scratch.hpp>
#include <weft/comm/failure.hpp>
#include <weft/comm/measured_prices.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/check.hpp>
#include <weft/comm/plan/engine.hpp>
#include <weft/comm/progress.hpp>
#include <weft/comm/transport/detail/host_plan_steps.hpp>
#include <weft/comm/transport/detail/mpi_comm_handle.hpp>
#include <weft/comm/transport/detail/mpi_datatype.hpp>
#include <weft/comm/transport/detail/mpi_error.hpp>
#include <weft/comm/transport/detail/mpi_family.hpp>
#include <weft/comm/transport/detail/mpi_requests.hpp>
#include <weft/comm/transport/detail/mpi_vendor.hpp>
#include <weft/comm/transport/mpi_environment.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/topology/topology.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::mpi {

class communicator;

/// Measures automatic's prices of a collective on an mpi communicator, weft's candidates and
/// MPI's own collective, all its ranks together: what measured_automatic() gives
/// options::measured_automatic.
/// base: the communicator's table to continue at the large sizes, or none.
using measurer = std::shared_ptr<const measured_prices> (*)(communicator&, collective,
                                                            bool peer_access, bool messages,
                                                            const measured_prices* base);

struct options {
  /// Deadline of every wait (and of the collective set-up calls).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// Emulated nodes: ranks grouped as this cluster's nodes, rank r on its device r; its
  /// size must equal the communicator's. Empty: WEFT_TOPOLOGY, else the real nodes.
  std::optional<topology::cluster> topology;
  /// What a call that fails part-way does (weft/comm/failure.hpp): end the job (MPI_Abort)
  /// after printing weft's error, or throw it. Splits inherit it.
  weft::on_failure on_failure = weft::on_failure::abort_job;
  /// With mpi::measured_automatic(), automatic picks by prices measured on this machine, MPI's
  /// own collective among them (see the header), where the nodes are real; every rank must pass
  /// the same. Splits inherit it. A program compiles the measurement only where it opts in.
  measurer measured_automatic = nullptr;
};

inline void broadcast_bytes(communicator& comm, std::span<std::byte> data, int root);

class communicator {
public:
  /// Processes do not share memory: plans that load from peers (algo::direct) cannot run.
  static constexpr bool peer_access = false;
  static constexpr std::string_view transport_name = "mpi";
  /// A plan step's message is cut into MPI messages of at most this many bytes, so that a
  /// received piece is reduced while the next arrives. Each MPI message is a rendezvous
  /// (a synchronisation with the sender), so pieces must not be small: 1 MiB, the size ring
  /// already cuts its steps to, measured best among 128 KiB .. 64 MiB (4 processes, 1-64 MiB).
  static constexpr std::size_t message_bytes = std::size_t{1} << 20;
  /// Pieces of one recv_reduce in flight at once (the staging area holds this many).
  static constexpr std::size_t pieces_in_flight = 2;

  /// Wraps the caller's communicator; weft never frees it and never changes its error
  /// handler. Collective over `comm`. Throws weft::error if MPI is not initialized.
  static communicator borrow(MPI_Comm comm, const options& opt = {}) {
    return communicator(detail::mpi_comm_handle(comm, false), opt);
  }
  /// Takes `comm` over: weft sets MPI_ERRORS_RETURN on it and frees it when done (also if
  /// this call throws). Collective over `comm`.
  static communicator adopt(MPI_Comm comm, const options& opt = {}) {
    return communicator(detail::mpi_comm_handle(comm, true), opt);
  }

  communicator(communicator&&) noexcept = default;
  /// Runs the destructor's rule on the communicator assigned over (a failed family's MPI
  /// communicators are kept, not freed), then takes `o` over.
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      std::destroy_at(this);
      std::construct_at(this, std::move(o));
    }
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() {
    if (!family_) return; // moved from
    // The family no longer finds this communicator's progress when it answers a query.
    family_->delist(progress_.get());
    // A failed family's communicators are never freed (mpi_family.hpp says why); a process
    // that learns of the failure only here keeps them too.
    if (detail::mpi_alive()) {
      family_->poll();
      if (family_->failure().failed()) {
        dup_.keep();
        credit_.keep();
      }
    }
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// Rank r's rank in MPI_COMM_WORLD.
  [[nodiscard]] int world_rank(int r) const { return world_ranks_.at(static_cast<std::size_t>(r)); }
  /// devices()[r]: rank r's device in cluster() (node-major numbering).
  [[nodiscard]] const std::vector<int>& devices() const noexcept { return devices_; }
  /// node_of()[r]: the node of rank r, an index into cluster()'s nodes.
  [[nodiscard]] const std::vector<int>& node_of() const noexcept { return node_of_; }
  [[nodiscard]] const topology::cluster& cluster() const noexcept { return *cluster_; }
  /// Whether the nodes are emulated (options::topology or WEFT_TOPOLOGY), not detected.
  [[nodiscard]] bool emulated_nodes() const noexcept { return emulated_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) {
    timeout_ = weft::detail::checked_timeout(t, "mpi::communicator::set_timeout");
  }
  /// Whether collectives on this communicator compare the call across ranks first (as
  /// WEFT_CHECK_CALLS=1 does for every communicator of the process).
  [[nodiscard]] bool check_calls() const noexcept { return check_calls_; }
  void set_check_calls(bool on) noexcept { check_calls_ = on; }
  /// How many plans, barriers and splits this rank has begun on this communicator.
  [[nodiscard]] std::uint64_t sequence() const noexcept { return seq_; }
  /// This process's progress counters: its operation, sequence number and plan step now (a
  /// process cannot see the others': each reports its own in its errors).
  [[nodiscard]] rank_progress progress() const {
    return progress_->snapshot(
        world_ranks_.empty() ? rank_ : world_ranks_[static_cast<std::size_t>(rank_)], "running");
  }
  /// The wrapped communicator, for the program's own MPI calls (weft's traffic is on a
  /// private duplicate and never matches them).
  [[nodiscard]] MPI_Comm native() const noexcept { return base_.get(); }

  /// What a call that fails part-way does; splits inherit it.
  [[nodiscard]] weft::on_failure failure_policy() const noexcept { return family_->policy(); }
  /// Whether this communicator's family (it, the one it was split from, its splits) failed:
  /// every call then throws failure() at once.
  [[nodiscard]] bool failed() const {
    if (!family_) return false; // moved from
    family_->poll();
    return family_->failure().failed();
  }
  /// The family's first failure ("" while there is none).
  [[nodiscard]] std::string failure() const {
    if (!family_) return {};
    family_->poll();
    return family_->failure().what();
  }
  /// Ends the job: prints `why` as weft's error and calls MPI_Abort, which ends every process.
  [[noreturn]] void abort(std::string_view why, int code = 1) const noexcept {
    end_job(why, "mpi::communicator::abort", code);
  }

  // --- point to point -------------------------------------------------------------------
  // MPI semantics: send returns once the buffer may be reused, which for a large message
  // can mean once the receiver has matched it; a receive must name the count and type that
  // were sent. Another count of bytes is a weft::error; another type of the same bytes (float
  // sent, int32 received) is not detected, since MPI messages do not carry their type
  // (weft::local's do, and refuse it). Both wait at most timeout(). A send that fails while
  // MPI still reads its buffer for a receiver that vanished cannot be cancelled: weft then
  // ends the job (see the header comment); post() copies, and never has to.

  template <element T>
  void send(std::span<const T> data, int peer, int tag = 0) {
    check_peer(peer, "send");
    check_tag(tag, "send");
    const recorded scope(*this, "send", recorded::point_to_point);
    const auto ctx = context("send");
    guarded(ctx.operation, [&] {
      post_sends(send_buffer(data), data.size(), peer, tag, max_message, p2p_, ctx.operation,
                 credits());
      p2p_.wait_all(detail::mpi_datatype<T>(), dtype_traits<T>::name, ctx);
      p2p_copy_.reset();
    });
  }
  template <element T>
  void send(std::span<T> data, int peer, int tag = 0) {
    send(std::span<const T>(data), peer, tag);
  }
  template <element T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    check_peer(peer, "recv");
    check_tag(tag, "recv");
    const recorded scope(*this, "recv", recorded::point_to_point);
    const auto ctx = context("recv");
    guarded(ctx.operation, [&] {
      post_recvs(data.data(), data.size(), peer, tag, max_message, p2p_, ctx.operation);
      p2p_.wait_all(detail::mpi_datatype<T>(), dtype_traits<T>::name, ctx);
    });
  }
  /// A buffered send, like weft::local's: copies `data`, starts sending the copy and returns
  /// at once, whatever the size, so two ranks that both post before they receive cannot
  /// deadlock (a pipeline's neighbours do). The copy is freed once delivered: later calls
  /// of post() free what has arrived, and flush() waits, at most timeout(), until every
  /// posted message has been delivered. Messages to one peer arrive in order with send's.
  /// After a failure the copies still in flight are kept until the end of the process.
  template <element T>
  void post(std::span<const T> data, int peer, int tag = 0) {
    check_peer(peer, "post");
    check_tag(tag, "post");
    const recorded scope(*this, "post", recorded::point_to_point);
    const auto ctx = context("post");
    guarded(ctx.operation, [&] {
      while (!posted_.empty() &&
             posted_.front().requests.test_all(MPI_BYTE, posted_.front().type_name, ctx))
        posted_.pop_front();
      posted_message& m = posted_.emplace_back();
      m.type_name = dtype_traits<T>::name;
      m.copy = std::make_unique<std::byte[]>(data.size_bytes() == 0 ? 1 : data.size_bytes());
      if (!data.empty()) std::memcpy(m.copy.get(), data.data(), data.size_bytes());
      post_sends(reinterpret_cast<const T*>(m.copy.get()), data.size(), peer, tag, max_message,
                 m.requests, ctx.operation, true);
    });
  }
  template <element T>
  void post(std::span<T> data, int peer, int tag = 0) {
    post(std::span<const T>(data), peer, tag);
  }
  /// Waits until every posted message has been delivered (at most timeout(), then a
  /// weft::error naming the peer that did not take its message, and the culprit).
  void flush() {
    const recorded scope(*this, "flush", recorded::point_to_point);
    const auto ctx = context("flush");
    guarded(ctx.operation, [&] {
      while (!posted_.empty()) {
        posted_.front().requests.wait_all(MPI_BYTE, posted_.front().type_name, ctx);
        posted_.pop_front();
      }
    });
  }

  /// Sends `out` to `to` and receives `in` from `from` at the same time (no deadlock when
  /// two ranks exchange).
  template <element T>
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) {
    check_peer(to, "sendrecv");
    check_peer(from, "sendrecv");
    check_tag(tag, "sendrecv");
    const recorded scope(*this, "sendrecv", recorded::point_to_point);
    const auto ctx = context("sendrecv");
    guarded(ctx.operation, [&] {
      post_recvs(in.data(), in.size(), from, tag, max_message, p2p_, ctx.operation);
      post_sends(send_buffer(out), out.size(), to, tag, max_message, p2p_, ctx.operation,
                 credits());
      p2p_.wait_all(detail::mpi_datatype<T>(), dtype_traits<T>::name, ctx);
      p2p_copy_.reset();
    });
  }

  void barrier() {
    const recorded scope(*this, "barrier");
    const auto ctx = context("barrier");
    guarded(ctx.operation, [&] {
      MPI_Request req = MPI_REQUEST_NULL;
      WEFT_MPI_TRY(MPI_Ibarrier(dup_.get(), &req), ctx.operation, rank_);
      detail::mpi_wait(req, ctx, "have every rank enter the barrier");
    });
  }

  /// Splits into communicators of the ranks with the same color (>= 0), ordered by (key,
  /// rank), as MPI_Comm_split. Collective. The result owns its MPI_Comm and keeps this
  /// communicator's cluster: its rank r sits on the same device as before. It belongs to
  /// this communicator's family: a failure of either fails both.
  communicator split(int color, int key) {
    WEFT_EXPECTS(color >= 0, "mpi::communicator::split: color must be >= 0");
    const recorded scope(*this, "split");
    const auto ctx = context("split");
    std::optional<communicator> made;
    guarded(ctx.operation, [&] {
      // Gathering first, with a deadline, means MPI_Comm_split below (which has none) starts
      // only when every rank has arrived; the table also gives the children's placement.
      constexpr int fields = 5;
      const int mine[fields] = {color, key, devices_[static_cast<std::size_t>(rank_)],
                                world_ranks_[static_cast<std::size_t>(rank_)],
                                (*root_of_)[static_cast<std::size_t>(rank_)]};
      std::vector<int> table(static_cast<std::size_t>(fields * size_));
      all_gather_ints(mine, fields, table, ctx);
      std::vector<std::pair<int, int>> members; // (key, rank) of my color
      for (int r = 0; r < size_; ++r) {
        if (table[static_cast<std::size_t>(fields * r)] == color) {
          members.emplace_back(table[static_cast<std::size_t>(fields * r + 1)], r);
        }
      }
      std::sort(members.begin(), members.end());
      std::vector<int> devices;
      std::vector<int> world_ranks;
      std::vector<int> roots;
      int new_rank = -1;
      for (const auto& [k, r] : members) {
        if (r == rank_) new_rank = static_cast<int>(devices.size());
        devices.push_back(table[static_cast<std::size_t>(fields * r + 2)]);
        world_ranks.push_back(table[static_cast<std::size_t>(fields * r + 3)]);
        roots.push_back(table[static_cast<std::size_t>(fields * r + 4)]);
      }
      MPI_Comm child = MPI_COMM_NULL;
      WEFT_MPI_TRY(MPI_Comm_split(dup_.get(), color, key, &child), ctx.operation, rank_);
      detail::mpi_comm_handle owned(child, true);
      WEFT_MPI_TRY(MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN), ctx.operation, rank_);
      made.emplace(communicator(std::move(owned), new_rank, std::move(devices),
                                std::move(world_ranks), std::move(roots), cluster_, emulated_,
                                timeout_, family_));
    });
    made->check_calls_ = check_calls_;
    made->measurer_ = measurer_;
    return std::move(*made);
  }

  /// Runs one rank's plan over its buffers. `in`/`out` hold in_count/out_count elements
  /// (in may equal out: in place).
  ///
  /// Each round hands MPI its sends at once, except, under on_failure::throw_error, a step
  /// above credit_bytes: it waits for the receiver's credit, a zero-byte message on the
  /// communicator's credit channel that the receiver sends as it posts the step's receives,
  /// so MPI never holds a large send of the caller's buffer for a receiver that is not in the
  /// call. The waits of the round release such sends as their credits arrive, every piece of
  /// a step at once (one credit per step, not per piece).
  template <element T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view operation) {
    if (pl.peer_access()) {
      throw error(operation, rank_, error::unknown,
                  "the plan loads from peers' buffers (algo::direct, alone or inside "
                  "hierarchical<>), and MPI processes do not share memory: use ring, tree, "
                  "halving_doubling, hierarchical<ring, ...> or automatic");
    }
    check_plan_rank(pl, rank_, size_, operation);
    const recorded scope(*this, operation, pl.steps().size());
    T* const scratch = scratch_.get<T>(pl.scratch_count());
    // The input is only ever read.
    const plan_buffers<T> buffers{{const_cast<T*>(in), out, scratch},
                                  {in_count, out_count, pl.scratch_count()},
                                  operation,
                                  rank_};
    operation_ = operation;
    auto ctx = context(operation);
    ctx.tick = [](void* self) { static_cast<communicator*>(self)->release_queued_sends(); };
    ctx.tick_arg = this;
    const MPI_Datatype type = detail::mpi_datatype<T>();
    constexpr std::string_view type_name = dtype_traits<T>::name;
    constexpr std::size_t piece = message_bytes / sizeof(T) > 0 ? message_bytes / sizeof(T) : 1;
    plan_run<T, Op> hooks{{{}, buffers, op}, *this, operation, ctx, type, type_name, piece};
    guarded(operation, [&] { run_plan(pl.steps(), hooks); });
  }

  /// Under on_failure::throw_error, a plan's step larger than this many bytes waits for its
  /// receiver's credit (see execute); a smaller one goes at once, as MPI sends it eagerly (copied
  /// out of the buffer before the send completes): 4 KiB, Open MPI's eager limit over shared
  /// memory, the smallest of its transports'.
  static constexpr std::size_t credit_bytes = 4096;

  /// MPI's own collective C (algo::vendor) on execute's buffers and counts (plan.hpp's table;
  /// `count` per rank): MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast,
  /// MPI_Ireduce or MPI_Ialltoall, for the types and operators MPI has built in; avg is MPI_SUM,
  /// then divided here. Waits at most timeout(). Counts above INT_MAX are a weft::error (MPI's
  /// counts are int).
  template <collective C, element T, class Op>
  requires detail::mpi_vendor_type<T> && detail::mpi_vendor_op<Op>
  void vendor(const T* in, std::size_t in_count, T* out, std::size_t out_count, std::size_t count,
              int root, const Op&) {
    constexpr std::string_view operation = name_of(C);
    const auto p = static_cast<std::size_t>(size_);
    constexpr bool blocks_in = input_per_rank(C);
    constexpr bool blocks_out = output_per_rank(C);
    const std::size_t want_in = blocks_in ? count * p : count;
    const std::size_t want_out = blocks_out ? count * p : count;
    const bool output_used = C != collective::reduce || rank_ == root;
    const bool input_used = C != collective::broadcast || rank_ == root;
    if ((input_used && in_count != want_in) || (output_used && out_count != want_out)) {
      throw error(operation, rank_, error::unknown,
                  "vendor " + std::string(operation) + " of " + std::to_string(count) + " on " +
                      std::to_string(size_) + " ranks needs an input of " +
                      std::to_string(input_used ? want_in : 0) + " elements and an output of " +
                      std::to_string(output_used ? want_out : 0) + ", not " +
                      std::to_string(in_count) + " and " + std::to_string(out_count));
    }
    if (count > max_message || want_in > max_message || want_out > max_message) {
      throw error(operation, rank_, error::unknown,
                  "vendor " + std::string(operation) + " of " + std::to_string(count) +
                      " elements per rank: MPI's collectives count in int, at most " +
                      std::to_string(max_message) +
                      " elements per buffer; use weft's plans "
                      "(algo::automatic, algo::ring, ...), which cut messages to size");
    }
    const recorded scope(*this, operation);
    const auto ctx = context(operation);
    if (count == 0) return; // the same on every rank: nobody calls MPI
    guarded(operation, [&] {
      vendor_run<C>(in, in_count, out, out_count, count, root, detail::mpi_op_of<Op>(), ctx);
    });
    if constexpr (is_average_v<Op> &&
                  (C == collective::all_reduce || C == collective::reduce_scatter ||
                   C == collective::reduce)) {
      if (output_used) detail::divide(out, count, size_);
    }
  }

  /// Whether automatic picks by measured prices (options::measured_automatic, real nodes).
  [[nodiscard]] bool measures_automatic() const noexcept {
    return measurer_ != nullptr && !emulated_;
  }
  /// measure_prices measures MPI's own collective too (automatic_choice.hpp).
  static constexpr bool measure_prices_with_vendor = true;
  /// Measures automatic's prices of collective c now, all ranks together (where
  /// measures_automatic()): weft's candidates and MPI's own collective; base: its table to
  /// continue at the large sizes, or none.
  [[nodiscard]] std::shared_ptr<const measured_prices> measure_prices(
      collective c, bool peer_access, bool messages, const measured_prices* base = nullptr) {
    WEFT_EXPECTS(measurer_ != nullptr, "mpi::communicator::measure_prices: no measurer given");
    return measurer_(*this, c, peer_access, messages, base);
  }
  /// automatic's measured prices of collective c: empty until its first automatic call of c.
  [[nodiscard]] std::shared_ptr<const measured_prices>& measured_prices_of(collective c) {
    return measured_.at(static_cast<std::size_t>(c));
  }
  [[nodiscard]] const std::shared_ptr<const measured_prices>& measured_prices_of(
      collective c) const {
    return measured_.at(static_cast<std::size_t>(c));
  }

private:
  // vendor's MPI call and its wait: on the caller's buffers, or on a copy in weft's memory
  // (staged) where MPI cannot take them as they are, and always under throw_error, whose
  // failed calls must leave no request on the caller's buffers (a nonblocking collective can be
  // neither cancelled nor freed: the copy is parked instead).
  template <collective C, class T>
  void vendor_run(const T* in, std::size_t in_count, T* out, std::size_t out_count,
                  std::size_t count, int root, MPI_Op mop, const detail::mpi_wait_context& ctx) {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    const int n = static_cast<int>(count);
    const bool output_used = C != collective::reduce || rank_ == root;
    const bool input_used = C != collective::broadcast || rank_ == root;
    detail::mpi_vendor_buffers way = detail::mpi_vendor_layout(
        C, in, input_used ? in_count * sizeof(T) : 0, out, output_used ? out_count * sizeof(T) : 0,
        rank_, root, count * sizeof(T));
    if (credits()) way = detail::mpi_vendor_buffers::staged;
    std::unique_ptr<std::byte[]> copy;
    const T* src = in;
    T* dst = out;
    if (way == detail::mpi_vendor_buffers::staged) {
      const std::size_t in_n = input_used ? in_count : 0;
      const std::size_t out_n = output_used ? out_count : 0;
      copy = std::make_unique<std::byte[]>((in_n + out_n) * sizeof(T) + 1);
      T* const staged_in = reinterpret_cast<T*>(copy.get());
      if (in_n > 0) std::memcpy(staged_in, in, in_n * sizeof(T));
      src = staged_in;
      dst = staged_in + in_n;
    }
    const bool in_place = way == detail::mpi_vendor_buffers::in_place;
    MPI_Comm comm = dup_.get();
    MPI_Request req = MPI_REQUEST_NULL;
    const char* what = "";
    if constexpr (C == collective::all_reduce) {
      what = "finish MPI_Iallreduce with every rank";
      WEFT_MPI_TRY(MPI_Iallreduce(in_place ? MPI_IN_PLACE : src, dst, n, type, mop, comm, &req),
                   ctx.operation, rank_);
    } else if constexpr (C == collective::reduce_scatter) {
      what = "finish MPI_Ireduce_scatter_block with every rank";
      WEFT_MPI_TRY(MPI_Ireduce_scatter_block(src, dst, n, type, mop, comm, &req), ctx.operation,
                   rank_);
    } else if constexpr (C == collective::all_gather) {
      what = "finish MPI_Iallgather with every rank";
      WEFT_MPI_TRY(MPI_Iallgather(in_place ? MPI_IN_PLACE : src, n, type, dst, n, type, comm, &req),
                   ctx.operation, rank_);
    } else if constexpr (C == collective::broadcast) {
      what = "finish MPI_Ibcast with every rank";
      if (rank_ == root && src != dst) std::memmove(dst, src, count * sizeof(T));
      WEFT_MPI_TRY(MPI_Ibcast(dst, n, type, root, comm, &req), ctx.operation, rank_);
    } else if constexpr (C == collective::reduce) {
      what = "finish MPI_Ireduce with every rank";
      WEFT_MPI_TRY(MPI_Ireduce(in_place ? MPI_IN_PLACE : src, output_used ? dst : nullptr, n, type,
                               mop, root, comm, &req),
                   ctx.operation, rank_);
    } else {
      what = "finish MPI_Ialltoall with every rank";
      WEFT_MPI_TRY(MPI_Ialltoall(src, n, type, dst, n, type, comm, &req), ctx.operation, rank_);
    }
    try {
      detail::mpi_wait(req, ctx, what);
    } catch (...) {
      if (copy) family_->park(std::move(copy));
      throw;
    }
    if (copy && output_used && dst != out) std::memcpy(out, dst, out_count * sizeof(T));
  }

  friend void broadcast_bytes(communicator& comm, std::span<std::byte> data, int root);

  // The MPI transport's hooks for run_plan: a round hands MPI its sends at once (see
  // execute), then posts and waits for each receive in order (copy and reduce:
  // host_plan_steps).
  template <class T, class Op>
  struct plan_run : detail::host_plan_steps<T, Op> {
    using detail::host_plan_steps<T, Op>::buffers;
    using detail::host_plan_steps<T, Op>::op;
    communicator& c;
    std::string_view operation;
    const detail::mpi_wait_context& ctx;
    MPI_Datatype type;
    std::string_view type_name;
    std::size_t piece;

    void begin_round(const plan_round&) {} // sends are queued as they come
    void at_step(const plan_round& r, std::size_t k, const step& s) {
      c.progress_->at_step(r.number, k, s.kind);
    }
    void send(std::size_t, const step& s) {
      c.check_peer(s.peer, operation);
      c.queue_plan_sends(buffers.at(s.src, s.src_offset, s.count), s.count, s.peer, piece,
                         s.src == buffer::scratch, operation);
    }
    void sends_posted(const plan_round&) { c.release_queued_sends(); }
    void recv(std::size_t, const step& s) {
      c.check_peer(s.peer, operation);
      c.post_plan_recvs(buffers.at(s.dst, s.dst_offset, s.count), s.count, s.peer, piece,
                        s.dst == buffer::scratch, operation);
      c.recvs_.wait_all(type, type_name, ctx);
    }
    void recv_reduce(std::size_t, const step& s) {
      c.check_peer(s.peer, operation);
      c.recv_reduce(buffers.at(s.src, s.src_offset, s.count),
                    buffers.at(s.dst, s.dst_offset, s.count), s.count, s.peer, piece, op, ctx);
    }
    [[noreturn]] void peer_access(const step& s) const {
      throw error(operation, c.rank_, s.peer, "the MPI transport cannot run a peer-access step");
    }
    void load(std::size_t, const step& s) { peer_access(s); }
    void load_reduce(std::size_t, const step& s) { peer_access(s); }
    void sync(std::size_t, const step& s) { peer_access(s); }
    // The round's sends: those still waiting for a credit (the tick releases them), then
    // their completion.
    void end_round(const plan_round&) {
      detail::mpi_poll(
          [&] { return c.unsent_ == 0 && c.sends_.test_all(type, type_name, ctx); }, ctx,
          [&] {
            return c.unsent_ > 0
                       ? detail::mpi_waiting_for{c.first_unsent_peer(), "have its receive posted"}
                       : detail::mpi_waiting_for{c.sends_.first_pending_peer(),
                                                 "have its message received"};
          });
      c.eager_copies_.clear();
    }
  };

  // Records an operation in the progress counters while it runs, after checking that the
  // family has not failed (then the call throws the failure at once); one that ends by an
  // exception stays recorded (progress() then shows where it failed; the family is failed,
  // so no query takes it for a wait). Point-to-point calls count on their own.
  class recorded {
  public:
    struct point_to_point_t {};
    static constexpr point_to_point_t point_to_point{};

    recorded(communicator& c, std::string_view operation, std::size_t steps = 0)
        : c_(c), uncaught_(std::uncaught_exceptions()) {
      c.family_->check(operation, c.rank_);
      c.progress_->begin(operation, ++c.seq_, 0, c.rank_, c.size_, steps);
    }
    recorded(communicator& c, std::string_view operation, point_to_point_t)
        : c_(c), uncaught_(std::uncaught_exceptions()) {
      c.family_->check(operation, c.rank_);
      c.progress_->begin(operation, ++c.p2p_seq_, 0, c.rank_, c.size_);
    }
    recorded(const recorded&) = delete;
    recorded& operator=(const recorded&) = delete;
    ~recorded() {
      if (std::uncaught_exceptions() == uncaught_) c_.progress_->done();
    }

  private:
    communicator& c_;
    int uncaught_;
  };

  [[noreturn]] static void end_job(std::string_view what, std::string_view reason,
                                   int code = 1) noexcept {
    detail::print_abort_message(what, reason);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();
  }

  // The context of this communicator's waits in `operation`.
  [[nodiscard]] detail::mpi_wait_context context(std::string_view operation) const {
    return {operation, rank_, timeout_, progress_.get(), family_.get(), root_of_.get()};
  }

  // Runs f, the part of a call that moves data. If it throws, the call failed part-way:
  // see failed_call. The exception goes on to the caller unchanged.
  template <class F>
  void guarded(std::string_view operation, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      failed_call(operation, e.what());
      throw;
    } catch (...) {
      failed_call(operation, "an exception not derived from std::exception");
      throw;
    }
  }

  // After a call failed part-way: the family is failed (and told, when this is the first
  // failure), every request retired, weft's memory that MPI may still use kept for good, and
  // this communicator's MPI communicators never freed. A request on the caller's buffer that
  // is still live ends the job: the call must not return with it. Under abort_job, so does
  // every failure.
  WEFT_COLD void failed_call(std::string_view operation, const std::string& what) noexcept {
    try {
      const int me = world_ranks_[static_cast<std::size_t>(rank_)];
      (void)family_->fail_and_tell("world rank " + std::to_string(me) + " failed in " +
                                   std::string(operation) + ": " + what);
      const auto window = detail::mpi_answer_window(timeout_);
      for (MPI_Request& r : credits_in_) {
        if (r == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&r);
        MPI_Request_free(&r); // a zero-byte receive: no buffer to keep
      }
      credits_in_.clear();
      credit_arrived_.clear();
      queued_.clear();
      unsent_ = 0;
      detail::mpi_retired left;
      for (detail::mpi_requests* set : {&sends_, &recvs_, &p2p_}) {
        const detail::mpi_retired l = set->retire(window);
        left.caller_memory = left.caller_memory || l.caller_memory;
        left.weft_memory = left.weft_memory || l.weft_memory;
      }
      for (posted_message& m : posted_) {
        if (m.requests.retire(window).weft_memory) family_->park(std::move(m.copy));
      }
      posted_.clear();
      if (left.weft_memory) {
        family_->park(std::move(scratch_));
        family_->park(std::move(staging_));
        for (auto& c : eager_copies_)
          family_->park(std::move(c));
        if (p2p_copy_) family_->park(std::move(p2p_copy_));
      }
      eager_copies_.clear();
      p2p_copy_.reset();
      dup_.keep();
      credit_.keep();
      if (left.caller_memory) {
        end_job(what + "\nweft: " + std::string(operation) + " on rank " + std::to_string(rank_) +
                    ": MPI still uses the call's buffer for a message it cannot cancel, and the "
                    "process must not "
                    "return into the program with it",
                "a request still uses the caller's buffer");
      }
    } catch (...) {
      end_job(what, "out of memory while failing"); // nothing better is left
    }
    if (family_->policy() == weft::on_failure::abort_job) end_job(what, "on_failure::abort_job");
  }

  // The most elements of one MPI message (MPI counts are int).
  static constexpr std::size_t max_message = static_cast<std::size_t>(INT_MAX);

  // A root communicator: duplicates `base`, then places its ranks on nodes.
  communicator(detail::mpi_comm_handle base, const options& opt)
      : base_(std::move(base)),
        timeout_(weft::detail::checked_timeout(opt.timeout, "mpi::options::timeout")),
        measurer_(opt.measured_automatic) {
    if (!detail::mpi_alive()) {
      throw error(
          "weft: mpi::communicator: MPI is not initialized (or already finalized): "
          "call MPI_Init, or create a weft::mpi::environment first");
    }
    WEFT_EXPECTS(base_.get() != MPI_COMM_NULL, "mpi::communicator: the MPI_Comm is MPI_COMM_NULL");
    WEFT_EXPECTS(opt.on_failure == weft::on_failure::throw_error ||
                     opt.on_failure == weft::on_failure::abort_job,
                 "mpi::options::on_failure: not an on_failure value");
    if (base_.owned())
      WEFT_MPI_TRY(MPI_Comm_set_errhandler(base_.get(), MPI_ERRORS_RETURN), "mpi::communicator");
    duplicate(base_.get());
    std::vector<int> world(static_cast<std::size_t>(size_));
    translate_to_world(world);
    world_ranks_ = std::move(world);
    make_family(opt.on_failure);
    std::optional<topology::cluster> emulated = opt.topology;
    std::string source = "the topology in mpi::options";
    if (!emulated) {
      const char* spec = std::getenv("WEFT_TOPOLOGY");
      if (spec != nullptr && *spec != '\0') {
        emulated = topology::parse(spec);
        source = "WEFT_TOPOLOGY=\"" + std::string(spec) + "\"";
      }
    }
    if (emulated) {
      if (emulated->size() != size_) {
        throw error("mpi::communicator", rank_, error::unknown,
                    source + " describes " + std::to_string(emulated->size()) +
                        " ranks, but the MPI communicator has " + std::to_string(size_) +
                        " processes: launch " + std::to_string(emulated->size()) +
                        " processes, or give a topology of " + std::to_string(size_) +
                        " ranks (unset WEFT_TOPOLOGY to use the real nodes)");
      }
      emulated_ = true;
      devices_.resize(static_cast<std::size_t>(size_));
      for (int r = 0; r < size_; ++r)
        devices_[static_cast<std::size_t>(r)] = r;
      cluster_ = std::make_shared<const topology::cluster>(std::move(*emulated));
    } else {
      detect_nodes();
    }
    set_node_of();
  }

  // A communicator made by split: owns `base`, inherits the parent's cluster and family.
  communicator(detail::mpi_comm_handle base, int rank, std::vector<int> devices,
               std::vector<int> world_ranks, std::vector<int> root_ranks,
               std::shared_ptr<const topology::cluster> cluster, bool emulated,
               std::chrono::milliseconds timeout, std::shared_ptr<detail::mpi_family> family)
      : base_(std::move(base)),
        world_ranks_(std::move(world_ranks)),
        devices_(std::move(devices)),
        cluster_(std::move(cluster)),
        emulated_(emulated),
        timeout_(timeout),
        family_(std::move(family)),
        root_of_(std::make_shared<const std::vector<int>>(std::move(root_ranks))) {
    duplicate(base_.get());
    if (rank_ != rank || size_ != static_cast<int>(devices_.size())) {
      throw error("split", rank_, error::unknown,
                  "MPI_Comm_split placed this process at rank " + std::to_string(rank_) + " of " +
                      std::to_string(size_) + ", weft expected rank " + std::to_string(rank) +
                      " of " + std::to_string(devices_.size()));
    }
    set_node_of();
    family_->enlist(progress_.get(),
                    root_of_.get()); // last: a constructor that throws leaves nothing enlisted
  }

  // The root's family: a control channel (another duplicate), and a nonce from rank 0 that
  // tells this family's control messages from any other's.
  void make_family(weft::on_failure policy) {
    const detail::mpi_wait_context ctx{"mpi::communicator", rank_, timeout_};
    MPI_Comm control = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    WEFT_MPI_TRY(MPI_Comm_idup(dup_.get(), &control, &req), ctx.operation, rank_);
    detail::mpi_wait(req, ctx, "duplicate the communicator (MPI_Comm_idup) with every rank");
    detail::mpi_comm_handle owned(control, true);
    WEFT_MPI_TRY(MPI_Comm_set_errhandler(control, MPI_ERRORS_RETURN), ctx.operation, rank_);
    // On the heap: a broadcast that times out keeps its buffer.
    auto nonce = std::make_unique<std::uint64_t>(0);
    if (rank_ == 0) {
      std::random_device rd;
      *nonce =
          (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
          static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }
    WEFT_MPI_TRY(MPI_Ibcast(nonce.get(), 1, MPI_UINT64_T, 0, dup_.get(), &req), ctx.operation,
                 rank_);
    try {
      detail::mpi_wait(req, ctx, "agree on the family's nonce with every rank");
    } catch (...) {
      (void)nonce.release();
      throw;
    }
    // Every rank must have the same policy: it decides whether plans send credits. And the
    // same measured_automatic: measuring is collective.
    auto policies = std::make_unique<int[]>(4);
    policies[0] = static_cast<int>(policy);
    policies[1] = -static_cast<int>(policy);
    policies[2] = measurer_ != nullptr ? 1 : 0;
    policies[3] = -policies[2];
    WEFT_MPI_TRY(
        MPI_Iallreduce(MPI_IN_PLACE, policies.get(), 4, MPI_INT, MPI_MAX, dup_.get(), &req),
        ctx.operation, rank_);
    try {
      detail::mpi_wait(req, ctx, "compare the failure policy with every rank");
    } catch (...) {
      (void)policies.release();
      throw;
    }
    if (policies[0] != -policies[1]) {
      throw error(ctx.operation, rank_, error::unknown,
                  "the ranks disagree on mpi::options::on_failure (this rank: " +
                      std::string(weft::name_of(policy)) +
                      "): every rank of a communicator must pass the same");
    }
    if (policies[2] != -policies[3]) {
      throw error(ctx.operation, rank_, error::unknown,
                  std::string("the ranks disagree on mpi::options::measured_automatic (this "
                              "rank: ") +
                      (measurer_ != nullptr ? "set" : "unset") +
                      "): every rank of a communicator must pass the same");
    }
    std::vector<int> roots(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r)
      roots[static_cast<std::size_t>(r)] = r;
    root_of_ = std::make_shared<const std::vector<int>>(std::move(roots));
    family_ =
        std::make_shared<detail::mpi_family>(std::move(owned), *nonce, rank_, world_ranks_, policy);
    family_->enlist(progress_.get(), root_of_.get());
  }

  // dup_ = a private duplicate of `comm` for all of weft's traffic, credit_ = another for the
  // credits of plans' sends; rank_, size_, plan_tag_.
  void duplicate(MPI_Comm comm) {
    int rank = 0;
    WEFT_MPI_TRY(MPI_Comm_rank(comm, &rank), "mpi::communicator");
    detail::mpi_wait_context ctx{"mpi::communicator", rank, timeout_};
    if (family_) { // a split's: its family hears of a failure meanwhile
      ctx.family = family_.get();
      ctx.root_of = root_of_.get();
    }
    for (detail::mpi_comm_handle* h : {&dup_, &credit_}) {
      MPI_Comm dup = MPI_COMM_NULL;
      MPI_Request req = MPI_REQUEST_NULL;
      WEFT_MPI_TRY(MPI_Comm_idup(comm, &dup, &req), ctx.operation, rank);
      detail::mpi_wait(req, ctx, "duplicate the communicator (MPI_Comm_idup) with every rank");
      *h = detail::mpi_comm_handle(dup, true);
      WEFT_MPI_TRY(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), ctx.operation, rank);
    }
    WEFT_MPI_TRY(MPI_Comm_rank(dup_.get(), &rank_), ctx.operation, rank);
    WEFT_MPI_TRY(MPI_Comm_size(dup_.get(), &size_), ctx.operation, rank);
    // MPI defines the largest tag on MPI_COMM_WORLD, for every communicator.
    void* value = nullptr;
    int found = 0;
    WEFT_MPI_TRY(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found), ctx.operation,
                 rank);
    plan_tag_ = found != 0 && value != nullptr ? *static_cast<int*>(value) : 32767; // MPI's least
  }

  void translate_to_world(std::vector<int>& world) const {
    MPI_Group mine = MPI_GROUP_NULL;
    MPI_Group all = MPI_GROUP_NULL;
    WEFT_MPI_TRY(MPI_Comm_group(dup_.get(), &mine), "mpi::communicator", rank_);
    WEFT_MPI_TRY(MPI_Comm_group(MPI_COMM_WORLD, &all), "mpi::communicator", rank_);
    std::vector<int> ranks(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r)
      ranks[static_cast<std::size_t>(r)] = r;
    const int rc = MPI_Group_translate_ranks(mine, size_, ranks.data(), all, world.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    WEFT_MPI_TRY(rc, "mpi::communicator", rank_);
  }

  // Real nodes: the processes that share memory with this one, each node named by its
  // lowest rank; nodes in the order of those ranks, devices node-major.
  void detect_nodes() {
    const auto ctx = context("mpi::communicator");
    MPI_Comm node = MPI_COMM_NULL;
    WEFT_MPI_TRY(MPI_Comm_split_type(dup_.get(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                 ctx.operation, rank_);
    const detail::mpi_comm_handle node_handle(node, true);
    MPI_Group node_group = MPI_GROUP_NULL;
    MPI_Group group = MPI_GROUP_NULL;
    WEFT_MPI_TRY(MPI_Comm_group(node, &node_group), ctx.operation, rank_);
    WEFT_MPI_TRY(MPI_Comm_group(dup_.get(), &group), ctx.operation, rank_);
    const int first = 0;
    int leader = MPI_UNDEFINED;
    const int rc = MPI_Group_translate_ranks(node_group, 1, &first, group, &leader);
    MPI_Group_free(&node_group);
    MPI_Group_free(&group);
    WEFT_MPI_TRY(rc, ctx.operation, rank_);
    std::vector<int> leaders(static_cast<std::size_t>(size_));
    all_gather_ints(&leader, 1, leaders, ctx);
    std::vector<int> ids = leaders; // node names, in rank order of their leaders
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<int> per_node(ids.size(), 0);
    std::vector<int> node_index(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      const auto n =
          std::lower_bound(ids.begin(), ids.end(), leaders[static_cast<std::size_t>(r)]) -
          ids.begin();
      node_index[static_cast<std::size_t>(r)] = static_cast<int>(n);
      ++per_node[static_cast<std::size_t>(n)];
    }
    std::vector<int> next(ids.size(), 0); // next free device of each node
    for (std::size_t n = 1; n < ids.size(); ++n)
      next[n] = next[n - 1] + per_node[n - 1];
    devices_.resize(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      devices_[static_cast<std::size_t>(r)] =
          next[static_cast<std::size_t>(node_index[static_cast<std::size_t>(r)])]++;
    }
    cluster_ = std::make_shared<const topology::cluster>(
        per_node, topology::default_link(topology::link_kind::shm),
        topology::default_link(topology::link_kind::ethernet));
  }

  void set_node_of() {
    node_of_.resize(devices_.size());
    for (std::size_t r = 0; r < devices_.size(); ++r)
      node_of_[r] = cluster_->node_of(devices_[r]);
  }

  // all = every rank's n ints, gathered through weft's own buffer: one that MPI may still
  // write into after a deadline is kept, not freed.
  void all_gather_ints(const int* mine, int n, std::vector<int>& all,
                       const detail::mpi_wait_context& ctx) {
    // This rank's ints, then everyone's: both read or written by MPI until the gather is done.
    auto gathered =
        std::make_unique<std::byte[]>((all.size() + static_cast<std::size_t>(n)) * sizeof(int));
    auto* ints = reinterpret_cast<int*>(gathered.get());
    std::copy(mine, mine + n, ints + all.size());
    MPI_Request req = MPI_REQUEST_NULL;
    WEFT_MPI_TRY(MPI_Iallgather(ints + all.size(), n, MPI_INT, ints, n, MPI_INT, dup_.get(), &req),
                 ctx.operation, rank_);
    try {
      detail::mpi_wait(req, ctx, "gather from every rank");
    } catch (...) {
      if (family_)
        family_->park(std::move(gathered));
      else
        (void)gathered.release();
      throw;
    }
    std::copy(ints, ints + all.size(), all.begin());
  }

  void check_peer(int peer, std::string_view operation) const {
    check_peer_rank(peer, rank_, size_, false, operation);
  }

  void check_tag(int tag, std::string_view operation) const {
    if (tag < 0 || tag >= plan_tag_) {
      throw error(
          operation, rank_, error::unknown,
          "tag " + std::to_string(tag) + " outside [0, " + std::to_string(plan_tag_) +
              "): MPI tags are non-negative, and weft keeps MPI_TAG_UB for its collectives");
    }
  }

  // The messages of one step: pieces of at most `piece` elements, posted in order.
  template <class T>
  void post_sends(const T* data, std::size_t count, int peer, int tag, std::size_t piece,
                  detail::mpi_requests& set, std::string_view operation, bool weft_memory = false) {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    std::size_t off = 0;
    do { // a count of 0 is still one (empty) message
      const std::size_t n = std::min(piece, count - off);
      WEFT_MPI_TRY(MPI_Isend(data + off, static_cast<int>(n), type, peer, tag, dup_.get(),
                             &set.add_send(peer, weft_memory)),
                   operation, rank_, peer);
      off += n;
    } while (off < count);
  }
  template <class T>
  void post_recvs(T* data, std::size_t count, int peer, int tag, std::size_t piece,
                  detail::mpi_requests& set, std::string_view operation, bool weft_memory = false) {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    std::size_t off = 0;
    do {
      const std::size_t n = std::min(piece, count - off);
      WEFT_MPI_TRY(MPI_Irecv(data + off, static_cast<int>(n), type, peer, tag, dup_.get(),
                             &set.add_recv(peer, n, weft_memory)),
                   operation, rank_, peer);
      off += n;
    } while (off < count);
  }

  // A plan's send step, queued whole. A step larger than credit_bytes waits for its
  // receiver's credit (a zero-byte receive posted here; MPI keeps the order of one sender's
  // messages, so the k-th credit from a peer is for the k-th large step this rank queued for
  // it), then goes, all its pieces at once; a smaller step goes as soon as every step queued
  // before it for the same peer has gone, so that the pieces reach the receiver in order.
  template <class T>
  void queue_plan_sends(const T* data, std::size_t count, int peer, std::size_t piece,
                        bool weft_memory, std::string_view operation) {
    int credit = -1;
    if (credits() && count * sizeof(T) > credit_bytes) {
      credit = static_cast<int>(credits_in_.size());
      credits_in_.push_back(MPI_REQUEST_NULL);
      credit_arrived_.push_back(0);
      WEFT_MPI_TRY(
          MPI_Irecv(nullptr, 0, MPI_BYTE, peer, plan_tag_, credit_.get(), &credits_in_.back()),
          operation, rank_, peer);
    }
    queued_.push_back({data, count, piece, sizeof(T), detail::mpi_datatype<T>(), peer, weft_memory,
                       credit, false});
    ++unsent_;
  }

  // What a point-to-point send sends from: under throw_error a copy (p2p_copy_), since a
  // point-to-point receive posts no credit and MPI cannot cancel a send whose receiver is gone;
  // the caller's buffer otherwise.
  template <class T>
  const T* send_buffer(std::span<const T> data) {
    if (!credits()) return data.data();
    p2p_copy_ = std::make_unique<std::byte[]>(data.size_bytes() == 0 ? 1 : data.size_bytes());
    if (!data.empty()) std::memcpy(p2p_copy_.get(), data.data(), data.size_bytes());
    return reinterpret_cast<const T*>(p2p_copy_.get());
  }

  // Gives `peer` the credit for a step of `count` elements of T, as this rank posts the
  // step's first receive (none for a step small enough to go without).
  template <class T>
  void grant_credit(std::size_t count, int peer, std::string_view operation) {
    if (!credits() || count * sizeof(T) <= credit_bytes) return;
    MPI_Request r = MPI_REQUEST_NULL;
    WEFT_MPI_TRY(MPI_Isend(nullptr, 0, MPI_BYTE, peer, plan_tag_, credit_.get(), &r), operation,
                 rank_, peer);
    MPI_Request_free(&r); // no buffer: nothing to wait for
  }

  // A plan's recv step: its pieces' receives, then the step's credit.
  template <class T>
  void post_plan_recvs(T* data, std::size_t count, int peer, std::size_t piece, bool weft_memory,
                       std::string_view operation) {
    post_recvs(data, count, peer, plan_tag_, piece, recvs_, operation, weft_memory);
    grant_credit<T>(count, peer, operation);
  }

  // Sends the queued steps that may go (see queue_plan_sends). The round's last wait ends
  // when unsent_ is 0 and the sends are done; the next round starts with empty lists.
  void release_queued_sends() {
    if (unsent_ == 0) {
      queued_.clear();
      credits_in_.clear();
      credit_arrived_.clear();
      return;
    }
    if (!credits_in_.empty()) {
      credit_index_.resize(credits_in_.size());
      int completed = 0;
      WEFT_MPI_TRY(MPI_Testsome(static_cast<int>(credits_in_.size()), credits_in_.data(),
                                &completed, credit_index_.data(), MPI_STATUSES_IGNORE),
                   "plan", rank_);
      if (completed != MPI_UNDEFINED && completed > 0) {
        for (int k = 0; k < completed; ++k)
          credit_arrived_[static_cast<std::size_t>(credit_index_[static_cast<std::size_t>(k)])] = 1;
        // A credit may be older than a verdict: a receiver that failed since has cancelled
        // its receive. Read the control channel before handing MPI the caller's buffer.
        family_->poll();
        family_->failure().check(operation_, rank_);
      }
    }
    blocked_.assign(static_cast<std::size_t>(size_), 0);
    for (queued_send& q : queued_) {
      if (q.sent || blocked_[static_cast<std::size_t>(q.peer)] != 0) continue;
      if (q.credit >= 0 && credit_arrived_[static_cast<std::size_t>(q.credit)] == 0) {
        blocked_[static_cast<std::size_t>(q.peer)] = 1;
        continue;
      }
      const auto* bytes = static_cast<const std::byte*>(q.data);
      bool weft_memory = q.weft_memory;
      if (q.credit < 0 && credits() && !weft_memory) {
        // A small step goes without a credit: from a copy, so that a send MPI did not buffer
        // eagerly cannot keep the caller's buffer after a failure (the copy is parked instead).
        const std::size_t n = q.count * q.element_bytes;
        auto& copy = eager_copies_.emplace_back(std::make_unique<std::byte[]>(n == 0 ? 1 : n));
        if (n > 0) std::memcpy(copy.get(), bytes, n);
        bytes = copy.get();
        weft_memory = true;
      }
      std::size_t off = 0;
      do { // a count of 0 is still one (empty) message
        const std::size_t n = std::min(q.piece, q.count - off);
        WEFT_MPI_TRY(MPI_Isend(bytes + off * q.element_bytes, static_cast<int>(n), q.type, q.peer,
                               plan_tag_, dup_.get(), &sends_.add_send(q.peer, weft_memory)),
                     "plan", rank_, q.peer);
        off += n;
      } while (off < q.count);
      q.sent = true;
      --unsent_;
    }
  }

  // Whether large steps wait for credits: under throw_error, whose failed calls must return
  // with nothing left on the caller's buffers. Under abort_job a failure ends the job, and
  // large sends go at once, as fast as without weft's failure handling. Every rank of a
  // family has the same policy (checked when the root is made).
  [[nodiscard]] bool credits() const noexcept {
    return family_->policy() == weft::on_failure::throw_error;
  }

  [[nodiscard]] int first_unsent_peer() const noexcept {
    for (const queued_send& q : queued_) {
      if (!q.sent) return q.peer;
    }
    return error::unknown;
  }

  // dst = a (op) message from peer, piece by piece: up to pieces_in_flight pieces land in
  // the staging slots while the oldest is reduced.
  template <class T, class Op>
  void recv_reduce(const T* a, T* dst, std::size_t count, int peer, std::size_t piece, const Op& op,
                   const detail::mpi_wait_context& ctx) {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    const std::size_t pieces = (count + piece - 1) / piece;
    const std::size_t depth = std::min(pieces, pieces_in_flight);
    const std::size_t stride = std::min(count, piece);
    T* const stage = staging_.get<T>(depth * stride);
    recvs_.resize(depth);
    const auto post = [&](std::size_t p) {
      const std::size_t off = p * piece;
      const std::size_t n = std::min(piece, count - off);
      const std::size_t slot = p % depth;
      WEFT_MPI_TRY(MPI_Irecv(stage + slot * stride, static_cast<int>(n), type, peer, plan_tag_,
                             dup_.get(), &recvs_.set_recv(slot, peer, n)),
                   ctx.operation, rank_, peer);
    };
    for (std::size_t p = 0; p < depth; ++p)
      post(p);
    grant_credit<T>(count, peer, ctx.operation);
    for (std::size_t p = 0; p < pieces; ++p) {
      const std::size_t off = p * piece;
      const std::size_t n = std::min(piece, count - off);
      const std::size_t slot = p % depth;
      recvs_.wait(slot, type, dtype_traits<T>::name, ctx);
      detail::reduce2(dst + off, a + off, stage + slot * stride, n, op);
      if (p + depth < pieces) post(p + depth);
    }
    recvs_.resize(0);
  }

  detail::mpi_comm_handle base_;   // the wrapped communicator (borrowed or owned)
  detail::mpi_comm_handle dup_;    // weft's private duplicate of it, always owned
  detail::mpi_comm_handle credit_; // another, for the credits of plans' sends
  int rank_ = 0;
  int size_ = 0;
  int plan_tag_ = 32767;
  std::vector<int> world_ranks_;
  std::vector<int> devices_;
  std::vector<int> node_of_;
  std::shared_ptr<const topology::cluster> cluster_;
  bool emulated_ = false;
  std::chrono::milliseconds timeout_;
  bool check_calls_ = false;
  std::uint64_t seq_ = 0;
  std::uint64_t p2p_seq_ = 0;
  std::unique_ptr<detail::progress_record> progress_ = std::make_unique<detail::progress_record>();
  std::shared_ptr<detail::mpi_family> family_;
  std::shared_ptr<const std::vector<int>> root_of_; // rank r's rank in the family's root
  detail::scratch_buffer scratch_;
  detail::scratch_buffer staging_;
  // post()'s messages in flight, oldest first, each with its own copy of the data.
  struct posted_message {
    std::unique_ptr<std::byte[]> copy;
    detail::mpi_requests requests;
    std::string_view type_name;
  };
  // Dropping a message not yet delivered (the communicator destroyed or assigned over first)
  // lets MPI finish it in the background: its request is freed, its copy leaked, since MPI may
  // still read it. Correct programs' peers take every message, so little or nothing leaks.
  // (The communicator's move assignment destroys and rebuilds, so an outbox is never assigned.)
  class outbox : public std::deque<posted_message> {
  public:
    outbox() = default;
    outbox(outbox&&) noexcept = default;
    outbox& operator=(outbox&&) = delete;
    outbox(const outbox&) = delete;
    outbox& operator=(const outbox&) = delete;
    ~outbox() { settle(); }

  private:
    void settle() noexcept {
      for (posted_message& m : *this) {
        bool delivered = false;
        try {
          delivered = detail::mpi_alive() &&
                      m.requests.test_all(MPI_BYTE, m.type_name, {"post", error::unknown, {}});
        } catch (...) {
        }
        if (!delivered && m.requests.retire(std::chrono::milliseconds(0)).weft_memory)
          (void)m.copy.release();
      }
      clear();
    }
  };
  outbox posted_;
  // In-flight requests; empty between calls. Members so that their storage is reused.
  detail::mpi_requests sends_;
  detail::mpi_requests recvs_;
  detail::mpi_requests p2p_;
  // A plan round's sends in order, and the credits the large ones wait for (see execute).
  struct queued_send {
    const void* data;
    std::size_t count; // elements of the step
    std::size_t piece; // elements of one message
    std::size_t element_bytes;
    MPI_Datatype type;
    int peer;
    bool weft_memory;
    int credit; // index into credits_in_; -1: small enough to go without
    bool sent;
  };
  std::vector<queued_send> queued_;
  std::vector<MPI_Request> credits_in_;
  std::vector<char> credit_arrived_;
  std::vector<int> credit_index_;
  std::vector<char> blocked_; // per peer, in one pass of release_queued_sends
  std::size_t unsent_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> eager_copies_; // small steps' data, under throw_error
  std::unique_ptr<std::byte[]> p2p_copy_;                  // send()'s data, under throw_error
  std::string_view operation_ = "plan";                    // the plan running now, for errors
  measurer measurer_ = nullptr;                            // options::measured_automatic
  std::array<std::shared_ptr<const measured_prices>, 8> measured_; // by collective
};

/// The opt-in for options::measured_automatic: automatic picks by prices measured on this
/// machine, MPI's own collective among the candidates (see the header).
///   auto world = weft::mpi::world({.measured_automatic = weft::mpi::measured_automatic()});
/// A template, so that only a program that opts in compiles the measurement.
template <class Comm = communicator>
[[nodiscard]] measurer measured_automatic() noexcept {
  return [](Comm& comm, collective c, bool peer_access, bool messages,
            const measured_prices* base) -> std::shared_ptr<const measured_prices> {
    using weft::detail::measured_prices_for;
    switch (c) {
      case collective::all_reduce:
        return measured_prices_for<collective::all_reduce, true>(comm, peer_access, messages, base);
      case collective::reduce_scatter:
        return measured_prices_for<collective::reduce_scatter, true>(comm, peer_access, messages,
                                                                     base);
      case collective::all_gather:
        return measured_prices_for<collective::all_gather, true>(comm, peer_access, messages, base);
      case collective::broadcast:
        return measured_prices_for<collective::broadcast, true>(comm, peer_access, messages, base);
      case collective::reduce:
        return measured_prices_for<collective::reduce, true>(comm, peer_access, messages, base);
      case collective::all_to_all:
        return measured_prices_for<collective::all_to_all, true>(comm, peer_access, messages, base);
    }
    throw error("weft: mpi measured automatic: no such collective (" +
                std::to_string(static_cast<int>(c)) + ")");
  };
}

/// A communicator over MPI_COMM_WORLD (borrowed). Collective over all processes.
inline communicator world(const options& opt = {}) {
  return communicator::borrow(MPI_COMM_WORLD, opt);
}

/// Broadcasts `data` from `root` to every rank of `comm`, which must all pass the same
/// number of bytes: the bootstrap of another library's communicator (NCCL's ncclUniqueId,
/// made on one rank and needed by all). Waits at most comm.timeout(). The broadcast goes
/// through weft's own buffer, so a deadline never leaves MPI writing into `data`.
inline void broadcast_bytes(communicator& comm, std::span<std::byte> data, int root) {
  const std::string_view operation = "broadcast_bytes";
  if (root < 0 || root >= comm.size_) {
    throw error(operation, comm.rank_, error::unknown,
                "root " + std::to_string(root) + " outside the communicator of " +
                    std::to_string(comm.size_) + " ranks");
  }
  if (data.size() > communicator::max_message) {
    throw error(operation, comm.rank_, error::unknown, "more than INT_MAX bytes");
  }
  const communicator::recorded scope(comm, operation);
  const auto ctx = comm.context(operation);
  comm.guarded(operation, [&] {
    auto bytes = std::make_unique<std::byte[]>(data.empty() ? 1 : data.size());
    if (comm.rank_ == root && !data.empty()) std::memcpy(bytes.get(), data.data(), data.size());
    MPI_Request req = MPI_REQUEST_NULL;
    WEFT_MPI_TRY(MPI_Ibcast(bytes.get(), static_cast<int>(data.size()), MPI_BYTE, root,
                            comm.dup_.get(), &req),
                 ctx.operation, comm.rank_);
    try {
      detail::mpi_wait(req, ctx, "receive the broadcast from its root");
    } catch (...) {
      comm.family_->park(std::move(bytes));
      throw;
    }
    if (!data.empty()) std::memcpy(data.data(), bytes.get(), data.size());
  });
}

} // namespace weft::mpi

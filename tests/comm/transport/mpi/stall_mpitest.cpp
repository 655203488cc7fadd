// One rank stalls (it sleeps before its call) while the others are in a call with it: every
// survivor's error must name the stalled rank, a survivor's buffer must be its own again once
// the error is thrown (one frees it, the others keep and re-read it after the stalled rank has
// woken and made its own call), a later call on the failed communicator must throw the first
// failure at once, and the job must end cleanly: never a segfault or a hang. ctest runs each
// mode under mpirun -n 4 with a 60 s limit; a rank that finds something wrong prints "FAIL"
// and exits 1.
//
//   stall_mpitest collective        a 4 MiB ring all-reduce, on_failure::throw_error
//   stall_mpitest collective_abort  the same under the default on_failure::abort_job: the job
//                                   ends with weft's message and MPI_Abort's errorcode 1
//   stall_mpitest vendor            MPI's own all-reduce (algo::vendor: MPI_Iallreduce), 4 MiB,
//                                   on_failure::throw_error
//   stall_mpitest post              buffered post() sends to the stalled rank, then flush()
//   stall_mpitest optimizer         data_parallel<zero<2>> with its bucket reductions on the
//                                   progress thread
#include <weft/comm/transport/mpi.hpp>
#include <weft/optim.hpp>
#include <weft/weft.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace wo = weft::optim;

constexpr int stalled = 2;
constexpr auto timeout = 2000ms;
constexpr auto asleep = 6s; // well past every survivor's deadline and verdict
constexpr std::size_t elements = std::size_t{1} << 20; // 4 MiB of float

int failures = 0;

void check(bool ok, int rank, const std::string& what, const std::string& detail = {}) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "FAIL rank %d: %s%s%s\n", rank, what.c_str(), detail.empty() ? "" : "\n  ",
               detail.c_str());
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const weft::error& e) {
    return e.what();
  }
  return {};
}

// The stalled rank's own call, once it wakes: the family failed meanwhile, and it says so at
// once, naming this rank.
template <class F>
void late_call(int rank, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = error_of(f);
  check(!msg.empty(), rank, "the stalled rank's late call did not throw");
  check(std::chrono::steady_clock::now() - t0 < 1s, rank, "the late call did not throw at once");
  check(contains(msg, "the communicator failed earlier") && contains(msg, "world rank 2 stalled"),
        rank, "the late call's error does not give the first failure", msg);
}

// A survivor's error, and then a later call on the same communicator.
template <class Later>
void survivor_checks(int rank, const std::string& msg, Later&& later) {
  std::fprintf(stderr, "rank %d: %s\n", rank, msg.c_str());
  check(!msg.empty(), rank, "the call did not fail");
  check(contains(msg, "world rank 2 stalled"), rank, "the error does not name the stalled rank",
        msg);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string again = error_of(later);
  check(std::chrono::steady_clock::now() - t0 < 500ms, rank,
        "a later call on the failed communicator waited");
  check(
      contains(again, "the communicator failed earlier") && contains(again, "world rank 2 stalled"),
      rank, "a later call does not throw the first failure", again);
}

// The survivors wait here until the stalled rank has woken and made its call; then what the
// stalled rank's traffic could still do to their buffers has had its chance.
void after_the_stalled_rank_woke() {
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(200ms);
  MPI_Barrier(MPI_COMM_WORLD);
}

template <class Algo = weft::algo::ring>
void collective(weft::mpi::communicator& world) {
  const int rank = world.rank();
  auto buf = std::make_unique<std::vector<float>>(elements, static_cast<float>(rank + 1));
  if (rank == stalled) {
    std::this_thread::sleep_for(asleep);
    late_call(rank, [&] { weft::all_reduce<Algo>(world, std::span(*buf)); });
    after_the_stalled_rank_woke();
    return;
  }
  const std::string msg = error_of([&] { weft::all_reduce<Algo>(world, std::span(*buf)); });
  survivor_checks(rank, msg, [&] { world.barrier(); });
  // Rank 1 frees its buffer, as unwinding would, and fills new memory (likely the same pages)
  // with a pattern; the others keep theirs. Nothing may change either after the error.
  if (rank == 1) {
    buf.reset();
    buf = std::make_unique<std::vector<float>>(elements, -7.0f);
  }
  const std::vector<float> snapshot = *buf;
  after_the_stalled_rank_woke();
  check(*buf == snapshot, rank, "the buffer changed after the error");
}

void post(weft::mpi::communicator& world) {
  const int rank = world.rank();
  const int p = world.size();
  std::vector<float> out(elements, static_cast<float>(rank));
  std::vector<float> in(elements, 0.0f);
  if (rank == stalled) {
    std::this_thread::sleep_for(asleep);
    late_call(rank, [&] { world.post(std::span<const float>(out), (rank + 1) % p, 3); });
    after_the_stalled_rank_woke();
    return;
  }
  // Ranks 1 and 3 wait on rank 2 (to take a posted message, to send one); rank 0 finishes its
  // exchange and waits in the all-reduce after it, on ranks that have failed by then.
  const std::string msg = error_of([&] {
    world.post(std::span<const float>(out), (rank + 1) % p, 3);
    world.recv(std::span(in), (rank + p - 1) % p, 3);
    world.flush();
    weft::all_reduce<weft::algo::ring>(world, std::span(in));
  });
  survivor_checks(rank, msg, [&] { world.post(std::span<const float>(out), (rank + 1) % p, 4); });
  const std::vector<float> snapshot = in;
  after_the_stalled_rank_woke();
  check(in == snapshot, rank, "the receive buffer changed after the error");
}

void optimizer(weft::mpi::communicator& world) {
  const int rank = world.rank();
  wo::param_set params;
  for (int t = 0; t < 4; ++t)
    params.add("w" + std::to_string(t), {elements / 4});
  auto opt = wo::make_data_parallel<wo::zero<2>, float>(
      world, params, wo::sgd{.lr = 0.1f}, {.bucket_elements = elements / 4, .overlap = true});
  std::vector<float> initial(elements, 1.0f);
  opt->set_parameters(initial);
  if (rank == stalled) std::this_thread::sleep_for(asleep);
  // Each tensor is a bucket: marking it ready starts its reduce-scatter on the progress thread.
  const std::string msg = error_of([&] {
    for (const auto& t : params.tensors()) {
      auto g = opt->grad(t.name);
      for (auto& x : g)
        x = 1.0f;
      opt->grad_ready(t.name);
    }
    opt->step(1.0f);
  });
  if (rank == stalled) {
    check(contains(msg, "the communicator failed earlier") && contains(msg, "world rank 2 stalled"),
          rank, "the stalled rank's step does not give the first failure", msg);
    after_the_stalled_rank_woke();
    return;
  }
  survivor_checks(rank, msg, [&] { world.barrier(); });
  after_the_stalled_rank_woke();
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "collective" && mode != "collective_abort" && mode != "vendor" && mode != "post" &&
      mode != "optimizer") {
    std::fprintf(stderr,
                 "usage: stall_mpitest collective|collective_abort|vendor|post|optimizer\n");
    return 2;
  }
  weft::mpi::environment env(argc, argv, MPI_THREAD_MULTIPLE);
  {
    weft::mpi::options opt{.timeout = timeout, .topology = {}};
    if (mode != "collective_abort") opt.on_failure = weft::on_failure::throw_error;
    auto world = weft::mpi::world(opt);
    if (world.size() != 4) {
      std::fprintf(stderr, "stall_mpitest runs on 4 processes\n");
      return 2;
    }
    if (mode == "collective" || mode == "collective_abort") collective(world);
    if (mode == "vendor") collective<weft::algo::vendor>(world);
    if (mode == "post") post(world);
    if (mode == "optimizer") optimizer(world);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (failures == 0) std::fprintf(stderr, "PASS rank %d\n", rank);
  return failures == 0 ? 0 : 1;
}

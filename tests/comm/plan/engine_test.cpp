#include <weft/comm/plan/engine.hpp>
#include <weft/core/error.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

namespace {

using weft::buffer;
using weft::collective;
using weft::plan;
using weft::plan_request;
using weft::plan_round;
using weft::step;

// Writes down every hook run_plan calls, in order.
struct recording : weft::plan_hooks {
  std::vector<std::string> calls;

  void note(const std::string& what, std::size_t k) { calls.push_back(what + std::to_string(k)); }
  void begin_round(const plan_round& r) { calls.push_back("begin" + std::to_string(r.number)); }
  void at_step(const plan_round&, std::size_t k, const step&) { note("at", k); }
  void send(std::size_t k, const step&) { note("send", k); }
  void sends_posted(const plan_round& r) { calls.push_back("posted" + std::to_string(r.number)); }
  void recv(std::size_t k, const step&) { note("recv", k); }
  void recv_reduce(std::size_t k, const step&) { note("recv_reduce", k); }
  void copy(std::size_t k, const step&) { note("copy", k); }
  void reduce(std::size_t k, const step&) { note("reduce", k); }
  void load(std::size_t k, const step&) { note("load", k); }
  void load_reduce(std::size_t k, const step&) { note("load_reduce", k); }
  void sync(std::size_t k, const step&) { note("sync", k); }
  void end_round(const plan_round& r) { calls.push_back("end" + std::to_string(r.number)); }
};

TEST(plan_engine, a_round_posts_its_sends_first_then_runs_its_other_steps_in_order) {
  plan pl(plan_request{collective::all_reduce, 4, 0, 8, 0, {}, 4});
  pl.copy(buffer::input, 0, buffer::output, 0, 8); // 0
  pl.send(1, buffer::output, 0, 4);                // 1
  pl.recv_reduce(3, buffer::input, 4, buffer::output, 4, 4);
  pl.send(2, buffer::output, 4, 4); // 3: still posted before the receive above
  pl.next_round();
  pl.recv(1, buffer::output, 0, 4); // 4
  pl.reduce(buffer::input, 0, buffer::output, 0, 4);
  const int g = pl.add_group({0, 1});
  pl.load(1, buffer::input, 0, buffer::scratch, 0, 4);       // 6
  pl.load_reduce(g, buffer::input, 0, buffer::output, 0, 4); // 7
  pl.sync(g);                                                // 8, a round of its own
  recording x;
  weft::run_plan(pl.steps(), x);
  const std::vector<std::string> want = {
      "begin0", "at1",    "send1",        "at3",  "send3",  "posted0", "at0",
      "copy0",  "at2",    "recv_reduce2", "end0", "begin1", "posted1", "at4",
      "recv4",  "at5",    "reduce5",      "at6",  "load6",  "at7",     "load_reduce7",
      "end1",   "begin2", "posted2",      "at8",  "sync8",  "end2"};
  EXPECT_EQ(x.calls, want);
}

TEST(plan_engine, an_empty_plan_calls_no_hook) {
  recording x;
  weft::run_plan(plan().steps(), x);
  EXPECT_TRUE(x.calls.empty());
}

// A transport whose plan check refuses a family of kinds runs no step of it silently: reaching
// one throws.
struct peer_access_only : weft::plan_hooks_without_messages {
  int ran = 0;
  void begin_round(const plan_round&) {}
  void at_step(const plan_round&, std::size_t, const step&) {}
  void sends_posted(const plan_round&) {}
  void end_round(const plan_round&) {}
  void copy(std::size_t, const step&) { ++ran; }
  void reduce(std::size_t, const step&) { ++ran; }
  void load(std::size_t, const step&) { ++ran; }
  void load_reduce(std::size_t, const step&) { ++ran; }
  void sync(std::size_t, const step&) { ++ran; }
};
struct messages_only : weft::plan_hooks_without_peer_access {
  int ran = 0;
  void begin_round(const plan_round&) {}
  void at_step(const plan_round&, std::size_t, const step&) {}
  void sends_posted(const plan_round&) {}
  void end_round(const plan_round&) {}
  void send(std::size_t, const step&) { ++ran; }
  void recv(std::size_t, const step&) { ++ran; }
  void recv_reduce(std::size_t, const step&) { ++ran; }
  void copy(std::size_t, const step&) { ++ran; }
  void reduce(std::size_t, const step&) { ++ran; }
};

TEST(plan_engine, a_kind_the_check_refuses_throws_if_it_reaches_the_run) {
  plan msg(plan_request{collective::all_reduce, 2, 0, 4, 0, {}, 4});
  msg.copy(buffer::input, 0, buffer::output, 0, 4);
  msg.recv(1, buffer::output, 0, 4);
  peer_access_only p;
  try {
    weft::run_plan(msg.steps(), p);
    ADD_FAILURE() << "a recv ran on hooks without messages";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("internal error"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("recv"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p.ran, 1); // the copy before it

  plan peer(plan_request{collective::all_reduce, 2, 0, 4, 0, {}, 4});
  peer.send(1, buffer::input, 0, 4);
  peer.sync(peer.add_group({0, 1}));
  messages_only m;
  EXPECT_THROW(weft::run_plan(peer.steps(), m), weft::error);
  EXPECT_EQ(m.ran, 1); // the send
}

} // namespace

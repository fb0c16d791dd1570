// Ranks that make different calls (docs/collectives.md, "Failures"): every rank runs each scenario
// below on a communicator of its own, one rank (or several) calling something else than the
// others, and checks that
//   - every rank that took part fails with ErrorKind::call_mismatch, well within 10 s (not after
//     the timeout), and its message names both calls;
//   - no user buffer was written: inputs, in-place buffers and outputs hold what they held;
//   - the communicator is broken afterwards (the next call fails at once).
// Then a last communicator runs one matched all_reduce, to show the job is still usable.
//
//   mismatch_check --local N [--profile P] [--mesh] [--quirk Q]   starts N ranks of itself
//   mismatch_check [--only NAME]                                  one rank, from the environment
// Exit 0 when every scenario behaved; each problem is a line with FAIL.
#include <tbverbs/collective.hpp>

#include "check_main.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using tbverbs::Communicator;
using tbverbs::ErrorKind;
using tbverbs::ReduceOp;
using tbverbs::Result;

using check::failed;

// A buffer of `n` elements with a pattern that no collective of the scenarios produces, and the
// check that it still holds it.
template <class T> struct Guarded {
  std::vector<T> v;
  std::vector<T> kept;
  Guarded(std::size_t n, int salt) : v(n) {
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(1000 + 37 * salt + static_cast<int>(i % 50));
    kept = v;
  }
  std::span<T> span() { return v; }
  std::span<const T> cspan() const { return v; }
  void check(const std::string& what) const {
    if (std::memcmp(v.data(), kept.data(), v.size() * sizeof(T)) != 0) failed(what + ": a user buffer was written");
  }
};

// One scenario: what rank r of n calls (returns false when r takes no part), and two words both
// calls' descriptions must show in the error.
struct Scenario {
  std::string name;
  int min_ranks;
  std::function<bool(Communicator&, int, int, Result<void>&)> call;
  std::string word_a, word_b;
};

std::vector<Scenario> scenarios() {
  std::vector<Scenario> s;
  // all_reduce in place: rank 0 one element, the others two (ring or latency, as chosen).
  s.push_back({"count", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 Guarded<float> b(r == 0 ? 1 : 2, r);
                 out = c.all_reduce(b.span());
                 b.check("count");
                 return true;
               },
               "1 element", "2 elements"});
  // The reduce_scatter: rank 0 blocks of 1 element, the others of 2.
  s.push_back({"reduce_scatter_count", 2,
               [](Communicator& c, int r, int n, Result<void>& out) {
                 const std::size_t block = r == 0 ? 1 : 2;
                 Guarded<float> in(block * static_cast<std::size_t>(n), r), o(block, 100 + r);
                 out = c.reduce_scatter(in.cspan(), o.span());
                 in.check("reduce_scatter input");
                 o.check("reduce_scatter output");
                 return true;
               },
               "reduce_scatter", "element"});
  // all_reduce on rank 0, broadcast from rank 1 on the others.
  s.push_back({"collective", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 Guarded<float> b(1, r);
                 out = r == 0 ? c.all_reduce(b.span()) : c.broadcast(b.span(), 1);
                 if (r != 1) b.check("collective");
                 return true;
               },
               "all_reduce", "broadcast"});
  // The same with a million elements (the head messages differ in frames).
  s.push_back({"collective_large", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 Guarded<float> b(1000000, r);
                 out = r == 0 ? c.all_reduce(b.span()) : c.broadcast(b.span(), 1);
                 if (r != 1) b.check("collective_large");
                 return true;
               },
               "all_reduce", "broadcast"});
  // float32 on rank 0, int32 on the others, out of place.
  s.push_back({"dtype", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 if (r == 0) {
                   Guarded<float> in(2, r), o(2, 50);
                   out = c.all_reduce(in.cspan(), o.span());
                   in.check("dtype input");
                   o.check("dtype output");
                 } else {
                   Guarded<std::int32_t> in(2, r), o(2, 50);
                   out = c.all_reduce(in.cspan(), o.span());
                   in.check("dtype input");
                   o.check("dtype output");
                 }
                 return true;
               },
               "float32", "int32"});
  // sum on rank 0, max on the others.
  s.push_back({"op", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 Guarded<float> b(2, r);
                 out = c.all_reduce(b.span(), r == 0 ? ReduceOp::sum : ReduceOp::max);
                 b.check("op");
                 return true;
               },
               "sum", "max"});
  // broadcast from rank 0 on rank 0, from the last rank on the others.
  s.push_back({"root", 2,
               [](Communicator& c, int r, int n, Result<void>& out) {
                 Guarded<float> b(3, r);
                 const int root = r == 0 ? 0 : n - 1;
                 out = c.broadcast(b.span(), root);
                 if (r != 0 && r != n - 1) b.check("root");
                 return true;
               },
               "root 0", "root"});
  // reduce on rank 0, all_reduce on the others: the same schedule underneath (reduce runs as an
  // all_reduce), a different call.
  s.push_back({"reduce_vs_all_reduce", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 Guarded<float> in(2, r), o(2, 60 + r);
                 out = r == 0 ? c.reduce(in.cspan(), o.span(), ReduceOp::sum, 0) : c.all_reduce(in.cspan(), o.span());
                 in.check("reduce input");
                 o.check("reduce output");
                 return true;
               },
               "root 0", "all_reduce"});
  // all_to_all on rank 0, all_gather of as many bytes on the others (both all_gather's schedule).
  s.push_back({"all_to_all_vs_all_gather", 2,
               [](Communicator& c, int r, int n, Result<void>& out) {
                 const std::size_t all = 2 * static_cast<std::size_t>(n);
                 Guarded<float> in(all, r), o(r == 0 ? all : all * static_cast<std::size_t>(n), 70 + r);
                 out = r == 0 ? c.all_to_all(in.cspan(), o.span()) : c.all_gather(in.cspan(), o.span());
                 in.check("all_to_all input");
                 o.check("all_to_all output");
                 return true;
               },
               "all_to_all", "all_gather"});
  // gather to rank 0 on rank 0, scatter from rank 0 on the others.
  s.push_back({"gather_vs_scatter", 2,
               [](Communicator& c, int r, int n, Result<void>& out) {
                 const std::size_t all = 3 * static_cast<std::size_t>(n);
                 Guarded<float> mine(3, r), blocks(all, 80 + r);
                 out = r == 0 ? c.gather(mine.cspan(), blocks.span(), 0) : c.scatter(blocks.cspan(), mine.span(), 0);
                 mine.check("gather/scatter block");
                 blocks.check("gather/scatter blocks");
                 return true;
               },
               "gather", "scatter"});
  // The rank at the far side of the ring differs (4 ranks: neither neighbour of rank 0).
  s.push_back({"far_rank", 4,
               [](Communicator& c, int r, int n, Result<void>& out) {
                 Guarded<float> b(r == n / 2 ? 3 : 2, r);
                 out = c.all_reduce(b.span());
                 b.check("far_rank");
                 return true;
               },
               "3 elements", "2 elements"});
  // A large ring all_reduce with one element more on the far rank: the bandwidth algorithm.
  s.push_back({"far_rank_large", 4,
               [](Communicator& c, int r, int n, Result<void>& out) {
                 Guarded<float> b(r == n / 2 ? 300001 : 300000, r);
                 out = c.all_reduce(b.span());
                 b.check("far_rank_large");
                 return true;
               },
               "300001 elements", "300000 elements"});
  // send and recv of different sizes between ranks 0 and 1; the others take no part.
  s.push_back({"p2p_count", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 if (r > 1) return false;
                 Guarded<float> b(r == 0 ? 4 : 5, r);
                 out = r == 0 ? c.send(b.cspan(), 1) : c.recv(b.span(), 0);
                 b.check("p2p_count");
                 return true;
               },
               "4 elements", "5 elements"});
  // send and recv of different sizes between ranks 0 and 2, which share no cable on a ring of 4
  // (the side channel carries them); the others take no part.
  s.push_back({"p2p_no_cable", 4,
               [](Communicator& c, int r, int, Result<void>& out) {
                 if (r != 0 && r != 2) return false;
                 Guarded<std::int64_t> b(r == 0 ? 4 : 5, r);
                 out = r == 0 ? c.send(b.cspan(), 2) : c.recv(b.span(), 0);
                 if (r == 0 && out) return false; // the sender's bytes are on their way: the receiver checks
                 b.check("p2p_no_cable");
                 return true;
               },
               "4 elements", "5 elements"});
  // rank 0 sends to rank 1, which (with every other rank) calls all_reduce.
  s.push_back({"p2p_vs_collective", 2,
               [](Communicator& c, int r, int, Result<void>& out) {
                 Guarded<float> b(4, r);
                 out = r == 0 ? c.send(b.cspan(), 1) : c.all_reduce(b.span());
                 b.check("p2p_vs_collective");
                 return true;
               },
               "send", "all_reduce"});
  return s;
}

Result<Communicator> connect() {
  auto opts = tbverbs::CommunicatorOptions::from_env();
  if (!opts) return tbverbs::fail(opts.error());
  opts->timeout = std::chrono::milliseconds(30000);
  return Communicator::connect(*opts);
}

// The error of a rank that took part: kind, time, both calls in the message.
void check_error(const Scenario& s, const tbverbs::Error& e, double secs, const char* where) {
  const std::string m = e.message();
  std::printf("rank %d: %s: %s failed after %.3f s as expected: %s\n", check::rank, s.name.c_str(), where, secs, m.c_str());
  if (e.kind != ErrorKind::call_mismatch) failed(s.name + ": the error is not call_mismatch: " + m);
  if (secs > 10) failed(s.name + ": the mismatch took " + std::to_string(secs) + " s to report");
  if (m.find(s.word_a) == std::string::npos || m.find(s.word_b) == std::string::npos)
    failed(s.name + ": the message does not show both calls (\"" + s.word_a + "\", \"" + s.word_b + "\")");
}

void run_scenario(const Scenario& s) {
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = connect();
  if (!comm) {
    // connect() is no barrier: ranks that finished it may make their call (and find the
    // mismatch) while this one still sets up its links; it then hears of the mismatch here.
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check_error(s, comm.error(), secs, "connect");
    return;
  }
  Communicator& c = *comm;
  const int n = c.size();
  if (n < s.min_ranks) return;
  Result<void> r;
  const auto t1 = std::chrono::steady_clock::now();
  check::rank = c.rank();
  const bool part = s.call(c, c.rank(), n, r);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (!part) return; // ranks outside the call leave the communicator as it is
  if (r) {
    failed(s.name + ": returned ok although the ranks made different calls");
    return;
  }
  check_error(s, r.error(), secs, "the call");
  const auto t2 = std::chrono::steady_clock::now();
  if (auto again = c.barrier(); again) failed(s.name + ": a barrier after the mismatch returned ok");
  if (std::chrono::steady_clock::now() - t2 > std::chrono::seconds(1)) failed(s.name + ": the call after it waited");
}

int run_rank(const std::string& only) {
  check::rank = std::atoi(std::getenv("RANK") != nullptr ? std::getenv("RANK") : "-1");
  for (const Scenario& s : scenarios())
    if (only.empty() || only == s.name) run_scenario(s);
  // A matched call on a fresh communicator: nothing of the failures stayed behind.
  auto comm = connect();
  if (!comm) {
    failed("connect after the scenarios: " + comm.error().message());
    return 1;
  }
  std::vector<float> v(5, 1.0f);
  if (auto r = comm->all_reduce(std::span<float>(v)); !r) failed("a matched all_reduce: " + r.error().message());
  else if (v[4] != static_cast<float>(comm->size())) failed("a matched all_reduce computed " + std::to_string(v[4]));
  if (auto r = comm->close(); !r) failed("close: " + r.error().message());
  if (check::failures == 0) std::printf("rank %d: every mismatch was reported\n", check::rank);
  return check::failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return check::main(argc, argv, true, [](const std::string& only) { return run_rank(only); });
}

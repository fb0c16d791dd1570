// Requests (collective/request.hpp, docs/collectives.md "Requests") as a program uses them, every
// result checked against the rank's own arithmetic:
//   - eight all_reduces in flight, waited in reverse order;
//   - a symmetric exchange: every rank starts its sends to both neighbours (and, with 4 ranks or
//     more, to the rank across the ring: the side channel) before its receives, 1 MiB each (far
//     more than the credits: the sends could not complete without the peers' receives);
//   - a blocking call made while requests are outstanding;
//   - every other collective started at once (all_to_all, reduce, gather, scatter, broadcast,
//     all_gather, reduce_scatter, barrier), then test() polled until each completes;
//   - a request destroyed before it completed (its destructor waits: the result is there);
//   - wait(limit) that gives up while the peer is late, then wait() that completes;
//   - last, on a new communicator, a mismatched call among three requests: every request of
//     every rank fails with call_mismatch, and the communicator is broken.
//
//   request_check --local N [--profile P] [--mesh] [--quirk Q]
// Exit 0 when everything matched; each problem is a line with FAIL.
#include <tbverbs/collective.hpp>

#include "check_main.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

using tbverbs::Communicator;
using tbverbs::ErrorKind;
using tbverbs::ReduceOp;
using tbverbs::Request;
using tbverbs::Result;

using check::expect;
using check::failed;
using check::ok;

// Started, or a FAIL line and an empty optional.
std::optional<Request> started(Result<Request> r, const std::string& what) {
  if (!r) {
    failed(what + " was not started: " + r.error().message());
    return std::nullopt;
  }
  return std::move(*r);
}

// Rank r's element i of vector v.
std::int64_t value(int r, std::size_t i, int v) { return static_cast<std::int64_t>(r) * 1000 + static_cast<std::int64_t>(i % 97) + v * 7; }

void eight_in_flight(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::vector<std::vector<std::int64_t>> bufs(8);
  std::vector<std::optional<Request>> reqs;
  for (int v = 0; v < 8; ++v) {
    bufs[static_cast<std::size_t>(v)].resize(static_cast<std::size_t>(1) << (2 * v)); // 1 .. 16384 elements
    for (std::size_t i = 0; i < bufs[static_cast<std::size_t>(v)].size(); ++i) bufs[static_cast<std::size_t>(v)][i] = value(me, i, v);
    reqs.push_back(started(c.all_reduce_async(std::span<std::int64_t>(bufs[static_cast<std::size_t>(v)])), "all_reduce_async " + std::to_string(v)));
  }
  for (int v = 7; v >= 0; --v) {
    auto& r = reqs[static_cast<std::size_t>(v)];
    if (!r || !ok(r->wait(), "all_reduce request " + std::to_string(v))) continue;
    std::vector<std::int64_t> want(bufs[static_cast<std::size_t>(v)].size(), 0);
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < want.size(); ++i) want[i] += value(q, i, v);
    expect(bufs[static_cast<std::size_t>(v)], want, "all_reduce request " + std::to_string(v));
  }
}

void symmetric_exchange(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::vector<int> peers{(me + 1) % n};
  if (n > 2) peers.push_back((me + n - 1) % n);
  if (n >= 4) peers.push_back((me + n / 2) % n); // across the ring: no cable, the side channel
  constexpr std::size_t count = (std::size_t{1} << 20) / sizeof(std::int64_t);
  std::vector<std::vector<std::int64_t>> out(peers.size(), std::vector<std::int64_t>(count)), in(peers.size(), std::vector<std::int64_t>(count, -1));
  std::vector<std::optional<Request>> reqs;
  for (std::size_t k = 0; k < peers.size(); ++k) { // every send before any receive, on every rank
    for (std::size_t i = 0; i < count; ++i) out[k][i] = value(me, i, 100 + peers[k]);
    reqs.push_back(started(c.send_async(std::span<const std::int64_t>(out[k]), peers[k]), "send_async to " + std::to_string(peers[k])));
  }
  for (std::size_t k = 0; k < peers.size(); ++k)
    reqs.push_back(started(c.recv_async(std::span<std::int64_t>(in[k]), peers[k]), "recv_async from " + std::to_string(peers[k])));
  for (std::size_t k = 0; k < reqs.size(); ++k)
    if (reqs[k]) (void)ok(reqs[k]->wait(), "exchange request " + std::to_string(k));
  for (std::size_t k = 0; k < peers.size(); ++k) {
    std::vector<std::int64_t> want(count);
    for (std::size_t i = 0; i < count; ++i) want[i] = value(peers[k], i, 100 + me);
    expect(in[k], want, "recv_async from " + std::to_string(peers[k]));
  }
}

void blocking_among_requests(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::vector<std::int64_t> a(5000, me + 1), b(3, me * 2);
  auto ra = started(c.all_reduce_async(std::span<std::int64_t>(a)), "all_reduce_async before a blocking call");
  if (ok(c.all_reduce(std::span<std::int64_t>(b), ReduceOp::max), "blocking all_reduce while a request is outstanding"))
    expect(b, std::vector<std::int64_t>(3, 2 * (n - 1)), "blocking all_reduce among requests");
  if (ra && ok(ra->wait(), "request waited after the blocking call")) expect(a, std::vector<std::int64_t>(5000, n * (n + 1) / 2), "request before a blocking call");
}

void every_collective(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const auto N = static_cast<std::size_t>(n);
  constexpr std::size_t b = 1001;
  std::vector<std::int64_t> a2a_in(b * N), a2a_out(b * N, -1), red(b, me), red_out(b, -1), mine(b, me), gat(b * N, -1),
      sca_in(b * N), sca_out(b, -1), bc(b, me == 1 % n ? 42 : 0), ag(b * N, -1), rs_in(b * N, me), rs_out(b, -1);
  for (std::size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = me * 100 + static_cast<std::int64_t>(i / b);
  for (std::size_t i = 0; i < sca_in.size(); ++i) sca_in[i] = static_cast<std::int64_t>(i / b) * 3;
  const int last = n - 1;
  std::vector<std::pair<std::string, std::optional<Request>>> reqs;
  reqs.emplace_back("all_to_all", started(c.all_to_all_async(std::span<const std::int64_t>(a2a_in), std::span<std::int64_t>(a2a_out)), "all_to_all_async"));
  reqs.emplace_back("reduce", started(c.reduce_async(std::span<const std::int64_t>(red), std::span<std::int64_t>(red_out), ReduceOp::sum, last), "reduce_async"));
  reqs.emplace_back("gather", started(c.gather_async(std::span<const std::int64_t>(mine), std::span<std::int64_t>(gat), 0), "gather_async"));
  reqs.emplace_back("scatter", started(c.scatter_async(std::span<const std::int64_t>(sca_in), std::span<std::int64_t>(sca_out), last), "scatter_async"));
  reqs.emplace_back("broadcast", started(c.broadcast_async(std::span<std::int64_t>(bc), 1 % n), "broadcast_async"));
  reqs.emplace_back("all_gather", started(c.all_gather_async(std::span<const std::int64_t>(mine), std::span<std::int64_t>(ag)), "all_gather_async"));
  reqs.emplace_back("reduce_scatter", started(c.reduce_scatter_async(std::span<const std::int64_t>(rs_in), std::span<std::int64_t>(rs_out)), "reduce_scatter_async"));
  reqs.emplace_back("barrier", started(c.barrier_async(), "barrier_async"));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (auto& [name, r] : reqs) {
    if (!r) continue;
    for (;;) { // test() until complete: the progress thread runs them meanwhile
      auto t = r->test();
      if (!t) {
        failed(name + " request: " + t.error().message());
        break;
      }
      if (*t) break;
      if (std::chrono::steady_clock::now() > until) {
        failed(name + " request: test() still false after 60 s");
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::vector<std::int64_t> want(b * N);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<std::int64_t>(i / b) * 100 + me;
  expect(a2a_out, want, "all_to_all request");
  expect(red_out, std::vector<std::int64_t>(b, me == last ? n * (n - 1) / 2 : -1), "reduce request (the root's sum; the others untouched)");
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = me == 0 ? static_cast<std::int64_t>(i / b) : -1;
  expect(gat, want, "gather request (the root's; the others untouched)");
  expect(sca_out, std::vector<std::int64_t>(b, me * 3), "scatter request");
  expect(bc, std::vector<std::int64_t>(b, 42), "broadcast request");
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<std::int64_t>(i / b);
  expect(ag, want, "all_gather request");
  expect(rs_out, std::vector<std::int64_t>(b, n * (n - 1) / 2), "reduce_scatter request");
}

void destroyed_early(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::vector<std::int64_t> v(1 << 19, me);
  { auto r = started(c.all_reduce_async(std::span<std::int64_t>(v)), "all_reduce_async destroyed early"); } // waits
  expect(v, std::vector<std::int64_t>(v.size(), n * (n - 1) / 2), "a request destroyed before it completed");
}

void late_peer(Communicator& c) {
  const int me = c.rank();
  if (c.size() < 2 || me > 1) return;
  std::vector<std::int64_t> v(100, me == 1 ? 77 : 0);
  if (me == 1) { // late by 500 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    (void)ok(c.send(std::span<const std::int64_t>(v), 0), "the late send");
    return;
  }
  auto r = started(c.recv_async(std::span<std::int64_t>(v), 1), "recv_async from the late rank");
  if (!r) return;
  auto early = r->wait(std::chrono::milliseconds(100));
  if (early || !early.error().is(ErrorKind::timeout)) failed("wait(100 ms) on a recv whose sender is 500 ms late did not give up with timeout");
  if (ok(r->wait(), "wait() after wait(limit) gave up")) expect(v, std::vector<std::int64_t>(100, 77), "the late recv");
}

void mismatch_fails_every_request(Communicator& c) {
  const int me = c.rank();
  std::vector<float> a(me == 0 ? 1 : 2, 1.0f), b(4, 1.0f), d(4, 1.0f);
  std::vector<std::optional<Request>> reqs;
  reqs.push_back(started(c.all_reduce_async(std::span<float>(a)), "the mismatched all_reduce_async"));
  reqs.push_back(started(c.all_reduce_async(std::span<float>(b)), "the request after it"));
  reqs.push_back(started(c.barrier_async(), "the barrier after it"));
  for (std::size_t k = 0; k < reqs.size(); ++k) {
    if (!reqs[k]) continue;
    auto r = reqs[k]->wait();
    if (r) failed("request " + std::to_string(k) + " after a mismatched call succeeded");
    else if (!r.error().is(ErrorKind::call_mismatch)) failed("request " + std::to_string(k) + " failed as " + r.error().message() + ", not call_mismatch");
  }
  if (c.all_reduce(std::span<float>(d))) failed("a blocking call after the mismatch succeeded (the communicator should be broken)");
}

int run_rank() {
  auto opts = check::rank_options(std::chrono::milliseconds(20000));
  if (!opts) return 1;
  auto comm = check::connected(*opts);
  if (!comm) return 1;
  Communicator& c = *comm;
  eight_in_flight(c);
  symmetric_exchange(c);
  blocking_among_requests(c);
  every_collective(c);
  destroyed_early(c);
  late_peer(c);
  const int me = c.rank(), n = c.size();
  if (!ok(c.close(), "close")) return 1;
  // The mismatch on a communicator of its own, as its first call (a rank that finished an earlier
  // call and found the mismatch would break a peer still finishing that call: docs/collectives.md).
  auto again = Communicator::connect(*opts);
  if (!again && again.error().is(ErrorKind::call_mismatch)) {
    // connect() is no barrier: a rank that finished it made the mismatched call and told this one,
    // still verifying its links, which is how the mismatch reaches it.
    std::printf("rank %d: the mismatch reached this rank during connect: %s\n", check::rank, again.error().message().c_str());
  } else if (!again) {
    std::printf("rank %d: connect again: %s\n", check::rank, again.error().message().c_str());
    return 1;
  }
  if (again) mismatch_fails_every_request(*again);
  if (check::failures == 0) std::printf("rank %d of %d: every request verified\n", me, n);
  return check::failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return check::main(argc, argv, false, [](const std::string&) { return run_rank(); });
}

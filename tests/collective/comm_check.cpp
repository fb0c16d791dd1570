// The collectives layer (tbverbs/collective.hpp) checked as a program uses it: every rank builds
// its options with CommunicatorOptions::from_env(), connects, and runs every collective, dtype and
// op on counts that leave uneven chunks, in and out of place, comparing each result element by
// element with what it computes itself from every rank's known input.
//
//   comm_check --local N [--profile P] [--mesh] [--quirk NAME=VALUE]... [rank options]
//       starts N ranks of itself on an emulated fabric (the ring example's launcher);
//   comm_check [rank options]      one rank, from the launcher's environment.
//
// Rank options: --counts 1,7,4099   element counts of the full matrix (every dtype and op)
//               --large N           one more count for float32 and int64 (0: none)
//               --credits N         N back-to-back 4-byte all_reduces whose side-channel frames
//                                   must be zero (the data path is in band)
//               --expect-error      a rank is killed: every other rank must fail with an Error
//                                   (never hang), and say which rank
//               --bench BYTES       instead of the checks: time a float32 sum all_reduce of BYTES
//                                   per rank (--iters N, default 20, after 2 warm-ups; one line
//                                   "bench: BYTES B, T us, algbw A GB/s, busbw B GB/s" from rank 0)
//               --overlap R         with --bench: the overlap figure instead (an all_reduce_async
//                                   of BYTES under compute as long; fails above R x the longer)
// Launcher options: --link-gbps B --link-latency-us L (every cable direction paced: docs/emulator.md)
// Exit 0 when everything matched; 1 with a line per mismatch otherwise.
#include <tbverbs/collective.hpp>
#include <tbverbs/side_channel.hpp>
#include <tbverbs/sizes.hpp>

#include "../../examples/ring_all_sum/launcher.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using tbverbs::bfloat16;
using tbverbs::float16;
using tbverbs::ReduceOp;

struct RankOptions {
  std::vector<std::size_t> counts{1, 7, 4099};
  std::size_t large = 0;
  int credits = 0;
  bool expect_error = false;
  std::size_t bench_bytes = 0;
  int iters = 20;
  double overlap_limit = 0; // --overlap R: the overlap figure instead of the bench, at most R
};

int g_failures = 0;
int g_rank = -1;

void failed(const std::string& what) {
  if (++g_failures <= 20) std::printf("rank %d: FAIL %s\n", g_rank, what.c_str());
}

template <class T> T from_double(double v) {
  if constexpr (std::is_same_v<T, float16>) return float16::from_float(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bfloat16>) return bfloat16::from_float(static_cast<float>(v));
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<long long>(v)); // wraps (int8 products)
  else return static_cast<T>(v);
}
template <class T> double to_double(T v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) return v.to_float();
  else return static_cast<double>(v);
}
template <class T> std::string type_name() { return std::string(tbverbs::dtype_name(tbverbs::dtype_of_v<T>)); }
// Rank r's element i for `op`: small integers, so every result is exact in every dtype (sums of
// at most 8 ranks stay below 32, products below 2^8, both exact in bfloat16's 8-bit mantissa;
// int8 products wrap, as the layer's do). Min and max see -4..4, or 0..8 for unsigned types.
template <class T> double input(ReduceOp op, int r, std::size_t i) {
  const auto k = static_cast<long long>(i % 1009);
  switch (op) {
  case ReduceOp::sum:
  case ReduceOp::avg: return static_cast<double>((r * 7 + k * 3) % 4);
  case ReduceOp::prod: return 1.0 + static_cast<double>((r + k) % 2);
  case ReduceOp::min:
  case ReduceOp::max: return static_cast<double>((r * 5 + k * 11) % 9) - (std::is_unsigned_v<T> ? 0.0 : 4.0);
  }
  return 0;
}
double combine(ReduceOp op, double a, double b) {
  switch (op) {
  case ReduceOp::sum:
  case ReduceOp::avg: return a + b;
  case ReduceOp::prod: return a * b;
  case ReduceOp::min: return a < b ? a : b;
  case ReduceOp::max: return a > b ? a : b;
  }
  return 0;
}
// avg: the exact sum (an integer below 32) divided by n in double; rounded once to T it is what
// the layer's one division in T gives (a quotient of small integers is never a rounding tie).
template <class T> double reduced(ReduceOp op, int n, std::size_t i) {
  double v = input<T>(op, 0, i);
  for (int r = 1; r < n; ++r) v = combine(op, v, input<T>(op, r, i));
  return op == ReduceOp::avg ? v / n : v;
}

template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      failed(what + ": element " + std::to_string(i) + " is " + std::to_string(to_double(got[i])) + ", expected " +
             std::to_string(to_double(want[i])));
      return;
    }
}

// A buffer that tells the communicator when it goes (forget_memory), as docs/collectives.md asks of
// every buffer a collective used under Memory::registered: freed memory is never mistaken for it.
template <class T> struct Buf : std::vector<T> {
  tbverbs::Communicator* comm;
  Buf(tbverbs::Communicator& c, std::size_t n, T v = T{}) : std::vector<T>(n, v), comm(&c) {}
  Buf(const Buf&) = default;
  Buf& operator=(const Buf&) = default;
  ~Buf() { comm->forget_memory(this->data(), this->size() * sizeof(T)); }
};

bool ok(const tbverbs::Result<void>& r, const std::string& what) {
  if (!r) failed(what + ": " + r.error().message());
  return static_cast<bool>(r);
}

// reduce, gather and scatter to and from the first and the last rank, out of place and in place;
// a rank that keeps no result passes a buffer that must come back untouched.
template <class T> void check_rooted(tbverbs::Communicator& c, std::size_t count, const std::string& tag) {
  const int n = c.size(), me = c.rank();
  const std::size_t all = count * static_cast<std::size_t>(n);
  const T sentinel = from_double<T>(99);
  for (int root : {0, n - 1}) {
    const std::string at = " to root " + std::to_string(root) + " " + tag;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      if (op == ReduceOp::avg && std::is_integral_v<T>) continue; // refused as all_reduce's is
      Buf<T> in(c, count), out(c, count, sentinel), want(c, count, sentinel);
      for (std::size_t i = 0; i < count; ++i) in[i] = from_double<T>(input<T>(op, me, i));
      if (me == root)
        for (std::size_t i = 0; i < count; ++i) want[i] = from_double<T>(reduced<T>(op, n, i));
      const std::string what = "reduce " + std::string(tbverbs::reduce_op_name(op)) + at;
      if (ok(c.reduce(std::span<const T>(in), std::span<T>(out), op, root), what)) expect_equal(out, want, what);
      if (me == root && ok(c.reduce(std::span<const T>(in), std::span<T>(in), op, root), "in place " + what)) expect_equal(in, want, "in place " + what);
      if (me != root && ok(c.reduce(std::span<const T>(in), std::span<T>(), op, root), "empty out " + what)) {}
    }
    Buf<T> mine(c, count), got(c, all, sentinel), want(c, all, sentinel);
    for (std::size_t i = 0; i < count; ++i) mine[i] = from_double<T>(input<T>(ReduceOp::max, me, i));
    for (std::size_t i = 0; me == root && i < all; ++i) want[i] = from_double<T>(input<T>(ReduceOp::max, static_cast<int>(i / count), i % count));
    if (ok(c.gather(std::span<const T>(mine), std::span<T>(got), root), "gather" + at)) expect_equal(got, want, "gather" + at);
    // In place at the root (the others gather as before, with no out).
    Buf<T> inplace(c, me == root ? all : 0, sentinel);
    if (me == root) std::memcpy(inplace.data() + static_cast<std::size_t>(me) * count, mine.data(), count * sizeof(T));
    const std::span<const T> own = me == root ? std::span<const T>(inplace.data() + static_cast<std::size_t>(me) * count, count) : std::span<const T>(mine);
    if (ok(c.gather(own, std::span<T>(inplace), root), "in place gather" + at)) expect_equal(inplace, me == root ? want : inplace, "in place gather" + at);
    // scatter: the root's block q is rank q's `mine` of the gather above.
    Buf<T> blocks(c, me == root ? all : 0), part(c, count, sentinel);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = from_double<T>(input<T>(ReduceOp::max, static_cast<int>(i / count), i % count));
    if (ok(c.scatter(std::span<const T>(blocks), std::span<T>(part), root), "scatter" + at)) expect_equal(part, mine, "scatter" + at);
    // In place at the root (its block of `blocks` is its out); the others scatter as before.
    const std::span<T> mine_out = me == root ? std::span<T>(blocks.data() + static_cast<std::size_t>(me) * count, count) : std::span<T>(part);
    if (ok(c.scatter(std::span<const T>(blocks), mine_out, root), "in place scatter" + at))
      expect_equal(std::vector<T>(mine_out.begin(), mine_out.end()), std::vector<T>(mine), "in place scatter" + at);
  }
}

// all_to_all: rank s's block d is value(s, d, i); block q of the result is rank q's block `me`.
template <class T> void check_all_to_all(tbverbs::Communicator& c, std::size_t count, const std::string& tag) {
  const int n = c.size(), me = c.rank();
  auto value = [](int s, int d, std::size_t i) { return static_cast<double>((static_cast<std::size_t>(s) * 3 + static_cast<std::size_t>(d) * 5 + i) % 7); };
  const std::size_t all = count * static_cast<std::size_t>(n);
  Buf<T> in(c, all), out(c, all, from_double<T>(99)), want(c, all);
  for (std::size_t i = 0; i < all; ++i) {
    in[i] = from_double<T>(value(me, static_cast<int>(i / count), i % count));
    want[i] = from_double<T>(value(static_cast<int>(i / count), me, i % count));
  }
  if (ok(c.all_to_all(std::span<const T>(in), std::span<T>(out)), "all_to_all " + tag)) expect_equal(out, want, "all_to_all " + tag);
  if (n > 1) { // not equal blocks, and in place: refused before anything is sent
    auto r = c.all_to_all(std::span<const T>(in.data(), all - 1), std::span<T>(out.data(), all - 1));
    if (r || !r.error().is(tbverbs::ErrorKind::invalid_argument)) failed("all_to_all of unequal blocks " + tag + " was not refused");
    auto p = c.all_to_all(std::span<const T>(in), std::span<T>(in));
    if (p || !p.error().is(tbverbs::ErrorKind::invalid_argument)) failed("all_to_all in place " + tag + " was not refused");
  }
}

template <class T> void check_type(tbverbs::Communicator& c, std::size_t count) {
  const int n = c.size(), me = c.rank();
  const std::string tag = std::string(type_name<T>()) + " x " + std::to_string(count);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    const std::string where = tag + " " + std::string(tbverbs::reduce_op_name(op));
    if (op == ReduceOp::avg && std::is_integral_v<T>) { // refused before anything is sent: breaks nothing
      Buf<T> v(c, count, T{1});
      auto r = c.all_reduce(std::span<T>(v), op);
      if (r || !r.error().is(tbverbs::ErrorKind::invalid_argument) || r.error().message().find("avg") == std::string::npos)
        failed("all_reduce " + where + ": not refused as invalid_argument naming avg" +
               (r ? std::string() : ": " + r.error().message()));
      Buf<T> rs(c, count * static_cast<std::size_t>(n), T{1}), rs_out(c, count);
      if (c.reduce_scatter(std::span<T>(rs), std::span<T>(rs_out), op)) failed("reduce_scatter " + where + ": not refused");
      continue;
    }
    Buf<T> in(c, count), want(c, count);
    for (std::size_t i = 0; i < count; ++i) {
      in[i] = from_double<T>(input<T>(op, me, i));
      want[i] = from_double<T>(reduced<T>(op, n, i));
    }
    // all_reduce, out of place (the input must stay as it was) and in place.
    Buf<T> out(c, count, from_double<T>(99));
    const Buf<T> kept = in;
    if (ok(c.all_reduce(std::span<const T>(in), std::span<T>(out), op), "all_reduce " + where)) {
      expect_equal(out, want, "all_reduce " + where);
      expect_equal(in, kept, "all_reduce " + where + " left its input");
    }
    Buf<T> buf = in;
    if (ok(c.all_reduce(std::span<T>(buf), op), "all_reduce in place " + where))
      expect_equal(buf, want, "all_reduce in place " + where);

    // reduce_scatter: `count` elements per rank out of count * n.
    Buf<T> rs_in(c, count * static_cast<std::size_t>(n)), rs_out(c, count), rs_want(c, count);
    for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = from_double<T>(input<T>(op, me, i));
    for (std::size_t i = 0; i < count; ++i)
      rs_want[i] = from_double<T>(reduced<T>(op, n, static_cast<std::size_t>(me) * count + i));
    if (ok(c.reduce_scatter(std::span<T>(rs_in), std::span<T>(rs_out), op), "reduce_scatter " + where))
      expect_equal(rs_out, rs_want, "reduce_scatter " + where);
  }
  // all_gather, out of place and in place (the input is this rank's block of the output).
  Buf<T> mine(c, count), all(c, count * static_cast<std::size_t>(n)), all_want(c, count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < count; ++i) mine[i] = from_double<T>(input<T>(ReduceOp::max, me, i));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i)
      all_want[static_cast<std::size_t>(r) * count + i] = from_double<T>(input<T>(ReduceOp::max, r, i));
  if (ok(c.all_gather(std::span<T>(mine), std::span<T>(all)), "all_gather " + tag)) expect_equal(all, all_want, "all_gather " + tag);
  Buf<T> inplace(c, all.size(), from_double<T>(0));
  std::memcpy(inplace.data() + static_cast<std::size_t>(me) * count, mine.data(), count * sizeof(T));
  if (ok(c.all_gather(std::span<const T>(inplace.data() + static_cast<std::size_t>(me) * count, count), std::span<T>(inplace)),
         "all_gather in place " + tag))
    expect_equal(inplace, all_want, "all_gather in place " + tag);

  // broadcast from the first and the last rank.
  for (int root : {0, n - 1}) {
    Buf<T> b(c, count), b_want(c, count);
    for (std::size_t i = 0; i < count; ++i) {
      b[i] = from_double<T>(input<T>(ReduceOp::sum, me, i));
      b_want[i] = from_double<T>(input<T>(ReduceOp::sum, root, i));
    }
    if (ok(c.broadcast(std::span<T>(b), root), "broadcast from " + std::to_string(root) + " " + tag))
      expect_equal(b, b_want, "broadcast from " + std::to_string(root) + " " + tag);
  }

  check_rooted<T>(c, count, tag);
  check_all_to_all<T>(c, count, tag);

  // send/recv around the ring of ranks: even ranks send first, odd ones receive first.
  const int to = (me + 1) % n, from = (me + n - 1) % n;
  Buf<T> s(c, count), r(c, count), r_want(c, count);
  for (std::size_t i = 0; i < count; ++i) {
    s[i] = from_double<T>(input<T>(ReduceOp::min, me, i));
    r_want[i] = from_double<T>(input<T>(ReduceOp::min, from, i));
  }
  auto send = [&] { return ok(c.send(std::span<const T>(s), to), "send to " + std::to_string(to) + " " + tag); };
  auto recv = [&] {
    if (ok(c.recv(std::span<T>(r), from), "recv from " + std::to_string(from) + " " + tag))
      expect_equal(r, r_want, "recv from " + std::to_string(from) + " " + tag);
  };
  if (n == 1) return;
  if (me % 2 == 0) {
    send();
    recv();
  } else {
    recv();
    send();
  }
  // With an odd count of ranks the last (even) rank sends to rank 0, which was sending too:
  // that works only because a send completes when its bytes are received, not when recv is called.
}

// The overlap figure (docs/collectives.md, "Requests"): T_comm, a blocking float32 sum all_reduce
// of `bytes`; T_compute, a fixed amount of arithmetic calibrated alone to take about as long; T_both,
// the all_reduce started with all_reduce_async, the same arithmetic, then wait(). Each the slowest
// rank's mean over `iters`. Returns T_both / max(T_comm, T_compute); 1.0 is perfect overlap, 2.0 none.
double overlap_figure(tbverbs::Communicator& c, std::size_t bytes, int iters) {
  using clock = std::chrono::steady_clock;
  std::vector<float> buf(std::max<std::size_t>(1, bytes / sizeof(float)), 1.0f), work(1 << 18, 1.0f);
  auto pass = [&] { // one pass of arithmetic over 1 MiB (in cache): the program's compute
    for (float& x : work) x = x * 0.999f + 0.001f;
  };
  auto mean_ms = [&](auto&& body) {
    const auto t0 = clock::now();
    for (int i = 0; i < iters; ++i) body();
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count() / iters;
  };
  (void)ok(c.all_reduce(std::span<float>(buf)), "warm-up all_reduce");
  const double comm = mean_ms([&] { (void)ok(c.all_reduce(std::span<float>(buf)), "all_reduce"); });
  const double one_pass = mean_ms([&] { for (int k = 0; k < 20; ++k) pass(); }) / 20;
  const int passes = std::max(1, static_cast<int>(comm / std::max(one_pass, 1e-6)));
  const double compute = mean_ms([&] { for (int k = 0; k < passes; ++k) pass(); });
  const double both = mean_ms([&] {
    auto r = c.all_reduce_async(std::span<float>(buf));
    for (int k = 0; k < passes; ++k) pass();
    if (r) (void)ok(r->wait(), "all_reduce request");
    else failed("all_reduce_async: " + r.error().message());
  });
  std::vector<double> t{comm, compute, both};
  (void)ok(c.all_reduce(std::span<double>(t), ReduceOp::max), "all_reduce of the times");
  const double figure = t[2] / std::max(t[0], t[1]);
  if (c.rank() == 0)
    std::printf("overlap: %zu B all_reduce %.1f ms, compute %.1f ms (%d passes, %.3f ms each; %.1f%% of the sum: %g), both %.1f ms: %.2f x the longer\n",
                bytes, t[0], t[1], passes, one_pass, 100.0 * work[0] / (work[0] + 1.0f), static_cast<double>(work[0]), t[2], figure);
  return figure;
}

int run_rank(const RankOptions& ro) {
  auto opts = tbverbs::CommunicatorOptions::from_env();
  if (!opts) {
    std::printf("options: %s\n", opts.error().message().c_str());
    return 1;
  }
  g_rank = opts->rank;
  auto comm = tbverbs::Communicator::connect(*opts);
  if (!comm) {
    std::printf("rank %d: connect: %s\n", opts->rank, comm.error().message().c_str());
    return 1;
  }
  tbverbs::Communicator& c = *comm;

  if (ro.bench_bytes > 0 && ro.overlap_limit > 0) {
    const double figure = overlap_figure(c, ro.bench_bytes, ro.iters);
    if (figure > ro.overlap_limit) failed("overlap: " + std::to_string(figure) + " x the longer, above " + std::to_string(ro.overlap_limit));
    if (!ok(c.barrier(), "final barrier")) return 1;
    return g_failures == 0 ? 0 : 1;
  }
  if (ro.bench_bytes > 0) {
    // The slowest rank's mean time per call: a barrier before the timed loop, then each rank's
    // mean, reduced with max (nccl-tests' convention).
    std::vector<float> buf(std::max<std::size_t>(1, ro.bench_bytes / sizeof(float)), 1.0f);
    for (int i = 0; i < 2; ++i)
      if (!ok(c.all_reduce(std::span<float>(buf)), "warm-up all_reduce")) return 1;
    if (!ok(c.barrier(), "barrier")) return 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < ro.iters; ++i)
      if (!ok(c.all_reduce(std::span<float>(buf)), "all_reduce")) return 1;
    std::vector<double> us{std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / ro.iters};
    if (!ok(c.all_reduce(std::span<double>(us), ReduceOp::max), "all_reduce of the times")) return 1;
    const double bytes = static_cast<double>(buf.size() * sizeof(float));
    const double algbw = bytes / us[0] / 1e3, n = c.size();
    if (c.rank() == 0)
      std::printf("bench: %.0f B, %.1f us, algbw %.3f GB/s, busbw %.3f GB/s (%s)\n", bytes, us[0], algbw,
                  algbw * 2 * (n - 1) / n, std::string(tbverbs::collective::algorithm_name(c.algorithm_for(tbverbs::collective::Collective::all_reduce, buf.size() * sizeof(float)))).c_str());
    if (!ok(c.barrier(), "final barrier")) return 1;
    std::printf("rank %d of %d: all collectives verified (bench only)\n", c.rank(), c.size());
    return g_failures == 0 ? 0 : 1;
  }

  if (ro.expect_error) {
    // Collectives until one fails: a rank of the job is killed by the launcher.
    std::vector<float> v(1 << 16, 1.0f);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000000; ++i) {
      if (i == 20) { // the event a failure test fires its fault on (kill_test.sh: --kill-after-line)
        std::printf("rank %d: running: 20 all_reduces done\n", c.rank());
        std::fflush(stdout);
        start = std::chrono::steady_clock::now();
      }
      auto r = c.all_reduce(std::span<float>(v));
      if (!r) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("rank %d: all_reduce %d failed after %.1f s%s as expected: %s\n", c.rank(), i, s,
                    i >= 20 ? " (from all_reduce 20)" : "", r.error().message().c_str());
        auto again = c.barrier();
        if (again) {
          failed("a broken communicator ran a barrier");
          return 1;
        }
        return 0;
      }
    }
    failed("no collective failed although a rank was killed");
    return 1;
  }

  // Wrong arguments are refused before anything is sent, and break nothing.
  {
    std::vector<float> a(10), b(11);
    auto r = c.all_reduce(std::span<float>(a), std::span<float>(b));
    if (r || r.error().kind != tbverbs::ErrorKind::invalid_argument) failed("all_reduce of 10 into 11 elements was not refused");
    auto bc = c.broadcast(std::span<float>(a), c.size());
    if (bc || bc.error().kind != tbverbs::ErrorKind::invalid_argument) failed("broadcast from a root outside the job was not refused");
  }

  for (std::size_t count : ro.counts) {
    check_type<float>(c, count);
    check_type<double>(c, count);
    check_type<std::int32_t>(c, count);
    check_type<std::int64_t>(c, count);
    check_type<float16>(c, count);
    check_type<bfloat16>(c, count);
    check_type<std::int8_t>(c, count);
    check_type<std::uint8_t>(c, count);
    check_type<std::uint32_t>(c, count);
    check_type<std::uint64_t>(c, count);
  }
  if (ro.large > 0) {
    check_type<float>(c, ro.large);
    check_type<std::int64_t>(c, ro.large);
  }
  if (!ok(c.barrier(), "barrier")) return 1;

  if (ro.credits > 0 && c.size() > 1) {
    // The data path is in band: back-to-back collectives send no side-channel frame.
    Buf<std::int32_t> word(c, 1);
    // The first call on a new buffer may register it (Memory::registered); the steady state after it
    // registers nothing.
    if (!ok(c.all_reduce(std::span<std::int32_t>(word)), "first all_reduce of the word")) return 1;
    const std::uint64_t before = c.side_channel().frames_sent();
    const std::uint64_t reg_before = c.registrations();
    for (int i = 0; i < ro.credits; ++i) {
      word[0] = c.rank() + i;
      if (!ok(c.all_reduce(std::span<std::int32_t>(word)), "all_reduce " + std::to_string(i) + " of " + std::to_string(ro.credits))) break;
      const std::int64_t want = static_cast<std::int64_t>(c.size()) * (c.size() - 1) / 2 + static_cast<std::int64_t>(c.size()) * i;
      if (word[0] != want) {
        failed("back-to-back all_reduce " + std::to_string(i) + ": " + std::to_string(word[0]) + ", expected " + std::to_string(want));
        break;
      }
    }
    const std::uint64_t frames = c.side_channel().frames_sent() - before;
    std::printf("rank %d: %d back-to-back all_reduces sent %llu side-channel frames and made %llu registrations\n", c.rank(),
                ro.credits, static_cast<unsigned long long>(frames),
                static_cast<unsigned long long>(c.registrations() - reg_before));
    if (frames != 0) failed(std::to_string(frames) + " side-channel frames during " + std::to_string(ro.credits) + " collectives");
    if (c.registrations() != reg_before) failed("registrations in the steady state");
  }
  if (!ok(c.barrier(), "final barrier")) return 1;
  // Leaving: no rank's exit may fail another rank's last collective (close() waits for all).
  const int me = c.rank(), n = c.size();
  const std::string rule = c.algorithm_rule();
  if (!ok(c.close(), "close")) return 1;
  if (auto after = c.barrier(); after || after.error().kind != tbverbs::ErrorKind::invalid_argument) failed("a closed communicator ran a barrier");
  if (g_failures == 0) std::printf("rank %d of %d: all collectives verified (%s)\n", me, n, rule.c_str());
  return g_failures == 0 ? 0 : 1;
}

std::vector<std::size_t> parse_counts(const std::string& s) {
  std::vector<std::size_t> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto v = tbverbs::parse_decimal(part, std::uint64_t{1} << 30);
    if (!v) {
      std::fprintf(stderr, "--counts: \"%s\" is not a count\n", part.c_str());
      std::exit(2);
    }
    out.push_back(static_cast<std::size_t>(*v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  RankOptions ro;
  ring::LocalOptions lo;
  lo.ranks = 0;
  lo.emu_library = TBVERBS_EMU_LIBRARY_PATH;
  lo.timeout = std::chrono::milliseconds(240000);
  std::vector<std::string> rank_args;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", argv[i]);
      std::exit(2);
    }
    return argv[++i];
  };
  auto number = [&](const std::string& flag, const std::string& v, std::uint64_t max) {
    auto n = tbverbs::parse_decimal(v, max);
    if (!n) {
      std::fprintf(stderr, "%s: \"%s\" is not a number up to %llu\n", flag.c_str(), v.c_str(), static_cast<unsigned long long>(max));
      std::exit(2);
    }
    return *n;
  };
  auto real = [&](const std::string& flag, const std::string& v, double max) {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end == nullptr || *end != '\0' || !(d >= 0 && d <= max)) {
      std::fprintf(stderr, "%s: \"%s\" is not a number from 0 to %g\n", flag.c_str(), v.c_str(), max);
      std::exit(2);
    }
    return d;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--local") lo.ranks = static_cast<int>(number(a, need(i), 64));
    else if (a == "--profile") lo.profile = need(i);
    else if (a == "--mesh") lo.mesh = true;
    else if (a == "--quirk") lo.quirks.push_back(need(i));
    else if (a == "--kill-rank") lo.kill_rank = static_cast<int>(number(a, need(i), 63));
    else if (a == "--link-gbps") lo.link.gbytes_per_s = real(a, need(i), 10000);
    else if (a == "--link-latency-us") lo.link.latency_us = real(a, need(i), 10000000);
    else if (a == "--kill-after-ms") lo.kill_after = std::chrono::milliseconds(number(a, need(i), 600000));
    else if (a == "--kill-after-line") lo.kill_after_line = need(i);
    else {
      rank_args.push_back(a);
      if (a == "--counts") ro.counts = parse_counts(rank_args.emplace_back(need(i)));
      else if (a == "--large") ro.large = static_cast<std::size_t>(number(a, rank_args.emplace_back(need(i)), 1u << 28));
      else if (a == "--credits") ro.credits = static_cast<int>(number(a, rank_args.emplace_back(need(i)), 1000000));
      else if (a == "--expect-error") ro.expect_error = true;
      else if (a == "--bench") {
        auto b = tbverbs::parse_size(rank_args.emplace_back(need(i)), std::uint64_t{1} << 32);
        if (!b) {
          std::fprintf(stderr, "--bench: a size (4K, 64M)\n");
          return 2;
        }
        ro.bench_bytes = static_cast<std::size_t>(*b);
      } else if (a == "--overlap") ro.overlap_limit = real(a, rank_args.emplace_back(need(i)), 100);
      else if (a == "--iters") ro.iters = static_cast<int>(number(a, rank_args.emplace_back(need(i)), 1000000));
      else {
        std::fprintf(stderr, "unknown option %s\n", a.c_str());
        return 2;
      }
    }
  }
  if (lo.ranks > 0) {
    lo.args = rank_args;
    return ring::run_local(lo);
  }
  return run_rank(ro);
}

// Split communicators (Communicator::split, docs/collectives.md "Split communicators") as a
// program uses them, every result checked against the rank's own arithmetic on the members this
// program expects (computed here from the colors and keys, not asked of the library):
//   - three rounds of pairs (color rank/2), halves (keys reversed: the last rank first) and the
//     halves split again (every other member: on 8 ranks, members no cable joins), plus a
//     communicator without rank 0 (rank 0 passes color -1 and gets an empty one), all alive at once;
//   - on each: all_reduce (sum, in place max, avg), all_gather, reduce_scatter, broadcast, reduce,
//     gather, scatter, all_to_all, barrier, a symmetric send/recv exchange, odd counts;
//   - requests on three communicators of the family in flight at once, waited in reverse;
//   - connect()'s communicator closed first: the split ones still run; every one closed;
//   - last, on a new family, a mismatched call (all_gather against all_reduce of the same bytes)
//     on a split communicator: every rank fails with call_mismatch, the parent is broken too.
//
//   split_check --local N [--profile P] [--mesh] [--quirk Q]
// Exit 0 when everything matched; each problem is a line with FAIL.
#include <tbverbs/collective.hpp>

#include "check_main.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
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

// The members a split gives, in their order there: the family ranks whose color is `color`, by
// key, then rank.
std::vector<int> members(int n, const std::function<int(int)>& color_of, const std::function<int(int)>& key_of, int color) {
  std::vector<std::pair<int, int>> order;
  for (int q = 0; q < n; ++q)
    if (color_of(q) == color) order.emplace_back(key_of(q), q);
  std::sort(order.begin(), order.end());
  std::vector<int> m;
  for (const auto& [k, q] : order) m.push_back(q);
  return m;
}

// Element i of call v on the member whose family rank is f.
std::int64_t value(int f, std::size_t i, int v) { return static_cast<std::int64_t>(f) * 1000 + static_cast<std::int64_t>(i % 97) + v * 7; }

// One split communicator and the family ranks of its members, in its rank order.
struct Split {
  Communicator comm;
  std::vector<int> family;
  std::string name;
};

// Every collective on `s`, checked.
void exercise(Split& s, int v) {
  Communicator& c = s.comm;
  const std::string& name = s.name;
  const std::size_t m = s.family.size();
  if (static_cast<std::size_t>(c.size()) != m) {
    failed(name + ": size() is " + std::to_string(c.size()) + ", expected " + std::to_string(m));
    return;
  }
  const std::size_t me = static_cast<std::size_t>(c.rank());
  auto mine = [&](std::size_t count, int call) {
    std::vector<std::int64_t> b(count);
    for (std::size_t i = 0; i < count; ++i) b[i] = value(s.family[me], i, v + call);
    return b;
  };
  auto of = [&](std::size_t q, std::size_t i, int call) { return value(s.family[q], i, v + call); };
  const std::size_t count = 1001;
  { // all_reduce sum, out of place
    auto in = mine(count, 0);
    std::vector<std::int64_t> out(count, -1), want(count, 0);
    for (std::size_t q = 0; q < m; ++q)
      for (std::size_t i = 0; i < count; ++i) want[i] += of(q, i, 0);
    if (ok(c.all_reduce(std::span<const std::int64_t>(in), std::span<std::int64_t>(out)), name + " all_reduce")) expect(out, want, name + " all_reduce");
  }
  { // all_reduce max, in place
    auto buf = mine(count, 1);
    std::vector<std::int64_t> want(count, INT64_MIN);
    for (std::size_t q = 0; q < m; ++q)
      for (std::size_t i = 0; i < count; ++i) want[i] = std::max(want[i], of(q, i, 1));
    if (ok(c.all_reduce(std::span<std::int64_t>(buf), ReduceOp::max), name + " all_reduce max")) expect(buf, want, name + " all_reduce max");
  }
  { // all_reduce avg (small integers: the sum is exact in float)
    std::vector<float> buf(count), want(count, 0.f);
    for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(of(me, i, 2) % 4096);
    for (std::size_t q = 0; q < m; ++q)
      for (std::size_t i = 0; i < count; ++i) want[i] += static_cast<float>(of(q, i, 2) % 4096);
    for (auto& w : want) w /= static_cast<float>(m);
    if (ok(c.all_reduce(std::span<float>(buf), ReduceOp::avg), name + " all_reduce avg")) expect(buf, want, name + " all_reduce avg");
  }
  const std::size_t b = 3; // blocks
  { // all_gather
    auto in = mine(b, 3);
    std::vector<std::int64_t> out(b * m, -1), want;
    for (std::size_t q = 0; q < m; ++q)
      for (std::size_t i = 0; i < b; ++i) want.push_back(of(q, i, 3));
    if (ok(c.all_gather(std::span<const std::int64_t>(in), std::span<std::int64_t>(out)), name + " all_gather")) expect(out, want, name + " all_gather");
  }
  { // reduce_scatter
    auto in = mine(b * m, 4);
    std::vector<std::int64_t> out(b, -1), want(b, 0);
    for (std::size_t q = 0; q < m; ++q)
      for (std::size_t i = 0; i < b; ++i) want[i] += of(q, me * b + i, 4);
    if (ok(c.reduce_scatter(std::span<const std::int64_t>(in), std::span<std::int64_t>(out)), name + " reduce_scatter"))
      expect(out, want, name + " reduce_scatter");
  }
  const int last = static_cast<int>(m) - 1;
  { // broadcast from the last member
    auto buf = mine(count, 5);
    std::vector<std::int64_t> want(count);
    for (std::size_t i = 0; i < count; ++i) want[i] = of(static_cast<std::size_t>(last), i, 5);
    if (ok(c.broadcast(std::span<std::int64_t>(buf), last), name + " broadcast")) expect(buf, want, name + " broadcast");
  }
  { // reduce to member 0; the others pass no output
    auto in = mine(count, 6);
    std::vector<std::int64_t> out(me == 0 ? count : 0), want(me == 0 ? count : 0, 0);
    for (std::size_t q = 0; q < m && me == 0; ++q)
      for (std::size_t i = 0; i < count; ++i) want[i] += of(q, i, 6);
    if (ok(c.reduce(std::span<const std::int64_t>(in), std::span<std::int64_t>(out), ReduceOp::sum, 0), name + " reduce"))
      expect(out, want, name + " reduce");
  }
  { // gather to the last member
    auto in = mine(b, 7);
    const bool root = static_cast<int>(me) == last;
    std::vector<std::int64_t> out(root ? b * m : 0, -1), want;
    for (std::size_t q = 0; q < m && root; ++q)
      for (std::size_t i = 0; i < b; ++i) want.push_back(of(q, i, 7));
    if (ok(c.gather(std::span<const std::int64_t>(in), std::span<std::int64_t>(out), last), name + " gather")) expect(out, want, name + " gather");
  }
  { // scatter from member 0
    auto in = me == 0 ? mine(b * m, 8) : std::vector<std::int64_t>();
    std::vector<std::int64_t> out(b, -1), want(b);
    for (std::size_t i = 0; i < b; ++i) want[i] = of(0, me * b + i, 8);
    if (ok(c.scatter(std::span<const std::int64_t>(in), std::span<std::int64_t>(out), 0), name + " scatter")) expect(out, want, name + " scatter");
  }
  { // all_to_all
    auto in = mine(b * m, 9);
    std::vector<std::int64_t> out(b * m, -1), want(b * m);
    for (std::size_t q = 0; q < m; ++q)
      for (std::size_t i = 0; i < b; ++i) want[q * b + i] = of(q, me * b + i, 9);
    if (ok(c.all_to_all(std::span<const std::int64_t>(in), std::span<std::int64_t>(out)), name + " all_to_all")) expect(out, want, name + " all_to_all");
  }
  (void)ok(c.barrier(), name + " barrier");
  if (m < 2) return;
  { // symmetric exchange: a send to the next member and one to the previous, then the receives
    const std::size_t next = (me + 1) % m, prev = (me + m - 1) % m;
    auto to_next = mine(count, 10), to_prev = mine(count, 11);
    std::vector<std::int64_t> from_prev(count, -1), from_next(count, -1), want_prev(count), want_next(count);
    for (std::size_t i = 0; i < count; ++i) {
      want_prev[i] = of(prev, i, 10);
      want_next[i] = of(next, i, 11);
    }
    auto s1 = c.send_async(std::span<const std::int64_t>(to_next), static_cast<int>(next));
    auto s2 = c.send_async(std::span<const std::int64_t>(to_prev), static_cast<int>(prev));
    auto r1 = c.recv_async(std::span<std::int64_t>(from_prev), static_cast<int>(prev));
    auto r2 = c.recv_async(std::span<std::int64_t>(from_next), static_cast<int>(next));
    if (!s1 || !s2 || !r1 || !r2) {
      failed(name + " exchange: a request was not started");
      return;
    }
    const bool all = ok(s1->wait(), name + " send") & ok(s2->wait(), name + " send") & ok(r1->wait(), name + " recv") &
                     ok(r2->wait(), name + " recv");
    if (all) {
      expect(from_prev, want_prev, name + " recv from the previous member");
      expect(from_next, want_next, name + " recv from the next member");
    }
  }
}

// all_reduce_async on several communicators of the family at once, waited in reverse.
void in_flight_across(std::vector<Split*> splits, int v) {
  std::vector<std::vector<std::int64_t>> bufs;
  std::vector<std::optional<Request>> reqs;
  const std::size_t count = 4099;
  for (Split* s : splits) {
    const std::size_t me = static_cast<std::size_t>(s->comm.rank());
    bufs.emplace_back(count);
    for (std::size_t i = 0; i < count; ++i) bufs.back()[i] = value(s->family[me], i, v);
  }
  for (std::size_t k = 0; k < splits.size(); ++k) {
    auto r = splits[k]->comm.all_reduce_async(std::span<std::int64_t>(bufs[k]));
    if (!r) failed(splits[k]->name + " all_reduce_async: " + r.error().message());
    reqs.push_back(r ? std::optional<Request>(std::move(*r)) : std::nullopt);
  }
  for (std::size_t k = splits.size(); k-- > 0;) {
    if (!reqs[k] || !ok(reqs[k]->wait(), splits[k]->name + " request")) continue;
    std::vector<std::int64_t> want(count, 0);
    for (int f : splits[k]->family)
      for (std::size_t i = 0; i < count; ++i) want[i] += value(f, i, v);
    expect(bufs[k], want, splits[k]->name + " request");
  }
}

// `c.split(color(rank), key(rank))`, with the members this program expects.
std::optional<Split> make_split(Communicator& c, const std::vector<int>& family_of_c, const std::function<int(int)>& color,
                                const std::function<int(int)>& key, const std::string& name) {
  const int n = c.size(), me = c.rank();
  auto s = c.split(color(me), key(me));
  if (!s) {
    failed(name + ": split: " + s.error().message());
    return std::nullopt;
  }
  Split out{std::move(*s), {}, name};
  for (int q : members(n, color, key, color(me))) out.family.push_back(family_of_c[static_cast<std::size_t>(q)]);
  const int r = out.comm.rank();
  if (r < 0 || static_cast<std::size_t>(r) >= out.family.size() || out.family[static_cast<std::size_t>(r)] != family_of_c[static_cast<std::size_t>(me)])
    failed(name + ": rank() is " + std::to_string(r) + ", not this rank's place by key, then rank");
  return out;
}

// Ranks 0 and 1 each make a subgroup of both, but rank 0 makes one before: their subgroups are
// not the same one, and the first call on them fails with call_mismatch on both.
void subgroups_that_differ(Communicator& c) {
  const int me = c.rank();
  if (me > 1) return;
  const int both[] = {0, 1};
  if (me == 0) (void)c.subgroup(std::span<const int>(both));
  auto g = c.subgroup(std::span<const int>(both));
  if (!g) {
    failed("subgroup: " + g.error().message());
    return;
  }
  std::vector<std::int64_t> buf(16, me);
  auto r = g->all_reduce(std::span<std::int64_t>(buf));
  if (r) failed("subgroups that differ: the call returned ok");
  else if (!r.error().is(ErrorKind::call_mismatch)) failed("subgroups that differ: " + r.error().message() + " (expected call_mismatch)");
  else std::printf("rank %d: subgroup mismatch seen: %s\n", me, r.error().message().c_str());
  if (buf != std::vector<std::int64_t>(16, me)) failed("subgroups that differ: the buffer was written");
}

void mismatch_breaks_the_family(Communicator& c) {
  const int n = c.size(), me = c.rank();
  auto s = c.split(0, me);
  if (!s) {
    failed("mismatch: split: " + s.error().message());
    return;
  }
  std::vector<std::int64_t> in(4, me), out(4 * static_cast<std::size_t>(n), -7);
  Result<void> r = me == 0 ? s->all_gather(std::span<const std::int64_t>(in), std::span<std::int64_t>(out))
                           : s->all_reduce(std::span<const std::int64_t>(out), std::span<std::int64_t>(out)); // the same bytes
  if (r) failed("mismatch: a mismatched call returned ok");
  else if (!r.error().is(ErrorKind::call_mismatch)) failed("mismatch: " + r.error().message() + " (expected call_mismatch)");
  else std::printf("rank %d: mismatch seen: %s\n", me, r.error().message().c_str());
  if (me == 0 && std::any_of(out.begin(), out.end(), [](std::int64_t x) { return x != -7; })) failed("mismatch: rank 0's output was written");
  if (c.barrier()) failed("mismatch: the parent still ran a barrier after its split communicator broke");
}

int run_rank() {
  auto opts = check::rank_options(std::chrono::milliseconds(20000));
  if (!opts) return 1;
  auto comm = check::connected(*opts);
  if (!comm) return 1;
  Communicator& c = *comm;
  const int n = c.size(), me = c.rank();
  std::vector<int> everyone(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) everyone[static_cast<std::size_t>(q)] = q;
  std::vector<Split> alive; // every split communicator, all alive at once (the same list on every rank but rank 0's last)
  alive.reserve(16);
  for (int round = 0; round < 3; ++round) {
    const std::string r = " (round " + std::to_string(round) + ")";
    auto pairs = make_split(c, everyone, [](int q) { return q / 2; }, [](int q) { return q; }, "pairs" + r);
    auto halves = make_split(c, everyone, [n](int q) { return q < (n + 1) / 2 ? 0 : 1; }, [n](int q) { return n - q; }, "halves" + r);
    if (!pairs || !halves) return 1;
    alive.push_back(std::move(*pairs));
    alive.push_back(std::move(*halves));
    Split& h = alive.back();
    auto quarters = make_split(h.comm, h.family, [](int q) { return q % 2; }, [](int) { return 0; }, "halves split again" + r);
    if (!quarters) return 1;
    alive.push_back(std::move(*quarters));
  }
  { // subgroup(): pairs listed last rank first, made by their members only
    const int p = me - me % 2;
    std::vector<int> ranks = p + 1 < n ? std::vector<int>{p + 1, p} : std::vector<int>{p};
    auto g = c.subgroup(std::span<const int>(ranks));
    if (!g) failed("subgroup: " + g.error().message());
    else alive.push_back(Split{std::move(*g), ranks, "subgroup"});
    const int twice[] = {me, me};
    const int other[] = {(me + 1) % n};
    if (c.subgroup(std::span<const int>(twice)) || (n > 1 && c.subgroup(std::span<const int>(other))))
      failed("subgroup accepted a rank listed twice, or a list without this rank");
  }
  auto without0 = c.split(me == 0 ? -1 : 1, 0);
  if (!without0) failed("split without rank 0: " + without0.error().message());
  else if (me == 0 && (without0->size() != 0 || without0->rank() != -1 || without0->barrier()))
    failed("rank 0's color -1 split is not empty (size " + std::to_string(without0->size()) + ")");
  else if (me != 0) alive.push_back(Split{std::move(*without0), std::vector<int>(everyone.begin() + 1, everyone.end()), "without rank 0"});
  int v = 0;
  for (Split& s : alive) exercise(s, v += 20);
  { // the parent between them
    std::vector<std::int64_t> buf(257, me), want(257, static_cast<std::int64_t>(n) * (n - 1) / 2);
    if (ok(c.all_reduce(std::span<std::int64_t>(buf)), "parent all_reduce")) expect(buf, want, "parent all_reduce");
  }
  in_flight_across({&alive[0], &alive[1], &alive[2], &alive[3]}, 1000);
  if (!ok(c.close(), "close the parent")) return 1;
  exercise(alive[0], 2000); // the family's links stay while any of it is open
  for (Split& s : alive) (void)ok(s.comm.close(), "close " + s.name);
  auto again = Communicator::connect(*opts);
  if (!again && again.error().is(ErrorKind::call_mismatch))
    std::printf("rank %d: the mismatch reached this rank during connect: %s\n", me, again.error().message().c_str());
  else if (!again) failed("connect again: " + again.error().message());
  else mismatch_breaks_the_family(*again);
  if (again) (void)again->close();
  auto third = Communicator::connect(*opts);
  if (!third && third.error().is(ErrorKind::call_mismatch))
    std::printf("rank %d: the mismatch reached this rank during connect: %s\n", me, third.error().message().c_str());
  else if (!third) failed("connect a third time: " + third.error().message());
  else if (n > 1) subgroups_that_differ(*third);
  if (check::failures == 0) std::printf("rank %d of %d: every split communicator verified\n", me, n);
  return check::failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return check::main(argc, argv, false, [](const std::string&) { return run_rank(); });
}

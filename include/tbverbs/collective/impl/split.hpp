/// @file collective/impl/split.hpp
/// Communicator::split and the collectives of a split communicator (collective/communicator.hpp;
/// docs/collectives.md, "Split communicators"). A split communicator owns no link: its calls run as
/// sends and receives between its members on the family's links (connect()'s communicator's), each
/// carrying the split communicator's number in its call identity. A call is three steps:
///   1. agree: every member sends its call's identity to every other member and compares what it
///      receives; a difference fails the call (call_mismatch) on every member before any user
///      buffer is written;
///   2. move: the blocks go straight to the member that needs them (a reduction's blocks to the
///      member that combines them, in member order, so every member ends with the same bits);
///   3. finish: avg's division.
/// The transfers of one step run one after the other in order_pairwise's order. Included by
/// collective/impl/communicator.hpp at its end.
#pragma once

#include "../call.hpp"
#include "../communicator.hpp"
#include "requests.hpp"
#include "subgroup.hpp"

#include <cstring>
#include <utility>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// Sets the family's note of the split communicator's call running (its errors name it) for the
/// call's length.
class Communicator::Within {
public:
  /// Notes `what` in `s` until this goes.
  Within(State& s, std::string what) : s_(s) { s_.within = std::move(what); }
  ~Within() { s_.within.clear(); }
  Within(const Within&) = delete;
  Within& operator=(const Within&) = delete;

private:
  State& s_;
};

TBVERBS_COLLECTIVE_DEF Result<Communicator> Communicator::split(int color, int key) {
  if (!s_) return fail(Error::make(Step::collective, ErrorKind::invalid_argument, "split on an empty (moved-from, closed or color < 0) communicator"));
  const std::size_t n = static_cast<std::size_t>(size());
  const std::int32_t mine[2] = {color < 0 ? -1 : color, key};
  std::vector<std::int32_t> all(2 * n);
  if (auto r = all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all)); !r) return fail(r.error());
  collective::Subgroup& here = sub_ ? *sub_ : s_->root;
  const std::uint64_t seq = here.splits++;
  if (color < 0) return Communicator();
  std::vector<std::pair<std::int32_t, int>> order; // (key, rank here) of the ranks with this color
  for (std::size_t q = 0; q < n; ++q)
    if (all[2 * q] == color) order.emplace_back(all[2 * q + 1], static_cast<int>(q));
  std::sort(order.begin(), order.end());
  std::vector<int> ranks;
  int me = 0;
  for (const auto& [k, q] : order) {
    if (q == rank()) me = static_cast<int>(ranks.size());
    ranks.push_back(q);
  }
  const std::uint64_t words[] = {0, seq, static_cast<std::uint32_t>(color)}; // 0: a split
  return member(std::move(ranks), me, collective::child_tag(here.tag, words));
}

TBVERBS_COLLECTIVE_DEF Result<Communicator> Communicator::subgroup(std::span<const int> ranks) {
  auto invalid = [](const std::string& d) { return fail(Error::make(Step::collective, ErrorKind::invalid_argument, "subgroup: " + d)); };
  if (!s_) return invalid("an empty (moved-from, closed or color < 0) communicator");
  const int n = size();
  std::vector<int> list(ranks.begin(), ranks.end()), sorted = list;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return invalid("a rank is listed twice");
  if (!sorted.empty() && (sorted.front() < 0 || sorted.back() >= n))
    return invalid("the ranks are not all ranks of 0.." + std::to_string(n - 1));
  const auto mine = std::find(list.begin(), list.end(), rank());
  if (mine == list.end()) return invalid("this rank (" + std::to_string(rank()) + ") is not in the list");
  collective::Subgroup& here = sub_ ? *sub_ : s_->root;
  std::vector<std::uint64_t> words{1, here.subgroups[list]++}; // 1: a subgroup
  for (int q : list) words.push_back(static_cast<std::uint64_t>(q));
  const int me = static_cast<int>(mine - list.begin());
  return member(std::move(list), me, collective::child_tag(here.tag, words));
}

// A new member of this family: `ranks_here` (ranks of this communicator) in its rank order.
TBVERBS_COLLECTIVE_DEF Communicator Communicator::member(std::vector<int> ranks_here, int me_here, std::uint32_t tag) {
  auto g = std::make_shared<collective::Subgroup>();
  for (int q : ranks_here) g->members.push_back(sub_ ? sub_->members[static_cast<std::size_t>(q)] : q);
  g->me = me_here;
  g->tag = tag;
  Communicator c;
  c.s_ = s_;
  c.sub_ = std::move(g);
  s_->holders.fetch_add(1);
  return c;
}

// A split communicator's call (run(), this thread holding the family): send and recv are one
// transfer of the family's; the collectives agree, then move their blocks.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::run_split(collective::Collective kind, DType t, ReduceOp op,
                                                          std::span<const std::byte> in, std::span<std::byte> out, int arg) {
  using collective::Collective;
  collective::Subgroup& g = *sub_;
  Communicator family = view(*s_, nullptr);
  const Within within(*s_, "rank " + std::to_string(g.me) + " of " + collective::communicator_name(g.tag));
  if (kind == Collective::send || kind == Collective::recv)
    return family.run_held(kind, t, op, in, out, g.members[static_cast<std::size_t>(arg)], g.tag);
  collective::CallIdentity id = identify(kind, t, op, in.size(), out.size(), arg, collective::Algorithm::ring);
  id.collective_seq = g.collectives++;
  id.communicator = g.tag;
  s_->within += ", " + collective::describe(id);
  if (auto r = agree(id); !r) return r;
  Result<void> moved;
  switch (kind) {
  case Collective::all_reduce:
  case Collective::reduce_scatter:
  case Collective::reduce: moved = reduce_blocks(kind, t, op, in, out, arg); break;
  case Collective::barrier: break; // agreeing was all of it
  default: moved = move_blocks(kind, in, out, t, arg);
  }
  if (!moved) return moved;
  if (op == ReduceOp::avg && !out.empty() && kind != Collective::barrier)
    collective::divide(t, out.data(), out.size() / dtype_size(t), size());
  return {};
}

// Every member sends its call's identity to every other and compares what it receives with its
// own: nothing is written to a user buffer before every member is known to have made this call.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::agree(const collective::CallIdentity& id) {
  constexpr std::size_t hb = collective::call_header_bytes;
  const std::size_t m = sub_->members.size(), me = static_cast<std::size_t>(sub_->me);
  Communicator family = view(*s_, nullptr);
  auto slots = family.own_buffer(s_->identities, m * hb);
  if (!slots) return fail(family.broke(slots.error(), "agreeing on the call"));
  auto slot = [&](std::size_t k) { return std::span<std::byte, hb>(*slots + k * hb, hb); };
  collective::encode(id, slot(me));
  std::vector<collective::Transfer> group;
  for (std::size_t k = 0; k < m; ++k)
    if (k != me) {
      group.push_back({true, sub_->members[k], slot(me), {}});
      group.push_back({false, sub_->members[k], {}, slot(k)});
    }
  if (auto r = transfer(group, DType::u8); !r) return r;
  for (std::size_t k = 0; k < m; ++k) {
    if (k == me) continue;
    const auto theirs = collective::decode_call(slot(k));
    if (!theirs)
      return fail(family.broke(Error::make(Step::collective, ErrorKind::bad_frame,
                                           "rank " + std::to_string(k) + " sent no call identity"), "agreeing on the call"));
    if (!collective::same_call(id, *theirs)) return fail(family.broke(collective::mismatch_error(id, *theirs), "agreeing on the call"));
  }
  return {};
}

// The transfers of one step, in order_pairwise's order, each a send or recv of the family tagged
// with this communicator's number. Empty ones are skipped (every member skips the same).
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::transfer(std::vector<collective::Transfer>& group, DType t) {
  using collective::Collective;
  Communicator family = view(*s_, nullptr);
  collective::order_pairwise(group, family.rank(), [](const collective::Transfer& x) { return x.peer; },
                             [](const collective::Transfer& x) { return x.send; });
  for (const collective::Transfer& x : group) {
    if (x.from.empty() && x.into.empty()) continue;
    auto r = x.send ? family.run_held(Collective::send, t, ReduceOp::sum, x.from, {}, x.peer, sub_->tag)
                    : family.run_held(Collective::recv, t, ReduceOp::sum, {}, x.into, x.peer, sub_->tag);
    if (!r) return r;
  }
  return {};
}

// all_reduce, reduce_scatter and reduce: every member's block k goes to the member that combines
// it (member k; reduce: the root combines the whole vector), which combines the contributions in
// member order; all_reduce then sends each combined block to every member.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::reduce_blocks(collective::Collective kind, DType t, ReduceOp op,
                                                              std::span<const std::byte> in, std::span<std::byte> out, int root) {
  using collective::Collective;
  const std::size_t m = sub_->members.size(), me = static_cast<std::size_t>(sub_->me), es = dtype_size(t);
  const std::size_t count = kind == Collective::reduce_scatter ? out.size() / es * m : in.size() / es;
  // Block k: all_reduce's k-th share, reduce_scatter's k-th output; reduce: all of it, at the root.
  auto block = [&](std::size_t k) -> std::pair<std::size_t, std::size_t> {
    if (kind == Collective::reduce) return {0, k == static_cast<std::size_t>(root) ? in.size() : 0};
    if (kind == Collective::reduce_scatter) return {k * out.size(), out.size()};
    return collective::block_of(count, m, k, es);
  };
  const auto [mine_at, mine_bytes] = block(me);
  Communicator family = view(*s_, nullptr);
  auto slots = family.own_buffer(s_->blocks, std::max<std::size_t>(m * mine_bytes, 1));
  if (!slots) return fail(family.broke(slots.error(), "combining"));
  std::vector<collective::Transfer> group;
  for (std::size_t k = 0; k < m; ++k) {
    if (k == me) continue;
    const auto [at, bytes] = block(k);
    group.push_back({true, sub_->members[k], in.subspan(at, bytes), {}});
    group.push_back({false, sub_->members[k], {}, std::span<std::byte>(*slots + k * mine_bytes, mine_bytes)});
  }
  if (auto r = transfer(group, t); !r) return r;
  if (mine_bytes > 0) { // slot k: member k's contribution; combined into slot 0 in member order
    std::byte* acc = *slots;
    std::memcpy(acc + me * mine_bytes, in.data() + mine_at, mine_bytes);
    for (std::size_t k = 1; k < m; ++k) collective::reduce(op, t, acc, acc, acc + k * mine_bytes, mine_bytes / es);
    std::memcpy(kind == Collective::all_reduce ? out.data() + mine_at : out.data(), acc, mine_bytes);
  }
  if (kind != Collective::all_reduce) return {};
  group.clear();
  for (std::size_t k = 0; k < m; ++k) {
    if (k == me) continue;
    const auto [at, bytes] = block(k);
    group.push_back({true, sub_->members[k], out.subspan(mine_at, mine_bytes), {}});
    group.push_back({false, sub_->members[k], {}, out.subspan(at, bytes)});
  }
  return transfer(group, t);
}

// all_gather, gather, broadcast, scatter and all_to_all: each block straight from the member that
// has it to the member that keeps it; this member's own block copied.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::move_blocks(collective::Collective kind, std::span<const std::byte> in,
                                                            std::span<std::byte> out, DType t, int root) {
  using collective::Collective;
  const std::size_t m = sub_->members.size(), me = static_cast<std::size_t>(sub_->me);
  const std::size_t r = static_cast<std::size_t>(root);
  std::vector<collective::Transfer> group;
  auto send = [&](std::size_t k, std::span<const std::byte> b) { group.push_back({true, sub_->members[k], b, {}}); };
  auto recv = [&](std::size_t k, std::span<std::byte> b) { group.push_back({false, sub_->members[k], {}, b}); };
  auto copy = [](std::span<std::byte> to, std::span<const std::byte> from) {
    if (!to.empty() && to.data() != from.data()) std::memmove(to.data(), from.data(), to.size());
  };
  switch (kind) {
  case Collective::all_gather:
  case Collective::gather: {
    const std::size_t b = in.size();
    const bool keeps = kind == Collective::all_gather || me == r;
    for (std::size_t k = 0; k < m; ++k) {
      if (k == me) continue;
      if (kind == Collective::all_gather || k == r) send(k, in);
      if (keeps) recv(k, out.subspan(k * b, b));
    }
    if (keeps) copy(out.subspan(me * b, b), in);
    break;
  }
  case Collective::broadcast:
    for (std::size_t k = 0; k < m; ++k)
      if (me == r && k != me) send(k, out);
    if (me != r) recv(r, out);
    break;
  case Collective::scatter: {
    const std::size_t b = out.size();
    for (std::size_t k = 0; k < m; ++k)
      if (me == r && k != me) send(k, in.subspan(k * b, b));
    if (me != r) recv(r, out);
    else copy(out, in.subspan(me * b, b));
    break;
  }
  case Collective::all_to_all: {
    const std::size_t b = in.size() / m;
    for (std::size_t k = 0; k < m; ++k) {
      if (k == me) continue;
      send(k, in.subspan(k * b, b));
      recv(k, out.subspan(k * b, b));
    }
    copy(out.subspan(me * b, b), in.subspan(me * b, b));
    break;
  }
  default: break;
  }
  return transfer(group, t);
}

TBVERBS_NAMESPACE_END

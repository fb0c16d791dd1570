/// @file collective/call.hpp
/// `collective::CallIdentity`: what a call of the collectives layer was called as (the collective,
/// element type, op, element count, root or peer, algorithm, and its place in the sequence of
/// calls), its 64-byte wire form, and the comparison every rank makes before it writes a user's
/// buffer. The engine sends it as the first message of every call on every link the call uses
/// (collective/engine.hpp, "The call header"); ranks that made different calls fail with
/// ErrorKind::call_mismatch naming both calls.
#pragma once

#include "../detail/wire.hpp"
#include "../error.hpp"
#include "types.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// Which collective a call is (its wire code in the call header: new ones are appended). reduce,
/// gather, scatter and all_to_all run on the schedules of the others (Communicator's lowering).
enum class Collective : std::uint8_t {
  all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier, reduce, gather, scatter, all_to_all
};

/// The last Collective (the call header refuses codes past it).
inline constexpr Collective last_collective = Collective::all_to_all;

/// "all_reduce", "reduce_scatter", ...
constexpr std::string_view collective_name(Collective c) noexcept {
  switch (c) {
  case Collective::all_reduce: return "all_reduce";
  case Collective::reduce_scatter: return "reduce_scatter";
  case Collective::all_gather: return "all_gather";
  case Collective::broadcast: return "broadcast";
  case Collective::send: return "send";
  case Collective::recv: return "recv";
  case Collective::barrier: return "barrier";
  case Collective::reduce: return "reduce";
  case Collective::gather: return "gather";
  case Collective::scatter: return "scatter";
  case Collective::all_to_all: return "all_to_all";
  }
  return "?";
}

/// The collective whose schedule runs `c`: reduce runs as all_reduce, gather and all_to_all as
/// all_gather (all_to_all gathers every rank's whole input), scatter as broadcast; the others as
/// themselves.
constexpr Collective schedule_of(Collective c) noexcept {
  switch (c) {
  case Collective::reduce: return Collective::all_reduce;
  case Collective::gather:
  case Collective::all_to_all: return Collective::all_gather;
  case Collective::scatter: return Collective::broadcast;
  default: return c;
  }
}

/// Which all_reduce algorithm runs (collective/algorithms.hpp): `automatic` follows the measured
/// table of collective/choice.hpp.
enum class Algorithm : std::uint8_t { automatic, ring, latency, mesh };

/// "auto", "ring", "latency", "mesh".
constexpr std::string_view algorithm_name(Algorithm a) noexcept {
  switch (a) {
  case Algorithm::automatic: return "auto";
  case Algorithm::ring: return "ring";
  case Algorithm::latency: return "latency";
  case Algorithm::mesh: return "mesh";
  }
  return "?";
}

/// One call as its rank made it. Two ranks agree on a collective when every field but `rank` is
/// equal; on a send and a recv when they are each other's complement (the same `from`, `to`,
/// type, count and `pair_seq`, one `send` and the other `recv`).
struct CallIdentity {
  Collective kind = Collective::all_reduce; ///< The call.
  DType type = DType::f32;                  ///< Element type (barrier: int32).
  ReduceOp op = ReduceOp::sum;              ///< all_reduce, reduce_scatter and reduce; sum otherwise.
  Algorithm algorithm = Algorithm::ring;    ///< The algorithm the rank chose (never automatic).
  /// Elements as the caller counts them: all_reduce's and reduce's vector, the block (one rank's
  /// share) of all_gather, reduce_scatter, gather, scatter and all_to_all, broadcast's buffer,
  /// send's and recv's message; 0 for barrier.
  std::uint64_t count = 0;
  std::int32_t root = -1;       ///< broadcast, reduce, gather, scatter: the root; -1 otherwise.
  std::int32_t from = -1;       ///< send/recv: the sending rank; -1 otherwise.
  std::int32_t to = -1;         ///< send/recv: the receiving rank; -1 otherwise.
  std::uint64_t collective_seq = 0; ///< Collectives this rank made before this call.
  std::uint64_t pair_seq = 0;       ///< send/recv: the messages `from` sent to `to` before this one.
  /// The communicator of the call: 0 for one that connect() made, a split one's own number
  /// otherwise (Communicator::split; the same on all its members).
  std::uint32_t communicator = 0;
  std::int32_t rank = -1;       ///< The rank that made the call (not compared).

  /// True for send and recv (they involve two ranks; collectives involve every rank).
  bool point_to_point() const noexcept { return kind == Collective::send || kind == Collective::recv; }
};

/// Bytes of a CallIdentity on the wire (one 4 KiB frame).
inline constexpr std::size_t call_header_bytes = 64;

/// The wire form: "TBCI", version 1, the fields big-endian (the communicator at byte 52, zero
/// before split communicators existed), a CRC-32 of the first 56 bytes.
inline void encode(const CallIdentity& c, std::span<std::byte, call_header_bytes> out) noexcept {
  std::byte* p = out.data();
  for (std::size_t i = 0; i < call_header_bytes; ++i) p[i] = std::byte{0};
  p[0] = std::byte{'T'}, p[1] = std::byte{'B'}, p[2] = std::byte{'C'}, p[3] = std::byte{'I'};
  p[4] = std::byte{1};
  p[5] = static_cast<std::byte>(c.kind);
  p[6] = static_cast<std::byte>(c.type);
  p[7] = static_cast<std::byte>(c.op);
  p[8] = static_cast<std::byte>(c.algorithm);
  detail::put_be<std::int32_t>(p + 12, c.rank);
  detail::put_be<std::int32_t>(p + 16, c.root);
  detail::put_be<std::int32_t>(p + 20, c.from);
  detail::put_be<std::int32_t>(p + 24, c.to);
  detail::put_be<std::uint64_t>(p + 28, c.count);
  detail::put_be<std::uint64_t>(p + 36, c.collective_seq);
  detail::put_be<std::uint64_t>(p + 44, c.pair_seq);
  detail::put_be<std::uint32_t>(p + 52, c.communicator);
  detail::put_be<std::uint32_t>(p + 56, detail::crc32(std::span<const std::byte>(p, 56)));
}

/// The identity in `in`, or nullopt when it is not one (foreign bytes, a newer version, a bad CRC).
inline std::optional<CallIdentity> decode_call(std::span<const std::byte> in) noexcept {
  if (in.size() < call_header_bytes) return std::nullopt;
  const std::byte* p = in.data();
  if (p[0] != std::byte{'T'} || p[1] != std::byte{'B'} || p[2] != std::byte{'C'} || p[3] != std::byte{'I'} ||
      p[4] != std::byte{1})
    return std::nullopt;
  if (detail::get_be<std::uint32_t>(p + 56) != detail::crc32(std::span<const std::byte>(p, 56))) return std::nullopt;
  const auto k = static_cast<std::uint8_t>(p[5]), t = static_cast<std::uint8_t>(p[6]), o = static_cast<std::uint8_t>(p[7]),
             a = static_cast<std::uint8_t>(p[8]);
  if (k > static_cast<std::uint8_t>(last_collective) || t > static_cast<std::uint8_t>(last_dtype) ||
      o > static_cast<std::uint8_t>(ReduceOp::avg) || a > static_cast<std::uint8_t>(Algorithm::mesh))
    return std::nullopt;
  CallIdentity c;
  c.kind = static_cast<Collective>(k);
  c.type = static_cast<DType>(t);
  c.op = static_cast<ReduceOp>(o);
  c.algorithm = static_cast<Algorithm>(a);
  c.rank = detail::get_be<std::int32_t>(p + 12);
  c.root = detail::get_be<std::int32_t>(p + 16);
  c.from = detail::get_be<std::int32_t>(p + 20);
  c.to = detail::get_be<std::int32_t>(p + 24);
  c.count = detail::get_be<std::uint64_t>(p + 28);
  c.collective_seq = detail::get_be<std::uint64_t>(p + 36);
  c.pair_seq = detail::get_be<std::uint64_t>(p + 44);
  c.communicator = detail::get_be<std::uint32_t>(p + 52);
  return c;
}

/// "1 element", "4099 elements".
inline std::string elements(std::uint64_t n) { return std::to_string(n) + (n == 1 ? " element" : " elements"); }

/// The call as its caller wrote it: "all_reduce(float32 sum, 4 elements)", "broadcast(float32,
/// 3 elements, root 1)", "send(int32, 4 elements, to rank 1)", "barrier()". `with_algorithm`
/// adds the algorithm ("..., ring algorithm)").
inline std::string describe(const CallIdentity& c, bool with_algorithm = false) {
  const std::string t(dtype_name(c.type));
  std::string s(collective_name(c.kind));
  switch (c.kind) {
  case Collective::all_reduce: s += "(" + t + " " + std::string(reduce_op_name(c.op)) + ", " + elements(c.count); break;
  case Collective::reduce_scatter:
    s += "(" + t + " " + std::string(reduce_op_name(c.op)) + ", blocks of " + elements(c.count);
    break;
  case Collective::all_gather: s += "(" + t + ", blocks of " + elements(c.count); break;
  case Collective::broadcast: s += "(" + t + ", " + elements(c.count) + ", root " + std::to_string(c.root); break;
  case Collective::send: s += "(" + t + ", " + elements(c.count) + ", to rank " + std::to_string(c.to); break;
  case Collective::recv: s += "(" + t + ", " + elements(c.count) + ", from rank " + std::to_string(c.from); break;
  case Collective::barrier: s += "("; break;
  case Collective::reduce:
    s += "(" + t + " " + std::string(reduce_op_name(c.op)) + ", " + elements(c.count) + ", root " + std::to_string(c.root);
    break;
  case Collective::gather:
  case Collective::scatter: s += "(" + t + ", blocks of " + elements(c.count) + ", root " + std::to_string(c.root); break;
  case Collective::all_to_all: s += "(" + t + ", blocks of " + elements(c.count); break;
  }
  if (with_algorithm && c.kind != Collective::barrier && !c.point_to_point())
    s += std::string(", ") + std::string(algorithm_name(c.algorithm)) + " algorithm";
  return s + ")";
}

/// Where the call stands in its rank's sequence: "collective call 4" (1-based), or for send and
/// recv "message 2 to rank 1" / "message 2 from rank 0"; `with_collectives` adds how many
/// collectives the rank had made before a send or recv.
inline std::string position(const CallIdentity& c, bool with_collectives = false) {
  if (!c.point_to_point()) return "collective call " + std::to_string(c.collective_seq + 1);
  std::string s = "message " + std::to_string(c.pair_seq + 1) +
                  (c.kind == Collective::send ? " to rank " + std::to_string(c.to) : " from rank " + std::to_string(c.from));
  if (with_collectives) s += " after " + std::to_string(c.collective_seq) + " collective calls";
  return s;
}

/// "the communicator connect() made" for 0, "split communicator 1a2b3c4d" otherwise.
inline std::string communicator_name(std::uint32_t c) {
  if (c == 0) return "the communicator connect() made";
  char hex[9];
  for (int i = 0; i < 8; ++i) hex[i] = "0123456789abcdef"[(c >> (28 - 4 * i)) & 0xfu];
  hex[8] = '\0';
  return std::string("split communicator ") + hex;
}

/// True when `mine` (made here) and `theirs` (a peer's) are the same call: the same collective, or
/// a send and its recv, on the same communicator.
inline bool same_call(const CallIdentity& mine, const CallIdentity& theirs) noexcept {
  const bool shared = mine.type == theirs.type && mine.count == theirs.count && mine.collective_seq == theirs.collective_seq &&
                      mine.communicator == theirs.communicator;
  if (mine.point_to_point() || theirs.point_to_point()) {
    const bool pair = (mine.kind == Collective::send && theirs.kind == Collective::recv) ||
                      (mine.kind == Collective::recv && theirs.kind == Collective::send);
    return pair && shared && mine.from == theirs.from && mine.to == theirs.to && mine.pair_seq == theirs.pair_seq;
  }
  return shared && mine.kind == theirs.kind && mine.op == theirs.op && mine.algorithm == theirs.algorithm &&
         mine.root == theirs.root;
}

/// The error of two ranks that made different calls (kind call_mismatch): "the communicator is
/// broken: rank 0 called all_reduce(float32 sum, 1 element), rank 1 called broadcast(float32,
/// 1 element, root 1) (collective call 4)". The calls come last: an abort frame that must be cut
/// keeps the end of its text.
inline Error mismatch_error(const CallIdentity& mine, const CallIdentity& theirs) {
  const bool algo = mine.kind == theirs.kind && mine.algorithm != theirs.algorithm;
  const bool counts = mine.point_to_point() && theirs.point_to_point() && mine.collective_seq != theirs.collective_seq;
  const std::string pm = position(mine, counts), pt = position(theirs, counts);
  const bool same_place = pm == pt || (mine.point_to_point() && theirs.point_to_point() && mine.pair_seq == theirs.pair_seq && !counts);
  auto on = [&](const CallIdentity& c) {
    return mine.communicator == theirs.communicator ? std::string() : " on " + communicator_name(c.communicator);
  };
  std::string d = "the communicator is broken: rank " + std::to_string(mine.rank) + " called " + describe(mine, algo) + on(mine);
  if (!same_place) d += " as its " + pm;
  d += ", rank " + std::to_string(theirs.rank) + " called " + describe(theirs, algo) + on(theirs);
  d += same_place ? " (" + pm + ")" : " as its " + pt;
  return Error::make(Step::collective, ErrorKind::call_mismatch, d);
}

} // namespace collective
TBVERBS_NAMESPACE_END

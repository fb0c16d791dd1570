/// @file collective/impl/subgroup.hpp
/// A split communicator's members (collective::Subgroup), the transfers its calls are made of, and
/// the arithmetic every member derives alike (its number, its blocks). collective/impl/split.hpp
/// runs the calls.
#pragma once

#include "../../config.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// A split communicator's members and its place in its family (private to Communicator).
struct Subgroup {
  std::vector<int> members;      ///< Family ranks (connect()'s communicator's), in this communicator's rank order.
  int me = 0;                    ///< This rank's place in `members`.
  std::uint32_t tag = 0;         ///< Its number on the wire (CallIdentity::communicator): never 0, the same on every member.
  std::uint64_t collectives = 0; ///< Collective calls made (the next one's number).
  std::uint64_t splits = 0;      ///< split calls made on it (the next child's number derives from it).
  std::map<std::vector<int>, std::uint64_t> subgroups; ///< subgroup() calls made on it, per list of ranks.
};

/// One send or receive of a split communicator's call.
struct Transfer {
  bool send = false;               ///< A send (else a receive).
  int peer = 0;                    ///< The other rank, in the family's ranks.
  std::span<const std::byte> from; ///< A send's bytes.
  std::span<std::byte> into;       ///< A receive's bytes.
};

/// The number of a communicator made from the one numbered `parent` (0: connect()'s), from
/// `words` that every member knows alike (a split's number and color; a subgroup's ranks and how
/// many of them were made before): FNV-1a over them, never 0. Two communicators of one family
/// share a number with a chance of about 2^-32 per pair.
inline std::uint32_t child_tag(std::uint32_t parent, std::span<const std::uint64_t> words) noexcept {
  std::uint32_t h = 2166136261u;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ static_cast<std::uint32_t>((v >> (8 * i)) & 0xffu)) * 16777619u;
  };
  mix(parent);
  for (std::uint64_t w : words) mix(w);
  return h == 0 ? 1 : h;
}

/// Block `k` of `count` elements cut into `m` blocks that differ by at most one element, in bytes
/// of `es`: {offset, length}.
inline std::pair<std::size_t, std::size_t> block_of(std::size_t count, std::size_t m, std::size_t k, std::size_t es) noexcept {
  const std::size_t begin = count * k / m, end = count * (k + 1) / m;
  return {begin * es, (end - begin) * es};
}

} // namespace collective
TBVERBS_NAMESPACE_END

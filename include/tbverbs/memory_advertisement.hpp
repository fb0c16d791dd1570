/// @file memory_advertisement.hpp
/// `MemoryAdvertisement`: what a peer needs to RDMA WRITE into (or READ from) one registered
/// buffer on one device, and its wire form. A buffer registered as a MemoryRegionSet has one rkey
/// per region (Apple's max_mr_size cuts a large buffer into several), so the advertisement carries
/// the region plan and every rkey, and at() applies the same plan on the writer's side to pick the
/// region, and so the rkey, that holds a range.
#pragma once

#include "config.hpp"
#include "wire.hpp"
#include "error.hpp"
#include "memory_region_set.hpp"
#include "result.hpp"
#include "work_request.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// One buffer as a peer may address it: its address and length in the owner's address space,
/// how it was cut into regions, and each region's rkey.
struct MemoryAdvertisement {
  std::uint64_t address = 0;         ///< The buffer's start, in the owner's address space.
  std::uint64_t length = 0;          ///< Its length in bytes.
  RegionPlan plan;                   ///< How the owner cut it into regions.
  std::vector<std::uint32_t> rkeys;  ///< One per region of `plan`, in address order.

  /// Largest number of regions a wire form may carry (a 1 TiB buffer of Apple's 16,384,000-byte
  /// regions is about 67,000): a bound, so a corrupt count cannot make parse() allocate without end.
  static constexpr std::uint64_t max_regions = 1u << 20;

  /// The advertisement of a registered buffer (its regions' rkeys).
  static MemoryAdvertisement of(const MemoryRegionSet& set) {
    MemoryAdvertisement a;
    a.address = reinterpret_cast<std::uintptr_t>(set.data());
    a.length = set.size();
    a.plan = set.plan();
    a.rkeys.reserve(set.regions().size());
    for (const auto& mr : set.regions()) a.rkeys.push_back(mr.rkey());
    return a;
  }

  /// The owner's address and the rkey of its region that holds [offset, offset + bytes): what an
  /// RDMA WRITE to that range names (RegionPlan::region_of, the owner's rule). Errors:
  /// invalid_argument when the range leaves the buffer or no one region holds it. Allocates nothing.
  [[nodiscard]] Result<RemoteBuffer> at(std::size_t offset, std::size_t bytes) const noexcept {
    const auto k = plan.region_of(static_cast<std::size_t>(length), offset, bytes);
    if (!k || *k >= rkeys.size())
      return fail(Error::make(Step::make_sge, ErrorKind::invalid_argument,
                              "range " + std::to_string(offset) + "+" + std::to_string(bytes) +
                                  " outside the advertised buffer of " + std::to_string(length) + " bytes"));
    return RemoteBuffer{address + offset, rkeys[*k]};
  }

  /// Wire form: magic "TBMA", version, address, length, the plan's four fields, the region count
  /// and rkeys, CRC-32 of all before it; big-endian.
  std::vector<std::byte> serialize() const {
    WireWriter w;
    w.put<std::uint32_t>(magic).put<std::uint16_t>(version).put<std::uint64_t>(address).put<std::uint64_t>(length);
    w.put<std::uint64_t>(plan.region_bytes).put<std::uint64_t>(plan.stride).put<std::uint64_t>(plan.count);
    w.put<std::uint64_t>(plan.max_span).put<std::uint32_t>(static_cast<std::uint32_t>(rkeys.size()));
    for (std::uint32_t k : rkeys) w.put<std::uint32_t>(k);
    return w.crc().take();
  }

  /// Reads a wire form. Errors: bad_frame for a truncated, foreign or corrupt one, a newer
  /// version, or one whose plan does not describe its length and rkeys.
  [[nodiscard]] static Result<MemoryAdvertisement> parse(std::span<const std::byte> bytes) {
    auto bad = [](const char* why) {
      return fail(Error::make(Step::configure, ErrorKind::bad_frame, std::string("memory advertisement: ") + why));
    };
    WireReader r(bytes);
    if (r.get<std::uint32_t>() != magic) return bad("not a tbverbs memory advertisement");
    if (const auto v = r.get<std::uint16_t>(); v != version)
      return bad(v > version ? "a newer version than this library reads" : "an unknown version");
    MemoryAdvertisement a;
    a.address = r.get<std::uint64_t>();
    a.length = r.get<std::uint64_t>();
    a.plan.region_bytes = static_cast<std::size_t>(r.get<std::uint64_t>());
    a.plan.stride = static_cast<std::size_t>(r.get<std::uint64_t>());
    a.plan.count = static_cast<std::size_t>(r.get<std::uint64_t>());
    a.plan.max_span = static_cast<std::size_t>(r.get<std::uint64_t>());
    const auto n = r.get<std::uint32_t>();
    if (!r.ok()) return bad("truncated");
    if (n != a.plan.count || n > max_regions || r.remaining() != std::size_t{n} * 4 + 4)
      return bad("the region count does not match its rkeys");
    a.rkeys.reserve(n);
    for (std::uint32_t k = 0; k < n; ++k) a.rkeys.push_back(r.get<std::uint32_t>());
    if (!r.check_crc()) return bad("checksum mismatch (corrupt)");
    // The plan must cover the length exactly as RegionPlan::make would have cut it.
    const bool one = a.plan.count == 1 && a.plan.region_bytes == a.length && a.plan.stride == a.length;
    const bool many = a.plan.count > 1 && a.plan.stride > 0 && a.plan.stride <= a.plan.region_bytes &&
                      a.plan.region_bytes <= a.length &&
                      (a.plan.count - 1) < (a.length - a.plan.region_bytes + a.plan.stride - 1) / a.plan.stride + 1 &&
                      1 + (a.length - a.plan.region_bytes + a.plan.stride - 1) / a.plan.stride == a.plan.count;
    if (!(one || many || (a.plan.count == 0 && a.length == 0))) return bad("the region plan does not fit the length");
    return a;
  }

private:
  static constexpr std::uint32_t magic = 0x54424d41u; // "TBMA"
  static constexpr std::uint16_t version = 1;
};

TBVERBS_NAMESPACE_END

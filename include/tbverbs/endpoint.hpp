/// @file endpoint.hpp
/// What one side of a queue pair sends the other, and its versioned, checksummed wire form.
#pragma once

#include "config.hpp"
#include "detail/wire.hpp"
#include "error.hpp"
#include "gid.hpp"
#include "result.hpp"
#include "types.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <span>
#include <string>

TBVERBS_NAMESPACE_BEGIN

/// Capability bits an endpoint advertises.
enum class EndpointCaps : std::uint32_t {
  none = 0,          ///< SEND/RECV only.
  rdma_write = 1,    ///< The side executes RDMA WRITE (Apple's driver accepts but drops them).
  equal_frames = 2,  ///< Sends and receives must span equal numbers of 4 KiB frames (Apple).
};
/// Union of capability bits.
constexpr EndpointCaps operator|(EndpointCaps a, EndpointCaps b) noexcept {
  return static_cast<EndpointCaps>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
/// True when `have` has every bit of `want`.
constexpr bool has(EndpointCaps have, EndpointCaps want) noexcept {
  return (static_cast<std::uint32_t>(have) & static_cast<std::uint32_t>(want)) == static_cast<std::uint32_t>(want);
}

/// A queue pair's address and parameters as its peer needs them: QP number, PSN, LID, GID (with
/// its type and the port's link layer), MTU, QP type and capabilities.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto wire
/// \until remote.error()
struct Endpoint {
  std::uint32_t qp_num = 0;          ///< 24-bit QP number.
  std::uint32_t psn = 0;             ///< 24-bit initial packet sequence number of the sender.
  std::uint16_t lid = 0;             ///< LID: InfiniBand addresses by it (0 on RoCE; a LID on Thunderbolt, unused).
  std::uint8_t port = 1;             ///< The sender's port number (informational).
  Mtu mtu = Mtu::mtu1024;            ///< The largest path MTU the sender can use (at most its port's active MTU); RTR takes the smaller of both ends'.
  QpType qp_type = QpType::uc;       ///< Transport type; both sides must agree.
  EndpointCaps caps = EndpointCaps::none; ///< Capability bits.
  Gid gid;                           ///< The sender's source GID (its RTR sgid_index entry).
  GidType gid_type = GidType::unknown;         ///< Its type (RoCE v1/v2, IB); unknown from older peers and on Apple.
  LinkLayer link_layer = LinkLayer::unspecified; ///< The sender's port link layer; unspecified from older peers.

  /// Wire magic, "TBVE".
  static constexpr std::uint32_t magic = 0x54425645u;
  /// Wire format version this build writes and reads.
  static constexpr std::uint16_t version = 1;
  /// Byte-order marker written big-endian; a host writing raw little-endian structs shows 0x0201.
  static constexpr std::uint16_t byte_order_mark = 0x0102;
  /// Size of the wire form in bytes.
  static constexpr std::size_t wire_size = 48;

  /// The wire form: magic, version, byte-order mark, fields big-endian, CRC-32 last.
  std::array<std::byte, wire_size> serialize() const noexcept {
    std::array<std::byte, wire_size> w{};
    std::byte* p = w.data();
    detail::put_be<std::uint32_t>(p + 0, magic);
    detail::put_be<std::uint16_t>(p + 4, version);
    detail::put_be<std::uint16_t>(p + 6, byte_order_mark);
    detail::put_be<std::uint32_t>(p + 8, qp_num);
    detail::put_be<std::uint32_t>(p + 12, psn);
    detail::put_be<std::uint16_t>(p + 16, lid);
    p[18] = static_cast<std::byte>(port);
    p[19] = static_cast<std::byte>(mtu);
    p[20] = static_cast<std::byte>(qp_type);
    // 21 and 22 were reserved (zero) in the first frames of version 1: a peer that writes zero
    // there says "unknown", so both new fields stay compatible within version 1.
    p[21] = static_cast<std::byte>(gid_type);
    p[22] = static_cast<std::byte>(link_layer);
    // 23 reserved, zero
    detail::put_be<std::uint32_t>(p + 24, static_cast<std::uint32_t>(caps));
    for (std::size_t i = 0; i < 16; ++i) p[28 + i] = static_cast<std::byte>(gid.raw()[i]);
    detail::put_be<std::uint32_t>(p + 44, detail::crc32({p, 44}));
    return w;
  }

  /// Decodes a wire form. Truncated, foreign (magic or byte order), corrupt (checksum, fields out
  /// of range) and newer-version frames are rejected with `bad_frame` saying which; never garbage.
  [[nodiscard]] static Result<Endpoint> parse(std::span<const std::byte> w) {
    auto bad = [](const std::string& why) {
      return fail(Error::make(Step::parse_endpoint, ErrorKind::bad_frame, why));
    };
    if (w.size() < 8) return bad("truncated endpoint frame: " + std::to_string(w.size()) + " bytes");
    const std::byte* p = w.data();
    if (detail::get_be<std::uint32_t>(p) != magic) return bad("foreign frame: not a tbverbs endpoint (bad magic)");
    const auto ver = detail::get_be<std::uint16_t>(p + 4);
    if (ver > version)
      return bad("endpoint frame version " + std::to_string(ver) + " is newer than this build's " +
                 std::to_string(version) + "; upgrade tbverbs on this side");
    if (ver == 0) return bad("endpoint frame version 0 is invalid");
    if (detail::get_be<std::uint16_t>(p + 6) != byte_order_mark) return bad("foreign byte order in endpoint frame");
    if (w.size() < wire_size)
      return bad("truncated endpoint frame: " + std::to_string(w.size()) + " of " + std::to_string(wire_size) + " bytes");
    if (w.size() > wire_size) return bad("endpoint frame too long: " + std::to_string(w.size()) + " bytes");
    if (detail::get_be<std::uint32_t>(p + 44) != detail::crc32({p, 44}))
      return bad("corrupt endpoint frame: checksum mismatch");
    Endpoint e;
    e.qp_num = detail::get_be<std::uint32_t>(p + 8);
    e.psn = detail::get_be<std::uint32_t>(p + 12);
    e.lid = detail::get_be<std::uint16_t>(p + 16);
    e.port = static_cast<std::uint8_t>(p[18]);
    const auto mtu = static_cast<std::uint8_t>(p[19]);
    const auto type = static_cast<std::uint8_t>(p[20]);
    e.caps = static_cast<EndpointCaps>(detail::get_be<std::uint32_t>(p + 24));
    const auto gid_type = static_cast<std::uint8_t>(p[21]);
    e.gid_type = gid_type <= 3 ? static_cast<GidType>(gid_type) : GidType::unknown; // a newer type: unknown here
    e.link_layer = static_cast<LinkLayer>(static_cast<std::uint8_t>(p[22]));
    std::array<std::uint8_t, 16> raw{};
    for (std::size_t i = 0; i < 16; ++i) raw[i] = static_cast<std::uint8_t>(p[28 + i]);
    e.gid = Gid(raw);
    if (e.qp_num > 0xffffff || e.psn > 0xffffff) return bad("corrupt endpoint frame: QP number or PSN exceeds 24 bits");
    // What no valid peer sends is refused, not carried into RTR: QP number 0 (the
    // special QP0), a zero GID, a set reserved byte, capability bits this version does not define,
    // an unknown link layer, and UD (a UD QP needs address handles and a QKEY, not this exchange).
    if (e.qp_num == 0) return bad("corrupt endpoint frame: QP number 0");
    if (e.gid.is_zero()) return bad("corrupt endpoint frame: zero GID (the peer sent an unset entry)");
    if (p[23] != std::byte{0}) return bad("corrupt endpoint frame: reserved byte 23 is set");
    constexpr std::uint32_t known_caps =
        static_cast<std::uint32_t>(EndpointCaps::rdma_write) | static_cast<std::uint32_t>(EndpointCaps::equal_frames);
    if ((static_cast<std::uint32_t>(e.caps) & ~known_caps) != 0)
      return bad("corrupt endpoint frame: unknown capability bits 0x" + [&] {
        char hex[16];
        std::snprintf(hex, sizeof hex, "%x", static_cast<unsigned>(static_cast<std::uint32_t>(e.caps) & ~known_caps));
        return std::string(hex);
      }());
    switch (e.link_layer) {
    case LinkLayer::unspecified:
    case LinkLayer::infiniband:
    case LinkLayer::ethernet:
    case LinkLayer::thunderbolt: break;
    default: return bad("corrupt endpoint frame: link layer " + std::to_string(static_cast<unsigned>(e.link_layer)));
    }
    if (mtu < 1 || mtu > 5) return bad("corrupt endpoint frame: MTU code " + std::to_string(mtu));
    if (type == 4) return bad("endpoint frame of a UD QP: tbverbs connects RC and UC queue pairs only");
    if (type != 2 && type != 3) return bad("corrupt endpoint frame: QP type " + std::to_string(type));
    e.mtu = static_cast<Mtu>(mtu);
    e.qp_type = static_cast<QpType>(type);
    return e;
  }

  /// Equality of every field.
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

/// One line with every field, in the order and style of `ibv_rc_pingpong`'s address lines: "QPN
/// 0x000123, PSN 0x62a2f5, LID 0x0000, GID ::ffff:10.0.0.1 (RoCE v2), port 1, MTU 1024, UC,
/// Thunderbolt, caps equal_frames" (the GID type, link layer and caps only when known or set).
inline std::string to_string(const Endpoint& e) {
  char nums[64];
  std::snprintf(nums, sizeof nums, "QPN 0x%06x, PSN 0x%06x, LID 0x%04x, GID ", static_cast<unsigned>(e.qp_num),
                static_cast<unsigned>(e.psn), static_cast<unsigned>(e.lid));
  std::string s = nums + e.gid.to_string();
  if (e.gid_type != GidType::unknown) s += " (" + std::string(gid_type_name(e.gid_type)) + ")";
  s += ", port " + std::to_string(e.port) + ", MTU " + std::string(mtu_name(e.mtu)) + ", " +
       std::string(qp_type_name(e.qp_type));
  if (e.link_layer != LinkLayer::unspecified) s += ", " + std::string(link_layer_name(e.link_layer));
  if (e.caps != EndpointCaps::none) {
    s += ", caps";
    if (has(e.caps, EndpointCaps::rdma_write)) s += " rdma_write";
    if (has(e.caps, EndpointCaps::equal_frames)) s += " equal_frames";
    const auto other = static_cast<std::uint32_t>(e.caps) &
                       ~static_cast<std::uint32_t>(EndpointCaps::rdma_write | EndpointCaps::equal_frames);
    if (other != 0) s += " 0x" + [&] {
      char hex[16];
      std::snprintf(hex, sizeof hex, "%x", static_cast<unsigned>(other));
      return std::string(hex);
    }();
  }
  return s;
}
/// Prints to_string(e): `std::cout << prepared->endpoint() << "\n"`.
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, const Endpoint& e) {
  return os << to_string(e);
}

TBVERBS_NAMESPACE_END

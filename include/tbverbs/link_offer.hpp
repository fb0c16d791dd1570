/// @file link_offer.hpp
/// `LinkOffer`: what one end of a link can do, advertised before its queue pair exists, and
/// `agree()`: the recipe both ends of one link then use. A Mac facing a Linux host and two Linux
/// hosts facing each other pick different recipes in one job: the recipe follows the
/// link, not one's own platform.
#pragma once

#include "config.hpp"
#include "context.hpp"
#include "detail/printable.hpp"
#include "detail/wire.hpp"
#include "error.hpp"
#include "message_size.hpp"
#include "queue_pair.hpp"
#include "recipe.hpp"
#include "result.hpp"
#include "types.hpp"
#include "work_request.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// Transports one end of a link can run (bit set).
enum class Transports : std::uint8_t {
  none = 0,     ///< Nothing (never offered by a valid peer).
  rc = 1,       ///< Reliable connected.
  uc = 2,       ///< Unreliable connected.
  rc_uc = 3,    ///< Both (rdma-core NICs, the usb4_rdma native transport).
};
/// True when `set` has every transport of `t`.
constexpr bool has(Transports set, Transports t) noexcept {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(t)) == static_cast<unsigned>(t);
}

/// What unit a queue depth is counted in.
enum class DepthUnit : std::uint8_t {
  work_requests = 0, ///< One per posted request (rdma-core).
  frames = 1,        ///< One per 4 KiB frame a request spans (Apple, TN3205); sends and receives then pair frame for frame.
};

/// What one end of a link can do: its transports, the operations it executes, the largest
/// message it takes, its depth unit and largest depth, its provider family and device. Sent to
/// the peer before either end creates the link's queue pair (connect_links, LinkOptions::negotiate).
///
/// The wire form is 64 bytes: magic "TBVO", version, byte-order mark, fields big-endian, the
/// device name (NUL-padded), CRC-32 last. parse() refuses truncated, foreign, corrupt and newer
/// frames, and offers no valid peer sends (no transport, no SEND).
struct LinkOffer {
  Transports transports = Transports::none;      ///< Transports this end can run.
  SendOps ops = SendOps::send;                   ///< Operations it executes on its best transport.
  DepthUnit depth_unit = DepthUnit::work_requests; ///< What its depths count.
  std::uint32_t max_depth = 0;                   ///< Its largest queue depth, in depth_unit.
  std::uint64_t max_message = 0;                 ///< The largest message it will try (largest_message_guess).
  Platform platform = Platform::any;             ///< Its provider family.
  detail::FixedString<32> device;                ///< Its device name (for explanations).

  /// Wire magic, "TBVO".
  static constexpr std::uint32_t magic = 0x5442564fu;
  /// Wire format version this build writes and reads.
  static constexpr std::uint16_t version = 1;
  /// Byte-order marker written big-endian.
  static constexpr std::uint16_t byte_order_mark = 0x0102;
  /// Size of the wire form in bytes.
  static constexpr std::size_t wire_size = 64;

  /// What this end offers for a link made with `recipe` on `context` (whose device attributes
  /// are `device`), for messages of up to `max_message` bytes:
  ///  - Apple's driver: UC only, SEND only, depths in 4 KiB frames up to 4095 (TN3205);
  ///  - rdma-core: the recipe's transport, and UC as well when it is RC (so a peer that runs UC
  ///    only still meets it), the operations send_ops_for() allows the recipe, depths in work
  ///    requests up to the device's max_qp_wr.
  static LinkOffer of(const Context& context, const QpRecipe& recipe, const DeviceAttributes& device,
                      std::uint64_t max_message) noexcept {
    LinkOffer o;
    o.platform = context.platform();
    o.device.assign(context.name());
    o.max_message = max_message;
    if (o.platform == Platform::apple) {
      o.transports = Transports::uc;
      o.ops = SendOps::send;
      o.depth_unit = DepthUnit::frames;
      o.max_depth = max_depth_frames;
      return o;
    }
    o.transports = recipe.type() == QpType::rc ? Transports::rc_uc
                   : recipe.type() == QpType::uc ? Transports::uc
                                                 : Transports::none;
    o.ops = send_ops_for(recipe.type(), o.platform, recipe.rdma_write_allowed(), recipe.access());
    o.depth_unit = DepthUnit::work_requests;
    o.max_depth = device.max_qp_wr > 0 ? static_cast<std::uint32_t>(device.max_qp_wr) : 0;
    return o;
  }

  /// The wire form.
  std::array<std::byte, wire_size> serialize() const noexcept {
    std::array<std::byte, wire_size> w{};
    std::byte* p = w.data();
    detail::put_be<std::uint32_t>(p + 0, magic);
    detail::put_be<std::uint16_t>(p + 4, version);
    detail::put_be<std::uint16_t>(p + 6, byte_order_mark);
    p[8] = static_cast<std::byte>(transports);
    p[9] = static_cast<std::byte>(depth_unit);
    p[10] = static_cast<std::byte>(platform);
    // 11 reserved, zero
    detail::put_be<std::uint32_t>(p + 12, static_cast<std::uint32_t>(ops));
    detail::put_be<std::uint32_t>(p + 16, max_depth);
    detail::put_be<std::uint64_t>(p + 20, max_message);
    const std::string_view name = device.view();
    for (std::size_t i = 0; i < 32 && i < name.size(); ++i) p[28 + i] = static_cast<std::byte>(name[i]);
    detail::put_be<std::uint32_t>(p + 60, detail::crc32({p, 60}));
    return w;
  }

  /// Decodes a wire form; `bad_frame` at Step::parse_endpoint saying what is wrong, never garbage.
  [[nodiscard]] static Result<LinkOffer> parse(std::span<const std::byte> w) {
    auto bad = [](const std::string& why) {
      return fail(Error::make(Step::parse_endpoint, ErrorKind::bad_frame, "link offer: " + why));
    };
    if (w.size() != wire_size) return bad(std::to_string(w.size()) + " bytes, not " + std::to_string(wire_size));
    const std::byte* p = w.data();
    if (detail::get_be<std::uint32_t>(p) != magic) return bad("foreign frame (bad magic)");
    const auto ver = detail::get_be<std::uint16_t>(p + 4);
    if (ver == 0 || ver > version)
      return bad("version " + std::to_string(ver) + " (this build reads " + std::to_string(version) + ")");
    if (detail::get_be<std::uint16_t>(p + 6) != byte_order_mark) return bad("foreign byte order");
    if (detail::get_be<std::uint32_t>(p + 60) != detail::crc32({p, 60})) return bad("checksum mismatch");
    LinkOffer o;
    const auto t = static_cast<std::uint8_t>(p[8]);
    const auto unit = static_cast<std::uint8_t>(p[9]);
    const auto plat = static_cast<std::uint8_t>(p[10]);
    if (t == 0 || t > 3) return bad("no transport, or unknown transport bits");
    if (unit > 1) return bad("unknown depth unit " + std::to_string(unit));
    if (plat > 2) return bad("unknown provider family " + std::to_string(plat));
    if (p[11] != std::byte{0}) return bad("reserved byte 11 is set");
    o.transports = static_cast<Transports>(t);
    o.depth_unit = static_cast<DepthUnit>(unit);
    o.platform = static_cast<Platform>(plat);
    const auto ops = detail::get_be<std::uint32_t>(p + 12);
    if ((ops & ~static_cast<std::uint32_t>(SendOps::reliable_connected)) != 0 || !contains(static_cast<SendOps>(ops), SendOp::send))
      return bad("operations without SEND, or unknown operation bits");
    o.ops = static_cast<SendOps>(ops);
    o.max_depth = detail::get_be<std::uint32_t>(p + 16);
    o.max_message = detail::get_be<std::uint64_t>(p + 20);
    char name[33] = {};
    for (std::size_t i = 0; i < 32; ++i) name[i] = static_cast<char>(p[28 + i]);
    o.device.assign(std::string_view(name));
    if (detail::has_control(o.device.view())) return bad("a device name with control characters"); // a peer's words are data
    return o;
  }
};

/// The recipe one link uses: what both ends offered.
struct LinkAgreement {
  QpType type = QpType::uc;        ///< RC when both ends offer it, else UC.
  SendOps ops = SendOps::send;     ///< Operations both execute on that transport.
  bool equal_frames = false;       ///< Either end counts depths in frames: every send and its receive span the same frames.
  std::uint64_t max_message = 0;   ///< The smaller of both ends' largest messages.
  std::string why;                 ///< Which rule chose the transport, naming the end that decided.

  /// "RC, SEND WRITE READ, messages up to 1048576 bytes" (one line, for logs).
  std::string summary() const {
    std::string s = type == QpType::rc ? "RC" : "UC";
    s += ", SEND";
    if (contains(ops, SendOp::rdma_write)) s += " WRITE";
    if (contains(ops, SendOp::rdma_read)) s += " READ";
    if (equal_frames) s += ", sends and receives paired frame for frame";
    s += ", messages up to " + std::to_string(max_message) + " bytes";
    return s;
  }
};

namespace detail {
inline std::string offer_transports(Transports t) {
  return t == Transports::rc_uc ? "RC and UC" : t == Transports::rc ? "RC only" : t == Transports::uc ? "UC only" : "no transport";
}
inline std::string offer_who(const LinkOffer& o) {
  std::string s(o.device.view());
  if (o.platform == Platform::apple) s += " (Apple's Thunderbolt driver)";
  return s;
}
} // namespace detail

/// What one link uses, from both ends' offers: RC when both offer it, else UC when both do;
/// the operations both execute on it; frame pairing when either counts frames; the smaller
/// largest message. The choice is symmetric (both ends reach the same one); only `why`, which
/// names the end that decided, is worded from this side. Errors: `unsupported` at
/// Step::configure when the two ends share no transport, naming both offers.
[[nodiscard]] inline Result<LinkAgreement> agree(const LinkOffer& mine, const LinkOffer& theirs) {
  LinkAgreement a;
  const auto both = static_cast<Transports>(static_cast<unsigned>(mine.transports) & static_cast<unsigned>(theirs.transports));
  const std::string here = "this end's " + detail::offer_who(mine) + " runs " + detail::offer_transports(mine.transports);
  const std::string there = "the peer's " + detail::offer_who(theirs) + " runs " + detail::offer_transports(theirs.transports);
  if (has(both, Transports::rc)) {
    a.type = QpType::rc;
    a.why = "both ends run RC";
  } else if (has(both, Transports::uc)) {
    a.type = QpType::uc;
    a.why = !has(theirs.transports, Transports::rc) && has(mine.transports, Transports::rc) ? there
            : !has(mine.transports, Transports::rc) && has(theirs.transports, Transports::rc) ? here
                                                                                               : "both ends run UC only";
  } else {
    return fail(Error::make(Step::configure, ErrorKind::unsupported,
                            "no transport both ends of the link run: " + here + ", " + there));
  }
  a.ops = mine.ops & theirs.ops & (a.type == QpType::rc ? SendOps::reliable_connected : SendOps::unreliable_connected);
  a.equal_frames = mine.depth_unit == DepthUnit::frames || theirs.depth_unit == DepthUnit::frames;
  a.max_message = std::min(mine.max_message, theirs.max_message);
  return a;
}

/// `recipe` as the agreement says: its transport, and RDMA WRITE only when both ends execute it.
inline QpRecipe agreed_recipe(QpRecipe recipe, const LinkAgreement& a) {
  recipe.qp_type(a.type);
  recipe.allow_rdma_write(recipe.rdma_write_allowed() && contains(a.ops, SendOp::rdma_write));
  return recipe;
}

TBVERBS_NAMESPACE_END

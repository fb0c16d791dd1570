/// @file gid.hpp
/// GIDs, a snapshot of one port's GID table that keeps every entry's index, and the selection
/// that both the RTR `sgid_index` and the GID advertised to the peer are taken from.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "error.hpp"
#include "loader.hpp"
#include "result.hpp"

#include <arpa/inet.h>

#include <array>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// A 16-byte GID value (an IPv6 address in form).
class Gid {
public:
  /// The all-zero GID (an unset entry).
  constexpr Gid() = default;
  /// From 16 raw bytes, network order.
  constexpr explicit Gid(const std::array<std::uint8_t, 16>& raw) noexcept : raw_(raw) {}
  /// The IPv4-mapped GID "::ffff:a.b.c.d"; `ipv4` in host order (0x0a000001 is 10.0.0.1).
  static constexpr Gid from_ipv4(std::uint32_t ipv4) noexcept {
    std::array<std::uint8_t, 16> r{};
    r[10] = 0xff;
    r[11] = 0xff;
    r[12] = static_cast<std::uint8_t>(ipv4 >> 24);
    r[13] = static_cast<std::uint8_t>(ipv4 >> 16);
    r[14] = static_cast<std::uint8_t>(ipv4 >> 8);
    r[15] = static_cast<std::uint8_t>(ipv4);
    return Gid(r);
  }
  /// Parses IPv6 text ("fe80::1", "::ffff:10.0.0.1"); an error of kind invalid_argument otherwise.
  [[nodiscard]] static Result<Gid> parse(std::string_view text) {
    char buf[INET6_ADDRSTRLEN + 1] = {};
    if (text.size() >= sizeof buf)
      return fail(Error::make(Step::configure, ErrorKind::invalid_argument, "GID text too long"));
    std::memcpy(buf, text.data(), text.size());
    std::array<std::uint8_t, 16> r{};
    if (::inet_pton(AF_INET6, buf, r.data()) != 1)
      return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                              "not an IPv6/GID text: " + std::string(text)));
    return Gid(r);
  }

  /// The raw bytes, network order.
  constexpr const std::array<std::uint8_t, 16>& raw() const noexcept { return raw_; }
  /// True for the all-zero GID (an empty or unset entry).
  constexpr bool is_zero() const noexcept {
    for (auto b : raw_)
      if (b != 0) return false;
    return true;
  }
  /// True for "::ffff:a.b.c.d": the entry a Thunderbolt port publishes once its interface has
  /// an IPv4 address, and the RoCE v2 IPv4 entry on rdma-core NICs.
  constexpr bool is_ipv4_mapped() const noexcept {
    for (int i = 0; i < 10; ++i)
      if (raw_[i] != 0) return false;
    return raw_[10] == 0xff && raw_[11] == 0xff;
  }
  /// True for `fe80::/10`: not routable over the cable (RTR ETIMEDOUT or ENODATA on Thunderbolt).
  constexpr bool is_link_local() const noexcept { return raw_[0] == 0xfe && (raw_[1] & 0xc0) == 0x80; }
  /// The IPv4 address of an IPv4-mapped GID in host order (0 otherwise).
  constexpr std::uint32_t ipv4() const noexcept {
    if (!is_ipv4_mapped()) return 0;
    return (std::uint32_t{raw_[12]} << 24) | (std::uint32_t{raw_[13]} << 16) |
           (std::uint32_t{raw_[14]} << 8) | std::uint32_t{raw_[15]};
  }
  /// IPv6 text ("::ffff:10.0.0.1").
  std::string to_string() const {
    char buf[INET6_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET6, raw_.data(), buf, sizeof buf) == nullptr) return "?";
    return buf;
  }
  /// Equality of the 16 bytes.
  friend constexpr bool operator==(const Gid&, const Gid&) = default;

private:
  std::array<std::uint8_t, 16> raw_{};
};

/// Dotted text of a host-order IPv4 address.
inline std::string ipv4_to_string(std::uint32_t ipv4) {
  return std::to_string(ipv4 >> 24) + "." + std::to_string((ipv4 >> 16) & 0xff) + "." +
         std::to_string((ipv4 >> 8) & 0xff) + "." + std::to_string(ipv4 & 0xff);
}

/// Parses dotted IPv4 text into a host-order address.
[[nodiscard]] inline Result<std::uint32_t> parse_ipv4(std::string_view text) {
  char buf[INET_ADDRSTRLEN + 1] = {};
  in_addr a{};
  if (text.size() < sizeof buf) std::memcpy(buf, text.data(), text.size());
  if (text.size() >= sizeof buf || ::inet_pton(AF_INET, buf, &a) != 1)
    return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                            "not an IPv4 address: " + std::string(text)));
  return static_cast<std::uint32_t>(ntohl(a.s_addr));
}

class GidTable;

/// One chosen GID table entry: port, index and value, made only by a GidTable. A QpRecipe takes
/// its RTR `sgid_index` and the GID it advertises from the same selection, so they cannot differ.
class GidSelection {
public:
  /// The port the entry belongs to.
  std::uint8_t port() const noexcept { return port_; }
  /// The entry's index in the port's GID table (the RTR `sgid_index`).
  int index() const noexcept { return index_; }
  /// The entry's value when it was selected (the GID advertised to the peer).
  const Gid& gid() const noexcept { return gid_; }
  /// Why this entry was chosen, for logs and teaching ("first IPv4-mapped entry").
  std::string_view reason() const noexcept { return reason_; }

  /// Re-reads the entry from the device. An entry that changed or vanished since the table was
  /// read (the IPv4 address was removed or changed, the table was rebuilt) gives `gid_stale`,
  /// so a stale selection is reported instead of used. Tables made from plain entries (tests)
  /// have nothing to re-read and always pass.
  [[nodiscard]] Result<void> revalidate() const {
    if (api_ == nullptr || context_ == nullptr) return {};
    abi::ibv_gid now{};
    const int rc = api_->query_gid(static_cast<abi::ibv_context*>(context_.get()), port_, index_, &now);
    Gid value;
    if (rc == 0) {
      std::array<std::uint8_t, 16> raw{};
      std::memcpy(raw.data(), now.raw, 16);
      value = Gid(raw);
    }
    if (value == gid_) return {};
    Error e = Error::make(Step::revalidate_gid, ErrorKind::gid_stale);
    e.on(device_.view(), port_, index_).from(platform_);
    e.with_detail("GID[" + std::to_string(index_) + "] was " + gid_.to_string() + ", now " +
                  (rc == 0 ? value.to_string() : std::string("unreadable")));
    return fail(e);
  }

private:
  friend class GidTable;
  GidSelection() = default;

  std::uint8_t port_ = 1;
  int index_ = 0;
  Gid gid_;
  std::string_view reason_;
  const detail::VerbsApi* api_ = nullptr;
  std::shared_ptr<void> context_;
  detail::FixedString<64> device_;
  Platform platform_ = Platform::any;
};

/// A snapshot of one port's whole GID table (length from the port: 1024 on Thunderbolt), keeping
/// every entry's index. Entries that could not be read are kept as zero GIDs (holes).
class GidTable {
public:
  /// A table from plain entries, index = position (for tests and tools).
  static GidTable from_entries(std::uint8_t port, std::vector<Gid> entries, Platform platform = Platform::any,
                               std::string_view device = {}) {
    GidTable t;
    t.port_ = port;
    t.entries_ = std::move(entries);
    t.platform_ = platform;
    t.device_.assign(device);
    return t;
  }
  /// Reads `length` entries of `port` through `api`. Used by Context::gid_table().
  static GidTable read(const detail::VerbsApi& api, std::shared_ptr<void> context, std::uint8_t port,
                       int length, Platform platform, std::string_view device) {
    GidTable t = from_entries(port, {}, platform, device);
    t.entries_.resize(static_cast<std::size_t>(length > 0 ? length : 0));
    for (int i = 0; i < length; ++i) {
      abi::ibv_gid g{};
      if (api.query_gid(static_cast<abi::ibv_context*>(context.get()), port, i, &g) == 0) {
        std::array<std::uint8_t, 16> raw{};
        std::memcpy(raw.data(), g.raw, 16);
        t.entries_[static_cast<std::size_t>(i)] = Gid(raw);
      }
    }
    t.api_ = &api;
    t.context_ = std::move(context);
    return t;
  }

  /// The port this table belongs to.
  std::uint8_t port() const noexcept { return port_; }
  /// The table length (the port's gid_tbl_len).
  std::size_t size() const noexcept { return entries_.size(); }
  /// All entries; the position is the GID index.
  std::span<const Gid> entries() const noexcept { return entries_; }
  /// The entry at `index` (zero GID when out of range).
  Gid at(int index) const noexcept {
    return index >= 0 && static_cast<std::size_t>(index) < entries_.size() ? entries_[static_cast<std::size_t>(index)]
                                                                           : Gid();
  }

  /// The first IPv4-mapped entry: what a Thunderbolt port needs. Fails with `no_ipv4_gid`, saying
  /// which entries exist (only `fe80::` means the interface has no IPv4 address).
  [[nodiscard]] Result<GidSelection> first_ipv4_mapped() const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].is_ipv4_mapped() && entries_[i].ipv4() != 0)
        return make_selection(static_cast<int>(i), "first IPv4-mapped entry");
    return fail(no_usable("no IPv4-mapped GID"));
  }

  /// The IPv4-mapped entry for `ipv4` (host order): the address of the interface the bootstrap
  /// socket uses, so that the GID and the cable agree. Fails with `gid_not_found`.
  [[nodiscard]] Result<GidSelection> matching_ipv4(std::uint32_t ipv4) const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].is_ipv4_mapped() && entries_[i].ipv4() == ipv4)
        return make_selection(static_cast<int>(i), "entry matching the bootstrap IPv4 address");
    Error e = no_usable("no GID for " + ipv4_to_string(ipv4));
    e.kind = ErrorKind::gid_not_found;
    return fail(e);
  }

  /// An explicit index from the operator, still validated: in range, not empty, and on Apple's
  /// driver IPv4-mapped. Fails with `gid_index_invalid` saying why.
  [[nodiscard]] Result<GidSelection> at_index(int index) const {
    auto bad = [&](const std::string& why) {
      Error e = Error::make(Step::select_gid, ErrorKind::gid_index_invalid,
                            "GID index " + std::to_string(index) + " " + why + "; " + summary());
      e.on(device_.view(), port_, index).from(platform_);
      return fail(e);
    };
    if (index < 0 || static_cast<std::size_t>(index) >= entries_.size())
      return bad("is outside the table (length " + std::to_string(entries_.size()) + ")");
    const Gid& g = entries_[static_cast<std::size_t>(index)];
    if (g.is_zero()) return bad("is an empty entry");
    if (platform_ == Platform::apple && !g.is_ipv4_mapped())
      return bad("is " + g.to_string() + ", not an IPv4-mapped entry (Thunderbolt RTR would fail)");
    return make_selection(index, "operator override");
  }

  /// The selection tbverbs makes by default: `TBVERBS_GID_INDEX` when set (validated), else the
  /// entry matching `bootstrap_ipv4` when given, else the first IPv4-mapped entry.
  [[nodiscard]] Result<GidSelection> select(std::optional<std::uint32_t> bootstrap_ipv4 = std::nullopt) const {
    if (const char* env = std::getenv("TBVERBS_GID_INDEX"); env != nullptr && *env != '\0') {
      int index = -1;
      const std::string_view s(env);
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), index);
      if (ec != std::errc() || p != s.data() + s.size()) {
        Error e = Error::make(Step::configure, ErrorKind::gid_index_invalid,
                              "TBVERBS_GID_INDEX=\"" + std::string(s) + "\" is not a number");
        return fail(e.on(device_.view(), port_).from(platform_));
      }
      return at_index(index);
    }
    if (bootstrap_ipv4) return matching_ipv4(*bootstrap_ipv4);
    return first_ipv4_mapped();
  }

  /// One line describing the populated entries, e.g. "GID[0]=fe80::1 GID[1]=::ffff:10.0.0.1".
  std::string summary() const {
    std::string s;
    int shown = 0, populated = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].is_zero()) continue;
      ++populated;
      if (shown < 8) {
        s += (shown ? " " : "") + ("GID[" + std::to_string(i) + "]=" + entries_[i].to_string());
        ++shown;
      }
    }
    if (populated == 0) return "the GID table (length " + std::to_string(entries_.size()) + ") is empty";
    if (populated > shown) s += " (+" + std::to_string(populated - shown) + " more)";
    return s;
  }

private:
  Result<GidSelection> make_selection(int index, std::string_view reason) const {
    GidSelection s;
    s.port_ = port_;
    s.index_ = index;
    s.gid_ = entries_[static_cast<std::size_t>(index)];
    s.reason_ = reason;
    s.api_ = api_;
    s.context_ = context_;
    s.device_ = device_;
    s.platform_ = platform_;
    return s;
  }
  Error no_usable(const std::string& what) const {
    bool only_link_local = true, any = false;
    for (const Gid& g : entries_) {
      if (g.is_zero()) continue;
      any = true;
      if (!g.is_link_local()) only_link_local = false;
    }
    std::string why = what + ": " + summary();
    if (!any || only_link_local)
      why += " (only fe80:: entries: the interface behind this port has no IPv4 address)";
    Error e = Error::make(Step::select_gid, ErrorKind::no_ipv4_gid, why);
    e.on(device_.view(), port_).from(platform_);
    return e;
  }

  std::uint8_t port_ = 1;
  std::vector<Gid> entries_;
  Platform platform_ = Platform::any;
  detail::FixedString<64> device_;
  const detail::VerbsApi* api_ = nullptr;
  std::shared_ptr<void> context_;
};

TBVERBS_NAMESPACE_END

/// @file gid.hpp
/// GIDs, a snapshot of one port's GID table that keeps every entry's index, and the selection
/// that both the RTR `sgid_index` and the GID advertised to the peer are taken from.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/decimal.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "loader.hpp"
#include "result.hpp"
#include "types.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iosfwd>
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
    // inet_pton stops at a NUL: "fe80::1\0junk" would pass as fe80::1.
    if (text.find('\0') != std::string_view::npos)
      return fail(Error::make(Step::configure, ErrorKind::invalid_argument, "GID text with a NUL character"));
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

/// IPv6 text of `g` ("::ffff:10.0.0.1"), as `g.to_string()`.
inline std::string to_string(const Gid& g) { return g.to_string(); }
/// Prints the IPv6 text of `g`.
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, const Gid& g) {
  return os << g.to_string();
}

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

/// One entry of a port's GID table as tbverbs read it: value, type and netdev, where known.
struct GidEntry {
  Gid gid;                         ///< The value (zero: an empty entry).
  GidType type = GidType::unknown; ///< RoCE v1, RoCE v2 or IB; unknown without a type source.
  std::string netdev;              ///< The Ethernet interface behind a RoCE entry ("" when unknown).
};

/// The port facts a GID table keeps next to its entries (from `ibv_query_port`), so that a
/// selection knows how to address: by GID with a GRH (RoCE, Thunderbolt) or by LID (InfiniBand).
struct GidPortFacts {
  LinkLayer link_layer = LinkLayer::unspecified; ///< Link layer of the port.
  std::uint16_t lid = 0;                         ///< The port's LID (0: RoCE, or no subnet manager on InfiniBand).
  Mtu active_mtu = Mtu::mtu1024;                 ///< The port's active MTU.
  bool known = false;                            ///< False when the port could not be queried.
};

/// One chosen GID table entry: port, index and value, made only by a GidTable. A QpRecipe takes
/// its RTR `sgid_index` and the GID it advertises from the same selection, so they cannot differ.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto gid
/// \until gid.error()
/// \skipline QpRecipe::for_platform
class GidSelection {
public:
  /// The port the entry belongs to.
  std::uint8_t port() const noexcept { return port_; }
  /// The entry's index in the port's GID table (the RTR `sgid_index`).
  int index() const noexcept { return index_; }
  /// The entry's value when it was selected (the GID advertised to the peer).
  const Gid& gid() const noexcept { return gid_; }
  /// The entry's type (RoCE v1/v2, IB), GidType::unknown where the platform publishes none.
  GidType type() const noexcept { return type_; }
  /// The netdev behind the entry ("" when unknown, and on InfiniBand and Thunderbolt).
  std::string_view netdev() const noexcept { return netdev_.view(); }
  /// The port's link layer, LID and active MTU when the table was read.
  const GidPortFacts& port_facts() const noexcept { return facts_; }
  /// True on an InfiniBand port: the peer is addressed by LID, with a GRH only across subnets.
  bool is_infiniband() const noexcept { return facts_.link_layer == LinkLayer::infiniband; }
  /// Why this entry was chosen, naming the rule ("first RoCE v2 IPv4 entry").
  std::string_view reason() const noexcept { return reason_; }
  /// "GID[3] ::ffff:10.0.0.1 RoCE v2 netdev eth0": index, value, type and netdev where known,
  /// as set-up lines and `show_gids` name an entry (on InfiniBand also the port's LID).
  std::string describe() const {
    std::string s = "GID[" + std::to_string(index_) + "] " + gid_.to_string();
    if (type_ != GidType::unknown) s += " " + std::string(gid_type_name(type_));
    if (!netdev_.empty()) s += " netdev " + std::string(netdev_.view());
    if (is_infiniband()) s += " LID " + std::to_string(facts_.lid);
    return s;
  }

  /// Re-reads the entry from the device. An entry that changed or vanished since the table was
  /// read (the IPv4 address was removed or changed, the table was rebuilt) gives `gid_stale`,
  /// so a stale selection is reported instead of used. Tables made from plain entries (tests)
  /// have nothing to re-read and always pass.
  [[nodiscard]] Result<void> revalidate() const {
    if (api_ == nullptr || context_ == nullptr) return {};
    abi::ibv_gid now{};
    const int rc = api_->query_gid(context_.get(), port_, index_, &now);
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
  GidType type_ = GidType::unknown;
  detail::FixedString<32> netdev_;
  GidPortFacts facts_;
  std::string_view reason_;
  const detail::VerbsApi* api_ = nullptr;
  detail::Kept<abi::ibv_context> context_;
  detail::FixedString<64> device_;
  Platform platform_ = Platform::any;
};

/// "GID[1] ::ffff:10.0.0.1 RoCE v2 netdev eth0", as `s.describe()`.
inline std::string to_string(const GidSelection& s) { return s.describe(); }
/// Prints `s.describe()`.
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, const GidSelection& s) {
  return os << s.describe();
}

/// A snapshot of one port's whole GID table (length from the port: 1024 on Thunderbolt), keeping
/// every entry's index, its type and netdev where the platform says them, and the port's link
/// layer, LID and active MTU. Entries that could not be read are kept as zero GIDs (holes).
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto table
/// \until gid.error()
class GidTable {
public:
  /// A table from plain entries, index = position, types unknown (for tests and tools).
  static GidTable from_entries(std::uint8_t port, std::vector<Gid> entries, Platform platform = Platform::any,
                               std::string_view device = {}) {
    GidTable t;
    t.port_ = port;
    t.entries_ = std::move(entries);
    t.types_.assign(t.entries_.size(), GidType::unknown);
    t.netdevs_.assign(t.entries_.size(), std::string());
    t.platform_ = platform;
    t.device_.assign(device);
    return t;
  }
  /// A table from typed entries (index = position) and port facts: how tests describe an mlx5
  /// RoCE port (each address as a RoCE v1 and a RoCE v2 entry) or an InfiniBand port.
  static GidTable from_typed_entries(std::uint8_t port, std::vector<GidEntry> entries,
                                     Platform platform = Platform::rdma_core, std::string_view device = {},
                                     GidPortFacts facts = {}) {
    GidTable t = from_entries(port, {}, platform, device);
    for (auto& e : entries) {
      t.entries_.push_back(e.gid);
      t.types_.push_back(e.type);
      t.netdevs_.push_back(std::move(e.netdev));
    }
    t.facts_ = facts;
    t.type_source_ = "given";
    return t;
  }
  /// Reads `length` entries of `port` through `api`, then the port facts (`query_port`) and,
  /// except on Apple's driver (which publishes no types), each entry's type and netdev from the
  /// first source that answers: `_ibv_query_gid_table`, `_ibv_query_gid_ex`,
  /// `ibv_query_gid_type` (all optional symbols), then sysfs `gid_attrs/types/N` and
  /// `gid_attrs/ndevs/N` under the device's ibdev_path (Linux; fails soft). Used by
  /// Context::gid_table().
  static GidTable read(const detail::VerbsApi& api, detail::Kept<abi::ibv_context> context, std::uint8_t port,
                       int length, Platform platform, std::string_view device) {
    GidTable t = from_entries(port, {}, platform, device);
    const std::size_t n = static_cast<std::size_t>(length > 0 ? length : 0);
    t.entries_.resize(n);
    t.types_.assign(n, GidType::unknown);
    t.netdevs_.assign(n, std::string());
    abi::ibv_context* ctx = context.get();
    for (int i = 0; i < length; ++i) {
      abi::ibv_gid g{};
      if (api.query_gid(ctx, port, i, &g) == 0) {
        std::array<std::uint8_t, 16> raw{};
        std::memcpy(raw.data(), g.raw, 16);
        t.entries_[static_cast<std::size_t>(i)] = Gid(raw);
      }
    }
    abi::ibv_port_attr pa;
    std::memset(&pa, 0, sizeof pa);
    if (api.query_port(ctx, port, &pa) == 0) {
      t.facts_.link_layer = static_cast<LinkLayer>(pa.link_layer);
      t.facts_.lid = pa.lid;
      const int m = static_cast<int>(pa.active_mtu);
      t.facts_.active_mtu = m >= 1 && m <= 5 ? static_cast<Mtu>(m) : Mtu::mtu1024;
      t.facts_.known = true;
    }
    if (platform != Platform::apple) t.read_types(api, ctx, device);
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
    return in_range(index) ? entries_[static_cast<std::size_t>(index)] : Gid();
  }
  /// The type of the entry at `index` (unknown when out of range or not known).
  GidType type_at(int index) const noexcept {
    return in_range(index) ? types_[static_cast<std::size_t>(index)] : GidType::unknown;
  }
  /// The netdev of the entry at `index` ("" when out of range or not known).
  std::string_view netdev_at(int index) const noexcept {
    return in_range(index) ? std::string_view(netdevs_[static_cast<std::size_t>(index)]) : std::string_view();
  }
  /// The port's link layer, LID and active MTU when the table was read.
  const GidPortFacts& port_facts() const noexcept { return facts_; }
  /// Where the entry types came from: "_ibv_query_gid_table", "_ibv_query_gid_ex",
  /// "ibv_query_gid_type", "sysfs", "given" (from_typed_entries) or "none".
  std::string_view type_source() const noexcept { return type_source_; }
  /// True when at least one entry's type is known.
  bool has_types() const noexcept {
    for (GidType t : types_)
      if (t != GidType::unknown) return true;
    return false;
  }
  /// True for an InfiniBand port: link layer InfiniBand, or (old kernels report 0) a port with a
  /// LID, IB-typed or untyped entries and no IPv4-mapped one.
  bool is_infiniband() const noexcept {
    if (facts_.link_layer == LinkLayer::infiniband) return true;
    if (facts_.link_layer != LinkLayer::unspecified || !facts_.known || facts_.lid == 0) return false;
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (!entries_[i].is_zero() && (entries_[i].is_ipv4_mapped() || types_[i] == GidType::roce_v1 ||
                                     types_[i] == GidType::roce_v2))
        return false;
    return true;
  }

  /// The first IPv4-mapped entry: what a Thunderbolt port needs. Fails with `no_ipv4_gid`, saying
  /// which entries exist (only `fe80::` means the interface has no IPv4 address).
  [[nodiscard]] Result<GidSelection> first_ipv4_mapped() const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].is_ipv4_mapped() && entries_[i].ipv4() != 0)
        return make_selection(static_cast<int>(i), "first IPv4-mapped entry");
    return fail(no_usable({})); // the kind says "no IPv4-mapped GID"; the detail lists the entries
  }

  /// The IPv4-mapped entry for `ipv4` (host order): the address of the interface the bootstrap
  /// socket uses, so that the GID and the cable agree. Where the address has several entries
  /// (RoCE v1 and v2 on mlx5), the RoCE v2 one. Fails with `gid_not_found`.
  [[nodiscard]] Result<GidSelection> matching_ipv4(std::uint32_t ipv4) const {
    int found = -1;
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].is_ipv4_mapped() && entries_[i].ipv4() == ipv4) {
        if (found < 0 || types_[i] == GidType::roce_v2) found = static_cast<int>(i);
        if (types_[i] == GidType::roce_v2) break;
      }
    if (found >= 0) return make_selection(found, "entry matching the bootstrap IPv4 address");
    Error e = no_usable("the address is " + ipv4_to_string(ipv4));
    e.kind = ErrorKind::gid_not_found;
    return fail(e);
  }

  /// An explicit index from the operator, still validated: in range, not empty, and on Apple's
  /// driver IPv4-mapped. On rdma-core any populated entry is accepted, a RoCE v1 one included
  /// (the operator asked for it). Fails with `gid_index_invalid` saying why.
  [[nodiscard]] Result<GidSelection> at_index(int index) const {
    auto bad = [&](const std::string& why) {
      Error e = Error::make(Step::select_gid, ErrorKind::gid_index_invalid,
                            "GID index " + std::to_string(index) + " " + why + "; " + summary());
      e.on(device_.view(), port_, index).from(platform_);
      return fail(e);
    };
    if (!in_range(index)) return bad("is outside the table (length " + std::to_string(entries_.size()) + ")");
    const Gid& g = entries_[static_cast<std::size_t>(index)];
    if (g.is_zero()) return bad("is an empty entry");
    if (platform_ == Platform::apple && !g.is_ipv4_mapped())
      return bad("is " + g.to_string() + ", not an IPv4-mapped entry (Thunderbolt RTR would fail)");
    return make_selection(index, types_[static_cast<std::size_t>(index)] == GidType::roce_v1
                                     ? "operator override (TBVERBS_GID_INDEX), a RoCE v1 entry"
                                     : "operator override");
  }

  /// The RoCE entry of version `want` (GidType::roce_v2 unless the fabric is set up for v1), by
  /// the rules NCCL, UCX and perftest follow: the entry matching `bootstrap_ipv4` (the bootstrap
  /// socket's local address), else the first IPv4-mapped entry, else a non-link-local IPv6
  /// entry. A table without any types (an old provider, no sysfs) takes untyped entries by the
  /// same rules. Fails with `no_ipv4_gid`, naming every entry with its type.
  [[nodiscard]] Result<GidSelection> roce(GidType want = GidType::roce_v2,
                                          std::optional<std::uint32_t> bootstrap_ipv4 = std::nullopt) const {
    const bool typed = has_types();
    auto fits = [&](std::size_t i) { return !entries_[i].is_zero() && (typed ? types_[i] == want : true); };
    const bool v1 = want == GidType::roce_v1;
    if (bootstrap_ipv4)
      for (std::size_t i = 0; i < entries_.size(); ++i)
        if (fits(i) && entries_[i].is_ipv4_mapped() && entries_[i].ipv4() == *bootstrap_ipv4)
          return make_selection(static_cast<int>(i), !typed ? "entry matching the bootstrap IPv4 address (GID types unknown)"
                                                     : v1   ? "RoCE v1 entry matching the bootstrap IPv4 address (TBVERBS_ROCE_VERSION=1)"
                                                            : "RoCE v2 entry matching the bootstrap IPv4 address");
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (fits(i) && entries_[i].is_ipv4_mapped() && entries_[i].ipv4() != 0)
        return make_selection(static_cast<int>(i), !typed ? "first IPv4-mapped entry (GID types unknown)"
                                                   : v1   ? "first RoCE v1 IPv4 entry (TBVERBS_ROCE_VERSION=1)"
                                                          : "first RoCE v2 IPv4 entry");
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (fits(i) && !entries_[i].is_ipv4_mapped() && !entries_[i].is_link_local())
        return make_selection(static_cast<int>(i), !typed ? "first global IPv6 entry (no IPv4 entry; GID types unknown)"
                                                   : v1   ? "first RoCE v1 IPv6 entry (no IPv4 entry; TBVERBS_ROCE_VERSION=1)"
                                                          : "RoCE v2 IPv6 entry (no RoCE v2 IPv4 entry)");
    std::string what = typed ? "no " + std::string(gid_type_name(want)) + " GID with an IPv4 or global IPv6 address"
                             : "no IPv4-mapped or global IPv6 GID";
    if (typed && !v1)
      for (std::size_t i = 0; i < entries_.size(); ++i)
        if (types_[i] == GidType::roce_v1 && !entries_[i].is_link_local() && !entries_[i].is_zero()) {
          what += " (RoCE v1 entries exist: set TBVERBS_ROCE_VERSION=1 only if the whole fabric runs RoCE v1)";
          break;
        }
    return fail(no_usable(what));
  }

  /// The InfiniBand port GID (subnet prefix + port GUID, normally index 0): on InfiniBand the peer
  /// is addressed by LID, and the GID only matters across subnets (a GRH). Fails with
  /// `no_ipv4_gid`'s kind only when the table is empty.
  [[nodiscard]] Result<GidSelection> infiniband_port_gid() const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (!entries_[i].is_zero())
        return make_selection(static_cast<int>(i), "InfiniBand port GID (addressing by LID)");
    return fail(no_usable("no port GID"));
  }

  /// The selection tbverbs makes by default: the operator's `TBVERBS_GID_INDEX` for this device and
  /// port when it names one (env_override()), else select_automatic(). The selection's reason names
  /// the rule.
  [[nodiscard]] Result<GidSelection> select(std::optional<std::uint32_t> bootstrap_ipv4 = std::nullopt) const {
    auto forced = env_override(bootstrap_ipv4);
    if (!forced) return fail(forced.error());
    if (*forced) return std::move(**forced);
    return select_automatic(bootstrap_ipv4);
  }

  /// What `TBVERBS_GID_INDEX` asks for on this table's device and port, validated as at_index()
  /// does; an empty optional when it is unset or names other devices only. Two forms:
  /// `TBVERBS_GID_INDEX=3` (every device and port, as `NCCL_IB_GID_INDEX`), or a comma list of
  /// `DEVICE:INDEX` and `DEVICE:PORT:INDEX` entries, e.g. `mlx5_0:3,mlx5_1:1:5` (devices not listed
  /// take select_automatic()). A malformed value is an error naming the syntax. When the caller
  /// passed the bootstrap socket's address, this table has an entry for it, and the index selects
  /// an IPv4-mapped entry of another address, the two explicit choices disagree: an error, never a
  /// silent override.
  [[nodiscard]] Result<std::optional<GidSelection>> env_override(
      std::optional<std::uint32_t> bootstrap_ipv4 = std::nullopt) const {
    const char* env = std::getenv("TBVERBS_GID_INDEX");
    if (env == nullptr || *env == '\0') return std::optional<GidSelection>{};
    const std::string_view all(env);
    auto malformed = [&](std::string_view why) {
      Error e = Error::make(Step::configure, ErrorKind::gid_index_invalid,
                            "TBVERBS_GID_INDEX=\"" + std::string(all) + "\" " + std::string(why) +
                                " (the form is INDEX, or DEVICE:INDEX and DEVICE:PORT:INDEX entries separated by "
                                "commas, e.g. mlx5_0:3,mlx5_1:1:5)");
      return fail(e.on(device_.view(), port_).from(platform_));
    };
    // Negative numbers parse: at_index() then says they are outside the table.
    auto number = [](std::string_view t, int& out) {
      const bool negative = !t.empty() && t.front() == '-';
      const auto v = detail::parse_decimal(negative ? t.substr(1) : t, 0x7fffffff);
      if (v) out = negative ? -static_cast<int>(*v) : static_cast<int>(*v);
      return v.has_value();
    };
    int index = -1;
    bool listed = false;
    if (all.find(':') == std::string_view::npos) {
      if (!number(all, index)) return malformed("is not a number");
    } else {
      if (all.back() == ',' || all.front() == ',' || all.find(",,") != std::string_view::npos)
        return malformed("has an empty entry");
      for (std::string_view rest = all; !rest.empty();) {
        const std::size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        const std::size_t c1 = item.find(':'), c2 = item.rfind(':');
        if (c1 == 0 || c1 == std::string_view::npos) return malformed("has an entry without a device");
        int port = -1, value = -1;
        if (!number(item.substr(c2 + 1), value)) return malformed("has an entry whose index is not a number");
        if (c2 != c1 && (!number(item.substr(c1 + 1, c2 - c1 - 1), port) || port < 1 || port > 255))
          return malformed("has an entry whose port is not a number from 1 to 255");
        if (item.substr(0, c1) == device_.view() && (port < 0 || port == port_) && !listed) {
          index = value;
          listed = true;
        }
      }
      if (!listed) return std::optional<GidSelection>{}; // this device (and port) is not listed
    }
    auto chosen = at_index(index);
    if (!chosen) return fail(chosen.error());
    if (bootstrap_ipv4 && chosen->gid().is_ipv4_mapped() && chosen->gid().ipv4() != *bootstrap_ipv4)
      if (auto there = matching_ipv4(*bootstrap_ipv4)) {
          const int i = there->index();
          Error e = Error::make(Step::configure, ErrorKind::gid_index_invalid,
                                "TBVERBS_GID_INDEX selects GID[" + std::to_string(index) + "] " +
                                    chosen->gid().to_string() + ", but the bootstrap address " +
                                    ipv4_to_string(*bootstrap_ipv4) + " is GID[" + std::to_string(i) +
                                    "] of the same port: two explicit choices disagree (name the device in "
                                    "TBVERBS_GID_INDEX, e.g. " + std::string(device_.view()) + ":" +
                                    std::to_string(i) + ", or unset it)");
          return fail(e.on(device_.view(), port_, index).from(platform_));
        }
    return std::optional<GidSelection>(std::move(*chosen));
  }

  /// The rules without `TBVERBS_GID_INDEX` (for a program the operator must not steer). On Apple's
  /// driver: the entry matching `bootstrap_ipv4` when given, else the first IPv4-mapped entry. On
  /// InfiniBand: the port GID. On RoCE: roce() with the version of `TBVERBS_ROCE_VERSION` (2 when
  /// unset; 1 only when asked), so the RoCE v2 entry matching `bootstrap_ipv4`, else the first RoCE
  /// v2 IPv4 entry, else a RoCE v2 global IPv6 entry.
  [[nodiscard]] Result<GidSelection> select_automatic(std::optional<std::uint32_t> bootstrap_ipv4 = std::nullopt) const {
    if (platform_ == Platform::apple) {
      if (bootstrap_ipv4) return matching_ipv4(*bootstrap_ipv4);
      return first_ipv4_mapped();
    }
    if (is_infiniband()) return infiniband_port_gid();
    GidType want = GidType::roce_v2;
    if (const char* env = std::getenv("TBVERBS_ROCE_VERSION"); env != nullptr && *env != '\0') {
      const std::string_view v(env);
      if (v == "1") want = GidType::roce_v1;
      else if (v != "2") {
        Error e = Error::make(Step::configure, ErrorKind::invalid_argument,
                              "TBVERBS_ROCE_VERSION=\"" + std::string(v) + "\" must be 1 or 2");
        return fail(e.on(device_.view(), port_).from(platform_));
      }
    }
    return roce(want, bootstrap_ipv4);
  }

  /// One line describing the populated entries, e.g. "GID[0]=fe80::1 (RoCE v1) GID[1]=fe80::1
  /// (RoCE v2) GID[3]=::ffff:10.0.0.1 (RoCE v2)": types where known.
  std::string summary() const {
    std::string s;
    int shown = 0, populated = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].is_zero()) continue;
      ++populated;
      if (shown < 8) {
        s += (shown ? " " : "") + ("GID[" + std::to_string(i) + "]=" + entries_[i].to_string());
        if (types_[i] != GidType::unknown) s += " (" + std::string(gid_type_name(types_[i])) + ")";
        ++shown;
      }
    }
    if (populated == 0) return "the GID table (length " + std::to_string(entries_.size()) + ") is empty";
    if (populated > shown) s += " (+" + std::to_string(populated - shown) + " more)";
    return s;
  }

private:
  bool in_range(int index) const noexcept {
    return index >= 0 && static_cast<std::size_t>(index) < entries_.size();
  }
  static GidType type_of_abi(std::uint32_t t) noexcept {
    return t == 0 ? GidType::ib : t == 1 ? GidType::roce_v1 : t == 2 ? GidType::roce_v2 : GidType::unknown;
  }
  // The sysfs strings ("IB/RoCE v1" names both IB and RoCE v1: the link layer tells them apart).
  GidType type_of_sysfs(bool v2) const noexcept {
    return v2 ? GidType::roce_v2 : facts_.link_layer == LinkLayer::infiniband ? GidType::ib : GidType::roce_v1;
  }

  void read_types(const detail::VerbsApi& api, abi::ibv_context* ctx, std::string_view device) {
    using detail::GidEntryAbi;
    const std::size_t n = entries_.size();
    auto netdev_of_ifindex = [](std::uint32_t ifindex) {
      char name[IF_NAMESIZE + 1] = {};
      return ifindex != 0 && ::if_indextoname(ifindex, name) != nullptr ? std::string(name) : std::string();
    };
    if (api.query_gid_table != nullptr) {
      // One call for every port of the device: room for a few ports' worth, then more once.
      for (std::size_t room : {n * 4 + 16, n * 32 + 64}) {
        std::vector<GidEntryAbi> buf(room);
        const ssize_t got = api.query_gid_table(ctx, buf.data(), buf.size(), 0, sizeof(GidEntryAbi));
        if (got < 0) continue;
        for (std::size_t k = 0; k < static_cast<std::size_t>(got) && k < buf.size(); ++k) {
          const GidEntryAbi& e = buf[k];
          if (e.port_num != port_ || e.gid_index >= n) continue;
          types_[e.gid_index] = type_of_abi(e.gid_type);
          netdevs_[e.gid_index] = netdev_of_ifindex(e.ndev_ifindex);
        }
        type_source_ = "_ibv_query_gid_table";
        break;
      }
    }
    if (type_source_ == "none" && api.query_gid_ex != nullptr) {
      for (std::size_t i = 0; i < n; ++i) {
        if (entries_[i].is_zero()) continue;
        GidEntryAbi e{};
        if (api.query_gid_ex(ctx, port_, static_cast<std::uint32_t>(i), &e, 0, sizeof e) != 0) continue;
        types_[i] = type_of_abi(e.gid_type);
        netdevs_[i] = netdev_of_ifindex(e.ndev_ifindex);
        type_source_ = "_ibv_query_gid_ex";
      }
    }
    if (type_source_ == "none" && api.query_gid_type != nullptr) {
      for (std::size_t i = 0; i < n; ++i) {
        int t = -1;
        if (entries_[i].is_zero() || api.query_gid_type(ctx, port_, static_cast<unsigned>(i), &t) != 0) continue;
        if (t == 0 || t == 1) {
          types_[i] = type_of_sysfs(t == 1);
          type_source_ = "ibv_query_gid_type";
        }
      }
    }
#if defined(__linux__)
    // sysfs, as show_gids reads it: the types where no verb gave them, the netdevs where the
    // verbs gave no interface index. Optional: a missing directory or file changes nothing.
    std::string dir;
    if (ctx != nullptr && ctx->device != nullptr && ctx->device->ibdev_path[0] != '\0')
      dir.assign(ctx->device->ibdev_path, ::strnlen(ctx->device->ibdev_path, sizeof ctx->device->ibdev_path));
    else if (!device.empty())
      dir = "/sys/class/infiniband/" + std::string(device);
    if (dir.empty()) return;
    const std::string base = dir + "/ports/" + std::to_string(port_) + "/gid_attrs/";
    for (std::size_t i = 0; i < n; ++i) {
      if (entries_[i].is_zero()) continue;
      if (types_[i] == GidType::unknown) {
        const std::string t = read_small_file(base + "types/" + std::to_string(i));
        if (t == "RoCE v2" || t == "IB/RoCE v1") {
          types_[i] = type_of_sysfs(t == "RoCE v2");
          type_source_ = "sysfs";
        }
      }
      if (netdevs_[i].empty()) netdevs_[i] = read_small_file(base + "ndevs/" + std::to_string(i));
    }
#else
    (void)device;
#endif
  }
#if defined(__linux__)
  // The first line of a small sysfs file, "" when it cannot be read (POSIX open/read only).
  static std::string read_small_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    char buf[64];
    const ssize_t got = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (got <= 0) return {};
    std::string s(buf, static_cast<std::size_t>(got));
    if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
    return s;
  }
#endif

  Result<GidSelection> make_selection(int index, std::string_view reason) const {
    GidSelection s;
    s.port_ = port_;
    s.index_ = index;
    s.gid_ = entries_[static_cast<std::size_t>(index)];
    s.type_ = types_[static_cast<std::size_t>(index)];
    s.netdev_.assign(netdevs_[static_cast<std::size_t>(index)]);
    s.facts_ = facts_;
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
    std::string why = what.empty() ? summary() : what + ": " + summary();
    if (!any || only_link_local)
      why += " (only fe80:: entries: the interface behind this port has no IPv4 address)";
    Error e = Error::make(Step::select_gid, ErrorKind::no_ipv4_gid, why);
    e.on(device_.view(), port_).from(platform_);
    return e;
  }

  std::uint8_t port_ = 1;
  std::vector<Gid> entries_;
  std::vector<GidType> types_;
  std::vector<std::string> netdevs_;
  GidPortFacts facts_;
  std::string_view type_source_ = "none";
  Platform platform_ = Platform::any;
  detail::FixedString<64> device_;
  const detail::VerbsApi* api_ = nullptr;
  detail::Kept<abi::ibv_context> context_;
};

TBVERBS_NAMESPACE_END

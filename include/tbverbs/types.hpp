/// @file types.hpp
/// Small typed versions of verbs enums and attribute structs, so that callers never pass a
/// bare integer where a QP type, an MTU or an access flag is meant.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// Queue-pair transport type (values of `enum ibv_qp_type`).
enum class QpType : std::uint8_t {
  rc = 2, ///< Reliable connected: retries, acknowledgements. rdma-core NICs; refused by Apple's driver.
  uc = 3, ///< Unreliable connected: the only type Apple's Thunderbolt driver offers.
  ud = 4, ///< Unreliable datagram: not exposed by Apple's driver.
};

/// Path MTU (values of `enum ibv_mtu`).
enum class Mtu : std::uint8_t {
  mtu256 = 1,  ///< 256 bytes.
  mtu512 = 2,  ///< 512 bytes.
  mtu1024 = 3, ///< 1024 bytes: what JACCL and ds4 use on Thunderbolt.
  mtu2048 = 4, ///< 2048 bytes.
  mtu4096 = 5, ///< 4096 bytes.
};

/// The MTU in bytes (0 for an unknown value).
constexpr int mtu_bytes(Mtu m) noexcept {
  const int v = static_cast<int>(m);
  return v >= 1 && v <= 5 ? 128 << v : 0;
}

/// Printable name of a QP type as verbs programs name it ("RC", "UC", "UD"); "unknown QP type"
/// for a value tbverbs does not know.
constexpr std::string_view qp_type_name(QpType t) noexcept {
  switch (t) {
  case QpType::rc: return "RC";
  case QpType::uc: return "UC";
  case QpType::ud: return "UD";
  }
  return "unknown QP type";
}

/// Printable MTU in bytes, as `ibv_devinfo` prints it ("1024"); "unknown MTU" for another code.
constexpr std::string_view mtu_name(Mtu m) noexcept {
  switch (m) {
  case Mtu::mtu256: return "256";
  case Mtu::mtu512: return "512";
  case Mtu::mtu1024: return "1024";
  case Mtu::mtu2048: return "2048";
  case Mtu::mtu4096: return "4096";
  }
  return "unknown MTU";
}

/// Port state (values of `enum ibv_port_state`).
enum class PortState : std::uint8_t {
  nop = 0,          ///< Reserved.
  down = 1,         ///< No link: on Thunderbolt the peer is not RDMA-enabled or no cable.
  init = 2,         ///< Link up, not configured.
  armed = 3,        ///< Configured, not yet active.
  active = 4,       ///< Usable.
  active_defer = 5, ///< Active, deferring.
};

/// Printable name of a port state ("PORT_ACTIVE").
constexpr std::string_view port_state_name(PortState s) noexcept {
  switch (s) {
  case PortState::nop: return "PORT_NOP";
  case PortState::down: return "PORT_DOWN";
  case PortState::init: return "PORT_INIT";
  case PortState::armed: return "PORT_ARMED";
  case PortState::active: return "PORT_ACTIVE";
  case PortState::active_defer: return "PORT_ACTIVE_DEFER";
  }
  return "PORT_UNKNOWN";
}

/// Link layer of a port (`ibv_port_attr::link_layer`).
enum class LinkLayer : std::uint8_t {
  unspecified = 0,   ///< Not reported (InfiniBand on old kernels).
  infiniband = 1,    ///< InfiniBand.
  ethernet = 2,      ///< Ethernet (RoCE).
  thunderbolt = 100, ///< Apple's RDMA over Thunderbolt: `ibv_devinfo` prints "Thunderbolt (100)" (TN3205; mlx PR #4191).
};

/// Printable name of a link layer, as `ibv_devinfo` prints it ("Thunderbolt", "Ethernet",
/// "InfiniBand"); "unspecified" for 0 and "unknown" for a value tbverbs does not know.
constexpr std::string_view link_layer_name(LinkLayer l) noexcept {
  switch (l) {
  case LinkLayer::unspecified: return "unspecified";
  case LinkLayer::infiniband: return "InfiniBand";
  case LinkLayer::ethernet: return "Ethernet";
  case LinkLayer::thunderbolt: return "Thunderbolt";
  }
  return "unknown";
}

/// The type of a GID table entry: which packets a QP whose RTR source is that entry sends
/// (rdma-core's `enum ibv_gid_type` and the sysfs `gid_attrs/types/N` strings).
enum class GidType : std::uint8_t {
  unknown = 0, ///< Not known: no type source (Apple's driver publishes none), or the read failed.
  ib = 1,      ///< InfiniBand (sysfs prints "IB/RoCE v1" on an InfiniBand port).
  roce_v1 = 2, ///< RoCE v1: raw Ethernet frames, not routable across IP subnets.
  roce_v2 = 3, ///< RoCE v2: UDP/IP, routable; what NCCL, UCX and perftest choose by default.
};

/// Printable name of a GID type as `show_gids` and `ibv_devinfo -v` print it ("RoCE v2",
/// "RoCE v1", "IB"); "unknown" when not known.
constexpr std::string_view gid_type_name(GidType t) noexcept {
  switch (t) {
  case GidType::ib: return "IB";
  case GidType::roce_v1: return "RoCE v1";
  case GidType::roce_v2: return "RoCE v2";
  case GidType::unknown: break;
  }
  return "unknown";
}

/// Memory-region access rights (bits of `enum ibv_access_flags`). Combine with `|`.
enum class Access : int {
  none = 0,           ///< Local read only (enough for a buffer that is only sent from).
  local_write = 1,    ///< The NIC may write it locally: needed to receive into it.
  remote_write = 2,   ///< A peer may RDMA WRITE into it.
  remote_read = 4,    ///< A peer may RDMA READ from it.
  remote_atomic = 8,  ///< A peer may run atomics on it.
};
/// Union of access rights.
constexpr Access operator|(Access a, Access b) noexcept {
  return static_cast<Access>(static_cast<int>(a) | static_cast<int>(b));
}
/// True when `have` includes every right of `want`.
constexpr bool includes(Access have, Access want) noexcept {
  return (static_cast<int>(have) & static_cast<int>(want)) == static_cast<int>(want);
}

/// Attributes of one port (`ibv_query_port`).
struct PortAttributes {
  std::uint8_t port = 1;                          ///< Port number.
  PortState state = PortState::nop;               ///< Link state: must be active to use the port.
  Mtu max_mtu = Mtu::mtu1024;                     ///< Largest MTU the port supports.
  Mtu active_mtu = Mtu::mtu1024;                  ///< MTU in use; path MTU must not exceed it.
  int gid_table_length = 0;                       ///< GID table length (1024 on Thunderbolt).
  std::uint16_t lid = 0;                          ///< Local identifier (0 on RoCE and Thunderbolt).
  LinkLayer link_layer = LinkLayer::unspecified;  ///< Link layer.
  std::uint32_t max_msg_sz = 0;                   ///< Largest message (16,773,120 on Thunderbolt: TN3205).
};

/// The device limits tbverbs uses (`ibv_query_device`).
struct DeviceAttributes {
  int max_qp = 0;              ///< Queue pairs per device as reported (11 on Thunderbolt, of which 10 are usable: budget with usable_qps()).
  int max_qp_wr = 0;           ///< Work requests per queue.
  int max_sge = 0;             ///< Scatter-gather entries per work request.
  int max_cq = 0;              ///< Completion queues.
  int max_cqe = 0;             ///< Entries per completion queue.
  int max_mr = 0;              ///< Memory regions (100 per device on Thunderbolt, across the processes of a host).
  std::uint64_t max_mr_size = 0; ///< Largest memory region (16,384,000 bytes on Thunderbolt).
  int phys_port_cnt = 0;       ///< Number of ports.
};

/// Queue capacities of a QP: asked for in a recipe, granted (possibly lower) by the driver.
struct QpCapacities {
  std::uint32_t max_send_wr = 0;     ///< Send queue depth (4 KiB frames on Thunderbolt).
  std::uint32_t max_recv_wr = 0;     ///< Receive queue depth (4 KiB frames on Thunderbolt).
  std::uint32_t max_send_sge = 1;    ///< Scatter-gather entries per send.
  std::uint32_t max_recv_sge = 1;    ///< Scatter-gather entries per receive.
  std::uint32_t max_inline_data = 0; ///< Inline bytes (0: undocumented on Apple's driver).
};

// ---- printing -------------------------------------------------------------------------------
// to_string and operator<< for the enums above: `std::cout << qp.type()` prints "UC". The
// operators are templates on the stream's traits, so this header needs only <iosfwd>; a program
// that prints has <ostream> (or <iostream>) included anyway. std::formatter specialisations are
// in format.hpp.

/// "RC", "UC" or "UD".
inline std::string to_string(QpType t) { return std::string(qp_type_name(t)); }
/// The MTU in bytes: "1024".
inline std::string to_string(Mtu m) { return std::string(mtu_name(m)); }
/// "PORT_ACTIVE", as `ibv_devinfo` prints the state.
inline std::string to_string(PortState s) { return std::string(port_state_name(s)); }
/// "Thunderbolt", "Ethernet", "InfiniBand", as `ibv_devinfo` prints the link layer.
inline std::string to_string(LinkLayer l) { return std::string(link_layer_name(l)); }
/// "RoCE v2", "RoCE v1", "IB" or "unknown".
inline std::string to_string(GidType t) { return std::string(gid_type_name(t)); }

/// Prints qp_type_name(t).
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, QpType t) {
  return os << qp_type_name(t);
}
/// Prints mtu_name(m).
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, Mtu m) {
  return os << mtu_name(m);
}
/// Prints port_state_name(s).
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, PortState s) {
  return os << port_state_name(s);
}
/// Prints link_layer_name(l).
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, LinkLayer l) {
  return os << link_layer_name(l);
}
/// Prints gid_type_name(t).
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, GidType t) {
  return os << gid_type_name(t);
}

TBVERBS_NAMESPACE_END

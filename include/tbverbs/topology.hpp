/// @file topology.hpp
/// Topology discovery: which of a rank's devices faces which peer, found from what the ports
/// publish instead of from a device file. Every Thunderbolt cable is its own point-to-point
/// subnet (a /30 per cable: docs/field-reports.md section 2), so the port of another rank whose
/// IPv4 address is on the same subnet is the one at the other end of the cable. Each rank reads its
/// ports (state, selected IPv4-mapped GID, the interface's netmask where the system knows it),
/// the ranks exchange them over the side channel, and every rank computes the same graph.
///
/// Problems are reported naming both ends: two ports of different ranks on one subnet whose
/// netmasks disagree (asymmetric), three or more ports on one subnet (ambiguous: not one subnet
/// per cable), two ports of one rank on one subnet, a port whose subnet nobody else is on, and a
/// hop of the ring with no cable at all (missing). Cables whose addresses are crossed (the two
/// ends of a physical cable on different subnets) are caught where the driver sees them: RTR
/// toward the discovered peer times out (ETIMEDOUT), and Topology::describe_cable() names both
/// ends for that error.
///
/// Optional, like link.hpp: the core umbrella header does not include it. POSIX only
/// (`getifaddrs`, on macOS and Linux).
#pragma once

#include "side_channel.hpp"
#include "tbverbs.hpp"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// One port of one rank as discovery sees it.
struct PortAddress {
  std::string device;      ///< Device name (rdma_en2).
  std::uint8_t port = 1;   ///< Port number.
  bool usable = false;     ///< Active, with an IPv4-mapped GID selected.
  int gid_index = -1;      ///< The selected GID's index (usable ports).
  std::uint32_t ipv4 = 0;  ///< The selected GID's IPv4 address, host order (usable ports).
  int prefix = 30;         ///< Netmask length of the address: the interface's, else the default.
  bool prefix_known = false; ///< True when the netmask came from the interface (getifaddrs).
  std::string problem;     ///< Why the port is not usable ("PORT_DOWN", "no IPv4-mapped GID").

  /// The subnet of the address under its own netmask.
  std::uint32_t subnet() const noexcept { return prefix <= 0 ? 0 : ipv4 & (~0u << (32 - std::min(prefix, 32))); }
  /// True when `ipv4` is on this port's subnet (under this port's netmask).
  bool contains(std::uint32_t other) const noexcept {
    const std::uint32_t m = prefix <= 0 ? 0 : ~0u << (32 - std::min(prefix, 32));
    return (ipv4 & m) == (other & m);
  }
};

/// How discovery reads the ports.
struct TopologyOptions {
  /// Netmask length assumed when the system does not know the address's interface (the emulator,
  /// or an address the GID table has and the interfaces do not): one /30 per cable, as the docs
  /// recommend. `TBVERBS_SUBNET_PREFIX` overrides it.
  int default_prefix = 30;
};

/// One cable: two ports of two ranks on one subnet.
struct Cable {
  int rank[2] = {-1, -1};         ///< The ranks at its ends (rank[0] < rank[1]).
  std::size_t port[2] = {0, 0};   ///< Index of each end in its rank's Topology::ports().
};

/// The graph of a job's cables, the same on every rank (computed from the ports all ranks sent).
class Topology {
public:
  /// The graph of `ports` (index = rank): pure, for tests and for discover_topology().
  static Topology from_ports(std::vector<std::vector<PortAddress>> ports) {
    Topology t;
    t.ports_ = std::move(ports);
    t.build();
    return t;
  }

  /// Every rank's ports, as they were exchanged.
  const std::vector<std::vector<PortAddress>>& ports() const noexcept { return ports_; }
  /// Every cable found, ordered by (rank, device, port) of its lower end.
  const std::vector<Cable>& cables() const noexcept { return cables_; }
  /// Every problem found, one line each, naming both ends (crossed, asymmetric, ambiguous,
  /// alone). Not all are fatal: a port nobody faces may be a spare cable.
  const std::vector<std::string>& problems() const noexcept { return problems_; }
  /// Number of ranks.
  int size() const noexcept { return static_cast<int>(ports_.size()); }

  /// The cables between ranks `a` and `b`, in the same order on every rank.
  std::vector<Cable> between(int a, int b) const {
    std::vector<Cable> out;
    for (const Cable& c : cables_)
      if ((c.rank[0] == a && c.rank[1] == b) || (c.rank[0] == b && c.rank[1] == a)) out.push_back(c);
    return out;
  }
  /// The device of `rank` on cable `c`.
  const PortAddress& end(const Cable& c, int rank) const {
    const int k = c.rank[0] == rank ? 0 : 1;
    return ports_[static_cast<std::size_t>(c.rank[k])][c.port[k]];
  }

  /// "rank 0 rdma_en2 (10.99.0.1/30) <-> rank 1 rdma_en1 (10.99.0.2/30)".
  std::string describe_cable(const Cable& c) const {
    return describe_end(c.rank[0], c.port[0]) + " <-> " + describe_end(c.rank[1], c.port[1]);
  }
  /// "rank 0 rdma_en2 (10.99.0.1/30)".
  std::string describe_end(int rank, std::size_t port) const {
    const PortAddress& p = ports_[static_cast<std::size_t>(rank)][port];
    std::string s = "rank " + std::to_string(rank) + " " + p.device + (p.port != 1 ? ":" + std::to_string(p.port) : "");
    if (p.usable) s += " (" + ipv4_to_string(p.ipv4) + "/" + std::to_string(p.prefix) + ")";
    else s += " (" + p.problem + ")";
    return s;
  }
  /// The cable that `rank`'s `device` belongs to, if any.
  std::optional<Cable> cable_of(int rank, std::string_view device) const {
    for (const Cable& c : cables_)
      for (int k = 0; k < 2; ++k)
        if (c.rank[k] == rank && ports_[static_cast<std::size_t>(rank)][c.port[k]].device == device) return c;
    return std::nullopt;
  }

  /// A ring through every rank along discovered cables: the ranks in ring order, starting at
  /// rank 0, trying rank order (0, 1, 2, ...) first. Errors: `invalid_argument` at
  /// Step::configure when there is none, naming each pair of ring neighbours without a cable and
  /// the ports on both ends, then the problems found.
  [[nodiscard]] Result<std::vector<int>> ring() const {
    const int n = size();
    if (n < 2) return fail(Error::make(Step::configure, ErrorKind::invalid_argument, "a ring needs 2 ranks or more"));
    std::vector<std::vector<bool>> adj(static_cast<std::size_t>(n), std::vector<bool>(static_cast<std::size_t>(n)));
    for (const Cable& c : cables_)
      adj[static_cast<std::size_t>(c.rank[0])][static_cast<std::size_t>(c.rank[1])] =
          adj[static_cast<std::size_t>(c.rank[1])][static_cast<std::size_t>(c.rank[0])] = true;
    std::vector<int> order{0};
    std::vector<bool> used(static_cast<std::size_t>(n));
    used[0] = true;
    long budget = 2000000; // bounded search: a 64-rank job still answers quickly
    if (n == 2 && adj[0][1]) return std::vector<int>{0, 1};
    if (n > 2 && hamilton(adj, order, used, budget)) return order;
    // None: name the hops of the rank-order ring that have no cable, with both ends' ports.
    std::string why = "no ring through all " + std::to_string(n) + " ranks along the discovered cables";
    for (int r = 0; r < n && why.size() < 200; ++r) {
      const int s = (r + 1) % n;
      if (n == 2 && r == 1) break;
      if (adj[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)]) continue;
      why += "; no cable between rank " + std::to_string(r) + " and rank " + std::to_string(s) + " (rank " +
             std::to_string(r) + ": " + port_list(r) + "; rank " + std::to_string(s) + ": " + port_list(s) + ")";
    }
    Error e = Error::make(Step::configure, ErrorKind::invalid_argument, why);
    return fail(e);
  }

  /// Lines describing the graph: every cable, then every problem.
  std::vector<std::string> describe() const {
    std::vector<std::string> out;
    for (const Cable& c : cables_) out.push_back("cable " + describe_cable(c));
    for (const auto& p : problems_) out.push_back("problem: " + p);
    return out;
  }

  /// The wire form of one rank's ports, for the exchange (versioned; parse_ports() reads it).
  /// Written with the side channel's big-endian writer (detail/side_channel_frame.hpp).
  static std::vector<std::byte> serialize_ports(const std::vector<PortAddress>& ports) {
    detail::sc::Writer w;
    auto str = [&](const std::string& s) {
      const std::size_t n = std::min<std::size_t>(s.size(), 255);
      w.num(n, 1);
      w.text(std::string_view(s).substr(0, n));
    };
    w.num(wire_magic, 4);
    w.num(std::min<std::size_t>(ports.size(), 255), 1);
    for (std::size_t i = 0; i < ports.size() && i < 255; ++i) {
      const PortAddress& p = ports[i];
      str(p.device);
      w.num(p.port, 1);
      w.num((p.usable ? 1u : 0u) | (p.prefix_known ? 2u : 0u), 1);
      w.num(p.gid_index >= 0 && p.gid_index <= max_wire_gid_index ? static_cast<std::uint64_t>(p.gid_index) + 1 : 0, 4);
      w.num(p.ipv4, 4);
      w.num(static_cast<std::uint64_t>(std::clamp(p.prefix, 0, 32)), 1);
      str(p.problem);
    }
    return std::move(w.out);
  }
  /// Reads serialize_ports()' form: every field is a peer's claim and is checked, not believed.
  /// Errors: `bad_frame` for a truncated or foreign message, or a field out of its range (a GID
  /// index above 65535, a netmask longer than 32 bits, a usable port without a GID index, flags
  /// this version does not know).
  [[nodiscard]] static Result<std::vector<PortAddress>> parse_ports(std::span<const std::byte> in, int from_rank) {
    detail::sc::Reader r{in};
    auto bad = [&](const std::string& what) {
      return fail(Error::make(Step::side_channel, ErrorKind::bad_frame,
                              "rank " + std::to_string(from_rank) + " sent " + what));
    };
    std::vector<PortAddress> out;
    if (r.num(4) != wire_magic || !r.ok) return bad("no topology message");
    const auto n = r.num(1);
    for (std::uint64_t i = 0; i < n && r.ok; ++i) {
      PortAddress p;
      p.device = r.text(static_cast<std::size_t>(r.num(1)));
      p.port = static_cast<std::uint8_t>(r.num(1));
      const auto flags = r.num(1);
      // The GID index travels as index + 1 (0: none). Checked before it becomes an int
      // (0x80000000 must not overflow the conversion: fuzz/fuzz_topology.cpp).
      const auto gid_field = r.num(4);
      p.ipv4 = static_cast<std::uint32_t>(r.num(4));
      const auto prefix = r.num(1);
      p.problem = r.text(static_cast<std::size_t>(r.num(1)));
      if (!r.ok) break;
      // A peer's words are data: control characters in them are refused, never printed.
      if (detail::has_control(p.device) || detail::has_control(p.problem))
        return bad("a topology message with control characters in port " + std::to_string(i + 1) + "'s device name or problem");
      const std::string which = "port " + std::to_string(i + 1) + " (" + p.device + ")";
      if ((flags & ~std::uint64_t{3}) != 0) return bad("a topology message with unknown flags for " + which);
      if (gid_field > std::uint64_t{max_wire_gid_index} + 1)
        return bad("a topology message with GID index " + std::to_string(gid_field - 1) + " for " + which +
                   " (at most " + std::to_string(max_wire_gid_index) + ")");
      if (prefix > 32) return bad("a topology message with a /" + std::to_string(prefix) + " netmask for " + which);
      p.usable = (flags & 1u) != 0;
      p.prefix_known = (flags & 2u) != 0;
      p.gid_index = static_cast<int>(gid_field) - 1;
      p.prefix = static_cast<int>(prefix);
      if (p.usable && p.gid_index < 0) return bad("a topology message with a usable " + which + " but no GID index");
      out.push_back(std::move(p));
    }
    if (!r.ok || !r.in.empty()) return bad("a truncated topology message");
    return out;
  }

  /// The largest GID index the topology message carries: GID tables are at most 1024 entries on
  /// the platforms tbverbs knows (Thunderbolt's); 16 bits leave room (our bound).
  static constexpr int max_wire_gid_index = 65535;

private:
  static constexpr std::uint32_t wire_magic = 0x54425450u; // "TBTP", version 1

  std::string port_list(int r) const {
    std::string s;
    for (std::size_t i = 0; i < ports_[static_cast<std::size_t>(r)].size(); ++i) {
      const PortAddress& p = ports_[static_cast<std::size_t>(r)][i];
      s += (s.empty() ? "" : ", ") + p.device +
           (p.usable ? " " + ipv4_to_string(p.ipv4) + "/" + std::to_string(p.prefix) : " " + p.problem);
    }
    return s.empty() ? "no devices" : s;
  }

  bool hamilton(const std::vector<std::vector<bool>>& adj, std::vector<int>& order, std::vector<bool>& used,
                long& budget) const {
    const int n = size();
    const int cur = order.back();
    if (static_cast<int>(order.size()) == n) return adj[static_cast<std::size_t>(cur)][0];
    for (int k = 1; k < n; ++k) {
      const int next = (cur + k) % n; // the next rank first: rank order when it is cabled
      if (used[static_cast<std::size_t>(next)] || !adj[static_cast<std::size_t>(cur)][static_cast<std::size_t>(next)]) continue;
      if (--budget < 0) return false;
      used[static_cast<std::size_t>(next)] = true;
      order.push_back(next);
      if (hamilton(adj, order, used, budget)) return true;
      order.pop_back();
      used[static_cast<std::size_t>(next)] = false;
    }
    return false;
  }

  void build() {
    struct End {
      int rank;
      std::size_t port;
    };
    std::vector<End> ends;
    for (std::size_t r = 0; r < ports_.size(); ++r)
      for (std::size_t i = 0; i < ports_[r].size(); ++i)
        if (ports_[r][i].usable) ends.push_back({static_cast<int>(r), i});
    auto at = [&](const End& e) -> const PortAddress& { return ports_[static_cast<std::size_t>(e.rank)][e.port]; };
    // For every usable port: the other ports on its subnet (both netmasks agreeing).
    std::vector<std::vector<std::size_t>> mates(ends.size());
    for (std::size_t i = 0; i < ends.size(); ++i)
      for (std::size_t j = i + 1; j < ends.size(); ++j) {
        const PortAddress &a = at(ends[i]), &b = at(ends[j]);
        const bool ab = a.contains(b.ipv4), ba = b.contains(a.ipv4);
        if (!ab && !ba) continue;
        const std::string both = describe_end(ends[i].rank, ends[i].port) + " and " + describe_end(ends[j].rank, ends[j].port);
        if (ab != ba) {
          problems_.push_back("asymmetric: " + both + " disagree on the subnet (different netmasks on the two ends " +
                              "of one cable); give both ends the same /30");
          continue;
        }
        if (a.ipv4 == b.ipv4) {
          problems_.push_back("duplicate address: " + both + " have the same IPv4 address");
          continue;
        }
        if (ends[i].rank == ends[j].rank) {
          problems_.push_back("one rank, one subnet: " + both + " are on the same subnet; each cable needs its " +
                              "own (macOS routes the subnet through one interface only)");
          continue;
        }
        mates[i].push_back(j);
        mates[j].push_back(i);
      }
    for (std::size_t i = 0; i < ends.size(); ++i) {
      const PortAddress& a = at(ends[i]);
      if (mates[i].empty()) {
        problems_.push_back("alone: " + describe_end(ends[i].rank, ends[i].port) +
                            " faces no rank of this job: no other port has an address in " + ipv4_to_string(a.subnet()) +
                            "/" + std::to_string(a.prefix) +
                            " (the other end has no IPv4 address, its port is down, or it is outside the job)");
        continue;
      }
      if (mates[i].size() > 1) {
        if (mates[i].front() < i) continue; // reported once, by the lowest port of the subnet
        std::string names = describe_end(ends[i].rank, ends[i].port);
        for (std::size_t j : mates[i]) names += ", " + describe_end(ends[j].rank, ends[j].port);
        problems_.push_back("ambiguous: " + names + " share one subnet; give each cable its own /30");
        continue;
      }
      const std::size_t j = mates[i].front();
      if (j < i || mates[j].size() != 1) continue;
      Cable c;
      c.rank[0] = ends[i].rank;
      c.port[0] = ends[i].port;
      c.rank[1] = ends[j].rank;
      c.port[1] = ends[j].port;
      if (c.rank[0] > c.rank[1]) {
        std::swap(c.rank[0], c.rank[1]);
        std::swap(c.port[0], c.port[1]);
      }
      cables_.push_back(c);
    }
    std::sort(cables_.begin(), cables_.end(), [&](const Cable& x, const Cable& y) {
      if (x.rank[0] != y.rank[0]) return x.rank[0] < y.rank[0];
      if (x.rank[1] != y.rank[1]) return x.rank[1] < y.rank[1];
      const PortAddress &a = ports_[static_cast<std::size_t>(x.rank[0])][x.port[0]],
                        &b = ports_[static_cast<std::size_t>(y.rank[0])][y.port[0]];
      return a.device != b.device ? a.device < b.device : a.port < b.port;
    });
  }

  std::vector<std::vector<PortAddress>> ports_;
  std::vector<Cable> cables_;
  std::vector<std::string> problems_;
};

namespace detail {
/// The netmask length of the local interface that holds `ipv4` (host order), if any.
inline std::optional<int> interface_prefix(std::uint32_t ipv4) noexcept {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<int> out;
  for (ifaddrs* i = list; i != nullptr && !out; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    const auto* m = reinterpret_cast<const sockaddr_in*>(i->ifa_netmask);
    if (ntohl(a->sin_addr.s_addr) != ipv4) continue;
    int bits = 0;
    for (std::uint32_t v = ntohl(m->sin_addr.s_addr); v & 0x80000000u; v <<= 1) ++bits;
    out = bits;
  }
  ::freeifaddrs(list);
  return out;
}
} // namespace detail

/// This rank's ports as discovery sees them: every port of every device of `lib`, with its state
/// and, when active, the GID tbverbs would select (GidTable::select(): TBVERBS_GID_INDEX, else the
/// first IPv4-mapped entry) and that address's netmask. A device that cannot be opened or
/// queried is listed as not usable with the reason. Errors: DeviceList::get's (no device).
[[nodiscard]] inline Result<std::vector<PortAddress>> local_ports(const Library& lib, const TopologyOptions& options = {}) {
  int prefix = options.default_prefix;
  if (const char* env = std::getenv("TBVERBS_SUBNET_PREFIX"); env != nullptr && *env != '\0') {
    const int v = std::atoi(env);
    if (v < 1 || v > 32)
      return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                              std::string("TBVERBS_SUBNET_PREFIX=") + env + " is not a netmask length (1..32)"));
    prefix = v;
  }
  auto list = DeviceList::get(lib);
  if (!list) return fail(list.error());
  std::vector<PortAddress> out;
  for (const Device& d : *list) {
    PortAddress base;
    base.device = std::string(d.name());
    auto ctx = Context::open(lib, d);
    if (!ctx) {
      base.problem = "cannot be opened";
      out.push_back(base);
      continue;
    }
    auto attrs = ctx->query_device();
    const int ports = attrs && attrs->phys_port_cnt > 0 ? attrs->phys_port_cnt : 1;
    for (int p = 1; p <= ports && p < 256; ++p) {
      PortAddress a = base;
      a.port = static_cast<std::uint8_t>(p);
      a.prefix = prefix;
      auto port = ctx->query_port(a.port);
      if (!port) a.problem = "ibv_query_port failed";
      else if (port->state != PortState::active) a.problem = std::string(port_state_name(port->state));
      else if (auto table = ctx->gid_table(a.port); !table) a.problem = "GID table unreadable";
      else if (auto sel = table->select(); !sel || !sel->gid().is_ipv4_mapped()) a.problem = "no IPv4-mapped GID";
      else {
        a.usable = true;
        a.gid_index = sel->index();
        a.ipv4 = sel->gid().ipv4();
        if (auto known = detail::interface_prefix(a.ipv4)) {
          a.prefix = *known;
          a.prefix_known = true;
        }
      }
      out.push_back(std::move(a));
    }
  }
  return out;
}

/// Discovers the job's cables: reads this rank's ports (local_ports()), exchanges them with every
/// rank over `sc` (one all_gather: every rank must call it at the same point), and builds the
/// same Topology on every rank. Errors: local_ports()' and the side channel's; `bad_frame` for a
/// rank whose message is not a topology message.
[[nodiscard]] inline Result<Topology> discover_topology(const Library& lib, SideChannel& sc,
                                                        const TopologyOptions& options = {}) {
  auto mine = local_ports(lib, options);
  // A rank without devices still takes part (its ports are empty), so the others can name it.
  std::vector<PortAddress> empty;
  const auto wire = Topology::serialize_ports(mine ? *mine : empty);
  auto all = sc.all_gather(wire);
  if (!all) return fail(all.error());
  if (!mine) return fail(mine.error());
  std::vector<std::vector<PortAddress>> ports;
  for (std::size_t r = 0; r < all->size(); ++r) {
    auto p = Topology::parse_ports((*all)[r], static_cast<int>(r));
    if (!p) return fail(p.error());
    ports.push_back(std::move(*p));
  }
  return Topology::from_ports(std::move(ports));
}

TBVERBS_NAMESPACE_END

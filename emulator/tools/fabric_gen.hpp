// The fabrics `tbverbs-emu run` (and `tbverbs-emu fabric`) make: an N-host ring with K cables
// between neighbours, or a fully connected mesh, with one IPv4 /30 per cable, and the JACCL-style
// device file that goes with it. One profile for every host, or a comma-separated list that gives
// the hosts their profiles in turn (a mixed fabric of Macs and Linux hosts).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace emu_cli {

/// The emulator's profiles a fabric may name.
inline const std::vector<std::string>& known_profiles() {
  static const std::vector<std::string> k = {"thunderbolt", "rdma-core-rc", "rdma-core-roce", "rdma-core-ib", "usb4-rdma"};
  return k;
}

/// The names of `profiles`: one profile, or a comma-separated list ("thunderbolt,usb4-rdma").
inline std::vector<std::string> profile_list(const std::string& profiles) {
  std::vector<std::string> list;
  std::size_t start = 0;
  for (;;) {
    const auto comma = profiles.find(',', start);
    list.push_back(profiles.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return list;
    start = comma + 1;
  }
}

/// The profile of host h: the hosts take profile_list(profiles) in turn.
inline std::string host_profile(const std::string& profiles, int h) {
  const auto list = profile_list(profiles);
  return list[static_cast<std::size_t>(h) % list.size()];
}

/// The device of cable c on one side of a host of the ring: Thunderbolt's rdma_enN, usb4_rdmaN on
/// usb4-rdma, or mlx5_N on the rdma-core profiles (the library then treats them as rdma-core NICs).
inline std::string ring_device_name(const std::string& profile, int c, bool right) {
  if (profile == "thunderbolt") return "rdma_en" + std::to_string(2 * c + (right ? 2 : 1));
  if (profile == "usb4-rdma") return "usb4_rdma" + std::to_string(2 * c + (right ? 1 : 0));
  return "mlx5_" + std::to_string(2 * c + (right ? 1 : 0));
}

/// Pacing of every cable direction (the emulator's link model, docs/emulator.md).
struct LinkModel {
  double gbytes_per_s = 0; // 0: unpaced
  double latency_us = 0;
  bool paced() const { return gbytes_per_s > 0 || latency_us > 0; }
};

/// The fabric file's "link" and "quirks" objects on `f`.
inline void add_link_and_quirks(nlohmann::json& f, const LinkModel& link, const std::vector<std::string>& quirks) {
  if (link.paced()) { // a key left out is not modelled (no bandwidth limit, or no latency)
    nlohmann::json l = nlohmann::json::object();
    if (link.gbytes_per_s > 0) l["gbytes_per_s"] = link.gbytes_per_s;
    if (link.latency_us > 0) l["latency_us"] = link.latency_us;
    f["link"] = l;
  }
  if (!quirks.empty()) {
    nlohmann::json q = nlohmann::json::object();
    for (const auto& kv : quirks) {
      const auto eq = kv.find('=');
      q[kv.substr(0, eq)] = eq == std::string::npos ? std::string() : kv.substr(eq + 1);
    }
    f["quirks"] = q;
  }
}

/// An N-host ring with `cables` cables between neighbours: cable c of hop h joins host h's right
/// device c and host h+1's left device c, with 10.{99+c}.h.1/30 and 10.{99+c}.h.2/30 on its ends
/// (one subnet per cable, as Thunderbolt wants; InfiniBand ports get none).
inline nlohmann::json ring_fabric(int n, int cables, const std::vector<std::string>& quirks, const std::string& profile,
                                  const LinkModel& link) {
  nlohmann::json hosts = nlohmann::json::array(), wires = nlohmann::json::array();
  auto ip = [](int c, int hop, int end) {
    return "10." + std::to_string(99 + c) + "." + std::to_string(hop) + "." + std::to_string(end) + "/30";
  };
  auto dev = [&](int h, int c, bool right) { return ring_device_name(host_profile(profile, h), c, right); };
  for (int h = 0; h < n; ++h) {
    const int left_hop = (h + n - 1) % n;
    nlohmann::json devices = nlohmann::json::array();
    for (int c = 0; c < cables; ++c) {
      nlohmann::json left = {{"port", 1}}, right = {{"port", 1}};
      if (host_profile(profile, h) != "rdma-core-ib") {
        left["ipv4"] = ip(c, left_hop, 2);
        right["ipv4"] = ip(c, h, 1);
      }
      devices.push_back({{"name", dev(h, c, false)}, {"ports", {left}}});
      devices.push_back({{"name", dev(h, c, true)}, {"ports", {right}}});
    }
    hosts.push_back({{"name", "host" + std::to_string(h)}, {"profile", host_profile(profile, h)}, {"devices", devices}});
  }
  for (int h = 0; h < n; ++h)
    for (int c = 0; c < cables; ++c)
      wires.push_back({"host" + std::to_string(h) + ":" + dev(h, c, true) + ":1",
                       "host" + std::to_string((h + 1) % n) + ":" + dev((h + 1) % n, c, false) + ":1"});
  nlohmann::json f = {{"profile", host_profile(profile, 0)}, {"hosts", hosts}, {"cables", wires}};
  add_link_and_quirks(f, link, quirks);
  return f;
}

/// The device of host h toward host p on a fully connected fabric: one per other host, numbered in
/// host order.
inline std::string mesh_device_name(const std::string& profile, int h, int p) {
  const int k = p < h ? p : p - 1;
  const std::string mine = host_profile(profile, h);
  if (mine == "thunderbolt") return "rdma_en" + std::to_string(k + 1);
  if (mine == "usb4-rdma") return "usb4_rdma" + std::to_string(k);
  return "mlx5_" + std::to_string(k);
}

/// A fully connected fabric of n hosts: the cable between hosts a < b joins a's device toward b
/// and b's toward a, with 10.{150 + c / 256}.{c mod 256}.1/30 and .2/30 (c = a n + b).
inline nlohmann::json mesh_fabric(int n, const std::vector<std::string>& quirks, const std::string& profile,
                                  const LinkModel& link) {
  nlohmann::json hosts = nlohmann::json::array(), wires = nlohmann::json::array();
  auto ip = [n](int a, int b, int end) {
    const int c = a * n + b;
    return "10." + std::to_string(150 + c / 256) + "." + std::to_string(c % 256) + "." + std::to_string(end) + "/30";
  };
  for (int h = 0; h < n; ++h) {
    nlohmann::json devices = nlohmann::json::array();
    for (int p = 0; p < n; ++p) {
      if (p == h) continue;
      nlohmann::json port = {{"port", 1}};
      if (host_profile(profile, h) != "rdma-core-ib") port["ipv4"] = ip(std::min(h, p), std::max(h, p), h < p ? 1 : 2);
      devices.push_back({{"name", mesh_device_name(profile, h, p)}, {"ports", {port}}});
    }
    hosts.push_back({{"name", "host" + std::to_string(h)}, {"profile", host_profile(profile, h)}, {"devices", devices}});
  }
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      wires.push_back({"host" + std::to_string(a) + ":" + mesh_device_name(profile, a, b) + ":1",
                       "host" + std::to_string(b) + ":" + mesh_device_name(profile, b, a) + ":1"});
  nlohmann::json f = {{"profile", host_profile(profile, 0)}, {"hosts", hosts}, {"cables", wires}};
  add_link_and_quirks(f, link, quirks);
  return f;
}

/// The mesh's JACCL-style device file: entry [i][j] is host i's device toward host j.
inline nlohmann::json mesh_devices(int n, const std::string& profile) {
  nlohmann::json m = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (int j = 0; j < n; ++j) row.push_back(i == j ? nlohmann::json(nullptr) : nlohmann::json(mesh_device_name(profile, i, j)));
    m.push_back(row);
  }
  return m;
}

/// The ring's JACCL-style device file: entry [i][j] lists rank i's devices toward rank j (a string
/// for one cable), null on the diagonal and between non-neighbours; entry k on rank i and entry k
/// on rank j are the same cable. With two ranks both hops join the same pair: the entry lists hop
/// 0's cables at even positions and hop 1's at odd ones, in the same order on both ranks.
inline nlohmann::json ring_devices(int n, int cables, const std::string& profile) {
  auto one_or_list = [](nlohmann::json l) { return l.size() == 1 ? l[0] : l; };
  nlohmann::json m = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    nlohmann::json row = nlohmann::json::array();
    auto dev = [&](int c, bool right) { return ring_device_name(host_profile(profile, i), c, right); };
    for (int j = 0; j < n; ++j) {
      nlohmann::json l = nlohmann::json::array();
      if (i != j && n == 2) {
        for (int c = 0; c < cables; ++c) { // hop 0: rank 0's right devices to rank 1's left ones
          l.push_back(dev(c, i == 0));
          l.push_back(dev(c, i == 1));
        }
      } else if (j == (i + 1) % n) {
        for (int c = 0; c < cables; ++c) l.push_back(dev(c, true));
      } else if (j == (i + n - 1) % n) {
        for (int c = 0; c < cables; ++c) l.push_back(dev(c, false));
      }
      row.push_back(l.empty() ? nlohmann::json(nullptr) : one_or_list(l));
    }
    m.push_back(row);
  }
  return m;
}

/// A fabric to make: `hosts` hosts in a ring (`cables` cables between neighbours) or a mesh, their
/// profiles, the quirks it plays and its link model.
struct FabricSpec {
  int hosts = 0;
  int cables = 1;
  bool mesh = false;
  std::string profile = "thunderbolt"; ///< one profile, or a list the hosts take in turn
  std::vector<std::string> quirks;     ///< NAME=VALUE
  LinkModel link;
};

/// Why `f` cannot be made as asked, or "" (each option parses alone; together they may not).
inline std::string refused(const FabricSpec& f) {
  if (f.hosts < 2 || f.hosts > 64) return "the number of ranks must be 2..64 (a ring needs two), not " + std::to_string(f.hosts);
  if (f.mesh && f.cables != 1) return "--mesh has one cable between every pair of hosts: no --cables";
  if (f.cables < 1 || f.cables > 16) return "--cables must be 1..16";
  if (!(f.link.gbytes_per_s >= 0 && f.link.gbytes_per_s <= 1e4) || !(f.link.latency_us >= 0 && f.link.latency_us <= 1e7))
    return "--link-gbps must be 0..10000 GB/s and --link-latency-us 0..10000000";
  const auto listed = profile_list(f.profile);
  for (const auto& one : listed)
    if (std::find(known_profiles().begin(), known_profiles().end(), one) == known_profiles().end())
      return "unknown profile \"" + one + "\" (thunderbolt, usb4-rdma, rdma-core-rc, rdma-core-roce, rdma-core-ib)";
  if (listed.size() > static_cast<std::size_t>(f.hosts))
    return "--profile lists " + std::to_string(listed.size()) + " profiles, more than the " + std::to_string(f.hosts) +
           " hosts (a list gives the hosts their profiles in turn)";
  for (std::size_t a = 0; a < f.quirks.size(); ++a) {
    const std::string na = f.quirks[a].substr(0, f.quirks[a].find('='));
    if (f.quirks[a].find('=') == std::string::npos) return "--quirk " + f.quirks[a] + ": NAME=VALUE";
    for (std::size_t b = a + 1; b < f.quirks.size(); ++b)
      if (na == f.quirks[b].substr(0, f.quirks[b].find('=')))
        return "--quirk " + na + " is given twice (" + f.quirks[a] + ", " + f.quirks[b] + "): one reading per run";
  }
  return "";
}

/// The fabric file of `f`.
inline nlohmann::json fabric_of(const FabricSpec& f) {
  return f.mesh ? mesh_fabric(f.hosts, f.quirks, f.profile, f.link) : ring_fabric(f.hosts, f.cables, f.quirks, f.profile, f.link);
}

/// The JACCL-style device file of `f`.
inline nlohmann::json devices_of(const FabricSpec& f) {
  return f.mesh ? mesh_devices(f.hosts, f.profile) : ring_devices(f.hosts, f.cables, f.profile);
}

} // namespace emu_cli

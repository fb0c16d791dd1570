// The fabric file (JSON): its parser, the fabric it describes and the host a process plays (shared_state.cpp
// has the state file every process of a fabric maps).
#include "emu.hpp"

#include <tbverbs/collective/launcher.hpp>

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace emu {
namespace {

using json = nlohmann::json;

// Used when TBVERBS_EMU_FABRIC is unset: two hosts joined by one Thunderbolt cable,
// addresses already assigned, so a verbs program "just works" out of the box.
const char* kDefaultFabric = R"({
  "profile": "thunderbolt",
  "hosts": [
    {"name": "host0", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.99.0.1/30"}]}]},
    {"name": "host1", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.99.0.2/30"}]}]}
  ],
  "cables": [["host0:rdma_en1:1", "host1:rdma_en1:1"]]
})";

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Profile parse_profile(const std::string& s) {
  if (s == "thunderbolt") return Profile::Thunderbolt;
  if (s == "rdma-core-rc") return Profile::RdmaCoreRc;
  if (s == "rdma-core-roce") return Profile::RdmaCoreRoce;
  if (s == "rdma-core-ib") return Profile::RdmaCoreIb;
  if (s == "usb4-rdma") return Profile::Usb4Rdma;
  throw std::runtime_error("unknown profile \"" + s +
                           "\" (expected \"thunderbolt\", \"usb4-rdma\", \"rdma-core-rc\", \"rdma-core-roce\" or "
                           "\"rdma-core-ib\")");
}

// "host:device[:port]" → (host, device, port) names. The port is digits only ("1:garbage" and
// "1.9" are refused, not read as 1).
void split_endpoint(const std::string& s, std::string* host, std::string* dev, int* port) {
  auto a = s.find(':');
  if (a == std::string::npos) throw std::runtime_error("cable end \"" + s + "\" is not host:device[:port]");
  auto b = s.find(':', a + 1);
  *host = s.substr(0, a);
  *dev = s.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  *port = 1;
  if (b != std::string::npos) {
    const std::string digits = s.substr(b + 1);
    if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos)
      throw std::runtime_error("cable end \"" + s + "\": the port must be a number (host:device:port)");
    *port = std::stoi(digits);
  }
}

// A host or device name: what the cable syntax and the sysfs paths can carry.
void check_name(const std::string& what, const std::string& name) {
  if (name.empty() || name.size() >= IBV_SYSFS_NAME_MAX)
    throw std::runtime_error(what + " name \"" + name + "\" must be 1 to " + std::to_string(IBV_SYSFS_NAME_MAX - 1) +
                             " characters");
  for (unsigned char c : name)
    if (c == ':' || c == '/' || c <= ' ' || c == 0x7f)
      throw std::runtime_error(what + " name \"" + name + "\" may not contain ':', '/', spaces or control characters");
}

// Every key of `obj` must be one the loader reads (a misspelled key would otherwise be ignored in
// silence); "comment" is allowed anywhere, for notes in the file.
void check_keys(const json& obj, std::initializer_list<const char*> known, const std::string& where) {
  for (const auto& [key, value] : obj.items()) {
    (void)value;
    bool ok = key == "comment";
    for (const char* k : known) ok = ok || key == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
      throw std::runtime_error(where + ": unknown key \"" + key + "\" (known: " + list + ")");
    }
  }
}

// An integer field, refusing 1.9, "1" and true (nlohmann would convert them).
int int_field(const json& obj, const char* key, int fallback, const std::string& where) {
  if (!obj.contains(key)) return fallback;
  const json& v = obj[key];
  if (!v.is_number_integer()) throw std::runtime_error(where + ": \"" + key + "\" must be an integer");
  return v.get<int>();
}

// JSON allows a key twice in one object and nlohmann keeps the last; a fabric file with a
// duplicate key is almost always an edit gone wrong, so it is refused, naming the key.
struct DuplicateKeys : nlohmann::json_sax<json> {
  std::vector<std::vector<std::string>> open;  // the keys seen in each object being parsed
  std::string duplicate;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    auto& keys = open.back();
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) {
      duplicate = k;
      return false;
    }
    keys.push_back(k);
    return true;
  }
  bool end_object() override {
    open.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

// Bounds of a link model: beyond them a run would take days or the arithmetic (int64 ns) would
// overflow; nobody means them.
constexpr double kMinGbps = 1e-6, kMaxGbps = 1e6, kMaxLatencyUs = 1e7;

// Sets one dimension of a link model from its key and value, refusing what the model cannot mean.
void set_link_key(LinkModel& m, const std::string& key, double v, const std::string& where) {
  if (key == "gbytes_per_s") {
    if (!(v >= kMinGbps && v <= kMaxGbps))  // also refuses NaN
      throw std::runtime_error(where + ": \"gbytes_per_s\" must be a number from 1e-06 to 1e+06 (GB/s; omit it for "
                               "an unpaced link), not " + std::to_string(v));
    m.ns_per_byte = 1.0 / v;  // 1 GB/s = 1 byte per ns
  } else if (key == "latency_us") {
    if (!(v >= 0 && v <= kMaxLatencyUs))
      throw std::runtime_error(where + ": \"latency_us\" must be a number from 0 to 1e+07 (microseconds), not " +
                               std::to_string(v));
    m.latency_ns = static_cast<int64_t>(v * 1000.0 + 0.5);
  } else {
    throw std::runtime_error(where + ": unknown key \"" + key + "\" (known: gbytes_per_s, latency_us)");
  }
}

// A "link" object of the fabric file: {"gbytes_per_s": B, "latency_us": L}, either key optional.
LinkModel parse_link_json(const json& j, const std::string& where) {
  if (!j.is_object())
    throw std::runtime_error(where + ": \"link\" must be an object {\"gbytes_per_s\": B, \"latency_us\": L}");
  LinkModel m;
  for (const auto& [key, value] : j.items()) {
    if (key == "comment") continue;
    if (!value.is_number())
      throw std::runtime_error(where + ": \"" + key + "\" must be a number, not " + value.dump());
    set_link_key(m, key, value.get<double>(), where);
  }
  return m;
}

std::unique_ptr<Fabric> parse_fabric(const std::string& text, const std::string& origin) {
  auto f = std::make_unique<Fabric>();
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(origin + ": not valid JSON: " + e.what());
  }
  {
    DuplicateKeys dup;
    json::sax_parse(text, &dup);
    if (!dup.duplicate.empty())
      throw std::runtime_error(origin + ": the key \"" + dup.duplicate + "\" appears twice in one object");
  }
  try {
    if (!j.is_object()) throw std::runtime_error("top level must be an object");
    check_keys(j, {"profile", "quirks", "link", "hosts", "cables"}, "the fabric");
    // The fabric's link model applies to every cable that has none of its own.
    const LinkModel fabric_link = j.contains("link") ? parse_link_json(j["link"], "the fabric's link") : LinkModel{};
    f->profile = parse_profile(j.value("profile", std::string("thunderbolt")));
    if (j.contains("quirks")) {
      const json& jq = j["quirks"];
      if (!jq.is_object()) throw std::runtime_error("\"quirks\" must be an object of name: value");
      for (const auto& [name, value] : jq.items()) {
        if (!value.is_string())
          throw std::runtime_error("quirk " + name + ": the value must be a string (e.g. \"wait\", \"26.3\")");
        set_quirk(f->quirks, name, value.get<std::string>());
      }
    }
    if (!j.contains("hosts") || !j["hosts"].is_array() || j["hosts"].empty())
      throw std::runtime_error("\"hosts\" must be a non-empty array");
    for (const auto& jh : j["hosts"]) {
      HostDef h;
      if (!jh.is_object()) throw std::runtime_error("every entry of \"hosts\" must be an object");
      h.name = jh.at("name").get<std::string>();
      check_name("host", h.name);
      check_keys(jh, {"name", "profile", "devices"}, "host \"" + h.name + "\"");
      if (f->find_host(h.name) >= 0) throw std::runtime_error("host \"" + h.name + "\" defined twice");
      Profile hp = jh.contains("profile") ? parse_profile(jh["profile"].get<std::string>()) : f->profile;
      int hidx = static_cast<int>(f->hosts.size());
      f->hosts.push_back(h);
      const json devs = jh.value("devices", json::array());
      if (!devs.is_array()) throw std::runtime_error("host \"" + h.name + "\": \"devices\" must be an array");
      for (const auto& jd : devs) {
        DeviceDef d;
        d.host = hidx;
        d.profile = hp;
        json jports = json::array({json::object({{"port", 1}})});
        if (jd.is_string()) {
          d.name = jd.get<std::string>();
        } else {
          d.name = jd.at("name").get<std::string>();
          check_keys(jd, {"name", "profile", "ports"}, h.name + ":" + d.name);
          if (jd.contains("profile")) d.profile = parse_profile(jd["profile"].get<std::string>());
          if (jd.contains("ports")) jports = jd["ports"];
        }
        check_name("host \"" + h.name + "\": device", d.name);
        if (f->find_device(hidx, d.name) >= 0)
          throw std::runtime_error("host \"" + h.name + "\": device \"" + d.name + "\" defined twice");
        int didx = static_cast<int>(f->devices.size());
        uint64_t g = fnv1a(h.name + "/" + d.name);
        d.guid = htobe64(g);
        f->devices.push_back(d);
        f->hosts[hidx].devices.push_back(didx);
        if (!jports.is_array() || jports.empty())
          throw std::runtime_error(h.name + ":" + d.name + ": \"ports\" must be a non-empty array");
        int expect = 1;
        for (const auto& jp : jports) {
          PortDef p;
          p.host = hidx;
          p.device = didx;
          const std::string where = h.name + ":" + d.name;
          if (!jp.is_object()) throw std::runtime_error(where + ": every port must be an object");
          check_keys(jp, {"port", "state", "ipv4_gid_index", "lid", "active_mtu", "ipv6", "subnet_prefix", "netdev",
                          "ipv4"},
                     where + " port");
          p.port_num = int_field(jp, "port", expect, where);
          if (p.port_num != expect)
            throw std::runtime_error(h.name + ":" + d.name + ": ports must be numbered 1, 2, ... in order");
          ++expect;
          std::string st = jp.value("state", std::string("up"));
          if (st != "up" && st != "down")
            throw std::runtime_error(h.name + ":" + d.name + ": port state must be \"up\" or \"down\"");
          p.initially_up = st == "up";
          const int gi = int_field(jp, "ipv4_gid_index", 1, where);
          if (gi < 1 || gi > 15)
            throw std::runtime_error(h.name + ":" + d.name + ": ipv4_gid_index must be 1..15");
          p.ipv4_gid_index = static_cast<uint32_t>(gi);
          if (jp.contains("lid")) {
            p.lid = int_field(jp, "lid", 0, where);
            if (p.lid < 0 || p.lid > 0xbfff)
              throw std::runtime_error(h.name + ":" + d.name + ": lid must be 0 (no subnet manager) .. 0xbfff");
          }
          if (jp.contains("active_mtu")) {
            const int m = int_field(jp, "active_mtu", 1024, where);
            if (m != 256 && m != 512 && m != 1024 && m != 2048 && m != 4096)
              throw std::runtime_error(h.name + ":" + d.name + ": active_mtu must be 256, 512, 1024, 2048 or 4096");
            p.active_mtu = static_cast<uint32_t>(__builtin_ctz(static_cast<unsigned>(m)) - 7);  // 256 -> IBV_MTU_256 (1)
          }
          if (jp.contains("ipv6") && !jp["ipv6"].is_null()) {
            std::string t = jp["ipv6"].get<std::string>();
            if (auto sl = t.find('/'); sl != std::string::npos) t.resize(sl);
            if (inet_pton(AF_INET6, t.c_str(), p.ipv6) != 1)
              throw std::runtime_error(h.name + ":" + d.name + ": bad ipv6 \"" + t + "\"");
            p.has_ipv6 = true;
          }
          if (jp.contains("subnet_prefix")) {
            // "fec0:0:0:1": the upper 64 bits of the port GID (InfiniBand).
            std::string t = jp["subnet_prefix"].get<std::string>() + "::";
            uint8_t raw[16];
            if (inet_pton(AF_INET6, t.c_str(), raw) != 1)
              throw std::runtime_error(h.name + ":" + d.name + ": bad subnet_prefix (e.g. \"fe80:0:0:0\")");
            std::memcpy(p.subnet_prefix, raw, 8);
          }
          p.netdev = jp.value("netdev", std::string());
          if (jp.contains("ipv4") && !jp["ipv4"].is_null()) {
            std::string cidr = jp["ipv4"].get<std::string>();
            if (!parse_cidr(cidr, &p.initial_ip, &p.initial_prefix))
              throw std::runtime_error(h.name + ":" + d.name + ": bad ipv4 \"" + cidr + "\"");
            p.initial_has_ip = true;
          }
          if (f->ports.size() >= kMaxPorts) throw std::runtime_error("too many ports (limit 64)");
          f->devices[didx].ports.push_back(static_cast<int>(f->ports.size()));
          f->ports.push_back(p);
        }
      }
    }
    for (const auto& jc : j.value("cables", json::array())) {
      std::string ends[2];
      bool routed = false;
      LinkModel link = fabric_link;
      if (jc.is_array() && jc.size() == 2) {
        ends[0] = jc[0].get<std::string>();
        ends[1] = jc[1].get<std::string>();
      } else if (jc.is_object()) {
        check_keys(jc, {"a", "b", "routed", "link"}, "a cable");
        ends[0] = jc.at("a").get<std::string>();
        ends[1] = jc.at("b").get<std::string>();
        routed = jc.value("routed", false);
        // A cable's own link replaces the fabric's as a whole: a key it omits is unpaced there.
        if (jc.contains("link")) link = parse_link_json(jc["link"], "the link of cable " + ends[0] + " - " + ends[1]);
      } else {
        throw std::runtime_error("a cable must be [\"host:dev:port\", \"host:dev:port\"] or {\"a\":..,\"b\":..}");
      }
      int pi[2];
      for (int k = 0; k < 2; ++k) {
        std::string hn, dn;
        int pn;
        split_endpoint(ends[k], &hn, &dn, &pn);
        int hh = f->find_host(hn);
        if (hh < 0) throw std::runtime_error("cable end \"" + ends[k] + "\": unknown host \"" + hn + "\"");
        int dd = f->find_device(hh, dn);
        if (dd < 0) throw std::runtime_error("cable end \"" + ends[k] + "\": unknown device \"" + dn + "\"");
        pi[k] = f->find_port(dd, pn);
        if (pi[k] < 0) throw std::runtime_error("cable end \"" + ends[k] + "\": no such port");
        if (f->ports[pi[k]].peer >= 0) throw std::runtime_error("port " + ends[k] + " has two cables");
      }
      if (pi[0] == pi[1]) throw std::runtime_error("a cable joins port " + ends[0] + " to itself");
      f->ports[pi[0]].peer = pi[1];
      f->ports[pi[1]].peer = pi[0];
      f->ports[pi[0]].routed = f->ports[pi[1]].routed = routed;
      f->ports[pi[0]].link = f->ports[pi[1]].link = link;
      f->paced = f->paced || link.paced();
      // A usb4_rdma device cabled to a Mac runs Apple's compatible transport (DeviceDef::mac_compat).
      for (int k = 0; k < 2; ++k) {
        DeviceDef& mine = f->devices[f->ports[pi[k]].device];
        if (mine.profile == Profile::Usb4Rdma && f->devices[f->ports[pi[1 - k]].device].profile == Profile::Thunderbolt)
          mine.mac_compat = true;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(origin + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(origin + ": " + e.what());
  }
  return f;
}

std::mutex g_fabrics_mutex;
std::map<std::string, std::unique_ptr<Fabric>>& fabrics() {
  static auto* m = new std::map<std::string, std::unique_ptr<Fabric>>();  // never destroyed: handles outlive exit
  return *m;
}

std::string default_state_dir(const std::string& key, const std::string& text) {
  const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(text, fnv1a(key))));
  return std::string(base) + "/tbverbs-emu-" + std::to_string(getuid()) + "-" + buf;
}

}  // namespace

std::unique_ptr<Fabric> parse_fabric_text(const std::string& text, const std::string& origin) {
  return parse_fabric(text, origin);
}

LinkModel parse_link_text(const std::string& text, const std::string& where) {
  LinkModel m;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw std::runtime_error(where + ": \"" + item + "\" is not key=value (gbytes_per_s=B,latency_us=L)");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    char* end = nullptr;
    errno = 0;
    const double v = value.empty() ? 0 : std::strtod(value.c_str(), &end);
    if (value.empty() || *end != 0 || errno == ERANGE)
      throw std::runtime_error(where + ": \"" + key + "\" must be a number, not \"" + value + "\"");
    set_link_key(m, key, v, where);
  }
  return m;
}

const char* profile_name(Profile p) {
  switch (p) {
    case Profile::Thunderbolt: return "thunderbolt";
    case Profile::RdmaCoreRc: return "rdma-core-rc";
    case Profile::RdmaCoreRoce: return "rdma-core-roce";
    case Profile::RdmaCoreIb: return "rdma-core-ib";
    case Profile::Usb4Rdma: return "usb4-rdma";
  }
  return "?";
}

int Fabric::find_host(const std::string& name) const {
  for (size_t i = 0; i < hosts.size(); ++i)
    if (hosts[i].name == name) return static_cast<int>(i);
  return -1;
}
int Fabric::find_device(int host, const std::string& name) const {
  if (host < 0) return -1;
  for (int d : hosts[host].devices)
    if (devices[d].name == name) return d;
  return -1;
}
int Fabric::find_port(int device, int port_num) const {
  if (device < 0) return -1;
  const auto& ps = devices[device].ports;
  if (port_num < 1 || port_num > static_cast<int>(ps.size())) return -1;
  return ps[port_num - 1];
}
std::string Fabric::port_label(int port) const {
  const PortDef& p = ports[port];
  return hosts[p.host].name + ":" + devices[p.device].name + ":" + std::to_string(p.port_num);
}

bool parse_cidr(const std::string& s, uint32_t* ip, uint32_t* prefix) {
  std::string addr = s;
  *prefix = 24;
  auto slash = s.find('/');
  if (slash != std::string::npos) {
    addr = s.substr(0, slash);
    std::string p = s.substr(slash + 1);
    if (p.empty() || p.size() > 2 || p.find_first_not_of("0123456789") != std::string::npos) return false;
    *prefix = static_cast<uint32_t>(std::stoi(p));
    if (*prefix > 32) return false;
  }
  in_addr a{};
  if (inet_pton(AF_INET, addr.c_str(), &a) != 1) return false;
  *ip = ntohl(a.s_addr);
  return true;
}

std::string format_ipv4(uint32_t ip) {
  in_addr a{};
  a.s_addr = htonl(ip);
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

Fabric& load_fabric(const std::string& path) {
  std::lock_guard<std::mutex> g(g_fabrics_mutex);
  std::string key = path;
  std::string text;
  if (path.empty()) {
    text = kDefaultFabric;
  } else {
    std::error_code ec;
    auto canon = std::filesystem::weakly_canonical(path, ec);
    if (!ec) key = canon.string();
    auto it = fabrics().find(key);
    if (it != fabrics().end()) return *it->second;
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read fabric file " + path + ": " + std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto it = fabrics().find(key);
  if (it != fabrics().end()) return *it->second;
  auto f = parse_fabric(text, path.empty() ? std::string("built-in default fabric") : path);
  f->path = path;
  // TBVERBS_EMU_LINK paces every cable, whatever the file says (a quick what-if without editing
  // the file). Every process of the fabric must see the same value: the model lives in each
  // process, only the cables' busy clocks are shared.
  if (const char* e = std::getenv("TBVERBS_EMU_LINK"); e && *e) {
    const LinkModel m = parse_link_text(e, "TBVERBS_EMU_LINK");
    for (auto& p : f->ports) p.link = m;
    f->paced = m.paced() && !f->ports.empty();
  }
  const char* sd = std::getenv("TBVERBS_EMU_STATE_DIR");
  f->state_dir = (sd && *sd) ? std::string(sd) : default_state_dir(key, text);
  f->shm = open_shared(*f);
  // TBVERBS_EMU_QUIRKS overrides the file's quirks in the shared state, for every
  // process on the fabric, each time a process loads it (convenient for tests).
  if (const char* env = std::getenv("TBVERBS_EMU_QUIRKS"); env && *env) {
    QuirkSet q;
    std::memcpy(q, f->shm->quirks, sizeof q);
    try {
      set_quirks(q, env);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("TBVERBS_EMU_QUIRKS=\"") + env + "\": " + e.what());
    }
    Guard g(f->shm->lock);
    for (uint32_t i = 0; i < kNumQuirks; ++i) __atomic_store_n(&f->shm->quirks[i], q[i], __ATOMIC_RELAXED);
  }
  Fabric& ref = *f;
  fabrics()[key] = std::move(f);
  return ref;
}

Fabric& env_fabric() {
  const char* p = std::getenv("TBVERBS_EMU_FABRIC");
  return load_fabric(p ? p : "");
}

namespace {
// `name` (TBVERBS_EMU_HOST) with every "{rank}" replaced by the launcher's rank (the table of
// tbverbs/collective/launcher.hpp: RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, JACCL_RANK,
// MLX_RANK), so torchrun, mpirun and srun start every rank of a job with one environment
// ("host{rank}" is host0 on rank 0, host1 on rank 1, ...). nullopt, with `error` set, when the name
// holds {rank} and no launcher gives a rank.
std::optional<std::string> with_rank(std::string name, std::string* error) {
  static constexpr std::string_view placeholder = "{rank}";
  if (name.find(placeholder) == std::string::npos) return name;
  std::string problem;
  const auto job = tbverbs::launcher_job(problem);
  if (!job || !job->rank) {
    if (error)
      *error = "TBVERBS_EMU_HOST=\"" + name + "\" holds {rank}, but " +
               (job ? std::string("no launcher gives a rank (set ") + tbverbs::launcher_rank_variables + ")" : problem);
    return std::nullopt;
  }
  const std::string rank = std::to_string(*job->rank);
  for (std::size_t at = name.find(placeholder); at != std::string::npos; at = name.find(placeholder, at + rank.size()))
    name.replace(at, placeholder.size(), rank);
  return name;
}
}  // namespace

int env_host(const Fabric& f, std::string* error) {
  const char* h = std::getenv("TBVERBS_EMU_HOST");
  if (!h || !*h) return 0;
  const auto name = with_rank(h, error);
  if (!name) return -1;
  int i = f.find_host(*name);
  if (i < 0 && error) {
    std::string known;
    for (const auto& x : f.hosts) known += (known.empty() ? "" : ", ") + x.name;
    *error = "TBVERBS_EMU_HOST=\"" + std::string(h) + "\"" + (*name == h ? "" : " (\"" + *name + "\")") +
             " is not a host of the fabric (hosts: " + known + ")";
  }
  return i;
}

}  // namespace emu

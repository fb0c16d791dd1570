// Fabric description (JSON) and the per-fabric shared state file.
#include "emu.hpp"

#include <tbverbs/collective/launcher.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
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
  throw std::runtime_error("unknown profile \"" + s +
                           "\" (expected \"thunderbolt\", \"rdma-core-rc\", \"rdma-core-roce\" or \"rdma-core-ib\")");
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

// ---------------------------------------------------------------- shared state

void ShmLock::init() {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&m, &a);
  pthread_mutexattr_destroy(&a);
}

void ShmLock::lock() {
  int r = pthread_mutex_lock(&m);
  if (r == EOWNERDEAD) pthread_mutex_consistent(&m);  // holder died; state stays usable
}

static uint64_t layout_id(const Fabric& f) {
  return sizeof(Shared) ^ (uint64_t(f.ports.size()) << 40) ^ (uint64_t(kRecvRing) << 20) ^ kCqRing;
}

// The state belongs to the user who runs the emulator and to nobody else: senders trust the pid
// and addresses stored in it for process_vm_writev, so a state file others can write would let
// them aim our writes at any process we may write to (issue 9). The directory is made 0700 and
// the file 0600; a directory or file that is not ours (or not a directory / regular file) is
// refused rather than used.
static void check_private_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    throw std::runtime_error("cannot create the emulator state directory " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    throw std::runtime_error("emulator state directory " + dir + " is not a directory (a symlink?): refusing it");
  if (st.st_uid != ::geteuid())
    throw std::runtime_error("emulator state directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                             ", not to this user (uid " + std::to_string(::geteuid()) +
                             "): refusing it; set TBVERBS_EMU_STATE_DIR to a directory of your own");
  // Ours but open to others (made by an older emulator, mode 1777): closed now. A file someone
  // else planted in it is refused below, by its owner.
  if ((st.st_mode & 0077) != 0 && ::chmod(dir.c_str(), 0700) != 0)
    throw std::runtime_error("cannot make the emulator state directory " + dir + " private: " + std::strerror(errno));
}

Shared* open_shared(Fabric& f) {
  if (::mkdir(f.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    std::error_code ec;  // a nested path: make the parents, then the directory itself, private
    std::filesystem::create_directories(std::filesystem::path(f.state_dir).parent_path(), ec);
    ::mkdir(f.state_dir.c_str(), 0700);
  }
  check_private_dir(f.state_dir);
  // Which fabric file this state belongs to, for `tbverbs-emu gc` (state whose fabric file and
  // processes are gone is removed). Rewritten by every opener: cheap, and always current.
  {
    const std::string record = f.state_dir + "/fabric";
    int rfd = ::open(record.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (rfd >= 0) {
      const std::string text = (f.path.empty() ? std::string("(built-in)") : f.path) + "\n";
      ssize_t w = ::write(rfd, text.data(), text.size());
      (void)w;
      ::close(rfd);
    }
  }
  std::string file = f.state_dir + "/state";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot open emulator state " + file + ": " + std::strerror(errno));
  {
    struct stat fst {};
    if (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode) || fst.st_uid != ::geteuid()) {
      ::close(fd);
      throw std::runtime_error("emulator state " + file + " is not a file of this user: refusing it");
    }
    if ((fst.st_mode & 0077) != 0) ::fchmod(fd, 0600);  // an older emulator's 0666
  }
  // flock serialises the one-time initialisation between racing processes.
  if (flock(fd, LOCK_EX) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot lock " + file + ": " + std::strerror(errno));
  }
  struct stat st {};
  fstat(fd, &st);
  bool fresh = static_cast<size_t>(st.st_size) != sizeof(Shared);
  if (!fresh) {
    // Only the header: Shared itself is hundreds of MiB (sparse).
    struct {
      uint64_t magic, layout;
      uint32_t nports;
    } probe{};
    static_assert(offsetof(Shared, magic) == 0 && offsetof(Shared, layout) == 8 && offsetof(Shared, nports) == 16);
    if (pread(fd, &probe, 20, 0) != 20 || probe.magic != kMagic || probe.layout != layout_id(f) ||
        probe.nports != f.ports.size())
      fresh = true;
  }
  if (fresh && (ftruncate(fd, 0) != 0 || ftruncate(fd, sizeof(Shared)) != 0)) {
    int e = errno;
    flock(fd, LOCK_UN);
    ::close(fd);
    throw std::runtime_error("cannot size " + file + ": " + std::strerror(e));
  }
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    flock(fd, LOCK_UN);
    ::close(fd);
    throw std::runtime_error("cannot map " + file + ": " + std::strerror(e));
  }
  auto* s = static_cast<Shared*>(p);
  if (fresh) {
    s->layout = layout_id(f);
    s->nports = static_cast<uint32_t>(f.ports.size());
    s->lock.init();
    s->atomics.init();
    s->next_gen = 1;
    s->next_channel = 1;
    s->next_pd = 1;
    for (size_t i = 0; i < f.ports.size(); ++i) {
      s->ports[i].up = f.ports[i].initially_up;
      s->ports[i].has_ip = f.ports[i].initial_has_ip;
      s->ports[i].ip = f.ports[i].initial_ip;
      s->ports[i].prefix = f.ports[i].initial_prefix;
    }
    for (uint32_t i = 0; i < kNumQuirks; ++i) s->quirks[i] = f.quirks[i];
    for (auto& q : s->qps) q.lock.init();
    for (auto& c : s->cqs) c.lock.init();
    __atomic_store_n(&s->magic, kMagic, __ATOMIC_RELEASE);
  }
  flock(fd, LOCK_UN);
  ::close(fd);  // the mapping stays valid
  return s;
}

void reset_shared(const Fabric& f) {
  std::error_code ec;
  std::filesystem::remove_all(f.state_dir, ec);
}

uint32_t own_bell(Shared* s) {
  const int32_t me = getpid();
  const uint64_t start = self_start();
  uint32_t take = kMaxCqs;
  for (uint32_t i = 0; i < kMaxCqs; ++i) {
    const ShmBell& b = s->bells[i];
    if (b.pid == me && b.pid_start == start) return i;
    if (take == kMaxCqs && b.pid == 0) take = i;
  }
  for (uint32_t i = 0; take == kMaxCqs && i < kMaxCqs; ++i)  // none free: one of a process that is gone
    if (!pid_alive(s->bells[i].pid) || process_start(s->bells[i].pid) != s->bells[i].pid_start) take = i;
  if (take < kMaxCqs) {
    ShmBell& b = s->bells[take];
    b.pid_start = start;
    b.waiters = 0;
    __atomic_store_n(&b.pid, me, __ATOMIC_RELEASE);
  }
  return take;
}

bool pid_alive(int32_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  // A zombie (killed, not yet reaped, e.g. an orphan whose init does not reap)
  // has released its memory and QPs as far as the kernel is concerned.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = 0;
  const char* rp = std::strrchr(buf, ')');  // the command name may contain spaces
  return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

uint64_t process_start(int32_t pid) {
  if (pid <= 0) return 0;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  // Field 22 (starttime); the command name (field 2) may hold spaces and parentheses, so count
  // from its closing parenthesis: the space after it starts field 3.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  ++p;
  for (int field = 3; field < 22 && p; ++field) p = std::strchr(p + 1, ' ');
  return p ? std::strtoull(p + 1, nullptr, 10) : 0;
}

uint64_t self_start() {
  // Cached per pid: a forked child inherits the cache and must read its own.
  static std::atomic<int32_t> pid{0};
  static std::atomic<uint64_t> start{0};
  const int32_t me = getpid();
  if (pid.load(std::memory_order_acquire) != me) {
    start.store(process_start(me), std::memory_order_relaxed);
    pid.store(me, std::memory_order_release);
  }
  return start.load(std::memory_order_relaxed);
}

void collect_dead(Shared* s) {
  for (auto& q : s->qps)
    if (q.in_use && !pid_alive(q.pid)) {
      Guard g(q.lock);
      q.in_use = 0;
      q.state = IBV_QPS_RESET;
      discard_waiting(q);
    }
  for (auto& p : s->pds)
    if (p.in_use && p.pid >= 0 && !pid_alive(p.pid)) p.in_use = 0;
  for (auto& c : s->cqs)
    if (c.in_use && !pid_alive(c.pid)) c.in_use = 0;
  for (auto& m : s->mrs)
    if (m.key && !pid_alive(m.pid)) m.key = 0;
}

std::vector<std::string> collect_state_dirs(bool dry_run, std::string* report, const std::string& under) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  const std::string mine = "tbverbs-emu-" + std::to_string(getuid()) + "-";
  const auto now = fs::file_time_type::clock::now();
  for (const char* base : {"/dev/shm", "/tmp"}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      const std::string name = entry.path().filename().string();
      const bool emu = name.rfind(mine, 0) == 0, ring = name.rfind("tbverbs-ring-", 0) == 0;
      if (!(emu || ring) || !entry.is_directory(ec) || entry.is_symlink(ec)) continue;
      const std::string dir = entry.path().string();
      struct stat st {};
      if (::lstat(dir.c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
      // A directory of the launcher's that is not a state directory (its work files) is left alone.
      const bool has_state = fs::exists(dir + "/state", ec);
      if (ring && !has_state && !fs::is_empty(dir, ec)) continue;
      // The fabric file it belongs to, when recorded; without a record (an older emulator, or no
      // state yet), only a directory untouched for 10 minutes counts as abandoned.
      std::string fabric;
      std::ifstream(dir + "/fabric") >> fabric;
      // A fabric file under `under` counts as gone: its owner (a test tree's clean-up) is done with it.
      const bool done_with = !under.empty() && !fabric.empty() && fabric.rfind(under, 0) == 0 &&
                             (fabric.size() == under.size() || fabric[under.size()] == '/' || under.back() == '/');
      const bool fabric_gone = done_with ||
                               (!fabric.empty() ? (fabric != "(built-in)" && !fs::exists(fabric, ec))
                                                : now - fs::last_write_time(dir, ec) > std::chrono::minutes(10));
      if (!fabric_gone) continue;
      // Any live process with objects in the state keeps it.
      bool live = false;
      if (has_state) {
        int fd = ::open((dir + "/state").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat fst {};
        if (fd >= 0 && ::fstat(fd, &fst) == 0 && static_cast<size_t>(fst.st_size) == sizeof(Shared)) {
          void* p = mmap(nullptr, sizeof(Shared), PROT_READ, MAP_SHARED, fd, 0);
          if (p != MAP_FAILED) {
            const auto* sh = static_cast<const Shared*>(p);
            if (sh->magic == kMagic) {
              for (const auto& q : sh->qps) live = live || (q.in_use && pid_alive(q.pid));
              for (const auto& c : sh->cqs) live = live || (c.in_use && pid_alive(c.pid));
              for (const auto& m : sh->mrs) live = live || (m.key && pid_alive(m.pid));
            }
            munmap(p, sizeof(Shared));
          }
        }
        if (fd >= 0) ::close(fd);
      }
      if (live) continue;
      if (report) *report += (dry_run ? "would remove " : "removed ") + dir + (fabric.empty() ? "" : " (" + fabric + ")") + "\n";
      if (!dry_run) fs::remove_all(dir, ec);
      removed.push_back(dir);
    }
  }
  return removed;
}

uint32_t count_pds(const Shared* s, int device, bool* any_leaked) {
  uint32_t n = 0;
  if (any_leaked) *any_leaked = false;
  for (const auto& p : s->pds)
    if (p.in_use && p.device == static_cast<uint32_t>(device)) {
      ++n;
      if (p.pid < 0 && any_leaked) *any_leaked = true;
    }
  return n;
}

// ---------------------------------------------------------------- port view

bool port_active(const Fabric& f, int port) {
  if (port < 0 || port >= static_cast<int>(f.ports.size())) return false;
  const ShmPort* sp = f.shm->ports;
  int peer = f.ports[port].peer;
  return __atomic_load_n(&sp[port].up, __ATOMIC_ACQUIRE) && peer >= 0 &&
         __atomic_load_n(&sp[peer].up, __ATOMIC_ACQUIRE);
}

uint32_t gid_table_len(const Fabric& f, int port) {
  switch (f.devices[f.ports[port].device].profile) {
    case Profile::Thunderbolt: return 1024;
    // Our assumption for both: the lengths public ibv_devinfo output of ConnectX RoCE (256)
    // and InfiniBand (128) ports commonly shows; only the first entries are ever populated.
    case Profile::RdmaCoreRoce: return 256;
    case Profile::RdmaCoreIb: return 128;
    case Profile::RdmaCoreRc: break;
  }
  return 16;
}

namespace {
// fe80::<interface id from the device GUID>; index > 0 stands for other interfaces
// (Thunderbolt, rdma-core-rc) and is folded into the id.
void link_local_gid(const Fabric& f, int port, uint32_t index, ibv_gid* out) {
  out->raw[0] = 0xfe;
  out->raw[1] = 0x80;
  uint64_t iid = be64toh(f.devices[f.ports[port].device].guid) ^ uint64_t(f.ports[port].port_num) ^
                 (uint64_t(index) << 56);
  iid = htobe64(iid);
  std::memcpy(out->raw + 8, &iid, 8);
}
// Read the address once so the entry is consistent while another process changes it.
bool ipv4_gid(const Fabric& f, int port, ibv_gid* out) {
  ShmPort sp;
  std::memcpy(&sp, &f.shm->ports[port], sizeof sp);
  if (!sp.has_ip) return false;
  out->raw[10] = 0xff;
  out->raw[11] = 0xff;
  uint32_t be = htonl(sp.ip);
  std::memcpy(out->raw + 12, &be, 4);
  return true;
}
}  // namespace

bool gid_at(const Fabric& f, int port, uint32_t index, ibv_gid* out) {
  std::memset(out, 0, sizeof *out);
  const PortDef& pd = f.ports[port];
  switch (f.devices[pd.device].profile) {
    case Profile::RdmaCoreRoce:
      // docs/field-reports.md section 4b: mlx5 publishes every address twice, RoCE v1 then RoCE v2:
      // 0/1 = fe80:: (v1/v2), 2/3 = ::ffff:a.b.c.d, 4/5 = a global IPv6 address. Our
      // assumption: fixed slots (an address that goes away leaves its two slots empty).
      if (index <= 1) {
        link_local_gid(f, port, 0, out);
        return true;
      }
      if (index <= 3) return ipv4_gid(f, port, out);
      if (index <= 5 && pd.has_ipv6) {
        std::memcpy(out->raw, pd.ipv6, 16);
        return true;
      }
      return false;
    case Profile::RdmaCoreIb:
      // docs/field-reports.md section 4b: only the port GID, subnet prefix (default fe80::/64)
      // + GUID.
      if (index != 0) return false;
      link_local_gid(f, port, 0, out);
      std::memcpy(out->raw, pd.subnet_prefix, 8);
      return true;
    case Profile::Thunderbolt:
    case Profile::RdmaCoreRc:
      break;
  }
  const uint32_t v4 = pd.ipv4_gid_index;
  if (index < v4) {
    // Link-local entries derived from the device GUID, present whatever the address
    // state; index 0 is the port's own, later ones stand for other interfaces.
    link_local_gid(f, port, index, out);
    return true;
  }
  if (index == v4) return ipv4_gid(f, port, out);
  return false;
}

uint32_t gid_type_at(const Fabric& f, int port, uint32_t index) {
  switch (f.devices[f.ports[port].device].profile) {
    case Profile::RdmaCoreRoce: return index % 2 == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
    case Profile::RdmaCoreIb: return IBV_GID_TYPE_IB;
    // Thunderbolt: what Apple's driver reports is unpublished; RoCE v2 is our assumption.
    case Profile::Thunderbolt:
    case Profile::RdmaCoreRc: break;
  }
  return IBV_GID_TYPE_ROCE_V2;
}

std::string port_netdev(const Fabric& f, int port) {
  const PortDef& pd = f.ports[port];
  const Profile p = f.devices[pd.device].profile;
  if (p != Profile::RdmaCoreRoce) return "";
  if (!pd.netdev.empty()) return pd.netdev;
  // Our assumption: one Ethernet interface per port, named after the device ("mlx5_0" port 1 → "mlx5_0p1").
  return f.devices[pd.device].name + "p" + std::to_string(pd.port_num);
}

int port_of_gid(const Fabric& f, const ibv_gid& gid) {
  for (size_t p = 0; p < f.ports.size(); ++p) {
    const uint32_t n = std::min<uint32_t>(gid_table_len(f, static_cast<int>(p)), 16);
    for (uint32_t i = 0; i < n; ++i) {
      ibv_gid g;
      if (gid_at(f, static_cast<int>(p), i, &g) && std::memcmp(&g, &gid, sizeof g) == 0) return static_cast<int>(p);
    }
  }
  return -1;
}

std::string ensure_sysfs(const Fabric& f, int device) {
  const DeviceDef& d = f.devices[device];
  if (d.profile != Profile::RdmaCoreRoce && d.profile != Profile::RdmaCoreIb) return "";
  // <state>/sysfs/<host>/class/infiniband/<dev>: the host is in the path because two hosts
  // may have devices of the same name. The tree is static (slot types and netdevs do not
  // change), so it is written once; files are replaced atomically (rename).
  const std::string dir = f.state_dir + "/sysfs/" + f.hosts[d.host].name + "/class/infiniband/" + d.name;
  std::error_code ec;
  if (std::filesystem::exists(dir + "/.complete", ec)) return dir;
  auto put = [&](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    const std::string tmp = path + ".tmp" + std::to_string(getpid());
    { std::ofstream(tmp) << text << "\n"; }
    std::filesystem::rename(tmp, path, ec);
  };
  for (int gp : d.ports) {
    const std::string pdir = dir + "/ports/" + std::to_string(f.ports[gp].port_num);
    const std::string nd = port_netdev(f, gp);
    for (uint32_t i = 0; i < 6; ++i) {
      if (d.profile == Profile::RdmaCoreIb && i > 0) break;
      // The strings rdma-core's ibv_query_gid_type compares against ("IB/RoCE v1", "RoCE v2").
      put(pdir + "/gid_attrs/types/" + std::to_string(i),
          gid_type_at(f, gp, i) == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
      if (!nd.empty()) put(pdir + "/gid_attrs/ndevs/" + std::to_string(i), nd);
    }
  }
  put(dir + "/.complete", "");
  return dir;
}

// ---------------------------------------------------------------- faults

int fault_check(Fabric& f, const char* verb, int host) {
  Shared* s = f.shm;
  if (__atomic_load_n(&s->nfaults, __ATOMIC_ACQUIRE) == 0) return 0;  // hot path: no faults armed
  Guard g(s->lock);
  for (auto& ft : s->faults) {
    if (ft.kind != kFaultFailCall || std::strcmp(ft.verb, verb) != 0) continue;
    if (ft.host >= 0 && ft.host != host) continue;
    ++ft.seen;
    if (ft.seen >= ft.nth && (ft.count == 0 || ft.failed < ft.count)) {
      ++ft.failed;
      return ft.err;
    }
  }
  return 0;
}

uint32_t fault_delay_us(Fabric& f, int host) {
  Shared* s = f.shm;
  if (__atomic_load_n(&s->nfaults, __ATOMIC_ACQUIRE) == 0) return 0;
  Guard g(s->lock);
  uint32_t d = 0;
  for (auto& ft : s->faults)
    if (ft.kind == kFaultDelay && (ft.host < 0 || ft.host == host) && ft.delay_us > d) d = ft.delay_us;
  return d;
}

bool fault_sticky_loss(Fabric& f, int host) {
  Shared* s = f.shm;
  if (__atomic_load_n(&s->nfaults, __ATOMIC_ACQUIRE) == 0) return false;
  Guard g(s->lock);
  for (auto& ft : s->faults)
    if (ft.kind == kFaultStickyLoss && (ft.host < 0 || ft.host == host)) return true;
  return false;
}

std::string channel_path(const Fabric& f, int32_t pid, uint32_t id) {
  return f.state_dir + "/chan-" + std::to_string(pid) + "-" + std::to_string(id);
}

void remove_dead_channels(const Fabric& f) {
  // A process killed before ibv_destroy_comp_channel leaves its FIFO behind (issue 9: they piled
  // up until gc or reset). The name carries the owner's pid; a pid that is reused by a live
  // process keeps its FIFO, which is harmless (nobody writes to it: its CQs are gone).
  DIR* d = ::opendir(f.state_dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    long pid = 0;
    unsigned long id = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "chan-%ld-%lu%c", &pid, &id, &tail) != 2 || pid <= 0) continue;
    if (!pid_alive(static_cast<int32_t>(pid))) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

}  // namespace emu

// devices: what does tbverbs see on this machine, and which GID would it use?
//
// Lists every RDMA device the verbs library reports, its limits (with the QP budget a job may
// plan with: 10 on Apple whatever max_qp says), how completion waits will wait (on Apple they
// poll: TN3205, "the caller must poll"), each port (state, MTU, link layer, LID, GID table
// length), the populated entries of each port's GID table (IPv4-mapped and link-local entries
// marked), and the GID tbverbs would select for a queue pair, with the reason. When it cannot
// select one, it prints the error with its diagnosis (cause and remedy) instead.
//
//   devices [--library PATH] [--device NAME] [--json]
//
// Exit status: 0 when at least one listed port is active and has a usable GID selection,
// 1 when none has (or the library/device cannot be opened), 2 on a usage error.
// TBVERBS_LIBRARY and TBVERBS_GID_INDEX are honoured exactly as the library honours them.
#include <tbverbs/tbverbs.hpp>

#include <CLI/CLI.hpp>

#if TBVERBS_EXAMPLE_HAVE_JSON
#include <nlohmann/json.hpp>
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

// ---- What we found, collected first and printed afterwards (as text or JSON). ----

struct ErrorReport {
  std::string kind;     // kind_name(), e.g. "no IPv4-mapped GID"
  std::string message;  // Error::message(): step, errno, context, detail, cause and remedy
  std::string cause;    // the diagnosis' cause ("" when the catalogue has none)
  std::string remedy;   // the diagnosis' remedy
};

ErrorReport report(const tbverbs::Error& e) {
  ErrorReport r{std::string(tbverbs::kind_name(e.kind)), e.message(), {}, {}};
  if (const tbverbs::Diagnosis* d = e.diagnosis()) {
    r.cause = d->cause;
    r.remedy = d->remedy;
  }
  return r;
}

struct GidEntry {
  int index = 0;
  std::string gid;
  bool ipv4_mapped = false;
  bool link_local = false;
  std::string ipv4;  // dotted address of an IPv4-mapped entry
  std::string type;  // "RoCE v2", "RoCE v1", "IB"; "" where the platform publishes none (Apple)
  std::string netdev;  // the Ethernet interface behind a RoCE entry, "" when unknown
};

struct Selection {
  int index = 0;
  std::string gid;
  std::string reason;
  std::string described;  // GidSelection::describe(): index, value, type, netdev, LID on InfiniBand
  std::string type;
};

struct PortReport {
  int port = 0;
  std::optional<tbverbs::PortAttributes> attr;
  std::optional<ErrorReport> query_error;
  std::vector<GidEntry> gids;           // populated entries only
  std::optional<Selection> selection;   // what tbverbs would use ...
  std::optional<ErrorReport> selection_error;  // ... or why it cannot
  std::optional<ErrorReport> port_error;       // the port is not active (PD allocation would fail)
  std::string type_source;  // where the GID types came from (GidTable::type_source)
  bool usable() const { return selection && !port_error; }
};

struct DeviceReport {
  std::string name;
  std::optional<std::uint64_t> guid;  // empty: the library does not export ibv_get_device_guid
  tbverbs::Platform platform = tbverbs::Platform::any;
  std::optional<ErrorReport> open_error;
  std::optional<tbverbs::DeviceAttributes> limits;
  int usable_qps = 0;             // tbverbs::usable_qps(): the QP budget
  std::string completions;        // how CompletionQueue::wait waits on this device
  std::vector<PortReport> ports;
};

// The preset QpRecipe::for_platform() would pick for this device, in words.
std::string_view recipe_text(tbverbs::Platform p) {
  return p == tbverbs::Platform::apple ? "QpRecipe::thunderbolt (UC, path MTU 1024, SEND/RECV only, depths in 4 KiB frames)"
                                       : "QpRecipe::rdma_core_rc (RC, path MTU = the port's active MTU (the smaller of both "
                                         "ends'), rnr_retry 7, RDMA WRITE allowed; RoCE v2 GID, by LID on InfiniBand)";
}

std::string_view platform_text(tbverbs::Platform p) {
  switch (p) {
  case tbverbs::Platform::apple: return "Apple RDMA over Thunderbolt";
  case tbverbs::Platform::rdma_core: return "rdma-core";
  case tbverbs::Platform::any: break;
  }
  return "unknown";
}

// "Thunderbolt (100)", "Ethernet (2)": name and number, as ibv_devinfo prints the transport.
std::string link_layer_text(tbverbs::LinkLayer l) {
  return std::string(tbverbs::link_layer_name(l)) + " (" + std::to_string(static_cast<int>(l)) + ")";
}

std::string hex64(std::optional<std::uint64_t> v) {
  if (!v) return "n/a";
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(*v));
  return buf;
}

// How a default CQ waits on this device. Never fails the example: a device without completion
// channels (Apple's driver) polls, and the CQ says why when a channel was wanted and refused.
std::string completion_text(const tbverbs::Context& ctx) {
  auto cq = ctx.create_cq(16);
  if (!cq) return "no CQ: " + cq.error().message().substr(0, cq.error().message().find('\n'));
  if (cq->has_channel()) return "waits sleep on a completion channel";
  std::string s = ctx.platform() == tbverbs::Platform::apple ? "waits poll (TN3205: the caller must poll)"
                                                              : "waits poll";
  if (const auto& note = cq->channel_note()) {
    const std::string m = note->message();
    s += "; " + m.substr(0, m.find('\n'));
  }
  return s;
}

// Everything about one port: attributes, the GID table snapshot and the selection.
PortReport inspect_port(const tbverbs::Context& ctx, std::uint8_t port) {
  PortReport r;
  r.port = port;
  auto attr = ctx.query_port(port);
  if (!attr) {
    r.query_error = report(attr.error());
    return r;
  }
  r.attr = *attr;

  // One snapshot of the whole table: the selection below is made from this same snapshot, so
  // what is printed is exactly what was chosen from.
  auto table = ctx.gid_table(port);
  if (!table) {
    r.query_error = report(table.error());
    return r;
  }
  const auto entries = table->entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const tbverbs::Gid& g = entries[i];
    if (g.is_zero()) continue;  // 1024 slots on Thunderbolt, most of them empty
    GidEntry e;
    e.index = static_cast<int>(i);
    e.gid = g.to_string();
    e.ipv4_mapped = g.is_ipv4_mapped();
    e.link_local = g.is_link_local();
    if (e.ipv4_mapped) e.ipv4 = tbverbs::ipv4_to_string(g.ipv4());
    if (table->type_at(e.index) != tbverbs::GidType::unknown) e.type = tbverbs::gid_type_name(table->type_at(e.index));
    e.netdev = std::string(table->netdev_at(e.index));
    r.gids.push_back(std::move(e));
  }

  // select() is what every tbverbs program calls: TBVERBS_GID_INDEX when set (validated),
  // otherwise the first IPv4-mapped entry.
  if (auto sel = table->select()) {
    r.selection = Selection{sel->index(), sel->gid().to_string(), std::string(sel->reason()), sel->describe(),
                            sel->type() == tbverbs::GidType::unknown ? "" : std::string(tbverbs::gid_type_name(sel->type()))};
    r.type_source = std::string(table->type_source());
  } else {
    r.selection_error = report(sel.error());
  }
  // A usable GID on a port that is down still fails at the first step (ibv_alloc_pd on Apple).
  if (auto active = ctx.require_active_port(port); !active) r.port_error = report(active.error());
  return r;
}

DeviceReport inspect_device(const tbverbs::Library& lib, const tbverbs::Device& dev) {
  DeviceReport d;
  d.name = std::string(dev.name());
  d.guid = dev.guid();
  d.platform = dev.platform();
  auto ctx = tbverbs::Context::open(lib, dev);
  if (!ctx) {
    d.open_error = report(ctx.error());
    return d;
  }
  int ports = 1;
  if (auto attr = ctx->query_device()) {
    d.limits = *attr;
    d.usable_qps = tbverbs::usable_qps(*attr, ctx->platform());
    if (attr->phys_port_cnt > 0) ports = attr->phys_port_cnt;
  }
  d.completions = completion_text(*ctx);
  for (int p = 1; p <= ports && p <= 255; ++p) d.ports.push_back(inspect_port(*ctx, static_cast<std::uint8_t>(p)));
  return d;
}

// ---- Text output ----

// message() is several lines (what failed, then "  cause: ..." and "  remedy: ..."): the first
// gets the label, the others are indented under it.
void print_error(std::ostream& out, const ErrorReport& e, std::string_view indent, std::string_view label) {
  std::istringstream lines(e.message);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    out << indent << (first ? label : std::string_view()) << line << '\n';
    first = false;
  }
}

void print_text(std::ostream& out, const std::string& library, tbverbs::Platform lib_platform,
                const std::vector<DeviceReport>& devices) {
  (void)lib_platform; // guessed from the file name only; each device below says what it is
  out << "library: " << library << '\n';
  for (const DeviceReport& d : devices) {
    out << "\ndevice " << d.name << "  guid " << hex64(d.guid) << "  (" << platform_text(d.platform) << ")\n";
    if (d.open_error) {
      print_error(out, *d.open_error, "  ", "error: ");
      continue;
    }
    if (d.limits)
      out << "  limits: " << d.usable_qps << " usable QPs (max_qp " << d.limits->max_qp << "), " << d.limits->max_mr
          << " memory regions of at most " << d.limits->max_mr_size << " bytes, " << d.limits->max_qp_wr
          << " work requests per queue, " << d.limits->max_sge << " SGEs per request, " << d.limits->max_cqe
          << " CQ entries\n";
    out << "  completions: " << d.completions << '\n';
    out << "  recipe: " << recipe_text(d.platform) << '\n';
    for (const PortReport& p : d.ports) {
      out << "  port " << p.port << ":";
      if (!p.attr) {
        out << '\n';
        print_error(out, *p.query_error, "    ", "error: ");
        continue;
      }
      const tbverbs::PortAttributes& a = *p.attr;
      out << " state " << tbverbs::port_state_name(a.state) << ", active MTU " << tbverbs::mtu_bytes(a.active_mtu)
          << " (max " << tbverbs::mtu_bytes(a.max_mtu) << "), link layer " << link_layer_text(a.link_layer)
          << ", LID " << a.lid << ", GID table length " << a.gid_table_length << '\n';
      if (p.query_error) print_error(out, *p.query_error, "    ", "error: ");
      out << "    GID table (" << p.gids.size() << " populated of " << a.gid_table_length;
      if (!p.type_source.empty() && p.type_source != "none") out << "; types from " << p.type_source;
      out << "):\n";
      // As show_gids lists them: index, GID, then the RoCE version and the netdev where known.
      for (const GidEntry& g : p.gids) {
        out << "      GID[" << g.index << "]  " << g.gid;
        if (!g.type.empty()) out << "  " << g.type;
        if (!g.netdev.empty()) out << "  " << g.netdev;
        if (g.ipv4_mapped) out << "  IPv4-mapped (" << g.ipv4 << ")";
        if (g.link_local) out << "  link-local";
        out << '\n';
      }
      if (p.selection)
        out << "    selected: " << p.selection->described << "  (" << p.selection->reason << ")\n";
      else if (p.selection_error)
        print_error(out, *p.selection_error, "    ", "no usable GID: ");
      if (p.port_error) print_error(out, *p.port_error, "    ", "not usable: ");
    }
  }
}

#if TBVERBS_EXAMPLE_HAVE_JSON
nlohmann::json to_json(const ErrorReport& e) {
  return {{"kind", e.kind}, {"message", e.message}, {"cause", e.cause}, {"remedy", e.remedy}};
}

nlohmann::json to_json(const std::string& library, tbverbs::Platform lib_platform,
                       const std::vector<DeviceReport>& devices, bool usable) {
  nlohmann::json j;
  j["library"] = library;
  j["platform"] = platform_text(lib_platform);
  j["usable"] = usable;
  j["devices"] = nlohmann::json::array();
  for (const DeviceReport& d : devices) {
    nlohmann::json jd{{"name", d.name}, {"guid", hex64(d.guid)}, {"platform", platform_text(d.platform)}};
    if (d.open_error) jd["error"] = to_json(*d.open_error);
    jd["recipe"] = recipe_text(d.platform);
    if (d.limits)
      jd["limits"] = {{"max_qp", d.limits->max_qp},       {"usable_qps", d.usable_qps},
                      {"max_mr", d.limits->max_mr},       {"max_qp_wr", d.limits->max_qp_wr},
                      {"max_sge", d.limits->max_sge},     {"max_cqe", d.limits->max_cqe},
                      {"max_mr_size", d.limits->max_mr_size}};
    jd["completions"] = d.completions;
    jd["ports"] = nlohmann::json::array();
    for (const PortReport& p : d.ports) {
      nlohmann::json jp{{"port", p.port}, {"usable", p.usable()}};
      if (p.attr) {
        jp["state"] = tbverbs::port_state_name(p.attr->state);
        jp["active_mtu"] = tbverbs::mtu_bytes(p.attr->active_mtu);
        jp["max_mtu"] = tbverbs::mtu_bytes(p.attr->max_mtu);
        jp["link_layer"] = link_layer_text(p.attr->link_layer);
        jp["lid"] = p.attr->lid;
        jp["gid_table_length"] = p.attr->gid_table_length;
      }
      if (p.query_error) jp["error"] = to_json(*p.query_error);
      jp["gids"] = nlohmann::json::array();
      for (const GidEntry& g : p.gids) {
        nlohmann::json jg{{"index", g.index}, {"gid", g.gid}, {"ipv4_mapped", g.ipv4_mapped},
                          {"link_local", g.link_local}};
        if (g.ipv4_mapped) jg["ipv4"] = g.ipv4;
        if (!g.type.empty()) jg["type"] = g.type;
        if (!g.netdev.empty()) jg["netdev"] = g.netdev;
        jp["gids"].push_back(std::move(jg));
      }
      if (p.selection)
        jp["selection"] = {{"index", p.selection->index}, {"gid", p.selection->gid}, {"reason", p.selection->reason},
                           {"type", p.selection->type}};
      if (!p.type_source.empty()) jp["gid_type_source"] = p.type_source;
      if (p.selection_error) jp["selection_error"] = to_json(*p.selection_error);
      if (p.port_error) jp["port_error"] = to_json(*p.port_error);
      jd["ports"].push_back(std::move(jp));
    }
    j["devices"].push_back(std::move(jd));
  }
  return j;
}
#endif

} // namespace

int main(int argc, char** argv) {
  std::string library_path, device_name;
  bool json = false;
  CLI::App app{"devices: every RDMA device, its ports and GID table, and the GID selection tbverbs would make"};
  app.add_option("--library", library_path, "verbs library to load (default: $TBVERBS_LIBRARY, then the platform's)");
  app.add_option("--device", device_name, "show only this device");
  app.add_flag("--json", json, "machine-readable output (for bug reports)");
  app.footer("exit status: 0 when a port is active with a usable GID, 1 otherwise, 2 on a usage error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2; // --help is 0; every usage error is 2, as the footer says
  }
#if !TBVERBS_EXAMPLE_HAVE_JSON
  if (json) {
    std::cerr << "this build has no JSON support (nlohmann/json was not found)\n";
    return 2;
  }
#endif

  // A failure before any device is known (no library, no device, wrong name) is one error.
  auto fatal = [&](const tbverbs::Error& e, std::string_view library) {
#if TBVERBS_EXAMPLE_HAVE_JSON
    if (json) {
      nlohmann::json j{{"library", library}, {"usable", false}, {"devices", nlohmann::json::array()},
                       {"error", to_json(report(e))}};
      std::cout << j.dump(2) << '\n';
      return 1;
    }
#endif
    (void)library;
    std::cerr << "error: " << e.message() << '\n';
    return 1;
  };

  auto lib = tbverbs::Library::load(library_path);
  if (!lib) return fatal(lib.error(), library_path);
  const std::string loaded(lib->path());

  auto list = tbverbs::DeviceList::get(*lib);
  if (!list) return fatal(list.error(), loaded);

  std::vector<DeviceReport> devices;
  if (!device_name.empty()) {
    // A wrong name is reported with the names that exist, before anything is opened.
    auto dev = list->find(device_name);
    if (!dev) return fatal(dev.error(), loaded);
    devices.push_back(inspect_device(*lib, *dev));
  } else {
    for (const tbverbs::Device& dev : *list) devices.push_back(inspect_device(*lib, dev));
  }

  bool usable = false;
  for (const DeviceReport& d : devices)
    for (const PortReport& p : d.ports) usable = usable || p.usable();

#if TBVERBS_EXAMPLE_HAVE_JSON
  if (json) {
    std::cout << to_json(loaded, lib->platform(), devices, usable).dump(2) << '\n';
    return usable ? 0 : 1;
  }
#endif
  print_text(std::cout, loaded, lib->platform(), devices);
  if (!usable) std::cout << "\nno active port with a usable GID: see the errors above\n";
  return usable ? 0 : 1;
}

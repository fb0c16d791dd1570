// tbverbs-doctor: preflight checks before a verbs job, one remedy per problem.
//
// Walks the same steps a job takes (load the library, list devices, open each, query ports,
// read the GID table, select a GID, allocate a PD, count the QP and MR budget, see how completion
// waits will wait) and stops at nothing: every problem found is reported with the diagnosis
// catalogue's cause and remedy. Completion channels are not a requirement: where they are
// refused (Apple's driver: TN3205, "the caller must poll") the check passes and says that waits
// poll.
// Exit status: 0 when every checked port can carry a connection, 1 when something is wrong,
// 2 on a usage error. `--json` prints the same findings for a bug report.
#include "../common/cli_args.hpp"

#include <tbverbs/budget.hpp>
#include <tbverbs/tbverbs.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/utsname.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace tbverbs;
using nlohmann::json;

namespace {

// A job to budget (--ranks N): its topology, and the sizes ring_all_sum uses by default.
struct JobPlan {
  int ranks = 0;                 // 0: no job given
  std::string topology = "ring"; // ring: two neighbours; mesh: every other rank
  int cables = 1;                // cables per neighbour
  std::size_t message_bytes = 256 * 1024;
  int window = 8;
  std::size_t buffer_bytes = 0;  // registered user buffers (input and output), 0: staged
  std::size_t devices = 1;       // devices on this host the links are spread over
  /// Links (QPs) of this host's job on one device.
  int links_per_device() const {
    const int peers = topology == "mesh" ? ranks - 1 : 2;
    const int links = peers * cables;
    const int d = static_cast<int>(std::max<std::size_t>(1, devices));
    return (links + d - 1) / d;
  }
};

struct Finding {
  std::string check;   // what was checked ("port rdma_en2:1 state")
  bool ok = true;
  std::string detail;  // what was found
  std::string cause;   // for a problem: why, from the catalogue
  std::string remedy;  // for a problem: what to do
  std::string diagnosis; // for a problem: the catalogue entry's id ("no-ipv4-gid-macos"), "" when none
  std::string errno_name; // for a problem: the errno by its <cerrno> name ("ENOMEM"), "" when none
  int errno_value = 0;    // ... and its number on this platform (0 when none)
};

std::string first_line(const std::string& m) { return m.substr(0, m.find('\n')); }

struct Report {
  std::vector<Finding> findings;
  void pass(std::string check, std::string detail) { findings.push_back({std::move(check), true, std::move(detail), {}, {}, {}, {}, 0}); }
  void problem(std::string check, const Error& e) {
    Finding f{std::move(check), false, e.message(), {}, {}, {}, std::string(e.errno_name()), e.sys_errno};
    // message() already carries cause and remedy; keep them apart too for --json readers.
    if (const Diagnosis* d = e.diagnosis()) {
      f.cause = d->cause;
      f.remedy = d->remedy;
      f.diagnosis = d->id;
      f.detail = f.detail.substr(0, f.detail.find("\n  cause:"));
    }
    findings.push_back(std::move(f));
  }
  bool healthy() const {
    for (const auto& f : findings)
      if (!f.ok) return false;
    return !findings.empty();
  }
};

// How CompletionQueue::wait will wait on this device, and whether completion channels work when
// asked for explicitly. Never a problem: without channels, waits poll (the library falls back).
void check_completions(Report& report, const Context& ctx, const std::string& dev) {
  auto cq = ctx.create_cq(16); // what a job gets by default
  if (!cq) return report.problem("completion queue " + dev, cq.error());
  std::string how = cq->has_channel() ? "waits sleep on a completion channel"
                                      : (ctx.platform() == Platform::apple
                                             ? "waits poll (Apple: TN3205, the caller must poll)"
                                             : "waits poll");
  if (cq->channel_note()) how += "; " + first_line(cq->channel_note()->message());
  report.pass("completion queue " + dev, how);
  auto probe = ctx.create_cq(16, CqWait::channel);
  if (!probe) return report.problem("completion channels " + dev, probe.error());
  if (probe->has_channel())
    report.pass("completion channels " + dev, "supported (ibv_create_comp_channel and ibv_req_notify_cq work)");
  else
    report.pass("completion channels " + dev,
                "not available: " + first_line(probe->channel_note() ? probe->channel_note()->message() : "") +
                    "; tbverbs polls instead");
}

// The job's budget on this device (budget.hpp): QPs, CQs, PDs, MRs and frames per queue, before
// anything is created; one finding listing every shortfall.
void check_budget_of(Report& report, const Context& ctx, const std::string& dev, const JobPlan& job) {
  auto limits = DeviceLimits::of(ctx);
  if (!limits) return report.problem("budget " + dev, limits.error());
  JobShape shape;
  shape.links = job.links_per_device();
  shape.message_bytes = job.message_bytes;
  shape.window = job.window;
  // Like ring_all_sum: the window lowered to fit 4095 frames; user buffers and scratch slots.
  if (limits->frames) {
    const std::uint32_t f = frames_of(job.message_bytes);
    const int fit = static_cast<int>((max_depth_frames - f) / (2 * f));
    shape.window = std::max(1, std::min(shape.window, fit));
  }
  if (job.buffer_bytes > 0) shape.buffers = {job.buffer_bytes, job.buffer_bytes};
  shape.buffers.push_back((job.buffer_bytes > 0 ? 2 : 4) * 2 * static_cast<std::size_t>(shape.window) * job.message_bytes + 4096);
  auto needs = JobNeeds::of(shape, *limits);
  if (!needs) return report.problem("budget " + dev, needs.error());
  const std::string what = "budget " + dev + " (" + job.topology + " of " + std::to_string(job.ranks) + " ranks, " +
                           std::to_string(shape.links) + " link(s) on this device)";
  const auto sf = shortfalls(*needs, *limits);
  if (sf.empty()) return report.pass(what, budget_summary(*needs, *limits));
  Finding f{what, false, {}, {}, {}, {}, {}, 0};
  for (std::size_t i = 0; i < sf.size(); ++i) f.detail += (i ? "; " : "") + sf[i].to_string();
  f.cause = "the job needs more of this device than it allows, so it would fail at the verb that runs out "
            "(create_qp EBUSY at the 11th QP on Apple, reg_mr at about the 100th region)";
  f.remedy = "fewer links per device (more cables and devices, fewer ranks in a mesh), smaller messages or a "
             "smaller window, staged memory (fewer regions)";
  report.findings.push_back(std::move(f));
}

void check_device(Report& report, const Library& lib, const Device& device, int qp_need, const JobPlan& job) {
  const std::string dev(device.name());
  auto ctx = Context::open(lib, device);
  if (!ctx) return report.problem("open " + dev, ctx.error());
  auto attrs = ctx->query_device();
  if (!attrs) return report.problem("query " + dev, attrs.error());
  const int usable = usable_qps(*attrs, ctx->platform());
  report.pass("device " + dev,
              std::string(ctx->platform() == Platform::apple ? "Apple Thunderbolt" : "rdma-core") + ", " +
                  std::to_string(attrs->phys_port_cnt) + " port(s), max_qp " + std::to_string(attrs->max_qp) +
                  ", " + std::to_string(attrs->max_mr) + " MRs of at most " + std::to_string(attrs->max_mr_size) +
                  " bytes, " + std::to_string(attrs->max_cqe) + " CQ entries, max_sge " +
                  std::to_string(attrs->max_sge));
  // The budget a job may plan with: 10 on Apple whatever max_qp says (TN3205; Macs report 11).
  if (qp_need > 0 && usable > 0 && qp_need > usable) {
    Error e = Error::make(Step::create_qp, ErrorKind::capacity,
                          "the job needs " + std::to_string(qp_need) + " QPs on this device, the device allows " +
                              std::to_string(usable));
    report.problem("QP budget " + dev, e.on(dev).from(ctx->platform()));
  } else {
    std::string d = std::to_string(usable) + " usable QPs";
    if (ctx->platform() == Platform::apple && attrs->max_qp != usable)
      d += " (max_qp reports " + std::to_string(attrs->max_qp) + "; Apple's driver allows " +
           std::to_string(apple_usable_qps) + " per device, TN3205)";
    if (qp_need > 0) d += "; the job needs " + std::to_string(qp_need);
    report.pass("QP budget " + dev, d);
  }
  if (job.ranks > 0) check_budget_of(report, *ctx, dev, job);
  check_completions(report, *ctx, dev);
  const int ports = attrs->phys_port_cnt > 0 ? attrs->phys_port_cnt : 1;
  for (int p = 1; p <= ports; ++p) {
    const std::string where = dev + ":" + std::to_string(p);
    auto port = ctx->require_active_port(static_cast<std::uint8_t>(p));
    if (!port) {
      report.problem("port " + where + " state", port.error());
      continue;
    }
    report.pass("port " + where + " state", std::string(port_state_name(port->state)) + ", link layer " +
                                               std::string(link_layer_name(port->link_layer)) + " (" +
                                               std::to_string(static_cast<int>(port->link_layer)) +
                                               "), active MTU " + std::to_string(mtu_bytes(port->active_mtu)) +
                                               ", GID table " + std::to_string(port->gid_table_length));
    auto table = ctx->gid_table(static_cast<std::uint8_t>(p));
    if (!table) {
      report.problem("GID table " + where, table.error());
      continue;
    }
    {
      // The populated entries as show_gids lists them (index, GID, RoCE version, netdev).
      std::string listing;
      int shown = 0, populated = 0;
      for (std::size_t i = 0; i < table->size(); ++i) {
        const int idx = static_cast<int>(i);
        if (table->at(idx).is_zero()) continue;
        if (++populated > 8) continue;
        listing += (shown++ ? "; " : "") + ("GID[" + std::to_string(i) + "] " + table->at(idx).to_string());
        if (table->type_at(idx) != GidType::unknown) listing += " " + std::string(gid_type_name(table->type_at(idx)));
        if (!table->netdev_at(idx).empty()) listing += " " + std::string(table->netdev_at(idx));
      }
      if (populated > shown) listing += " (+" + std::to_string(populated - shown) + " more)";
      if (populated == 0) listing = "empty";
      report.pass("GID table " + where, listing);
    }
    auto sel = table->select();
    if (!sel) {
      report.problem("GID selection " + where, sel.error());
      continue;
    }
    report.pass("GID selection " + where, sel->describe() + " (" + std::string(sel->reason()) + ")");
    // Apple's driver refuses PDs on a port that is down even when the query says otherwise.
    auto pd = ctx->alloc_pd();
    if (!pd) report.problem("protection domain " + where, pd.error());
    else report.pass("protection domain " + where, "allocated");
  }
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"tbverbs-doctor: checks the verbs library, devices, ports and GIDs, one remedy per problem"};
  std::string library, device;
  int qp_need = 0;
  bool as_json = false;
  app.add_option("--library", library, "verbs library to load (default: TBVERBS_LIBRARY, then the platform's)");
  app.add_option("--device", device, "check only this device (default: all)");
  app.add_option("--qps", qp_need, "QPs the job will create per device, 1..65536 (checked against the device's cap)")
      ->check(CLI::Range(1, 65536));
  app.add_flag("--json", as_json, "print the findings as JSON (for bug reports)");
  JobPlan job;
  std::string msg = "256K", size;
  app.add_option("--ranks", job.ranks, "budget a job of N ranks (2..64) on each device (QPs, CQs, PDs, MRs, frames per queue)")
      ->check(CLI::Range(2, 64));
  app.add_option("--topology", job.topology, "--ranks: ring (two neighbours) or mesh (every other rank)")
      ->check(CLI::IsMember({"ring", "mesh"}))
      ->capture_default_str();
  app.add_option("--cables", job.cables, "--ranks: cables per neighbour")->check(CLI::Range(1, 64))->capture_default_str();
  // Sizes through the one size parser (tools/common/size_arg.hpp; issue 19: the doctor's own
  // aborted on 20 digits and wrapped 17179869185G to 1 GiB).
  app.add_option("--message-bytes", msg, "--ranks: largest message (e.g. 256K)")
      ->check(cli::size_validator())
      ->capture_default_str();
  app.add_option("--window", job.window, "--ranks: messages in flight per direction")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--size", size, "--ranks: registered user buffers per rank (e.g. 64M; default staged)")
      ->check(cli::size_validator());
  if (const int rc = cli::parse_args(app, argc, argv); rc >= 0) return rc;
  job.message_bytes = *cli::parse_size(msg);  // checked by size_validator
  job.buffer_bytes = size.empty() ? 0 : *cli::parse_size(size);
  // The doctor reports channel fallbacks as findings; the library's stderr notice would repeat them.
  set_notice_handler(nullptr);

  Report report;
  auto lib = Library::load(library);
  if (!lib) {
    report.problem("load verbs library", lib.error());
  } else {
    report.pass("load verbs library", std::string(lib->path()));
    auto list = DeviceList::get(*lib);
    if (!list) {
      report.problem("list devices", list.error());
    } else {
      report.pass("list devices", list->names());
      if (!device.empty()) {
        auto d = list->find(device);
        if (!d) report.problem("find " + device, d.error());
        else check_device(report, *lib, *d, qp_need, job);
      } else {
        job.devices = list->size();
        for (const Device& d : *list) check_device(report, *lib, d, qp_need, job);
      }
    }
  }

  if (as_json) {
    utsname u{};
    ::uname(&u);
    json j;
    j["tool"] = "tbverbs-doctor";
    j["tbverbs_version"] = std::to_string(TBVERBS_VERSION_MAJOR) + "." + std::to_string(TBVERBS_VERSION_MINOR) + "." +
                           std::to_string(TBVERBS_VERSION_PATCH);
    j["system"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
    j["healthy"] = report.healthy();
    j["findings"] = json::array();
    // diagnosis (the catalogue id) and errno (its <cerrno> name; errno_value the number here) are
    // fields of their own, so a bug report can be matched without parsing the detail text; null
    // where a finding has none.
    auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
    for (const auto& f : report.findings)
      j["findings"].push_back({{"check", f.check},
                               {"ok", f.ok},
                               {"detail", f.detail},
                               {"diagnosis", or_null(f.diagnosis)},
                               {"errno", or_null(f.errno_name)},
                               {"errno_value", f.errno_value != 0 ? json(f.errno_value) : json(nullptr)},
                               {"cause", f.cause},
                               {"remedy", f.remedy}});
    std::puts(j.dump(2).c_str());
  } else {
    int problems = 0;
    for (const auto& f : report.findings) {
      std::printf("[%s] %s: %s\n", f.ok ? " ok " : "FAIL", f.check.c_str(), f.detail.c_str());
      if (!f.ok) {
        ++problems;
        if (!f.cause.empty()) std::printf("       cause:  %s\n", f.cause.c_str());
        if (!f.remedy.empty()) std::printf("       remedy: %s\n", f.remedy.c_str());
      }
    }
    std::printf("%s\n", report.healthy() ? "tbverbs-doctor: all checks passed"
                                         : ("tbverbs-doctor: " + std::to_string(problems) + " problem(s) found").c_str());
  }
  return report.healthy() ? 0 : 1;
}

// tbverbs-emu: the emulated verbs fabric's command line.
//
// Runs N ranks of a program on a fabric made for the run (`run`, run_job.hpp), writes fabrics
// (`fabric`), changes the shared run-time state of a fabric (addresses, port state, faults)
// through the C control API, and can act as an orphaned QP holder.
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "run_job.hpp"
#include <tbverbs/detail/printable.hpp>
#include "tbverbs_emu/control.h"
#include "trace_timeline.hpp"

namespace {

struct ErrnoName {
  const char* name;
  int value;
};
const ErrnoName kErrnos[] = {
    {"EPERM", EPERM},       {"ENOENT", ENOENT},       {"EINTR", EINTR},         {"EIO", EIO},
    {"EAGAIN", EAGAIN},     {"ENOMEM", ENOMEM},       {"EACCES", EACCES},       {"EFAULT", EFAULT},
    {"EBUSY", EBUSY},       {"ENODEV", ENODEV},       {"EINVAL", EINVAL},       {"ENOSPC", ENOSPC},
    {"ENOSYS", ENOSYS},     {"ENODATA", ENODATA},     {"ETIMEDOUT", ETIMEDOUT}, {"EOPNOTSUPP", EOPNOTSUPP},
    {"ENOTSUP", ENOTSUP},   {"ENETDOWN", ENETDOWN},   {"ENETUNREACH", ENETUNREACH},
    {"ECONNREFUSED", ECONNREFUSED}, {"EHOSTUNREACH", EHOSTUNREACH}, {"ECONNRESET", ECONNRESET},
};

// The largest errno a system call returns on Linux (MAX_ERRNO in include/linux/err.h).
constexpr int kMaxErrno = 4095;

int parse_errno(const std::string& s) {
  for (const auto& e : kErrnos)
    if (s == e.name) return e.value;
  try {
    size_t used = 0;
    int v = std::stoi(s, &used);
    if (used == s.size() && v > 0 && v <= kMaxErrno) return v;
    if (used == s.size())
      throw CLI::ValidationError("--errno", s + " is not an errno (1.." + std::to_string(kMaxErrno) + ", or a name like EBUSY)");
  } catch (const CLI::ValidationError&) {
    throw;
  } catch (...) {
  }
  throw CLI::ValidationError("--errno", "unknown errno \"" + s + "\" (use a name like EBUSY or a number)");
}

// Text that may hold bytes of a file or another process (a fabric file's JSON error quotes it),
// with control characters escaped (the library's one printable()): printed, it cannot move the
// terminal's cursor or forge a line.
std::string printable(const std::string& text) { return tbverbs::detail::printable(text, 2000); }

int check(int rc) {
  if (rc != 0) {
    std::fprintf(stderr, "tbverbs-emu: %s (%s)\n", printable(tbemu_last_error()).c_str(), std::strerror(rc));
    return 1;
  }
  return 0;
}

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

// Opens `device` on `host` and creates `n` UC QPs, then keeps them until killed or
// `seconds` pass: the "orphaned runner still holding the QPs" of the field reports.
int hold_qps(const std::string& fabric, const std::string& host, const std::string& device, int n, int seconds,
             bool daemonize, const std::string& pidfile) {
  // The pid file is written once the QPs are held; a path it cannot be written to is refused
  // before anything is held (a caller that waits for it would wait for ever).
  if (!pidfile.empty()) {
    std::ofstream probe(pidfile, std::ios::app);
    if (!probe) {
      std::fprintf(stderr, "tbverbs-emu: --pidfile %s: cannot be written (%s)\n", printable(pidfile).c_str(), std::strerror(errno));
      return 2;
    }
  }
  if (!fabric.empty()) setenv("TBVERBS_EMU_FABRIC", fabric.c_str(), 1);
  setenv("TBVERBS_EMU_HOST", host.c_str(), 1);
  int ready[2] = {-1, -1};
  if (daemonize) {
    // Double fork: the holder is reparented to init, like an orphaned runner.
    if (pipe(ready) != 0) return 1;
    pid_t p = fork();
    if (p < 0) return 1;
    if (p > 0) {
      close(ready[1]);
      char buf[64] = {};
      ssize_t r = read(ready[0], buf, sizeof buf - 1);
      if (r <= 0) {
        std::fprintf(stderr, "tbverbs-emu: holder failed to start\n");
        return 1;
      }
      std::printf("%s", buf);
      std::fflush(stdout);
      return std::strncmp(buf, "holding", 7) == 0 ? 0 : 1;
    }
    close(ready[0]);
    setsid();
    if (fork() != 0) _exit(0);
  }
  auto say = [&](const std::string& msg) {
    if (ready[1] >= 0) {
      ssize_t w = write(ready[1], msg.data(), msg.size());
      (void)w;
      close(ready[1]);
      ready[1] = -1;
    } else {
      std::printf("%s", msg.c_str());
      std::fflush(stdout);
    }
  };
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  ibv_device* dev = nullptr;
  for (int i = 0; list && i < num; ++i)
    if (device == ibv_get_device_name(list[i])) dev = list[i];
  if (!dev) {
    say("error: no device " + device + " on host " + host + "\n");
    return 1;
  }
  ibv_context* ctx = ibv_open_device(dev);
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
  if (!cq) {
    say(std::string("error: cannot set up device: ") + std::strerror(errno) + "\n");
    return 1;
  }
  std::vector<ibv_qp*> qps;
  for (int i = 0; i < n; ++i) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 1;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.qp_type = IBV_QPT_UC;
    ibv_qp* q = ibv_create_qp(pd, &a);
    if (!q) {
      say(std::string("error: create_qp #") + std::to_string(i + 1) + ": " + std::strerror(errno) + "\n");
      return 1;
    }
    qps.push_back(q);
  }
  if (!pidfile.empty()) {
    std::ofstream out(pidfile);
    out << getpid() << "\n";
    if (!out.flush()) {
      say("error: --pidfile " + pidfile + ": the write failed\n");
      return 1;
    }
  }
  say("holding " + std::to_string(n) + " QPs on " + host + ":" + device + " pid " + std::to_string(getpid()) + "\n");
  if (daemonize) {
    // Detach from the terminal/ctest pipes so the caller is not kept waiting.
    freopen("/dev/null", "r", stdin);
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!g_stop && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (auto* q : qps) ibv_destroy_qp(q);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  if (!pidfile.empty()) unlink(pidfile.c_str());
  return 0;
}

// The fabric options `run` and `fabric` share.
void add_fabric_options(CLI::App* sub, emu_cli::FabricSpec& f) {
  sub->add_option("-n,--ranks", f.hosts, "number of ranks (hosts), 2..64")->required();
  sub->add_option("--profile", f.profile,
                  "the emulated NICs: thunderbolt (Apple's driver), usb4-rdma (Linux Thunderbolt), rdma-core-rc, "
                  "rdma-core-roce or rdma-core-ib; a comma-separated list gives the hosts its profiles in turn")
      ->capture_default_str();
  sub->add_option("--cables", f.cables, "cables between ring neighbours, 1..16")->capture_default_str();
  sub->add_flag("--mesh", f.mesh, "a cable between every pair of hosts instead of a ring");
  sub->add_option("--quirk", f.quirks, "a contested reading of Apple's driver to play, NAME=VALUE (repeatable; docs/emulator.md)")
      ->allow_extra_args(false); // one value per --quirk: the next word is not a quirk
  sub->add_option("--link-gbps", f.link.gbytes_per_s, "pace every cable direction at this bandwidth (GB/s; 0: unpaced)");
  sub->add_option("--link-latency-us", f.link.latency_us, "and deliver each message this many us later");
}

// The emulated verbs library this program runs on (it links it): the ranks load the same one.
std::string own_emu_library() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&tbemu_describe), &info) != 0 && info.dli_fname != nullptr) {
    char resolved[4096];
    if (::realpath(info.dli_fname, resolved) != nullptr) return resolved;
    return info.dli_fname;
  }
  return "";
}

// `fabric`: writes the fabric file (and the device file) of `f`.
int write_fabric(const emu_cli::FabricSpec& f, const std::string& out, const std::string& devices) {
  if (const std::string why = emu_cli::refused(f); !why.empty()) {
    std::fprintf(stderr, "tbverbs-emu fabric: %s\n", why.c_str());
    return 2;
  }
  std::ofstream fo(out);
  fo << emu_cli::fabric_of(f).dump(2) << "\n";
  if (!fo.flush()) {
    std::fprintf(stderr, "tbverbs-emu fabric: %s: cannot be written (%s)\n", printable(out).c_str(), std::strerror(errno));
    return 1;
  }
  std::printf("wrote the fabric of a %d-host %s to %s\n", f.hosts, f.mesh ? "mesh" : "ring", out.c_str());
  if (!devices.empty()) {
    std::ofstream d(devices);
    d << emu_cli::devices_of(f).dump() << "\n";
    if (!d.flush()) {
      std::fprintf(stderr, "tbverbs-emu fabric: %s: cannot be written (%s)\n", printable(devices).c_str(), std::strerror(errno));
      return 1;
    }
    std::printf("wrote its device file to %s\n", devices.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Control the tbverbs emulated verbs fabric (state shared by every process on it)"};
  std::string fabric;
  app.add_option("--fabric,-f", fabric, "Fabric description file (default: $TBVERBS_EMU_FABRIC)");
  app.require_subcommand(1);
  auto fab = [&]() -> const char* { return fabric.empty() ? nullptr : fabric.c_str(); };

  auto* show = app.add_subcommand("show", "Print ports, addresses, QPs and faults");
  auto* reset = app.add_subcommand("reset", "Return ports/addresses to the fabric file and clear faults");
  auto* sdir = app.add_subcommand("state-dir", "Print the shared state directory");
  std::string trace_file;
  auto* trace = app.add_subcommand("trace", "Print a trace file (TBVERBS_EMU_TRACE=FILE) as a per-QP timeline");
  trace->add_option("file", trace_file)->required();
  auto* gc = app.add_subcommand("gc", "Remove state directories whose fabric file and processes are gone");
  bool dry_run = false;
  gc->add_flag("--dry-run", dry_run, "only list what would be removed");
  std::string gc_under;
  gc->add_option("--fabrics-under", gc_under,
                 "also remove the state of fabric files under this directory (they stay; their user is done)")
      ->check(CLI::ExistingDirectory);

  std::string host, device, cidr;
  int port = 1;
  auto* setip = app.add_subcommand("set-ipv4", "Assign an IPv4 address (GID ::ffff:a.b.c.d at index 1)");
  setip->add_option("host", host)->required();
  setip->add_option("device", device)->required();
  setip->add_option("cidr", cidr, "a.b.c.d/prefix")->required();
  setip->add_option("--port", port)->check(CLI::Range(1, 255));
  auto* clrip = app.add_subcommand("clear-ipv4", "Remove a port's IPv4 address");
  clrip->add_option("host", host)->required();
  clrip->add_option("device", device)->required();
  clrip->add_option("--port", port)->check(CLI::Range(1, 255));
  auto* pdown = app.add_subcommand("port-down", "Take a port down (both cable ends report PORT_DOWN)");
  pdown->add_option("host", host)->required();
  pdown->add_option("device", device)->required();
  pdown->add_option("--port", port)->check(CLI::Range(1, 255));
  auto* pup = app.add_subcommand("port-up", "Bring a port up");
  pup->add_option("host", host)->required();
  pup->add_option("device", device)->required();
  pup->add_option("--port", port)->check(CLI::Range(1, 255));

  auto* dremove = app.add_subcommand(
      "device-remove", "Remove a device (hot unplug): IBV_EVENT_DEVICE_FATAL, its QPs to ERR, its ports down");
  dremove->add_option("host", host)->required();
  dremove->add_option("device", device)->required();
  auto* drestore = app.add_subcommand("device-restore", "Bring a removed device back (new contexts only)");
  drestore->add_option("host", host)->required();
  drestore->add_option("device", device)->required();

  auto* fault = app.add_subcommand("fault", "Inject or clear faults");
  fault->require_subcommand(1);
  std::string verb, err_s, fhost, next_on;
  uint64_t nth = 1;
  uint32_t count = 1, usec = 0, qpn = 0;
  // CLI11 reads "-1" into an unsigned option as its wrapped value (--nth -1 set a fault at call
  // 18446744073709551615): unsigned options take digits only (hexadecimal where said).
  const CLI::Validator digits(
      [](std::string& v) {
        const bool hex = v.rfind("0x", 0) == 0 || v.rfind("0X", 0) == 0;
        const std::string body = hex ? v.substr(2) : v;
        return !body.empty() && body.find_first_not_of(hex ? "0123456789abcdefABCDEF" : "0123456789") == std::string::npos
                   ? std::string()
                   : "not a number of 0 or more: " + v;
      },
      "UINT");
  auto* ffail = fault->add_subcommand("fail", "Fail the nth call of a verb with an errno");
  ffail->add_option("--verb", verb, "e.g. ibv_create_qp, ibv_modify_qp, ibv_post_send")->required();
  ffail->add_option("--nth", nth, "first failing call, 1-based (default 1)")->check(digits)->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  ffail->add_option("--errno", err_s, "errno name or number, e.g. EBUSY")->required();
  ffail->add_option("--count", count, "how many calls fail (0 = all from nth on; default 1)")->check(digits);
  ffail->add_option("--host", fhost, "only calls made on this host");
  auto* fdrop = fault->add_subcommand("drop", "Lose everything one QP sends (one direction)");
  auto* o_qpn = fdrop->add_option("--qpn", qpn, "QP number (decimal or 0x...)")->check(digits);
  auto* o_next = fdrop->add_option("--next-on", next_on, "the next QP created on this host");
  o_qpn->excludes(o_next);
  uint32_t fatal_qpn = 0;
  auto* ffatal = fault->add_subcommand(
      "qp-fatal", "A catastrophic QP error: the QP goes to ERR, its owner gets IBV_EVENT_QP_FATAL and flushes");
  ffatal->add_option("--qpn", fatal_qpn, "QP number (decimal or 0x...)")->required()->check(digits);
  auto* fdelay = fault->add_subcommand("delay", "Delay delivery of sends posted on a host");
  fdelay->add_option("--usec", usec)->required()->check(digits)->check(CLI::Range(0u, 3600u * 1000000u));
  fdelay->add_option("--host", fhost);
  auto* fsticky = fault->add_subcommand(
      "sticky-loss", "A UC send meeting no posted receive kills that direction for good (Apple, as reported)");
  fsticky->add_option("--host", fhost);
  int nleak = 0;
  std::string lhost, ldev;
  auto* fleak = fault->add_subcommand(
      "leak-pds", "Protection domains leaked by orphaned processes (count against max_pd until reset; RTR ENODATA)");
  fleak->add_option("host", lhost)->required();
  fleak->add_option("device", ldev)->required();
  fleak->add_option("n", nleak, "how many PDs")->required()->check(CLI::Range(1, 1024));
  auto* fclear = fault->add_subcommand("clear", "Remove every fault (leaked PDs included)");

  std::vector<std::string> quirk_args;
  auto* quirk = app.add_subcommand(
      "quirk", "Set quirks for every process on the fabric, e.g. quirk empty_rq=drop macos=26.2 (none: list them)");
  quirk->add_option("assignments", quirk_args, "NAME=VALUE ...");

  std::string sig_s = "KILL";
  auto* killh = app.add_subcommand("kill-host", "Peer death: signal every process holding a QP on a host");
  killh->add_option("host", host)->required();
  killh->add_option("--signal", sig_s, "KILL (default), TERM, STOP, CONT or a number");

  int n = 10, seconds = 3600;
  bool daemonize = false;
  std::string pidfile;
  auto* hold = app.add_subcommand("hold-qps", "Create QPs on a device and keep them (orphaned holder)");
  hold->add_option("host", host)->required();
  hold->add_option("device", device)->required();
  // Issue 19, finding 7: -n -1 and --seconds -1 were taken (a holder of no QPs, gone at once).
  hold->add_option("-n,--count", n, "number of QPs, 1..256 (default 10)")->check(CLI::Range(1, 256));
  hold->add_option("--seconds", seconds, "give them back after this long, 1..31536000 (default 3600)")
      ->check(CLI::Range(1, 31536000));
  hold->add_flag("--daemon", daemonize, "detach (double fork) so the holder is an orphan of init");
  hold->add_option("--pidfile", pidfile, "write the holder's pid here");

  emu_cli::RunOptions ro;
  long grace_ms = 5000, fault_after_ms = 0;
  int kill_rank = -1, stop_rank = -1;
  auto* run = app.add_subcommand(
      "run", "Run N ranks of a program on an emulated fabric made for the run: tbverbs-emu run -n 3 -- ./my_program ARGS");
  add_fabric_options(run, ro.spec);
  run->add_option("--emu-library", ro.emu_library, "the emulated verbs library the ranks load (default: this program's)");
  run->add_flag("--no-device-file", ro.no_device_file, "give the ranks no device file: they discover the cables from the subnets");
  run->add_option("--grace-ms", grace_ms, "after the first rank fails, how long the others may take to stop (default 5000)")
      ->check(CLI::Range(0L, 3600000L));
  auto* o_kill = run->add_option("--kill-rank", kill_rank, "SIGKILL this rank during the run (a failure test)")->check(CLI::Range(0, 63));
  auto* o_stop = run->add_option("--stop-rank", stop_rank, "SIGSTOP this rank during the run (alive but silent)")->check(CLI::Range(0, 63));
  o_kill->excludes(o_stop);
  run->add_option("--kill-after", fault_after_ms, "ms after the start (or after --kill-after-line) to fire it")
      ->check(CLI::Range(0L, 3600000L));
  run->add_option("--kill-after-line", ro.fault_after_line,
                  "fire it once a rank printed a line containing this text (the job says it is running)");
  run->add_flag("--keep", ro.keep, "keep the temporary directory (fabric, device file, state)");
  run->add_flag("-q,--quiet", ro.quiet, "no set-up line of the launcher's own");
  run->add_option("program", ro.program, "PROGRAM ARGS... (after --)")->required();

  emu_cli::FabricSpec fspec;
  std::string fabric_out, devices_out;
  auto* fabric_cmd = app.add_subcommand("fabric", "Write the fabric file of N emulated hosts (and its device file)");
  add_fabric_options(fabric_cmd, fspec);
  fabric_cmd->add_option("-o,--out", fabric_out, "the fabric file to write")->required();
  fabric_cmd->add_option("--devices", devices_out, "also write the JACCL-style device file here");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; every usage error is 2, as the other commands' own
  }

  if (*run) {
    ro.fabric = fabric;
    if (ro.emu_library.empty()) ro.emu_library = own_emu_library();
    ro.grace = std::chrono::milliseconds(grace_ms);
    ro.fault_rank = kill_rank >= 0 ? kill_rank : stop_rank;
    ro.stop = stop_rank >= 0;
    ro.fault_after = std::chrono::milliseconds(fault_after_ms);
    return emu_cli::run_job(ro);
  }
  if (*fabric_cmd) return write_fabric(fspec, fabric_out, devices_out);
  if (*show) {
    const char* s = tbemu_describe(fab());
    if (!s) return check(EINVAL);
    std::fputs(s, stdout);
    return 0;
  }
  if (*trace) return tbverbs_emu_cli::print_trace_timeline(trace_file);
  if (*reset) return check(tbemu_reset(fab()));
  if (*gc) {
    int n = 0;
    std::fputs(tbemu_gc_under(gc_under.empty() ? nullptr : gc_under.c_str(), dry_run ? 1 : 0, &n), stdout);
    std::printf("%s %d state director%s\n", dry_run ? "would remove" : "removed", n, n == 1 ? "y" : "ies");
    return 0;
  }
  if (*sdir) {
    const char* s = tbemu_state_dir(fab());
    if (!s) return check(EINVAL);
    std::puts(s);
    return 0;
  }
  if (*setip) return check(tbemu_set_ipv4(fab(), host.c_str(), device.c_str(), port, cidr.c_str()));
  if (*clrip) return check(tbemu_clear_ipv4(fab(), host.c_str(), device.c_str(), port));
  if (*pdown) return check(tbemu_set_port_up(fab(), host.c_str(), device.c_str(), port, 0));
  if (*pup) return check(tbemu_set_port_up(fab(), host.c_str(), device.c_str(), port, 1));
  if (*dremove) return check(tbemu_set_device_removed(fab(), host.c_str(), device.c_str(), 1));
  if (*drestore) return check(tbemu_set_device_removed(fab(), host.c_str(), device.c_str(), 0));
  if (*ffail) {
    int e;
    try {
      e = parse_errno(err_s);
    } catch (const CLI::Error& ex) {
      app.exit(ex);
      return 2;
    }
    return check(tbemu_fault_fail_call(fab(), fhost.empty() ? nullptr : fhost.c_str(), verb.c_str(), nth, e, count));
  }
  if (*fdrop) {
    if (*o_qpn) return check(tbemu_fault_drop_qp(fab(), qpn));
    if (*o_next) return check(tbemu_fault_drop_next_qp(fab(), next_on.c_str()));
    std::fprintf(stderr, "tbverbs-emu: fault drop needs --qpn or --next-on\n");
    return 2;
  }
  if (*ffatal) return check(tbemu_fault_qp_fatal(fab(), fatal_qpn));
  if (*fdelay) return check(tbemu_fault_delay(fab(), fhost.empty() ? nullptr : fhost.c_str(), usec));
  if (*fsticky) return check(tbemu_fault_sticky_loss(fab(), fhost.empty() ? nullptr : fhost.c_str()));
  if (*fleak) return check(tbemu_fault_leak_pds(fab(), lhost.c_str(), ldev.c_str(), nleak));
  if (*fclear) return check(tbemu_fault_clear(fab()));
  if (*quirk) {
    std::string joined;
    for (const auto& a : quirk_args) joined += (joined.empty() ? "" : ",") + a;
    if (!joined.empty())
      if (int rc = check(tbemu_set_quirks(fab(), joined.c_str()))) return rc;
    const char* q = tbemu_quirks(fab());
    if (!q) return check(EINVAL);
    std::printf("%s\n", q);
    return 0;
  }
  if (*killh) {
    int sig = sig_s == "KILL" ? SIGKILL : sig_s == "TERM" ? SIGTERM : sig_s == "STOP" ? SIGSTOP
            : sig_s == "CONT" ? SIGCONT : std::atoi(sig_s.c_str());
    if (sig <= 0 || sig >= NSIG) {
      std::fprintf(stderr, "tbverbs-emu: bad signal %s (KILL, TERM, STOP, CONT or a number 1..%d)\n", sig_s.c_str(),
                   NSIG - 1);
      return 2;
    }
    int killed = 0;
    if (int rc = check(tbemu_kill_host(fab(), host.c_str(), sig, &killed))) return rc;
    std::printf("signalled %d process(es) on %s\n", killed, host.c_str());
    return 0;
  }
  if (*hold) return hold_qps(fabric, host, device, n, seconds, daemonize, pidfile);
  return 0;
}

// `--local N`: an emulated Thunderbolt ring of N hosts in a temporary directory, and N ranks of
// this program started on it (fork + exec of ourselves with the rank's environment), their output
// prefixed and their exit codes collected. Linux only (the emulator is).
#pragma once

#include <tbverbs/side_channel.hpp>

#include "../../tools/common/local_scratch.hpp"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ring {

/// The emulator's profiles a launch may name (--profile takes one, or a comma-separated list).
inline const std::vector<std::string>& known_profiles() {
  static const std::vector<std::string> k = {"thunderbolt", "rdma-core-rc", "rdma-core-roce", "rdma-core-ib", "usb4-rdma"};
  return k;
}

/// The names of `profiles`, one profile or a comma-separated list ("thunderbolt,usb4-rdma").
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

/// The profile of host h: the hosts take profile_list(profiles) in turn ("thunderbolt,usb4-rdma":
/// Macs at even positions, Linux usb4_rdma hosts at odd ones; a list of N names gives each of N
/// hosts its own).
inline std::string host_profile(const std::string& profiles, int h) {
  const auto list = profile_list(profiles);
  return list[static_cast<std::size_t>(h) % list.size()];
}

/// The device of cable c on one side of a host in the local ring: Thunderbolt's rdma_enN,
/// usb4_rdmaN on usb4-rdma (the Linux Thunderbolt driver), or mlx5_N on the rdma-core profiles
/// (so the library treats them as rdma-core NICs).
inline std::string ring_device_name(const std::string& profile, int c, bool right) {
  if (profile == "thunderbolt") return "rdma_en" + std::to_string(2 * c + (right ? 2 : 1));
  if (profile == "usb4-rdma") return "usb4_rdma" + std::to_string(2 * c + (right ? 1 : 0));
  return "mlx5_" + std::to_string(2 * c + (right ? 1 : 0));
}

/// The fabric of an N-host ring with `cables` cables between neighbours: cable c of hop h joins
/// host h's rdma_en{2c+2} and host h+1's rdma_en{2c+1}, with 10.{99+c}.h.1/30 and 10.{99+c}.h.2/30
/// on its two ends (one subnet per cable, as Thunderbolt wants). `quirks` ("name=value") go into
/// the fabric's "quirks" object: the contested readings of Apple's driver the emulator plays.
/// `profile` is the emulator's: thunderbolt (devices rdma_enN), usb4-rdma (usb4_rdmaN), or
/// rdma-core-rc, rdma-core-roce, rdma-core-ib (devices mlx5_N; InfiniBand ports get no IPv4
/// address: IB has no IPv4 GID); a comma-separated list gives the hosts its profiles in turn
/// (host_profile: a mixed fabric of Macs and Linux hosts).
/// A `link` with a bandwidth paces every cable direction (the emulator's link model, docs/emulator.md).
struct LinkModel {
  double gbytes_per_s = 0;  // 0: unpaced
  double latency_us = 0;
  bool paced() const { return gbytes_per_s > 0 || latency_us > 0; }
};
inline nlohmann::json ring_fabric(int n, int cables = 1, const std::vector<std::string>& quirks = {},
                                  const std::string& profile = "thunderbolt", const LinkModel& link = {}) {
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
  if (link.paced()) {  // a key left out is not modelled (no bandwidth limit, or no latency)
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
  return f;
}

/// The device of host h toward host p on a fully connected fabric of n hosts: one per other host,
/// numbered in host order (Thunderbolt's rdma_en1.., or mlx5_0..).
inline std::string mesh_device_name(const std::string& profile, int h, int p) {
  const int k = p < h ? p : p - 1;
  const std::string mine = host_profile(profile, h);
  if (mine == "thunderbolt") return "rdma_en" + std::to_string(k + 1);
  if (mine == "usb4-rdma") return "usb4_rdma" + std::to_string(k);
  return "mlx5_" + std::to_string(k);
}

/// A fully connected fabric of n hosts (a cable between every pair, as 2 to 4 Macs are often
/// cabled): the cable between hosts a < b joins a's device toward b and b's toward a, with
/// 10.{150 + c / 256}.{c mod 256}.1/30 and .2/30 (c = a n + b: one subnet per cable).
inline nlohmann::json mesh_fabric(int n, const std::vector<std::string>& quirks = {},
                                  const std::string& profile = "thunderbolt", const LinkModel& link = {}) {
  nlohmann::json f = ring_fabric(n, 1, quirks, profile, link);
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
  f["hosts"] = hosts;
  f["cables"] = wires;
  return f;
}

/// Its JACCL-style device file: entry [i][j] is host i's device toward host j.
inline nlohmann::json mesh_devices(int n, const std::string& profile = "thunderbolt") {
  nlohmann::json m = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (int j = 0; j < n; ++j) row.push_back(i == j ? nlohmann::json(nullptr) : nlohmann::json(mesh_device_name(profile, i, j)));
    m.push_back(row);
  }
  return m;
}

/// The JACCL-style device file of that ring: entry [i][j] lists rank i's devices toward rank j
/// (a string for one cable), null on the diagonal and between non-neighbours; entry k on rank i and
/// entry k on rank j are the same cable. With two ranks both hops join the same pair: the entry
/// lists hop 0's cables at even positions and hop 1's at odd ones, in the same order on both ranks.
inline nlohmann::json ring_devices(int n, int cables = 1, const std::string& profile = "thunderbolt") {
  auto one_or_list = [](nlohmann::json l) { return l.size() == 1 ? l[0] : l; };
  nlohmann::json m = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    nlohmann::json row = nlohmann::json::array();
    auto dev = [&](int c, bool right) { return ring_device_name(host_profile(profile, i), c, right); };
    for (int j = 0; j < n; ++j) {
      nlohmann::json l = nlohmann::json::array();
      if (i != j && n == 2) {
        for (int c = 0; c < cables; ++c) {
          // Hop 0 runs from rank 0's right devices to rank 1's left ones; hop 1 the other way.
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


struct LocalOptions {
  int ranks = 4;
  std::string self;                 // path of this program
  std::vector<std::string> args;    // arguments for the ranks (without --local)
  std::string emu_library;          // the emulated verbs library
  std::string fabric;               // an existing fabric file (kept, state not reset); empty = generate
  std::chrono::milliseconds timeout{30000};
  int kill_rank = -1;               // SIGKILL this rank ...
  std::chrono::milliseconds kill_after{0};  // ... this long after the start
  bool stop = false;                // SIGSTOP it instead (alive but silent); SIGKILL once the others exited
  bool keep = false;                // keep the temporary directory
  int cables = 1;                   // cables between neighbours
  std::vector<std::string> quirks;  // "name=value": readings of Apple's driver the emulator plays
  std::string profile = "thunderbolt";  // the emulator's profile of the generated fabric
  bool no_device_file = false;      // give the ranks no device file: they discover the cables
  LinkModel link;                   // pacing of every cable direction of the generated fabric
  bool mesh = false;                // a fully connected fabric instead of a ring
};

struct RankProcess {
  pid_t pid = -1;
  int fd = -1;
  std::string partial;
  bool exited = false;
  int status = 0;
  double exit_s = 0;
};

/// Starts the ranks and waits for them. Returns the exit code of the launcher: 0 when every rank
/// exited 0, 1 otherwise (with a line per failed rank).
/// Set by SIGINT/SIGTERM while run_local waits: the ranks are stopped and the temporary state
/// removed before the launcher exits (Ctrl-C left both behind: issue 9).
inline volatile std::sig_atomic_t g_launcher_signal = 0;
inline void launcher_on_signal(int sig) { g_launcher_signal = sig; }

inline int run_local(const LocalOptions& o) {
  namespace fs = std::filesystem;
  using clock = std::chrono::steady_clock;
  const int n = o.ranks;
  if (n < 2 || n > 64) {
    std::fprintf(stderr, "--local: the number of ranks must be 2..64 (a ring needs two)\n");
    return 2;
  }
  // The emulator's state in memory, for a fabric generated here only: an existing one keeps the
  // emulator's own state directory.
  const auto scratch = cli::LocalScratch::make("ring", o.fabric.empty());
  if (!scratch) return 2;
  const fs::path& dir = scratch->dir;
  const std::string& state_dir = scratch->state;
  std::string fabric = o.fabric;
  if (fabric.empty()) {
    fabric = (dir / "fabric.json").string();
    std::ofstream(fabric) << (o.mesh ? mesh_fabric(n, o.quirks, o.profile, o.link)
                                     : ring_fabric(n, o.cables, o.quirks, o.profile, o.link))
                                 .dump(2)
                          << "\n";
  }
  const std::string devices = o.no_device_file ? std::string("(none: discovered)") : (dir / "devices.json").string();
  if (!o.no_device_file)
    std::ofstream(devices) << (o.mesh ? mesh_devices(n, o.profile) : ring_devices(n, o.cables, o.profile)).dump() << "\n";
  // An existing fabric file keeps its own quirks; --quirk reaches the ranks through the
  // emulator's environment variable instead.
  std::string quirk_env;
  for (const auto& q : o.quirks) quirk_env += (quirk_env.empty() ? "" : ",") + q;
  const int port = tbverbs::free_loopback_port();
  const std::string coordinator = "127.0.0.1:" + std::to_string(port);
  // A job id of this launch: the ranks derive their side-channel token from it, so a rank of
  // another job that finds the same port is refused instead of joining.
  std::string job_id = "local-" + std::to_string(::getpid()) + "-" +
                       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("local %s of %d emulated hosts (profile %s, %d cable%s between %s%s%s): fabric %s, devices %s, coordinator %s\n",
              o.mesh ? "mesh" : "ring", n, o.fabric.empty() ? o.profile.c_str() : "of the fabric file", o.cables,
              o.cables == 1 ? "" : "s", o.mesh ? "every pair" : "neighbours",
              quirk_env.empty() ? "" : ", quirks ", quirk_env.c_str(), fabric.c_str(), devices.c_str(), coordinator.c_str());
  if (o.link.paced()) {
    // The model the emulator plays, and what it allows: a ring all_sum keeps both directions of
    // both cables of every rank busy at best, so its bus bandwidth is at most 2B.
    if (!o.fabric.empty())
      std::printf("link model: --link-gbps/--link-latency-us ignored: the fabric file %s has its own\n", o.fabric.c_str());
    else
    {
      char bw[48] = "unlimited", ideal[64] = "";
      if (o.link.gbytes_per_s > 0) {
        std::snprintf(bw, sizeof bw, "%g GB/s", o.link.gbytes_per_s);
        std::snprintf(ideal, sizeof ideal, "; ideal ring busbw 2B = %g GB/s", 2 * o.link.gbytes_per_s);
      }
      std::printf("link model: every cable direction paced at B = %s, latency L = %g us (a message of s bytes leaves "
                  "s/B after the previous one on that direction and arrives L later)%s\n",
                  bw, o.link.latency_us, ideal);
    }
  }
  std::fflush(stdout);

  std::vector<RankProcess> ranks(static_cast<std::size_t>(n));
  const auto start = clock::now();
  for (int i = 0; i < n; ++i) {
    int p[2];
    if (::pipe(p) != 0) {
      std::perror("pipe");
      return 2;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
#if defined(__linux__)
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned rank holding QPs if the launcher dies
#endif
      ::dup2(p[1], 1);
      ::dup2(p[1], 2);
      ::close(p[0]);
      ::close(p[1]);
      ::setenv("TBVERBS_LIBRARY", o.emu_library.c_str(), 1);
      ::setenv("TBVERBS_EMU_FABRIC", fabric.c_str(), 1);
      ::setenv("TBVERBS_EMU_HOST", ("host" + std::to_string(i)).c_str(), 1);
      if (o.fabric.empty()) ::setenv("TBVERBS_EMU_STATE_DIR", state_dir.c_str(), 1);
      if (!o.fabric.empty() && !quirk_env.empty()) ::setenv("TBVERBS_EMU_QUIRKS", quirk_env.c_str(), 1);
      ::setenv("JACCL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("TBVERBS_JOB_ID", job_id.c_str(), 1);
      ::setenv("JACCL_COORDINATOR", coordinator.c_str(), 1);
      if (o.no_device_file) {
        ::unsetenv("JACCL_IBV_DEVICES");
        ::unsetenv("MLX_IBV_DEVICES");
        ::setenv("TBVERBS_RANKS", std::to_string(n).c_str(), 1);
      } else {
        ::setenv("JACCL_IBV_DEVICES", devices.c_str(), 1);
      }
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(o.self.c_str()));
      for (const auto& a : o.args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(o.self.c_str(), argv.data());
      std::fprintf(stderr, "exec %s: %s\n", o.self.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    ::close(p[1]);
    ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
    ranks[static_cast<std::size_t>(i)].pid = pid;
    ranks[static_cast<std::size_t>(i)].fd = p[0];
  }

  struct sigaction sa {};
  sa.sa_handler = launcher_on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  // A reader that goes away (`ring_all_sum --local 4 | head`) must not kill the launcher with
  // SIGPIPE before it has waited for its ranks and removed its state (it left /tmp and /dev/shm
  // directories behind): writes to the closed stdout fail instead, and the run goes on.
  struct sigaction ign {}, old_pipe {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &old_pipe);
  auto flush_line = [&](int i, const std::string& line) {
    // A rank names itself at the start of its own lines ("rank 3: FAILED ..."), for runs by hand;
    // under the launcher the prefix already says it ("[rank 3] FAILED ...", not "[rank 3] rank 3:").
    const std::string own = "rank " + std::to_string(i) + ": ";
    const char* text = line.compare(0, own.size(), own) == 0 ? line.c_str() + own.size() : line.c_str();
    std::printf("[rank %d] %s\n", i, text);
    std::fflush(stdout);
  };
  bool killed = false, stopped_reaped = false;
  std::optional<clock::time_point> first_failure;
  std::vector<std::string> hung;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int i = 0; i < n; ++i)
      if (ranks[static_cast<std::size_t>(i)].fd >= 0) {
        fds.push_back({ranks[static_cast<std::size_t>(i)].fd, POLLIN, 0});
        who.push_back(i);
      }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 50);
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      RankProcess& rp = ranks[static_cast<std::size_t>(who[k])];
      char buf[65536];
      for (;;) {
        const ssize_t got = ::read(rp.fd, buf, sizeof buf);
        if (got > 0) {
          rp.partial.append(buf, static_cast<std::size_t>(got));
          std::size_t nl;
          while ((nl = rp.partial.find('\n')) != std::string::npos) {
            flush_line(who[k], rp.partial.substr(0, nl));
            rp.partial.erase(0, nl + 1);
          }
          continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          if (!rp.partial.empty()) flush_line(who[k], rp.partial);
          rp.partial.clear();
          ::close(rp.fd);
          rp.fd = -1;
        }
        break;
      }
    }
    const auto now = clock::now();
    const double t = std::chrono::duration<double>(now - start).count();
    for (int i = 0; i < n; ++i) {
      RankProcess& rp = ranks[static_cast<std::size_t>(i)];
      if (rp.exited) continue;
      int st = 0;
      if (::waitpid(rp.pid, &st, WNOHANG) == rp.pid) {
        rp.exited = true;
        rp.status = st;
        rp.exit_s = t;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !first_failure) first_failure = now;
      }
    }
    if (o.kill_rank >= 0 && o.kill_rank < n && !killed && now - start >= o.kill_after) {
      killed = true;
      std::printf("launcher: %s rank %d (%s) at %.3f s, as asked by %s\n", o.stop ? "stopping" : "killing", o.kill_rank,
                  o.stop ? "SIGSTOP" : "SIGKILL", t, o.stop ? "--stop-rank" : "--kill-rank");
      std::fflush(stdout);
      ::kill(ranks[static_cast<std::size_t>(o.kill_rank)].pid, o.stop ? SIGSTOP : SIGKILL);
    }
    // A stopped rank has served its purpose once another rank gave up on it (a timeout, since its
    // side channel stays open). It is killed then: on the emulator a stopped process may hold a
    // lock of the shared fabric state that a peer's ibv_post_send waits for (real hardware has no
    // such lock), and a robust mutex is released only when its owner dies, not when it stops.
    if (o.stop && killed && first_failure && !stopped_reaped &&
        !ranks[static_cast<std::size_t>(o.kill_rank)].exited) {
      stopped_reaped = true;
      std::printf("launcher: a rank gave up at %.3f s; killing the stopped rank %d\n",
                  std::chrono::duration<double>(*first_failure - start).count(), o.kill_rank);
      std::fflush(stdout);
      ::kill(ranks[static_cast<std::size_t>(o.kill_rank)].pid, SIGKILL);
    }
    bool all = true;
    for (const auto& rp : ranks) all = all && rp.exited && rp.fd < 0;
    if (all) break;
    if (g_launcher_signal != 0) {
      std::printf("launcher: %s: stopping the ranks and removing the temporary state\n", strsignal(g_launcher_signal));
      std::fflush(stdout);
      for (auto& rp : ranks) {
        if (!rp.exited) {
          ::kill(rp.pid, SIGKILL);
          ::waitpid(rp.pid, &rp.status, 0);
          rp.exited = true;
        }
        if (rp.fd >= 0) {
          ::close(rp.fd);
          rp.fd = -1;
        }
      }
      break;
    }
    // After a failure, the others must stop on their own within the timeout (plus a margin for
    // the process exit); one that does not is reported as hung and killed.
    if (first_failure && now - *first_failure > o.timeout + std::chrono::seconds(5)) {
      for (int i = 0; i < n; ++i) {
        RankProcess& rp = ranks[static_cast<std::size_t>(i)];
        if (!rp.exited) {
          hung.push_back("rank " + std::to_string(i));
          ::kill(rp.pid, SIGKILL);
        }
      }
      first_failure = now + std::chrono::hours(1);  // report once
    }
  }

  int failed = 0;
  for (int i = 0; i < n; ++i) {
    const RankProcess& rp = ranks[static_cast<std::size_t>(i)];
    if (WIFEXITED(rp.status) && WEXITSTATUS(rp.status) == 0) continue;
    ++failed;
    if (WIFSIGNALED(rp.status))
      std::printf("launcher: rank %d was killed by signal %d (%s) at %.3f s\n", i, WTERMSIG(rp.status),
                  strsignal(WTERMSIG(rp.status)), rp.exit_s);
    else
      std::printf("launcher: rank %d exited with status %d at %.3f s\n", i, WEXITSTATUS(rp.status), rp.exit_s);
  }
  for (const auto& h : hung) std::printf("launcher: %s did not exit within the timeout after the first failure: HUNG\n", h.c_str());
  if (failed == 0) std::printf("launcher: all %d ranks exited 0\n", n);
  else std::printf("launcher: FAILED: %d of %d ranks did not exit 0\n", failed, n);
  std::fflush(stdout);

  if (!o.keep) scratch->remove();
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  if (g_launcher_signal != 0) return 128 + g_launcher_signal;
  return failed == 0 ? 0 : 1;
}

}  // namespace ring

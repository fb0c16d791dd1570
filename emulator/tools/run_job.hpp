// `tbverbs-emu run -n N [...] -- PROGRAM ARGS...`: N ranks of a program on an emulated fabric made
// for the run, as a launcher starts them on N machines: the fabric written to a temporary
// directory, each rank given the launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and JACCL_RANK, JACCL_COORDINATOR, JACCL_IBV_DEVICES
// for mlx.launch's programs), the emulator's (TBVERBS_LIBRARY, TBVERBS_EMU_FABRIC, TBVERBS_EMU_HOST,
// TBVERBS_EMU_STATE_DIR) and a job secret nobody else has (TBVERBS_JOB_SECRET); every line of
// output prefixed with its rank; the others stopped soon after one fails, and the job's exit
// status the first failure's; signals forwarded; the temporary state removed. The one launcher of
// the project: ring_all_sum --local, comm_check, the tutorial and the tests run through it.
#pragma once

#include "fabric_gen.hpp"

#include "../../tools/common/local_scratch.hpp"

#include <tbverbs/job_secret.hpp>
#include <tbverbs/side_channel.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace emu_cli {

/// What `tbverbs-emu run` is asked to do.
struct RunOptions {
  FabricSpec spec;                    // the fabric made for the run (spec.hosts: the number of ranks)
  std::vector<std::string> program;   // PROGRAM ARGS...
  std::string emu_library;            // the emulated verbs library the ranks load
  std::string fabric;                 // an existing fabric file (kept; its state too); empty: make one
  bool no_device_file = false;        // the ranks discover the cables from the subnets
  std::chrono::milliseconds grace{5000}; // after the first failure, how long the others may take to stop
  int fault_rank = -1;                // SIGKILL (or SIGSTOP) this rank ...
  bool stop = false;
  std::chrono::milliseconds fault_after{0}; // ... this long after the start, or after the line:
  std::string fault_after_line;       // a rank printed a line containing this
  bool keep = false;                  // keep the temporary directory
  bool quiet = false;                 // no set-up lines of the launcher's own
};

/// Where a rank writes its output and the launcher reads it: a pseudo-terminal, so that the C
/// library line-buffers the rank's stdout as in a terminal (through a pipe, printf's lines wait in
/// its buffer until it fills or the rank exits, and are lost when it is killed), in raw mode (no
/// "\r\n", no echo); a pipe where no pseudo-terminal can be had. Both ends are open before the
/// fork (a pseudo-terminal's reader gets EIO while no writer has it open).
struct OutputChannel {
  int read_end = -1;
  int write_end = -1;

  static OutputChannel open() {
    OutputChannel c;
    const int m = ::posix_openpt(O_RDWR | O_NOCTTY);
    const char* name = m >= 0 && ::grantpt(m) == 0 && ::unlockpt(m) == 0 ? ::ptsname(m) : nullptr;
    const int s = name != nullptr ? ::open(name, O_RDWR | O_NOCTTY) : -1;
    if (s >= 0) {
      termios t{};
      if (::tcgetattr(s, &t) == 0) {
        ::cfmakeraw(&t);
        ::tcsetattr(s, TCSANOW, &t);
      }
      c.read_end = m;
      c.write_end = s;
    } else {
      if (m >= 0) ::close(m);
      int p[2];
      if (::pipe(p) != 0) return c;
      c.read_end = p[0];
      c.write_end = p[1];
    }
    ::fcntl(c.read_end, F_SETFD, FD_CLOEXEC);
    return c;
  }
};

struct RankProcess {
  pid_t pid = -1;
  int fd = -1;
  std::string partial;
  bool exited = false;
  int status = 0;
  double exit_s = 0;
};

inline volatile std::sig_atomic_t g_run_signal = 0;
inline void run_on_signal(int sig) { g_run_signal = sig; }

/// The fabric and device files of the run (or the given fabric), in `dir`.
struct RunFiles {
  std::string fabric, devices;
};
inline RunFiles write_files(const RunOptions& o, const std::string& dir) {
  RunFiles f{o.fabric, o.no_device_file ? std::string() : dir + "/devices.json"};
  if (f.fabric.empty()) {
    f.fabric = dir + "/fabric.json";
    std::ofstream(f.fabric) << fabric_of(o.spec).dump(2) << "\n";
  }
  if (!o.no_device_file)
    std::ofstream(f.devices) << devices_of(o.spec).dump() << "\n";
  return f;
}

/// The child's side of a fork: rank i's environment, its output into `out`, then the program.
[[noreturn]] inline void exec_rank(const RunOptions& o, int i, const OutputChannel& channel, const RunFiles& files,
                                   const std::string& state_dir, const std::string& coordinator, const std::string& job_id,
                                   const std::string& secret) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL); // no orphaned rank holding QPs if the launcher dies
  ::setpgid(0, 0); // its own process group: a signal reaches what it started too (a shell's children)
  ::dup2(channel.write_end, 1);
  ::dup2(channel.write_end, 2);
  ::close(channel.write_end);
  const std::string n = std::to_string(o.spec.hosts), r = std::to_string(i);
  const auto colon = coordinator.rfind(':');
  for (const auto& [k, v] : std::vector<std::pair<const char*, std::string>>{
           {"RANK", r}, {"WORLD_SIZE", n}, {"LOCAL_RANK", r}, {"LOCAL_WORLD_SIZE", n},
           {"MASTER_ADDR", coordinator.substr(0, colon)}, {"MASTER_PORT", coordinator.substr(colon + 1)},
           {"JACCL_RANK", r}, {"JACCL_COORDINATOR", coordinator}, {"TBVERBS_JOB_ID", job_id},
           {"TBVERBS_LIBRARY", o.emu_library}, {"TBVERBS_EMU_FABRIC", files.fabric}, {"TBVERBS_EMU_HOST", "host" + r}})
    ::setenv(k, v.c_str(), 1);
  if (!secret.empty()) ::setenv("TBVERBS_JOB_SECRET", secret.c_str(), 1);
  if (o.fabric.empty()) ::setenv("TBVERBS_EMU_STATE_DIR", state_dir.c_str(), 1);
  std::string quirk_env; // an existing fabric file keeps its own quirks; --quirk reaches the ranks this way
  for (const auto& q : o.spec.quirks) quirk_env += (quirk_env.empty() ? "" : ",") + q;
  if (!o.fabric.empty() && !quirk_env.empty()) ::setenv("TBVERBS_EMU_QUIRKS", quirk_env.c_str(), 1);
  ::unsetenv("MLX_IBV_DEVICES");
  if (files.devices.empty()) {
    ::unsetenv("JACCL_IBV_DEVICES");
    ::setenv("TBVERBS_RANKS", n.c_str(), 1);
  } else {
    ::setenv("JACCL_IBV_DEVICES", files.devices.c_str(), 1);
  }
  std::vector<char*> argv;
  for (const auto& a : o.program) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "tbverbs-emu run: cannot start %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

/// A line of rank i's output, prefixed "[rank i] " (a rank that names itself at the start, "rank
/// 3: ...", is not named twice).
inline void print_rank_line(int i, const std::string& line) {
  const std::string own = "rank " + std::to_string(i) + ": ";
  const char* text = line.compare(0, own.size(), own) == 0 ? line.c_str() + own.size() : line.c_str();
  std::printf("[rank %d] %s\n", i, text);
  std::fflush(stdout);
}

/// Reads what rank `i` wrote, printing whole lines; returns true when one contained `watch`.
inline bool drain(RankProcess& rp, int i, const std::string& watch) {
  bool seen = false;
  char buf[65536];
  for (;;) {
    const ssize_t got = ::read(rp.fd, buf, sizeof buf);
    if (got > 0) {
      rp.partial.append(buf, static_cast<std::size_t>(got));
      std::size_t nl;
      while ((nl = rp.partial.find('\n')) != std::string::npos) {
        const std::string line = rp.partial.substr(0, nl);
        seen = seen || (!watch.empty() && line.find(watch) != std::string::npos);
        print_rank_line(i, line);
        rp.partial.erase(0, nl + 1);
      }
      continue;
    }
    if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
      if (!rp.partial.empty()) print_rank_line(i, rp.partial);
      rp.partial.clear();
      ::close(rp.fd);
      rp.fd = -1;
    }
    return seen;
  }
}

/// Sends `sig` to rank `rp`'s process group (the rank and what it started).
inline void signal_rank(const RankProcess& rp, int sig) {
  if (::kill(-rp.pid, sig) != 0) ::kill(rp.pid, sig);
}

/// The launcher's exit status for a rank's wait status: its exit code, or 128 + its signal.
inline int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0); }

/// Watches the ranks until all exited: prints their output, fires the fault, stops the others
/// `grace` after the first failure, forwards a signal. Returns the first failure's exit status (0
/// when every rank exited 0), or 128 + the signal that ended the run.
inline int watch_ranks(const RunOptions& o, std::vector<RankProcess>& ranks) {
  using clock = std::chrono::steady_clock;
  const int n = o.spec.hosts;
  const auto start = clock::now();
  bool fault_done = false, line_seen = o.fault_after_line.empty(), stopped_reaped = false, terminated = false;
  std::optional<clock::time_point> first_failure, line_at;
  int first_status = 0, forwarded = 0;
  std::optional<clock::time_point> forwarded_at, all_exited_at;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int i = 0; i < n; ++i)
      if (ranks[static_cast<std::size_t>(i)].fd >= 0) {
        fds.push_back({ranks[static_cast<std::size_t>(i)].fd, POLLIN, 0});
        who.push_back(i);
      }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 50);
    else ::usleep(20000);
    for (std::size_t k = 0; k < fds.size(); ++k)
      if (fds[k].revents != 0 && drain(ranks[static_cast<std::size_t>(who[k])], who[k], line_seen ? std::string() : o.fault_after_line)) {
        line_seen = true;
        line_at = clock::now();
      }
    const auto now = clock::now();
    const double t = std::chrono::duration<double>(now - start).count();
    for (int i = 0; i < n; ++i) {
      RankProcess& rp = ranks[static_cast<std::size_t>(i)];
      int st = 0;
      if (rp.exited || ::waitpid(rp.pid, &st, WNOHANG) != rp.pid) continue;
      rp.exited = true;
      rp.status = st;
      rp.exit_s = t;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && !first_failure) { // a rank the fault killed counts: the others have `grace` from then
        first_failure = now;
        first_status = exit_code_of(st);
      }
    }
    // The fault: after a delay from the start, or from the line a rank printed once it runs.
    const auto fault_from = o.fault_after_line.empty() ? std::optional<clock::time_point>(start) : line_at;
    if (o.fault_rank >= 0 && !fault_done && fault_from && now - *fault_from >= o.fault_after) {
      fault_done = true;
      std::printf("launcher: %s rank %d (%s) at %.3f s%s\n", o.stop ? "stopping" : "killing", o.fault_rank,
                  o.stop ? "SIGSTOP" : "SIGKILL", t, o.fault_after_line.empty() ? "" : ", after its job said it was running");
      std::fflush(stdout);
      signal_rank(ranks[static_cast<std::size_t>(o.fault_rank)], o.stop ? SIGSTOP : SIGKILL);
    }
    // A stopped rank has served its purpose once another rank gave up on it: on the emulator a
    // stopped process may hold a lock of the shared state a peer waits for (hardware has none).
    if (o.stop && fault_done && first_failure && !stopped_reaped && !ranks[static_cast<std::size_t>(o.fault_rank)].exited) {
      stopped_reaped = true;
      std::printf("launcher: a rank gave up at %.3f s; killing the stopped rank %d\n",
                  std::chrono::duration<double>(*first_failure - start).count(), o.fault_rank);
      std::fflush(stdout);
      signal_rank(ranks[static_cast<std::size_t>(o.fault_rank)], SIGKILL);
    }
    bool all = true, exited = true;
    for (const auto& rp : ranks) {
      all = all && rp.exited && rp.fd < 0;
      exited = exited && rp.exited;
    }
    if (all) break;
    // Every rank exited, but something it left behind holds its output open: that is not the
    // job; a second later its output is read no more.
    if (exited && !all_exited_at) all_exited_at = now;
    if (all_exited_at && now - *all_exited_at > std::chrono::seconds(1)) {
      for (auto& rp : ranks)
        if (rp.fd >= 0) {
          signal_rank(rp, SIGKILL);
          ::close(rp.fd);
          rp.fd = -1;
        }
      break;
    }
    // A signal to the launcher goes to every rank; those still there a second later are killed.
    if (g_run_signal != 0 && forwarded == 0) {
      forwarded = g_run_signal;
      forwarded_at = now;
      std::printf("launcher: %s: stopping the ranks and removing the temporary state\n", strsignal(forwarded));
      std::fflush(stdout);
      for (auto& rp : ranks)
        if (!rp.exited) signal_rank(rp, forwarded);
    }
    // After the first failure the others have `grace` to stop on their own, then SIGTERM, then
    // SIGKILL a second later.
    const bool overdue = first_failure && now - *first_failure > o.grace;
    if ((overdue && !terminated) || (forwarded_at && now - *forwarded_at > std::chrono::seconds(1))) {
      if (!terminated && overdue) {
        terminated = true;
        // A rank still running this long after a failure did not notice it on its own (the
        // library's tests look for this line).
        for (std::size_t i = 0; i < ranks.size(); ++i)
          if (!ranks[i].exited) {
            std::printf("launcher: rank %zu still running %.1f s after the first failure: stopping it (SIGTERM, then SIGKILL)\n", i,
                        std::chrono::duration<double>(o.grace).count());
            signal_rank(ranks[i], SIGTERM);
          }
        std::fflush(stdout);
        first_failure = *first_failure - o.grace + std::chrono::seconds(1); // SIGKILL a second from now
        continue;
      }
      for (auto& rp : ranks)
        if (!rp.exited) signal_rank(rp, SIGKILL);
    }
  }
  if (forwarded != 0) return 128 + forwarded;
  return first_status;
}

/// Prints the ranks' exit statuses.
inline void report(const std::vector<RankProcess>& ranks) {
  int failed = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankProcess& rp = ranks[i];
    if (WIFEXITED(rp.status) && WEXITSTATUS(rp.status) == 0) continue;
    ++failed;
    if (WIFSIGNALED(rp.status))
      std::printf("launcher: rank %zu was killed by signal %d (%s) at %.3f s\n", i, WTERMSIG(rp.status),
                  strsignal(WTERMSIG(rp.status)), rp.exit_s);
    else
      std::printf("launcher: rank %zu exited with status %d at %.3f s\n", i, WEXITSTATUS(rp.status), rp.exit_s);
  }
  if (failed == 0) std::printf("launcher: all %zu ranks exited 0\n", ranks.size());
  else std::printf("launcher: FAILED: %d of %zu ranks did not exit 0\n", failed, ranks.size());
  std::fflush(stdout);
}

/// Installs `handler` for SIGINT, SIGTERM and SIGHUP and ignores SIGPIPE (a reader that goes away,
/// `... | head`, must not end the launcher before it removed its state); restored on destruction.
struct SignalScope {
  struct sigaction old_int {}, old_term {}, old_hup {}, old_pipe {};
  SignalScope() {
    struct sigaction sa {};
    sa.sa_handler = run_on_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
    ::sigaction(SIGHUP, &sa, &old_hup);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe);
  }
  ~SignalScope() {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::sigaction(SIGHUP, &old_hup, nullptr);
    ::sigaction(SIGPIPE, &old_pipe, nullptr);
  }
};

/// Why the run cannot be made as asked, or "".
inline std::string refused(const RunOptions& o) {
  if (const std::string why = refused(o.spec); !why.empty()) return why;
  if (o.program.empty()) return "no program to run: tbverbs-emu run -n N -- PROGRAM ARGS...";
  if (o.fault_rank >= o.spec.hosts)
    return "--kill-rank/--stop-rank " + std::to_string(o.fault_rank) + " is not a rank of 0.." + std::to_string(o.spec.hosts - 1);
  if (o.emu_library.empty() || ::access(o.emu_library.c_str(), R_OK) != 0)
    return "no emulated verbs library at \"" + o.emu_library + "\" (--emu-library PATH)";
  return "";
}

/// The link model the emulator plays, and what it allows: a ring all_sum keeps both directions of
/// both cables of every rank busy at best, so its bus bandwidth is at most 2B.
inline void print_link_model(const RunOptions& o) {
  if (!o.spec.link.paced()) return;
  if (!o.fabric.empty()) {
    std::printf("link model: --link-gbps/--link-latency-us ignored: the fabric file %s has its own\n", o.fabric.c_str());
    return;
  }
  char bw[48] = "unlimited", ideal[64] = "";
  if (o.spec.link.gbytes_per_s > 0) {
    std::snprintf(bw, sizeof bw, "%g GB/s", o.spec.link.gbytes_per_s);
    std::snprintf(ideal, sizeof ideal, "; ideal ring busbw 2B = %g GB/s", 2 * o.spec.link.gbytes_per_s);
  }
  std::printf("link model: every cable direction paced at B = %s, latency L = %g us (a message of s bytes leaves s/B "
              "after the previous one on that direction and arrives L later)%s\n",
              bw, o.spec.link.latency_us, ideal);
}

/// Runs the job (see the top of this file). Returns the launcher's exit status.
inline int run_job(const RunOptions& o) {
  if (const std::string why = refused(o); !why.empty()) {
    std::fprintf(stderr, "tbverbs-emu run: %s\n", why.c_str());
    return 2;
  }
  const auto scratch = cli::LocalScratch::make("ring", o.fabric.empty());
  if (!scratch) return 2;
  const RunFiles files = write_files(o, scratch->dir.string());
  const std::string coordinator = "127.0.0.1:" + std::to_string(tbverbs::free_loopback_port());
  const std::string job_id = "local-" + std::to_string(::getpid()) + "-" +
                             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  std::string secret; // one the caller gave stays; else a new one, in the ranks' environment only
  if (const char* given = std::getenv("TBVERBS_JOB_SECRET"); given == nullptr || *given == '\0') {
    auto made = tbverbs::make_job_secret();
    if (!made) {
      std::fprintf(stderr, "tbverbs-emu run: %s\n", made.error().message().c_str());
      return 2;
    }
    secret = *made;
  }
  if (!o.quiet) {
    std::string quirks;
    for (const auto& q : o.spec.quirks) quirks += (quirks.empty() ? "" : ",") + q;
    std::printf("local %s of %d emulated hosts (profile %s, %d cable%s between %s%s%s): fabric %s, devices %s, coordinator %s%s%s\n",
                o.spec.mesh ? "mesh" : "ring", o.spec.hosts, o.fabric.empty() ? o.spec.profile.c_str() : "of the fabric file", o.spec.cables,
                o.spec.cables == 1 ? "" : "s", o.spec.mesh ? "every pair" : "neighbours", quirks.empty() ? "" : ", quirks ",
                quirks.c_str(), files.fabric.c_str(), files.devices.empty() ? "(none: discovered)" : files.devices.c_str(),
                coordinator.c_str(), o.fabric.empty() ? ", state " : "", o.fabric.empty() ? scratch->state.c_str() : "");
    print_link_model(o);
    std::fflush(stdout);
  }
  SignalScope signals;
  std::vector<RankProcess> ranks(static_cast<std::size_t>(o.spec.hosts));
  for (int i = 0; i < o.spec.hosts; ++i) {
    const OutputChannel out = OutputChannel::open();
    if (out.read_end < 0) {
      std::perror("tbverbs-emu run: no pipe for the rank's output");
      return 2;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) exec_rank(o, i, out, files, scratch->state, coordinator, job_id, secret);
    ::setpgid(pid, pid); // as the child does: whichever runs first, signals find the group
    ::fcntl(out.read_end, F_SETFL, ::fcntl(out.read_end, F_GETFL) | O_NONBLOCK);
    ::close(out.write_end);
    ranks[static_cast<std::size_t>(i)].pid = pid;
    ranks[static_cast<std::size_t>(i)].fd = out.read_end;
  }
  const int status = watch_ranks(o, ranks);
  report(ranks);
  if (!o.keep) scratch->remove();
  return status;
}

} // namespace emu_cli

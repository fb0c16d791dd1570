// `--local N`: N ranks of this program on an emulated fabric made for the run. The launcher is
// `tbverbs-emu run` (emulator/tools/run_job.hpp), the project's one: this process becomes it
// (exec, same pid), with the run's options and, after `--`, this program and the ranks' arguments.
// What a user types by hand for their own program is the same: `tbverbs-emu run -n 4 -- ./prog`.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace ring {

/// Pacing of every cable direction of the fabric made for the run (docs/emulator.md, "Links").
struct LinkModel {
  double gbytes_per_s = 0; ///< 0: unpaced
  double latency_us = 0;
  bool paced() const { return gbytes_per_s > 0 || latency_us > 0; }
};

/// What `--local` asks of `tbverbs-emu run`.
struct LocalOptions {
  int ranks = 4;
  std::string tool;                 ///< the tbverbs-emu program (empty: the one this build made, else on PATH)
  std::string self;                 ///< the program the ranks run (empty: this one)
  std::vector<std::string> args;    ///< arguments for the ranks (without the launcher's own)
  std::string emu_library;          ///< the emulated verbs library (empty: tbverbs-emu's own)
  std::string fabric;               ///< an existing fabric file (kept, state not reset); empty = generate
  std::chrono::milliseconds timeout{30000}; ///< the ranks' own bound: they get it (+5 s) to fail on their own after a failure
  int kill_rank = -1;               ///< SIGKILL this rank ...
  std::chrono::milliseconds kill_after{0};  ///< ... this long after the start (or after kill_after_line)
  std::string kill_after_line;      ///< ... once a rank printed a line containing this
  bool stop = false;                ///< SIGSTOP it instead (alive but silent); SIGKILL once another rank gave up
  bool keep = false;                ///< keep the temporary directory
  int cables = 1;                   ///< cables between neighbours
  std::vector<std::string> quirks;  ///< "name=value": readings of Apple's driver the emulator plays
  std::string profile = "thunderbolt"; ///< the emulator's profile (or a list the hosts take in turn)
  bool no_device_file = false;      ///< give the ranks no device file: they discover the cables
  LinkModel link;                   ///< pacing of every cable direction of the generated fabric
  bool mesh = false;                ///< a fully connected fabric instead of a ring
};

/// This program's path (/proc/self/exe names tbverbs-emu once the exec happened).
inline std::string self_path() {
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return len > 0 ? std::string(self, static_cast<std::size_t>(len)) : std::string();
}

/// The fabric options of `o` for `tbverbs-emu run` or `tbverbs-emu fabric`.
inline std::vector<std::string> fabric_options(const LocalOptions& o) {
  std::vector<std::string> c = {"-n", std::to_string(o.ranks), "--profile", o.profile, "--cables", std::to_string(o.cables)};
  if (o.mesh) c.push_back("--mesh");
  for (const auto& q : o.quirks) c.insert(c.end(), {"--quirk", q});
  if (o.link.gbytes_per_s > 0) c.insert(c.end(), {"--link-gbps", std::to_string(o.link.gbytes_per_s)});
  if (o.link.latency_us > 0) c.insert(c.end(), {"--link-latency-us", std::to_string(o.link.latency_us)});
  return c;
}

/// The command line of `tbverbs-emu run` for `o`.
inline std::vector<std::string> run_command(const LocalOptions& o) {
  std::vector<std::string> c;
  if (!o.fabric.empty()) c.insert(c.end(), {"--fabric", o.fabric});
  c.push_back("run");
  const auto f = fabric_options(o);
  c.insert(c.end(), f.begin(), f.end());
  c.insert(c.end(), {"--grace-ms", std::to_string((o.timeout + std::chrono::seconds(5)).count())});
  if (!o.emu_library.empty()) c.insert(c.end(), {"--emu-library", o.emu_library});
  if (o.no_device_file) c.push_back("--no-device-file");
  if (o.kill_rank >= 0) {
    c.insert(c.end(), {o.stop ? "--stop-rank" : "--kill-rank", std::to_string(o.kill_rank), "--kill-after",
                       std::to_string(o.kill_after.count())});
    if (!o.kill_after_line.empty()) c.insert(c.end(), {"--kill-after-line", o.kill_after_line});
  }
  if (o.keep) c.push_back("--keep");
  c.push_back("--");
  c.push_back(o.self.empty() ? self_path() : o.self);
  c.insert(c.end(), o.args.begin(), o.args.end());
  return c;
}

/// Becomes `tbverbs-emu ARGS...` (the one this build made, else the one on PATH); returns (2) only
/// when that program cannot be started.
inline int exec_tool(std::string tool, const std::vector<std::string>& args) {
  if (tool.empty()) {
#if defined(TBVERBS_EMU_TOOL)
    tool = TBVERBS_EMU_TOOL; // the examples' CMakeLists.txt
#endif
    if (tool.empty() || ::access(tool.c_str(), X_OK) != 0) tool = "tbverbs-emu";
  }
  std::vector<char*> argv = {tool.data()};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "--local: cannot start %s: %s (build the emulator's tbverbs-emu, or put it on PATH)\n", argv[0],
               std::strerror(errno));
  return 2;
}

/// Becomes `tbverbs-emu run` for `o`.
inline int run_local(const LocalOptions& o) { return exec_tool(o.tool, run_command(o)); }

/// Becomes `tbverbs-emu fabric` writing the fabric of `o` to `path`.
inline int write_fabric(const LocalOptions& o, const std::string& path) {
  std::vector<std::string> c = {"fabric", "-o", path};
  const auto f = fabric_options(o);
  c.insert(c.end(), f.begin(), f.end());
  return exec_tool(o.tool, c);
}

} // namespace ring

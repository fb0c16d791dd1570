// The scratch of a `--local` run (ring_all_sum, tbverbs-probe): a directory under /tmp for the
// fabric file and the ranks' logs, and the emulator's state directory, in memory (/dev/shm) when
// the machine has one: every QP's receive ring and every CQ live there, and a disk-backed /tmp
// makes them slow.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

namespace cli {

struct LocalScratch {
  std::filesystem::path dir;  ///< /tmp/tbverbs-TOOL-XXXXXX: the fabric file, logs.
  std::string state;          ///< The emulator's state: /dev/shm/tbverbs-TOOL-XXXXXX, else dir/state.

  /// Makes both for `tool` ("ring", "probe"); the state in /dev/shm only when `state_in_memory`
  /// (a caller using an existing fabric leaves the state to the emulator). Prints why and returns
  /// nothing when /tmp refuses a directory.
  static std::optional<LocalScratch> make(const std::string& tool, bool state_in_memory = true) {
    std::string tmp = "/tmp/tbverbs-" + tool + "-XXXXXX";
    if (::mkdtemp(tmp.data()) == nullptr) {
      std::perror("mkdtemp");
      return std::nullopt;
    }
    LocalScratch s{tmp, (std::filesystem::path(tmp) / "state").string()};
    std::string shm = "/dev/shm/tbverbs-" + tool + "-XXXXXX";
    if (state_in_memory && ::access("/dev/shm", W_OK) == 0 && ::mkdtemp(shm.data()) != nullptr) s.state = shm;
    // Who owns the pair: `tbverbs-emu gc` removes both once this process is gone and no process
    // holds objects in the state (a launcher killed with SIGKILL cannot remove them; issue 19 item 5).
    if (std::FILE* f = std::fopen((s.dir / "launcher").c_str(), "w")) {
      std::fprintf(f, "%d %s\n", static_cast<int>(::getpid()), s.state.c_str());
      std::fclose(f);
    }
    return s;
  }
  /// Removes both (best effort: the run is over, nothing is left to report to).
  void remove() const {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    std::filesystem::remove_all(state, ec);
  }
};

}  // namespace cli

// examples/tutorial/tutorial.hpp: the few lines every tutorial program shares, so that each
// program is about its one idea (docs/tutorial/README.md). Nothing in here is RDMA:
//
//   fail(step, error)   prints tbverbs' whole error message and returns 1 (the exit status)
//   Job::from_env()     who this process is: its rank, how many ranks there are, where rank 0
//                       listens (the "coordinator"), and which device is cabled to which
//                       neighbour, from the variables a launcher sets (mlx.launch's JACCL_RANK,
//                       JACCL_COORDINATOR and JACCL_IBV_DEVICES, as ring_all_sum reads them)
//   run_local(...)      `--local`: writes an emulated fabric of N Macs cabled in a ring, starts N
//                       copies of this program on it (one per Mac, with those variables set) and
//                       waits for them; the same launcher as `ring_all_sum --local N`
#pragma once

#include <tbverbs/collective/device_file.hpp>
#include <tbverbs/collective/launcher.hpp>
#include <tbverbs/side_channel.hpp>
#include <tbverbs/tbverbs.hpp>

#include "../ring_all_sum/launcher.hpp" // ring::run_local, the `--local N` of ring_all_sum

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace tutorial {

// Every tbverbs step returns a Result; a failed one carries an Error whose message() names the
// verb, the errno by name, the device, port and GID index, and a cause and remedy.
inline int fail(const std::string& step, const tbverbs::Error& e) {
  std::cerr << "FAILED: " << step << ": " << e.message() << "\n";
  return 1;
}

struct Job {
  int rank = 0;
  int size = 0;
  std::string coordinator;  // "host:port" where rank 0 listens for the others
  std::string left_device;  // the device cabled to rank - 1 (the first cable, if there are several)
  std::string right_device; // the device cabled to rank + 1
  std::uint64_t token = 0;  // the same on every rank of one job: a stray process is refused
  bool secret_token = false; // made from the job's secret (TBVERBS_JOB_SECRET): nobody else can compute it

  // The side channel: a TCP connection from every rank to rank 0, for the few bytes RDMA needs
  // before it can run (the queue pairs' addresses) and for "I am ready" barriers.
  tbverbs::SideChannelOptions side_channel() const {
    tbverbs::SideChannelOptions o;
    o.rank = rank;
    o.size = size;
    o.coordinator = coordinator;
    o.job_token = token;
    o.secret_token = secret_token;
    return o;
  }

  static std::optional<Job> from_env() {
    std::string problem;
    auto job = tbverbs::launcher_job(problem);
    const char* devices = std::getenv("JACCL_IBV_DEVICES");
    if (!job || !job->rank || job->coordinator.empty() || devices == nullptr) {
      std::cerr << (job ? "no job: run with --local, or set JACCL_RANK, JACCL_COORDINATOR and JACCL_IBV_DEVICES"
                        : problem)
                << "\n";
      return std::nullopt;
    }
    std::ifstream file(devices);
    std::stringstream text;
    text << file.rdbuf();
    auto cables = tbverbs::parse_device_file(text.str(), *job->rank, problem);
    if (!cables || cables->left.empty() || cables->right.empty()) {
      std::cerr << devices << ": " << (cables ? "no cable to a neighbour" : problem) << "\n";
      return std::nullopt;
    }
    Job j;
    j.rank = *job->rank;
    j.size = cables->ranks;
    j.coordinator = job->coordinator;
    j.left_device = cables->left[0];
    j.right_device = cables->right[0];
    const char* id = std::getenv("TBVERBS_JOB_ID");
    auto token = tbverbs::job_token_from_env("tbverbs tutorial " + j.coordinator + (id ? id : ""));
    if (!token) {
      std::cerr << token.error() << "\n";
      return std::nullopt;
    }
    j.token = token->token;
    j.secret_token = token->secret;
    return j;
  }
};

// `--local`: `ranks` copies of this program, each on its own emulated Mac ("host0", "host1", ...),
// with `args` as their command line. `profile` is the emulated hardware: "thunderbolt" (Apple's
// driver) or "rdma-core-rc" (a Linux RDMA NIC); `quirks` are the contested behaviours of Apple's
// driver the emulator should play ("empty_rq=drop"). Every line a rank prints comes out prefixed
// with "[rank N]". Returns 0 when every rank exited 0.
inline int run_local(int ranks, std::vector<std::string> args, const std::string& profile = "thunderbolt",
                     std::vector<std::string> quirks = {}) {
  if (std::string(TBVERBS_TUTORIAL_EMU_LIBRARY).empty()) {
    std::cerr << "--local: this build has no emulator (configure with TBVERBS_BUILD_EMULATOR=ON)\n";
    return 77; // ctest's "skipped"
  }
  ring::LocalOptions o;
  o.ranks = ranks;
  o.args = std::move(args);
  o.emu_library = TBVERBS_TUTORIAL_EMU_LIBRARY; // the emulator of this build (examples/tutorial/CMakeLists.txt)
  o.profile = profile;
  o.quirks = std::move(quirks);
  return ring::run_local(o);
}

} // namespace tutorial

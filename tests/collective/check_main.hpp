// The command line the scenario checks share (mismatch_check, failure_check, registration_check):
//   --local N            start N ranks of this program on an emulated ring (tbverbs-emu run)
//   --profile P, --mesh, --quirk Q, --link-latency-us L   the fabric those ranks run on
//   --only NAME          one scenario (given to every rank), where the check has scenarios
// Without --local this process is one rank of a job its launcher started: run_rank(only).
#pragma once

#include "../../examples/ring_all_sum/launcher.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace check {

/// This rank, for the FAIL lines (set once the options are read).
inline int rank = -1;
/// The problems this rank found: the exit status is 0 only without any.
inline int failures = 0;

/// One problem: a line with FAIL, which the tests' FAIL_REGULAR_EXPRESSION also catches.
inline void failed(const std::string& what) {
  ++failures;
  std::printf("rank %d: FAIL %s\n", rank, what.c_str());
}

/// True when `r` is ok; else a FAIL line naming `what` and the error.
template <class R> bool ok(const R& r, const std::string& what) {
  if (!r) failed(what + ": " + r.error().message());
  return static_cast<bool>(r);
}

/// A FAIL line naming `what` and the first element where `got` differs from `want` (or the sizes).
template <class T> void expect(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  if (got.size() != want.size()) {
    failed(what + ": " + std::to_string(got.size()) + " elements, expected " + std::to_string(want.size()));
    return;
  }
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      failed(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
      return;
    }
}

/// This rank's options from its launcher's environment, with `timeout` (check::rank set), or
/// nullopt after a line saying why.
inline std::optional<tbverbs::CommunicatorOptions> rank_options(std::chrono::milliseconds timeout) {
  auto opts = tbverbs::CommunicatorOptions::from_env();
  if (!opts) {
    std::printf("options: %s\n", opts.error().message().c_str());
    return std::nullopt;
  }
  rank = opts->rank;
  opts->timeout = timeout;
  return std::move(*opts);
}

/// A communicator connected with `o`, or nullopt after a line saying why.
inline std::optional<tbverbs::Communicator> connected(const tbverbs::CommunicatorOptions& o) {
  auto comm = tbverbs::Communicator::connect(o);
  if (!comm) {
    std::printf("rank %d: connect: %s\n", rank, comm.error().message().c_str());
    return std::nullopt;
  }
  return std::move(*comm);
}

/// Parses the command line, then runs the job (--local) or this rank. `run_rank(only)` returns the
/// rank's exit status. Exit 2 for an unknown option, a missing value, or --only where
/// `has_scenarios` is false.
template <class RunRank> int main(int argc, char** argv, bool has_scenarios, RunRank run_rank) {
  ring::LocalOptions lo;
  lo.ranks = 0;
  lo.emu_library = TBVERBS_EMU_LIBRARY_PATH;
  lo.timeout = std::chrono::milliseconds(240000);
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--local") lo.ranks = std::atoi(value().c_str());
    else if (a == "--profile") lo.profile = value();
    else if (a == "--mesh") lo.mesh = true;
    else if (a == "--quirk") lo.quirks.push_back(value());
    else if (a == "--link-latency-us") lo.link.latency_us = std::atof(value().c_str()); // arrival after send completion
    else if (a == "--only" && has_scenarios) {
      only = value();
      lo.args = {"--only", only};
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  return lo.ranks > 0 ? ring::run_local(lo) : run_rank(only);
}

} // namespace check

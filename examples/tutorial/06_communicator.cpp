// Tutorial chapter 6 (docs/tutorial/06-communicator.md): chapter 5's all_sum with the
// collectives layer, tbverbs::Communicator (tbverbs/collective.hpp).
//
//   tutorial_06_communicator --local N [--count C] [--quirk NAME=VALUE]
//                           N ranks (2..16) on N emulated Macs in a ring; --quirk: a reading of
//                           Apple's driver the emulator plays (docs/emulator.md, Quirks)
//   tutorial_06_communicator [--count C]             one rank, from a launcher's environment
//
// The same vector as chapter 5 (N chunks of C floats, element i on rank r is r + 1 + i % 5) and
// the same check. What chapter 5 did by hand (devices, GIDs, links, receives posted before any
// send, the two phases, the waits) is Communicator::connect() and one all_reduce() call; on top,
// the layer picks an algorithm by size, uses both ring directions and every cable, keeps
// receives posted between calls (no side-channel traffic per collective), works on six element
// types and four operations, bounds every wait, and refuses a bad call before sending anything.
#include <tbverbs/collective.hpp>

#include "tutorial.hpp"

#include <chrono>
#include <iostream>
#include <span>
#include <string>
#include <vector>

using namespace tbverbs;
using tutorial::fail;

static int run_rank(std::size_t count) {
  // Rank, size, rank 0's address and the device file, from the launcher's variables (mlx.launch,
  // torchrun, mpirun, Slurm); TBVERBS_* variables tune it (docs/collectives.md, Options).
  auto opts = CommunicatorOptions::from_env();
  if (!opts) return fail("reading the job's environment", opts.error());
  const int rank = opts->rank, n = opts->size;
  if (rank == 0) opts->log = [](const std::string& line) { std::cout << "rank 0: set-up: " << line << "\n"; };
  auto comm = Communicator::connect(*opts); // rendezvous, devices, links verified, first credits
  if (!comm) return fail("connecting the communicator", comm.error());
  if (rank == 0) std::cout << "rank 0: algorithm rule: " << comm->algorithm_rule() << "\n";

  const std::size_t total = static_cast<std::size_t>(n) * count;
  std::vector<float> data(total);
  for (std::size_t i = 0; i < total; ++i) data[i] = float(rank + 1 + int(i % 5));
  const auto algo = comm->algorithm_for(collective::Collective::all_reduce, total * sizeof(float));

  // Chapter 5's whole exchange: one call, in place, bounded by the options' timeout.
  const auto t0 = std::chrono::steady_clock::now();
  if (auto r = comm->all_reduce(std::span<float>(data), ReduceOp::sum); !r) return fail("all_reduce", r.error());
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t i = 0; i < total; ++i) {
    const float want = float(n * (n + 1) / 2 + n * int(i % 5));
    if (data[i] != want) return std::cerr << "FAILED: element " << i << " is " << data[i] << ", not " << want << "\n", 1;
  }
  std::cout << "rank " << rank << ": all_reduce (sum) of " << n << " x " << count << " floats verified in " << int(us)
            << " us (" << collective::algorithm_name(algo) << "): data[0] = " << data[0] << "\n";

  // A mistake the layer catches before sending anything: all_gather's output must hold every
  // rank's input. The call fails on every rank alike, and the communicator stays usable.
  std::vector<std::int32_t> mine(4, rank), all(4 * static_cast<std::size_t>(n) - 1);
  auto wrong = comm->all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all));
  if (wrong) return std::cerr << "FAILED: an all_gather into too small a buffer was accepted\n", 1;
  if (rank == 0) std::cout << "rank 0: refused, nothing sent: " << wrong.error().message() << "\n";
  all.resize(4 * static_cast<std::size_t>(n));
  if (auto r = comm->all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all)); !r)
    return fail("all_gather", r.error());
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i] != static_cast<std::int32_t>(i / 4)) return std::cerr << "FAILED: all_gather element " << i << "\n", 1;
  std::cout << "rank " << rank << ": all_gather of " << n << " x 4 int32 verified\n";

  if (rank == 0)
    for (const auto& line : comm->traffic()) std::cout << "rank 0: traffic: " << line << "\n";
  if (auto r = comm->close(); !r) return fail("closing", r.error()); // waits for every rank
  return 0;
}

int main(int argc, char** argv) {
  int local = 0;
  std::vector<std::string> quirks; // --local: readings of Apple's driver the emulator plays
  std::size_t count = 1024;
  bool bad = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--local" && i + 1 < argc) local = std::atoi(argv[++i]);
    else if (a == "--quirk" && i + 1 < argc) quirks.push_back(argv[++i]);
    else if (a == "--count" && i + 1 < argc) count = std::strtoul(argv[++i], nullptr, 10);
    else bad = true;
  }
  if (bad || (local != 0 && (local < 2 || local > 16)) || count == 0 || count > (1u << 24)) {
    std::cerr << "usage: tutorial_06_communicator [--local N (2..16) [--quirk NAME=VALUE]] [--count C (1..16777216 floats per chunk)]\n";
    return 2;
  }
  if (local != 0) return tutorial::run_local(local, {"--count", std::to_string(count)}, "thunderbolt", quirks);
  return run_rank(count);
}

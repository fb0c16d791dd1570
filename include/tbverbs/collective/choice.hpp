/// @file collective/choice.hpp
/// Which algorithm a collective runs, from measurements: the one table `Algorithm::automatic`
/// follows, and the rule in words (Communicator::algorithm_rule, ring_all_sum's set-up lines).
#pragma once

#include "algorithms.hpp"

#include <string>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// The all_reduce crossover: the latency algorithm at or below these bytes per rank, the ring
/// above. Measured with bench/all_sum/crossover.sh (Release, a 2-core machine shared
/// with other builds, load average about 4) on the paced emulator at B = 0.25 GB/s, L = 150 us
/// (Thunderbolt 5's 9.4 GB/s and 4 us slowed 37.6x: the same bandwidth-delay product, 37.6 KB,
/// which is what places the crossover), time of the latency algorithm over the ring's, 20
/// iterations:
///
///     bytes per rank   4K    16K   32K   64K   128K  256K  512K  1M
///     2 ranks          0.80  0.81  0.90  1.17  1.08  1.40  1.36  1.40
///     3 ranks          0.94  0.79  0.64  0.84  0.98  0.85  1.00  1.05
///     4 ranks          0.61  0.66  0.73  0.84  1.08  1.41  1.61  1.93   (another run: 0.98 at 128K)
///     8 ranks          0.54  0.68  0.74  0.98  1.47  1.45  1.88  2.48
///
/// The link model predicts the same places: the ring costs 2(n-1) hops of L and sends (n-1)/n of
/// the buffer per cable direction, the latency algorithm floor(n/2) hops and floor(n/2) buffers,
/// so it wins below L B (2(n-1) - h) / (h - (n-1)/n), h = floor(n/2): 2 L B at 2 ranks (75 KB on
/// Thunderbolt 5), 9 L B at 3 (every rank is a neighbour: one hop), 3.2 L B at 4 and 8 (120 KB).
inline std::size_t latency_crossover_bytes(int n) noexcept {
  if (n == 2) return 32 * 1024;
  if (n == 3) return 256 * 1024;
  return 64 * 1024;
}

/// The mesh's crossover on a fully connected job (MESH=1 bench/all_sum/crossover.sh, the same
/// machine, link and day as latency_crossover_bytes(); load average about 6), the mesh's time
/// over the ring's:
///
///     bytes per rank   4K    16K   64K   128K  256K  512K  1M
///     4 ranks          0.23  0.24  0.30  0.56  0.79  1.11  1.17
///     5 ranks          0.30  0.20  0.43  0.43  0.36  0.56  0.98
///     8 ranks          0.52  0.39  0.48  0.60  0.88  1.16  1.87
///
/// The model: one hop and one vector per cable direction against the ring's 2(n-1) hops and
/// (n-1)/n of a vector, so the mesh wins below (2n - 3) n L B; measured lower (the sending CPU
/// copies n - 1 vectors: the emulator's sender does the transfer), so the table keeps 256 KiB.
inline std::size_t mesh_crossover_bytes(int) noexcept { return 256 * 1024; }

/// The algorithm `kind` runs for `bytes` per rank (all_reduce: its vector; all_gather: one block;
/// reduce_scatter: one block) on `net`, given the caller's `asked` (all_reduce only; the others
/// always choose). Never Algorithm::automatic. all_gather takes the latency algorithm whenever
/// the blocks fit its gather area: it moves floor(n/2) blocks per cable direction, the ring's
/// all-gather (n - 1)/2 of them, in fewer hops.
inline Algorithm choose(const Network& net, Collective kind, std::size_t bytes, Algorithm asked) noexcept {
  const int n = net.size();
  const std::size_t fits = net.layout().vector_bytes;
  const bool mesh = net.fully_connected();
  // all_to_all (`bytes`: a rank's whole input): on a mesh, each block straight to its rank while
  // the blocks fit the gather area; else all_gather's choice for the whole input.
  if (kind == Collective::all_to_all && mesh && bytes / static_cast<std::size_t>(n) <= fits) return Algorithm::mesh;
  switch (schedule_of(kind)) {
  case Collective::all_reduce:
    if (asked == Algorithm::mesh && !mesh) return Algorithm::latency; // 3 ranks or fewer: one hop already
    if (asked != Algorithm::automatic) return asked;
    if (mesh && bytes <= std::min(fits, mesh_crossover_bytes(n))) return Algorithm::mesh;
    return bytes <= std::min(fits, latency_crossover_bytes(n)) ? Algorithm::latency : Algorithm::ring;
  case Collective::all_gather:
    if (mesh && bytes <= std::min(fits, mesh_crossover_bytes(n))) return Algorithm::mesh;
    return bytes <= fits ? Algorithm::latency : Algorithm::ring;
  case Collective::reduce_scatter:
    return mesh && bytes <= std::min(fits, mesh_crossover_bytes(n)) ? Algorithm::mesh : Algorithm::ring;
  default: return Algorithm::ring;
  }
}

/// The rule choose() follows for all_reduce, in one line.
inline std::string algorithm_rule(const Network& net, Algorithm asked) {
  const int n = net.size();
  const std::size_t fits = net.layout().vector_bytes;
  if (asked == Algorithm::mesh && !net.fully_connected())
    return "latency (mesh asked: with 3 ranks or fewer every rank is a neighbour, one hop)";
  if (asked != Algorithm::automatic) return std::string(algorithm_name(asked)) + " (asked for)";
  if (net.fully_connected())
    return "auto: mesh (every pair cabled: one hop) up to " + std::to_string(std::min(fits, mesh_crossover_bytes(n))) +
           " bytes per rank, ring (reduce-scatter + all-gather, both directions) above (the crossover measured on "
           "the paced emulator: collective/choice.hpp)";
  return "auto: latency (floor(n/2) hops each way) up to " + std::to_string(std::min(fits, latency_crossover_bytes(n))) +
         " bytes per rank, ring (reduce-scatter + all-gather, both directions) above (the crossover measured on the "
         "paced emulator: collective/choice.hpp)";
}

} // namespace collective
TBVERBS_NAMESPACE_END

/// @file collective/cabling.hpp
/// `collective::Cabling`: which device faces which rank (the ring order, the cables to each ring
/// neighbour, the mesh's devices), as a device file, topology discovery or the caller gives it.
#pragma once

#include "../config.hpp"

#include <string>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// Which device faces which rank, as a device file or topology discovery gives it.
struct Cabling {
  /// The ring order: order[p] is the rank at position p (empty: 0, 1, ..., size - 1). The left
  /// neighbour is the rank before this one in it, the right neighbour the rank after it.
  std::vector<int> order;
  std::vector<std::string> left;   ///< One device per cable to the left neighbour, in the cables' agreed order.
  std::vector<std::string> right;  ///< One device per cable to the right neighbour.
  /// A fully connected job: per rank, the device toward each rank that is not a ring neighbour
  /// ("" for this rank, the neighbours, and ranks without a cable). Empty: no mesh links.
  std::vector<std::string> mesh;
};

} // namespace collective
TBVERBS_NAMESPACE_END

/// @file collective/device_file.hpp
/// The device files operators already have: JACCL's matrix (`JACCL_IBV_DEVICES`) and
/// mlx.distributed_config's hostfile, read into the cables one rank has toward each other rank.
/// A pure function of the text, so a fuzz harness can feed it anything (fuzz/fuzz_ring_config.cpp).
#pragma once

#include "../config.hpp"
#include "../detail/json.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// One rank's cables as a device file lists them, in ring order 0, 1, ..., ranks - 1.
struct DeviceFileCables {
  int ranks = 0;                    ///< Ranks in the job (the matrix's size).
  std::vector<std::string> left;    ///< Devices toward rank - 1, in the cables' agreed order.
  std::vector<std::string> right;   ///< Devices toward rank + 1.
  /// For a fully connected job (the mesh algorithms): the first device toward each rank that is
  /// not a neighbour; empty for this rank, its neighbours and ranks the file gives no cable to.
  std::vector<std::string> others;
};

/// Parses a device file for `rank`: a JSON matrix whose [i][j] lists rank i's devices toward rank
/// j (a string for one cable, a list for several, null on the diagonal), as JACCL reads it, or
/// mlx.distributed_config's hostfile (`{"hosts": [{"rdma": [row i]}, ...]}`). Entry k on rank i and
/// entry k on rank j are the same cable (as JACCL pairs them and exo writes them). With two ranks
/// both neighbours are the same rank: its cables are shared out, even entries for rank 0's
/// rightward hop and odd ones for rank 1's, one cable carrying both (two QPs on one device).
/// At most 64 ranks and 32 cables per entry. Returns nullopt with one line in `problem` for
/// anything else.
inline std::optional<DeviceFileCables> parse_device_file(std::string_view text, int rank, std::string& problem) {
  using detail::json::Value;
  std::string why;
  auto parsed = detail::json::parse(text, why);
  if (!parsed) {
    problem = "not valid JSON: " + why;
    return std::nullopt;
  }
  Value m = std::move(*parsed);
  if (m.is_object()) {
    const Value* hosts = m.find("hosts");
    if (hosts == nullptr || !hosts->is_array()) {
      problem = "expected a matrix, or an object with a \"hosts\" list (mlx.distributed_config)";
      return std::nullopt;
    }
    Value rows;
    rows.kind = Value::Kind::array;
    for (const Value& h : hosts->items) {
      const Value* rdma = h.is_object() ? h.find("rdma") : nullptr;
      if (rdma == nullptr) {
        problem = "every entry of \"hosts\" needs an \"rdma\" list";
        return std::nullopt;
      }
      rows.items.push_back(*rdma);
    }
    m = std::move(rows);
  }
  if (!m.is_array() || m.items.size() < 2) {
    problem = "expected a square matrix of at least 2 ranks";
    return std::nullopt;
  }
  if (m.items.size() > 64) {
    problem = "at most 64 ranks";
    return std::nullopt;
  }
  const int n = static_cast<int>(m.items.size());
  for (std::size_t k = 0; k < m.items.size(); ++k)
    if (!m.items[k].is_array() || m.items[k].items.size() != m.items.size()) {
      problem = "row " + std::to_string(k) + " is not a list of " + std::to_string(m.items.size()) +
                " entries: the device file must be a square matrix, one row and one column per rank";
      return std::nullopt;
    }
  if (rank < 0 || rank >= n) {
    problem = "rank " + std::to_string(rank) + " is outside the device file's " + std::to_string(n) + " ranks";
    return std::nullopt;
  }
  auto entry = [&](int peer) -> std::optional<std::vector<std::string>> {
    const Value& e = m.items[static_cast<std::size_t>(rank)].items[static_cast<std::size_t>(peer)];
    const std::string where = "entry [" + std::to_string(rank) + "][" + std::to_string(peer) + "]";
    std::vector<std::string> out;
    if (e.is_string() && !e.text.empty()) {
      out.push_back(e.text);
    } else if (e.is_array()) {
      for (const Value& d : e.items) {
        if (!d.is_string() || d.text.empty()) {
          problem = where + " lists something that is not a device name";
          return std::nullopt;
        }
        out.push_back(d.text);
      }
    } else if (!e.is_null()) {
      problem = where + " is neither a device name, a list of them, nor null";
      return std::nullopt;
    }
    if (out.size() > 32) {
      problem = where + " lists more than 32 cables";
      return std::nullopt;
    }
    return out;
  };
  DeviceFileCables c;
  c.ranks = n;
  const int left = (rank + n - 1) % n, right = (rank + 1) % n;
  if (n == 2) {
    auto cables = entry(1 - rank);
    if (!cables) return std::nullopt;
    std::vector<std::string> even, odd;
    for (std::size_t k = 0; k < cables->size(); ++k) (k % 2 == 0 ? even : odd).push_back((*cables)[k]);
    if (odd.empty()) odd = even;
    c.right = rank == 0 ? even : odd;
    c.left = rank == 0 ? odd : even;
  } else {
    auto r = entry(right), l = entry(left);
    if (!r || !l) return std::nullopt;
    c.right = std::move(*r);
    c.left = std::move(*l);
  }
  if (c.left.empty() || c.right.empty()) {
    problem = "rank " + std::to_string(rank) + " needs devices toward ranks " + std::to_string(left) + " and " +
              std::to_string(right) + " (a ring)";
    return std::nullopt;
  }
  c.others.assign(static_cast<std::size_t>(n), std::string());
  for (int p = 0; p < n; ++p) {
    if (p == rank || p == left || p == right) continue;
    auto e = entry(p);
    if (!e) return std::nullopt;
    if (!e->empty()) c.others[static_cast<std::size_t>(p)] = e->front();
  }
  return c;
}

TBVERBS_NAMESPACE_END

// What a user types that the ring reads before anything else: sizes ("64M"), rank numbers from the
// environment, and the device file (JACCL's matrix, or mlx.distributed_config's hostfile). Pure
// functions, so fuzz/fuzz_ring_config.cpp can feed them anything.
#pragma once

#include "../../tools/common/size_arg.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ring {

// Largest buffer a rank may ask for: far above any real all_sum (1 GiB per rank is the issue's
// bound), far below what overflows a size_t or the allocator (issue 9: a wrapped size crashed).
constexpr std::size_t kMaxBytes = std::size_t{1} << 40;

// "64M", "4K", "1G", "123" (bytes); nullopt for anything else or above kMaxBytes. The parser
// every example and tool shares (tools/common/size_arg.hpp).
inline std::optional<std::size_t> parse_size(const std::string& s) { return cli::parse_size(s, kMaxBytes); }

// A rank number from the environment: digits only ("one" is not rank 0).
std::optional<int> parse_rank(const std::string& s) {
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(s);
}

/// One rank's cables as a device file lists them: the job's rank count and the devices toward
/// the left (rank - 1) and right (rank + 1) neighbours, in the cables' agreed order; and, for the
/// mesh all_sum of a fully connected job, the first device toward each other rank (`others[peer]`,
/// empty for this rank, its neighbours, and ranks the file gives no cable to).
struct DeviceFileCables {
  int ranks = 0;
  std::vector<std::string> left, right;
  std::vector<std::string> others;
};

/// Parses a device file for `rank`: a JSON matrix whose [i][j] lists rank i's devices toward rank
/// j (a string for one cable, a list for several, null on the diagonal), as JACCL reads it, or
/// mlx.distributed_config's hostfile ({"hosts": [{"rdma": [row i]}, ...]}). Entry k on rank i and
/// entry k on rank j are the same cable (as JACCL pairs them and exo writes them). With two
/// ranks both neighbours are the same rank: its cables are shared out, even entries for rank 0's
/// rightward hop and odd ones for rank 1's, one cable carrying both (two QPs on one device).
/// Returns nullopt with one line in `problem` for anything else.
inline std::optional<DeviceFileCables> parse_device_file(std::string_view text, int rank, std::string& problem) {
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    problem = std::string("not valid JSON: ") + e.what();
    return std::nullopt;
  }
  if (m.is_object() && m.contains("hosts") && m["hosts"].is_array()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& h : m["hosts"]) {
      if (!h.is_object() || !h.contains("rdma")) {
        problem = "every entry of \"hosts\" needs an \"rdma\" list";
        return std::nullopt;
      }
      rows.push_back(h["rdma"]);
    }
    m = std::move(rows);
  }
  if (!m.is_array() || m.size() < 2) {
    problem = "expected a square matrix of at least 2 ranks";
    return std::nullopt;
  }
  if (m.size() > 64) {
    problem = "at most 64 ranks";
    return std::nullopt;
  }
  const int n = static_cast<int>(m.size());
  for (std::size_t k = 0; k < m.size(); ++k)
    if (!m[k].is_array() || m[k].size() != m.size()) {
      problem = "row " + std::to_string(k) + " is not a list of " + std::to_string(m.size()) +
                " entries: the device file must be a square matrix, one row and one column per rank";
      return std::nullopt;
    }
  if (rank < 0 || rank >= n) {
    problem = "rank " + std::to_string(rank) + " is outside the device file's " + std::to_string(n) + " ranks";
    return std::nullopt;
  }
  auto entry = [&](int peer) -> std::optional<std::vector<std::string>> {
    const auto& e = m[static_cast<std::size_t>(rank)][static_cast<std::size_t>(peer)];
    const std::string where = "entry [" + std::to_string(rank) + "][" + std::to_string(peer) + "]";
    std::vector<std::string> out;
    if (e.is_string() && !e.get<std::string>().empty()) out.push_back(e.get<std::string>());
    else if (e.is_array())
      for (const auto& d : e) {
        if (!d.is_string() || d.get<std::string>().empty()) {
          problem = where + " lists something that is not a device name";
          return std::nullopt;
        }
        out.push_back(d.get<std::string>());
      }
    else if (!e.is_null()) {
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

}  // namespace ring

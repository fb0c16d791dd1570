/// @file collective/launcher.hpp
/// Rank, job size and coordinator from the variables the common launchers set, so programs on
/// tbverbs start unchanged under mlx.launch, torchrun, mpirun and srun. One table, read in one
/// place (CommunicatorOptions::from_env, ring_all_sum, tbverbs-probe); the first launcher whose
/// rank variable is set wins, so a job started by mpirun inside a Slurm allocation (which also has
/// SLURM_PROCID) takes Open MPI's numbers:
///
///     launcher    rank                      size                      coordinator ("host:port")
///     mlx.launch  JACCL_RANK, MLX_RANK      MLX_WORLD_SIZE            JACCL_COORDINATOR, MLX_JACCL_COORDINATOR
///     torchrun    RANK                      WORLD_SIZE                MASTER_ADDR + MASTER_PORT
///     Open MPI    OMPI_COMM_WORLD_RANK      OMPI_COMM_WORLD_SIZE      (none of its own)
///     PMI         PMI_RANK                  PMI_SIZE                  (none of its own)
///     Slurm       SLURM_PROCID              SLURM_NTASKS              (none of its own)
///
/// The coordinator is the first of JACCL_COORDINATOR, MLX_JACCL_COORDINATOR and MASTER_ADDR +
/// MASTER_PORT that is set, whichever launcher gave the rank: mpirun, PMI and srun have no variable
/// for it, so with them give one explicitly or export one of those (`mpirun -x MASTER_ADDR=host0
/// -x MASTER_PORT=29500 ...`).
#pragma once

#include "../config.hpp"

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN
/// Where a job's placement came from and what it says.
struct LauncherJob {
  std::optional<int> rank;   ///< This process' rank, when a launcher's rank variable is set.
  std::optional<int> size;   ///< The number of ranks, when that launcher's size variable is set.
  std::string coordinator;   ///< "host:port" of rank 0, empty when no variable gives it.
  std::string launcher;      ///< "torchrun", "Open MPI", ...: which row gave the rank ("" when none).
  std::string rank_variable; ///< The variable the rank came from ("RANK"), for messages.
  std::string size_variable; ///< The variable the size came from ("WORLD_SIZE"), "" when none.
  std::string coordinator_from; ///< "MASTER_ADDR:MASTER_PORT", "JACCL_COORDINATOR", ... ("" when none).
};

namespace detail {
namespace launcher {
inline std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}
// A rank or size: digits only, at most 5 of them ("one" and "-1" are not numbers).
inline std::optional<int> number(const std::string& s) {
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(s);
}
struct LauncherRow {
  const char* name;
  const char* rank_vars[2];
  const char* size_var;
};
inline constexpr LauncherRow kLaunchers[] = {
    {"mlx.launch", {"JACCL_RANK", "MLX_RANK"}, "MLX_WORLD_SIZE"},
    {"torchrun", {"RANK", nullptr}, "WORLD_SIZE"},
    {"Open MPI", {"OMPI_COMM_WORLD_RANK", nullptr}, "OMPI_COMM_WORLD_SIZE"},
    {"PMI", {"PMI_RANK", nullptr}, "PMI_SIZE"},
    {"Slurm", {"SLURM_PROCID", nullptr}, "SLURM_NTASKS"},
};
} // namespace launcher
} // namespace detail

/// Reads the table above from the environment. Returns nullopt, with one line in `problem`, when a
/// variable that is used is set but malformed (a rank that is not a number, MASTER_ADDR without
/// MASTER_PORT, a size of 0, a rank outside the size); a job with no launcher variables at all is
/// not a problem (every field empty), the caller says what is missing.
inline std::optional<LauncherJob> launcher_job(std::string& problem) {
  LauncherJob job;
  for (const auto& row : detail::launcher::kLaunchers) {
    for (const char* var : row.rank_vars) {
      if (var == nullptr) continue;
      auto v = detail::launcher::env(var);
      if (!v) continue;
      auto r = detail::launcher::number(*v);
      if (!r) {
        problem = std::string(var) + "=\"" + *v + "\" (" + row.name + ") is not a rank number";
        return std::nullopt;
      }
      job.rank = *r;
      job.launcher = row.name;
      job.rank_variable = var;
      break;
    }
    if (!job.rank) continue;
    if (auto v = detail::launcher::env(row.size_var)) {
      auto n = detail::launcher::number(*v);
      if (!n || *n == 0) {
        problem = std::string(row.size_var) + "=\"" + *v + "\" (" + row.name + ") is not a number of ranks";
        return std::nullopt;
      }
      if (*job.rank >= *n) {
        problem = job.rank_variable + "=" + std::to_string(*job.rank) + " is outside " + row.size_var + "=" +
                  std::to_string(*n) + " (" + row.name + ")";
        return std::nullopt;
      }
      job.size = *n;
      job.size_variable = row.size_var;
    }
    break;
  }
  for (const char* var : {"JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR"}) {
    if (auto v = detail::launcher::env(var)) {
      job.coordinator = *v;
      job.coordinator_from = var;
      return job;
    }
  }
  auto addr = detail::launcher::env("MASTER_ADDR");
  auto port = detail::launcher::env("MASTER_PORT");
  if (addr && port) {
    auto p = detail::launcher::number(*port);
    if (!p || *p == 0 || *p > 65535) {
      problem = "MASTER_PORT=\"" + *port + "\" is not a TCP port";
      return std::nullopt;
    }
    // An IPv6 literal needs brackets in "host:port".
    const bool v6 = addr->find(':') != std::string::npos && addr->front() != '[';
    job.coordinator = (v6 ? "[" + *addr + "]" : *addr) + ":" + *port;
    job.coordinator_from = "MASTER_ADDR:MASTER_PORT";
  } else if (addr || port) {
    problem = std::string(addr ? "MASTER_ADDR is set without MASTER_PORT" : "MASTER_PORT is set without MASTER_ADDR") +
              " (torchrun sets both)";
    return std::nullopt;
  }
  return job;
}

/// The variables that give a rank, for "no rank" messages.
inline constexpr const char* launcher_rank_variables =
    "JACCL_RANK or MLX_RANK (mlx.launch), RANK (torchrun), OMPI_COMM_WORLD_RANK (mpirun), PMI_RANK or "
    "SLURM_PROCID (srun)";
/// The variables that give a coordinator, for "no coordinator" messages.
inline constexpr const char* launcher_coordinator_variables = "JACCL_COORDINATOR, or MASTER_ADDR and MASTER_PORT";

TBVERBS_NAMESPACE_END

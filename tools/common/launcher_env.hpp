// Rank, job size and coordinator from the variables the common launchers set (mlx.launch,
// torchrun, Open MPI, PMI, Slurm), for ring_all_sum and tbverbs-probe: the collectives layer's one
// table (tbverbs/collective/launcher.hpp, which documents it), under the tools' names. Flags given
// on the command line override all of it.
#pragma once

#include <tbverbs/collective/launcher.hpp>

#include <optional>
#include <string>

namespace cli {

using LauncherJob = tbverbs::LauncherJob;

/// tbverbs::launcher_job: the job as the launcher's variables give it, or nullopt with the one
/// line in `problem` when a variable is set but malformed.
inline std::optional<LauncherJob> launcher_job(std::string& problem) { return tbverbs::launcher_job(problem); }

/// The variables that give a rank, for "no rank" messages.
inline constexpr const char* kRankVariables = tbverbs::launcher_rank_variables;
/// The variables that give a coordinator, for "no coordinator" messages.
inline constexpr const char* kCoordinatorVariables = tbverbs::launcher_coordinator_variables;

} // namespace cli

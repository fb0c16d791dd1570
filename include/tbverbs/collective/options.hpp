/// @file collective/options.hpp
/// `CommunicatorOptions`: how a communicator finds its peers and devices, and how it moves data.
/// Settable in code, or read from the environment the common launchers set (from_env()). Its
/// definitions are in collective/impl/options.hpp (collective/linkage.hpp says when they are compiled).
#pragma once

#include "../error.hpp"
#include "../result.hpp"
#include "cabling.hpp"
#include "linkage.hpp"
#include "settings.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

TBVERBS_NAMESPACE_BEGIN

/// How a Communicator finds its peers and devices, and how it moves data. Every rank of a job
/// gives the same size, message size, window, transport and algorithm.
struct CommunicatorOptions {
  int rank = -1;     ///< This process' rank, 0 <= rank < size.
  int size = 0;      ///< Ranks in the job (1 to 64).
  /// "host:port" of rank 0's rendezvous (the side channel): rank 0 listens there, the others
  /// connect. On rank 0, port 0 picks a free port and reports it to on_listening (a framework that
  /// has its own store publishes it there: the torch.distributed backend does).
  std::string coordinator;
  /// Called once by rank 0 with the port it listens on, before it waits for the other ranks.
  std::function<void(std::uint16_t)> on_listening;
  /// Same on every rank of a job; a rendezvous frame with another token is refused, so two jobs
  /// on one coordinator port do not join. 0: derived from `job_secret` and the coordinator, or,
  /// without a secret, from the coordinator and the job id (TBVERBS_JOB_ID, SLURM_JOB_ID,
  /// MLX_JOB_ID, TORCHELASTIC_RUN_ID), which anyone who can reach the coordinator can compute.
  std::uint64_t job_token = 0;
  /// The job's secret (job_secret.hpp: TBVERBS_JOB_SECRET or TBVERBS_JOB_SECRET_FILE, read by
  /// from_env()), the same on every rank; empty: none (a one-time notice says what that allows).
  /// Never printed.
  std::string job_secret;
  /// A job_token given in code comes from a value only the job's ranks have (a framework's Store).
  bool job_token_secret = false;
  /// The verbs library ("": TBVERBS_LIBRARY, then the platform's: librdma.dylib, libibverbs.so.1).
  std::string library;
  /// Which device faces which rank, the first that is given: `cabling` (set in code); a device
  /// file (`device_file`: JACCL's matrix or mlx.distributed_config's hostfile, from
  /// JACCL_IBV_DEVICES or MLX_IBV_DEVICES); else discovered from the ports' IPv4 subnets over the
  /// side channel (one /30 per cable: tbverbs/topology.hpp).
  std::optional<collective::Cabling> cabling;
  std::string device_file; ///< See cabling.
  collective::Memory memory = collective::Memory::automatic;          ///< TBVERBS_MEMORY: auto, registered, staged.
  collective::Transport transport = collective::Transport::automatic; ///< TBVERBS_TRANSPORT: auto, send, write.
  collective::Algorithm algorithm = collective::Algorithm::automatic; ///< TBVERBS_ALGORITHM: auto, ring, latency, mesh (all_reduce).
  /// Largest message, whole 4 KiB frames (TBVERBS_MESSAGE_BYTES, e.g. 256K). Lowered ring-wide to
  /// what every link's warm-up confirmed (one frame under macOS 26.2's reading).
  std::size_t message_bytes = 256 * 1024;
  int window = 8;                            ///< Messages in flight per ring direction (TBVERBS_WINDOW).
  /// Bound of every wait: set-up, no progress within a collective (TBVERBS_TIMEOUT_MS).
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds gid_wait{1000};  ///< How long to wait for an IPv4-mapped GID to appear.
  /// Set-up lines (devices, links, transport, message size); may be empty.
  std::function<void(const std::string&)> log;

  /// Options from the environment: rank, size and coordinator from the launcher table
  /// (collective/launcher.hpp: mlx.launch, torchrun, Open MPI, PMI, Slurm; TBVERBS_RANKS gives the
  /// size where the launcher does not), the device file from JACCL_IBV_DEVICES or MLX_IBV_DEVICES
  /// (its rank count is the size when nothing else gives one), and the TBVERBS_* settings above.
  /// Errors: `invalid_argument` at Step::configure naming what is missing or malformed (no rank,
  /// no coordinator, a size that disagrees with the device file, a setting that is not a value).
  [[nodiscard]] static Result<CommunicatorOptions> from_env();
  /// Options for a job whose rank and size a framework gives, with its own rendezvous (the
  /// torch.distributed backend: a Store): the device file and the TBVERBS_* settings from the
  /// environment, as from_env() reads them; the launcher variables are not read and the
  /// coordinator is left empty (the caller sets it, and usually job_token). Errors: as from_env(),
  /// and a rank or size out of range.
  [[nodiscard]] static Result<CommunicatorOptions> from_env(int rank, int size);

private:
  // The device file (JACCL_IBV_DEVICES, MLX_IBV_DEVICES; it gives the size when `size` is 0) and
  // the TBVERBS_* settings, into `o`, whose rank is set.
  static Result<void> read_environment(CommunicatorOptions& o);
};

TBVERBS_NAMESPACE_END

#if TBVERBS_COLLECTIVE_DEFINITIONS
#include "impl/options.hpp"
#endif

/// @file collective/options.hpp
/// `CommunicatorOptions`: how a communicator finds its peers and devices, and how it moves data.
/// Settable in code, or read from the environment the common launchers set (from_env()).
#pragma once

#include "../detail/decimal.hpp"
#include "../error.hpp"
#include "../job_secret.hpp"
#include "../result.hpp"
#include "device_file.hpp"
#include "launcher.hpp"
#include "network.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

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

namespace detail {
/// Reads a whole file with POSIX calls (at most `limit` bytes); nullopt when it cannot.
inline std::optional<std::string> read_small_file(const std::string& path, std::size_t limit = 16u << 20) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || out.size() + static_cast<std::size_t>(n) > limit) {
      ::close(fd);
      if (n < 0 || out.size() + static_cast<std::size_t>(n > 0 ? n : 0) > limit) return std::nullopt;
      return out;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
}
} // namespace detail

inline Result<CommunicatorOptions> CommunicatorOptions::from_env() {
  auto bad = [](std::string what) { return fail(Error::make(Step::configure, ErrorKind::invalid_argument, what)); };
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
  CommunicatorOptions o;
  std::string problem;
  const auto job = launcher_job(problem);
  if (!job) return bad(problem);
  if (!job->rank) return bad(std::string("no rank: set ") + launcher_rank_variables);
  o.rank = *job->rank;
  o.coordinator = job->coordinator;
  if (o.coordinator.empty())
    return bad(std::string("no coordinator: set ") + launcher_coordinator_variables + " (" + job->launcher +
               " gave the rank, not the coordinator)");
  if (job->size) o.size = *job->size;
  if (auto v = env("TBVERBS_RANKS")) {
    auto n = detail::parse_decimal(*v);
    if (!n || *n < 1 || *n > 64) return bad("TBVERBS_RANKS=\"" + *v + "\" is not a number of ranks from 1 to 64");
    if (o.size != 0 && static_cast<std::uint64_t>(o.size) != *n)
      return bad("TBVERBS_RANKS=" + *v + " but " + job->size_variable + "=" + std::to_string(o.size));
    o.size = static_cast<int>(*n);
  }
  if (auto r = read_environment(o); !r) return fail(r.error());
  if (o.size == 0)
    return bad("no job size: the launcher gave none (" + (job->launcher.empty() ? std::string("none") : job->launcher) +
               "); set TBVERBS_RANKS or a device file (JACCL_IBV_DEVICES)");
  if (o.rank >= o.size) return bad("rank " + std::to_string(o.rank) + " is outside the job's " + std::to_string(o.size) + " ranks");
  return o;
}

inline Result<CommunicatorOptions> CommunicatorOptions::from_env(int rank, int size) {
  if (size < 1 || size > 64 || rank < 0 || rank >= size)
    return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                            "rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                ": a job has 1 to 64 ranks, numbered from 0"));
  CommunicatorOptions o;
  o.rank = rank;
  o.size = size;
  if (auto r = read_environment(o); !r) return fail(r.error());
  return o;
}

inline Result<void> CommunicatorOptions::read_environment(CommunicatorOptions& o) {
  auto bad = [](std::string what) { return fail(Error::make(Step::configure, ErrorKind::invalid_argument, what)); };
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
  std::string problem;
  for (const char* var : {"JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"})
    if (auto v = env(var)) {
      o.device_file = *v;
      auto text = detail::read_small_file(*v);
      if (!text) return bad(std::string(var) + "=" + *v + ": cannot read the device file");
      auto cables = parse_device_file(*text, o.rank, problem);
      if (!cables) return bad(*v + ": " + problem);
      if (o.size != 0 && o.size != cables->ranks)
        return bad("the job has " + std::to_string(o.size) + " ranks but " + *v + " lists " + std::to_string(cables->ranks));
      o.size = cables->ranks;
      break;
    }
  auto secret = job_secret_from_env();
  if (!secret) return fail(secret.error());
  o.job_secret = std::move(*secret);
  if (auto v = env("TBVERBS_MEMORY")) {
    auto m = collective::parse_setting<collective::Memory>(*v);
    if (!m) return bad("TBVERBS_MEMORY=\"" + *v + "\": " + collective::setting_choices<collective::Memory>());
    o.memory = *m;
  }
  if (auto v = env("TBVERBS_TRANSPORT")) {
    auto t = collective::parse_setting<collective::Transport>(*v);
    if (!t) return bad("TBVERBS_TRANSPORT=\"" + *v + "\": " + collective::setting_choices<collective::Transport>());
    o.transport = *t;
  }
  if (auto v = env("TBVERBS_ALGORITHM")) {
    auto a = collective::parse_setting<collective::Algorithm>(*v);
    if (!a) return bad("TBVERBS_ALGORITHM=\"" + *v + "\": " + collective::setting_choices<collective::Algorithm>());
    o.algorithm = *a;
  }
  if (auto v = env("TBVERBS_MESSAGE_BYTES")) {
    auto b = detail::parse_size(*v, std::uint64_t{16} << 20);
    if (!b || *b < frame_bytes || *b % frame_bytes != 0 || *b > (std::size_t{16} << 20))
      return bad("TBVERBS_MESSAGE_BYTES=\"" + *v + "\": whole 4 KiB frames, at most 16M");
    o.message_bytes = static_cast<std::size_t>(*b);
  }
  if (auto v = env("TBVERBS_WINDOW")) {
    auto w = detail::parse_decimal(*v);
    if (!w || *w < 1 || *w > 1024) return bad("TBVERBS_WINDOW=\"" + *v + "\": 1 to 1024 messages");
    o.window = static_cast<int>(*w);
  }
  if (auto v = env("TBVERBS_TIMEOUT_MS")) {
    auto t = detail::parse_decimal(*v);
    if (!t || *t < 1 || *t > 86400000) return bad("TBVERBS_TIMEOUT_MS=\"" + *v + "\": 1 to 86400000 ms");
    o.timeout = std::chrono::milliseconds(*t);
  }
  return {};
}

TBVERBS_NAMESPACE_END

/// @file collective/impl/options.hpp
/// The definitions of CommunicatorOptions (collective/options.hpp): reading the launchers'
/// variables, the device file and the TBVERBS_* settings. Included by collective/options.hpp
/// where this translation unit holds the collectives layer's definitions (collective/linkage.hpp).
#pragma once

#include "../../detail/decimal.hpp"
#include "../../job_secret.hpp"
#include "../../sizes.hpp"
#include "../../message_size.hpp"
#include "../device_file.hpp"
#include "../launcher.hpp"
#include "../options.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

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

TBVERBS_COLLECTIVE_DEF Result<CommunicatorOptions> CommunicatorOptions::from_env() {
  auto bad = [](const std::string& what) { return fail(Error::make(Step::configure, ErrorKind::invalid_argument, what)); };
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

TBVERBS_COLLECTIVE_DEF Result<CommunicatorOptions> CommunicatorOptions::from_env(int rank, int size) {
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

TBVERBS_COLLECTIVE_DEF Result<void> CommunicatorOptions::read_environment(CommunicatorOptions& o) {
  auto bad = [](const std::string& what) { return fail(Error::make(Step::configure, ErrorKind::invalid_argument, what)); };
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

/// @file job_secret.hpp
/// A job's secret: the value every rank of a job is given, and nobody else has, from which the
/// side channel's job token is made (side_channel.hpp). A rendezvous frame carrying another token
/// is refused, so with a secret only ranks that were given it can join the job, end it at the
/// rendezvous, or send its ranks an abort. Without one, the token comes from public values (the
/// coordinator's address, a launcher's job id) and anyone who can reach the coordinator's port can
/// compute it.
///
/// What it is not: encryption. The token travels in every frame in the clear, so a process that
/// can read the job's traffic can copy it; the secret keeps out those that can only reach the
/// port (docs/side_channel.md, "The job's secret").
///
/// Where it comes from: a launcher makes one (make_job_secret(): ring_all_sum --local, comm_check
/// and `tbverbs-emu run` do) and hands it to its ranks as TBVERBS_JOB_SECRET; a job started by
/// hand, by mlx.launch, mpirun or Slurm sets TBVERBS_JOB_SECRET on every rank, or
/// TBVERBS_JOB_SECRET_FILE to a file holding it (not in the environment other processes of the
/// user may read); the torch.distributed backend makes a random token and passes it through the
/// framework's Store. The secret is never sent and never printed.
#pragma once

#include "config.hpp"
#include "error.hpp"
#include "result.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// The least number of characters a secret must have (16 random hex characters: 64 bits).
inline constexpr std::size_t min_job_secret_chars = 16;

/// The 64-bit job token of a job named `job_name` ("tbverbs communicator HOST:PORT JOBID"): from
/// `secret` when there is one, so it cannot be computed without it; else from `job_name` alone
/// (FNV-1a: the same on every rank of the job, refusing a stray rank of another).
constexpr std::uint64_t job_token(std::string_view job_name, std::string_view secret = {}) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](std::string_view text) {
    for (char ch : text) {
      h ^= static_cast<unsigned char>(ch);
      h *= 0x100000001b3ull;
    }
  };
  if (!secret.empty()) {
    mix("tbverbs job secret ");
    mix(secret);
    mix(" ");
  }
  mix(job_name);
  return h;
}

/// A new secret: 32 hex characters (128 bits) from the system's random source (/dev/urandom).
/// Errors: `unsupported` (with errno) when the source cannot be read.
[[nodiscard]] inline Result<std::string> make_job_secret() {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(Error::from_errno(Step::configure).with_detail("make_job_secret: cannot open /dev/urandom"));
  unsigned char raw[16];
  std::size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = ::read(fd, raw + got, sizeof raw - got);
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      ::close(fd);
      return fail(Error::from_errno(Step::configure, e).with_detail("make_job_secret: reading /dev/urandom"));
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char b : raw) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

/// The job's secret from the environment: TBVERBS_JOB_SECRET, or the first line of the file that
/// TBVERBS_JOB_SECRET_FILE names; empty when neither is set. Errors (`invalid_argument` at
/// Step::configure, never showing the secret): both set, the file unreadable, a secret shorter
/// than min_job_secret_chars.
[[nodiscard]] inline Result<std::string> job_secret_from_env() {
  auto invalid = [](const std::string& d) { return fail(Error::make(Step::configure, ErrorKind::invalid_argument, d)); };
  const char* value = std::getenv("TBVERBS_JOB_SECRET");
  const char* file = std::getenv("TBVERBS_JOB_SECRET_FILE");
  const bool has_value = value != nullptr && *value != '\0', has_file = file != nullptr && *file != '\0';
  if (has_value && has_file) return invalid("TBVERBS_JOB_SECRET and TBVERBS_JOB_SECRET_FILE are both set: give one");
  std::string secret;
  if (has_value) secret = value;
  if (has_file) {
    const int fd = ::open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return invalid(std::string("TBVERBS_JOB_SECRET_FILE: cannot open ") + file);
    char buf[256];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    if (n < 0) return invalid(std::string("TBVERBS_JOB_SECRET_FILE: cannot read ") + file);
    secret.assign(buf, static_cast<std::size_t>(n));
    secret = secret.substr(0, secret.find_first_of("\r\n"));
  }
  if (!secret.empty() && secret.size() < min_job_secret_chars)
    return invalid("the job secret (TBVERBS_JOB_SECRET" + std::string(has_file ? "_FILE" : "") + ") has " +
                   std::to_string(secret.size()) + " characters, fewer than " + std::to_string(min_job_secret_chars) +
                   ": use a random one (make_job_secret(), or `head -c 16 /dev/urandom | xxd -p`)");
  return secret;
}

/// A job token and whether it came from a secret (SideChannelOptions::job_token, secret_token).
struct JobToken {
  std::uint64_t token = 0; ///< The token.
  bool secret = false;     ///< True when made from the job's secret.
};

/// The token of a job named `job_name` with the environment's secret (job_secret_from_env()), or
/// without one. Errors: job_secret_from_env()'s.
[[nodiscard]] inline Result<JobToken> job_token_from_env(std::string_view job_name) {
  auto secret = job_secret_from_env();
  if (!secret) return fail(secret.error());
  return JobToken{job_token(job_name, *secret), !secret->empty()};
}

TBVERBS_NAMESPACE_END

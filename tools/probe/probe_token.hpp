// The side-channel job token of tbverbs-probe's two ends: the public constant, or one mixed with
// the shared secret of --token (docs/thunderbolt.md, "What the probe exposes"). One definition for
// the probe and its hostile-peer test helper.
#pragma once

#include <tbverbs/side_channel.hpp>

#include <cstdint>
#include <string>

inline std::uint64_t probe_job_token(const std::string& secret) {
  return tbverbs::side_channel_token(secret.empty() ? std::string("tbverbs-probe 1") : "tbverbs-probe 1:" + secret);
}

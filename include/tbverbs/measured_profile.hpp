/// @file measured_profile.hpp
/// `MeasuredProfile`: what `tbverbs-probe` measured on one host's driver (the largest message
/// delivered intact, what a send meeting an empty receive queue does, whether completion
/// channels work, ...), written with `--profile-out FILE` and loaded by the library from
/// `TBVERBS_PROFILE=FILE`, so measured values replace assumed defaults.
///
/// The file is plain `key=value` lines (`#` starts a comment, unknown keys are kept and ignored,
/// so an older library reads a newer probe's file): no JSON, no dependency, parsed here with the
/// standard library only.
///
/// ```
/// # tbverbs-probe 0.x, macOS 26.3 (25D125), rdma_en2 <-> 10.99.0.2
/// tbverbs_profile=1
/// device=rdma_en2
/// max_message_bytes=16384000
/// empty_rq=wait
/// completion_channels=false
/// ```
#pragma once

#include "completion_queue.hpp"
#include "config.hpp"
#include "detail/decimal.hpp"
#include "detail/mutex.hpp"
#include "error.hpp"
#include "result.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// What a UC send that meets an empty receive queue does (docs/field-reports.md section 4b:
/// contested).
enum class EmptyRqBehaviour : std::uint8_t {
  unknown, ///< Not measured: code must work under every reading (never let it happen).
  wait,    ///< Held by credit-based flow control until the peer posts a receive (TN3205, llama.cpp).
  drop,    ///< The message is lost, the QP lives (IB UC semantics).
  kill,    ///< The message is lost and that direction never delivers again (ds4).
};

/// The printable name of an EmptyRqBehaviour ("wait", "drop", "kill", "unknown").
constexpr std::string_view empty_rq_name(EmptyRqBehaviour b) noexcept {
  switch (b) {
  case EmptyRqBehaviour::wait: return "wait";
  case EmptyRqBehaviour::drop: return "drop";
  case EmptyRqBehaviour::kill: return "kill";
  case EmptyRqBehaviour::unknown: break;
  }
  return "unknown";
}

/// The values tbverbs-probe measured on one host. Every field is optional: absent means "not
/// measured", and the library keeps its assumed default for it.
struct MeasuredProfile {
  /// Format version of the file (`tbverbs_profile=1`).
  static constexpr int format_version = 1;

  std::string device;                          ///< The device measured (informational).
  std::string macos;                           ///< macOS version and build measured on (informational).
  std::optional<std::size_t> max_message_bytes; ///< Largest message delivered intact both ways.
  EmptyRqBehaviour empty_rq = EmptyRqBehaviour::unknown; ///< What a send meeting an empty receive queue did.
  std::optional<bool> completion_channels;     ///< Channels created and woken by a completion.
  std::optional<std::uint64_t> max_mr_bytes;   ///< Largest single region registered.
  std::optional<int> max_mrs;                  ///< Regions registered until refusal.
  std::optional<int> max_qps;                  ///< Queue pairs created until refusal.
  /// Every `key=value` pair of the file, known or not, in file order.
  std::vector<std::pair<std::string, std::string>> entries;

  /// The value of `key` in the file, if any (for keys this version does not interpret).
  std::optional<std::string_view> get(std::string_view key) const noexcept {
    for (const auto& [k, v] : entries)
      if (k == key) return std::string_view(v);
    return std::nullopt;
  }

  /// Parses the text of a profile file. `origin` names it in errors. Errors: `invalid_argument`
  /// at Step::configure naming the line, for a line without `=`, a malformed number or boolean,
  /// an unknown `empty_rq` value, or a `tbverbs_profile` version newer than this library's.
  [[nodiscard]] static Result<MeasuredProfile> parse(std::string_view text, std::string_view origin = "profile") {
    MeasuredProfile p;
    int line_no = 0;
    auto bad = [&](const std::string& why) {
      return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                              std::string(origin) + ":" + std::to_string(line_no) + ": " + why));
    };
    while (!text.empty()) {
      ++line_no;
      const std::size_t nl = text.find('\n');
      std::string_view line = text.substr(0, nl);
      text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
      line = trim(line.substr(0, line.find('#')));
      if (line.empty()) continue;
      const std::size_t eq = line.find('=');
      if (eq == std::string_view::npos || eq == 0) return bad("expected key=value, got \"" + std::string(line) + "\"");
      const std::string_view key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
      p.entries.emplace_back(std::string(key), std::string(value));
      if (key == "tbverbs_profile") {
        auto v = number(value);
        if (!v || *v < 1) return bad("tbverbs_profile must be a version number");
        if (*v > format_version)
          return bad("tbverbs_profile=" + std::string(value) + " is newer than this library reads (" +
                     std::to_string(format_version) + "); re-run the probe of this tbverbs version");
      } else if (key == "device") {
        p.device = std::string(value);
      } else if (key == "macos") {
        p.macos = std::string(value);
      } else if (key == "max_message_bytes") {
        auto v = number(value);
        if (!v || *v == 0) return bad("max_message_bytes must be a positive number of bytes");
        p.max_message_bytes = static_cast<std::size_t>(*v);
      } else if (key == "empty_rq") {
        if (value == "wait") p.empty_rq = EmptyRqBehaviour::wait;
        else if (value == "drop") p.empty_rq = EmptyRqBehaviour::drop;
        else if (value == "kill") p.empty_rq = EmptyRqBehaviour::kill;
        else if (value == "unknown" || value == "untested") p.empty_rq = EmptyRqBehaviour::unknown;
        else return bad("empty_rq must be wait, drop, kill or unknown");
      } else if (key == "completion_channels") {
        if (value == "true") p.completion_channels = true;
        else if (value == "false") p.completion_channels = false;
        else if (value != "untested") return bad("completion_channels must be true, false or untested");
      } else if (key == "max_mr_bytes") {
        auto v = number(value);
        if (!v) return bad("max_mr_bytes must be a number");
        p.max_mr_bytes = *v;
      } else if (key == "max_mrs" || key == "max_qps") {
        auto v = number(value);
        if (!v || *v > 1000000) return bad(std::string(key) + " must be a count");
        (key == "max_mrs" ? p.max_mrs : p.max_qps) = static_cast<int>(*v);
      }
    }
    return p;
  }

  /// Reads and parses the file at `path`. Errors: `invalid_argument` at Step::configure with the
  /// errno of a file that cannot be read (ENOENT, EACCES), or parse()'s.
  [[nodiscard]] static Result<MeasuredProfile> load(const std::string& path) {
    errno = 0;
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) {
      Error e = Error::from_errno(Step::configure);
      e.kind = ErrorKind::invalid_argument;
      return fail(e.with_detail("cannot read the measured profile " + path + " (TBVERBS_PROFILE)"));
    }
    std::string text;
    char buf[4096];
    std::size_t got = 0;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (1u << 20)) text.append(buf, got);
    std::fclose(f);
    return parse(text, path);
  }

  /// The text of a profile file: a comment line, then `key=value` lines parse() reads back.
  std::string format(std::string_view comment = {}) const {
    std::string s;
    if (!comment.empty()) s += "# " + std::string(comment) + "\n";
    s += "# measured by tbverbs-probe; load with TBVERBS_PROFILE=<this file>\n";
    s += "tbverbs_profile=" + std::to_string(format_version) + "\n";
    if (!device.empty()) s += "device=" + device + "\n";
    if (!macos.empty()) s += "macos=" + macos + "\n";
    if (max_message_bytes) s += "max_message_bytes=" + std::to_string(*max_message_bytes) + "\n";
    s += "empty_rq=" + std::string(empty_rq_name(empty_rq)) + "\n";
    s += "completion_channels=" + std::string(!completion_channels ? "untested" : *completion_channels ? "true" : "false") + "\n";
    if (max_mr_bytes) s += "max_mr_bytes=" + std::to_string(*max_mr_bytes) + "\n";
    if (max_mrs) s += "max_mrs=" + std::to_string(*max_mrs) + "\n";
    if (max_qps) s += "max_qps=" + std::to_string(*max_qps) + "\n";
    for (const auto& [k, v] : entries)
      if (!known(k)) s += k + "=" + v + "\n";
    return s;
  }

private:
  static std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
  }
  static std::optional<std::uint64_t> number(std::string_view s) noexcept { return detail::parse_decimal(s); }
  static bool known(std::string_view k) noexcept {
    for (std::string_view n : {"tbverbs_profile", "device", "macos", "max_message_bytes", "empty_rq",
                               "completion_channels", "max_mr_bytes", "max_mrs", "max_qps"})
      if (k == n) return true;
    return false;
  }
};

namespace detail {
/// The profile named by TBVERBS_PROFILE, read once per process and per value of the variable.
struct ProfileCache {
  Mutex mutex;
  std::string path;
  bool loaded = false;
  std::optional<Result<MeasuredProfile>> value;
};
inline ProfileCache& profile_cache() {
  static ProfileCache c;
  return c;
}
} // namespace detail

/// The measured profile of this host: the file named by `TBVERBS_PROFILE`, read once (again when
/// the variable changes). Returns an empty profile (every value unmeasured) when the variable is
/// unset or empty. Errors: MeasuredProfile::load()'s, for a set variable naming a missing or
/// malformed file: a profile the operator asked for is never silently ignored. Thread-safe.
[[nodiscard]] inline Result<MeasuredProfile> measured_profile() {
  const char* env = std::getenv("TBVERBS_PROFILE");
  const std::string path = env != nullptr ? env : "";
  if (path.empty()) return MeasuredProfile{};
  auto& c = detail::profile_cache();
  detail::Lock lock(c.mutex);
  if (!c.loaded || c.path != path) {
    c.value.emplace(MeasuredProfile::load(path));
    c.path = path;
    c.loaded = true;
  }
  return *c.value;
}

/// How a backend's completion queues should wait on `platform`, given what was measured: on
/// Apple, CqWait::automatic polls (TN3205: "the caller must poll"; no public consumer uses
/// channels), unless the profile says channels were created and woken by a completion, then
/// CqWait::channel. Elsewhere, and when the profile cannot be read, CqWait::automatic.
inline CqWait measured_cq_wait(Platform platform) {
  if (platform != Platform::apple) return CqWait::automatic;
  auto p = measured_profile();
  return p && p->completion_channels.value_or(false) ? CqWait::channel : CqWait::automatic;
}

/// What a send meeting an empty receive queue does on this host, as measured (unknown when not
/// measured or when the profile cannot be read). A backend that relies on one reading (posting
/// sends without a receives-posted handshake, as JACCL does) can check for `wait` here first.
inline EmptyRqBehaviour measured_empty_rq() {
  auto p = measured_profile();
  return p ? p->empty_rq : EmptyRqBehaviour::unknown;
}

TBVERBS_NAMESPACE_END

/// @file notice.hpp
/// One-time notices: the library was asked for something the provider does not give, took a
/// fallback that works, and says so once per process (not once per object: a ring of 8 links
/// would otherwise print 8 identical lines).
///
/// Why a hook and not only a record: the record (e.g. CompletionQueue::channel_note()) is there
/// for code that wants to check, but nobody checks what they do not know about, so the default
/// handler also prints one line to stderr. A program that owns its output installs its own
/// handler (a logger) or `nullptr` to stay silent.
#pragma once

#include "config.hpp"
#include "detail/atomic.hpp"
#include "error.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// What a one-time notice is about.
enum class Notice : std::uint8_t {
  /// A completion channel was wanted (CqWait::channel, or the default on rdma-core) but could
  /// not be created or armed (on Apple's driver: EOPNOTSUPP): completion waits poll instead.
  completion_channel_fallback = 0,
  /// Memory registered with Communicator::register_memory was unmapped and mapped again while
  /// its handle lived: the old registration still holds the old pages, so collectives on the new
  /// memory there are staged (copied) instead (collective/registration_cache.hpp).
  stale_registration = 1,
  /// Memory::registered cannot prove that a buffer is still the memory it registered (the page
  /// frames are not readable: no CAP_SYS_ADMIN on Linux, or macOS), so every buffer is
  /// registered for one call and deregistered after it instead of being kept.
  registration_per_call = 2,
  /// A side channel whose job token was not made from a job secret (job_secret.hpp): any process
  /// that can reach the coordinator's port can compute the token, join the rendezvous or abort
  /// the job.
  no_job_secret = 3,
};

/// The number of Notice values.
inline constexpr std::size_t notice_count = 4;

/// The fallback a notice announces, in words ("completion waits poll instead of sleeping on a
/// channel").
constexpr std::string_view notice_fallback(Notice n) noexcept {
  switch (n) {
  case Notice::completion_channel_fallback:
    return "completion waits poll instead of sleeping on a completion channel";
  case Notice::stale_registration:
    return "collectives on memory at that address are staged (copied) until its MemoryRegistration goes: register the new buffer";
  case Notice::no_job_secret:
    return "its side channel accepts any process that can reach that port: give every rank the same "
           "TBVERBS_JOB_SECRET (the --local launchers and tbverbs-emu run make one)";
  case Notice::registration_per_call:
    return "Memory::registered registers each buffer for one call (the page frames that would prove a kept registration "
           "still fits its memory are not readable here)";
  }
  return "a fallback was taken";
}

/// Receives a notice: which one, and the error that caused the fallback (errno as the verb
/// returned it, device, diagnosis). Called at most once per Notice per process, from the thread
/// that hit the fallback; must not throw.
using NoticeHandler = void (*)(Notice notice, const Error& cause);

/// The default handler: one line on stderr, "tbverbs: note: <what failed>; <fallback> (printed
/// once per process)".
inline void print_notice(Notice notice, const Error& cause) {
  const std::string m = cause.message();
  const std::string_view first(m.data(), m.find('\n') == std::string::npos ? m.size() : m.find('\n'));
  const std::string_view fb = notice_fallback(notice);
  std::fprintf(stderr, "tbverbs: note: %.*s; %.*s (printed once per process)\n", static_cast<int>(first.size()),
               first.data(), static_cast<int>(fb.size()), fb.data());
}

namespace detail {
/// The process-wide notice state: the handler and which notices were already given.
struct NoticeState {
  Atomic<NoticeHandler> handler{&print_notice};
  Atomic<bool> given[notice_count] = {};
};
/// The one NoticeState of the process.
inline NoticeState& notice_state() noexcept {
  static NoticeState s;
  return s;
}

/// Gives `notice` unless it was given before in this process. Never throws.
inline void notice_once(Notice notice, const Error& cause) noexcept {
  auto& s = notice_state();
  const auto i = static_cast<std::size_t>(notice);
  if (i >= notice_count || s.given[i].exchange(true, Order::relaxed)) return;
  if (NoticeHandler h = s.handler.load(Order::acquire)) {
    try {
      h(notice, cause);
    } catch (...) { // a handler must not throw; if it does, the fallback still stands
    }
  }
}
} // namespace detail

/// Installs `handler` for every later notice and returns the previous one; `nullptr` silences
/// notices. Thread-safe. The default is print_notice (one stderr line per notice per process).
inline NoticeHandler set_notice_handler(NoticeHandler handler) noexcept {
  return detail::notice_state().handler.exchange(handler, detail::Order::acq_rel);
}

/// True when `notice` was already given in this process (tests, and programs that report it).
inline bool notice_given(Notice notice) noexcept {
  const auto i = static_cast<std::size_t>(notice);
  return i < notice_count && detail::notice_state().given[i].load(detail::Order::relaxed);
}

/// Forgets that notices were given, so the next fallback notifies again. For tests.
inline void reset_notices() noexcept {
  for (auto& g : detail::notice_state().given) g.store(false, detail::Order::relaxed);
}

TBVERBS_NAMESPACE_END

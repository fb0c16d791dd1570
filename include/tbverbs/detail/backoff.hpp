/// @file backoff.hpp
/// The one pause between polls of a completion wait that has no channel to sleep on (always on
/// Apple's driver, TN3205: "all queue pair operations are non-blocking and the caller must
/// poll"): a bounded spin, then `sched_yield`, then short sleeps growing to about 1 ms, never
/// past the caller's deadline. CompletionQueue::wait and wait_any (link.hpp) both use it, so the
/// two cannot drift apart.
#pragma once

#include "../config.hpp"
#include "chrono.hpp"

#include <sched.h>
#include <time.h>

#include <cerrno>
#include <cstdint>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// Pacing of a polling wait. Make one per wait; call `pause()` after every poll that found
/// nothing and `reset()` after one that found something.
///
/// Phases: `spin_polls` polls back to back (a completion a few microseconds away costs no system
/// call; the clock is read only every `clock_every` of them), then `yield_polls` polls each after
/// a `sched_yield` (other ranks may share the core: the emulator runs every rank on one host),
/// then sleeps of an eighth of the time waited so far (next_sleep(): `first_sleep` at least,
/// `max_sleep` at most). A completion is so noticed at most about 12% of the wait late, plus the
/// system's timer lateness, whatever the wait; sleeps that doubled overslept a 500 us wait by up
/// to 300 us on a machine whose timers wake 70 us late. A sleep is cut to what is left before the
/// deadline, so a wait never oversleeps it. Not thread-safe; allocates nothing.
class PollBackoff {
public:
  using clock = std::chrono::steady_clock;
  /// Back-to-back polls before the first yield.
  static constexpr std::uint32_t spin_polls = 1024;
  /// During the spin, the clock is read once per this many polls.
  static constexpr std::uint32_t clock_every = 64;
  /// Polls preceded by a sched_yield before the first sleep.
  static constexpr std::uint32_t yield_polls = 64;
  /// The first sleep.
  static constexpr std::chrono::microseconds first_sleep{16};
  /// The longest sleep: a completion is noticed at most about this late.
  static constexpr std::chrono::microseconds max_sleep{1000};
  /// A sleep is at most the time waited divided by this.
  static constexpr int waited_per_sleep = 8;

  /// The sleep after `waited` without a completion: waited / waited_per_sleep, within
  /// [first_sleep, max_sleep].
  static constexpr std::chrono::microseconds next_sleep(std::chrono::microseconds waited) noexcept {
    const auto s = waited / waited_per_sleep;
    return s < first_sleep ? first_sleep : s > max_sleep ? max_sleep : s;
  }

  /// A backoff for a wait that ends at `deadline`.
  explicit PollBackoff(clock::time_point deadline) noexcept : deadline_(deadline) {}

  /// Pauses after an empty poll. Returns false, without pausing, once the deadline has passed
  /// (the caller then polls one last time or reports its timeout); true after the pause.
  bool pause() noexcept {
    const std::uint32_t n = polls_;
    if (polls_ < spin_polls + yield_polls) ++polls_; // stays in the sleep phase, never wraps
    if (n < spin_polls) {
      if ((n % clock_every) != clock_every - 1) return true;
      const auto now = clock::now();
      if (n == clock_every - 1) since_ = now; // the wait's start, to within clock_every polls
      return now < deadline_;
    }
    const auto now = clock::now();
    if (now >= deadline_) return false;
    if (n < spin_polls + yield_polls) {
      ::sched_yield();
      return true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - now);
    const auto sleep = next_sleep(std::chrono::duration_cast<std::chrono::microseconds>(now - since_));
    sleep_for(left < sleep ? left : sleep);
    return true;
  }

  /// Starts over at the spin phase (after a poll that found completions).
  void reset() noexcept { polls_ = 0; }

  /// The deadline this backoff honours.
  clock::time_point deadline() const noexcept { return deadline_; }

private:
  // nanosleep, not std::this_thread::sleep_for: <thread> costs the data-path header more compile
  // time than everything else in it. EINTR resumes with what is left.
  static void sleep_for(std::chrono::microseconds d) noexcept {
    if (d.count() <= 0) return;
    timespec ts{static_cast<time_t>(d.count() / 1000000), static_cast<long>((d.count() % 1000000) * 1000)};
    while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }

  clock::time_point deadline_;
  // The start of the wait, or of the last reset(): what next_sleep() divides. Read at the spin's
  // first clock reading, so reset() after every fruitful poll costs no clock read.
  clock::time_point since_;
  std::uint32_t polls_ = 0;
};

} // namespace detail
TBVERBS_NAMESPACE_END

/// @file mutex.hpp
/// The lock of the core headers' process-wide state (the loaded function tables, the measured
/// profile): a POSIX mutex, statically initialised.
///
/// Why not std::mutex: `<mutex>` costs the umbrella header about 0.01-0.02 s of compile time and
/// these locks guard rare, cold operations (a library load, a profile read), where a pthread mutex
/// does the same job. The side channel, which also starts threads, keeps
/// std::mutex.
#pragma once

#include "../config.hpp"

#include <pthread.h>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// A mutex for process-lifetime state (a function-local static). Never destroyed on purpose:
/// state it guards may be used from other statics' destructors at exit.
class Mutex {
public:
  Mutex() noexcept = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  ~Mutex() = default;
  // pthread_mutex_lock fails only for an uninitialised or error-checking mutex; this one is
  // neither, so the result carries nothing to report.
  void lock() noexcept { (void)::pthread_mutex_lock(&m_); }
  void unlock() noexcept { (void)::pthread_mutex_unlock(&m_); }

private:
  pthread_mutex_t m_ = PTHREAD_MUTEX_INITIALIZER;
};

/// Holds a Mutex for its scope.
class Lock {
public:
  explicit Lock(Mutex& m) noexcept : m_(m) { m_.lock(); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;
  ~Lock() { m_.unlock(); }

private:
  Mutex& m_;
};

} // namespace detail
TBVERBS_NAMESPACE_END

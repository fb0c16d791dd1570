/// @file atomic.hpp
/// The one atomic word the handles and notices need (reference counts, resource counters,
/// one-time flags, the notice handler), without `<atomic>`.
///
/// Why not std::atomic: in C++20, libstdc++'s `<atomic>` brings in the wait/notify machinery
/// (`<bits/atomic_wait.h>`: the thread sleep functions and the clocks), about 0.05 s of the
/// data-path header's 0.3 s compile budget. With GCC and Clang, every
/// compiler this library is built with, Atomic is made of the compiler's `__atomic` builtins,
/// which are what std::atomic itself is made of in libstdc++ and libc++; any other compiler gets
/// std::atomic underneath. The operations and memory orders are std::atomic's.
#pragma once

#include "../config.hpp"

#include <type_traits>

#if !(defined(__GNUC__) || defined(__clang__))
#include <atomic>
#endif

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// The memory orders of std::memory_order that the library uses.
enum class Order { relaxed, acquire, release, acq_rel, seq_cst };

/// An atomic integer, bool, enum or pointer (function pointers included), lock-free where
/// std::atomic of it is. Not copyable or movable, like std::atomic.
template <class T> class Atomic {
  static_assert(std::is_integral_v<T> || std::is_enum_v<T> || std::is_pointer_v<T>,
                "detail::Atomic holds one integer, bool, enum or pointer");

public:
  constexpr Atomic() noexcept = default;
  /// Starts at `v` (not an atomic operation, as std::atomic's constructor).
  constexpr Atomic(T v) noexcept : v_(v) {} // NOLINT: converts, as std::atomic<T> does
  Atomic(const Atomic&) = delete;
  Atomic& operator=(const Atomic&) = delete;
  ~Atomic() = default;

  /// The value, read with order `o` (relaxed, acquire or seq_cst).
  T load(Order o = Order::seq_cst) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_load_n(&v_, builtin(o));
#else
    return v_.load(standard(o));
#endif
  }
  /// Sets `v` with order `o` (relaxed, release or seq_cst).
  void store(T v, Order o = Order::seq_cst) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __atomic_store_n(&v_, v, builtin(o));
#else
    v_.store(v, standard(o));
#endif
  }
  /// Sets `v` and returns the value before.
  T exchange(T v, Order o = Order::seq_cst) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_exchange_n(&v_, v, builtin(o));
#else
    return v_.exchange(v, standard(o));
#endif
  }
  /// Adds `d` (integers only) and returns the value before.
  T fetch_add(T d, Order o = Order::seq_cst) noexcept
    requires std::is_integral_v<T> && (!std::is_same_v<T, bool>)
  {
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_fetch_add(&v_, d, builtin(o));
#else
    return v_.fetch_add(d, standard(o));
#endif
  }
  /// Subtracts `d` (integers only) and returns the value before.
  T fetch_sub(T d, Order o = Order::seq_cst) noexcept
    requires std::is_integral_v<T> && (!std::is_same_v<T, bool>)
  {
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_fetch_sub(&v_, d, builtin(o));
#else
    return v_.fetch_sub(d, standard(o));
#endif
  }

private:
#if defined(__GNUC__) || defined(__clang__)
  static constexpr int builtin(Order o) noexcept {
    switch (o) {
    case Order::relaxed: return __ATOMIC_RELAXED;
    case Order::acquire: return __ATOMIC_ACQUIRE;
    case Order::release: return __ATOMIC_RELEASE;
    case Order::acq_rel: return __ATOMIC_ACQ_REL;
    case Order::seq_cst: break;
    }
    return __ATOMIC_SEQ_CST;
  }
  alignas(sizeof(T)) T v_{}; // as std::atomic<T> aligns it
#else
  static constexpr std::memory_order standard(Order o) noexcept {
    switch (o) {
    case Order::relaxed: return std::memory_order_relaxed;
    case Order::acquire: return std::memory_order_acquire;
    case Order::release: return std::memory_order_release;
    case Order::acq_rel: return std::memory_order_acq_rel;
    case Order::seq_cst: break;
    }
    return std::memory_order_seq_cst;
  }
  std::atomic<T> v_{};
#endif
};

} // namespace detail
TBVERBS_NAMESPACE_END

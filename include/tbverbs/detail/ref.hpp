/// @file ref.hpp
/// Ownership for the handles' internals: an object that counts its own references (RefCounted)
/// and the pointer that holds one (Ref), and sole ownership with a release function (Unique).
///
/// Why not std::shared_ptr and std::unique_ptr: `<memory>` is the largest part of the data-path
/// header's compile time (in C++20 libstdc++'s unique_ptr.h includes `<ostream>`: 0.07 s of the
/// 0.3 s budget), and the handles need only this much: a count of who
/// keeps an object (a verbs object and its parents) alive, atomically, and one delete.
#pragma once

#include "../config.hpp"
#include "atomic.hpp"

#include <cstddef>
#include <type_traits>
#include <utility>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// An object that counts the Refs to it and deletes itself when the last goes. Created with
/// make_ref (the count starts at one, for the Ref it returns). Not copyable.
class RefCounted {
public:
  RefCounted() noexcept = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;

  /// The number of Refs to this object now (a snapshot: other threads may change it).
  long use_count() const noexcept { return refs_.load(Order::acquire); }

protected:
  virtual ~RefCounted() = default;

private:
  template <class> friend class Ref;
  void retain() const noexcept { refs_.fetch_add(1, Order::relaxed); }
  // acq_rel: every write another holder made before letting go happens before the delete.
  void release() const noexcept {
    if (refs_.fetch_sub(1, Order::acq_rel) == 1) delete this;
  }
  mutable Atomic<long> refs_{1};
};

/// One reference to a RefCounted T (or to nothing). Copying adds a reference, destroying or
/// resetting drops one; moving transfers it. A Ref<Derived> converts to a Ref<Base>, so a
/// Ref<RefCounted> can keep any of them alive.
template <class T> class Ref {
public:
  Ref() noexcept = default;
  Ref(std::nullptr_t) noexcept {} // NOLINT: a null pointer converts, as for shared_ptr
  Ref(const Ref& o) noexcept : p_(o.p_) { retain(); }
  Ref(Ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  template <class U>
    requires std::is_convertible_v<U*, T*>
  Ref(const Ref<U>& o) noexcept : p_(o.get()) { // NOLINT: converts like the pointers
    retain();
  }
  template <class U>
    requires std::is_convertible_v<U*, T*>
  Ref(Ref<U>&& o) noexcept : p_(o.release_to_caller()) {} // NOLINT: converts like the pointers
  Ref& operator=(Ref o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~Ref() { reset(); }

  /// Takes over the one reference a new object starts with (make_ref).
  static Ref adopt(T* p) noexcept {
    Ref r;
    r.p_ = p;
    return r;
  }

  T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  friend bool operator==(const Ref& r, std::nullptr_t) noexcept { return r.p_ == nullptr; }

  /// The number of Refs to the object (0 for none).
  long use_count() const noexcept { return p_ != nullptr ? p_->use_count() : 0; }
  /// Drops this reference (the object goes if it was the last).
  void reset() noexcept {
    if (T* p = std::exchange(p_, nullptr)) static_cast<const RefCounted*>(p)->release();
  }
  /// Gives the reference to the caller, who must adopt it (the converting move).
  T* release_to_caller() noexcept { return std::exchange(p_, nullptr); }

private:
  void retain() const noexcept {
    if (p_ != nullptr) static_cast<const RefCounted*>(p_)->retain();
  }
  T* p_ = nullptr;
};

/// A new T(args...) with its first reference.
template <class T, class... Args> Ref<T> make_ref(Args&&... args) {
  return Ref<T>::adopt(new T(std::forward<Args>(args)...));
}

/// Sole ownership of a T* that `Free` (a function object) releases: what std::unique_ptr with a
/// deleter does, for the owners in the core headers (a CQ's kept completions, the device list,
/// an aligned buffer). Move-only; null after a move or reset().
template <class T, class Free> class Unique {
public:
  Unique() noexcept = default;
  explicit Unique(T* p, Free free = Free{}) noexcept : p_(p), free_(free) {}
  Unique(const Unique&) = delete;
  Unique& operator=(const Unique&) = delete;
  Unique(Unique&& o) noexcept : p_(std::exchange(o.p_, nullptr)), free_(o.free_) {}
  Unique& operator=(Unique&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      free_ = o.free_;
    }
    return *this;
  }
  ~Unique() { reset(); }

  T* get() const noexcept { return p_; }
  T& operator[](std::size_t i) const noexcept { return p_[i]; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// Releases what it owns (if anything) and owns `p` instead.
  void reset(T* p = nullptr) noexcept {
    if (T* old = std::exchange(p_, p)) free_(old);
  }

private:
  T* p_ = nullptr;
  Free free_{};
};

/// delete[] as a Free for Unique.
template <class T> struct DeleteArray {
  void operator()(T* p) const noexcept { delete[] p; }
};
/// An owned array of T (new T[n], delete[]).
template <class T> using OwnedArray = Unique<T, DeleteArray<T>>;
/// n default-initialised T (throws std::bad_alloc as new[] does).
template <class T> OwnedArray<T> make_array(std::size_t n) { return OwnedArray<T>(new T[n]); }

} // namespace detail
TBVERBS_NAMESPACE_END

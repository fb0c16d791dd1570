/// @file handle.hpp
/// Shared machinery of the RAII handles: ownership of one verbs object, its destroy function
/// and a reference that keeps its parent alive.
#pragma once

#include "../config.hpp"
#include "../error.hpp"
#include "../loader.hpp"
#include "../result.hpp"

#include <atomic>
#include <cerrno>
#include <memory>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// What every handle made from one context needs to know: the function table, the provider
/// family and the device name (for errors), and resource counts (for the driver's caps).
struct ContextInfo {
  const VerbsApi* api = nullptr;
  Platform platform = Platform::any;
  FixedString<64> device;
  std::atomic<int> memory_regions{0};
  std::atomic<int> queue_pairs{0};
  /// The access rights the driver last accepted for a two-sided registration (-1: none yet), so
  /// ProtectionDomain::reg_mr_two_sided tries the set that worked first (see there).
  std::atomic<int> two_sided_access{-1};

  /// Stamps an error with this context's device and provider family.
  Error& stamp(Error& e, int port = 0, int gid_index = -1) const noexcept {
    return e.on(device.view(), port, gid_index).from(platform);
  }
};

/// A parent reference that also counts one live child in `info`: the count drops when the child's
/// destroy has run, however the child went away (close() or destructor).
template <class... Parents>
std::shared_ptr<void> counted_parent(std::shared_ptr<ContextInfo> info, std::atomic<int> ContextInfo::*counter,
                                     Parents... parents) {
  struct Holder {
    std::shared_ptr<ContextInfo> info;
    std::atomic<int> ContextInfo::*counter;
    std::shared_ptr<void> refs[sizeof...(Parents)];
    ~Holder() { (info.get()->*counter).fetch_sub(1, std::memory_order_relaxed); }
  };
  (info.get()->*counter).fetch_add(1, std::memory_order_relaxed);
  return std::shared_ptr<Holder>(new Holder{info, counter, {std::move(parents)...}});
}

/// Calls the verbs destroy function once, then lets go of the parent. The parent reference
/// lives in the deleter, so a child always dies before its parent, whatever order the caller
/// drops handles in: that is how the teardown order (QP, MR, CQ, PD, context) is enforced.
template <class T> struct Destroyer {
  int (*destroy)(T*) = nullptr;
  std::shared_ptr<void> parent;
  bool released = false;
  void operator()(T* p) const noexcept {
    // A destructor cannot report; close() is there for callers who want the teardown result.
    if (p != nullptr && !released && destroy != nullptr) (void)destroy(p);
  }
};

/// Owns one verbs object. Move-only; shared internally so that children can keep it alive.
template <class T> class Owned {
public:
  Owned() = default;
  Owned(T* p, int (*destroy)(T*), std::shared_ptr<void> parent)
      : ptr_(p, Destroyer<T>{destroy, std::move(parent)}) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&&) noexcept = default;
  Owned& operator=(Owned&&) noexcept = default;
  ~Owned() = default;

  T* get() const noexcept { return ptr_.get(); }
  /// A reference for a child's deleter.
  std::shared_ptr<void> keep_alive() const noexcept { return ptr_; }

  /// Destroys the object now and returns the verb's result. Fails with EBUSY, destroying
  /// nothing, while children made from it are still alive.
  Result<void> close() noexcept {
    if (!ptr_) return {};
    if (ptr_.use_count() > 1)
      return fail(Error::from_return(Step::destroy, EBUSY)
                      .with_detail("objects created from this handle are still alive; close them first"));
    auto* d = std::get_deleter<Destroyer<T>>(ptr_);
    const int rc = d->destroy(ptr_.get());
    if (rc != 0) return fail(Error::from_return(Step::destroy, rc));
    d->released = true;
    ptr_.reset();
    return {};
  }

private:
  std::shared_ptr<T> ptr_;
};

} // namespace detail
TBVERBS_NAMESPACE_END

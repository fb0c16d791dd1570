/// @file handle.hpp
/// Shared machinery of the RAII handles: ownership of one verbs object, its destroy function
/// and a reference that keeps its parent alive (detail/ref.hpp), and the closed stand-ins.
#pragma once

#include "../config.hpp"
#include "../error.hpp"
#include "../result.hpp"
#include "abi.hpp"
#include "atomic.hpp"
#include "ref.hpp"

#include <cerrno>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

struct VerbsApi; // loader.hpp; the data-path headers need only the few functions in ControlOps

/// The control verbs the data-path handles (CompletionQueue, QueuePair) call, copied from the
/// library's table when the context is opened, so that completion_queue.hpp and queue_pair.hpp
/// need not include the loader (dlopen, the table registry): a lean data-path header.
struct ControlOps {
  int (*modify_qp)(abi::ibv_qp* qp, abi::ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*query_qp)(abi::ibv_qp* qp, abi::ibv_qp_attr* attr, int attr_mask, abi::ibv_qp_init_attr* init_attr) = nullptr;
  int (*get_cq_event)(abi::ibv_comp_channel* channel, abi::ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(abi::ibv_cq* cq, unsigned int nevents) = nullptr;
};

/// What every handle made from one context needs to know: the function table, the provider
/// family and the device name (for errors), and resource counts (for the driver's caps). Shared
/// by the context and everything made from it (Ref<ContextInfo>).
struct ContextInfo final : RefCounted {
  const VerbsApi* api = nullptr;
  ControlOps ops;
  Platform platform = Platform::any;
  FixedString<64> device;
  Atomic<int> memory_regions{0};
  Atomic<int> queue_pairs{0};
  /// The access rights the driver last accepted for a two-sided registration (-1: none yet), so
  /// ProtectionDomain::reg_mr_two_sided tries the set that worked first (see there).
  Atomic<int> two_sided_access{-1};

  /// Stamps an error with this context's device and provider family.
  Error& stamp(Error& e, int port = 0, int gid_index = -1) const noexcept {
    return e.on(device.view(), port, gid_index).from(platform);
  }
  /// `ibv_modify_qp`: the one call every state change of a QP makes (prepare's INIT, connect's
  /// RTR and RTS, the RESET of a retry or QueuePair::reset, modify_to_error). Returns the verb's
  /// value, or EBADF without calling it when there is no QP (moved from, closed).
  int modify_qp(abi::ibv_qp* qp, abi::ibv_qp_attr& attr, int mask) const noexcept {
    return qp != nullptr && ops.modify_qp != nullptr ? ops.modify_qp(qp, &attr, mask) : EBADF;
  }
};

/// Inert stand-ins for a closed or moved-from CompletionQueue/QueuePair: their context's ops table
/// refuses every data-path call with EBADF (poll_cq: -EBADF) and touches nothing, so poll/post on a
/// closed handle is an error value, never a null or dangling dereference, and costs the hot path
/// nothing (the cached pointer always points at something valid).
struct ClosedObjects {
  abi::ibv_context ctx{};
  abi::ibv_cq cq{};
  abi::ibv_qp qp{};
  ClosedObjects() noexcept {
    ctx.ops.poll_cq = [](abi::ibv_cq*, int, abi::ibv_wc*) -> int { return -EBADF; };
    ctx.ops.req_notify_cq = [](abi::ibv_cq*, int) -> int { return EBADF; };
    ctx.ops.post_send = [](abi::ibv_qp*, abi::ibv_send_wr* wr, abi::ibv_send_wr** bad) -> int {
      *bad = wr;
      return EBADF;
    };
    ctx.ops.post_recv = [](abi::ibv_qp*, abi::ibv_recv_wr* wr, abi::ibv_recv_wr** bad) -> int {
      *bad = wr;
      return EBADF;
    };
    cq.context = &ctx;
    qp.context = &ctx;
    qp.send_cq = &cq;
    qp.recv_cq = &cq;
  }
};
/// The process's one set of stand-ins (never destroyed, so a handle may be closed at exit).
inline ClosedObjects& closed_objects() noexcept {
  static ClosedObjects* c = new ClosedObjects; // NOLINT: leaked on purpose, like the loaded tables
  return *c;
}
/// The stand-in of type T.
template <class T> T* closed_object() noexcept;
template <> inline abi::ibv_cq* closed_object<abi::ibv_cq>() noexcept { return &closed_objects().cq; }
template <> inline abi::ibv_qp* closed_object<abi::ibv_qp>() noexcept { return &closed_objects().qp; }
/// True when `p` is one of the stand-ins.
template <class T> bool is_closed_object(const T* p) noexcept { return p == closed_object<T>(); }

/// The raw pointer a data-path handle caches (so the hot path reads no Ref): never null,
/// the stand-in after a move or reset(), so moved-from and closed handles stay safe with the rule
/// of zero (the defaulted moves of the handle do the right thing).
template <class T> class HotPtr {
public:
  HotPtr() noexcept : p_(closed_object<T>()) {}
  explicit HotPtr(T* p) noexcept : p_(p != nullptr ? p : closed_object<T>()) {}
  HotPtr(const HotPtr&) = delete;
  HotPtr& operator=(const HotPtr&) = delete;
  HotPtr(HotPtr&& o) noexcept : p_(o.p_) { o.p_ = closed_object<T>(); }
  HotPtr& operator=(HotPtr&& o) noexcept {
    if (this != &o) {
      p_ = o.p_;
      o.p_ = closed_object<T>();
    }
    return *this;
  }
  ~HotPtr() = default;
  T* operator->() const noexcept { return p_; }
  T* get() const noexcept { return p_; }
  /// Points at the stand-in again (after close()).
  void reset() noexcept { p_ = closed_object<T>(); }
  /// True while it points at a live object.
  bool live() const noexcept { return !is_closed_object(p_); }

private:
  T* p_;
};

/// A plain pointer member that becomes null when its owner is moved from.
template <class T> class NullOnMove {
public:
  NullOnMove() = default;
  NullOnMove(T* p) noexcept : p_(p) {} // NOLINT: a pointer member
  NullOnMove(const NullOnMove&) = delete;
  NullOnMove& operator=(const NullOnMove&) = delete;
  NullOnMove(NullOnMove&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  NullOnMove& operator=(NullOnMove&& o) noexcept {
    if (this != &o) {
      p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  NullOnMove& operator=(T* p) noexcept {
    p_ = p;
    return *this;
  }
  ~NullOnMove() = default;
  operator T*() const noexcept { return p_; } // NOLINT: reads like the pointer it is
  T* operator->() const noexcept { return p_; }

private:
  T* p_ = nullptr;
};

/// A parent reference that also counts one live child in `info`: the count drops when the child's
/// destroy has run, however the child went away (close() or destructor).
template <class... Parents>
Ref<RefCounted> counted_parent(Ref<ContextInfo> info, Atomic<int> ContextInfo::*counter, Parents... parents) {
  struct Holder final : RefCounted {
    Ref<ContextInfo> info;
    Atomic<int> ContextInfo::*counter;
    Ref<RefCounted> refs[sizeof...(Parents)];
    Holder(Ref<ContextInfo> i, Atomic<int> ContextInfo::*c, Parents... p) noexcept
        : info(std::move(i)), counter(c), refs{std::move(p)...} {
      (info.get()->*counter).fetch_add(1, Order::relaxed);
    }
    ~Holder() override { (info.get()->*counter).fetch_sub(1, Order::relaxed); }
  };
  return make_ref<Holder>(std::move(info), counter, std::move(parents)...);
}

/// One verbs object, its destroy function and the reference to its parent. The destroy runs
/// once, when the last reference goes, and the parent is let go after it (a member outlives the
/// destructor's body), so a child always dies before its parent, whatever order the caller drops
/// handles in: that is how the teardown order (QP, MR, CQ, PD, context) is enforced.
template <class T> struct OwnedNode final : RefCounted {
  T* object;
  int (*destroy)(T*);
  Ref<RefCounted> parent;
  bool released = false; // close() destroyed it already
  OwnedNode(T* p, int (*d)(T*), Ref<RefCounted> up) noexcept : object(p), destroy(d), parent(std::move(up)) {}
  ~OwnedNode() override {
    // A destructor cannot report; close() is there for callers who want the teardown result.
    if (!released && destroy != nullptr) (void)destroy(object);
  }
};

/// A raw verbs pointer and the reference that keeps its object alive (what shared_ptr's aliasing
/// constructor gives): how a GID table holds its context.
template <class T> struct Kept {
  T* ptr = nullptr;
  Ref<RefCounted> keep;
  T* get() const noexcept { return ptr; }
  friend bool operator==(const Kept& k, std::nullptr_t) noexcept { return k.ptr == nullptr; }
};

/// Owns one verbs object. Move-only; shared internally so that children can keep it alive.
template <class T> class Owned {
public:
  Owned() = default;
  /// Owns `p` (nothing when null), destroyed with `destroy`; `parent` is kept until then. If the
  /// node cannot be allocated, `p` is destroyed before std::bad_alloc propagates (as
  /// std::shared_ptr's constructor does), so the verbs object never leaks.
  Owned(T* p, int (*destroy)(T*), Ref<RefCounted> parent) {
    if (p == nullptr) return;
    try {
      node_ = make_ref<OwnedNode<T>>(p, destroy, std::move(parent));
    } catch (...) {
      if (destroy != nullptr) (void)destroy(p);
      throw;
    }
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&&) noexcept = default;
  Owned& operator=(Owned&&) noexcept = default;
  ~Owned() = default;

  T* get() const noexcept { return node_ ? node_->object : nullptr; }
  /// A reference for a child's deleter.
  Ref<RefCounted> keep_alive() const noexcept { return node_; }
  /// The object with a reference that keeps it alive.
  Kept<T> kept() const noexcept { return {get(), keep_alive()}; }

  /// Destroys the object now and returns the verb's result. Fails with EBUSY, destroying
  /// nothing, while children made from it are still alive.
  Result<void> close() noexcept {
    if (!node_) return {};
    if (node_.use_count() > 1)
      return fail(Error::from_return(Step::destroy, EBUSY)
                      .with_detail("objects created from this handle are still alive; close them first"));
    const int rc = node_->destroy != nullptr ? node_->destroy(node_->object) : 0;
    if (rc != 0) return fail(Error::from_return(Step::destroy, rc));
    node_->released = true;
    node_.reset();
    return {};
  }

private:
  Ref<OwnedNode<T>> node_;
};

} // namespace detail
TBVERBS_NAMESPACE_END

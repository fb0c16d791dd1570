/// @file context.hpp
/// An opened device (`ibv_open_device`): port and device queries, the GID table, and the
/// factories of protection domains and completion queues.
#pragma once

#include "async_event.hpp"
#include "completion_queue.hpp"
#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/handle.hpp"
#include "device.hpp"
#include "error.hpp"
#include "gid.hpp"
#include "loader.hpp"
#include "protection_domain.hpp"
#include "result.hpp"
#include "types.hpp"

#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// An opened verbs device. Move-only, never null; closed on destruction after every object made
/// from it (children keep it alive, so teardown order is always right).
///
/// Threads: the queries and factories (query_*, gid_table, alloc_pd, create_cq) may be called
/// from several threads at once (rdma-core's verbs are thread-safe; the shared counters are
/// atomic). close() and moves must not race with any other call.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto ctx
/// \until ctx.error()
/// \skip ctx->alloc_pd
/// \until pd.error()
/// \skip ctx->create_cq
/// \until cq.error()
class Context {
public:
  /// Opens the device called `name`; an empty name means the `TBVERBS_DEVICE` environment
  /// variable, else the first device. Errors: `no_device` (with the library's errno and the
  /// diagnosis), `device_not_found` (listing the devices that exist), or open_device's errno.
  /// Nothing else (PD, MR) is touched when the name is wrong.
  [[nodiscard]] static Result<Context> open(const Library& lib, std::string_view name = {}) {
    auto list = DeviceList::get(lib);
    if (!list) return fail(list.error());
    std::string wanted(name);
    if (wanted.empty())
      if (const char* env = std::getenv("TBVERBS_DEVICE"); env != nullptr) wanted = env;
    Result<Device> dev = wanted.empty() ? Result<Device>(list->devices().front()) : list->find(wanted);
    if (!dev) return fail(dev.error());
    return open(lib, *dev);
  }

  /// Opens one device of a DeviceList.
  [[nodiscard]] static Result<Context> open(const Library& lib, const Device& device) {
    const detail::VerbsApi& api = lib.api();
    auto info = detail::make_ref<detail::ContextInfo>();
    info->api = &api;
    info->ops = {api.modify_qp, api.query_qp, api.get_cq_event, api.ack_cq_events};
    info->device.assign(device.name());
    info->platform = device.platform();
    errno = 0;
    abi::ibv_context* ctx = api.open_device(device.native_handle());
    if (ctx == nullptr) {
      Error e = Error::from_errno(Step::open_device);
      return fail(info->stamp(e));
    }
    return Context(detail::Owned<abi::ibv_context>(ctx, api.close_device, nullptr), std::move(info));
  }

  /// The device name.
  std::string_view name() const noexcept { return info_->device.view(); }
  /// The provider family (selects the diagnoses' remedies).
  Platform platform() const noexcept { return info_->platform; }

  /// Device limits. Errors: query_device's return value.
  [[nodiscard]] Result<DeviceAttributes> query_device() const {
    abi::ibv_device_attr a{};
    if (const int rc = info_->api->query_device(ctx_.get(), &a); rc != 0) {
      Error e = Error::from_return(Step::query_device, rc);
      return fail(info_->stamp(e));
    }
    DeviceAttributes d;
    d.max_qp = a.max_qp;
    d.max_qp_wr = a.max_qp_wr;
    d.max_sge = a.max_sge;
    d.max_cq = a.max_cq;
    d.max_cqe = a.max_cqe;
    d.max_mr = a.max_mr;
    d.max_mr_size = a.max_mr_size;
    d.phys_port_cnt = a.phys_port_cnt;
    return d;
  }

  /// Waits until `deadline` for the device's next asynchronous event (ibv_get_async_event): a
  /// port going down (`AsyncEventType::port_error`, with port()) or up, a QP or CQ error, the
  /// device lost. The event is acknowledged before it is returned. Events queue in the driver
  /// from the moment the device is open, so one that happened before the call is returned at
  /// once. A deadline already past still takes a pending event. The first call makes the
  /// context's async fd non-blocking (rdma-core's documented way to poll it) and the wait polls
  /// it in slices of at most 10 ms, so a driver whose fd is never signalled (the emulator's) is
  /// still heard. Safe from one thread at a time per context, beside any other call.
  /// Errors: `timeout` when no event came; `unsupported` when the library exports no
  /// ibv_get_async_event / ibv_ack_async_event (docs/core-api.md, "Asynchronous events");
  /// otherwise the verb's errno.
  [[nodiscard]] Result<AsyncEvent> wait_async_event(std::chrono::steady_clock::time_point deadline) const {
    if (ctx_.get() == nullptr || info_ == nullptr)
      return fail(Error::from_errno(Step::get_async_event, EBADF).with_detail("a moved-from or closed Context"));
    const detail::VerbsApi& api = *info_->api;
    if (api.get_async_event == nullptr) {
      Error e = Error::make(Step::get_async_event, ErrorKind::unsupported,
                            std::string("the verbs library (") + api.origin +
                                ") exports no ibv_get_async_event and ibv_ack_async_event: this device's "
                                "asynchronous events cannot be read; a dead port shows as a timeout");
      return fail(info_->stamp(e));
    }
    const int fd = ctx_.get()->async_fd;
    if (const int flags = ::fcntl(fd, F_GETFL); flags >= 0 && (flags & O_NONBLOCK) == 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    for (;;) {
      abi::ibv_async_event raw;
      std::memset(&raw, 0, sizeof raw);
      errno = 0;
      if (api.get_async_event(ctx_.get(), &raw) == 0) {
        const AsyncEvent ev = AsyncEvent::from_native(raw, info_->device.view());
        api.ack_async_event(&raw);
        return ev;
      }
      const int err = errno;
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        Error e = Error::from_errno(Step::get_async_event, err);
        return fail(info_->stamp(e));
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        Error e = Error::make(Step::get_async_event, ErrorKind::timeout, "no asynchronous event before the deadline");
        return fail(info_->stamp(e));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(left < 10 ? left : 10)); // EINTR or a timeout: look again
    }
  }
  /// wait_async_event for at most `timeout` from now.
  template <class Rep, class Period>
  [[nodiscard]] Result<AsyncEvent> wait_async_event(std::chrono::duration<Rep, Period> timeout) const {
    return wait_async_event(std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
  }

  /// One port's attributes. Errors: query_port's return value.
  [[nodiscard]] Result<PortAttributes> query_port(std::uint8_t port = 1) const {
    abi::ibv_port_attr a;
    std::memset(&a, 0, sizeof a); // the exported symbol fills only the fields it knows
    if (const int rc = info_->api->query_port(ctx_.get(), port, &a); rc != 0) {
      Error e = Error::from_return(Step::query_port, rc);
      return fail(info_->stamp(e, port));
    }
    PortAttributes p;
    p.port = port;
    p.state = static_cast<PortState>(a.state);
    p.max_mtu = static_cast<Mtu>(a.max_mtu);
    p.active_mtu = static_cast<Mtu>(a.active_mtu);
    p.gid_table_length = a.gid_tbl_len;
    p.lid = a.lid;
    p.link_layer = static_cast<LinkLayer>(a.link_layer);
    p.max_msg_sz = a.max_msg_sz;
    return p;
  }

  /// The port's state must be active; `port_not_active` (with the state's name) otherwise.
  [[nodiscard]] Result<PortAttributes> require_active_port(std::uint8_t port = 1) const {
    auto p = query_port(port);
    if (!p) return p;
    if (p->state != PortState::active && p->state != PortState::active_defer) {
      Error e = Error::make(Step::query_port, ErrorKind::port_not_active,
                            std::string("state ") + std::string(port_state_name(p->state)));
      return fail(info_->stamp(e, port));
    }
    return p;
  }

  /// A fresh snapshot of the port's whole GID table. Never cache it across connects: addresses
  /// change (APIPA renegotiation) and entries move.
  [[nodiscard]] Result<GidTable> gid_table(std::uint8_t port = 1) const {
    auto p = query_port(port);
    if (!p) return fail(p.error());
    return GidTable::read(*info_->api, ctx_.kept(), port, p->gid_table_length, info_->platform,
                          info_->device.view());
  }

  /// Allocates a protection domain. When the driver refuses without saying why (Apple's does
  /// so on a port that is down), the port is queried so the error can say so.
  ///
  /// Errors: ibv_alloc_pd's errno at Step::alloc_pd: on Apple a NULL with no errno and a port
  /// that is not active (the detail names its state; diagnosis "alloc-pd-port-down"); ENOMEM
  /// when the device's PD budget or memory is exhausted.
  [[nodiscard]] Result<ProtectionDomain> alloc_pd() const {
    const detail::VerbsApi& api = *info_->api;
    errno = 0;
    abi::ibv_pd* pd = api.alloc_pd(ctx_.get());
    if (pd == nullptr) {
      Error e = Error::from_errno(Step::alloc_pd);
      info_->stamp(e);
      if (auto port = query_port(1); port && port->state != PortState::active)
        e.with_detail("port 1 is " + std::string(port_state_name(port->state)));
      return fail(e);
    }
    return ProtectionDomain(detail::Owned<abi::ibv_pd>(pd, api.dealloc_pd, ctx_.keep_alive()), info_);
  }

  /// Creates a completion queue with room for at least `options.entries` completions. Size it for
  /// every outstanding signalled send plus every posted receive: an overrun loses completions.
  ///
  /// `options.wait` says how CompletionQueue::wait waits. CqWait::automatic (the default) makes
  /// no channel on Apple (TN3205: "the caller must poll"; no Apple consumer uses channels) and one
  /// elsewhere. Where a channel is wanted, it is created and armed once here; if either fails
  /// (any errno, e.g. EOPNOTSUPP), or the library has no channel functions, or ibv_create_cq
  /// refuses the channel, the CQ is made without one and polls: the cause is kept as
  /// `channel_note()` and given once per process as Notice::completion_channel_fallback.
  ///
  /// The CQ also allocates, once, room for `capacity()` completions, so a poll that meets a failed
  /// completion can keep the ones after it (CompletionQueue::poll loses nothing): 48 bytes per
  /// entry.
  ///
  /// Errors (never a channel's):
  /// - `capacity` at Step::create_cq when `entries` is above the device's max_cqe (it used to be
  ///   clamped silently, and a CQ smaller than asked overruns), or not positive;
  /// - `invalid_argument` when `comp_vector` is negative or not below the context's
  ///   num_comp_vectors;
  /// - ibv_create_cq's errno, with the entries asked for: ENOMEM (on rdma-core usually
  ///   RLIMIT_MEMLOCK), EINVAL (cqe above max_cqe on a device that reports none).
  [[nodiscard]] Result<CompletionQueue> create_cq(const CqOptions& options) const {
    const detail::VerbsApi& api = *info_->api;
    const int entries = options.entries;
    if (entries <= 0) {
      Error e = Error::make(Step::create_cq, ErrorKind::capacity, "a CQ needs at least one entry");
      return fail(info_->stamp(e));
    }
    if (auto dev = query_device(); dev && dev->max_cqe > 0 && entries > dev->max_cqe) {
      Error e = Error::make(Step::create_cq, ErrorKind::capacity);
      e.detail.appendf("%d entries asked, the device's max_cqe is %d", entries, dev->max_cqe);
      return fail(info_->stamp(e));
    }
    const int vectors = ctx_.get()->num_comp_vectors;
    if (options.comp_vector < 0 || (options.comp_vector > 0 && options.comp_vector >= vectors)) {
      Error e = Error::make(Step::create_cq, ErrorKind::invalid_argument);
      e.detail.appendf("comp_vector %d, the context has %d", options.comp_vector, vectors);
      return fail(info_->stamp(e));
    }
    const CqWait wait = options.wait;
    const bool want = wait == CqWait::channel || (wait == CqWait::automatic && info_->platform != Platform::apple);
    std::optional<Error> note;
    detail::Owned<abi::ibv_comp_channel> channel;
    if (want && api.create_comp_channel == nullptr) {
      Error e = Error::make(Step::create_comp_channel, ErrorKind::unsupported,
                            "the verbs library " + api.origin + " has no completion-channel functions");
      note = info_->stamp(e);
    } else if (want) {
      errno = 0;
      if (abi::ibv_comp_channel* ch = api.create_comp_channel(ctx_.get()); ch != nullptr) {
        channel = detail::Owned<abi::ibv_comp_channel>(ch, api.destroy_comp_channel, ctx_.keep_alive());
      } else {
        Error e = Error::from_errno(Step::create_comp_channel);
        note = info_->stamp(e);
      }
    }
    errno = 0;
    abi::ibv_cq* cq = api.create_cq(ctx_.get(), entries, nullptr, channel.get(), options.comp_vector);
    if (cq == nullptr && channel.get() != nullptr) {
      // A provider that makes channels but will not attach one to a CQ: keep the CQ, lose the channel.
      Error e = Error::from_errno(Step::create_cq);
      note = info_->stamp(e).with_detail("with a completion channel; " + std::to_string(entries) + " entries");
      channel = {};
      errno = 0;
      cq = api.create_cq(ctx_.get(), entries, nullptr, nullptr, options.comp_vector);
    }
    if (cq == nullptr) {
      Error e = Error::from_errno(Step::create_cq);
      return fail(info_->stamp(e).with_detail(std::to_string(entries) + " entries"));
    }
    auto parent = channel.get() != nullptr ? channel.keep_alive() : ctx_.keep_alive();
    const bool has_channel = channel.get() != nullptr;
    detail::Owned<abi::ibv_cq> owned(cq, api.destroy_cq, std::move(parent));
    const int keep = (cq->cqe > entries ? cq->cqe : entries) + 1;
    auto kept = detail::make_array<abi::ibv_wc>(static_cast<std::size_t>(keep));
    CompletionQueue result(std::move(channel), std::move(owned), info_, std::move(kept), keep);
    if (note) {
      result.fall_back_to_polling(*note);
    } else if (has_channel) {
      // Arm now, so a driver that makes channels but cannot arm them is found here, once, and
      // not in the middle of the first wait. An event this raises is consumed by a later wait.
      if (auto armed = result.arm(); !armed) result.fall_back_to_polling(armed.error());
    }
    return result;
  }

  /// create_cq with `entries` and `wait` (see create_cq(const CqOptions&) for the errors).
  [[nodiscard]] Result<CompletionQueue> create_cq(int entries, CqWait wait = CqWait::automatic) const {
    return create_cq(CqOptions{entries, wait, 0});
  }

  /// Creates a completion queue: `with_channel` true is CqWait::channel (a channel even on
  /// Apple, polling if it cannot be made), false is CqWait::poll. Kept for existing callers.
  [[nodiscard]] Result<CompletionQueue> create_cq(int entries, bool with_channel) const {
    return create_cq(entries, with_channel ? CqWait::channel : CqWait::poll);
  }

  /// Closes the device now and returns the verb's result (EBUSY while children are alive).
  [[nodiscard]] Result<void> close() noexcept { return ctx_.close(); }
  /// The raw `ibv_context*`.
  abi::ibv_context* native_handle() const noexcept { return ctx_.get(); }
  /// Shared state used by handles made from this context.
  const detail::Ref<detail::ContextInfo>& info() const noexcept { return info_; }

private:
  Context(detail::Owned<abi::ibv_context> ctx, detail::Ref<detail::ContextInfo> info)
      : ctx_(std::move(ctx)), info_(std::move(info)) {}
  detail::Owned<abi::ibv_context> ctx_;
  detail::Ref<detail::ContextInfo> info_;
};

TBVERBS_NAMESPACE_END

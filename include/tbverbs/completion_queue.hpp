/// @file completion_queue.hpp
/// Completion queues: `poll` into the caller's span (no allocation), `wait` with a deadline.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/backoff.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "notice.hpp"
#include "result.hpp"

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

TBVERBS_NAMESPACE_BEGIN

/// One successful work completion. Only successes are ever handed out (a failed completion is
/// returned as an Error by `poll`), so every field here is valid. Same layout as `ibv_wc`.
class WorkCompletion {
public:
  /// The wr_id of the work request.
  std::uint64_t wr_id() const noexcept { return wc_.wr_id; }
  /// Bytes received (receive completions).
  std::uint32_t byte_len() const noexcept { return wc_.byte_len; }
  /// The completion's opcode (`IBV_WC_SEND`, `IBV_WC_RECV`, ...).
  int opcode() const noexcept { return static_cast<int>(wc_.opcode); }
  /// True for a receive completion.
  bool is_recv() const noexcept { return (static_cast<int>(wc_.opcode) & abi::IBV_WC_RECV) != 0; }
  /// Immediate data in network order, when `has_imm()`.
  std::uint32_t imm_data() const noexcept { return wc_.imm_data; }
  /// True when the sender attached immediate data.
  bool has_imm() const noexcept { return (wc_.wc_flags & abi::IBV_WC_WITH_IMM) != 0; }
  /// The local QP number.
  std::uint32_t qp_num() const noexcept { return wc_.qp_num; }
  /// The raw `ibv_wc`.
  const abi::ibv_wc& native() const noexcept { return wc_; }

private:
  friend class CompletionQueue;
  abi::ibv_wc wc_;
};
static_assert(sizeof(WorkCompletion) == sizeof(abi::ibv_wc));

/// How a completion queue's `wait` waits (Context::create_cq).
///
/// Apple's driver documents no completion channels (TN3205: "all queue pair operations are
/// non-blocking and the caller must poll") and no public Apple consumer uses them, so on Apple
/// the default polls. Wherever a channel is wanted but cannot be created or armed (any errno,
/// e.g. EOPNOTSUPP), the CQ falls back to polling, records why (`channel_note()`) and says so
/// once per process (notice.hpp). A wait never fails for want of a channel.
enum class CqWait : std::uint8_t {
  /// Apple: poll. Elsewhere (rdma-core): a completion channel, falling back to polling.
  automatic,
  /// A completion channel on every platform, Apple's too; falls back to polling when it cannot
  /// be created or armed.
  channel,
  /// No channel: `wait` polls (bounded spin, then yields, then sleeps of at most 1 ms).
  poll,
};

/// A completion queue, with a completion channel when one was wanted and works (`wait` then
/// sleeps on its fd) and polling otherwise. Move-only; keeps its context alive; kept alive by
/// the QPs that use it.
class CompletionQueue {
public:
  /// Polls up to `out.size()` completions into `out`; returns how many. A failed completion is
  /// fatal to its QP: it is returned as an error (`wc_error` with the status name and wr_id;
  /// its opcode is not trusted) and the rest of that batch is dropped. A negative `ibv_poll_cq`
  /// return is an error too, never a count. Allocates nothing.
  [[nodiscard]] Result<std::size_t> poll(std::span<WorkCompletion> out) noexcept {
    abi::ibv_wc* wc = reinterpret_cast<abi::ibv_wc*>(out.data());
    const int n = cq_->context->ops.poll_cq(cq_, static_cast<int>(out.size()), wc);
    if (n < 0) [[unlikely]]
      return fail(poll_failed(n));
    for (int i = 0; i < n; ++i)
      if (wc[i].status != abi::IBV_WC_SUCCESS) [[unlikely]]
        return fail(completion_failed(wc[i]));
    return static_cast<std::size_t>(n);
  }

  /// Polls until at least one completion arrives or `deadline` passes (`timeout` error at
  /// Step::wait_cq: the peer may be alive but silent; see the side channel for liveness).
  /// Without a channel (always on Apple by default) it polls with detail::PollBackoff: a bounded
  /// spin, then sched_yield, then sleeps growing to about 1 ms, never past the deadline. With a
  /// channel it sleeps on the channel's fd between polls; if arming or reading the channel fails,
  /// the CQ falls back to polling for good (see fall_back_to_polling) and the wait goes on.
  /// Errors: poll's (wc_error, poll_cq), timeout. Not thread-safe (one waiter per CQ).
  [[nodiscard]] Result<std::size_t> wait(std::span<WorkCompletion> out,
                                         std::chrono::steady_clock::time_point deadline) {
    if (channel_ != nullptr) {
      for (unsigned spins = 0; channel_ != nullptr; ++spins) {
        auto r = poll(out);
        if (!r || *r > 0) return r;
        if ((spins & 63) != 63) continue; // a few cheap polls before looking at the clock
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) return fail(timed_out());
        if (auto armed = arm(); !armed) {
          fall_back_to_polling(armed.error());
          break;
        }
        // A completion that landed before arming raises no event: poll once more, then sleep.
        auto again = poll(out);
        if (!again || *again > 0) return again;
        sleep_on_channel(deadline - now); // falls back to polling when the channel fails
      }
    }
    detail::PollBackoff backoff(deadline);
    for (;;) {
      auto r = poll(out);
      if (!r || *r > 0) return r;
      if (!backoff.pause()) {
        auto last = poll(out); // the deadline passed while pausing: one last look
        if (!last || *last > 0) return last;
        return fail(timed_out());
      }
    }
  }

  /// The completion channel's file descriptor (readable once an armed CQ gets a completion), or
  /// -1 without a usable channel (none made, or fallen back to polling). For callers that sleep
  /// on several CQs at once with `poll()`: `arm()` each (on failure, `fall_back_to_polling`),
  /// poll each CQ once more, `poll()` the fds, `consume_event()` on the readable ones.
  int channel_fd() const noexcept { return channel_ != nullptr ? channel_->fd : -1; }
  /// Requests an event on the channel for the next completion (`ibv_req_notify_cq`). Errors:
  /// req_notify_cq's return value; `unsupported` without a channel.
  [[nodiscard]] Result<void> arm() noexcept {
    if (channel_ == nullptr)
      return fail(Error::make(Step::req_notify_cq, ErrorKind::unsupported, "this CQ has no completion channel"));
    if (const int rc = cq_->context->ops.req_notify_cq(cq_, 0); rc != 0) {
      Error e = Error::from_return(Step::req_notify_cq, rc);
      return fail(info_->stamp(e));
    }
    return {};
  }
  /// Reads one event from the channel (`ibv_get_cq_event`, which blocks if none is pending) and
  /// acknowledges it at once, so `destroy_cq` never waits for unacknowledged events.
  [[nodiscard]] Result<void> consume_event() noexcept {
    if (channel_ == nullptr)
      return fail(Error::make(Step::get_cq_event, ErrorKind::unsupported, "this CQ has no completion channel"));
    abi::ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    if (info_->api->get_cq_event(channel_, &ev_cq, &ev_ctx) != 0) {
      Error e = Error::from_errno(Step::get_cq_event);
      return fail(info_->stamp(e));
    }
    info_->api->ack_cq_events(ev_cq, 1);
    return {};
  }

  /// Stops using the completion channel: from now on `wait` polls, `has_channel()` is false and
  /// `channel_fd()` is -1. Records `why` as channel_note() (the first cause is kept) and gives
  /// Notice::completion_channel_fallback once per process. The channel object itself lives on
  /// until the CQ is destroyed (a CQ must go before its channel). Callers that arm the channel
  /// themselves (wait_any) call it when arming or reading the channel fails.
  void fall_back_to_polling(const Error& why) noexcept {
    channel_ = nullptr;
    if (!note_) note_ = why;
    detail::notice_once(Notice::completion_channel_fallback, *note_);
  }
  /// Why this CQ polls although a channel was wanted: the error of ibv_create_comp_channel,
  /// ibv_req_notify_cq or ibv_get_cq_event as the verb returned it (with its diagnosis), or
  /// `unsupported` at Step::create_comp_channel for a library without channel functions. Empty
  /// when a channel works, or none was wanted (CqWait::poll, the default on Apple).
  const std::optional<Error>& channel_note() const noexcept { return note_; }

  /// Entries the driver granted (may exceed what was asked).
  int capacity() const noexcept { return cq_->cqe; }
  /// True when `wait` sleeps on a completion channel; false when it polls.
  bool has_channel() const noexcept { return channel_ != nullptr; }
  /// Destroys now and returns the verb's result (EBUSY while QPs still use it).
  [[nodiscard]] Result<void> close() noexcept {
    auto r = owned_.close();
    if (!r) return r;
    cq_ = nullptr;
    return channel_owned_.close();
  }
  /// The raw `ibv_cq*`.
  abi::ibv_cq* native_handle() const noexcept { return cq_; }
  /// For QpRecipe::prepare: a reference that keeps this CQ alive.
  std::shared_ptr<void> keep_alive() const noexcept { return owned_.keep_alive(); }

private:
  friend class Context;
  CompletionQueue(detail::Owned<abi::ibv_comp_channel> channel, detail::Owned<abi::ibv_cq> cq,
                  std::shared_ptr<detail::ContextInfo> info)
      : channel_owned_(std::move(channel)), owned_(std::move(cq)), info_(std::move(info)) {
    cq_ = owned_.get();
    channel_ = channel_owned_.get();
  }

  [[gnu::noinline, gnu::cold]] Error timed_out() const noexcept {
    Error e = Error::make(Step::wait_cq, ErrorKind::timeout,
                          "no completion before the deadline; the peer may be dead or stopped");
    return info_->stamp(e);
  }
  [[gnu::noinline, gnu::cold]] Error poll_failed(int rc) const noexcept {
    Error e = Error::from_poll(rc);
    return info_->stamp(e);
  }
  [[gnu::noinline, gnu::cold]] Error completion_failed(const abi::ibv_wc& wc) const noexcept {
    Error e = Error::from_wc(static_cast<int>(wc.status), wc.wr_id, static_cast<int>(wc.vendor_err));
    e.on(info_->device.view()).from(info_->platform);
    std::string d = "QP " + std::to_string(wc.qp_num) + ", wr_id " + std::to_string(wc.wr_id);
    if (!e.detail.empty()) d += std::string(", ") + e.detail.data;
    return e.with_detail(d);
  }

  // Sleeps on the armed channel's fd for at most 10 ms at a time, so the caller's deadline is
  // honoured even if an event is lost. A channel that fails here is given up for polling.
  void sleep_on_channel(std::chrono::steady_clock::duration left) noexcept {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
    pollfd p{channel_->fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(ms < 0 ? 0 : (ms > 10 ? 10 : ms)));
    if (ready < 0 && errno != EINTR) {
      Error e = Error::from_errno(Step::get_cq_event);
      return fall_back_to_polling(info_->stamp(e));
    }
    if (ready > 0)
      if (auto ev = consume_event(); !ev) fall_back_to_polling(ev.error());
  }

  // Declaration order is destruction order reversed: the CQ goes before its channel.
  detail::Owned<abi::ibv_comp_channel> channel_owned_;
  detail::Owned<abi::ibv_cq> owned_;
  std::shared_ptr<detail::ContextInfo> info_;
  abi::ibv_cq* cq_ = nullptr;                 // cached: the poll path reads no shared_ptr
  abi::ibv_comp_channel* channel_ = nullptr; // null: wait polls (none made, or fallen back)
  std::optional<Error> note_;                 // why a wanted channel is not used
};

TBVERBS_NAMESPACE_END

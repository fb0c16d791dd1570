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
#include "work_request.hpp"

#include <poll.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>

TBVERBS_NAMESPACE_BEGIN

/// One successful work completion. Only successes are ever handed out (a failed completion is
/// returned as an Error by `poll`, after the successes before it), so every field here is valid.
/// Same layout as `ibv_wc`. A plain value: copy it and read it from any thread.
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
  /// Immediate data in host byte order (as SendWr::send_with_imm / rdma_write_with_imm took it),
  /// when `has_imm()`.
  std::uint32_t imm() const noexcept { return detail::to_network32(wc_.imm_data); }
  /// True when the sender attached immediate data.
  bool has_imm() const noexcept { return (wc_.wc_flags & abi::IBV_WC_WITH_IMM) != 0; }
  /// The local QP number: which QP of a shared CQ the completion belongs to.
  std::uint32_t qp_num() const noexcept { return wc_.qp_num; }
  /// The `ibv_wc_flags` bits (IBV_WC_WITH_IMM, IBV_WC_GRH, ...).
  unsigned wc_flags() const noexcept { return static_cast<unsigned>(wc_.wc_flags); }
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

namespace detail {
/// Keeps the completions a poll took off the CQ behind a failed one, and hands them out before
/// anything newer. It owns a stand-in `ibv_cq` whose context's poll_cq is `drain`: while anything
/// is kept, the CompletionQueue's cached pointer points at the stand-in, so the success path of
/// poll needs no test of its own; `drain` points it back at the real CQ once the last kept entry is
/// out. Heap-allocated with the CQ (room for granted cqe + 1 entries: a poll never returns more
/// than the CQ holds), so the failure path allocates nothing.
struct CqKeep final : RefCounted {
  abi::ibv_context shadow_context{};
  abi::ibv_cq shadow{};
  abi::ibv_cq* real = nullptr;
  abi::ibv_cq** slot = nullptr; // the owner's cached pointer
  OwnedArray<abi::ibv_wc> entries;
  int capacity = 0, head = 0, count = 0;
  bool from_kept = false;  // the last batch through the stand-in came from `entries`
  std::uint64_t lost = 0;  // entries that did not fit (never, with a truthful cqe)

  CqKeep(abi::ibv_cq* cq, OwnedArray<abi::ibv_wc> room, int room_size) noexcept
      : real(cq), entries(std::move(room)), capacity(room_size) {
    shadow_context.device = cq->context->device;
    shadow_context.ops = cq->context->ops; // the real context's other ops, as they were
    shadow_context.ops.poll_cq = &drain;
    shadow_context.ops.req_notify_cq = &notify;
    shadow.context = &shadow_context;
    shadow.channel = cq->channel;
    shadow.cq_context = this;
    shadow.cqe = cq->cqe;
  }
  CqKeep(const CqKeep&) = delete;
  CqKeep& operator=(const CqKeep&) = delete;
  ~CqKeep() override = default;

  void store(const abi::ibv_wc* wc, int n) noexcept {
    const int fits = n < capacity ? n : capacity;
    for (int i = 0; i < fits; ++i) entries[static_cast<std::size_t>(i)] = wc[i];
    head = 0;
    count = fits;
    if (fits < n) lost += static_cast<std::uint64_t>(n - fits);
  }
  void unpop() noexcept {
    --head;
    ++count;
  }
  // The stand-in's poll_cq: kept entries up to and including the next failure, then the real CQ's.
  static int drain(abi::ibv_cq* cq, int n, abi::ibv_wc* wc) noexcept {
    CqKeep* k = static_cast<CqKeep*>(cq->cq_context);
    if (k->count == 0) {
      k->from_kept = false;
      *k->slot = k->real;
      return k->real->context->ops.poll_cq(k->real, n, wc);
    }
    k->from_kept = false; // true only when this batch ends in a kept failure (poll's keep() reads it)
    int m = 0;
    while (m < n && k->count != 0) {
      const abi::ibv_wc& w = k->entries[static_cast<std::size_t>(k->head)];
      wc[m++] = w;
      ++k->head;
      --k->count;
      if (w.status != abi::IBV_WC_SUCCESS) { // poll reports it; nothing after it in this batch
        k->from_kept = true;
        break;
      }
    }
    if (k->count == 0) *k->slot = k->real;
    return m;
  }
  static int notify(abi::ibv_cq* cq, int solicited_only) noexcept {
    CqKeep* k = static_cast<CqKeep*>(cq->cq_context);
    return k->real->context->ops.req_notify_cq(k->real, solicited_only);
  }
};

/// The CompletionQueue's cached CQ pointer and its keeper: never null (the closed stand-in after
/// close() or a move), and the keeper always knows where the pointer lives.
struct HotCq {
  abi::ibv_cq* ptr = closed_object<abi::ibv_cq>();
  Ref<CqKeep> keeper;

  HotCq() = default;
  explicit HotCq(abi::ibv_cq* p) noexcept : ptr(p != nullptr ? p : closed_object<abi::ibv_cq>()) {}
  HotCq(const HotCq&) = delete;
  HotCq& operator=(const HotCq&) = delete;
  HotCq(HotCq&& o) noexcept : ptr(o.ptr), keeper(std::move(o.keeper)) {
    o.ptr = closed_object<abi::ibv_cq>();
    attach();
  }
  HotCq& operator=(HotCq&& o) noexcept {
    if (this != &o) {
      ptr = o.ptr;
      keeper = std::move(o.keeper);
      o.ptr = closed_object<abi::ibv_cq>();
      attach();
    }
    return *this;
  }
  ~HotCq() = default;
  void attach() noexcept {
    if (keeper) keeper->slot = &ptr;
  }
  abi::ibv_cq* operator->() const noexcept { return ptr; }
  abi::ibv_cq* get() const noexcept { return ptr; }
  void reset() noexcept {
    ptr = closed_object<abi::ibv_cq>();
    keeper.reset();
  }
  bool live() const noexcept { return !is_closed_object(ptr); }
};
} // namespace detail

/// What Context::create_cq makes: size, how `wait` waits, and the completion vector.
struct CqOptions {
  /// Completions the CQ must hold (at most the device's max_cqe: a larger request is a
  /// `capacity` error, never silently clamped). Size it for every outstanding signalled send plus
  /// every posted receive: an overrun loses completions.
  int entries = 256;
  /// How CompletionQueue::wait waits.
  CqWait wait = CqWait::automatic;
  /// The completion vector (interrupt) for the CQ's events, below the context's
  /// num_comp_vectors; 0 on Apple.
  int comp_vector = 0;
};

/// A completion queue, with a completion channel when one was wanted and works (`wait` then
/// sleeps on its fd) and polling otherwise. Move-only; keeps its context alive; kept alive by
/// the QPs that use it.
///
/// **Nothing is lost.** A failed completion is returned as an Error, but never at the cost of the
/// completions around it: the successes polled before it are returned first (as a count), and the
/// failure and everything after it are kept in the CQ (a buffer of `capacity()` entries made with
/// the CQ) and handed out, in the CQ's order, by the next polls. With one CQ shared by many QPs,
/// one QP's flush errors therefore never take another QP's completions with them.
///
/// **Closed and moved-from.** After close() or a move, poll/wait/arm return an error (EBADF,
/// diagnosis "handle-closed") instead of touching freed memory; native_handle() is null and
/// channel_fd() is -1.
///
/// **Threads.** One poller at a time: poll, wait, arm, consume_event and fall_back_to_polling
/// must not run concurrently on one CQ (the kept completions and the channel state are not
/// synchronised; rdma-core's ibv_poll_cq itself is thread-safe, but the order of two pollers'
/// results would be meaningless anyway). Posting on QPs that use the CQ may run concurrently
/// with polling it. The CQ may be moved to, and used from, another thread between calls.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto cq
/// \until cq.error()
/// \skip WorkCompletion wc
/// \until done +=
/// \line }
class CompletionQueue {
public:
  /// Polls up to `out.size()` completions into `out` and returns how many; they are all
  /// successes. A failed completion is returned as an error (`wc_error` with its status name,
  /// wr_id, QP number and vendor_err; its opcode and byte_len are not trusted and not kept)
  /// once the successes polled before it have been returned: a batch with its first failure at
  /// position k > 0 returns k, the next poll returns the failure, and the polls after it the rest
  /// (`kept()` says how many wait); a failure at position 0 is returned at once. A negative
  /// `ibv_poll_cq` return is an error (`poll_cq`, the negated errno), never a count.
  /// Allocates nothing; the success path costs no test beyond the raw call's (kept completions are
  /// served by a stand-in CQ the cached pointer switches to, detail::CqKeep).
  [[nodiscard, gnu::always_inline]] Result<std::size_t> poll(std::span<WorkCompletion> out) noexcept {
    return poll(out, [](const WorkCompletion&) noexcept {});
  }

  /// poll(out), handing each success to `consume(const WorkCompletion&)` in the CQ's order, in
  /// the same pass that checks the statuses; returns how many were consumed. Use it on the hot
  /// path: `poll(out)` followed by the caller's own loop over the batch walks it twice (+6
  /// instructions per post and poll in bench/overhead), this one walks it once, as a raw loop that
  /// checks each status does (the raw calls' count). Failures, kept completions and errors as
  /// poll(out): on a failure at position k > 0, `consume` has seen the k successes before it and
  /// k is returned; the failure comes with the next call.
  template <class Consume>
  [[nodiscard, gnu::always_inline]] Result<std::size_t> poll(std::span<WorkCompletion> out,
                                                             Consume&& consume) noexcept(
      noexcept(consume(std::declval<const WorkCompletion&>()))) {
    // While completions are kept, cq_ points at the keeper's stand-in CQ, whose poll_cq hands them
    // out first (detail::CqKeep): the success path has no extra test.
    abi::ibv_wc* wc = reinterpret_cast<abi::ibv_wc*>(out.data());
    const int n = cq_->context->ops.poll_cq(cq_.get(), static_cast<int>(out.size()), wc);
    if (n < 0) [[unlikely]]
      return fail(poll_failed(n));
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != abi::IBV_WC_SUCCESS) [[unlikely]] {
        const std::size_t k = keep(wc, &wc[i], n);
        if (k == report_now) return fail(completion_failed(failed_));
        return k;
      }
      consume(out[static_cast<std::size_t>(i)]);
    }
    return static_cast<std::size_t>(n);
  }

  /// Polls until at least one completion arrives or `deadline` passes (`timeout` error at
  /// Step::wait_cq: the peer may be alive but silent; see the side channel for liveness).
  /// Without a channel (always on Apple by default) it polls with detail::PollBackoff: a bounded
  /// spin, then sched_yield, then sleeps growing to about 1 ms, never past the deadline. With a
  /// channel it sleeps on the channel's fd between polls; if arming or reading the channel fails,
  /// the CQ falls back to polling for good (see fall_back_to_polling) and the wait goes on.
  /// Errors: poll's (wc_error, poll_cq), timeout. One waiter per CQ (see the class comment).
  /// The loop is wait_any's, over this one CQ.
  [[nodiscard]] Result<std::size_t> wait(std::span<WorkCompletion> out,
                                         std::chrono::steady_clock::time_point deadline) {
    CompletionQueue* self = this;
    std::size_t which = 0;
    auto got = wait_any(std::span<CompletionQueue* const>(&self, 1), out, which, deadline);
    if (got && *got == 0) return fail(timed_out());
    return got;
  }

  /// Waits until one of `cqs` has completions or `deadline` passes: the library's one wait loop
  /// (wait() is it over one CQ; the links' tbverbs::wait_any over each link's CQ). Returns how many
  /// completions were written to `out` (0 when the deadline passed) and sets `which` to the index
  /// of their CQ; the CQs are polled in order, so put the busiest first.
  ///
  /// While every CQ has a usable completion channel: a few cheap polls, then it arms each, polls
  /// each once more (a completion that landed before arming raises no event) and sleeps on all
  /// the channels' descriptors at once, in slices of at most 10 ms. A CQ whose channel cannot be
  /// armed or read falls back to polling for good (fall_back_to_polling, noted once per
  /// process). Otherwise (always on Apple by default: TN3205, "the caller must poll") it polls
  /// every CQ in turn with detail::PollBackoff, and looks once more after the deadline passed.
  /// Errors: the CQs' (wc_error, poll_cq); invalid_argument for an empty span or more than 16 CQs.
  /// Allocates nothing.
  [[nodiscard]] static Result<std::size_t> wait_any(std::span<CompletionQueue* const> cqs, std::span<WorkCompletion> out,
                                                    std::size_t& which, std::chrono::steady_clock::time_point deadline) {
    using clock = std::chrono::steady_clock;
    constexpr std::size_t max_cqs = 16;
    if (cqs.empty() || cqs.size() > max_cqs)
      return fail(Error::make(Step::wait_cq, ErrorKind::invalid_argument, "a wait takes 1 to 16 completion queues"));
    auto poll_all = [&]() -> Result<std::size_t> {
      for (std::size_t i = 0; i < cqs.size(); ++i) {
        auto got = cqs[i]->poll(out);
        if (!got || *got > 0) {
          which = i;
          return got;
        }
      }
      return std::size_t{0};
    };
    // Sleeping on channels: every CQ must have one, or a completion on a channel-less CQ would
    // wait for the slice to end.
    auto all_channels = [&] {
      for (const CompletionQueue* cq : cqs)
        if (cq->channel_ == nullptr) return false;
      return true;
    };
    for (unsigned spins = 0; all_channels(); ++spins) {
      auto got = poll_all();
      if (!got || *got > 0) return got;
      if ((spins & 63) != 63) continue; // a few cheap polls before the clock and the system calls
      const auto now = clock::now();
      if (now >= deadline) return std::size_t{0};
      for (CompletionQueue* cq : cqs)
        if (auto armed = cq->arm(); !armed) cq->fall_back_to_polling(armed.error());
      if (!all_channels()) break;
      got = poll_all();
      if (!got || *got > 0) return got;
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
      pollfd fds[max_cqs];
      for (std::size_t i = 0; i < cqs.size(); ++i) fds[i] = pollfd{cqs[i]->channel_->fd, POLLIN, 0};
      const int ready = ::poll(fds, static_cast<nfds_t>(cqs.size()), static_cast<int>(ms < 0 ? 0 : (ms > 10 ? 10 : ms)));
      if (ready < 0 && errno != EINTR) {
        const Error e = Error::from_errno(Step::get_cq_event);
        for (CompletionQueue* cq : cqs) {
          Error stamped = e;
          cq->fall_back_to_polling(cq->stamp(stamped));
        }
        break;
      }
      for (std::size_t i = 0; ready > 0 && i < cqs.size(); ++i)
        if ((fds[i].revents & POLLIN) != 0)
          if (auto ev = cqs[i]->consume_event(); !ev) cqs[i]->fall_back_to_polling(ev.error());
    }
    // Polling: the one backoff every channel-less wait uses.
    detail::PollBackoff backoff(deadline);
    for (;;) {
      auto got = poll_all();
      if (!got || *got > 0) return got;
      if (!backoff.pause()) return poll_all(); // the deadline passed: one last look (0 if nothing)
    }
  }

  /// The completion channel's file descriptor (readable once an armed CQ gets a completion), or
  /// -1 without a usable channel (none made, fallen back to polling, closed, moved from). For
  /// callers that sleep on several CQs at once with `poll()`: `arm()` each (on failure,
  /// `fall_back_to_polling`), poll each CQ once more, `poll()` the fds, `consume_event()` on the
  /// readable ones.
  int channel_fd() const noexcept { return channel_ != nullptr ? channel_->fd : -1; }
  /// Requests an event on the channel for the next completion (`ibv_req_notify_cq`). Errors:
  /// req_notify_cq's return value; `unsupported` without a channel.
  [[nodiscard]] Result<void> arm() noexcept {
    if (channel_ == nullptr)
      return fail(Error::make(Step::req_notify_cq, ErrorKind::unsupported, "this CQ has no completion channel"));
    if (const int rc = cq_->context->ops.req_notify_cq(cq_.get(), 0); rc != 0) {
      Error e = Error::from_return(Step::req_notify_cq, rc);
      return fail(stamp(e));
    }
    return {};
  }
  /// Reads one event from the channel (`ibv_get_cq_event`, which blocks if none is pending) and
  /// acknowledges it at once, so `destroy_cq` never waits for unacknowledged events. Errors:
  /// get_cq_event's errno; `unsupported` without a channel.
  [[nodiscard]] Result<void> consume_event() noexcept {
    if (channel_ == nullptr || info_ == nullptr || info_->ops.get_cq_event == nullptr)
      return fail(Error::make(Step::get_cq_event, ErrorKind::unsupported, "this CQ has no completion channel"));
    abi::ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    errno = 0;
    if (info_->ops.get_cq_event(channel_, &ev_cq, &ev_ctx) != 0) {
      Error e = Error::from_errno(Step::get_cq_event);
      return fail(stamp(e));
    }
    info_->ops.ack_cq_events(ev_cq, 1);
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

  /// Entries the driver granted (may exceed what was asked); 0 once closed or moved from.
  int capacity() const noexcept { return cq_->cqe; }
  /// Failed and later completions taken off the CQ and not handed out yet (see poll).
  std::size_t kept() const noexcept { return cq_.keeper != nullptr ? static_cast<std::size_t>(cq_.keeper->count) : 0; }
  /// True when `wait` sleeps on a completion channel; false when it polls.
  bool has_channel() const noexcept { return channel_ != nullptr; }
  /// Destroys now and returns the verb's result (EBUSY while QPs still use it, and nothing is
  /// destroyed). Afterwards poll and wait return EBADF, native_handle() is null and
  /// channel_fd() is -1; completions kept from an earlier failed batch are dropped.
  [[nodiscard]] Result<void> close() noexcept {
    auto r = owned_.close();
    if (!r) return r;
    cq_.reset();
    channel_ = nullptr;
    return channel_owned_.close();
  }
  /// The raw `ibv_cq*`; null once closed or moved from.
  abi::ibv_cq* native_handle() const noexcept { return owned_.get(); }
  /// For QpRecipe::prepare: a reference that keeps this CQ alive.
  detail::Ref<detail::RefCounted> keep_alive() const noexcept { return owned_.keep_alive(); }

private:
  friend class Context;
  CompletionQueue(detail::Owned<abi::ibv_comp_channel> channel, detail::Owned<abi::ibv_cq> cq,
                  detail::Ref<detail::ContextInfo> info, detail::OwnedArray<abi::ibv_wc> kept, int kept_capacity)
      : channel_owned_(std::move(channel)), owned_(std::move(cq)), info_(std::move(info)), cq_(owned_.get()),
        channel_(channel_owned_.get()) {
    if (kept) cq_.keeper = detail::make_ref<detail::CqKeep>(owned_.get(), std::move(kept), kept_capacity);
    cq_.attach();
  }

  static constexpr std::size_t report_now = ~std::size_t{0};

  // The batch wc[0, n) has its first failure at `first_bad`. Returns the number of successes to
  // hand out now, or report_now when the failure comes first (it is then in failed_). Whatever
  // follows it is kept, and cq_ points at the keeper until it is handed out.
  [[gnu::noinline, gnu::cold]] std::size_t keep(const abi::ibv_wc* wc, const abi::ibv_wc* bad, int n) noexcept {
    const int first_bad = static_cast<int>(bad - wc);
    detail::CqKeep* k = cq_.keeper.get();
    if (k == nullptr) { // no keeper (closed): report the failure, drop the rest
      failed_ = wc[first_bad];
      return first_bad > 0 ? static_cast<std::size_t>(first_bad) : report_now;
    }
    if (k->from_kept) {
      // The batch came from the keeper, which ends a batch at its first failure (wc[n - 1]).
      k->from_kept = false;
      failed_ = wc[first_bad];
      if (first_bad == 0) return report_now;
      k->unpop(); // the failure goes next
      cq_.ptr = &k->shadow;
      return static_cast<std::size_t>(first_bad);
    }
    const int from = first_bad > 0 ? first_bad : first_bad + 1;
    if (first_bad == 0) failed_ = wc[0];
    k->store(wc + from, n - from);
    if (k->count != 0) cq_.ptr = &k->shadow;
    return first_bad > 0 ? static_cast<std::size_t>(first_bad) : report_now;
  }

  Error& stamp(Error& e) const noexcept { return info_ != nullptr ? info_->stamp(e) : e; }

  [[gnu::noinline, gnu::cold]] Error timed_out() const noexcept {
    Error e = Error::make(Step::wait_cq, ErrorKind::timeout,
                          "no completion before the deadline; the peer may be dead or stopped");
    return stamp(e);
  }
  [[gnu::noinline, gnu::cold]] Error poll_failed(int rc) const noexcept {
    Error e = Error::from_poll(rc);
    if (!cq_.live()) e.with_detail(fact::closed_handle);
    return stamp(e);
  }
  // Formats into the Error's fixed buffer: nothing here allocates (poll is noexcept).
  [[gnu::noinline, gnu::cold]] Error completion_failed(const abi::ibv_wc& wc) const noexcept {
    Error e = Error::from_wc(static_cast<int>(wc.status), wc.wr_id, static_cast<int>(wc.vendor_err));
    e.qp_num = wc.qp_num;
    if (cq_.keeper != nullptr && cq_.keeper->lost != 0)
      e.detail.appendf("%s%llu completions after a failure did not fit the CQ's capacity and were lost",
                       e.detail.empty() ? "" : "; ", static_cast<unsigned long long>(cq_.keeper->lost));
    return stamp(e);
  }

  // Sleeps on the armed channel's fd for at most 10 ms at a time, so the caller's deadline is
  // honoured even if an event is lost. A channel that fails here is given up for polling.
  // Declaration order is destruction order reversed: the CQ goes before its channel.
  detail::Owned<abi::ibv_comp_channel> channel_owned_;
  detail::Owned<abi::ibv_cq> owned_;
  detail::Ref<detail::ContextInfo> info_;
  detail::HotCq cq_;                                   // cached: the poll path reads no Ref
  detail::NullOnMove<abi::ibv_comp_channel> channel_; // null: wait polls (none made, fallen back, closed)
  abi::ibv_wc failed_{};                               // the failure poll is returning
  std::optional<Error> note_;                          // why a wanted channel is not used
};

TBVERBS_NAMESPACE_END

/// @file collective/impl/requests.hpp
/// The definitions behind Request (collective/request.hpp): a started collective's state, the
/// communicator's progress thread that runs them in order, and the point-to-point groups.
/// Included by collective/impl/communicator.hpp.
#pragma once

#include "../call.hpp"
#include "../request.hpp"
#include "../types.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <tuple>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

struct RequestQueue;
struct Subgroup;

/// `items` (sends and receives of one rank, `me`) in the order every rank derives alike: by pair of
/// ranks, and within a pair the lower rank's sends first, each direction in the order given (the
/// sort is stable). Run one after the other, such groups never make two ranks wait on each other:
/// the first unfinished pair of the whole job is the next item of both its ranks.
/// `peer(item)` is the other rank, `sends(item)` true for a send.
template <class T, class Peer, class Sends> void order_pairwise(std::vector<T>& items, int me, Peer peer, Sends sends) {
  std::vector<std::pair<std::tuple<int, int, int, std::size_t>, T>> keyed;
  keyed.reserve(items.size());
  for (std::size_t k = 0; k < items.size(); ++k) {
    const int p = peer(items[k]), lo = std::min(me, p), hi = std::max(me, p);
    const int from = sends(items[k]) ? me : p;
    keyed.emplace_back(std::tuple<int, int, int, std::size_t>(lo, hi, from == lo ? 0 : 1, k), std::move(items[k]));
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t k = 0; k < keyed.size(); ++k) items[k] = std::move(keyed[k].second);
}

/// One started collective: its arguments as the blocking call takes them, and, once it ran, its
/// result (`done` and `result` are guarded by the RequestQueue's mutex).
struct RequestState {
  Collective kind = Collective::all_reduce;   ///< The call.
  DType type = DType::f32;                    ///< Its element type.
  ReduceOp op = ReduceOp::sum;                ///< Its reduction.
  std::span<const std::byte> in;              ///< Its input.
  std::span<std::byte> out;                   ///< Its output.
  int arg = 0;                                ///< Root or peer (in its communicator's ranks).
  int peer = 0;                               ///< send/recv: the peer's rank in the family (the group order).
  std::shared_ptr<Subgroup> group;            ///< A split communicator's call: its members; null otherwise.
  bool released = false;                      ///< May run (send/recv: once a group was closed).
  bool done = false;                          ///< Ran; `result` holds how.
  Result<void> result;                        ///< The call's result.
  std::shared_ptr<RequestQueue> progress;         ///< The thread that runs it.

  /// True for send and recv.
  bool point_to_point() const noexcept { return kind == Collective::send || kind == Collective::recv; }
};

/// The progress thread of one family of communicators (one and those split from it) and its queue of started requests (collective/request.hpp, "Who
/// progresses it"). Everything but `thread` is guarded by `mu`.
struct RequestQueue {
  std::mutex mu;                                    ///< Guards the rest.
  std::condition_variable work;                     ///< The thread: something to run, or stop.
  std::condition_variable finished;                 ///< Waiters: a request completed.
  std::deque<std::shared_ptr<RequestState>> queue;  ///< Started, not yet running, in start order.
  bool running = false;                             ///< The thread runs a batch now.
  bool stop = false;                                ///< The thread ends once the queue is empty.
  std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now(); ///< A batch started or a request completed.
  std::chrono::milliseconds timeout{30000};          ///< The communicator's timeout.
  int rank = 0;                                      ///< This rank in the family (the group order).
  std::function<Result<void>(RequestState&)> execute; ///< Runs one request (the communicator's blocking path).
  std::function<void(const Error&)> abort;            ///< Breaks the communicator (a request that can wait no more).
  std::thread thread;                                ///< Runs loop().

  /// Lets every held send and recv run (a group is closed). Under `mu`.
  void release_all() noexcept {
    for (auto& r : queue) r->released = true;
  }
  /// True when nothing is queued or running. Under `mu`.
  bool idle() const noexcept { return queue.empty() && !running; }

  /// The next batch to run (under `mu`, the queue's front released): one collective, or the run
  /// of released sends and recvs at the front, in order_pairwise's order.
  std::vector<std::shared_ptr<RequestState>> take_batch() {
    std::vector<std::shared_ptr<RequestState>> batch;
    if (!queue.front()->point_to_point()) {
      batch.push_back(std::move(queue.front()));
      queue.pop_front();
      return batch;
    }
    while (!queue.empty() && queue.front()->point_to_point() && queue.front()->released) {
      batch.push_back(std::move(queue.front()));
      queue.pop_front();
    }
    order_pairwise(batch, rank, [](const auto& r) { return r->peer; }, [](const auto& r) { return r->kind == Collective::send; });
    return batch;
  }

  /// The thread: runs batches until stopped.
  void loop() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      work.wait(lk, [&] { return stop || (!queue.empty() && queue.front()->released); });
      if (queue.empty() || !queue.front()->released) return; // stopped, nothing left to run
      auto batch = take_batch();
      running = true;
      last_progress = std::chrono::steady_clock::now();
      for (auto& r : batch) {
        lk.unlock();
        Result<void> res = execute(*r);
        lk.lock();
        r->result = std::move(res);
        r->done = true;
        last_progress = std::chrono::steady_clock::now();
        finished.notify_all();
      }
      running = false;
      finished.notify_all();
    }
  }

  /// Waits (holding `lk` on `mu`) until `done()` or no request completed for the timeout, or
  /// `limit` passed; false on the timeout or limit. Closes any held group first.
  template <class Done> bool wait_for(std::unique_lock<std::mutex>& lk, Done done, std::chrono::milliseconds limit) {
    release_all();
    work.notify_one();
    const auto start = std::chrono::steady_clock::now();
    const auto give_up = limit.count() < 0 ? std::chrono::steady_clock::time_point::max() : start + limit;
    while (!done()) {
      const auto stalled = std::max(last_progress, start) + timeout;
      const auto until = std::min(give_up, stalled);
      if (std::chrono::steady_clock::now() >= until) return false;
      finished.wait_until(lk, until);
    }
    return true;
  }

  /// Runs `r` now: queued behind whatever was started before it, every held group closed.
  void enqueue(std::shared_ptr<RequestState> r) {
    {
      const std::lock_guard<std::mutex> lock(mu);
      r->released = !r->point_to_point();
      if (r->released) release_all(); // a collective follows the sends and recvs started before it
      queue.push_back(std::move(r));
    }
    work.notify_one();
  }

  /// Waits until every started request ran (bounded as wait() is); false when it gave up.
  bool drain() {
    std::unique_lock<std::mutex> lk(mu);
    return wait_for(lk, [&] { return idle(); }, std::chrono::milliseconds(-1));
  }

  /// Ends the thread once the queue is empty, and joins it.
  void shut_down() {
    {
      const std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    work.notify_one();
    if (thread.joinable()) thread.join();
  }
};

/// The error of a wait that gave up.
inline Error request_timeout(const RequestState& r, std::chrono::milliseconds waited, bool stalled) {
  return Error::make(Step::collective, ErrorKind::timeout,
                     std::string(collective_name(r.kind)) + " request: " +
                         (stalled ? "no request of this communicator completed for " : "not complete after ") +
                         std::to_string(waited.count()) + " ms (it stays in flight; its buffers stay in use)");
}

} // namespace collective

TBVERBS_COLLECTIVE_DEF Result<void> Request::wait(std::chrono::milliseconds limit) {
  if (!s_) return fail(Error::make(Step::collective, ErrorKind::invalid_argument, "wait on an empty (moved-from) Request"));
  collective::RequestState& r = *s_;
  collective::RequestQueue& p = *r.progress;
  std::unique_lock<std::mutex> lk(p.mu);
  if (!p.wait_for(lk, [&] { return r.done; }, limit)) {
    const bool stalled = limit.count() < 0 || std::chrono::steady_clock::now() - p.last_progress >= p.timeout;
    return fail(collective::request_timeout(r, limit.count() < 0 ? p.timeout : limit, stalled));
  }
  return r.result;
}

TBVERBS_COLLECTIVE_DEF Result<void> Request::wait() { return wait(std::chrono::milliseconds(-1)); }

TBVERBS_COLLECTIVE_DEF Result<bool> Request::test() {
  if (!s_) return fail(Error::make(Step::collective, ErrorKind::invalid_argument, "test on an empty (moved-from) Request"));
  collective::RequestState& r = *s_;
  collective::RequestQueue& p = *r.progress;
  const std::lock_guard<std::mutex> lock(p.mu);
  p.release_all();
  p.work.notify_one();
  if (!r.done) return false;
  if (!r.result) return fail(r.result.error());
  return true;
}

TBVERBS_COLLECTIVE_DEF Request::~Request() {
  if (!s_) return;
  std::shared_ptr<collective::RequestQueue> p = s_->progress;
  if (wait()) return;
  std::unique_lock<std::mutex> lk(p->mu);
  if (s_->done) return;
  // It could wait no more: break the communicator, so the call stops touching the buffers.
  lk.unlock();
  if (p->abort) p->abort(collective::request_timeout(*s_, p->timeout, true));
  (void)wait();
}

TBVERBS_COLLECTIVE_DEF Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    Request gone(std::move(*this));
    s_ = std::move(o.s_);
  }
  return *this;
}

TBVERBS_NAMESPACE_END

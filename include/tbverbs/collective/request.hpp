/// @file collective/request.hpp
/// `Request`: a collective started with a Communicator's `*_async` call, to be waited on or
/// tested. docs/collectives.md, "Requests", is its guide.
///
/// **Who progresses it.** The communicator's progress thread (one per family of split
/// communicators, started at its first `*_async` call) runs the started collectives one after the other, in the order they were started, while
/// the program computes; `wait()` and `test()` only look. It polls the completion queues while a
/// request runs (one core busy, as a blocking call's thread is) and sleeps when none does.
///
/// **Point-to-point groups.** send_async and recv_async requests are held until the program
/// waits on or tests one of its requests, starts a collective, or makes a blocking call: the ones
/// held then run as one group, in an order every rank derives alike (by pair of ranks, the lower
/// rank's sends first), so two ranks that both start a send to the other before their receives
/// complete (torch's batch_isend_irecv). A pair's send and recv must both be started before
/// either is waited on.
///
/// **Lifetime.** The buffers of a request must stay valid until it completes. Destroying an
/// incomplete Request waits for it (bounded as wait() is); its error, if any, is dropped (the
/// communicator is then broken, and says so on the next call).
#pragma once

#include "../error.hpp"
#include "../result.hpp"
#include "linkage.hpp"

#include <chrono>
#include <memory>

TBVERBS_NAMESPACE_BEGIN

class Communicator;
namespace collective {
struct RequestState;
} // namespace collective

/// A started collective (see the top of this file). Move-only; empty once moved from.
class Request {
public:
  /// Takes over `o`'s collective; `o` is then empty.
  Request(Request&& o) noexcept = default;
  /// Waits for this request's collective (as the destructor does), then takes over `o`'s.
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;            ///< Move-only.
  Request& operator=(const Request&) = delete; ///< Move-only.
  /// Waits for the collective if it has not completed (its error dropped).
  ~Request();

  /// Waits until the collective completed and returns its result. Bounded by the communicator's
  /// timeout counted from the last progress (a request queued behind others waits while they
  /// complete): past it, ErrorKind::timeout, and the request stays in flight. Calling it again
  /// after completion returns the same result.
  Result<void> wait();
  /// wait(), giving up after `limit` with ErrorKind::timeout (the request stays in flight).
  Result<void> wait(std::chrono::milliseconds limit);
  /// True once the collective completed (its result is then wait()'s); false while it runs or
  /// waits its turn. Starts any point-to-point group this rank holds.
  Result<bool> test();
  /// False for a moved-from Request.
  bool valid() const noexcept { return s_ != nullptr; }

private:
  friend class Communicator;
  explicit Request(std::shared_ptr<collective::RequestState> s) noexcept : s_(std::move(s)) {}
  std::shared_ptr<collective::RequestState> s_;
};

TBVERBS_NAMESPACE_END

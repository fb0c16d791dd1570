// The failure semantics of a Communicator that a framework relies on (docs/collectives.md,
// "Failures", "Leaving", "Threads"), each on a communicator of its own:
//   abort_from_thread  rank 0's watchdog thread calls abort(cause) while rank 0 runs collectives:
//                      rank 0's call fails with the cause, and every other rank is told that
//                      cause (its words, not "peer lost"), within a second;
//   closing_rank       the last rank leaves (its communicator's destructor) while the others
//                      call all_reduce: they fail at once with call_mismatch naming the rank that
//                      closed, not after the timeout;
//   finished_then_closed  the last rank sends to rank 0 and closes before rank 0 calls recv:
//                      the recv completes (the sender finished its part); the next call fails.
//                      With --link-latency-us 1000000 the send completes (UC: on the wire) 1 s
//                      before it lands, so rank 0 is inside its recv when the close reaches it;
//   threads            while one thread runs collectives, another registers and releases memory
//                      and calls a collective itself (refused with invalid_argument, nothing
//                      broken); under ThreadSanitizer, no race.
//
//   failure_check --local N      starts N ranks of itself on an emulated ring
// Exit 0 when every rank saw what it should; each problem is a line with FAIL.
#include <tbverbs/collective.hpp>

#include "check_main.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using tbverbs::Communicator;
using tbverbs::ErrorKind;
using clock_type = std::chrono::steady_clock;

using check::failed;

tbverbs::Result<Communicator> connect() {
  auto opts = tbverbs::CommunicatorOptions::from_env();
  if (!opts) return tbverbs::fail(opts.error());
  opts->timeout = std::chrono::milliseconds(20000);
  return Communicator::connect(*opts);
}

double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Collectives until one fails; returns its error and how long after `from` it came.
tbverbs::Error run_until_failure(Communicator& c, clock_type::time_point& failed_at) {
  std::vector<float> v(1 << 16, 1.0f);
  for (int i = 0; i < 1000000; ++i)
    if (auto r = c.all_reduce(std::span<float>(v)); !r) {
      failed_at = clock_type::now();
      return r.error();
    }
  failed_at = clock_type::now();
  return tbverbs::Error::make(tbverbs::Step::collective, ErrorKind::invalid_argument, "no call failed");
}

void abort_from_thread() {
  auto comm = connect();
  if (!comm) return failed("abort_from_thread: connect: " + comm.error().message());
  Communicator& c = *comm;
  check::rank = c.rank();
  std::thread watchdog;
  const auto t0 = clock_type::now();
  if (c.rank() == 0)
    watchdog = std::thread([&c] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      c.abort(tbverbs::Error::make(tbverbs::Step::collective, ErrorKind::timeout, "watchdog: step 17 took longer than 250 ms"));
    });
  clock_type::time_point at;
  const tbverbs::Error e = run_until_failure(c, at);
  if (watchdog.joinable()) watchdog.join();
  const std::string m = e.message();
  std::printf("rank %d: abort_from_thread: failed after %.3f s: %s\n", c.rank(), std::chrono::duration<double>(at - t0).count(),
              m.c_str());
  if (m.find("watchdog: step 17") == std::string::npos) failed("abort_from_thread: the error does not carry the watchdog's cause: " + m);
  if (c.rank() != 0 && !e.is(ErrorKind::peer_aborted)) failed("abort_from_thread: not peer_aborted: " + m);
  if (std::chrono::duration<double>(at - t0).count() > 5) failed("abort_from_thread: the abort took more than 5 s to arrive");
}

void closing_rank() {
  auto comm = connect();
  if (!comm) return failed("closing_rank: connect: " + comm.error().message());
  check::rank = comm->rank();
  const int last = comm->size() - 1;
  std::vector<float> v(1000, 1.0f);
  if (auto r = comm->all_reduce(std::span<float>(v)); !r) return failed("closing_rank: the first all_reduce: " + r.error().message());
  if (comm->rank() == last) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100)); // the others are inside their second all_reduce
    return;                                                      // the destructor closes
  }
  const auto t0 = clock_type::now();
  auto r = comm->all_reduce(std::span<float>(v));
  const double secs = since(t0);
  if (r) return failed("closing_rank: an all_reduce without rank " + std::to_string(last) + " returned ok");
  const std::string m = r.error().message();
  std::printf("rank %d: closing_rank: failed after %.3f s as expected: %s\n", comm->rank(), secs, m.c_str());
  if (!r.error().is(ErrorKind::call_mismatch)) failed("closing_rank: not call_mismatch: " + m);
  if (m.find("rank " + std::to_string(last) + " closed") == std::string::npos) failed("closing_rank: the message does not name the rank that closed");
  if (secs > 3) failed("closing_rank: " + std::to_string(secs) + " s to learn that a rank closed");
}

// A rank that finished a call and closed is not missing from that call: a peer still in it (here a
// recv of a send that landed before the sender closed, and an all_reduce the closing rank had
// finished) completes it; only its next call fails.
void finished_then_closed() {
  auto comm = connect();
  if (!comm) return failed("finished_then_closed: connect: " + comm.error().message());
  check::rank = comm->rank();
  const int last = comm->size() - 1;
  std::vector<float> v(1000, 1.0f), got(1000, 0.0f);
  if (comm->rank() == last) {
    if (auto r = comm->send(std::span<const float>(v), 0); !r) return failed("finished_then_closed: send: " + r.error().message());
    return; // the destructor closes: it tells the others it leaves after 0 collectives and 1 send to rank 0
  }
  if (comm->rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); // rank `last` is in close by now
    if (auto r = comm->recv(std::span<float>(got), last); !r)
      return failed("finished_then_closed: a recv of a send made before its sender closed failed: " + r.error().message());
    if (got != v) return failed("finished_then_closed: the recv returned ok with other data");
  }
  std::vector<float> w(10, 1.0f);
  auto r = comm->all_reduce(std::span<float>(w));
  if (r) return failed("finished_then_closed: an all_reduce without rank " + std::to_string(last) + " returned ok");
  if (!r.error().is(ErrorKind::call_mismatch)) failed("finished_then_closed: the next call: not call_mismatch: " + r.error().message());
  std::printf("rank %d: finished_then_closed: %sthe next call failed as expected: %s\n", comm->rank(),
              comm->rank() == 0 ? "the recv completed; " : "", r.error().message().c_str());
}

void threads() {
  auto comm = connect();
  if (!comm) return failed("threads: connect: " + comm.error().message());
  Communicator& c = *comm;
  check::rank = c.rank();
  std::atomic<bool> stop{false};
  int registered = 0, other = 0;
  std::thread side([&] { // registrations made and released while the other thread's collectives run
    std::vector<float> mine(1 << 14, 2.0f);
    while (!stop.load()) {
      auto reg = c.register_memory(std::span<const float>(mine));
      if (reg) ++registered;
      else ++other;
    }
  });
  std::vector<float> v(1 << 15, 1.0f);
  for (int i = 0; i < 200; ++i)
    if (auto r = c.all_reduce(std::span<float>(v)); !r) {
      failed("threads: all_reduce " + std::to_string(i) + ": " + r.error().message());
      break;
    }
  stop = true;
  side.join();
  // A call from a second thread while one runs (a 16 MiB all_reduce) is refused, and breaks nothing.
  std::vector<float> big(1 << 22, 1.0f);
  std::atomic<bool> started{false};
  tbverbs::Result<void> second;
  std::thread caller([&] {
    while (!started.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    second = c.barrier();
  });
  started = true;
  auto first = c.all_reduce(std::span<float>(big));
  caller.join();
  if (!first) failed("threads: the 16 MiB all_reduce: " + first.error().message());
  if (second || !second.error().is(ErrorKind::invalid_argument))
    failed("threads: a call from a second thread during a call was not refused with invalid_argument");
  std::printf("rank %d: threads: 200 all_reduces beside %d registrations from another thread (%d errors); a second "
              "thread's call during one: %s\n",
              c.rank(), registered, other, second ? "ok" : second.error().message().c_str());
  if (other != 0) failed("threads: the second thread's registrations failed");
  if (c.broken()) failed("threads: the communicator broke: " + c.broken()->message());
  if (auto r = c.barrier(); !r) failed("threads: a barrier after it: " + r.error().message());
}

int run_rank(const std::string& only) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (only.empty() || only == "threads") threads();
  if (only.empty() || only == "abort_from_thread") abort_from_thread();
  if (only.empty() || only == "closing_rank") closing_rank();
  if (only.empty() || only == "finished_then_closed") finished_then_closed();
  if (check::failures == 0) std::printf("rank %d: every failure was reported as it should\n", check::rank);
  return check::failures == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return check::main(argc, argv, true, [](const std::string& only) { return run_rank(only); });
}

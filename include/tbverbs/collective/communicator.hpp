/// @file collective/communicator.hpp
/// `Communicator`: the collectives a program calls: all_reduce (sum, prod, min, max, avg),
/// all_gather, reduce_scatter, broadcast, reduce, gather, scatter, all_to_all, send, recv and
/// barrier over typed spans, every call a
/// `Result<void>` bounded by the options' timeout. docs/collectives.md is its guide.
///
/// **Every call is checked against its peers.** Each call carries its identity (the collective,
/// element type, op, element count, root or peer, algorithm, and its number in this rank's
/// sequence of calls: collective/call.hpp); the ranks compare it before anything is written to a
/// user's buffer. Ranks that made different calls fail, every one of them, with
/// ErrorKind::call_mismatch naming both calls, and no user buffer is written.
///
/// **Threads.** A Communicator is used by one thread at a time: its calls run one after the other
/// on every rank, in the same order (a call from a second thread while one runs fails with
/// `invalid_argument` instead of corrupting the streams). abort() may be called from any thread
/// at any time; register_memory and a MemoryRegistration's end are safe from any thread too. Two
/// communicators (on different devices or ports) are independent.
///
/// **Failures.** A lost peer, a dead port, a timeout, a failed work completion or a mismatched
/// call comes back as an Error whose detail names this rank, the collective, the algorithm and the
/// step (and the rank waited for). After any failure inside a collective the communicator is
/// broken: the peers are told (they fail at once), and every later call returns the first error.
/// Destroy it and connect a new one. A wrong argument (sizes that do not match, a root outside the
/// job) is refused before anything is sent and breaks nothing.
#pragma once

#include "../error.hpp"
#include "../result.hpp"
#include "call.hpp"
#include "linkage.hpp"
#include "options.hpp"
#include "types.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

class SideChannel;
class AlignedBuffer;
namespace collective {
class Network;
class RegistrationCache;
struct RegistrationEntry;
struct OpShape;
struct OpMemory;
} // namespace collective

class Communicator;

/// A user buffer registered on every device of a Communicator until this handle goes: collectives
/// on memory inside it send and receive in place (no copy through the scratch slots). When the
/// handle goes, so does the registration (after a call that uses it, if one runs on another
/// thread): memory freed afterwards and mapped again is never mistaken for it. Keep the memory
/// mapped while the handle lives; where the page frames can be read, memory freed under a live
/// handle is detected and staged instead (docs/collectives.md, "Memory"). Move-only; may outlive
/// its Communicator (it then holds nothing).
class MemoryRegistration {
public:
  /// Takes over `o`'s registration; `o` then holds none.
  MemoryRegistration(MemoryRegistration&& o) noexcept
      : cache_(std::move(o.cache_)), entry_(o.entry_), data_(o.data_), bytes_(o.bytes_) {
    o.entry_ = nullptr;
  }
  /// Releases this registration, then takes over `o`'s.
  MemoryRegistration& operator=(MemoryRegistration&& o) noexcept {
    if (this != &o) {
      release();
      cache_ = std::move(o.cache_);
      entry_ = o.entry_;
      data_ = o.data_;
      bytes_ = o.bytes_;
      o.entry_ = nullptr;
    }
    return *this;
  }
  MemoryRegistration(const MemoryRegistration&) = delete;
  MemoryRegistration& operator=(const MemoryRegistration&) = delete;
  ~MemoryRegistration() { release(); }
  /// The registered bytes.
  std::span<const std::byte> bytes() const noexcept { return {data_, bytes_}; }

private:
  friend class Communicator;
  MemoryRegistration(std::weak_ptr<collective::RegistrationCache> c, collective::RegistrationEntry* e,
                     const std::byte* d, std::size_t n) noexcept
      : cache_(std::move(c)), entry_(e), data_(d), bytes_(n) {}
  void release() noexcept;
  std::weak_ptr<collective::RegistrationCache> cache_;
  collective::RegistrationEntry* entry_ = nullptr;
  const std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// A group of ranks connected over RDMA links, and the collectives they run together (see the top
/// of this file). Move-only.
class Communicator {
public:
  /// Connects this rank: the side-channel rendezvous through the coordinator, the devices (a
  /// device file, `cabling`, or discovery from the ports' subnets), every link verified, the first
  /// credits posted. Every rank calls it with matching options. Errors: the failing step's, its
  /// detail naming this rank and the step; the other ranks are told.
  [[nodiscard]] static Result<Communicator> connect(const CommunicatorOptions& options);

  /// Takes over `o`'s connection; `o` is then empty (its calls fail with invalid_argument).
  Communicator(Communicator&& o) noexcept;
  /// Leaves this communicator's job (close()), then takes over `o`'s.
  Communicator& operator=(Communicator&& o) noexcept;
  Communicator(const Communicator&) = delete;            ///< Move-only.
  Communicator& operator=(const Communicator&) = delete; ///< Move-only.
  /// close(), its error dropped.
  ~Communicator();

  /// Leaves the job: tells the peers this rank is leaving (a peer still inside a collective fails
  /// at once with call_mismatch instead of waiting out its timeout), waits for every rank to come
  /// to close (a side-channel barrier bounded by the timeout), then the registrations, links and
  /// connections go. Without the wait, a rank that finished its last collective and exited would
  /// look lost to a rank still completing that collective (its last send completion, say), which
  /// would then fail. Skipped on a broken communicator (the peers were told already). Idempotent;
  /// the destructor calls it, so call it yourself to see its error. After it, every call fails
  /// with invalid_argument.
  Result<void> close();

  /// This rank.
  int rank() const noexcept;
  /// Ranks in the job.
  int size() const noexcept;

  /// out[i] = in[i] combined over every rank with `op`; in place when in.data() == out.data().
  /// Every rank passes the same count. Errors: invalid_argument (sizes differ, or the spans
  /// overlap without being the same); call_mismatch; the collective's (see the top of this file).
  template <CollectiveElement T>
  [[nodiscard]] Result<void> all_reduce(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    if (in.size() != out.size()) return size_error("all_reduce", "in", in.size(), "out", out.size());
    return run(collective::Collective::all_reduce, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// all_reduce from a mutable input span (`std::span<float>` does not deduce `span<const T>`).
  template <CollectiveElement T>
  [[nodiscard]] Result<void> all_reduce(std::span<T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return all_reduce(std::span<const T>(in), out, op);
  }
  /// all_reduce in place.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::sum) {
    return all_reduce(std::span<const T>(buf), buf, op);
  }
  /// out = every rank's `in`, in rank order: out.size() == size() * in.size(). In place when `in`
  /// is this rank's block of `out`.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_gather(std::span<const T> in, std::span<T> out) {
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      return size_error("all_gather", "out", out.size(), "size() x in", in.size() * static_cast<std::size_t>(size()));
    return run(collective::Collective::all_gather, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// all_gather from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_gather(std::span<T> in, std::span<T> out) {
    return all_gather(std::span<const T>(in), out);
  }
  /// reduce_scatter from a mutable input span.
  template <CollectiveElement T>
  [[nodiscard]] Result<void> reduce_scatter(std::span<T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return reduce_scatter(std::span<const T>(in), out, op);
  }
  /// out = this rank's block of `in` combined over every rank: in.size() == size() * out.size().
  template <CollectiveElement T>
  [[nodiscard]] Result<void> reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    if (in.size() != out.size() * static_cast<std::size_t>(size()))
      return size_error("reduce_scatter", "in", in.size(), "size() x out", out.size() * static_cast<std::size_t>(size()));
    return run(collective::Collective::reduce_scatter, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// `buf` on every rank becomes `root`'s.
  template <CollectiveElement T> [[nodiscard]] Result<void> broadcast(std::span<T> buf, int root) {
    return run(collective::Collective::broadcast, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(std::span<const T>(buf)),
               std::as_writable_bytes(buf), root);
  }
  /// Sends `buf` to `peer`, which calls recv() with a buffer of the same size. Over the link to
  /// it (ring neighbours, mesh-cabled ranks); over the side channel where the ranks share no cable
  /// (docs/collectives.md, "send and recv").
  template <CollectiveElement T> [[nodiscard]] Result<void> send(std::span<const T> buf, int peer) {
    return run(collective::Collective::send, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(buf), {}, peer);
  }
  /// send from a mutable span.
  template <CollectiveElement T> [[nodiscard]] Result<void> send(std::span<T> buf, int peer) {
    return send(std::span<const T>(buf), peer);
  }
  /// Receives `peer`'s send() into `buf` (the same size).
  template <CollectiveElement T> [[nodiscard]] Result<void> recv(std::span<T> buf, int peer) {
    return run(collective::Collective::recv, dtype_of_v<T>, ReduceOp::sum, {}, std::as_writable_bytes(buf), peer);
  }
  /// out = `in` combined over every rank with `op`, at `root` only: there out.size() == in.size()
  /// (in place when they are the same); every other rank's `out` is neither checked nor written
  /// (pass an empty span). Runs as all_reduce into the communicator's own buffer on the other
  /// ranks (docs/collectives.md, "reduce, gather, scatter": the bytes it moves and the memory it
  /// holds).
  template <CollectiveElement T>
  [[nodiscard]] Result<void> reduce(std::span<const T> in, std::span<T> out, ReduceOp op, int root) {
    return reduce(std::as_bytes(in), std::as_writable_bytes(out), dtype_of_v<T>, op, root);
  }
  /// reduce from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> reduce(std::span<T> in, std::span<T> out, ReduceOp op, int root) {
    return reduce(std::span<const T>(in), out, op, root);
  }
  /// out = every rank's `in`, in rank order, at `root` only: there out.size() == size() *
  /// in.size() (in place when `in` is the root's block of `out`); every other rank's `out` is
  /// neither checked nor written.
  template <CollectiveElement T> [[nodiscard]] Result<void> gather(std::span<const T> in, std::span<T> out, int root) {
    return gather(std::as_bytes(in), std::as_writable_bytes(out), dtype_of_v<T>, root);
  }
  /// gather from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> gather(std::span<T> in, std::span<T> out, int root) {
    return gather(std::span<const T>(in), out, root);
  }
  /// out = block rank() of `root`'s `in`: in.size() == size() * out.size() at the root (in place
  /// when `out` is the root's block of `in`); every other rank's `in` is neither checked nor read.
  template <CollectiveElement T> [[nodiscard]] Result<void> scatter(std::span<const T> in, std::span<T> out, int root) {
    return scatter(std::as_bytes(in), std::as_writable_bytes(out), dtype_of_v<T>, root);
  }
  /// scatter from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> scatter(std::span<T> in, std::span<T> out, int root) {
    return scatter(std::span<const T>(in), out, root);
  }
  /// Block q of `out` = block rank() of rank q's `in`: equal blocks, in.size() == out.size(), a
  /// multiple of size(); the spans do not overlap.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_to_all(std::span<const T> in, std::span<T> out) {
    return all_to_all(std::as_bytes(in), std::as_writable_bytes(out), dtype_of_v<T>);
  }
  /// all_to_all from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_to_all(std::span<T> in, std::span<T> out) {
    return all_to_all(std::span<const T>(in), out);
  }
  /// Returns once every rank has called barrier(); in band (a one-element all_reduce).
  [[nodiscard]] Result<void> barrier() {
    return run(collective::Collective::barrier, DType::i32, ReduceOp::max, {}, {}, 0);
  }

  /// The collectives on untyped bytes, for backends that dispatch on a DType at run time
  /// (the torch.distributed backend). Sizes are in bytes, whole elements of `t`.
  [[nodiscard]] Result<void> all_reduce(std::span<const std::byte> in, std::span<std::byte> out, DType t, ReduceOp op) {
    if (in.size() != out.size()) return size_error("all_reduce", "in bytes", in.size(), "out bytes", out.size());
    return run(collective::Collective::all_reduce, t, op, in, out, 0);
  }
  /// See all_reduce(std::span<const std::byte>, ...).
  [[nodiscard]] Result<void> all_gather(std::span<const std::byte> in, std::span<std::byte> out, DType t) {
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      return size_error("all_gather", "out bytes", out.size(), "size() x in bytes", in.size() * static_cast<std::size_t>(size()));
    return run(collective::Collective::all_gather, t, ReduceOp::sum, in, out, 0);
  }
  /// See all_reduce(std::span<const std::byte>, ...).
  [[nodiscard]] Result<void> reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType t, ReduceOp op) {
    if (in.size() != out.size() * static_cast<std::size_t>(size()))
      return size_error("reduce_scatter", "in bytes", in.size(), "size() x out bytes", out.size() * static_cast<std::size_t>(size()));
    return run(collective::Collective::reduce_scatter, t, op, in, out, 0);
  }
  /// See all_reduce(std::span<const std::byte>, ...).
  [[nodiscard]] Result<void> broadcast(std::span<std::byte> buf, DType t, int root) {
    return run(collective::Collective::broadcast, t, ReduceOp::sum, buf, buf, root);
  }
  /// See all_reduce(std::span<const std::byte>, ...).
  [[nodiscard]] Result<void> send(std::span<const std::byte> buf, DType t, int peer) {
    return run(collective::Collective::send, t, ReduceOp::sum, buf, {}, peer);
  }
  /// See all_reduce(std::span<const std::byte>, ...).
  [[nodiscard]] Result<void> recv(std::span<std::byte> buf, DType t, int peer) {
    return run(collective::Collective::recv, t, ReduceOp::sum, {}, buf, peer);
  }

  /// See all_reduce(std::span<const std::byte>, ...); `out` is checked at `root` only.
  [[nodiscard]] Result<void> reduce(std::span<const std::byte> in, std::span<std::byte> out, DType t, ReduceOp op, int root) {
    if (rank() == root && in.size() != out.size()) return size_error("reduce", "in bytes", in.size(), "out bytes at the root", out.size());
    return run(collective::Collective::reduce, t, op, in, rank() == root ? out : std::span<std::byte>(), root);
  }
  /// See all_reduce(std::span<const std::byte>, ...); `out` is checked at `root` only.
  [[nodiscard]] Result<void> gather(std::span<const std::byte> in, std::span<std::byte> out, DType t, int root) {
    if (rank() == root && out.size() != in.size() * static_cast<std::size_t>(size()))
      return size_error("gather", "out bytes at the root", out.size(), "size() x in bytes", in.size() * static_cast<std::size_t>(size()));
    return run(collective::Collective::gather, t, ReduceOp::sum, in, rank() == root ? out : std::span<std::byte>(), root);
  }
  /// See all_reduce(std::span<const std::byte>, ...); `in` is checked at `root` only.
  [[nodiscard]] Result<void> scatter(std::span<const std::byte> in, std::span<std::byte> out, DType t, int root) {
    if (rank() == root && in.size() != out.size() * static_cast<std::size_t>(size()))
      return size_error("scatter", "in bytes at the root", in.size(), "size() x out bytes", out.size() * static_cast<std::size_t>(size()));
    return run(collective::Collective::scatter, t, ReduceOp::sum, rank() == root ? in : std::span<const std::byte>(), out, root);
  }
  /// See all_reduce(std::span<const std::byte>, ...).
  [[nodiscard]] Result<void> all_to_all(std::span<const std::byte> in, std::span<std::byte> out, DType t) {
    const std::size_t n = static_cast<std::size_t>(std::max(1, size()));
    if (in.size() != out.size()) return size_error("all_to_all", "in bytes", in.size(), "out bytes", out.size());
    if (in.size() % (n * dtype_size(t)) != 0)
      return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                              "all_to_all: " + std::to_string(in.size() / dtype_size(t)) + " elements do not make " +
                                  std::to_string(n) + " equal blocks"));
    return run(collective::Collective::all_to_all, t, ReduceOp::sum, in, out, 0);
  }

  /// Registers `memory` on every device until the returned handle goes (docs/collectives.md,
  /// "Memory"): collectives on it then move no byte through the scratch slots. Safe from any
  /// thread. Errors: capacity when the devices' MR budget has no room; the registration's
  /// (reg_mr: EFAULT for memory that is not mapped, or not writable) otherwise.
  [[nodiscard]] Result<MemoryRegistration> register_memory(std::span<const std::byte> memory);
  /// Typed register_memory.
  template <CollectiveElement T> [[nodiscard]] Result<MemoryRegistration> register_memory(std::span<const T> memory) {
    return register_memory(std::as_bytes(memory));
  }
  /// Deregisters every registration Memory::registered cached that overlaps the range and no call
  /// uses (memory held by a MemoryRegistration stays: its handle decides). Never needed for
  /// correctness (a cached registration is used only while its pages are provably the same, else
  /// for one call only: docs/collectives.md, "Memory"), but it gives the memory regions back at
  /// once. Returns how many were dropped. Safe from any thread.
  std::size_t forget_memory(const void* data, std::size_t bytes);

  /// The algorithm `kind` runs for `bytes` per rank ("ring", "latency", "mesh"): a rank's
  /// vector (all_reduce, reduce, broadcast), its block (all_gather, gather, reduce_scatter's
  /// output, scatter), its whole input (all_to_all, which gathers every rank's).
  collective::Algorithm algorithm_for(collective::Collective kind, std::size_t bytes) const noexcept;
  /// How all_reduce chooses its algorithm, in one line.
  std::string algorithm_rule() const;
  /// The network (devices, links, scratch layout) for backends and tools; null with one rank.
  const collective::Network* network() const noexcept;
  /// One line per link: the messages it carried each way since set-up.
  std::vector<std::string> traffic() const;
  /// The side channel (a framework's own barrier or bootstrap; the collectives use it only at
  /// set-up and on failure: frames_sent() stays put while they run).
  /// (An empty one, whose calls fail, once moved from or closed.)
  SideChannel& side_channel() noexcept;
  /// Registrations the cache made since connect (the steady state makes none).
  std::uint64_t registrations() const noexcept;
  /// Memory regions the communicator holds for user memory on device `port` (Network::ports order).
  std::size_t user_regions(std::size_t port) const;
  /// The options the communicator runs with (message size and window as set up).
  const CommunicatorOptions& options() const noexcept;
  /// The error that broke the communicator, if one did.
  const std::optional<Error>& broken() const noexcept;

  /// Breaks the communicator from any thread at any time (a framework's watchdog): a call running
  /// now fails within about 20 ms with `cause`, the peers are told `cause` (they fail at once with
  /// it, as peer_aborted), later calls fail with it. Idempotent.
  void abort(const Error& cause) noexcept;

private:
  struct State;      // everything a connected communicator holds (collective/impl/communicator.hpp)
  class Busy;        // the one thread a call may run on
  struct CallMemory; // the buffers and registrations of one call
  struct Lowered;    // a call as a schedule runs it

  static Result<void> size_error(const char* what, const char* a, std::size_t x, const char* b, std::size_t y) {
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            std::string(what) + ": " + a + " has " + std::to_string(x) + " elements, " + b + " " +
                                std::to_string(y)));
  }
  Result<void> run(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                   std::span<std::byte> out, int root_or_peer);
  Result<void> admit(const Busy& busy, collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                     std::span<std::byte> out, int arg);
  Result<Lowered> lower(collective::Collective kind, std::span<const std::byte> in, std::span<std::byte> out, int root);
  Result<void> shape_of(const Lowered& l, DType t, ReduceOp op, collective::OpShape& shape, collective::OpMemory& mem);
  void finish(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in, std::span<std::byte> out,
              const Lowered& l);
  std::optional<std::size_t> link_to(collective::Collective kind, int peer) const;
  Result<std::byte*> own_buffer(std::optional<AlignedBuffer>& b, std::size_t bytes);
  Result<void> validate(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                        std::span<std::byte> out, int arg) const;
  collective::CallIdentity identify(collective::Collective kind, DType t, ReduceOp op, std::size_t in_bytes,
                                    std::size_t out_bytes, int arg, collective::Algorithm algo) const;
  collective::Algorithm algorithm_of(collective::Collective kind, std::size_t in_bytes, std::size_t out_bytes) const;
  Result<void> prepare(collective::Collective kind, collective::Algorithm algo, collective::OpShape& shape,
                       CallMemory& cm);
  Result<void> dispatch(collective::Algorithm algo, const collective::OpShape& shape, const collective::OpMemory& mem,
                        const collective::CallIdentity& id);
  Result<void> run_on_side_channel(const collective::CallIdentity& id, std::span<const std::byte> in,
                                   std::span<std::byte> out);
  Error broke(Error e, const std::string& what);
  static Result<std::unique_ptr<collective::Network>> make_network(State& s, const CommunicatorOptions& o,
                                                                   const std::function<Result<void>(Error, const std::string&)>& context);

  Communicator() = default;
  mutable std::mutex guard_; // guards s_ itself (abort() and register_memory against close() and moves)
  std::unique_ptr<State> s_;
};

TBVERBS_NAMESPACE_END

#if TBVERBS_COLLECTIVE_DEFINITIONS
#include "impl/communicator.hpp"
#endif

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
/// **Requests.** Every collective also comes non-blocking (`all_reduce_async`, ..., the same
/// parameters): a `Request` (collective/request.hpp) to wait on or test, run by the
/// communicator's progress thread in start order while the program computes; send_async and
/// recv_async started before a wait run as one group that two ranks sending to each other
/// complete. docs/collectives.md, "Requests".
///
/// **Split communicators.** split(color, key) and subgroup(ranks) make communicators of some of
/// the ranks that share this one's links (no new queue pair): a family, whose calls between two
/// ranks form one stream and whose first error breaks every member. docs/collectives.md, "Split
/// communicators".
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
#include "request.hpp"
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
struct Subgroup;
struct Transfer;
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

  /// This rank (of this communicator: a split one counts its members from 0); -1 when empty.
  int rank() const noexcept;
  /// Ranks in this communicator (0 for an empty one: moved from, closed, or split with color < 0).
  int size() const noexcept;

  /// A communicator of the ranks that pass the same `color`, ranked by `key`, then by their rank
  /// here; a rank that passes a negative color gets an empty one (size() == 0). Every rank of this
  /// communicator calls it (it is a call like the collectives: an all_gather of the colors and
  /// keys). The new communicator shares this one's links: it creates no queue pair and registers
  /// nothing, so any number may be alive at once (docs/collectives.md, "Split communicators").
  /// Its collectives run as transfers between its members over the family's links (where two
  /// members share no cable, over the side channel), after the members have exchanged their
  /// calls' identities. A communicator and the ones split from it (a family) are one stream
  /// between any two ranks: calls that two ranks share, on any member of the family, are made in
  /// the same order on both (a difference is a call_mismatch, never wrong data). An error in any
  /// of them breaks the whole family, on every rank; the links go when the last of the family
  /// is closed. options(), network(), traffic() and side_channel() are the family's.
  [[nodiscard]] Result<Communicator> split(int color, int key);
  /// A communicator of `ranks` (ranks of this one, each once, this rank among them), ranked in
  /// that order, which only they call: split() for frameworks whose other ranks take no part
  /// (torch's new_group). Nothing is sent: the members that make the same list the same number
  /// of times get the same communicator, and its first call checks it (a member that listed
  /// other ranks fails that call with call_mismatch). Like split(), it shares this family's
  /// links. Errors: invalid_argument (a rank twice or outside 0..size()-1, this rank missing).
  [[nodiscard]] Result<Communicator> subgroup(std::span<const int> ranks);

  // Every collective below comes blocking (`all_reduce`) and non-blocking (`all_reduce_async`,
  // the same parameters, a Request back: see "Requests" at the top of this file), typed and on
  // bytes with a DType (for backends that dispatch at run time; sizes in bytes, whole elements).

  /// out[i] = in[i] combined over every rank with `op`; in place when in.data() == out.data().
  /// Every rank passes the same count. Errors: invalid_argument (sizes differ, or the spans
  /// overlap without being the same); call_mismatch; the collective's (see the top of this file).
  template <CollectiveElement T>
  [[nodiscard]] Result<void> all_reduce(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return call(collective::Collective::all_reduce, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), 0);
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
  /// all_reduce, non-blocking.
  template <CollectiveElement T>
  [[nodiscard]] Result<Request> all_reduce_async(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return call_async(collective::Collective::all_reduce, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// all_reduce_async from a mutable input span.
  template <CollectiveElement T>
  [[nodiscard]] Result<Request> all_reduce_async(std::span<T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return all_reduce_async(std::span<const T>(in), out, op);
  }
  /// all_reduce_async in place.
  template <CollectiveElement T> [[nodiscard]] Result<Request> all_reduce_async(std::span<T> buf, ReduceOp op = ReduceOp::sum) {
    return all_reduce_async(std::span<const T>(buf), buf, op);
  }

  /// out = every rank's `in`, in rank order: out.size() == size() * in.size(). In place when `in`
  /// is this rank's block of `out`.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_gather(std::span<const T> in, std::span<T> out) {
    return call(collective::Collective::all_gather, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// all_gather from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_gather(std::span<T> in, std::span<T> out) {
    return all_gather(std::span<const T>(in), out);
  }
  /// all_gather, non-blocking.
  template <CollectiveElement T> [[nodiscard]] Result<Request> all_gather_async(std::span<const T> in, std::span<T> out) {
    return call_async(collective::Collective::all_gather, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// all_gather_async from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<Request> all_gather_async(std::span<T> in, std::span<T> out) {
    return all_gather_async(std::span<const T>(in), out);
  }

  /// out = this rank's block of `in` combined over every rank: in.size() == size() * out.size().
  template <CollectiveElement T>
  [[nodiscard]] Result<void> reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return call(collective::Collective::reduce_scatter, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// reduce_scatter from a mutable input span.
  template <CollectiveElement T>
  [[nodiscard]] Result<void> reduce_scatter(std::span<T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return reduce_scatter(std::span<const T>(in), out, op);
  }
  /// reduce_scatter, non-blocking.
  template <CollectiveElement T>
  [[nodiscard]] Result<Request> reduce_scatter_async(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return call_async(collective::Collective::reduce_scatter, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// reduce_scatter_async from a mutable input span.
  template <CollectiveElement T>
  [[nodiscard]] Result<Request> reduce_scatter_async(std::span<T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    return reduce_scatter_async(std::span<const T>(in), out, op);
  }

  /// `buf` on every rank becomes `root`'s.
  template <CollectiveElement T> [[nodiscard]] Result<void> broadcast(std::span<T> buf, int root) {
    return call(collective::Collective::broadcast, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(std::span<const T>(buf)), std::as_writable_bytes(buf), root);
  }
  /// broadcast, non-blocking.
  template <CollectiveElement T> [[nodiscard]] Result<Request> broadcast_async(std::span<T> buf, int root) {
    return call_async(collective::Collective::broadcast, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(std::span<const T>(buf)), std::as_writable_bytes(buf), root);
  }

  /// Sends `buf` to `peer`, which calls recv() with a buffer of the same size. Over the link to
  /// it (ring neighbours, mesh-cabled ranks); over the side channel where the ranks share no cable
  /// (docs/collectives.md, "send and recv").
  template <CollectiveElement T> [[nodiscard]] Result<void> send(std::span<const T> buf, int peer) {
    return call(collective::Collective::send, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(buf), {}, peer);
  }
  /// send from a mutable span.
  template <CollectiveElement T> [[nodiscard]] Result<void> send(std::span<T> buf, int peer) {
    return send(std::span<const T>(buf), peer);
  }
  /// send, non-blocking: a pair's send_async and recv_async issued before either is waited on
  /// run as one group (two ranks that both send first complete: "Requests" above).
  template <CollectiveElement T> [[nodiscard]] Result<Request> send_async(std::span<const T> buf, int peer) {
    return call_async(collective::Collective::send, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(buf), {}, peer);
  }
  /// send_async from a mutable span.
  template <CollectiveElement T> [[nodiscard]] Result<Request> send_async(std::span<T> buf, int peer) {
    return send_async(std::span<const T>(buf), peer);
  }
  /// Receives `peer`'s send() into `buf` (the same size).
  template <CollectiveElement T> [[nodiscard]] Result<void> recv(std::span<T> buf, int peer) {
    return call(collective::Collective::recv, dtype_of_v<T>, ReduceOp::sum, {}, std::as_writable_bytes(buf), peer);
  }
  /// recv, non-blocking (see send_async()).
  template <CollectiveElement T> [[nodiscard]] Result<Request> recv_async(std::span<T> buf, int peer) {
    return call_async(collective::Collective::recv, dtype_of_v<T>, ReduceOp::sum, {}, std::as_writable_bytes(buf), peer);
  }

  /// out = `in` combined over every rank with `op`, at `root` only: there out.size() == in.size()
  /// (in place when they are the same); every other rank's `out` is neither checked nor written
  /// (pass an empty span). Runs as all_reduce into the communicator's own buffer on the other
  /// ranks (docs/collectives.md, "reduce, gather, scatter, all_to_all": the bytes it moves and the
  /// memory it holds).
  template <CollectiveElement T>
  [[nodiscard]] Result<void> reduce(std::span<const T> in, std::span<T> out, ReduceOp op, int root) {
    return call(collective::Collective::reduce, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), root);
  }
  /// reduce from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> reduce(std::span<T> in, std::span<T> out, ReduceOp op, int root) {
    return reduce(std::span<const T>(in), out, op, root);
  }
  /// reduce, non-blocking.
  template <CollectiveElement T>
  [[nodiscard]] Result<Request> reduce_async(std::span<const T> in, std::span<T> out, ReduceOp op, int root) {
    return call_async(collective::Collective::reduce, dtype_of_v<T>, op, std::as_bytes(in), std::as_writable_bytes(out), root);
  }
  /// out = every rank's `in`, in rank order, at `root` only: there out.size() == size() *
  /// in.size() (in place when `in` is the root's block of `out`); every other rank's `out` is
  /// neither checked nor written.
  template <CollectiveElement T> [[nodiscard]] Result<void> gather(std::span<const T> in, std::span<T> out, int root) {
    return call(collective::Collective::gather, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), root);
  }
  /// gather from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> gather(std::span<T> in, std::span<T> out, int root) {
    return gather(std::span<const T>(in), out, root);
  }
  /// gather, non-blocking.
  template <CollectiveElement T> [[nodiscard]] Result<Request> gather_async(std::span<const T> in, std::span<T> out, int root) {
    return call_async(collective::Collective::gather, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), root);
  }
  /// out = block rank() of `root`'s `in`: in.size() == size() * out.size() at the root (in place
  /// when `out` is the root's block of `in`); every other rank's `in` is neither checked nor read.
  template <CollectiveElement T> [[nodiscard]] Result<void> scatter(std::span<const T> in, std::span<T> out, int root) {
    return call(collective::Collective::scatter, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), root);
  }
  /// scatter from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> scatter(std::span<T> in, std::span<T> out, int root) {
    return scatter(std::span<const T>(in), out, root);
  }
  /// scatter, non-blocking.
  template <CollectiveElement T> [[nodiscard]] Result<Request> scatter_async(std::span<const T> in, std::span<T> out, int root) {
    return call_async(collective::Collective::scatter, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), root);
  }
  /// Block q of `out` = block rank() of rank q's `in`: equal blocks, in.size() == out.size(), a
  /// multiple of size(); the spans do not overlap.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_to_all(std::span<const T> in, std::span<T> out) {
    return call(collective::Collective::all_to_all, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// all_to_all from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<void> all_to_all(std::span<T> in, std::span<T> out) {
    return all_to_all(std::span<const T>(in), out);
  }
  /// all_to_all, non-blocking.
  template <CollectiveElement T> [[nodiscard]] Result<Request> all_to_all_async(std::span<const T> in, std::span<T> out) {
    return call_async(collective::Collective::all_to_all, dtype_of_v<T>, ReduceOp::sum, std::as_bytes(in), std::as_writable_bytes(out), 0);
  }
  /// all_to_all_async from a mutable input span.
  template <CollectiveElement T> [[nodiscard]] Result<Request> all_to_all_async(std::span<T> in, std::span<T> out) {
    return all_to_all_async(std::span<const T>(in), out);
  }
  /// Returns once every rank has called barrier(); in band (a one-element all_reduce).
  [[nodiscard]] Result<void> barrier() { return call(collective::Collective::barrier, DType::i32, ReduceOp::max, {}, {}, 0); }
  /// barrier, non-blocking.
  [[nodiscard]] Result<Request> barrier_async() { return call_async(collective::Collective::barrier, DType::i32, ReduceOp::max, {}, {}, 0); }

  /// all_reduce on bytes of `t` (see the top of this group).
  [[nodiscard]] Result<void> all_reduce(std::span<const std::byte> in, std::span<std::byte> out, DType t, ReduceOp op) {
    return call(collective::Collective::all_reduce, t, op, in, out, 0);
  }
  /// all_gather on bytes of `t`.
  [[nodiscard]] Result<void> all_gather(std::span<const std::byte> in, std::span<std::byte> out, DType t) {
    return call(collective::Collective::all_gather, t, ReduceOp::sum, in, out, 0);
  }
  /// reduce_scatter on bytes of `t`.
  [[nodiscard]] Result<void> reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType t, ReduceOp op) {
    return call(collective::Collective::reduce_scatter, t, op, in, out, 0);
  }
  /// broadcast on bytes of `t`.
  [[nodiscard]] Result<void> broadcast(std::span<std::byte> buf, DType t, int root) { return call(collective::Collective::broadcast, t, ReduceOp::sum, buf, buf, root); }
  /// send on bytes of `t`.
  [[nodiscard]] Result<void> send(std::span<const std::byte> buf, DType t, int peer) { return call(collective::Collective::send, t, ReduceOp::sum, buf, {}, peer); }
  /// recv on bytes of `t`.
  [[nodiscard]] Result<void> recv(std::span<std::byte> buf, DType t, int peer) { return call(collective::Collective::recv, t, ReduceOp::sum, {}, buf, peer); }
  /// reduce on bytes of `t`; `out` is checked at `root` only.
  [[nodiscard]] Result<void> reduce(std::span<const std::byte> in, std::span<std::byte> out, DType t, ReduceOp op, int root) {
    return call(collective::Collective::reduce, t, op, in, out, root);
  }
  /// gather on bytes of `t`; `out` is checked at `root` only.
  [[nodiscard]] Result<void> gather(std::span<const std::byte> in, std::span<std::byte> out, DType t, int root) {
    return call(collective::Collective::gather, t, ReduceOp::sum, in, out, root);
  }
  /// scatter on bytes of `t`; `in` is checked at `root` only.
  [[nodiscard]] Result<void> scatter(std::span<const std::byte> in, std::span<std::byte> out, DType t, int root) {
    return call(collective::Collective::scatter, t, ReduceOp::sum, in, out, root);
  }
  /// all_to_all on bytes of `t`.
  [[nodiscard]] Result<void> all_to_all(std::span<const std::byte> in, std::span<std::byte> out, DType t) {
    return call(collective::Collective::all_to_all, t, ReduceOp::sum, in, out, 0);
  }
  /// Any collective on bytes, non-blocking: `kind` with the arguments of its blocking form on bytes
  /// (`arg`: the root or peer; unused ones empty or 0). For backends (the torch one).
  [[nodiscard]] Result<Request> start(collective::Collective kind, std::span<const std::byte> in, std::span<std::byte> out, DType t,
                                      ReduceOp op = ReduceOp::sum, int arg = 0) {
    return call_async(kind, t, op, in, out, arg);
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
  class Within;      // the split communicator's call an error happened in

  Result<void> call(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in, std::span<std::byte> out,
                    int arg);
  Result<Request> call_async(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                             std::span<std::byte> out, int arg);
  Result<void> check_sizes(collective::Collective kind, DType t, std::span<const std::byte>& in, std::span<std::byte>& out,
                           int arg) const;
  Result<void> run(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                   std::span<std::byte> out, int root_or_peer);
  Result<void> run_held(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                        std::span<std::byte> out, int root_or_peer, std::uint32_t communicator = 0);
  Result<void> run_split(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                         std::span<std::byte> out, int arg);
  Result<void> agree(const collective::CallIdentity& id);
  Result<void> transfer(std::vector<collective::Transfer>& group, DType t);
  Result<void> reduce_blocks(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                             std::span<std::byte> out, int root);
  Result<void> move_blocks(collective::Collective kind, std::span<const std::byte> in, std::span<std::byte> out, DType t, int root);
  static Communicator view(State& s, std::shared_ptr<collective::Subgroup> group);
  Communicator member(std::vector<int> ranks_here, int me_here, std::uint32_t tag);
  Result<void> admit(const Busy& busy, collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                     std::span<std::byte> out, int arg);
  Result<Lowered> lower(collective::Collective kind, collective::Algorithm algo, std::span<const std::byte> in,
                        std::span<std::byte> out, int root);
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
  std::shared_ptr<State> s_; // the family's (shared with the communicators split from it)
  std::shared_ptr<collective::Subgroup> sub_; // a split communicator's members; null for connect()'s
  bool view_ = false; // the progress thread's handle on a family: closing it only lets go
};

TBVERBS_NAMESPACE_END

#if TBVERBS_COLLECTIVE_DEFINITIONS
#include "impl/communicator.hpp"
#endif

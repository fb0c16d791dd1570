/// @file collective/communicator.hpp
/// `Communicator`: the collectives a program calls: all_reduce (sum, prod, min, max),
/// all_gather, reduce_scatter, broadcast, send, recv and barrier over typed spans, every call a
/// `Result<void>` bounded by the options' timeout. docs/collectives.md is its guide.
///
/// **Threads.** A Communicator is used by one thread at a time: its calls run one after the other
/// on every rank, in the same order (a call from a second thread while one runs fails with
/// `invalid_argument` instead of corrupting the streams). abort() alone may be called from any
/// thread at any time. Two communicators (on different devices or ports) are independent.
///
/// **Failures.** A lost peer, a dead port, a timeout, a failed work completion or a wrong size
/// comes back as an Error whose detail names this rank, the collective, the algorithm and the step
/// (and the rank waited for). After any failure inside a collective the communicator is broken:
/// the peers are told (they fail at once with "rank N aborted: ..."), and every later call returns
/// the first error. Destroy it and connect a new one. A wrong argument (sizes that do not match,
/// a root outside the job) is refused before anything is sent and breaks nothing.
#pragma once

#include "../side_channel.hpp"
#include "../topology.hpp"
#include "choice.hpp"
#include "options.hpp"
#include "registration_cache.hpp"

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

class Communicator;

/// A user buffer registered on every device of a Communicator until this handle goes: collectives
/// on memory inside it send and receive in place (no copy through the scratch slots). Move-only.
/// Must not outlive its Communicator.
class MemoryRegistration {
public:
  /// Takes over `o`'s registration; `o` then holds none.
  MemoryRegistration(MemoryRegistration&& o) noexcept : cache_(o.cache_), data_(o.data_), bytes_(o.bytes_) { o.cache_ = nullptr; }
  /// Releases this registration, then takes over `o`'s.
  MemoryRegistration& operator=(MemoryRegistration&& o) noexcept {
    if (this != &o) {
      release();
      cache_ = o.cache_;
      data_ = o.data_;
      bytes_ = o.bytes_;
      o.cache_ = nullptr;
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
  MemoryRegistration(collective::RegistrationCache* c, const std::byte* d, std::size_t n) noexcept
      : cache_(c), data_(d), bytes_(n) {}
  void release() noexcept {
    if (cache_ != nullptr) cache_->unpin(data_, bytes_);
    cache_ = nullptr;
  }
  collective::RegistrationCache* cache_ = nullptr;
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
  Communicator(Communicator&& o) noexcept = default;
  /// Leaves this communicator's job (close()), then takes over `o`'s.
  Communicator& operator=(Communicator&& o) noexcept {
    if (this != &o) {
      (void)close();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;            ///< Move-only.
  Communicator& operator=(const Communicator&) = delete; ///< Move-only.
  /// close(), its error dropped.
  ~Communicator() { (void)close(); }

  /// Leaves the job: every rank waits for the others (a side-channel barrier bounded by the
  /// timeout), then the links, registrations and connections go. Without the wait, a rank that
  /// finished its last collective and exited would look lost to a rank still completing that
  /// collective (its last send completion, say), which would then fail. Skipped on a broken
  /// communicator (the peers were told already). Idempotent; the destructor calls it, so call it
  /// yourself to see its error. After it, every call fails with invalid_argument.
  Result<void> close();

  /// This rank.
  int rank() const noexcept { return s_ ? s_->opts.rank : -1; }
  /// Ranks in the job.
  int size() const noexcept { return s_ ? s_->opts.size : 0; }

  /// out[i] = in[i] combined over every rank with `op`; in place when in.data() == out.data().
  /// Every rank passes the same count. Errors: invalid_argument (sizes differ, or the spans
  /// overlap without being the same); the collective's (see the top of this file).
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

  /// Registers `memory` on every device until the returned handle goes (docs/collectives.md,
  /// "Memory"): collectives on it then move no byte through the scratch slots. Errors: capacity
  /// when the devices' MR budget has no room; the registration's (reg_mr) otherwise.
  [[nodiscard]] Result<MemoryRegistration> register_memory(std::span<const std::byte> memory) {
    if (auto u = usable("register_memory"); !u) return fail(u.error());
    if (!s_->net) return MemoryRegistration(nullptr, memory.data(), memory.size());
    collective::OpMemory::Buffer b;
    std::string why;
    if (!s_->cache->find(memory.data(), memory.size(), true, b, true, &why))
      return fail(Error::make(Step::reg_mr, ErrorKind::capacity, "register_memory of " + std::to_string(memory.size()) + " bytes: " + why));
    return MemoryRegistration(&*s_->cache, memory.data(), memory.size());
  }
  /// Typed register_memory.
  template <CollectiveElement T> [[nodiscard]] Result<MemoryRegistration> register_memory(std::span<const T> memory) {
    return register_memory(std::as_bytes(memory));
  }
  /// Deregisters every cached registration (Memory::registered) that overlaps the range: call it
  /// before freeing memory a collective used, so new memory at that address is not mistaken for
  /// it. Returns how many were dropped (memory held by a MemoryRegistration stays).
  std::size_t forget_memory(const void* data, std::size_t bytes) {
    return s_ && s_->cache ? s_->cache->forget(data, bytes) : 0;
  }

  /// The algorithm all_reduce runs for `bytes` per rank ("ring", "latency", "mesh").
  collective::Algorithm algorithm_for(collective::Collective kind, std::size_t bytes) const noexcept {
    return s_ && s_->net ? collective::choose(*s_->net, kind, bytes, s_->opts.algorithm) : collective::Algorithm::ring;
  }
  /// How all_reduce chooses its algorithm, in one line.
  std::string algorithm_rule() const {
    return s_ && s_->net ? collective::algorithm_rule(*s_->net, s_->opts.algorithm) : std::string("one rank: local copies");
  }
  /// The network (devices, links, scratch layout) for backends and tools; null with one rank.
  const collective::Network* network() const noexcept { return s_ ? s_->net.get() : nullptr; }
  /// One line per link: the messages it carried each way since set-up.
  std::vector<std::string> traffic() const { return s_ && s_->net ? s_->net->traffic() : std::vector<std::string>{}; }
  /// The side channel (a framework's own barrier or bootstrap; the collectives use it only at
  /// set-up and on failure: frames_sent() stays put while they run).
  /// (An empty one, whose calls fail, once moved from or closed.)
  SideChannel& side_channel() noexcept {
    static SideChannel none;
    return s_ ? s_->sc : none;
  }
  /// Registrations the cache made since connect (the steady state makes none).
  std::uint64_t registrations() const noexcept { return s_ && s_->cache ? s_->cache->registrations() : 0; }
  /// The options the communicator runs with (message size and window as set up).
  const CommunicatorOptions& options() const noexcept {
    static const CommunicatorOptions none;
    return s_ ? s_->opts : none;
  }
  /// The error that broke the communicator, if one did.
  const std::optional<Error>& broken() const noexcept {
    static const std::optional<Error> none;
    return s_ ? s_->broken : none;
  }

  /// Breaks the communicator from any thread (a framework's watchdog): a collective running now
  /// fails within about 20 ms with `cause`, the peers are told, later calls fail. Idempotent.
  void abort(const Error& cause) noexcept {
    if (s_) s_->sc.poison(cause);
  }

private:
  struct State {
    CommunicatorOptions opts;
    SideChannel sc;
    std::optional<Library> lib;
    std::unique_ptr<collective::Network> net;
    std::optional<collective::Engine> engine;
    std::optional<collective::RegistrationCache> cache;
    std::optional<AlignedBuffer> work;   // reduce_scatter's partial sums (registered, pinned)
    std::optional<AlignedBuffer> small;  // barrier's word
    std::optional<Error> broken;
    detail::Atomic<int> busy{0};
    std::string where;
  };

  static Result<void> size_error(const char* what, const char* a, std::size_t x, const char* b, std::size_t y) {
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            std::string(what) + ": " + a + " has " + std::to_string(x) + " elements, " + b + " " +
                                std::to_string(y)));
  }
  Result<void> usable(std::string_view op) const {
    if (!s_)
      return fail(Error::make(Step::collective, ErrorKind::invalid_argument, std::string(op) + " on a moved-from or closed communicator"));
    if (s_->broken) return fail(*s_->broken);
    return {};
  }
  Result<void> run(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                   std::span<std::byte> out, int root_or_peer);
  Result<void> run_on_side_channel(collective::Collective kind, std::span<const std::byte> in, std::span<std::byte> out,
                                   int peer);
  Error broke(Error e, const std::string& what);

  Communicator() = default;
  std::unique_ptr<State> s_;
};

// ---------------------------------------------------------------------------------------------

namespace detail {
/// `e` with this rank's context: "rank 1, all_reduce (...): <its detail>". A peer's abort keeps
/// its own text first ("rank 0 aborted: ... rank 2 ... (its error: peer lost); here: rank 1,
/// ..."): the detail holds 256 characters, and who failed first, and why, is the fact to keep
/// when it is cut (two ranks' contexts nested in one another did not fit).
inline Error in_context(Error e, const std::string& context) {
  const std::string d(e.detail.view());
  if (e.is(ErrorKind::peer_aborted) && !d.empty()) e.with_detail(d + "; here: " + context);
  else e.with_detail(context + (d.empty() ? "" : ": ") + d);
  return e;
}

/// The cabling of `rank` from discovered topology (the ring follows the cables; a fully connected
/// job gets its mesh links), or the error naming the hops without a cable.
inline Result<collective::Cabling> cabling_from_topology(const Topology& topo, int rank, int n,
                                                         const std::function<void(const std::string&)>& log) {
  auto order = topo.ring();
  if (!order) return fail(order.error());
  collective::Cabling c;
  c.order = *order;
  int pos = 0;
  for (int i = 0; i < n; ++i)
    if (c.order[static_cast<std::size_t>(i)] == rank) pos = i;
  const int left = c.order[static_cast<std::size_t>((pos + n - 1) % n)];
  const int right = c.order[static_cast<std::size_t>((pos + 1) % n)];
  auto devices_to = [&](int peer) {
    std::vector<std::string> d;
    for (const auto& cable : topo.between(rank, peer)) {
      d.push_back(topo.end(cable, rank).device);
      if (log) log("cable to rank " + std::to_string(peer) + ": " + topo.describe_cable(cable));
    }
    return d;
  };
  if (n == 2) { // the cables shared out as a device file would: even ones position 0's rightward hop
    const auto cables = devices_to(right);
    std::vector<std::string> even, odd;
    for (std::size_t k = 0; k < cables.size(); ++k) (k % 2 == 0 ? even : odd).push_back(cables[k]);
    if (odd.empty()) odd = even;
    c.right = pos == 0 ? even : odd;
    c.left = pos == 0 ? odd : even;
  } else {
    c.right = devices_to(right);
    c.left = devices_to(left);
    c.mesh.assign(static_cast<std::size_t>(n), std::string());
    for (int p = 0; p < n; ++p)
      if (p != rank && p != left && p != right)
        if (const auto cab = topo.between(rank, p); !cab.empty()) c.mesh[static_cast<std::size_t>(p)] = topo.end(cab.front(), rank).device;
  }
  return c;
}
} // namespace detail

inline Result<void> Communicator::close() {
  if (!s_) return {};
  std::unique_ptr<State> s = std::move(s_);
  Result<void> r;
  if (s->net && !s->broken && s->sc.valid()) {
    r = s->sc.barrier();
    if (!r) {
      r = fail(detail::in_context(r.error(), "rank " + std::to_string(s->opts.rank) + ", close (waiting for every rank to finish)"));
    }
  }
  return r; // the state goes here: registrations, links, devices, then the side channel
}

inline Error Communicator::broke(Error e, const std::string& what) {
  std::string context = "rank " + std::to_string(s_->opts.rank) + ", " + what;
  if (!s_->where.empty()) context += ", " + s_->where;
  e = detail::in_context(std::move(e), context);
  s_->broken = e;
  if (s_->sc.valid()) s_->sc.abort(e); // the other ranks learn who failed, and why
  return e;
}

inline Result<Communicator> Communicator::connect(const CommunicatorOptions& o) {
  auto invalid = [&](const std::string& d) { return fail(Error::make(Step::configure, ErrorKind::invalid_argument, d)); };
  if (o.size < 1 || o.size > 64) return invalid("a communicator has 1 to 64 ranks, not " + std::to_string(o.size));
  if (o.rank < 0 || o.rank >= o.size)
    return invalid("rank " + std::to_string(o.rank) + " is outside the job's " + std::to_string(o.size) + " ranks");
  if (o.message_bytes < frame_bytes || o.message_bytes % frame_bytes != 0)
    return invalid("message_bytes must be a whole number of 4 KiB frames");
  if (o.window < 1) return invalid("window must be at least 1");
  if (o.timeout.count() <= 0) return invalid("timeout must be positive");
  Communicator c;
  c.s_ = std::make_unique<State>();
  State& s = *c.s_;
  s.opts = o;
  auto context = [&](Error e, const std::string& step) {
    e = detail::in_context(std::move(e), "rank " + std::to_string(o.rank) + ", " + step);
    if (s.sc.valid()) s.sc.abort(e);
    return fail(e);
  };
  if (o.size == 1) return c; // one rank: every collective is a local copy
  if (o.coordinator.empty()) return invalid("no coordinator (host:port of rank 0)");

  SideChannelOptions sco;
  sco.rank = o.rank;
  sco.size = o.size;
  sco.coordinator = o.coordinator;
  sco.timeout = o.timeout;
  sco.on_listening = o.on_listening;
  if (o.job_token != 0) {
    sco.job_token = o.job_token;
  } else {
    std::string job_id;
    for (const char* var : {"TBVERBS_JOB_ID", "SLURM_JOB_ID", "MLX_JOB_ID", "TORCHELASTIC_RUN_ID"})
      if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
        job_id = v;
        break;
      }
    sco.job_token = side_channel_token("tbverbs communicator " + o.coordinator + " " + job_id);
  }
  auto sc = SideChannel::connect(sco);
  if (!sc) return context(sc.error(), "the side-channel rendezvous with " + o.coordinator);
  s.sc = std::move(*sc);

  auto lib = Library::load(o.library);
  if (!lib) return context(lib.error(), "loading the verbs library");
  s.lib.emplace(*lib);

  collective::NetworkConfig cfg;
  cfg.rank = o.rank;
  cfg.size = o.size;
  cfg.message_bytes = o.message_bytes;
  cfg.window = o.window;
  cfg.transport = o.transport;
  cfg.timeout = o.timeout;
  cfg.gid_wait = o.gid_wait;
  cfg.log = o.log;
  std::optional<Topology> topo;
  if (o.cabling) {
    cfg.cabling = *o.cabling;
  } else if (!o.device_file.empty()) {
    auto text = detail::read_small_file(o.device_file);
    if (!text) return context(Error::make(Step::configure, ErrorKind::invalid_argument, "cannot read " + o.device_file), "reading the device file");
    std::string problem;
    auto cables = parse_device_file(*text, o.rank, problem);
    if (!cables) return context(Error::make(Step::configure, ErrorKind::invalid_argument, o.device_file + ": " + problem), "reading the device file");
    if (cables->ranks != o.size)
      return context(Error::make(Step::configure, ErrorKind::invalid_argument,
                                 o.device_file + " lists " + std::to_string(cables->ranks) + " ranks, the job has " + std::to_string(o.size)),
                     "reading the device file");
    cfg.cabling.left = cables->left;
    cfg.cabling.right = cables->right;
    cfg.cabling.mesh = cables->others;
  } else {
    auto t = discover_topology(*s.lib, s.sc);
    if (!t) return context(t.error(), "discovering the cables");
    topo.emplace(std::move(*t));
    if (o.log)
      for (const auto& p : topo->problems()) o.log("topology: " + p);
    auto cabling = detail::cabling_from_topology(*topo, o.rank, o.size, o.log);
    if (!cabling) {
      if (o.log)
        for (const auto& cab : topo->cables()) o.log("topology: cable " + topo->describe_cable(cab));
      return context(cabling.error(), "building the ring from the discovered cables");
    }
    cfg.cabling = std::move(*cabling);
    if (o.log) {
      std::string line;
      for (int r : cfg.cabling.order) line += (line.empty() ? "" : " -> ") + std::to_string(r);
      o.log("ring order " + line + " -> " + std::to_string(cfg.cabling.order[0]) + " (discovered, no device file)");
    }
  }
  auto net = collective::Network::create(*s.lib, s.sc, std::move(cfg), s.where);
  if (!net) {
    Error e = net.error();
    std::string step = "setting up the links (" + s.where + ")";
    // Discovered cables whose RTR times out: the subnets pair these ports, the driver says they
    // are not the ends of one cable (the addresses are crossed between cables).
    if (topo && e.step == Step::modify_qp_rtr && e.is(ETIMEDOUT))
      if (auto cab = topo->cable_of(o.rank, e.device.view()))
        step += "; topology: crossed? the subnets pair " + topo->describe_cable(*cab) +
                ", but RTR toward it timed out: give the two ends of each cable one /30 of their own";
    return context(e, step);
  }
  s.net = std::move(*net);
  s.engine.emplace(*s.net);
  s.cache.emplace(*s.net);
  s.opts.message_bytes = s.net->config().message_bytes;
  s.where.clear();
  return c;
}

inline Result<void> Communicator::run_on_side_channel(collective::Collective kind, std::span<const std::byte> in,
                                                      std::span<std::byte> out, int peer) {
  // No cable between the two ranks: the bytes go over their TCP connection, in frames within the
  // side channel's frame cap (64 MiB by default).
  constexpr std::size_t chunk = std::size_t{32} << 20;
  if (kind == collective::Collective::send) {
    for (std::size_t off = 0; off < in.size() || off == 0; off += chunk) {
      if (auto r = s_->sc.send_to(peer, in.subspan(off, std::min(chunk, in.size() - off))); !r) return r;
      if (in.empty()) break;
    }
    return {};
  }
  for (std::size_t off = 0; off < out.size() || off == 0; off += chunk) {
    auto m = s_->sc.recv_from(peer);
    if (!m) return fail(m.error());
    const std::size_t want = std::min(chunk, out.size() - off);
    if (m->size() != want)
      return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                              "rank " + std::to_string(peer) + " sent " + std::to_string(m->size()) + " bytes, recv expected " +
                                  std::to_string(want) + " (the two sizes differ)"));
    if (want > 0) std::memcpy(out.data() + off, m->data(), want);
    if (out.empty()) break;
  }
  return {};
}

inline Result<void> Communicator::run(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                                      std::span<std::byte> out, int arg) {
  using collective::Collective;
  const std::string_view name = collective_name(kind);
  if (auto u = usable(name); !u) return u;
  if (s_->busy.exchange(1) != 0)
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            std::string(name) + " called while another call of this communicator runs (one thread at a time)"));
  struct Release {
    detail::Atomic<int>& b;
    ~Release() { b.store(0); }
  } release{s_->busy};
  const std::size_t es = dtype_size(t);
  const int n = size(), me = rank();
  auto invalid = [&](const std::string& d) {
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument, std::string(name) + ": " + d));
  };
  if (in.size() % es != 0 || out.size() % es != 0) return invalid("sizes are not whole elements of " + std::string(dtype_name(t)));
  const bool overlap = !in.empty() && !out.empty() && in.data() < out.data() + out.size() && out.data() < in.data() + in.size();
  if ((kind == Collective::broadcast) && (arg < 0 || arg >= n)) return invalid("root " + std::to_string(arg) + " is not a rank of 0.." + std::to_string(n - 1));
  if ((kind == Collective::send || kind == Collective::recv) && (arg < 0 || arg >= n || arg == me))
    return invalid("peer " + std::to_string(arg) + " is not another rank of 0.." + std::to_string(n - 1));
  if (kind == Collective::all_reduce && overlap && in.data() != out.data()) return invalid("in and out overlap without being the same");
  if (kind == Collective::all_gather && overlap && in.data() != out.data() + static_cast<std::size_t>(me) * in.size())
    return invalid("in overlaps out without being this rank's block of it");
  if (kind == Collective::reduce_scatter && overlap) return invalid("in and out overlap");

  // One rank: local copies.
  if (!s_->net) {
    if ((kind == Collective::all_reduce || kind == Collective::all_gather || kind == Collective::reduce_scatter) &&
        in.data() != out.data() && !out.empty())
      std::memmove(out.data(), in.data(), out.size());
    return {};
  }

  collective::Network& net = *s_->net;
  collective::OpShape shape;
  shape.kind = kind;
  shape.type = t;
  shape.op = op;
  collective::OpMemory mem;
  mem.input.data = const_cast<std::byte*>(in.data());
  mem.input.bytes = in.size();
  mem.output.data = out.data();
  mem.output.bytes = out.size();
  std::size_t per_rank = 0;
  switch (kind) {
  case Collective::all_reduce:
    shape.count = in.size() / es;
    shape.in_place = in.data() == out.data();
    per_rank = in.size();
    break;
  case Collective::all_gather:
    shape.count = out.size() / es;
    per_rank = in.size();
    break;
  case Collective::reduce_scatter:
    shape.count = in.size() / es;
    per_rank = out.size();
    break;
  case Collective::broadcast:
    shape.count = out.size() / es;
    shape.root = arg;
    break;
  case Collective::send:
  case Collective::recv:
    shape.count = (kind == Collective::send ? in.size() : out.size()) / es;
    shape.peer = arg;
    break;
  case Collective::barrier: {
    if (!s_->small) {
      auto b = AlignedBuffer::allocate(2 * sizeof(std::int32_t));
      if (!b) return fail(b.error());
      s_->small.emplace(std::move(*b));
    }
    shape.kind = Collective::all_reduce;
    shape.count = 1;
    shape.in_place = true;
    mem.input.data = mem.output.data = s_->small->data();
    mem.input.bytes = mem.output.bytes = sizeof(std::int32_t);
    per_rank = sizeof(std::int32_t);
    break;
  }
  }
  if (shape.count == 0 && kind != Collective::barrier) return {}; // nothing to move, on every rank

  // send/recv: the link to the peer (the right cable 0 of the sender is the left cable 0 of the
  // receiver; a mesh link both ways), or the side channel.
  if (kind == Collective::send || kind == Collective::recv) {
    const int peer = arg;
    std::optional<std::size_t> link;
    const bool sending = kind == Collective::send;
    if (sending ? peer == net.right() : peer == net.left()) link = net.first(sending ? collective::Side::right : collective::Side::left);
    else if (sending ? peer == net.left() : peer == net.right()) link = net.first(sending ? collective::Side::left : collective::Side::right);
    else link = net.mesh_link(peer);
    if (!link) {
      s_->where.clear();
      if (auto r = run_on_side_channel(kind, in, out, peer); !r) return fail(broke(r.error(), std::string(name) + " over the side channel (no cable to rank " + std::to_string(peer) + ")"));
      return {};
    }
    shape.link = *link;
  }

  const collective::Algorithm algo = kind == Collective::all_reduce || kind == Collective::all_gather ||
                                             kind == Collective::reduce_scatter
                                         ? collective::choose(net, kind, per_rank, kind == Collective::all_reduce ? s_->opts.algorithm : collective::Algorithm::automatic)
                                         : collective::Algorithm::ring;
  if ((algo == collective::Algorithm::latency || algo == collective::Algorithm::mesh) && per_rank > net.layout().vector_bytes)
    return invalid(std::string("the ") + std::string(collective::algorithm_name(algo)) + " algorithm takes up to " +
                   std::to_string(net.layout().vector_bytes) + " bytes per rank, not " + std::to_string(per_rank));

  // The user memory the algorithm sends from or receives into, registered or staged. The scratch
  // algorithms (latency, mesh) copy their vectors through the gather area and need none.
  const bool may_register = s_->opts.memory == collective::Memory::registered;
  const bool stage_all = s_->opts.memory == collective::Memory::staged;
  std::vector<const std::byte*> pinned;  // unpinned when the call ends
  struct Unpin {
    collective::RegistrationCache& cache;
    const std::byte *a = nullptr, *b = nullptr;
    std::size_t na = 0, nb = 0;
    ~Unpin() {
      if (a) cache.unpin(a, na);
      if (b) cache.unpin(b, nb);
    }
  } unpin{*s_->cache};
  auto lookup = [&](collective::OpMemory::Buffer& b, const std::byte* p, std::size_t bytes, int which) {
    if (stage_all || bytes == 0) return;
    if (s_->cache->find(p, bytes, may_register, b, true)) {
      (which == 0 ? unpin.a : unpin.b) = p;
      (which == 0 ? unpin.na : unpin.nb) = bytes;
    }
  };
  const bool scratch_algo = algo == collective::Algorithm::latency ||
                            (algo == collective::Algorithm::mesh && kind != Collective::reduce_scatter);
  // (mem, not in and out: a barrier runs on its own word.)
  if (!scratch_algo) {
    if (kind == Collective::broadcast || kind == Collective::recv) lookup(mem.output, mem.output.data, mem.output.bytes, 1);
    else if (kind == Collective::send) lookup(mem.input, mem.input.data, mem.input.bytes, 0);
    else if (kind == Collective::all_gather) lookup(mem.output, mem.output.data, mem.output.bytes, 1);
    else {
      if (!shape.in_place && kind != Collective::reduce_scatter) lookup(mem.output, mem.output.data, mem.output.bytes, 1);
      lookup(mem.input, mem.input.data, mem.input.bytes, 0);
      if (shape.in_place) mem.output = mem.input; // the same memory, the same registration
    }
  }
  if (kind == Collective::reduce_scatter && algo == collective::Algorithm::ring) {
    // The partial sums: a work buffer as large as the input, registered once and kept.
    if (!s_->work || s_->work->size() < in.size()) {
      if (s_->work) s_->cache->forget(s_->work->data(), s_->work->size());
      s_->work.reset();
      auto w = AlignedBuffer::allocate(in.size());
      if (!w) return fail(w.error());
      s_->work.emplace(std::move(*w));
    }
    mem.work.data = s_->work->data();
    mem.work.bytes = in.size();
    if (!stage_all) s_->cache->find(mem.work.data, mem.work.bytes, true, mem.work);
  }

  s_->where.clear();
  Result<void> r;
  switch (kind) {
  case Collective::broadcast: {
    collective::ChainSchedule plan(net, shape);
    r = s_->engine->run(plan, mem, s_->where);
    break;
  }
  case Collective::send:
  case Collective::recv: {
    collective::PairSchedule plan(net, shape);
    r = s_->engine->run(plan, mem, s_->where);
    break;
  }
  default:
    if (algo == collective::Algorithm::mesh) {
      collective::MeshSchedule plan(net, shape, mem);
      r = s_->engine->run(plan, mem, s_->where);
    } else if (algo == collective::Algorithm::latency) {
      collective::LatencySchedule plan(net, shape, mem);
      r = s_->engine->run(plan, mem, s_->where);
    } else {
      collective::RingSchedule plan(net, shape, mem);
      r = s_->engine->run(plan, mem, s_->where);
    }
  }
  if (!r) {
    std::string what = std::string(name) + " (" + std::string(collective::algorithm_name(algo)) + ", " +
                       std::to_string(shape.count * es) + " bytes of " + std::string(dtype_name(t)) + ")";
    return fail(broke(r.error(), what));
  }
  return {};
}

TBVERBS_NAMESPACE_END

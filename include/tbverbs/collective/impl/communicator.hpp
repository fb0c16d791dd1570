/// @file collective/impl/communicator.hpp
/// The definitions of Communicator and MemoryRegistration (collective/communicator.hpp): set-up,
/// the checks every call makes, the engine's dispatch, leaving and aborting. Included by
/// collective/communicator.hpp where this translation unit holds the collectives layer's
/// definitions (collective/linkage.hpp).
#pragma once

#include "../../side_channel.hpp"
#include "../../topology.hpp"
#include "../choice.hpp"
#include "../communicator.hpp"
#include "../registration_cache.hpp"
#include "requests.hpp"
#include "subgroup.hpp"

#include <atomic>
#include <cstring>
#include <thread>

TBVERBS_NAMESPACE_BEGIN

/// Everything a connected communicator holds (private to Communicator), shared by the
/// communicators split from it (its family).
struct Communicator::State {
  CommunicatorOptions opts;                             ///< As connected (message size and window as set up).
  SideChannel sc;                                       ///< Rendezvous, failures, leaving.
  std::optional<Library> lib;                           ///< The verbs library (more than one rank).
  std::unique_ptr<collective::Network> net;             ///< Devices, links, scratch memory.
  std::optional<collective::Engine> engine;             ///< Runs every schedule on `net`.
  std::shared_ptr<collective::RegistrationCache> cache; ///< User memory registrations (shared with their handles).
  std::optional<AlignedBuffer> work;                    ///< reduce_scatter's partial sums (the communicator's own).
  std::optional<AlignedBuffer> small;                   ///< barrier's word.
  std::optional<AlignedBuffer> spill;                   ///< A lowered call's result where the caller keeps none (Communicator::lower).
  std::optional<AlignedBuffer> identities;              ///< A split communicator's call identities (Communicator::agree).
  std::optional<AlignedBuffer> blocks;                  ///< A split communicator's received blocks (Communicator::reduce_blocks).
  std::optional<Error> broken;                          ///< The error that broke it, if one did.
  std::atomic<int> busy{0};                             ///< 1 while a call runs (Busy).
  std::uint64_t collectives = 0;                        ///< Collective calls made (the next one's number).
  std::vector<std::uint64_t> sent;                      ///< send calls made, per peer.
  std::vector<std::uint64_t> received;                  ///< recv calls made, per peer.
  std::string where;                                    ///< The set-up step running (Network::create names it), for errors.
  std::string within;                                   ///< The split communicator's call running, for errors (Within).
  std::shared_ptr<collective::RequestQueue> progress;   ///< The progress thread of the family (from the first *_async call).
  std::atomic<int> holders{1};                          ///< Open communicators of the family; the last close() leaves the job.
  collective::Subgroup root;                            ///< connect()'s communicator's split and subgroup counts (its members unused).
  ~State() {
    if (progress) progress->shut_down();
    if (cache) cache->close(); // the registrations go before the devices' protection domains
  }
};

/// The one thread a call may run on: held for the call, refused while another holds it.
class Communicator::Busy {
public:
  /// Takes the communicator unless another thread holds it.
  explicit Busy(State& s) noexcept : s_(s), held_(s.busy.exchange(1) == 0) {}
  ~Busy() {
    if (held_) s_.busy.store(0);
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
  /// False when another thread held it: the call is refused.
  bool held() const noexcept { return held_; }

private:
  State& s_;
  bool held_;
};

/// A call as a schedule runs it: reduce as all_reduce, gather and all_to_all as all_gather,
/// scatter as broadcast (Communicator::lower); the others as they are.
struct Communicator::Lowered {
  collective::Collective kind;    ///< The schedule's collective.
  std::span<const std::byte> in;  ///< What it reads.
  std::span<std::byte> out;       ///< What it writes (the caller's, or the communicator's spill buffer).
  int arg;                        ///< The root or peer.
};

/// The buffers and registrations of one call, released when it ends.
struct Communicator::CallMemory {
  collective::OpMemory mem;                                             ///< What the schedule reads and writes.
  collective::RegistrationCache* cache = nullptr;                       ///< Where `pinned` came from.
  collective::RegistrationCache::Entry* pinned[2] = {nullptr, nullptr}; ///< Registrations used by this call (in, out).
  CallMemory() = default;
  CallMemory(const CallMemory&) = delete;
  CallMemory& operator=(const CallMemory&) = delete;
  ~CallMemory() {
    if (cache != nullptr)
      for (auto* e : pinned) cache->unpin(e);
  }
};

TBVERBS_COLLECTIVE_DEF void MemoryRegistration::release() noexcept {
  if (entry_ != nullptr)
    if (auto c = cache_.lock()) c->release_owned(entry_);
  cache_.reset();
  entry_ = nullptr;
}

// A move takes the handle: the progress thread reaches the state through views of its own
// (Communicator::view), never through the Communicator that made a request.
TBVERBS_COLLECTIVE_DEF Communicator::Communicator(Communicator&& o) noexcept {
  const std::lock_guard<std::mutex> lock(o.guard_);
  s_ = std::move(o.s_);
  sub_ = std::move(o.sub_);
  view_ = o.view_;
}

TBVERBS_COLLECTIVE_DEF Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    (void)close();
    const std::scoped_lock lock(guard_, o.guard_);
    s_ = std::move(o.s_);
    sub_ = std::move(o.sub_);
    view_ = o.view_;
  }
  return *this;
}

TBVERBS_COLLECTIVE_DEF Communicator::~Communicator() { (void)close(); }

TBVERBS_COLLECTIVE_DEF int Communicator::rank() const noexcept { return !s_ ? -1 : sub_ ? sub_->me : s_->opts.rank; }

TBVERBS_COLLECTIVE_DEF int Communicator::size() const noexcept {
  return !s_ ? 0 : sub_ ? static_cast<int>(sub_->members.size()) : s_->opts.size;
}

// A handle on `s` that owns nothing: closing it lets go of nothing (the progress thread runs a
// family's requests through these).
TBVERBS_COLLECTIVE_DEF Communicator Communicator::view(State& s, std::shared_ptr<collective::Subgroup> group) {
  Communicator c;
  c.s_ = std::shared_ptr<State>(std::shared_ptr<State>(), &s);
  c.sub_ = std::move(group);
  c.view_ = true;
  return c;
}

TBVERBS_COLLECTIVE_DEF Result<MemoryRegistration> Communicator::register_memory(std::span<const std::byte> memory) {
  std::shared_ptr<collective::RegistrationCache> cache;
  {
    const std::lock_guard<std::mutex> lock(guard_);
    if (!s_) return fail(Error::make(Step::reg_mr, ErrorKind::invalid_argument, "register_memory on a moved-from or closed communicator"));
    if (s_->broken) return fail(*s_->broken);
    cache = s_->cache;
  }
  if (!cache) return MemoryRegistration({}, nullptr, memory.data(), memory.size()); // one rank: nothing to register
  auto e = cache->add_owned(memory.data(), memory.size());
  if (!e) return fail(e.error());
  return MemoryRegistration(cache, *e, memory.data(), memory.size());
}

TBVERBS_COLLECTIVE_DEF std::size_t Communicator::forget_memory(const void* data, std::size_t bytes) {
  std::shared_ptr<collective::RegistrationCache> cache;
  {
    const std::lock_guard<std::mutex> lock(guard_);
    if (s_) cache = s_->cache;
  }
  return cache ? cache->forget(data, bytes) : 0;
}

TBVERBS_COLLECTIVE_DEF collective::Algorithm Communicator::algorithm_for(collective::Collective kind, std::size_t bytes) const noexcept {
  return s_ && s_->net && !sub_ ? collective::choose(*s_->net, kind, bytes, s_->opts.algorithm) : collective::Algorithm::ring;
}

TBVERBS_COLLECTIVE_DEF std::string Communicator::algorithm_rule() const {
  if (sub_) return "a split communicator: transfers between its members (docs/collectives.md, \"Split communicators\")";
  return s_ && s_->net ? collective::algorithm_rule(*s_->net, s_->opts.algorithm) : std::string("one rank: local copies");
}

TBVERBS_COLLECTIVE_DEF const collective::Network* Communicator::network() const noexcept { return s_ ? s_->net.get() : nullptr; }

TBVERBS_COLLECTIVE_DEF std::vector<std::string> Communicator::traffic() const {
  return s_ && s_->net ? s_->net->traffic() : std::vector<std::string>{};
}

TBVERBS_COLLECTIVE_DEF SideChannel& Communicator::side_channel() noexcept {
  static SideChannel none;
  return s_ ? s_->sc : none;
}

TBVERBS_COLLECTIVE_DEF std::uint64_t Communicator::registrations() const noexcept {
  return s_ && s_->cache ? s_->cache->registrations() : 0;
}

TBVERBS_COLLECTIVE_DEF std::size_t Communicator::user_regions(std::size_t port) const {
  return s_ && s_->cache ? s_->cache->regions(port) : 0;
}

TBVERBS_COLLECTIVE_DEF const CommunicatorOptions& Communicator::options() const noexcept {
  static const CommunicatorOptions none;
  return s_ ? s_->opts : none;
}

TBVERBS_COLLECTIVE_DEF const std::optional<Error>& Communicator::broken() const noexcept {
  static const std::optional<Error> none;
  return s_ ? s_->broken : none;
}


namespace detail {
/// `e` with this rank's context: "rank 1, all_reduce (...), waiting for ...: <its detail>". The
/// detail holds 255 characters. Where the detail is the whole story (two ranks' calls that
/// differ, a peer's abort) it is kept whole and the context is what gets cut: a peer's abort
/// keeps its own text first ("rank 0 aborted: ... (its error: ...); here: rank 1, ..."), a
/// call_mismatch its calls at the end. Any other error keeps the context first (which rank, which
/// step and what it waited for), cut at the end.
inline Error in_context(Error e, const std::string& context) {
  const std::string d(e.detail.view());
  constexpr std::size_t capacity = sizeof(Error{}.detail.data) - 1;
  if (d.empty()) {
    e.with_detail(context);
    return e;
  }
  if (e.is(ErrorKind::peer_aborted)) {
    e.with_detail(d + "; here: " + context);
    return e;
  }
  const std::size_t room = capacity > d.size() + 2 ? capacity - d.size() - 2 : 0;
  if (!e.is(ErrorKind::call_mismatch) || context.size() <= room) e.with_detail(context + ": " + d);
  else if (room >= 8) e.with_detail(context.substr(0, room - 3) + "...: " + d);
  else e.with_detail(d);
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

/// `e`, or, when it is another rank's abort that says the ranks made different calls,
/// call_mismatch: this rank's error is that too (the detail quotes the rank that saw it).
inline Error as_claimed(Error e, const SideChannel& sc) {
  if (e.is(ErrorKind::peer_aborted) && sc.abort_claim() == ErrorKind::call_mismatch) e.kind = ErrorKind::call_mismatch;
  return e;
}

/// The side channel's options from a communicator's: its rank, size, coordinator and timeout, and
/// the job token (the options' own, or one from the job's secret and the coordinator, or, without
/// a secret, from the coordinator and the launcher's job id).
inline SideChannelOptions side_channel_options(const CommunicatorOptions& o) {
  SideChannelOptions sco;
  sco.rank = o.rank;
  sco.size = o.size;
  sco.coordinator = o.coordinator;
  sco.timeout = o.timeout;
  sco.on_listening = o.on_listening;
  if (o.job_token != 0) {
    sco.job_token = o.job_token;
    sco.secret_token = o.job_token_secret;
    return sco;
  }
  if (!o.job_secret.empty()) {
    sco.job_token = job_token("tbverbs communicator " + o.coordinator, o.job_secret);
    sco.secret_token = true;
    return sco;
  }
  std::string job_id;
  for (const char* var : {"TBVERBS_JOB_ID", "SLURM_JOB_ID", "MLX_JOB_ID", "TORCHELASTIC_RUN_ID"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
      job_id = v;
      break;
    }
  sco.job_token = side_channel_token("tbverbs communicator " + o.coordinator + " " + job_id);
  return sco;
}
} // namespace detail

TBVERBS_COLLECTIVE_DEF void Communicator::abort(const Error& cause) noexcept {
  const std::lock_guard<std::mutex> lock(guard_);
  if (!s_ || s_->broken) return;
  // The thread that uses the side channel tells the peers: a call running on another thread at
  // its next check (within about 20 ms), or this one now when no call runs.
  s_->sc.request_abort(cause);
  Busy busy(*s_);
  if (!busy.held()) return;
  (void)s_->sc.check_peers();
  s_->broken = cause;
}

TBVERBS_COLLECTIVE_DEF Result<void> Communicator::close() {
  State* s = nullptr;
  bool last = true;
  {
    const std::lock_guard<std::mutex> lock(guard_);
    if (!s_) return {};
    s = s_.get();
    if (view_) {
      s_.reset();
      return {};
    }
    last = s->holders.fetch_sub(1) == 1;
  }
  if (!last) { // the family stays: this one's requests run first (as do the others')
    if (s->progress && !s->progress->drain())
      abort(Error::make(Step::collective, ErrorKind::timeout,
                        "rank " + std::to_string(s->opts.rank) + " closed a split communicator while its requests made no progress"));
    const std::lock_guard<std::mutex> lock(guard_);
    s_.reset();
    sub_.reset();
    return {};
  }
  if (s->progress) { // the started requests run first (bounded); then the thread ends
    if (!s->progress->drain())
      abort(Error::make(Step::collective, ErrorKind::timeout,
                        "rank " + std::to_string(s->opts.rank) + " closed its communicator while its requests made no progress"));
    (void)s->progress->drain();
    s->progress->shut_down();
  }
  Result<void> r;
  {
    Busy busy(*s);
    if (!busy.held()) { // a call runs on another thread: stop it, and wait until it has
      s->sc.request_abort(Error::make(Step::collective, ErrorKind::invalid_argument,
                                      "rank " + std::to_string(s->opts.rank) + " closed its communicator while a call ran on another thread"));
      const auto until = std::chrono::steady_clock::now() + s->opts.timeout + std::chrono::seconds(1);
      while (s->busy.load() != 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (busy.held() && s->net && !s->broken && s->sc.valid()) {
      s->sc.announce_leaving("after " + std::to_string(s->collectives) + " collective call" + (s->collectives == 1 ? "" : "s"),
                             [s](int peer) {
                               return LeavingCounts{s->collectives, s->sent[static_cast<std::size_t>(peer)],
                                                    s->received[static_cast<std::size_t>(peer)]};
                             });
      r = s->sc.barrier();
      if (!r) r = fail(detail::in_context(r.error(), "rank " + std::to_string(s->opts.rank) + ", close (waiting for every rank to finish)"));
    }
  }
  std::shared_ptr<State> gone;
  {
    const std::lock_guard<std::mutex> lock(guard_);
    gone = std::move(s_);
    sub_.reset();
  }
  return r; // the state goes here: registrations, links, devices, then the side channel
}

TBVERBS_COLLECTIVE_DEF Error Communicator::broke(Error e, const std::string& what) {
  // A failure that another rank's abort explains (a peer that found a mismatch and left: its QPs
  // gone under this rank's sends) is reported as that abort, where the failure started; its
  // frame left before that rank's QPs went, so it is here or about to be.
  if (!e.is(ErrorKind::peer_aborted) && !e.is(ErrorKind::call_mismatch) && s_->sc.valid())
    for (int i = 0; i < 3; ++i) {
      if (auto p = s_->sc.check_peers(); !p && p.error().is(ErrorKind::peer_aborted)) {
        e = p.error();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  e = detail::as_claimed(std::move(e), s_->sc);
  std::string context = "rank " + std::to_string(s_->opts.rank) + ", " + (s_->within.empty() ? "" : s_->within + ": ") + what;
  if (!s_->where.empty()) context += ", " + s_->where;
  e = detail::in_context(std::move(e), context);
  s_->broken = e;
  if (s_->sc.valid()) s_->sc.abort(e); // the other ranks learn who failed, and why
  return e;
}

TBVERBS_COLLECTIVE_DEF Result<std::unique_ptr<collective::Network>>
Communicator::make_network(State& s, const CommunicatorOptions& o,
                           const std::function<Result<void>(Error, const std::string&)>& context) {
  collective::NetworkConfig cfg;
  cfg.rank = o.rank;
  cfg.size = o.size;
  cfg.message_bytes = o.message_bytes;
  cfg.window = o.window;
  cfg.transport = o.transport;
  cfg.timeout = o.timeout;
  cfg.gid_wait = o.gid_wait;
  cfg.log = o.log;
  auto err = [&](Error e, const std::string& step) -> Result<std::unique_ptr<collective::Network>> {
    return fail(context(std::move(e), step).error());
  };
  std::optional<Topology> topo;
  if (o.cabling) {
    cfg.cabling = *o.cabling;
  } else if (!o.device_file.empty()) {
    auto text = detail::read_small_file(o.device_file);
    if (!text) return err(Error::make(Step::configure, ErrorKind::invalid_argument, "cannot read " + o.device_file), "reading the device file");
    std::string problem;
    auto cables = parse_device_file(*text, o.rank, problem);
    if (!cables) return err(Error::make(Step::configure, ErrorKind::invalid_argument, o.device_file + ": " + problem), "reading the device file");
    if (cables->ranks != o.size)
      return err(Error::make(Step::configure, ErrorKind::invalid_argument,
                             o.device_file + " lists " + std::to_string(cables->ranks) + " ranks, the job has " + std::to_string(o.size)),
                 "reading the device file");
    cfg.cabling.left = cables->left;
    cfg.cabling.right = cables->right;
    cfg.cabling.mesh = cables->others;
  } else {
    auto t = discover_topology(*s.lib, s.sc);
    if (!t) return err(t.error(), "discovering the cables");
    topo.emplace(std::move(*t));
    if (o.log)
      for (const auto& p : topo->problems()) o.log("topology: " + p);
    auto cabling = detail::cabling_from_topology(*topo, o.rank, o.size, o.log);
    if (!cabling) {
      if (o.log)
        for (const auto& cab : topo->cables()) o.log("topology: cable " + topo->describe_cable(cab));
      return err(cabling.error(), "building the ring from the discovered cables");
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
    return err(e, step);
  }
  return net;
}

TBVERBS_COLLECTIVE_DEF Result<Communicator> Communicator::connect(const CommunicatorOptions& o) {
  auto invalid = [&](const std::string& d) { return fail(Error::make(Step::configure, ErrorKind::invalid_argument, d)); };
  if (o.size < 1 || o.size > 64) return invalid("a communicator has 1 to 64 ranks, not " + std::to_string(o.size));
  if (o.rank < 0 || o.rank >= o.size)
    return invalid("rank " + std::to_string(o.rank) + " is outside the job's " + std::to_string(o.size) + " ranks");
  if (o.message_bytes < frame_bytes || o.message_bytes % frame_bytes != 0)
    return invalid("message_bytes must be a whole number of 4 KiB frames");
  if (o.window < 1) return invalid("window must be at least 1");
  if (o.timeout.count() <= 0) return invalid("timeout must be positive");
  Communicator c;
  c.s_ = std::make_shared<State>();
  State& s = *c.s_;
  s.opts = o;
  s.sent.assign(static_cast<std::size_t>(o.size), 0);
  s.received.assign(static_cast<std::size_t>(o.size), 0);
  auto context = [&](Error e, const std::string& step) -> Result<void> {
    e = detail::in_context(detail::as_claimed(std::move(e), s.sc), "rank " + std::to_string(o.rank) + ", " + step);
    if (s.sc.valid()) s.sc.abort(e);
    return fail(e);
  };
  if (o.size == 1) return c; // one rank: every collective is a local copy
  if (o.coordinator.empty()) return invalid("no coordinator (host:port of rank 0)");
  auto sc = SideChannel::connect(detail::side_channel_options(o));
  if (!sc) return fail(context(sc.error(), "the side-channel rendezvous with " + o.coordinator).error());
  s.sc = std::move(*sc);
  auto lib = Library::load(o.library);
  if (!lib) return fail(context(lib.error(), "loading the verbs library").error());
  s.lib.emplace(*lib);
  auto net = make_network(s, o, context);
  if (!net) return fail(net.error());
  s.net = std::move(*net);
  s.engine.emplace(*s.net);
  s.cache = std::make_shared<collective::RegistrationCache>(*s.net);
  s.opts.message_bytes = s.net->config().message_bytes;
  s.where.clear();
  return c;
}

// No cable between the two ranks: the call's identity, then the bytes, over their TCP connection,
// in frames within the side channel's frame cap (64 MiB by default). The receiver compares the
// identity before it copies a byte.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::run_on_side_channel(const collective::CallIdentity& id, std::span<const std::byte> in,
                                                      std::span<std::byte> out) {
  constexpr std::size_t chunk = std::size_t{32} << 20;
  const bool sending = id.kind == collective::Collective::send;
  const int peer = sending ? id.to : id.from;
  if (sending) {
    std::array<std::byte, collective::call_header_bytes> header;
    collective::encode(id, header);
    if (auto r = s_->sc.send_to(peer, header); !r) return r;
    for (std::size_t off = 0; off < in.size(); off += chunk)
      if (auto r = s_->sc.send_to(peer, in.subspan(off, std::min(chunk, in.size() - off))); !r) return r;
    return {};
  }
  auto h = s_->sc.recv_from(peer);
  if (!h) return fail(h.error());
  const auto theirs = collective::decode_call(*h);
  if (!theirs || theirs->rank != peer)
    return fail(Error::make(Step::collective, ErrorKind::bad_frame, "rank " + std::to_string(peer) + " sent no call header before its data"));
  if (!collective::same_call(id, *theirs)) return fail(collective::mismatch_error(id, *theirs));
  for (std::size_t off = 0; off < out.size(); off += chunk) {
    auto m = s_->sc.recv_from(peer);
    if (!m) return fail(m.error());
    const std::size_t want = std::min(chunk, out.size() - off);
    if (m->size() != want)
      return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                              "rank " + std::to_string(peer) + " sent " + std::to_string(m->size()) + " bytes, recv expected " +
                                  std::to_string(want) + " although both called the same"));
    std::memcpy(out.data() + off, m->data(), want);
  }
  return {};
}

// Arguments every rank can check alone: refused before anything is sent, breaking nothing.
// (reduce's and gather's `out` and scatter's `in` reach here empty on the ranks that ignore them.)
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::validate(collective::Collective kind, DType t, ReduceOp op,
                                                         std::span<const std::byte> in, std::span<std::byte> out,
                                                         int arg) const {
  using collective::Collective;
  const std::size_t es = dtype_size(t);
  const int n = size(), me = rank();
  auto invalid = [&](const std::string& d) {
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument, std::string(collective::collective_name(kind)) + ": " + d));
  };
  if (in.size() % es != 0 || out.size() % es != 0) return invalid("sizes are not whole elements of " + std::string(dtype_name(t)));
  const bool reduces = kind == Collective::all_reduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
  if (op == ReduceOp::avg && !dtype_is_floating(t) && reduces)
    return invalid("avg of " + std::string(dtype_name(t)) +
                   " elements: avg is defined for floating-point types; for integers, sum and divide as you need");
  const bool rooted = kind == Collective::broadcast || kind == Collective::reduce || kind == Collective::gather || kind == Collective::scatter;
  if (rooted && (arg < 0 || arg >= n)) return invalid("root " + std::to_string(arg) + " is not a rank of 0.." + std::to_string(n - 1));
  if ((kind == Collective::send || kind == Collective::recv) && (arg < 0 || arg >= n || arg == me))
    return invalid("peer " + std::to_string(arg) + " is not another rank of 0.." + std::to_string(n - 1));
  const bool overlap = !in.empty() && !out.empty() && in.data() < out.data() + out.size() && out.data() < in.data() + in.size();
  if (!overlap) return {};
  switch (kind) {
  case Collective::all_reduce:
  case Collective::reduce:
    if (in.data() != out.data()) return invalid("in and out overlap without being the same");
    break;
  case Collective::all_gather:
  case Collective::gather:
    if (in.data() != out.data() + static_cast<std::size_t>(me) * in.size()) return invalid("in overlaps out without being this rank's block of it");
    break;
  case Collective::scatter:
    if (out.data() != in.data() + static_cast<std::size_t>(me) * out.size()) return invalid("out overlaps in without being this rank's block of it");
    break;
  case Collective::reduce_scatter:
  case Collective::all_to_all: return invalid("in and out overlap");
  default: break; // broadcast's one buffer is both
  }
  return {};
}

// The algorithm a call runs: all_reduce, all_gather and reduce_scatter choose by their bytes per
// rank (all_reduce as the options ask), the calls that run on their schedules as they do
// (all_to_all: collective/choice.hpp); the others have one each.
TBVERBS_COLLECTIVE_DEF collective::Algorithm Communicator::algorithm_of(collective::Collective kind, std::size_t in_bytes,
                                                        std::size_t out_bytes) const {
  using collective::Collective;
  switch (collective::schedule_of(kind)) {
  case Collective::all_reduce: return collective::choose(*s_->net, kind, in_bytes, s_->opts.algorithm);
  case Collective::all_gather: return collective::choose(*s_->net, kind, in_bytes, collective::Algorithm::automatic);
  case Collective::reduce_scatter: return collective::choose(*s_->net, kind, out_bytes, collective::Algorithm::automatic);
  case Collective::barrier: return collective::choose(*s_->net, Collective::all_reduce, sizeof(std::int32_t), s_->opts.algorithm);
  default: return collective::Algorithm::ring;
  }
}

TBVERBS_COLLECTIVE_DEF collective::CallIdentity Communicator::identify(collective::Collective kind, DType t, ReduceOp op,
                                                       std::size_t in_bytes, std::size_t out_bytes, int arg,
                                                       collective::Algorithm algo) const {
  using collective::Collective;
  collective::CallIdentity id;
  id.kind = kind;
  id.type = t;
  id.op = kind == Collective::all_reduce || kind == Collective::reduce_scatter || kind == Collective::reduce ? op : ReduceOp::sum;
  id.algorithm = algo;
  const std::size_t es = dtype_size(t), n = static_cast<std::size_t>(size());
  switch (kind) {
  case Collective::reduce_scatter:
  case Collective::recv:
  case Collective::broadcast:
  case Collective::scatter: id.count = out_bytes / es; break;
  case Collective::barrier: id.count = 0; break;
  case Collective::all_to_all: id.count = in_bytes / es / n; break;
  default: id.count = in_bytes / es;
  }
  id.rank = rank();
  id.collective_seq = s_->collectives;
  if (kind == Collective::broadcast || kind == Collective::reduce || kind == Collective::gather || kind == Collective::scatter)
    id.root = arg;
  if (kind == Collective::send) {
    id.from = rank();
    id.to = arg;
    id.pair_seq = s_->sent[static_cast<std::size_t>(arg)];
  }
  if (kind == Collective::recv) {
    id.from = arg;
    id.to = rank();
    id.pair_seq = s_->received[static_cast<std::size_t>(arg)];
  }
  return id;
}

// A buffer the communicator owns, at least `bytes` long: registered like a cached user buffer, so
// a larger one replaces it (the old registration forgotten first).
TBVERBS_COLLECTIVE_DEF Result<std::byte*> Communicator::own_buffer(std::optional<AlignedBuffer>& b, std::size_t bytes) {
  if (!b || b->size() < bytes) {
    if (b && s_->cache) s_->cache->forget(b->data(), b->size());
    b.reset();
    auto fresh = AlignedBuffer::allocate(std::max<std::size_t>(bytes, 1));
    if (!fresh) return fail(fresh.error());
    b.emplace(std::move(*fresh));
  }
  return b->data();
}

// reduce, gather, scatter and all_to_all run on the schedules of all_reduce, all_gather and
// broadcast: the ranks that keep no result (or all_to_all, every rank) receive into the
// communicator's own buffer, which finish() reads from. The call's identity stays the caller's.
// (all_to_all on a mesh has a schedule of its own: MeshSchedule.)
TBVERBS_COLLECTIVE_DEF Result<Communicator::Lowered> Communicator::lower(collective::Collective kind, collective::Algorithm algo,
                                                                       std::span<const std::byte> in, std::span<std::byte> out, int root) {
  using collective::Collective;
  const std::size_t n = static_cast<std::size_t>(size());
  const bool at_root = rank() == root;
  auto spill = [&](std::size_t bytes) -> Result<std::span<std::byte>> {
    auto p = own_buffer(s_->spill, bytes);
    if (!p) return fail(p.error());
    return std::span<std::byte>(*p, bytes);
  };
  Lowered l{collective::schedule_of(kind), in, out, root};
  switch (kind) {
  case Collective::reduce:
  case Collective::gather: {
    if (at_root) return l;
    auto o = spill(kind == Collective::reduce ? in.size() : in.size() * n);
    if (!o) return fail(o.error());
    l.out = *o;
    return l;
  }
  case Collective::all_to_all: {
    if (algo == collective::Algorithm::mesh) { // its own schedule: every block straight to its rank
      l.kind = Collective::all_to_all;
      return l;
    }
    auto o = spill(in.size() * n);
    if (!o) return fail(o.error());
    l.out = *o;
    return l;
  }
  case Collective::scatter: { // the root's `in` is only read (a chain's root receives nothing)
    if (at_root) l.out = std::span<std::byte>(const_cast<std::byte*>(in.data()), in.size());
    else if (auto o = spill(out.size() * n); !o) return fail(o.error());
    else l.out = *o;
    l.in = l.out;
    return l;
  }
  default: return l;
  }
}

// After a lowered call: the caller's result out of the communicator's buffer; avg's division.
TBVERBS_COLLECTIVE_DEF void Communicator::finish(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                                               std::span<std::byte> out, const Lowered& l) {
  using collective::Collective;
  const std::size_t n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
  if (kind == Collective::scatter) {
    const std::byte* mine = l.out.data() + me * out.size();
    if (mine != out.data() && !out.empty()) std::memmove(out.data(), mine, out.size());
  }
  if (kind == Collective::all_to_all && l.kind == Collective::all_gather) { // block q of out: rank q's block `me`
    const std::size_t b = in.size() / n;
    for (std::size_t q = 0; q < n && b > 0; ++q) std::memcpy(out.data() + q * b, l.out.data() + q * in.size() + me * b, b);
  }
  const bool reduced = kind == Collective::all_reduce || kind == Collective::reduce_scatter || kind == Collective::reduce;
  if (op == ReduceOp::avg && reduced && !out.empty()) collective::divide(t, out.data(), out.size() / dtype_size(t), size());
}

// The shape a schedule sees, and the user memory it moves registered or staged. The scratch
// algorithms (latency, mesh) copy their vectors through the gather area and need none.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::prepare(collective::Collective kind, collective::Algorithm algo,
                                          collective::OpShape& shape, CallMemory& cm) {
  using collective::Collective;
  collective::OpMemory& mem = cm.mem;
  const bool may_register = s_->opts.memory == collective::Memory::registered;
  const bool stage_all = s_->opts.memory == collective::Memory::staged;
  cm.cache = s_->cache.get();
  std::size_t k = 0;
  auto lookup = [&](collective::OpMemory::Buffer& b) {
    if (stage_all || b.bytes == 0 || k >= 2) return;
    cm.pinned[k++] = s_->cache->find(b.data, b.bytes, may_register, b);
  };
  const bool reads_input = kind == Collective::reduce_scatter || kind == Collective::all_to_all; // the mesh sends from the input
  const bool scratch_algo = algo == collective::Algorithm::latency || (algo == collective::Algorithm::mesh && !reads_input);
  if (!scratch_algo && kind != Collective::barrier) {
    if (kind == Collective::broadcast || kind == Collective::recv) lookup(mem.output);
    else if (kind == Collective::send) lookup(mem.input);
    else {
      if (!shape.in_place && kind != Collective::reduce_scatter) lookup(mem.output);
      lookup(mem.input);
      if (shape.in_place) mem.output = mem.input; // the same memory, the same registration
    }
  }
  if (kind == Collective::reduce_scatter && algo == collective::Algorithm::ring) {
    // The partial sums: a work buffer as large as the input, the communicator's own, registered
    // as a cached entry (its pages never change while it lives).
    auto w = own_buffer(s_->work, mem.input.bytes);
    if (!w) return fail(w.error());
    mem.work.data = *w;
    mem.work.bytes = mem.input.bytes;
    if (!stage_all) cm.pinned[1] = s_->cache->find(mem.work.data, mem.work.bytes, true, mem.work);
  }
  return {};
}

TBVERBS_COLLECTIVE_DEF Result<void> Communicator::dispatch(collective::Algorithm algo, const collective::OpShape& shape,
                                           const collective::OpMemory& mem, const collective::CallIdentity& id) {
  using collective::Collective;
  collective::Engine& engine = *s_->engine;
  collective::Network& net = *s_->net;
  if (shape.count == 0) {
    collective::EmptySchedule plan;
    return engine.run(plan, mem, id, s_->where);
  }
  switch (shape.kind) {
  case Collective::broadcast: {
    collective::ChainSchedule plan(net, shape);
    return engine.run(plan, mem, id, s_->where);
  }
  case Collective::send:
  case Collective::recv: {
    collective::PairSchedule plan(net, shape);
    return engine.run(plan, mem, id, s_->where);
  }
  default: break;
  }
  if (algo == collective::Algorithm::mesh) {
    collective::MeshSchedule plan(net, shape, mem);
    return engine.run(plan, mem, id, s_->where);
  }
  if (algo == collective::Algorithm::latency) {
    collective::LatencySchedule plan(net, shape, mem);
    return engine.run(plan, mem, id, s_->where);
  }
  collective::RingSchedule plan(net, shape, mem);
  return engine.run(plan, mem, id, s_->where);
}

// The link a send or recv to `peer` goes over (the right cable 0 of the sender is the left cable
// 0 of the receiver; a mesh link both ways), or nullopt: the side channel.
TBVERBS_COLLECTIVE_DEF std::optional<std::size_t> Communicator::link_to(collective::Collective kind, int peer) const {
  const collective::Network& net = *s_->net;
  const bool sending = kind == collective::Collective::send;
  if (sending ? peer == net.right() : peer == net.left()) return net.first(sending ? collective::Side::right : collective::Side::left);
  if (sending ? peer == net.left() : peer == net.right()) return net.first(sending ? collective::Side::left : collective::Side::right);
  return net.mesh_link(peer);
}

// The shape and memory a schedule sees for the (lowered) call `l`; barrier's word is the
// communicator's own.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::shape_of(const Lowered& l, DType t, ReduceOp op, collective::OpShape& shape,
                                                         collective::OpMemory& mem) {
  using collective::Collective;
  shape.kind = l.kind == Collective::barrier ? Collective::all_reduce : l.kind;
  shape.type = t;
  shape.op = op;
  mem.input.data = const_cast<std::byte*>(l.in.data());
  mem.input.bytes = l.in.size();
  mem.output.data = l.out.data();
  mem.output.bytes = l.out.size();
  const std::size_t es = dtype_size(t);
  switch (l.kind) {
  case Collective::all_reduce: shape.count = l.in.size() / es; shape.in_place = l.in.data() == l.out.data(); break;
  case Collective::all_gather: shape.count = l.out.size() / es; break;
  case Collective::reduce_scatter:
  case Collective::all_to_all: shape.count = l.in.size() / es; break;
  case Collective::broadcast: shape.count = l.out.size() / es; shape.root = l.arg; break;
  case Collective::send: shape.count = l.in.size() / es; shape.peer = l.arg; break;
  case Collective::recv: shape.count = l.out.size() / es; shape.peer = l.arg; break;
  case Collective::barrier: {
    auto w = own_buffer(s_->small, 2 * sizeof(std::int32_t));
    if (!w) return fail(w.error());
    shape.count = 1;
    shape.in_place = true;
    mem.input.data = mem.output.data = *w;
    mem.input.bytes = mem.output.bytes = sizeof(std::int32_t);
    break;
  }
  default: break; // lowered already
  }
  return {};
}

// Checks every call makes before it counts: the communicator usable, this thread its only
// caller (`busy`), no abort pending, the arguments.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::admit(const Busy& busy, collective::Collective kind, DType t, ReduceOp op,
                                                      std::span<const std::byte> in, std::span<std::byte> out, int arg) {
  const std::string name(collective::collective_name(kind));
  if (!busy.held())
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            name + " called while another call of this communicator runs (one thread at a time)"));
  if (s_->broken) return fail(*s_->broken);
  if (s_->sc.abort_requested()) // abort() from another thread between calls: the peers are told now
    if (auto r = s_->sc.check_peers(); !r) {
      s_->broken = r.error();
      return r;
    }
  return validate(kind, t, op, in, out, arg);
}

// Sizes every rank checks alone; the buffers a rank ignores (reduce's and gather's `out`, scatter's
// `in`, on the ranks other than the root) become empty here, so nothing reads or writes them.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::check_sizes(collective::Collective kind, DType t, std::span<const std::byte>& in,
                                                            std::span<std::byte>& out, int arg) const {
  using collective::Collective;
  const std::size_t es = dtype_size(t), n = static_cast<std::size_t>(std::max(1, size()));
  const bool at_root = rank() == arg;
  auto mismatch = [&](const char* a, std::size_t x, const char* b, std::size_t y) {
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            std::string(collective::collective_name(kind)) + ": " + a + " has " + std::to_string(x / es) + " elements, " +
                                b + " " + std::to_string(y / es)));
  };
  switch (kind) {
  case Collective::all_reduce: return in.size() == out.size() ? Result<void>() : mismatch("in", in.size(), "out", out.size());
  case Collective::all_gather: return out.size() == n * in.size() ? Result<void>() : mismatch("out", out.size(), "size() x in", n * in.size());
  case Collective::reduce_scatter: return in.size() == n * out.size() ? Result<void>() : mismatch("in", in.size(), "size() x out", n * out.size());
  case Collective::reduce:
    if (!at_root) out = {};
    return !at_root || in.size() == out.size() ? Result<void>() : mismatch("in", in.size(), "out at the root", out.size());
  case Collective::gather:
    if (!at_root) out = {};
    return !at_root || out.size() == n * in.size() ? Result<void>() : mismatch("out at the root", out.size(), "size() x in", n * in.size());
  case Collective::scatter:
    if (!at_root) in = {};
    return !at_root || in.size() == n * out.size() ? Result<void>() : mismatch("in at the root", in.size(), "size() x out", n * out.size());
  case Collective::all_to_all:
    if (in.size() != out.size()) return mismatch("in", in.size(), "out", out.size());
    if (in.size() % (n * es) == 0) return {};
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            "all_to_all: " + std::to_string(in.size() / es) + " elements do not make " + std::to_string(n) + " equal blocks"));
  default: return {};
  }
}

// A blocking call: run here, or, while started requests are queued or running, after them.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::call(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                                                     std::span<std::byte> out, int arg) {
  if (auto sz = check_sizes(kind, t, in, out, arg); !sz) return sz;
  if (s_ && s_->progress) {
    bool idle;
    {
      const std::lock_guard<std::mutex> lock(s_->progress->mu);
      idle = s_->progress->idle();
    }
    if (!idle) {
      auto r = call_async(kind, t, op, in, out, arg);
      if (!r) return fail(r.error());
      return r->wait();
    }
  }
  return run(kind, t, op, in, out, arg);
}

// A started call: checked now (a wrong argument is refused here and breaks nothing), queued for
// the progress thread, which starts with the first.
TBVERBS_COLLECTIVE_DEF Result<Request> Communicator::call_async(collective::Collective kind, DType t, ReduceOp op,
                                                              std::span<const std::byte> in, std::span<std::byte> out, int arg) {
  const std::string name(collective::collective_name(kind));
  if (!s_) return fail(Error::make(Step::collective, ErrorKind::invalid_argument, name + " on a moved-from or closed communicator"));
  if (auto sz = check_sizes(kind, t, in, out, arg); !sz) return fail(sz.error());
  if (auto v = validate(kind, t, op, in, out, arg); !v) return fail(v.error());
  if (!s_->progress) {
    auto p = std::make_shared<collective::RequestQueue>();
    p->timeout = s_->opts.timeout;
    State* st = s_.get();
    p->rank = st->opts.rank;
    p->execute = [st](collective::RequestState& r) { return view(*st, r.group).run(r.kind, r.type, r.op, r.in, r.out, r.arg); };
    p->abort = [st](const Error& e) { view(*st, nullptr).abort(e); };
    p->thread = std::thread([raw = p.get()] { raw->loop(); });
    s_->progress = std::move(p);
  }
  auto r = std::make_shared<collective::RequestState>();
  r->kind = kind;
  r->type = t;
  r->op = op;
  r->in = in;
  r->out = out;
  r->arg = arg;
  r->peer = sub_ && r->point_to_point() ? sub_->members[static_cast<std::size_t>(arg)] : arg;
  r->group = sub_;
  r->progress = s_->progress;
  s_->progress->enqueue(r);
  return Request(std::move(r));
}

TBVERBS_COLLECTIVE_DEF Result<void> Communicator::run(collective::Collective kind, DType t, ReduceOp op, std::span<const std::byte> in,
                                      std::span<std::byte> out, int arg) {
  using collective::Collective;
  const std::string name(collective::collective_name(kind));
  if (!s_) return fail(Error::make(Step::collective, ErrorKind::invalid_argument, name + " on a moved-from or closed communicator"));
  Busy busy(*s_);
  if (auto a = admit(busy, kind, t, op, in, out, arg); !a) return a;
  if (sub_) return run_split(kind, t, op, in, out, arg);
  return run_held(kind, t, op, in, out, arg);
}

// The call on connect()'s communicator, this thread holding it (Busy), the arguments admitted;
// `communicator` names the split communicator a send or recv is a transfer of.
TBVERBS_COLLECTIVE_DEF Result<void> Communicator::run_held(collective::Collective kind, DType t, ReduceOp op,
                                                         std::span<const std::byte> in, std::span<std::byte> out, int arg,
                                                         std::uint32_t communicator) {
  using collective::Collective;
  const std::string name(collective::collective_name(kind));
  if (!s_->net) { // one rank: local copies
    if (!in.empty() && !out.empty() && in.data() != out.data()) std::memmove(out.data(), in.data(), out.size());
    return {};
  }
  const collective::Algorithm algo = algorithm_of(kind, in.size(), out.size());
  auto lowered = lower(kind, algo, in, out, arg);
  if (!lowered) return fail(lowered.error()); // nothing sent, nothing counted
  const Lowered& l = *lowered;
  collective::CallIdentity id = identify(kind, t, op, in.size(), out.size(), arg, algo);
  id.communicator = communicator;
  const std::size_t per_rank = l.kind == Collective::reduce_scatter ? l.out.size()
                               : l.kind == Collective::all_to_all  ? l.in.size() / static_cast<std::size_t>(size()) // a block
                                                                   : l.in.size();
  if ((algo == collective::Algorithm::latency || algo == collective::Algorithm::mesh) && per_rank > s_->net->layout().vector_bytes)
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            name + ": the " + std::string(collective::algorithm_name(algo)) + " algorithm takes up to " +
                                std::to_string(s_->net->layout().vector_bytes) + " bytes per rank, not " + std::to_string(per_rank)));
  // From here the call counts: its number is in its identity.
  if (id.point_to_point()) ++(kind == Collective::send ? s_->sent : s_->received)[static_cast<std::size_t>(arg)];
  else ++s_->collectives;
  s_->where.clear();
  auto broken = [&](Error e) { return fail(broke(std::move(e), collective::describe(id) + " (" + std::string(collective::algorithm_name(algo)) + ")")); };
  collective::OpShape shape;
  CallMemory cm;
  if (auto sh = shape_of(l, t, op, shape, cm.mem); !sh) return broken(sh.error());
  if (id.point_to_point()) {
    const auto link = link_to(kind, arg);
    if (!link) {
      if (auto r = run_on_side_channel(id, in, out); !r) return broken(r.error());
      return {};
    }
    shape.link = *link;
  }
  if (shape.count > 0)
    if (auto p = prepare(l.kind, algo, shape, cm); !p) return broken(p.error());
  if (auto r = dispatch(algo, shape, cm.mem, id); !r) return broken(r.error());
  finish(kind, t, op, in, out, l);
  return {};
}

TBVERBS_NAMESPACE_END

#include "split.hpp"

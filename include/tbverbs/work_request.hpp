/// @file work_request.hpp
/// Typed work requests: `SendWr` (SEND, SEND with immediate, RDMA WRITE with or without
/// immediate, RDMA READ, the two atomics; signalled, inline, solicited and fence flags; one or
/// several SGEs), `RecvWr`, and fixed-capacity chains (`SendChain<N>`, `RecvChain<N>`) that
/// QueuePair::post hands to the driver with one doorbell. Nothing here allocates; a SendWr is the
/// raw `ibv_send_wr` plus room for one SGE, built on the stack.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

TBVERBS_NAMESPACE_BEGIN

/// A send-queue operation (values of `enum ibv_wr_opcode`).
enum class SendOp : std::uint8_t {
  rdma_write = 0,           ///< IBV_WR_RDMA_WRITE: write local SGEs to the peer's memory (RC, UC).
  rdma_write_with_imm = 1,  ///< IBV_WR_RDMA_WRITE_WITH_IMM: the write, then a receive completion carrying 32 bits at the peer (RC, UC; consumes a posted receive).
  send = 2,                 ///< IBV_WR_SEND: the two-sided message (every QP type; the only one on Thunderbolt).
  send_with_imm = 3,        ///< IBV_WR_SEND_WITH_IMM: a SEND whose receive completion carries 32 bits.
  rdma_read = 4,            ///< IBV_WR_RDMA_READ: read the peer's memory into local SGEs (RC only).
  atomic_cmp_and_swp = 5,   ///< IBV_WR_ATOMIC_CMP_AND_SWP: 64-bit compare and swap at the peer (RC only).
  atomic_fetch_and_add = 6, ///< IBV_WR_ATOMIC_FETCH_AND_ADD: 64-bit fetch and add at the peer (RC only).
};

/// A set of SendOps (bit `1 << op`): what a queue pair may post.
enum class SendOps : std::uint32_t {
  none = 0,                                            ///< Nothing.
  send = 1u << 2,                                      ///< SEND only (Apple's Thunderbolt driver).
  send_with_imm = 1u << 3,                             ///< SEND with immediate.
  rdma_write = 1u << 0,                                ///< RDMA WRITE.
  rdma_write_with_imm = 1u << 1,                       ///< RDMA WRITE with immediate.
  rdma_read = 1u << 4,                                 ///< RDMA READ.
  atomics = (1u << 5) | (1u << 6),                     ///< Both atomics.
  unreliable_connected = 0b1111u,                      ///< What UC offers: SEND and RDMA WRITE, with or without immediate.
  reliable_connected = 0b1111111u,                     ///< What RC offers: everything.
  datagram = (1u << 2) | (1u << 3),                    ///< What UD offers: SEND with or without immediate.
};
/// Union of two sets.
constexpr SendOps operator|(SendOps a, SendOps b) noexcept {
  return static_cast<SendOps>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
/// Intersection of two sets.
constexpr SendOps operator&(SendOps a, SendOps b) noexcept {
  return static_cast<SendOps>(static_cast<std::uint32_t>(a) & static_cast<std::uint32_t>(b));
}
/// `a` without the operations of `b`.
constexpr SendOps without(SendOps a, SendOps b) noexcept {
  return static_cast<SendOps>(static_cast<std::uint32_t>(a) & ~static_cast<std::uint32_t>(b));
}
/// True when `set` contains `op`.
constexpr bool contains(SendOps set, SendOp op) noexcept {
  return ((static_cast<std::uint32_t>(set) >> static_cast<unsigned>(op)) & 1u) != 0;
}
/// Printable name of a SendOp ("IBV_WR_RDMA_WRITE").
constexpr const char* send_op_name(SendOp op) noexcept {
  switch (op) {
  case SendOp::rdma_write: return "IBV_WR_RDMA_WRITE";
  case SendOp::rdma_write_with_imm: return "IBV_WR_RDMA_WRITE_WITH_IMM";
  case SendOp::send: return "IBV_WR_SEND";
  case SendOp::send_with_imm: return "IBV_WR_SEND_WITH_IMM";
  case SendOp::rdma_read: return "IBV_WR_RDMA_READ";
  case SendOp::atomic_cmp_and_swp: return "IBV_WR_ATOMIC_CMP_AND_SWP";
  case SendOp::atomic_fetch_and_add: return "IBV_WR_ATOMIC_FETCH_AND_ADD";
  }
  return "IBV_WR_UNKNOWN";
}

/// The peer's side of a one-sided operation: an address inside a region it registered with the
/// matching remote right, and that region's rkey (sent over the side channel).
struct RemoteBuffer {
  std::uint64_t addr = 0; ///< Remote virtual address.
  std::uint32_t rkey = 0; ///< The remote region's rkey.
};

namespace detail {
/// 32 bits in network byte order (immediate data travels big-endian, `__be32` in verbs.h).
constexpr std::uint32_t to_network32(std::uint32_t v) noexcept {
  if constexpr (std::endian::native == std::endian::little)
    return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
  else
    return v;
}
} // namespace detail

/// One send work request: exactly the raw `ibv_send_wr`, built by a named factory per operation.
/// Signalled by default. It points at the caller's SGE (or SGE array, `sges(list)`), which must
/// outlive the post (the driver reads SGEs at post time; after `post` returns they may go): as
/// with std::string_view, a temporary SGE is refused at compile time, so
/// `SendWr::send(id, *mr.sge(0, n))` does not compile; name the SGE first.
///
/// Threads: a plain value; copy it, keep it in arrays, build it on any thread. Refusals happen at
/// QueuePair::post, not here: an operation the QP's transport or provider profile does not
/// execute (`unsupported`), inline data above the granted max_inline_data (`capacity`).
class SendWr {
public:
  /// SEND of one buffer.
  static SendWr send(std::uint64_t wr_id, const abi::ibv_sge& sge) noexcept {
    return SendWr(wr_id, sge, abi::IBV_WR_SEND);
  }
  /// SEND with 32 bits of immediate data (`imm`, host byte order; the peer's
  /// WorkCompletion::imm() gives it back in host order).
  static SendWr send_with_imm(std::uint64_t wr_id, const abi::ibv_sge& sge, std::uint32_t imm) noexcept {
    SendWr w(wr_id, sge, abi::IBV_WR_SEND_WITH_IMM);
    w.wr_.imm_data = detail::to_network32(imm);
    return w;
  }
  /// RDMA WRITE of one local buffer to `dst` (the peer's region needs REMOTE_WRITE). No
  /// completion at the peer.
  static SendWr rdma_write(std::uint64_t wr_id, const abi::ibv_sge& sge, RemoteBuffer dst) noexcept {
    SendWr w(wr_id, sge, abi::IBV_WR_RDMA_WRITE);
    w.wr_.wr.rdma.remote_addr = dst.addr;
    w.wr_.wr.rdma.rkey = dst.rkey;
    return w;
  }
  /// RDMA WRITE with immediate: the write, then a receive completion at the peer carrying `imm`
  /// (host order) and consuming one posted receive: NCCL net_ib's completion signal.
  static SendWr rdma_write_with_imm(std::uint64_t wr_id, const abi::ibv_sge& sge, RemoteBuffer dst,
                                    std::uint32_t imm) noexcept {
    SendWr w = rdma_write(wr_id, sge, dst);
    w.wr_.opcode = abi::IBV_WR_RDMA_WRITE_WITH_IMM;
    w.wr_.imm_data = detail::to_network32(imm);
    return w;
  }
  /// RDMA READ of `src` into one local buffer (the peer's region needs REMOTE_READ, the local one
  /// LOCAL_WRITE). RC only.
  static SendWr rdma_read(std::uint64_t wr_id, const abi::ibv_sge& sge, RemoteBuffer src) noexcept {
    SendWr w(wr_id, sge, abi::IBV_WR_RDMA_READ);
    w.wr_.wr.rdma.remote_addr = src.addr;
    w.wr_.wr.rdma.rkey = src.rkey;
    return w;
  }
  /// Atomic 64-bit fetch-and-add at `dst` (8-byte aligned, REMOTE_ATOMIC); the old value lands
  /// in `sge` (8 bytes, LOCAL_WRITE). RC only.
  static SendWr fetch_and_add(std::uint64_t wr_id, const abi::ibv_sge& sge, RemoteBuffer dst,
                              std::uint64_t add) noexcept {
    SendWr w(wr_id, sge, abi::IBV_WR_ATOMIC_FETCH_AND_ADD);
    w.wr_.wr.atomic.remote_addr = dst.addr;
    w.wr_.wr.atomic.rkey = dst.rkey;
    w.wr_.wr.atomic.compare_add = add;
    return w;
  }
  /// Atomic 64-bit compare-and-swap at `dst`: writes `swap` when the value equals `compare`; the
  /// old value lands in `sge` (8 bytes). RC only.
  static SendWr compare_and_swap(std::uint64_t wr_id, const abi::ibv_sge& sge, RemoteBuffer dst,
                                 std::uint64_t compare, std::uint64_t swap) noexcept {
    SendWr w(wr_id, sge, abi::IBV_WR_ATOMIC_CMP_AND_SWP);
    w.wr_.wr.atomic.remote_addr = dst.addr;
    w.wr_.wr.atomic.rkey = dst.rkey;
    w.wr_.wr.atomic.compare_add = compare;
    w.wr_.wr.atomic.swap = swap;
    return w;
  }

  /// Uses the caller's SGEs instead of the one given to the factory (several SGEs per request,
  /// up to the QP's granted max_send_sge; none for a zero-length message). `list` must outlive
  /// the post.
  SendWr& sges(std::span<const abi::ibv_sge> list) noexcept {
    wr_.sg_list = const_cast<abi::ibv_sge*>(list.data()); // verbs.h's pointer is non-const; drivers only read it
    wr_.num_sge = static_cast<int>(list.size());
    return *this;
  }
  /// Asks (or not) for a completion of this request (IBV_SEND_SIGNALED; the default). Apple's
  /// driver completes unsignalled sends too: size the CQ for them.
  SendWr& signaled(bool on = true) noexcept { return flag(abi::IBV_SEND_SIGNALED, on); }
  /// Copies the payload into the work queue at post time (IBV_SEND_INLINE): the buffer may be
  /// reused as soon as post returns and needs no lkey. The total length must fit the QP's granted
  /// max_inline_data (QueuePair::post refuses it otherwise, with `capacity`). Not on Thunderbolt
  /// (undocumented there; the preset asks for 0).
  SendWr& inline_data(bool on = true) noexcept { return flag(abi::IBV_SEND_INLINE, on); }
  /// Raises a solicited event at the peer (IBV_SEND_SOLICITED), for peers that arm with
  /// solicited_only.
  SendWr& solicited(bool on = true) noexcept { return flag(abi::IBV_SEND_SOLICITED, on); }
  /// Waits for earlier RDMA READs and atomics on this QP before this request starts
  /// (IBV_SEND_FENCE).
  SendWr& fence(bool on = true) noexcept { return flag(abi::IBV_SEND_FENCE, on); }

  /// The wr_id.
  std::uint64_t wr_id() const noexcept { return wr_.wr_id; }
  /// The operation.
  SendOp op() const noexcept { return static_cast<SendOp>(wr_.opcode); }
  /// The `ibv_send_flags` bits.
  unsigned flags() const noexcept { return wr_.send_flags; }
  /// The number of SGEs.
  int num_sge() const noexcept { return wr_.num_sge; }
  /// Bytes over all SGEs.
  std::uint64_t length() const noexcept {
    std::uint64_t n = 0;
    for (int i = 0; i < wr_.num_sge; ++i) n += wr_.sg_list[i].length;
    return n;
  }
  /// The raw `ibv_send_wr` (its `next` is set by chains at post time).
  const abi::ibv_send_wr& native() const noexcept { return wr_; }

  // A temporary SGE would dangle in the request: refused at compile time (see the class comment).
  /// Deleted: the SGE must outlive the request.
  static SendWr send(std::uint64_t, abi::ibv_sge&&) = delete;
  /// Deleted: the SGE must outlive the request.
  static SendWr send_with_imm(std::uint64_t, abi::ibv_sge&&, std::uint32_t) = delete;
  /// Deleted: the SGE must outlive the request.
  static SendWr rdma_write(std::uint64_t, abi::ibv_sge&&, RemoteBuffer) = delete;
  /// Deleted: the SGE must outlive the request.
  static SendWr rdma_write_with_imm(std::uint64_t, abi::ibv_sge&&, RemoteBuffer, std::uint32_t) = delete;
  /// Deleted: the SGE must outlive the request.
  static SendWr rdma_read(std::uint64_t, abi::ibv_sge&&, RemoteBuffer) = delete;
  /// Deleted: the SGE must outlive the request.
  static SendWr fetch_and_add(std::uint64_t, abi::ibv_sge&&, RemoteBuffer, std::uint64_t) = delete;
  /// Deleted: the SGE must outlive the request.
  static SendWr compare_and_swap(std::uint64_t, abi::ibv_sge&&, RemoteBuffer, std::uint64_t, std::uint64_t) = delete;

private:
  friend class QueuePair;
  template <class, class, std::size_t> friend class WorkRequestChain;
  SendWr() noexcept = default;
  SendWr(std::uint64_t wr_id, const abi::ibv_sge& sge, abi::ibv_wr_opcode op) noexcept : wr_{} {
    wr_.wr_id = wr_id;
    wr_.sg_list = const_cast<abi::ibv_sge*>(&sge); // drivers only read it
    wr_.num_sge = 1;
    wr_.opcode = op;
    wr_.send_flags = abi::IBV_SEND_SIGNALED;
  }
  SendWr& flag(unsigned bit, bool on) noexcept {
    wr_.send_flags = on ? (wr_.send_flags | bit) : (wr_.send_flags & ~bit);
    return *this;
  }

  abi::ibv_send_wr wr_{};
};
static_assert(sizeof(SendWr) == sizeof(abi::ibv_send_wr) && std::is_trivially_copyable_v<SendWr>);

/// One receive work request: exactly the raw `ibv_recv_wr`: a wr_id and the caller's SGE (or
/// SGEs through `sges(list)`), which must outlive the post (a temporary is refused at compile
/// time, as for SendWr). On Thunderbolt the buffer must span as many 4 KiB frames as the send that
/// lands in it. A plain value.
class RecvWr {
public:
  /// A receive into `sge`.
  RecvWr(std::uint64_t wr_id, const abi::ibv_sge& sge) noexcept : wr_{} {
    wr_.wr_id = wr_id;
    wr_.sg_list = const_cast<abi::ibv_sge*>(&sge); // drivers only read it
    wr_.num_sge = 1;
  }
  /// Deleted: the SGE must outlive the request.
  RecvWr(std::uint64_t, abi::ibv_sge&&) = delete;
  /// A receive with no scatter-gather entry: a credit that an RDMA WRITE with immediate (or a
  /// zero-length send) consumes and completes; its completion carries the immediate, no data.
  explicit RecvWr(std::uint64_t wr_id) noexcept : wr_{} { wr_.wr_id = wr_id; }
  /// Uses the caller's SGEs (up to the QP's granted max_recv_sge); `list` must outlive the post.
  RecvWr& sges(std::span<const abi::ibv_sge> list) noexcept {
    wr_.sg_list = const_cast<abi::ibv_sge*>(list.data()); // drivers only read it
    wr_.num_sge = static_cast<int>(list.size());
    return *this;
  }
  /// The wr_id.
  std::uint64_t wr_id() const noexcept { return wr_.wr_id; }
  /// The raw `ibv_recv_wr`.
  const abi::ibv_recv_wr& native() const noexcept { return wr_; }

private:
  friend class QueuePair;
  template <class, class, std::size_t> friend class WorkRequestChain;
  RecvWr() noexcept = default;
  abi::ibv_recv_wr wr_{};
};
static_assert(sizeof(RecvWr) == sizeof(abi::ibv_recv_wr) && std::is_trivially_copyable_v<RecvWr>);

/// Up to N work requests (`Wr`: SendWr or RecvWr) posted together with one call and one doorbell
/// (QueuePair::post): a window of sends, or of receive credits. Fixed capacity, no allocation. On
/// a failed post the Error says how many of the chain were posted (`posted`) and the wr_id of the
/// first that was not. Not thread-safe; reuse it after clear(). Spelled SendChain<N> and
/// RecvChain<N>.
template <class Wr, class Raw, std::size_t N> class WorkRequestChain {
public:
  static_assert(N > 0, "a chain holds at least one request");
  /// An empty chain.
  WorkRequestChain() noexcept = default;
  /// Not copyable: its requests are linked to one another.
  WorkRequestChain(const WorkRequestChain&) = delete;
  /// Not copyable: its requests are linked to one another.
  WorkRequestChain& operator=(const WorkRequestChain&) = delete;
  ~WorkRequestChain() = default;

  /// Appends a copy of `wr`; false (nothing appended) when the chain is full.
  [[nodiscard]] bool push(const Wr& wr) noexcept {
    if (size_ == N) return false;
    wrs_[size_] = wr;
    wrs_[size_++].wr_.next = nullptr;
    return true;
  }
  /// Requests in the chain.
  std::size_t size() const noexcept { return size_; }
  /// True when empty.
  bool empty() const noexcept { return size_ == 0; }
  /// Capacity.
  static constexpr std::size_t capacity() noexcept { return N; }
  /// Request `i` (i < size()).
  const Wr& operator[](std::size_t i) const noexcept { return wrs_[i]; }
  /// Request `i` (i < size()), to change its flags.
  Wr& operator[](std::size_t i) noexcept { return wrs_[i]; }
  /// Empties the chain.
  void clear() noexcept { size_ = 0; }

private:
  friend class QueuePair;
  // Links the requests (wr.next) and returns the head; null when empty.
  Raw* link() noexcept {
    if (size_ == 0) return nullptr;
    for (std::size_t i = 0; i + 1 < size_; ++i) wrs_[i].wr_.next = &wrs_[i + 1].wr_;
    wrs_[size_ - 1].wr_.next = nullptr;
    return &wrs_[0].wr_;
  }
  void unlink() noexcept {
    for (std::size_t i = 0; i < size_; ++i) wrs_[i].wr_.next = nullptr;
  }
  Wr wrs_[N];
  std::size_t size_ = 0;
};

/// Up to N send work requests posted together (see WorkRequestChain).
template <std::size_t N> using SendChain = WorkRequestChain<SendWr, abi::ibv_send_wr, N>;
/// Up to N receive work requests posted together: the usual way to post a window of receive
/// credits (see WorkRequestChain).
template <std::size_t N> using RecvChain = WorkRequestChain<RecvWr, abi::ibv_recv_wr, N>;

TBVERBS_NAMESPACE_END

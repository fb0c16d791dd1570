// Instruction cost of tbverbs' post/poll path against the same raw calls through the ops
// table. Run under callgrind (run.sh): both loops execute in one process against one fake
// provider, so the only difference between their inclusive costs is the wrapper.
#include "fake_verbs.hpp"

#include <cstdio>
#include <cstdlib>

using namespace tbverbs;

// The raw loop does what correct raw verbs code must do: check post's return value, check
// poll's return value, check every completion's status.
[[gnu::noinline]] std::uint64_t raw_path(abi::ibv_qp* qp, abi::ibv_cq* cq, abi::ibv_sge sge, int iters) {
  std::uint64_t sum = 0;
  abi::ibv_wc wc[4];
  for (int i = 0; i < iters; ++i) {
    abi::ibv_send_wr wr{};
    wr.wr_id = static_cast<std::uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = abi::IBV_WR_SEND;
    wr.send_flags = abi::IBV_SEND_SIGNALED;
    abi::ibv_send_wr* bad = nullptr;
    if (qp->context->ops.post_send(qp, &wr, &bad) != 0) return 0;
    const int n = cq->context->ops.poll_cq(cq, 4, wc);
    if (n < 0) return 0;
    for (int k = 0; k < n; ++k) {
      if (wc[k].status != abi::IBV_WC_SUCCESS) return 0;
      sum += wc[k].wr_id;
    }
  }
  return sum;
}

// send() and the fused poll(out, consume): the status check and the caller's work on each
// completion in one pass, as in the raw loop.
[[gnu::noinline]] std::uint64_t tbverbs_path(QueuePair& qp, CompletionQueue& cq, abi::ibv_sge sge, int iters) {
  std::uint64_t sum = 0;
  WorkCompletion wc[4];
  for (int i = 0; i < iters; ++i) {
    if (!qp.send(static_cast<std::uint64_t>(i), sge)) return 0;
    if (!cq.poll(wc, [&](const WorkCompletion& c) noexcept { sum += c.wr_id(); })) return 0;
  }
  return sum;
}

// poll(out) and then the caller's own loop over the batch: a second pass over the completions
// (reported, not held to the limit: the fused form is what the hot path should use).
[[gnu::noinline]] std::uint64_t span_path(QueuePair& qp, CompletionQueue& cq, abi::ibv_sge sge, int iters) {
  std::uint64_t sum = 0;
  WorkCompletion wc[4];
  for (int i = 0; i < iters; ++i) {
    if (!qp.send(static_cast<std::uint64_t>(i), sge)) return 0;
    auto n = cq.poll(wc);
    if (!n) return 0;
    for (std::size_t k = 0; k < *n; ++k) sum += wc[k].wr_id();
  }
  return sum;
}

// The same loop through the typed work-request builder (work_request.hpp): SendWr::send builds
// the request in place and QueuePair::post checks it, which folds away for a plain SEND.
[[gnu::noinline]] std::uint64_t builder_path(QueuePair& qp, CompletionQueue& cq, abi::ibv_sge sge, int iters) {
  std::uint64_t sum = 0;
  WorkCompletion wc[4];
  for (int i = 0; i < iters; ++i) {
    if (!qp.post(SendWr::send(static_cast<std::uint64_t>(i), sge))) return 0;
    if (!cq.poll(wc, [&](const WorkCompletion& c) noexcept { sum += c.wr_id(); })) return 0;
  }
  return sum;
}

// Two provider models. "empty": post does nothing and poll hands out one completion: the worst
// case for the ratio, showing the wrapper's absolute cost. "ring": the least any real provider
// does (write a work-queue entry, ring a doorbell, later turn a completion entry into an
// ibv_wc), so the ratio reflects what a caller of a real driver pays.
namespace model {
struct Wqe {
  std::uint64_t wr_id, addr;
  std::uint32_t length, lkey, opcode, flags;
};
struct Cqe {
  std::uint64_t wr_id;
  std::uint32_t byte_len, qp_num;
};
inline Wqe sq[256];
inline Cqe cq[256];
inline unsigned sq_head, cq_head, cq_tail;
inline volatile unsigned doorbell;

int empty_post(abi::ibv_qp*, abi::ibv_send_wr*, abi::ibv_send_wr**) { return 0; }
int empty_poll(abi::ibv_cq*, int n, abi::ibv_wc* wc) {
  static std::uint64_t next = 0;
  if (n < 1) return 0;
  wc[0] = abi::ibv_wc{};
  wc[0].wr_id = next++;
  wc[0].status = abi::IBV_WC_SUCCESS;
  return 1;
}
int ring_post(abi::ibv_qp* qp, abi::ibv_send_wr* wr, abi::ibv_send_wr** bad) {
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge != 1) {
      *bad = wr;
      return EINVAL;
    }
    Wqe& w = sq[sq_head++ & 255];
    w = {wr->wr_id, wr->sg_list[0].addr, wr->sg_list[0].length, wr->sg_list[0].lkey,
         static_cast<std::uint32_t>(wr->opcode), wr->send_flags};
    doorbell = sq_head;
    if (wr->send_flags & abi::IBV_SEND_SIGNALED) cq[cq_tail++ & 255] = {w.wr_id, w.length, qp->qp_num};
  }
  return 0;
}
int ring_poll(abi::ibv_cq*, int n, abi::ibv_wc* wc) {
  int k = 0;
  for (; k < n && cq_head != cq_tail; ++k) {
    const Cqe& c = cq[cq_head++ & 255];
    wc[k] = abi::ibv_wc{};
    wc[k].wr_id = c.wr_id;
    wc[k].status = abi::IBV_WC_SUCCESS;
    wc[k].opcode = abi::IBV_WC_SEND;
    wc[k].byte_len = c.byte_len;
    wc[k].qp_num = c.qp_num;
  }
  return k;
}
} // namespace model

// Both loops against one provider model; the names mark them in callgrind's output.
[[gnu::noinline]] bool run_model(const char*, QueuePair& qp, CompletionQueue& cq, abi::ibv_sge sge, int iters) {
  const std::uint64_t a = raw_path(qp.native_handle(), cq.native_handle(), sge, iters);
  const std::uint64_t b = tbverbs_path(qp, cq, sge, iters);
  const std::uint64_t c = builder_path(qp, cq, sge, iters);
  const std::uint64_t d = span_path(qp, cq, sge, iters);
  return a != 0 && b != 0 && c != 0 && d != 0;
}
[[gnu::noinline]] bool empty_model(QueuePair& qp, CompletionQueue& cq, abi::ibv_sge sge, int iters) {
  return run_model("empty", qp, cq, sge, iters);
}
[[gnu::noinline]] bool ring_model(QueuePair& qp, CompletionQueue& cq, abi::ibv_sge sge, int iters) {
  return run_model("ring", qp, cq, sge, iters);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 100000;
  fake::FakeVerbs f;
  auto ctx = Context::open(f.library(), "rdma_en1");
  auto pd = ctx->alloc_pd();
  auto cq = ctx->create_cq(64, false);
  auto sel = ctx->gid_table(1)->first_ipv4_mapped();
  auto prep = QpRecipe::thunderbolt(*sel).prepare(*pd, *cq);
  if (!prep) {
    std::fprintf(stderr, "%s\n", prep.error().message().c_str());
    return 1;
  }
  Endpoint self = prep->endpoint();
  auto qp = std::move(*prep).connect(self);
  if (!qp) {
    std::fprintf(stderr, "%s\n", qp.error().message().c_str());
    return 1;
  }
  static char buf[4096];
  abi::ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), sizeof buf, 1};
  f.ctx.ops.post_send = model::empty_post;
  f.ctx.ops.poll_cq = model::empty_poll;
  const bool empty_ok = empty_model(*qp, *cq, sge, iters);
  f.ctx.ops.post_send = model::ring_post;
  f.ctx.ops.poll_cq = model::ring_poll;
  const bool ring_ok = ring_model(*qp, *cq, sge, iters);
  std::printf("iterations %d: %s\n", iters, empty_ok && ring_ok ? "ok" : "a loop failed");
  return empty_ok && ring_ok ? 0 : 1;
}

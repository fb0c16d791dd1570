// The extended QP API: ibv_create_qp_ex (verbs_context.create_qp_ex) and the ibv_wr_*
// send builders of ibv_qp_ex, which perftest uses by default and rdma-core's Python tests
// exercise. A batch is collected between wr_start and wr_complete and then posted as one
// ibv_send_wr chain through the ordinary data path, so both APIs share every check.
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>

#include "local.hpp"

using namespace emu;

namespace {

EmuQp* qp_of(ibv_qp_ex* x) { return reinterpret_cast<EmuQp*>(x); }
WrBatch& batch_of(ibv_qp_ex* x) { return *qp_of(x)->batch; }

void fail(WrBatch& b, int e) {
  if (!b.error) b.error = e;
}

void wr_start(ibv_qp_ex* x) {
  WrBatch& b = batch_of(x);
  b.wrs.clear();
  b.sges.clear();
  b.inline_bytes.clear();
  b.error = 0;
}

void begin(ibv_qp_ex* x, ibv_wr_opcode op, uint32_t rkey = 0, uint64_t raddr = 0, uint32_t imm = 0) {
  WrBatch& b = batch_of(x);
  WrBatch::Wr w{};
  w.wr.wr_id = x->wr_id;
  w.wr.send_flags = x->wr_flags;
  w.wr.opcode = op;
  w.wr.imm_data = imm;
  w.wr.wr.rdma.remote_addr = raddr;
  w.wr.wr.rdma.rkey = rkey;
  w.inline_at = -1;
  b.wrs.push_back(w);
}

void wr_send(ibv_qp_ex* x) { begin(x, IBV_WR_SEND); }
void wr_send_imm(ibv_qp_ex* x, __be32 imm) { begin(x, IBV_WR_SEND_WITH_IMM, 0, 0, imm); }
void wr_rdma_write(ibv_qp_ex* x, uint32_t rkey, uint64_t raddr) { begin(x, IBV_WR_RDMA_WRITE, rkey, raddr); }
void wr_rdma_write_imm(ibv_qp_ex* x, uint32_t rkey, uint64_t raddr, __be32 imm) {
  begin(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
}
void wr_rdma_read(ibv_qp_ex* x, uint32_t rkey, uint64_t raddr) { begin(x, IBV_WR_RDMA_READ, rkey, raddr); }
void atomic(ibv_qp_ex* x, ibv_wr_opcode op, uint32_t rkey, uint64_t raddr, uint64_t compare_add, uint64_t swap) {
  begin(x, op);
  ibv_send_wr& w = batch_of(x).wrs.back().wr;
  w.wr.atomic.remote_addr = raddr;  // the atomic member of the union has its own layout
  w.wr.atomic.rkey = rkey;
  w.wr.atomic.compare_add = compare_add;
  w.wr.atomic.swap = swap;
}
void wr_atomic_cmp_swp(ibv_qp_ex* x, uint32_t rkey, uint64_t raddr, uint64_t compare, uint64_t swap) {
  atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, raddr, compare, swap);
}
void wr_atomic_fetch_add(ibv_qp_ex* x, uint32_t rkey, uint64_t raddr, uint64_t add) {
  atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, raddr, add, 0);
}

// The WR the setters apply to: the last one begun. A setter before any opcode is a caller
// error, reported by wr_complete.
WrBatch::Wr* current(ibv_qp_ex* x) {
  WrBatch& b = batch_of(x);
  if (b.wrs.empty()) {
    fail(b, EINVAL);
    return nullptr;
  }
  return &b.wrs.back();
}

void wr_set_sge_list(ibv_qp_ex* x, size_t n, const ibv_sge* list) {
  WrBatch& b = batch_of(x);
  WrBatch::Wr* w = current(x);
  if (!w) return;
  if (n > qp_of(x)->cap.max_send_sge) return fail(b, EINVAL);
  w->first_sge = static_cast<uint32_t>(b.sges.size());
  w->num_sge = static_cast<uint32_t>(n);
  b.sges.insert(b.sges.end(), list, list + n);
}

void wr_set_sge(ibv_qp_ex* x, uint32_t lkey, uint64_t addr, uint32_t length) {
  ibv_sge g{addr, length, lkey};
  wr_set_sge_list(x, 1, &g);
}

void wr_set_inline_data_list(ibv_qp_ex* x, size_t n, const ibv_data_buf* list) {
  WrBatch& b = batch_of(x);
  WrBatch::Wr* w = current(x);
  if (!w) return;
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += list[i].length;
  if (total > qp_of(x)->cap.max_inline_data) return fail(b, EINVAL);  // as ibv_post_send refuses it
  w->inline_at = static_cast<int64_t>(b.inline_bytes.size());
  w->inline_len = static_cast<uint32_t>(total);
  w->wr.send_flags |= IBV_SEND_INLINE;
  for (size_t i = 0; i < n; ++i) {
    const char* p = static_cast<const char*>(list[i].addr);
    b.inline_bytes.insert(b.inline_bytes.end(), p, p + list[i].length);
  }
}

void wr_set_inline_data(ibv_qp_ex* x, void* addr, size_t length) {
  ibv_data_buf d{addr, length};
  wr_set_inline_data_list(x, 1, &d);
}

int wr_complete(ibv_qp_ex* x) {
  WrBatch& b = batch_of(x);
  if (b.error || b.wrs.empty()) {
    int e = b.error;
    wr_start(x);
    return e;
  }
  // Inline payloads become one SGE each, appended before any pointer into `sges` is taken.
  for (WrBatch::Wr& w : b.wrs) {
    if (w.inline_at < 0) continue;
    w.first_sge = static_cast<uint32_t>(b.sges.size());
    w.num_sge = 1;
    b.sges.push_back(ibv_sge{reinterpret_cast<uint64_t>(b.inline_bytes.data() + w.inline_at), w.inline_len, 0});
  }
  b.chain.resize(b.wrs.size());
  for (size_t i = 0; i < b.wrs.size(); ++i) {
    ibv_send_wr& c = b.chain[i];
    c = b.wrs[i].wr;
    c.sg_list = b.wrs[i].num_sge ? b.sges.data() + b.wrs[i].first_sge : nullptr;
    c.num_sge = static_cast<int>(b.wrs[i].num_sge);
    c.next = i + 1 < b.wrs.size() ? &b.chain[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  int e = emu_post_send(&qp_of(x)->qp, b.chain.data(), &bad);
  wr_start(x);
  return e;
}

void wr_abort(ibv_qp_ex* x) { wr_start(x); }

// What the data path carries per transport (see emu_post_send): SEND and WRITE with or
// without immediate on RC and UC, RDMA READ and the two atomics on RC only (IB spec; the
// Thunderbolt profile refuses the extended API and RC altogether). Memory windows, UD
// addressing and TSO are not modelled, so asking for them is refused at creation.
uint64_t supported_send_ops(ibv_qp_type t) {
  uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                 IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  if (t == IBV_QPT_RC)
    ops |= IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  return ops;
}

// The extended CQ: start_poll/next_poll take one completion through the ordinary poll path
// into EmuCq::cur, whose fields the read_* callbacks return; end_poll has nothing to release.
EmuCq* cq_of(ibv_cq_ex* x) { return reinterpret_cast<EmuCq*>(x); }

int take_one(ibv_cq_ex* x) {
  EmuCq* c = cq_of(x);
  int n = emu_poll_cq(&c->cq, 1, &c->cur);
  if (n < 0) return -n;
  if (n == 0) return ENOENT;
  x->status = c->cur.status;
  x->wr_id = c->cur.wr_id;
  return 0;
}
int cq_start_poll(ibv_cq_ex* x, ibv_poll_cq_attr* attr) { return attr && attr->comp_mask ? EINVAL : take_one(x); }
int cq_next_poll(ibv_cq_ex* x) { return take_one(x); }
void cq_end_poll(ibv_cq_ex*) {}
ibv_wc_opcode cq_read_opcode(ibv_cq_ex* x) { return cq_of(x)->cur.opcode; }
uint32_t cq_read_vendor_err(ibv_cq_ex* x) { return cq_of(x)->cur.vendor_err; }
uint32_t cq_read_byte_len(ibv_cq_ex* x) { return cq_of(x)->cur.byte_len; }
__be32 cq_read_imm_data(ibv_cq_ex* x) { return cq_of(x)->cur.imm_data; }
uint32_t cq_read_qp_num(ibv_cq_ex* x) { return cq_of(x)->cur.qp_num; }
uint32_t cq_read_src_qp(ibv_cq_ex* x) { return cq_of(x)->cur.src_qp; }
unsigned int cq_read_wc_flags(ibv_cq_ex* x) { return cq_of(x)->cur.wc_flags; }
uint32_t cq_read_slid(ibv_cq_ex* x) { return cq_of(x)->cur.slid; }
uint8_t cq_read_sl(ibv_cq_ex* x) { return cq_of(x)->cur.sl; }
uint8_t cq_read_dlid_path_bits(ibv_cq_ex* x) { return cq_of(x)->cur.dlid_path_bits; }

}  // namespace

namespace emu {

// ibv_create_cq_ex: the fields of ibv_wc (IBV_WC_STANDARD_FLAGS) and the single-threaded hint.
// Timestamps, CVLAN, flow tags, tag matching and a parent domain are not modelled: EOPNOTSUPP,
// which callers take as absence.
ibv_cq_ex* emu_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  if (!context || !attr) {
    errno = EINVAL;
    return nullptr;
  }
  if ((attr->wc_flags & ~static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS)) || (attr->comp_mask & ~IBV_CQ_INIT_ATTR_MASK_FLAGS) ||
      ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~IBV_CREATE_CQ_ATTR_SINGLE_THREADED))) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (attr->cqe > static_cast<uint32_t>(INT32_MAX) || attr->comp_vector > static_cast<uint32_t>(INT32_MAX)) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_cq* cq = ibv_create_cq(context, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                             static_cast<int>(attr->comp_vector));
  if (!cq) return nullptr;
  ibv_cq_ex& x = reinterpret_cast<EmuCq*>(cq)->cqx;
  // The extended fields after ibv_cq's: every callback not set below stays NULL.
  std::memset(reinterpret_cast<char*>(&x) + offsetof(ibv_cq_ex, comp_mask), 0,
              sizeof x - offsetof(ibv_cq_ex, comp_mask));
  x.start_poll = cq_start_poll;
  x.next_poll = cq_next_poll;
  x.end_poll = cq_end_poll;
  x.read_opcode = cq_read_opcode;
  x.read_vendor_err = cq_read_vendor_err;
  x.read_byte_len = cq_read_byte_len;
  x.read_imm_data = cq_read_imm_data;
  x.read_qp_num = cq_read_qp_num;
  x.read_src_qp = cq_read_src_qp;
  x.read_wc_flags = cq_read_wc_flags;
  x.read_slid = cq_read_slid;
  x.read_sl = cq_read_sl;
  x.read_dlid_path_bits = cq_read_dlid_path_bits;
  return &x;
}

// ibv_query_device_ex: rdma-core's inline falls back to ibv_query_device (and leaves every
// extended field 0, phys_port_cnt_ex too) only for a provider without this op. Nothing the
// extended attributes describe is modelled (ODP, TSO, RSS, device memory, timestamps,
// packet pacing), so they stay 0 apart from the port count.
int emu_query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                        size_t attr_size) {
  if (!attr || attr_size < sizeof attr->orig_attr) return EINVAL;
  if (input && input->comp_mask) return EINVAL;
  std::memset(attr, 0, attr_size);
  if (int e = ibv_query_device(context, &attr->orig_attr)) return e;
  if (attr_size >= offsetof(ibv_device_attr_ex, phys_port_cnt_ex) + sizeof attr->phys_port_cnt_ex)
    attr->phys_port_cnt_ex = attr->orig_attr.phys_port_cnt;
  return 0;
}

ibv_qp* emu_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  constexpr uint32_t kKnown = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  if (!context || !attr || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != context) {
    errno = EINVAL;
    return nullptr;
  }
  if ((attr->comp_mask & ~kKnown) || ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)) {
    errno = EOPNOTSUPP;  // XRC, TSO, RSS, creation flags: not modelled
    return nullptr;
  }
  const bool ex = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
  auto* c = reinterpret_cast<EmuContext*>(verbs_get_ctx(context));
  if (ex && c->fab->devices[c->dev].profile == Profile::Thunderbolt) {
    // Our assumption: TN3205 documents ibv_post_send only, so the extended send API is
    // treated as absent on Apple's driver (programs fall back or say so).
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (ex && (attr->send_ops_flags & ~supported_send_ops(attr->qp_type))) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  std::unique_ptr<WrBatch> b;
  if (ex) {
    b.reset(new (std::nothrow) WrBatch);
    if (!b) {
      errno = ENOMEM;
      return nullptr;
    }
  }
  // ibv_qp_init_attr_ex starts with the fields of ibv_qp_init_attr (rdma-core's layout).
  ibv_qp_init_attr init{};
  std::memcpy(&init, attr, sizeof init);
  ibv_qp* qp = ibv_create_qp(attr->pd, &init);
  if (!qp) return nullptr;
  attr->cap = init.cap;
  if (!ex) return qp;
  EmuQp* q = reinterpret_cast<EmuQp*>(qp);
  q->batch = std::move(b);
  ibv_qp_ex& x = q->qpx;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  if (attr->qp_type == IBV_QPT_RC) {
    x.wr_rdma_read = wr_rdma_read;
    x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
    x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  }
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  return qp;
}

}  // namespace emu

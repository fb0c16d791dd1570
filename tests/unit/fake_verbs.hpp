// A fake verbs provider behind a tbverbs function table: every verb is a plain function that
// reads its behaviour from one FakeVerbs object, so unit tests drive success and error paths
// without a provider. Only one FakeVerbs may be live at a time (the functions find it globally).
#pragma once

#include <tbverbs/tbverbs.hpp>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace fake {

namespace abi = tbverbs::abi;

struct FakeVerbs;
inline FakeVerbs* current = nullptr;

struct FakeVerbs {
  // Devices and ports.
  std::vector<std::string> device_names{"rdma_en1", "rdma_en2"};
  // The devices' ibv_device::transport_type. Unset: as the real drivers report it, Thunderbolt
  // (100) for Apple's rdma_enN names, InfiniBand (0) for the rest; set, for every device (the
  // library decides the platform by this value, not by the name).
  std::optional<int> transport_type;
  int list_errno = 0;                        // with no devices: errno left by get_device_list
  int port_state = abi::IBV_PORT_ACTIVE;
  std::vector<tbverbs::Gid> gids;            // the GID table (length = gids.size())
  // Failure switches.
  int alloc_pd_errno = 0;                    // alloc_pd returns NULL with this errno
  int reg_mr_errno = 0;
  int create_qp_errno = 0;
  int modify_qp_rc[8] = {};                  // per target state: returned by modify_qp
  int post_send_rc = 0;
  int post_recv_rc = 0;
  int post_fail_at = 0;                      // with post_*_rc: the 0-based WR of a chain the driver refuses (bad_wr)
  std::vector<abi::ibv_send_wr> posted_sends; // every send WR handed to post_send (next cleared)
  std::vector<std::vector<abi::ibv_sge>> posted_sges; // their SGEs
  std::vector<std::uint64_t> posted_recvs;   // wr_ids of posted receives
  int qp_state = 0;                          // what modify_qp set last (query_qp reports it)
  bool query_qp_works = false;               // query_qp answers (else EOPNOTSUPP, the old behaviour)
  int poll_rc = 0;                           // negative: poll_cq returns it
  std::deque<abi::ibv_wc> completions;       // what poll_cq hands out
  unsigned granted_send_wr = 0;              // 0: grant what was asked
  int max_qp = 10;                           // query_device's max_qp (Macs report 11)
  int link_layer = 0;                        // query_port's link_layer (Thunderbolt: 100)
  std::chrono::steady_clock::time_point hold_until{}; // poll_cq finds nothing before this
  // Completion channels: absent from the table unless enable_channels() is called.
  int create_channel_errno = 0;              // create_comp_channel returns NULL with this errno
  int req_notify_rc = 0;                     // req_notify_cq returns it
  int create_cq_channel_errno = 0;           // create_cq refuses a CQ with a channel (errno)
  int channel_creates = 0, notifies = 0, polls = 0;
  std::deque<abi::ibv_comp_channel> channels;
  int pipe_fds[2] = {-1, -1};                // the channels' fd: never readable
  // What happened.
  std::vector<std::string> calls;            // "dealloc_pd", "dereg_mr", ... in order
  std::vector<abi::ibv_qp_attr> modify_attrs;
  std::vector<int> modify_masks;

  // Objects.
  std::vector<abi::ibv_device> devices;
  std::vector<abi::ibv_device*> list;
  abi::ibv_context ctx{};
  std::deque<abi::ibv_pd> pds;
  std::deque<abi::ibv_mr> mrs;
  std::deque<abi::ibv_cq> cqs;
  std::deque<abi::ibv_qp> qps;
  tbverbs::detail::VerbsApi api;

  FakeVerbs();
  ~FakeVerbs() {
    current = nullptr;
    for (int fd : pipe_fds)
      if (fd >= 0) ::close(fd);
  }
  void enable_channels();
  // Asynchronous events: get_async_event hands these out in order (then EAGAIN); acks counts
  // ibv_ack_async_event calls.
  void enable_async_events();
  std::deque<abi::ibv_async_event> async_events;
  int async_acks = 0;
  FakeVerbs(const FakeVerbs&) = delete;
  FakeVerbs& operator=(const FakeVerbs&) = delete;

  tbverbs::Library library() const { return tbverbs::Library::from_table(api); }
  static tbverbs::Gid ipv4(unsigned a, unsigned b, unsigned c, unsigned d) {
    return tbverbs::Gid::from_ipv4((a << 24) | (b << 16) | (c << 8) | d);
  }
  static tbverbs::Gid link_local() { return *tbverbs::Gid::parse("fe80::1"); }
};

inline abi::ibv_device** f_get_device_list(int* n) {
  auto& f = *current;
  f.devices.assign(f.device_names.size(), abi::ibv_device{});
  f.list.clear();
  for (std::size_t i = 0; i < f.devices.size(); ++i) {
    std::strncpy(f.devices[i].name, f.device_names[i].c_str(), sizeof f.devices[i].name - 1);
    const int transport = f.transport_type.value_or(
        f.device_names[i].rfind("rdma_en", 0) == 0 ? tbverbs::thunderbolt_transport : 0);
    std::memcpy(&f.devices[i].transport_type, &transport, sizeof transport);
    f.list.push_back(&f.devices[i]);
  }
  f.list.push_back(nullptr);
  *n = static_cast<int>(f.devices.size());
  if (f.devices.empty()) {
    errno = f.list_errno;
    return f.list_errno ? nullptr : f.list.data();
  }
  return f.list.data();
}
inline void f_free_device_list(abi::ibv_device**) { current->calls.push_back("free_device_list"); }
inline const char* f_get_device_name(abi::ibv_device* d) { return d->name; }
inline std::uint64_t f_get_device_guid(abi::ibv_device*) { return 0; }
inline abi::ibv_context* f_open_device(abi::ibv_device* d) {
  current->ctx.device = d;
  current->ctx.async_fd = -1; // no fd (0 would be stdin, which wait_async_event makes non-blocking)
  return &current->ctx;
}
inline int f_close_device(abi::ibv_context*) {
  current->calls.push_back("close_device");
  return 0;
}
inline int f_query_device(abi::ibv_context*, abi::ibv_device_attr* a) {
  a->max_cqe = 4096;
  a->max_qp = current->max_qp;
  a->phys_port_cnt = 1;
  return 0;
}
inline int f_query_port(abi::ibv_context*, std::uint8_t port, abi::ibv_port_attr* a) {
  if (port != 1) return EINVAL;
  a->state = static_cast<abi::ibv_port_state>(current->port_state);
  a->active_mtu = abi::IBV_MTU_1024;
  a->max_mtu = abi::IBV_MTU_4096;
  a->gid_tbl_len = static_cast<int>(current->gids.size());
  a->lid = 0;
  a->link_layer = static_cast<std::uint8_t>(current->link_layer);
  return 0;
}
inline int f_query_gid(abi::ibv_context*, std::uint8_t, int index, abi::ibv_gid* g) {
  auto& f = *current;
  if (index < 0 || static_cast<std::size_t>(index) >= f.gids.size()) return EINVAL;
  std::memcpy(g->raw, f.gids[static_cast<std::size_t>(index)].raw().data(), 16);
  return 0;
}
inline abi::ibv_pd* f_alloc_pd(abi::ibv_context* c) {
  auto& f = *current;
  if (f.alloc_pd_errno) {
    errno = f.alloc_pd_errno;
    return nullptr;
  }
  f.pds.push_back(abi::ibv_pd{});
  f.pds.back().context = c;
  return &f.pds.back();
}
inline int f_dealloc_pd(abi::ibv_pd*) {
  current->calls.push_back("dealloc_pd");
  return 0;
}
inline abi::ibv_mr* f_reg_mr(abi::ibv_pd* pd, void* addr, std::size_t len, int) {
  auto& f = *current;
  if (f.reg_mr_errno) {
    errno = f.reg_mr_errno;
    return nullptr;
  }
  f.mrs.push_back(abi::ibv_mr{});
  auto& m = f.mrs.back();
  m.context = pd->context;
  m.pd = pd;
  m.addr = addr;
  m.length = len;
  m.lkey = 0x100 + static_cast<std::uint32_t>(f.mrs.size());
  m.rkey = 0x200 + static_cast<std::uint32_t>(f.mrs.size());
  return &m;
}
inline int f_dereg_mr(abi::ibv_mr*) {
  current->calls.push_back("dereg_mr");
  return 0;
}
inline int f_poll_cq(abi::ibv_cq*, int n, abi::ibv_wc* wc) {
  auto& f = *current;
  ++f.polls;
  if (f.poll_rc < 0) return f.poll_rc;
  if (std::chrono::steady_clock::now() < f.hold_until) return 0;
  int k = 0;
  while (k < n && !f.completions.empty()) {
    wc[k++] = f.completions.front();
    f.completions.pop_front();
  }
  return k;
}
inline int f_req_notify_cq(abi::ibv_cq*, int) {
  ++current->notifies;
  return current->req_notify_rc;
}
inline abi::ibv_comp_channel* f_create_comp_channel(abi::ibv_context* c) {
  auto& f = *current;
  ++f.channel_creates;
  if (f.create_channel_errno) {
    errno = f.create_channel_errno;
    return nullptr;
  }
  f.channels.push_back(abi::ibv_comp_channel{});
  f.channels.back().context = c;
  f.channels.back().fd = f.pipe_fds[0];
  return &f.channels.back();
}
inline int f_destroy_comp_channel(abi::ibv_comp_channel*) {
  current->calls.push_back("destroy_comp_channel");
  return 0;
}
inline int f_get_cq_event(abi::ibv_comp_channel*, abi::ibv_cq**, void**) {
  errno = EAGAIN; // the fake's fd never becomes readable, so this is never reached
  return -1;
}
inline void f_ack_cq_events(abi::ibv_cq*, unsigned int) {}
inline int f_post_send(abi::ibv_qp*, abi::ibv_send_wr* wr, abi::ibv_send_wr** bad) {
  auto& f = *current;
  int i = 0;
  for (; wr != nullptr; wr = wr->next, ++i) {
    if (f.post_send_rc != 0 && i >= f.post_fail_at) {
      *bad = wr;
      return f.post_send_rc;
    }
    abi::ibv_send_wr copy = *wr;
    copy.next = nullptr;
    f.posted_sends.push_back(copy);
    f.posted_sges.emplace_back(wr->sg_list, wr->sg_list + wr->num_sge);
  }
  return 0;
}
inline int f_post_recv(abi::ibv_qp*, abi::ibv_recv_wr* wr, abi::ibv_recv_wr** bad) {
  auto& f = *current;
  int i = 0;
  for (; wr != nullptr; wr = wr->next, ++i) {
    if (f.post_recv_rc != 0 && i >= f.post_fail_at) {
      *bad = wr;
      return f.post_recv_rc;
    }
    f.posted_recvs.push_back(wr->wr_id);
  }
  return 0;
}
inline abi::ibv_cq* f_create_cq(abi::ibv_context* c, int cqe, void*, abi::ibv_comp_channel* ch, int) {
  auto& f = *current;
  if (ch != nullptr && f.create_cq_channel_errno) {
    errno = f.create_cq_channel_errno;
    return nullptr;
  }
  f.cqs.push_back(abi::ibv_cq{});
  f.cqs.back().context = c;
  f.cqs.back().cqe = cqe;
  f.cqs.back().channel = ch;
  return &f.cqs.back();
}
inline int f_destroy_cq(abi::ibv_cq*) {
  current->calls.push_back("destroy_cq");
  return 0;
}
inline abi::ibv_qp* f_create_qp(abi::ibv_pd* pd, abi::ibv_qp_init_attr* a) {
  auto& f = *current;
  if (f.create_qp_errno) {
    errno = f.create_qp_errno;
    return nullptr;
  }
  if (f.granted_send_wr) a->cap.max_send_wr = f.granted_send_wr;
  f.qps.push_back(abi::ibv_qp{});
  auto& q = f.qps.back();
  q.context = pd->context;
  q.pd = pd;
  q.send_cq = a->send_cq;
  q.recv_cq = a->recv_cq;
  q.qp_num = 0x40 + static_cast<std::uint32_t>(f.qps.size());
  q.qp_type = a->qp_type;
  return &q;
}
inline int f_destroy_qp(abi::ibv_qp*) {
  current->calls.push_back("destroy_qp");
  return 0;
}
inline int f_modify_qp(abi::ibv_qp*, abi::ibv_qp_attr* a, int mask) {
  auto& f = *current;
  f.modify_attrs.push_back(*a);
  f.modify_masks.push_back(mask);
  const int rc = f.modify_qp_rc[a->qp_state];
  if (rc == 0) f.qp_state = a->qp_state;
  return rc;
}
inline int f_query_qp(abi::ibv_qp*, abi::ibv_qp_attr* a, int mask, abi::ibv_qp_init_attr*) {
  auto& f = *current;
  if (!f.query_qp_works || (mask & abi::IBV_QP_CAP) != 0)
    return EOPNOTSUPP; // exercise the fallback to create_qp's written-back caps
  a->qp_state = static_cast<abi::ibv_qp_state>(f.qp_state);
  return 0;
}

inline FakeVerbs::FakeVerbs() {
  current = this;
  gids = {link_local(), ipv4(10, 0, 0, 1)};
  ctx.ops.poll_cq = f_poll_cq;
  ctx.ops.req_notify_cq = f_req_notify_cq;
  ctx.ops.post_send = f_post_send;
  ctx.ops.post_recv = f_post_recv;
  api.get_device_list = f_get_device_list;
  api.free_device_list = f_free_device_list;
  api.get_device_name = f_get_device_name;
  api.get_device_guid = f_get_device_guid;
  api.open_device = f_open_device;
  api.close_device = f_close_device;
  api.query_device = f_query_device;
  api.query_port = f_query_port;
  api.query_gid = f_query_gid;
  api.alloc_pd = f_alloc_pd;
  api.dealloc_pd = f_dealloc_pd;
  api.reg_mr = f_reg_mr;
  api.dereg_mr = f_dereg_mr;
  api.create_cq = f_create_cq;
  api.destroy_cq = f_destroy_cq;
  api.create_qp = f_create_qp;
  api.destroy_qp = f_destroy_qp;
  api.modify_qp = f_modify_qp;
  api.query_qp = f_query_qp;
  api.origin = "fake";
  api.platform = tbverbs::Platform::rdma_core;
}

inline int f_get_async_event(abi::ibv_context*, abi::ibv_async_event* ev) {
  auto& f = *current;
  if (f.async_events.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *ev = f.async_events.front();
  f.async_events.pop_front();
  return 0;
}
inline void f_ack_async_event(abi::ibv_async_event*) { ++current->async_acks; }
inline void FakeVerbs::enable_async_events() {
  api.get_async_event = f_get_async_event;
  api.ack_async_event = f_ack_async_event;
}

inline void FakeVerbs::enable_channels() {
  if (pipe_fds[0] < 0 && ::pipe(pipe_fds) != 0) pipe_fds[0] = pipe_fds[1] = -1;
  api.create_comp_channel = f_create_comp_channel;
  api.destroy_comp_channel = f_destroy_comp_channel;
  api.get_cq_event = f_get_cq_event;
  api.ack_cq_events = f_ack_cq_events;
}

inline abi::ibv_wc completion(std::uint64_t wr_id, int status = abi::IBV_WC_SUCCESS,
                              int opcode = abi::IBV_WC_RECV, std::uint32_t len = 4096) {
  abi::ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = static_cast<abi::ibv_wc_status>(status);
  wc.opcode = static_cast<abi::ibv_wc_opcode>(opcode);
  wc.byte_len = len;
  return wc;
}

} // namespace fake

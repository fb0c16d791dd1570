// librdmacm.so.1 for the emulated fabric: the RDMA connection manager over the emulator.
//
// rdma-core's librdmacm talks to the kernel (/dev/infiniband/rdma_cm), which an emulated
// fabric has no part of. This one keeps librdmacm 44's ABI and plays the connection
// manager's protocol between processes of the fabric:
//
// - Addresses are the IPv4 addresses of the fabric's ports (tbemu_route_ipv4 finds the local
//   port that reaches one); the GID, LID and MTU of the path come from that port, as address
//   and route resolution give them on RoCE and InfiniBand.
// - A listener is an AF_UNIX SOCK_SEQPACKET socket in the fabric's state directory, named by
//   port space, address (or "any" and the host) and port. A connection is one such socket
//   pair that carries the CM's messages (REQ, REP, RTU, REJ, DREQ; fixed-size records).
// - QPs created on an id are moved through INIT, RTR and RTS by the CM, with the values the
//   kernel's CM picks (see qp_attr_for): remote write always, remote read when responder
//   resources were granted, PSNs exchanged in REQ and REP.
// - An event channel's fd is an epoll fd over the channel's sockets and an eventfd for events
//   made locally, so poll() on it works; rdma_get_cm_event reads the sockets it finds ready.
//   No thread: messages are read when the application asks for events.
// - A peer that closes its id or dies closes the socket: a connected id then gets
//   DISCONNECTED, as the kernel's CM sends a DREQ when a process's fd closes.
//
// Not modelled (calls fail with EOPNOTSUPP): UD port spaces' service lookup and multicast,
// SRQs, ECE, AF_INET6 and AF_IB addresses, rsockets (rsocket() fails; the other r* calls
// see no rsocket and fail with EBADF; rpoll is poll()).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "tbverbs_emu/control.h"

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// Private data limits of the IB CM messages less the CM's own header (rdma_connect(3),
// rdma_accept(3), rdma_reject(3): 56, 196 and 148 bytes on InfiniBand and RoCE).
constexpr uint8_t kMaxReqPrivate = 56;
constexpr uint8_t kMaxRepPrivate = 196;
constexpr uint8_t kMaxRejPrivate = 148;
// IB CM reject reasons (IBTA vol. 1, table 112) that the kernel passes up as the status of
// RDMA_CM_EVENT_REJECTED: no listener on the service ID, and a reject by the application.
constexpr int kRejInvalidServiceId = 8;
constexpr int kRejConsumer = 28;
// How long rdma_connect looks for a listener before the peer's CM rejects (see rdma_connect).
constexpr int kNoListenerGraceMs = 1000;
constexpr uint32_t kMagic = 0x4d434254;  // "TBCM"

enum MsgType : uint8_t { kReq = 1, kRep, kRtu, kRej, kDreq };

// One CM message. Both ends run on one machine, so fields are in host order.
struct Msg {
  uint32_t magic;
  uint8_t type;
  uint8_t private_len;
  uint8_t responder_resources, initiator_depth, retry_count, rnr_retry_count, flow_control, srq;
  uint32_t qpn, psn;
  uint8_t gid[16];
  uint16_t lid;
  uint8_t mtu;      // the sender port's active MTU (enum ibv_mtu)
  uint8_t qp_type;  // enum ibv_qp_type
  int32_t status;
  sockaddr_in src, dst;  // as the sender sees them
  uint8_t private_data[kMaxRepPrivate];
};

enum class St {
  Idle,
  Bound,
  AddrResolved,
  RouteResolved,
  Listening,
  PreReq,       // passive, accepted socket whose REQ has not arrived (not visible to the user)
  ReqReceived,  // passive, CONNECT_REQUEST reported
  Connecting,   // active, REQ sent
  RepReceived,  // active without a QP of its own: CONNECT_RESPONSE reported
  Accepted,     // passive, REP sent
  Connected,
  Disconnected,
  Rejected,
};

struct Channel {
  rdma_event_channel ch{-1};  // fd: an epoll fd (see the file comment)
  int evfd = -1;
  std::deque<rdma_cm_event*> queue;
  int waiters = 0;         // threads inside rdma_get_cm_event
  bool destroyed = false;  // rdma_destroy_event_channel while some were: the last one frees it
};

struct Peer {
  uint32_t qpn = 0, psn = 0;
  ibv_gid gid{};
  uint16_t lid = 0;
  uint8_t mtu = IBV_MTU_1024;
  uint8_t responder_resources = 0, initiator_depth = 0;
};

struct CmId {
  rdma_cm_id id{};  // first: the handle is a pointer to it
  uint64_t serial = 0;
  Channel* chan = nullptr;
  bool sync = false;  // created without a channel: operations wait for their events
  St st = St::Idle;
  int sock = -1;
  std::string listen_path;
  CmId* listener = nullptr;  // passive ids: the listening id
  // The local end of the path.
  uint8_t gid_index = 0;
  uint8_t link_layer = IBV_LINK_LAYER_ETHERNET;
  uint8_t active_mtu = IBV_MTU_1024;
  uint16_t lid = 0;
  uint8_t max_rd_atom = 0;  // the device's max_qp_rd_atom
  uint32_t psn = 0;
  std::string peer_host;  // the host that holds the destination address
  Peer peer;
  // What this side grants and asks for (rdma_connect's or rdma_accept's parameters).
  uint8_t responder_resources = 0, initiator_depth = 0, retry_count = 7, rnr_retry_count = 7;
  uint8_t tos = 0;
  // rdma_create_qp made these (rdma_destroy_qp frees them).
  bool own_cqs = false;
  // rdma_create_ep on a passive id: the QP each rdma_get_request creates.
  bool has_ep_attr = false;
  ibv_qp_init_attr ep_attr{};
  ibv_pd* ep_pd = nullptr;
};

struct Event {
  rdma_cm_event ev{};
  uint8_t data[kMaxRepPrivate];
};

struct Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;  // the default PD of rdma_create_qp(id, NULL, ...)
};

std::mutex g_mu;  // every id, channel and device below
auto& g_ids = *new std::map<uint64_t, CmId*>();
// Whether `c` is an id this process made and has not destroyed; compares the pointer, never
// reads through it. Caller holds g_mu.
bool live(const CmId* c) {
  for (const auto& [serial, x] : g_ids)
    if (x == c) return true;
  return false;
}
auto& g_devices = *new std::map<std::string, Device>();
uint64_t g_next_serial = 1;

CmId* cm(rdma_cm_id* id) { return reinterpret_cast<CmId*>(id); }

int fail(int e) {
  errno = e;
  return -1;
}

uint32_t random_psn() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(getpid()) * 2654435761u;
  return v & 0xffffff;
}

// ---------------------------------------------------------------- devices

// Opens (once per process, never closed: "devices remain opened while the librdmacm is
// loaded", rdma_get_devices(3)) the device of this host named `name`.
Device* device_named(const std::string& name) {
  auto it = g_devices.find(name);
  if (it != g_devices.end()) return &it->second;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && !ctx; ++i)
    if (name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  if (!ctx) {
    if (!errno) errno = ENODEV;
    return nullptr;
  }
  Device& d = g_devices[name];
  d.ctx = ctx;
  return &d;
}

Device* device_of(ibv_context* ctx) {
  for (auto& [name, d] : g_devices)
    if (d.ctx == ctx) return &d;
  return nullptr;
}

// The GID entry of `ip` on the port: its IPv4-mapped entry, RoCE v2 preferred (what rdma_cm
// uses by default on RoCE); the port GID (index 0) on a port without IPv4 entries
// (InfiniBand, where the address is IPoIB's and the path is the port's).
int gid_index_of(ibv_context* ctx, uint8_t port, int table_len, uint32_t ip_be, ibv_gid* gid) {
  int found = -1;
  for (int i = 0; i < table_len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(i), &e, 0) != 0) continue;
    const uint8_t* r = e.gid.raw;
    bool v4 = std::all_of(r, r + 10, [](uint8_t b) { return b == 0; }) && r[10] == 0xff && r[11] == 0xff &&
              std::memcmp(r + 12, &ip_be, 4) == 0;
    if (!v4) continue;
    if (found < 0 || e.gid_type == IBV_GID_TYPE_ROCE_V2) {
      found = i;
      *gid = e.gid;
    }
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2) break;
  }
  if (found >= 0) return found;
  if (ibv_query_gid(ctx, port, 0, gid) != 0) return -1;
  return 0;
}

// Binds `c` to the local port that reaches `dst_ip` (for rdma_resolve_addr) or holds it
// (rdma_bind_addr, local = true). Returns 0 or an errno.
int bind_device(CmId* c, uint32_t ip_be, bool local) {
  char dev[64], host[64];
  int port = 0;
  if (int e = tbemu_route_ipv4(nullptr, nullptr, ip_be, dev, sizeof dev, &port, host)) return e;
  if (local) {
    const char* me = tbemu_host(nullptr);
    if (!me || std::strcmp(me, host) != 0) return EADDRNOTAVAIL;  // not an address of this host
  }
  Device* d = device_named(dev);
  if (!d) return errno ? errno : ENODEV;
  ibv_port_attr pa{};
  if (ibv_query_port(d->ctx, static_cast<uint8_t>(port), &pa) != 0) return errno ? errno : EIO;
  ibv_device_attr da{};
  if (ibv_query_device(d->ctx, &da) != 0) return errno ? errno : EIO;
  c->id.verbs = d->ctx;
  c->id.port_num = static_cast<uint8_t>(port);
  c->peer_host = host;
  c->link_layer = pa.link_layer;
  c->active_mtu = static_cast<uint8_t>(pa.active_mtu);
  c->lid = pa.lid;
  c->max_rd_atom = static_cast<uint8_t>(std::min(da.max_qp_rd_atom, 255));
  uint32_t src_ip = local ? ip_be : 0;
  if (!local) {
    // Our source address: the local port's own IPv4 address, found through its GID table
    // entry (index of the IPv4-mapped GID). A port without one keeps 0.0.0.0.
    for (int i = 0; i < pa.gid_tbl_len; ++i) {
      ibv_gid g{};
      if (ibv_query_gid(d->ctx, c->id.port_num, i, &g) != 0) continue;
      const uint8_t* r = g.raw;
      if (std::all_of(r, r + 10, [](uint8_t b) { return b == 0; }) && r[10] == 0xff && r[11] == 0xff) {
        std::memcpy(&src_ip, r + 12, 4);
        break;
      }
    }
    if (c->id.route.addr.src_sin.sin_addr.s_addr == 0) c->id.route.addr.src_sin.sin_addr.s_addr = src_ip;
  }
  ibv_gid g{};
  int gi = gid_index_of(d->ctx, c->id.port_num, pa.gid_tbl_len,
                        local ? ip_be : c->id.route.addr.src_sin.sin_addr.s_addr, &g);
  if (gi < 0) return errno ? errno : EADDRNOTAVAIL;
  c->gid_index = static_cast<uint8_t>(gi);
  c->id.route.addr.addr.ibaddr.sgid = g;
  c->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
  return 0;
}

// ---------------------------------------------------------------- events and sockets

void push(Channel* ch, CmId* c, rdma_cm_event_type type, int status, const Msg* m = nullptr,
          CmId* listener = nullptr) {
  auto* e = new (std::nothrow) Event;
  if (!e) return;  // out of memory: the event is lost, as a full kernel queue would lose it
  e->ev.id = &c->id;
  e->ev.listen_id = listener ? &listener->id : nullptr;
  e->ev.event = type;
  e->ev.status = status;
  if (m) {
    rdma_conn_param& p = e->ev.param.conn;
    std::memcpy(e->data, m->private_data, m->private_len);
    p.private_data = m->private_len ? e->data : nullptr;
    p.private_data_len = m->private_len;
    // The kernel reports the peer's values from this side's point of view: what the peer
    // may read from us is its initiator depth, and the other way round.
    p.responder_resources = m->initiator_depth;
    p.initiator_depth = m->responder_resources;
    p.flow_control = m->flow_control;
    p.retry_count = m->retry_count;
    p.rnr_retry_count = m->rnr_retry_count;
    p.srq = m->srq;
    p.qp_num = m->qpn;
  }
  ch->queue.push_back(&e->ev);
  uint64_t one = 1;
  ssize_t r = ::write(ch->evfd, &one, sizeof one);
  (void)r;  // an eventfd write fails only at a counter of 2^64-1
}

void watch(CmId* c) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = c->serial;
  epoll_ctl(c->chan->ch.fd, EPOLL_CTL_ADD, c->sock, &ev);
}

void unwatch(CmId* c) {
  if (c->sock >= 0 && c->chan) epoll_ctl(c->chan->ch.fd, EPOLL_CTL_DEL, c->sock, nullptr);
}

void close_sock(CmId* c) {
  unwatch(c);
  if (c->sock >= 0) ::close(c->sock);
  c->sock = -1;
}

int send_msg(CmId* c, Msg& m) {
  m.magic = kMagic;
  m.src = c->id.route.addr.src_sin;
  m.dst = c->id.route.addr.dst_sin;
  ssize_t r = ::send(c->sock, &m, sizeof m, MSG_NOSIGNAL);
  return r == static_cast<ssize_t>(sizeof m) ? 0 : (errno ? errno : EIO);
}

Msg local_msg(CmId* c, MsgType t) {
  Msg m{};
  m.type = t;
  m.qpn = c->id.qp ? c->id.qp->qp_num : 0;
  m.psn = c->psn;
  std::memcpy(m.gid, c->id.route.addr.addr.ibaddr.sgid.raw, 16);
  m.lid = c->lid;
  m.mtu = c->active_mtu;
  m.qp_type = static_cast<uint8_t>(c->id.qp_type);
  m.responder_resources = c->responder_resources;
  m.initiator_depth = c->initiator_depth;
  m.retry_count = c->retry_count;
  m.rnr_retry_count = c->rnr_retry_count;
  return m;
}

void take_peer(CmId* c, const Msg& m) {
  c->peer.qpn = m.qpn;
  c->peer.psn = m.psn;
  std::memcpy(c->peer.gid.raw, m.gid, 16);
  c->peer.lid = m.lid;
  c->peer.mtu = m.mtu;
  c->peer.responder_resources = m.responder_resources;
  c->peer.initiator_depth = m.initiator_depth;
  c->id.route.addr.addr.ibaddr.dgid = c->peer.gid;
}

// The attributes the CM gives a connected QP for `state` (rdma_init_qp_attr). The values are
// those of the kernel's IB CM: remote write always, remote read and atomics only when this
// side grants responder resources; path MTU the smaller active MTU of the two ports; RTR by
// GRH on Ethernet and by LID on InfiniBand. Timers are our assumption (rdma_cm's defaults on
// RoCE are in the same range): ack timeout 14, minimum RNR timer 12.
int qp_attr_for(CmId* c, ibv_qp_state state, ibv_qp_attr* a, int* mask) {
  std::memset(a, 0, sizeof *a);
  a->qp_state = state;
  const bool rc = c->id.qp_type == IBV_QPT_RC;
  switch (state) {
    case IBV_QPS_INIT:
      a->port_num = c->id.port_num;
      a->pkey_index = 0;
      a->qp_access_flags = 0;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      return 0;
    case IBV_QPS_RTR: {
      a->path_mtu = static_cast<ibv_mtu>(std::min(c->active_mtu, c->peer.mtu));
      a->dest_qp_num = c->peer.qpn;
      a->rq_psn = c->peer.psn;
      a->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (rc && c->responder_resources)
        a->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      ibv_ah_attr& ah = a->ah_attr;
      ah.port_num = c->id.port_num;
      if (c->link_layer == IBV_LINK_LAYER_INFINIBAND) {
        ah.dlid = c->peer.lid;
      } else {
        ah.is_global = 1;
        ah.grh.dgid = c->peer.gid;
        ah.grh.sgid_index = c->gid_index;
        ah.grh.hop_limit = 64;  // an IPv4 TTL, as RoCE v2 carries it
        ah.grh.traffic_class = c->tos;
      }
      *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_ACCESS_FLAGS;
      if (rc) {
        a->max_dest_rd_atomic = c->responder_resources;
        a->min_rnr_timer = 12;
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    }
    case IBV_QPS_RTS:
      a->sq_psn = c->psn;
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (rc) {
        a->timeout = 14;
        a->retry_cnt = c->retry_count;
        a->rnr_retry = c->rnr_retry_count;
        a->max_rd_atomic = c->initiator_depth;
        *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      return 0;
    default: return EINVAL;
  }
}

int modify(CmId* c, ibv_qp_state state) {
  ibv_qp_attr a;
  int mask = 0;
  if (int e = qp_attr_for(c, state, &a, &mask)) return e;
  return ibv_modify_qp(c->id.qp, &a, mask);
}

// RTR then RTS (both sides do both once the peer's QP number and PSN are known).
int connect_qp(CmId* c) {
  if (int e = modify(c, IBV_QPS_RTR)) return e;
  return modify(c, IBV_QPS_RTS);
}

void qp_to_error(CmId* c) {
  if (!c->id.qp) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(c->id.qp, &a, IBV_QP_STATE);  // best effort: the connection is over either way
}

CmId* new_id(Channel* ch, void* context, rdma_port_space ps) {
  auto* c = new (std::nothrow) CmId;
  if (!c) return nullptr;
  c->id.channel = &ch->ch;
  c->id.context = context;
  c->id.ps = ps;
  c->id.qp_type = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
  c->chan = ch;
  c->serial = g_next_serial++;
  c->psn = random_psn();
  g_ids[c->serial] = c;
  return c;
}

void drop_id(CmId* c) {
  close_sock(c);
  if (!c->listen_path.empty()) ::unlink(c->listen_path.c_str());
  // Events still queued for it name a freed id: take them out.
  auto& q = c->chan->queue;
  for (auto it = q.begin(); it != q.end();) {
    if ((*it)->id == &c->id) {
      delete reinterpret_cast<Event*>(*it);
      it = q.erase(it);
    } else {
      ++it;
    }
  }
  g_ids.erase(c->serial);
  delete c;
}

// A REQ arrived on an accepted socket: the id becomes visible as CONNECT_REQUEST.
void on_req(CmId* c, const Msg& m) {
  CmId* l = c->listener;
  c->id.route.addr.src_sin = m.dst;
  c->id.route.addr.dst_sin = m.src;
  if (int e = bind_device(c, m.dst.sin_addr.s_addr, true)) {
    Msg r = local_msg(c, kRej);
    r.status = kRejInvalidServiceId;
    send_msg(c, r);
    std::fprintf(stderr, "tbverbs-emu rdmacm: a connection request for %s cannot be served here: %s\n",
                 inet_ntoa(m.dst.sin_addr), std::strerror(e));
    drop_id(c);
    return;
  }
  take_peer(c, m);
  c->id.qp_type = static_cast<ibv_qp_type>(m.qp_type);
  c->st = St::ReqReceived;
  push(c->chan, c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &m, l);
}

void on_msg(CmId* c, const Msg& m) {
  if (m.magic != kMagic) return;  // not ours: ignored, as a CM ignores garbled MADs
  switch (m.type) {
    case kReq:
      if (c->st == St::PreReq) on_req(c, m);
      return;
    case kRep:
      if (c->st != St::Connecting) return;
      take_peer(c, m);
      if (!c->id.qp) {
        c->st = St::RepReceived;
        push(c->chan, c, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, &m);
        return;
      }
      if (int e = connect_qp(c)) {
        Msg r = local_msg(c, kRej);
        r.status = kRejConsumer;
        send_msg(c, r);
        close_sock(c);
        c->st = St::Rejected;
        push(c->chan, c, RDMA_CM_EVENT_CONNECT_ERROR, -e, &m);
        return;
      }
      {
        Msg rtu = local_msg(c, kRtu);
        send_msg(c, rtu);
      }
      c->st = St::Connected;
      push(c->chan, c, RDMA_CM_EVENT_ESTABLISHED, 0, &m);
      return;
    case kRtu:
      if (c->st != St::Accepted) return;
      c->st = St::Connected;
      push(c->chan, c, RDMA_CM_EVENT_ESTABLISHED, 0);
      return;
    case kRej:
      if (c->st != St::Connecting && c->st != St::Accepted) return;
      close_sock(c);
      c->st = St::Rejected;
      push(c->chan, c, RDMA_CM_EVENT_REJECTED, m.status, &m);
      return;
    case kDreq:
      if (c->st != St::Connected && c->st != St::Accepted) return;
      close_sock(c);
      c->st = St::Disconnected;
      push(c->chan, c, RDMA_CM_EVENT_DISCONNECTED, 0);
      return;
    default: return;
  }
}

// The other end closed its id or died.
void on_eof(CmId* c) {
  close_sock(c);
  switch (c->st) {
    case St::PreReq: drop_id(c); return;
    case St::Connected:
    case St::Accepted:
      c->st = St::Disconnected;
      push(c->chan, c, RDMA_CM_EVENT_DISCONNECTED, 0);
      return;
    case St::Connecting:
    case St::RepReceived:
      c->st = St::Rejected;
      push(c->chan, c, RDMA_CM_EVENT_UNREACHABLE, -ECONNRESET);
      return;
    default: return;
  }
}

void on_listener(CmId* l) {
  for (;;) {
    int s = ::accept4(l->sock, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s < 0) return;  // EAGAIN: none left
    CmId* c = new_id(l->chan, l->id.context, l->id.ps);
    if (!c) {
      ::close(s);
      continue;
    }
    c->sock = s;
    c->st = St::PreReq;
    c->listener = l;
    watch(c);
  }
}

void on_ready(uint64_t serial) {
  auto it = g_ids.find(serial);
  if (it == g_ids.end()) return;  // destroyed since epoll reported it
  CmId* c = it->second;
  if (c->st == St::Listening) return on_listener(c);
  for (;;) {
    Msg m;
    ssize_t r = ::recv(c->sock, &m, sizeof m, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (r <= 0) return on_eof(c);
    if (r == static_cast<ssize_t>(sizeof m)) on_msg(c, m);
    if (c->sock < 0 || g_ids.find(serial) == g_ids.end()) return;
  }
}

Channel* new_channel() {
  auto* ch = new (std::nothrow) Channel;
  if (!ch) return nullptr;
  ch->ch.fd = epoll_create1(EPOLL_CLOEXEC);
  ch->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ch->ch.fd < 0 || ch->evfd < 0) {
    int e = errno;
    if (ch->ch.fd >= 0) ::close(ch->ch.fd);
    if (ch->evfd >= 0) ::close(ch->evfd);
    delete ch;
    errno = e;
    return nullptr;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // the eventfd; ids' serials start at 1
  epoll_ctl(ch->ch.fd, EPOLL_CTL_ADD, ch->evfd, &ev);
  return ch;
}

void free_channel(Channel* ch) {
  for (rdma_cm_event* e : ch->queue) delete reinterpret_cast<Event*>(e);
  ::close(ch->ch.fd);
  ::close(ch->evfd);
  delete ch;
}

void close_channel_fds(Channel* ch) {
  for (rdma_cm_event* e : ch->queue) delete reinterpret_cast<Event*>(e);
  ch->queue.clear();
  ::close(ch->ch.fd);
  ::close(ch->evfd);
  ch->ch.fd = ch->evfd = -1;
}

// A thread waiting in a channel that another thread destroys (rping's event thread when its
// main thread tears down): with rdma-core the thread's read() of the closed fd stays blocked
// until the process exits, and programs rely on that (they exit from main, not from that
// thread). Here the event thread may also be between two calls at that moment (events are
// made at once, so the teardown can overtake it), so a call on a destroyed channel blocks the
// same way. A destroyed channel's fds are closed once no thread waits in it; its few bytes are
// kept for such late callers.
[[noreturn]] void park_in_destroyed(Channel* ch, std::unique_lock<std::mutex>& g) {
  if (--ch->waiters == 0) close_channel_fds(ch);
  g.unlock();
  for (;;) pause();
}

int get_event(Channel* ch, rdma_cm_event** out) {
  for (;;) {
    {
      std::unique_lock<std::mutex> g(g_mu);
      if (ch->destroyed) {
        ++ch->waiters;
        park_in_destroyed(ch, g);
      }
      if (!ch->queue.empty()) {
        *out = ch->queue.front();
        ch->queue.pop_front();
        if (ch->queue.empty()) {
          uint64_t v;
          ssize_t r = ::read(ch->evfd, &v, sizeof v);
          (void)r;  // EAGAIN when already cleared
        }
        return 0;
      }
    }
    // Blocks as rdma_get_cm_event(3) does, unless the application made the fd non-blocking.
    const bool nonblock = (fcntl(ch->ch.fd, F_GETFL) & O_NONBLOCK) != 0;
    epoll_event evs[16];
    {
      std::lock_guard<std::mutex> g(g_mu);
      ++ch->waiters;
    }
    int n = epoll_wait(ch->ch.fd, evs, 16, nonblock ? 0 : -1);
    const int err = errno;
    std::unique_lock<std::mutex> g(g_mu);
    if (ch->destroyed) park_in_destroyed(ch, g);
    --ch->waiters;
    if (n < 0) return fail(err);  // EINTR too: rdma_get_cm_event is one read() in librdmacm
    if (n == 0) return fail(EAGAIN);
    for (int i = 0; i < n; ++i)
      if (evs[i].data.u64) on_ready(evs[i].data.u64);
  }
}

// Sync ids (no channel): waits for the id's next event and checks it is `want`. The error
// events become an errno.
int wait_for(CmId* c, rdma_cm_event_type want, rdma_cm_event** keep = nullptr) {
  for (;;) {
    rdma_cm_event* e = nullptr;
    if (get_event(c->chan, &e) != 0) return -1;
    rdma_cm_event_type t = e->event;
    int status = e->status;
    if (t == want && status == 0) {
      if (keep) *keep = e;
      else rdma_ack_cm_event(e);
      return 0;
    }
    rdma_ack_cm_event(e);
    switch (t) {
      case RDMA_CM_EVENT_REJECTED: return fail(ECONNREFUSED);
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_ADDR_ERROR:
      case RDMA_CM_EVENT_ROUTE_ERROR:
      case RDMA_CM_EVENT_CONNECT_ERROR: return fail(status < 0 ? -status : EHOSTUNREACH);
      case RDMA_CM_EVENT_DISCONNECTED: return fail(ECONNRESET);
      default: continue;
    }
  }
}

std::string listen_path(const std::string& dir, rdma_port_space ps, uint32_t ip_be, const std::string& host,
                        uint16_t port) {
  char b[128];
  if (ip_be) {
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &ip_be, ip, sizeof ip);
    std::snprintf(b, sizeof b, "/cm-%d-%s-%u", static_cast<int>(ps), ip, port);
  } else {
    std::snprintf(b, sizeof b, "/cm-%d-any@%s-%u", static_cast<int>(ps), host.c_str(), port);
  }
  return dir + b;
}

std::string this_host() {
  const char* h = tbemu_host(nullptr);
  return h ? h : "";
}

int unix_addr(const std::string& path, sockaddr_un* a) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (path.size() >= sizeof a->sun_path) return ENAMETOOLONG;
  std::memcpy(a->sun_path, path.c_str(), path.size());
  return 0;
}

int copy_conn(CmId* c, const rdma_conn_param* p, uint8_t max_private) {
  if (p && p->private_data_len > max_private) return EINVAL;
  // Without parameters the kernel offers the device's maximum (RDMA_MAX_RESP_RES and
  // RDMA_MAX_INIT_DEPTH are clamped to it).
  uint8_t rr = p ? p->responder_resources : 0xff, id = p ? p->initiator_depth : 0xff;
  c->responder_resources = std::min(rr, c->max_rd_atom);
  c->initiator_depth = std::min(id, c->max_rd_atom);
  if (c->id.qp_type != IBV_QPT_RC) c->responder_resources = c->initiator_depth = 0;
  if (p) {
    c->retry_count = std::min<uint8_t>(p->retry_count, 7);
    c->rnr_retry_count = std::min<uint8_t>(p->rnr_retry_count, 7);
  }
  return 0;
}

void put_private(Msg& m, const rdma_conn_param* p) {
  if (!p || !p->private_data_len || !p->private_data) return;
  m.private_len = p->private_data_len;
  std::memcpy(m.private_data, p->private_data, p->private_data_len);
}

int create_qp_common(CmId* c, ibv_qp_init_attr_ex* attr) {
  if (!c->id.verbs) return EINVAL;
  Device* d = device_of(c->id.verbs);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    if (!d) return EINVAL;
    if (!d->pd && !(d->pd = ibv_alloc_pd(d->ctx))) return errno ? errno : ENOMEM;
    attr->pd = d->pd;
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
  }
  if (attr->pd->context != c->id.verbs) return EINVAL;
  // Missing CQs are made here with completion channels, as rdma-core's librdmacm does
  // (rdma_get_send_comp and rdma_get_recv_comp wait on those channels).
  ibv_comp_channel *sch = nullptr, *rch = nullptr;
  ibv_cq *scq = nullptr, *rcq = nullptr;
  auto undo = [&] {
    if (scq) ibv_destroy_cq(scq);
    if (rcq) ibv_destroy_cq(rcq);
    if (sch) ibv_destroy_comp_channel(sch);
    if (rch) ibv_destroy_comp_channel(rch);
  };
  if (!attr->send_cq) {
    if (!(sch = ibv_create_comp_channel(c->id.verbs)) ||
        !(scq = ibv_create_cq(c->id.verbs, std::max<int>(1, attr->cap.max_send_wr), c, sch, 0))) {
      int e = errno ? errno : ENOMEM;
      undo();
      return e;
    }
    attr->send_cq = scq;
  }
  if (!attr->recv_cq) {
    if (!(rch = ibv_create_comp_channel(c->id.verbs)) ||
        !(rcq = ibv_create_cq(c->id.verbs, std::max<int>(1, attr->cap.max_recv_wr), c, rch, 0))) {
      int e = errno ? errno : ENOMEM;
      undo();
      return e;
    }
    attr->recv_cq = rcq;
  }
  ibv_qp* qp = ibv_create_qp_ex(c->id.verbs, attr);
  if (!qp) {
    int e = errno ? errno : ENOMEM;
    undo();
    return e;
  }
  c->id.qp = qp;
  c->id.qp_type = attr->qp_type;
  c->id.pd = attr->pd;
  c->id.send_cq_channel = sch;
  c->id.send_cq = attr->send_cq;
  c->id.recv_cq_channel = rch;
  c->id.recv_cq = attr->recv_cq;
  c->own_cqs = sch || rch;
  if (attr->qp_type == IBV_QPT_RC || attr->qp_type == IBV_QPT_UC) {
    if (int e = modify(c, IBV_QPS_INIT)) {
      ibv_destroy_qp(qp);
      c->id.qp = nullptr;
      undo();
      return e;
    }
  }
  return 0;
}

void destroy_qp_common(CmId* c) {
  if (c->id.qp) ibv_destroy_qp(c->id.qp);
  c->id.qp = nullptr;
  if (c->own_cqs) {
    if (c->id.send_cq_channel) {
      ibv_destroy_cq(c->id.send_cq);
      ibv_destroy_comp_channel(c->id.send_cq_channel);
    }
    if (c->id.recv_cq_channel) {
      ibv_destroy_cq(c->id.recv_cq);
      ibv_destroy_comp_channel(c->id.recv_cq_channel);
    }
  }
  c->id.send_cq_channel = c->id.recv_cq_channel = nullptr;
  c->id.send_cq = c->id.recv_cq = nullptr;
  c->own_cqs = false;
}

}  // namespace

// ---------------------------------------------------------------- channels and ids

EMU_EXPORT rdma_event_channel* rdma_create_event_channel(void) {
  Channel* ch = new_channel();
  return ch ? &ch->ch : nullptr;
}

EMU_EXPORT void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (!channel) return;
  std::lock_guard<std::mutex> g(g_mu);
  auto* ch = reinterpret_cast<Channel*>(channel);
  ch->destroyed = true;  // see park_in_destroyed
  if (ch->waiters > 0) {
    uint64_t one = 1;
    ssize_t r = ::write(ch->evfd, &one, sizeof one);  // wake them: they park, the last closes the fds
    (void)r;
    return;
  }
  close_channel_fds(ch);
}

EMU_EXPORT int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  if (!id) return fail(EINVAL);
  Channel* ch = channel ? reinterpret_cast<Channel*>(channel) : new_channel();
  if (!ch) return -1;
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = new_id(ch, context, ps);
  if (!c) {
    if (!channel) free_channel(ch);
    return fail(ENOMEM);
  }
  c->sync = channel == nullptr;
  if (c->sync) c->id.channel = nullptr;
  *id = &c->id;
  return 0;
}

EMU_EXPORT int rdma_destroy_id(rdma_cm_id* id) {
  if (!id) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  Channel* priv = c->sync ? c->chan : nullptr;
  // Accepted sockets that never carried a REQ belong to the listener.
  if (c->st == St::Listening) {
    for (auto it = g_ids.begin(); it != g_ids.end();) {
      CmId* x = (it++)->second;
      if (x->listener == c && x->st == St::PreReq) drop_id(x);
      else if (x->listener == c) x->listener = nullptr;
    }
  }
  delete[] c->id.route.path_rec;
  drop_id(c);
  if (priv) free_channel(priv);
  return 0;
}

EMU_EXPORT int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (!id) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  Channel* to = channel ? reinterpret_cast<Channel*>(channel) : new_channel();
  if (!to) return -1;
  Channel* from = c->chan;
  unwatch(c);
  for (auto it = from->queue.begin(); it != from->queue.end();) {
    if ((*it)->id == id) {
      to->queue.push_back(*it);
      it = from->queue.erase(it);
    } else {
      ++it;
    }
  }
  if (!to->queue.empty()) {
    uint64_t one = 1;
    ssize_t r = ::write(to->evfd, &one, sizeof one);
    (void)r;
  }
  c->chan = to;
  if (c->sock >= 0) watch(c);
  if (c->sync) free_channel(from);
  c->sync = channel == nullptr;
  c->id.channel = channel;
  return 0;
}

EMU_EXPORT int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail(EINVAL);
  return get_event(reinterpret_cast<Channel*>(channel), event);
}

EMU_EXPORT int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  delete reinterpret_cast<Event*>(event);
  return 0;
}

// ---------------------------------------------------------------- addresses and routes

EMU_EXPORT int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (!id || !addr) return fail(EINVAL);
  if (addr->sa_family != AF_INET) return fail(EAFNOSUPPORT);  // IPv4 only (see the file comment)
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::Idle) return fail(EINVAL);
  const auto* sin = reinterpret_cast<const sockaddr_in*>(addr);
  c->id.route.addr.src_sin = *sin;
  if (sin->sin_addr.s_addr != INADDR_ANY)
    if (int e = bind_device(c, sin->sin_addr.s_addr, true)) return fail(e);
  c->st = St::Bound;
  return 0;
}

EMU_EXPORT int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int /*timeout_ms*/) {
  if (!id || !dst) return fail(EINVAL);
  if (dst->sa_family != AF_INET || (src && src->sa_family != AF_INET)) return fail(EAFNOSUPPORT);
  std::unique_lock<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::Idle && c->st != St::Bound) return fail(EINVAL);
  if (src && c->st == St::Idle) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(src);
    c->id.route.addr.src_sin = *s;
    if (s->sin_addr.s_addr != INADDR_ANY)
      if (int e = bind_device(c, s->sin_addr.s_addr, true)) return fail(e);
  }
  c->id.route.addr.dst_sin = *reinterpret_cast<const sockaddr_in*>(dst);
  c->id.route.addr.src_sin.sin_family = AF_INET;
  if (c->id.route.addr.src_sin.sin_port == 0)
    c->id.route.addr.src_sin.sin_port = htons(static_cast<uint16_t>(32768 + random_psn() % 28232));
  // Resolution is immediate: the fabric knows every address. The outcome is an event.
  int e = bind_device(c, c->id.route.addr.dst_sin.sin_addr.s_addr, false);
  if (e == 0) {
    // On Ethernet the destination GID is the address's IPv4-mapped GID; on InfiniBand the
    // peer's port GID arrives with its REP.
    if (c->link_layer != IBV_LINK_LAYER_INFINIBAND) {
      ibv_gid& d = c->id.route.addr.addr.ibaddr.dgid;
      std::memset(d.raw, 0, 10);
      d.raw[10] = d.raw[11] = 0xff;
      std::memcpy(d.raw + 12, &c->id.route.addr.dst_sin.sin_addr.s_addr, 4);
    }
    c->st = St::AddrResolved;
    push(c->chan, c, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
  } else {
    push(c->chan, c, RDMA_CM_EVENT_ADDR_ERROR, -e);
  }
  if (!c->sync) return 0;
  g.unlock();
  return wait_for(c, RDMA_CM_EVENT_ADDR_RESOLVED);
}

EMU_EXPORT int rdma_resolve_route(rdma_cm_id* id, int /*timeout_ms*/) {
  if (!id) return fail(EINVAL);
  std::unique_lock<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::AddrResolved) return fail(EINVAL);
  auto* rec = new (std::nothrow) ibv_sa_path_rec[1]();
  if (!rec) return fail(ENOMEM);
  rec->sgid = c->id.route.addr.addr.ibaddr.sgid;
  rec->dgid = c->id.route.addr.addr.ibaddr.dgid;
  rec->slid = htons(c->lid);
  rec->pkey = htons(0xffff);
  rec->mtu = c->active_mtu;
  rec->hop_limit = c->link_layer == IBV_LINK_LAYER_INFINIBAND ? 0 : 64;
  rec->traffic_class = c->tos;
  rec->numb_path = 1;
  delete[] c->id.route.path_rec;
  c->id.route.path_rec = rec;
  c->id.route.num_paths = 1;
  c->st = St::RouteResolved;
  push(c->chan, c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  if (!c->sync) return 0;
  g.unlock();
  return wait_for(c, RDMA_CM_EVENT_ROUTE_RESOLVED);
}

EMU_EXPORT __be16 rdma_get_src_port(rdma_cm_id* id) { return id ? id->route.addr.src_sin.sin_port : 0; }
EMU_EXPORT __be16 rdma_get_dst_port(rdma_cm_id* id) { return id ? id->route.addr.dst_sin.sin_port : 0; }

EMU_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                                rdma_addrinfo** res) {
  if (!res || (!node && !service)) return EAI_NONAME;
  const bool passive = hints && (hints->ai_flags & RAI_PASSIVE);
  if (hints && hints->ai_family && hints->ai_family != AF_INET) return EAI_FAMILY;  // IPv4 only
  addrinfo h{};
  h.ai_family = AF_INET;
  h.ai_socktype = SOCK_STREAM;
  if (passive) h.ai_flags |= AI_PASSIVE;
  if (hints && (hints->ai_flags & RAI_NUMERICHOST)) h.ai_flags |= AI_NUMERICHOST;
  addrinfo* ai = nullptr;
  if (int e = getaddrinfo(node, service, &h, &ai)) return e;
  auto* r = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  auto* addr = static_cast<sockaddr_in*>(std::calloc(1, sizeof(sockaddr_in)));
  if (!r || !addr) {
    std::free(r);
    std::free(addr);
    freeaddrinfo(ai);
    return EAI_MEMORY;
  }
  std::memcpy(addr, ai->ai_addr, sizeof *addr);
  freeaddrinfo(ai);
  r->ai_flags = hints ? hints->ai_flags : 0;
  r->ai_family = AF_INET;
  r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
  r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type
                  : r->ai_port_space == RDMA_PS_UDP || r->ai_port_space == RDMA_PS_IPOIB ? IBV_QPT_UD
                                                                                         : IBV_QPT_RC;
  if (passive) {
    r->ai_src_addr = reinterpret_cast<sockaddr*>(addr);
    r->ai_src_len = sizeof *addr;
  } else {
    r->ai_dst_addr = reinterpret_cast<sockaddr*>(addr);
    r->ai_dst_len = sizeof *addr;
    if (hints && hints->ai_src_addr && hints->ai_src_len) {
      r->ai_src_addr = static_cast<sockaddr*>(std::malloc(hints->ai_src_len));
      if (!r->ai_src_addr) {
        rdma_freeaddrinfo(r);
        return EAI_MEMORY;
      }
      std::memcpy(r->ai_src_addr, hints->ai_src_addr, hints->ai_src_len);
      r->ai_src_len = hints->ai_src_len;
    }
  }
  *res = r;
  return 0;
}

EMU_EXPORT void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_route);
    std::free(res->ai_connect);
    std::free(res);
    res = next;
  }
}

// ---------------------------------------------------------------- QPs

EMU_EXPORT int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (!id || !attr) return fail(EINVAL);
  if (attr->srq) return fail(EOPNOTSUPP);  // SRQs are not modelled
  std::lock_guard<std::mutex> g(g_mu);
  if (int e = create_qp_common(cm(id), attr)) return fail(e);
  return 0;
}

EMU_EXPORT int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (!id || !attr) return fail(EINVAL);
  if (attr->srq) return fail(EOPNOTSUPP);
  ibv_qp_init_attr_ex x{};
  std::memcpy(&x, attr, sizeof *attr);  // the _ex struct starts with ibv_qp_init_attr's fields
  x.pd = pd;
  x.comp_mask = pd ? IBV_QP_INIT_ATTR_PD : 0;
  std::lock_guard<std::mutex> g(g_mu);
  if (int e = create_qp_common(cm(id), &x)) return fail(e);
  std::memcpy(attr, &x, sizeof *attr);  // granted capacities and the CQs made here
  return 0;
}

EMU_EXPORT void rdma_destroy_qp(rdma_cm_id* id) {
  if (!id) return;
  std::lock_guard<std::mutex> g(g_mu);
  destroy_qp_common(cm(id));
}

EMU_EXPORT int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* attr, int* mask) {
  if (!id || !attr || !mask) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  if (int e = qp_attr_for(cm(id), attr->qp_state, attr, mask)) return fail(e);
  return 0;
}

EMU_EXPORT int rdma_create_srq(rdma_cm_id*, ibv_pd*, ibv_srq_init_attr*) { return fail(EOPNOTSUPP); }

// ---------------------------------------------------------------- connections

EMU_EXPORT int rdma_listen(rdma_cm_id* id, int backlog) {
  if (!id) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::Bound) return fail(EINVAL);
  const char* dir = tbemu_state_dir(nullptr);
  if (!dir) return fail(EINVAL);
  const std::string state_dir = dir;
  const uint32_t ip = c->id.route.addr.src_sin.sin_addr.s_addr;
  const bool pick = c->id.route.addr.src_sin.sin_port == 0;
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  int stale = 0;
  for (int attempt = 0; attempt < 64; ++attempt) {
    if (pick) c->id.route.addr.src_sin.sin_port = htons(static_cast<uint16_t>(32768 + random_psn() % 28232));
    std::string path = listen_path(state_dir, c->id.ps, ip, this_host(), ntohs(c->id.route.addr.src_sin.sin_port));
    sockaddr_un a, tmp;
    const std::string tmp_path = path + ".new";
    if (int e = unix_addr(path, &a); e || (e = unix_addr(tmp_path, &tmp))) {
      ::close(s);
      return fail(e);
    }
    // The listener appears under its name only once it listens (bound under a temporary name,
    // then renamed): a client never meets a bound socket that refuses it for a moment.
    ::unlink(tmp_path.c_str());
    if (::bind(s, reinterpret_cast<sockaddr*>(&tmp), sizeof tmp) != 0 ||
        ::listen(s, backlog > 0 ? backlog : 16) != 0) {
      int e = errno;
      ::close(s);
      ::unlink(tmp_path.c_str());
      return fail(e);
    }
    if (::link(tmp_path.c_str(), path.c_str()) == 0) {  // like rename, but never replaces a live one
      ::unlink(tmp_path.c_str());
      c->sock = s;
      c->listen_path = path;
      c->st = St::Listening;
      watch(c);
      return 0;
    }
    const int link_err = errno;
    ::unlink(tmp_path.c_str());
    ::close(s);
    s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    if (link_err != EEXIST) {
      errno = link_err;
      break;
    }
    // A listener's file outlives a process that died: gone if nobody accepts on it.
    int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    bool alive = probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (probe >= 0) ::close(probe);
    if (!alive) {
      ::unlink(path.c_str());
      if (++stale > 8) break;  // removed again and again: another process keeps making it
      --attempt;               // the same path once more
      continue;
    }
    if (!pick) {
      errno = EADDRINUSE;
      break;
    }
  }
  int e = errno;
  ::close(s);
  return fail(e);
}

EMU_EXPORT int rdma_connect(rdma_cm_id* id, rdma_conn_param* param) {
  if (!id) return fail(EINVAL);
  std::unique_lock<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::RouteResolved) return fail(EINVAL);
  if (int e = copy_conn(c, param, kMaxReqPrivate)) return fail(e);
  const char* dir = tbemu_state_dir(nullptr);
  if (!dir) return fail(EINVAL);
  const sockaddr_in& dst = c->id.route.addr.dst_sin;
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  // No listener yet: the REQ is tried again for up to kNoListenerGraceMs before the reject (our
  // assumption, docs/emulator.md). A real fabric takes milliseconds to resolve the address and
  // the route, which hides the race of programs that listen again right after a first
  // connection (perftest -R: its control connection, then the test's); the emulator resolves
  // at once, and perftest's client then failed 1 run in 5 (issue 19 item 9).
  bool connected = false;
  for (int waited_ms = 0; !connected; waited_ms += 5) {
    for (uint32_t ip : {dst.sin_addr.s_addr, 0u}) {
      sockaddr_un a;
      if (unix_addr(listen_path(dir, c->id.ps, ip, c->peer_host, ntohs(dst.sin_port)), &a) != 0) continue;
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        connected = true;
        break;
      }
    }
    if (connected || waited_ms >= kNoListenerGraceMs) break;
    ::usleep(5000);
  }
  if (!connected) {
    ::close(s);
    // Nobody listens on that service: the peer's CM answers with a reject.
    c->st = St::Rejected;
    push(c->chan, c, RDMA_CM_EVENT_REJECTED, kRejInvalidServiceId);
  } else {
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    c->sock = s;
    Msg m = local_msg(c, kReq);
    if (!c->id.qp && param) m.qpn = param->qp_num;
    if (param) {
      m.flow_control = param->flow_control;
      m.srq = param->srq;
    }
    put_private(m, param);
    if (int e = send_msg(c, m)) {
      close_sock(c);
      return fail(e);
    }
    c->st = St::Connecting;
    watch(c);
  }
  if (!c->sync) return 0;
  g.unlock();
  return wait_for(c, c->id.qp ? RDMA_CM_EVENT_ESTABLISHED : RDMA_CM_EVENT_CONNECT_RESPONSE);
}

EMU_EXPORT int rdma_establish(rdma_cm_id* id) {
  if (!id) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::RepReceived || c->id.qp) return fail(EINVAL);
  Msg m = local_msg(c, kRtu);
  if (int e = send_msg(c, m)) return fail(e);
  c->st = St::Connected;
  return 0;
}

EMU_EXPORT int rdma_accept(rdma_cm_id* id, rdma_conn_param* param) {
  if (!id) return fail(EINVAL);
  std::unique_lock<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::ReqReceived) return fail(EINVAL);
  if (int e = copy_conn(c, param, kMaxRepPrivate)) return fail(e);
  if (c->id.qp) {
    if (int e = connect_qp(c)) {
      Msg r = local_msg(c, kRej);
      r.status = kRejConsumer;
      send_msg(c, r);
      return fail(e);
    }
  }
  Msg m = local_msg(c, kRep);
  if (!c->id.qp && param) m.qpn = param->qp_num;
  put_private(m, param);
  if (int e = send_msg(c, m)) return fail(e);
  c->st = St::Accepted;
  if (!c->sync) return 0;
  g.unlock();
  return wait_for(c, RDMA_CM_EVENT_ESTABLISHED);
}

EMU_EXPORT int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  if (!id) return fail(EINVAL);
  if (private_data_len > kMaxRejPrivate) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (c->st != St::ReqReceived) return fail(EINVAL);
  Msg m = local_msg(c, kRej);
  m.status = kRejConsumer;
  if (private_data && private_data_len) {
    m.private_len = private_data_len;
    std::memcpy(m.private_data, private_data, private_data_len);
  }
  int e = send_msg(c, m);
  close_sock(c);
  c->st = St::Rejected;
  return e ? fail(e) : 0;
}

EMU_EXPORT int rdma_disconnect(rdma_cm_id* id) {
  if (!id) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  // rdma_disconnect(3): "transitions any associated QP to the error state".
  qp_to_error(c);
  if (c->st != St::Connected && c->st != St::Accepted && c->st != St::Disconnected) return fail(EINVAL);
  if (c->st != St::Disconnected) {
    Msg m = local_msg(c, kDreq);
    send_msg(c, m);  // a peer already gone has nothing to tell
    close_sock(c);
    c->st = St::Disconnected;
    push(c->chan, c, RDMA_CM_EVENT_DISCONNECTED, 0);
  }
  return 0;
}

EMU_EXPORT int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id) return fail(EINVAL);
  CmId* l = cm(listen);
  if (!l->sync) return fail(EINVAL);  // rdma_get_request(3): synchronous listeners only
  rdma_cm_event* e = nullptr;
  if (wait_for(l, RDMA_CM_EVENT_CONNECT_REQUEST, &e) != 0) return -1;
  CmId* c = cm(e->id);
  rdma_ack_cm_event(e);
  // The new id is synchronous too, with a channel of its own.
  if (rdma_migrate_id(&c->id, nullptr) != 0) return -1;
  if (l->has_ep_attr) {
    ibv_qp_init_attr a = l->ep_attr;
    if (rdma_create_qp(&c->id, l->ep_pd, &a) != 0) {
      int err = errno;
      rdma_reject(&c->id, nullptr, 0);
      rdma_destroy_id(&c->id);
      return fail(err);
    }
  }
  *id = &c->id;
  return 0;
}

EMU_EXPORT int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !res) return fail(EINVAL);
  rdma_cm_id* cid = nullptr;
  if (rdma_create_id(nullptr, &cid, nullptr, static_cast<rdma_port_space>(res->ai_port_space)) != 0) return -1;
  CmId* c = cm(cid);
  c->id.qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  // The QP's type is the address's (rdma_create_ep(3): the QP is "used for communication" on
  // that address), whatever the caller left in the attributes.
  if (qp_init_attr) qp_init_attr->qp_type = c->id.qp_type;
  int r = 0;
  if (res->ai_flags & RAI_PASSIVE) {
    r = rdma_bind_addr(cid, res->ai_src_addr);
    if (r == 0 && qp_init_attr) {
      c->has_ep_attr = true;
      c->ep_attr = *qp_init_attr;
      c->ep_pd = pd;
    }
  } else {
    r = rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (r == 0) r = rdma_resolve_route(cid, 2000);
    if (r == 0 && qp_init_attr) r = rdma_create_qp(cid, pd, qp_init_attr);
  }
  if (r != 0) {
    int e = errno;
    rdma_destroy_id(cid);
    return fail(e);
  }
  *id = cid;
  return 0;
}

EMU_EXPORT void rdma_destroy_ep(rdma_cm_id* id) {
  if (!id) return;
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
}

// ---------------------------------------------------------------- devices, options, strings

EMU_EXPORT ibv_context** rdma_get_devices(int* num_devices) {
  if (num_devices) *num_devices = 0;
  std::lock_guard<std::mutex> g(g_mu);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  auto** out = static_cast<ibv_context**>(std::calloc(names.size() + 1, sizeof(ibv_context*)));
  if (!out) return nullptr;
  int k = 0;
  for (const std::string& name : names)
    if (Device* d = device_named(name)) out[k++] = d->ctx;
  if (num_devices) *num_devices = k;
  return out;
}

EMU_EXPORT void rdma_free_devices(ibv_context** list) { std::free(list); }  // the contexts stay open

EMU_EXPORT int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (!id || !optval) return fail(EINVAL);
  std::lock_guard<std::mutex> g(g_mu);
  CmId* c = cm(id);
  if (!live(c)) return fail(EINVAL);  // destroyed, or never an id (perftest passes one after a failed connect)
  if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_TOS && optlen == sizeof(uint8_t)) {
    c->tos = *static_cast<uint8_t*>(optval);  // becomes the GRH traffic class
    return 0;
  }
  if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_ACK_TIMEOUT && optlen == sizeof(uint8_t))
    return 0;  // RC retry timing is the emulator's (see docs/emulator.md, data path)
  if (level == RDMA_OPTION_ID && (optname == RDMA_OPTION_ID_REUSEADDR || optname == RDMA_OPTION_ID_AFONLY) &&
      optlen == sizeof(int))
    return 0;  // listeners never linger and only IPv4 exists here
  return fail(ENOSYS);  // what rdma-core answers for an option it does not know
}

EMU_EXPORT const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
    default: return "UNKNOWN EVENT";
  }
}

// ---------------------------------------------------------------- not modelled

EMU_EXPORT int rdma_join_multicast(rdma_cm_id*, sockaddr*, void*) { return fail(EOPNOTSUPP); }
EMU_EXPORT int rdma_join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*) { return fail(EOPNOTSUPP); }
EMU_EXPORT int rdma_leave_multicast(rdma_cm_id*, sockaddr*) { return fail(EOPNOTSUPP); }
EMU_EXPORT int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }
EMU_EXPORT int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }

// rsockets: no rsocket can be created, so every other call names a descriptor that is not one.
EMU_EXPORT int rsocket(int, int, int) { return fail(EOPNOTSUPP); }
EMU_EXPORT int rbind(int, const sockaddr*, socklen_t) { return fail(EBADF); }
EMU_EXPORT int rlisten(int, int) { return fail(EBADF); }
EMU_EXPORT int raccept(int, sockaddr*, socklen_t*) { return fail(EBADF); }
EMU_EXPORT int rconnect(int, const sockaddr*, socklen_t) { return fail(EBADF); }
EMU_EXPORT int rshutdown(int, int) { return fail(EBADF); }
EMU_EXPORT int rclose(int) { return fail(EBADF); }
EMU_EXPORT ssize_t rrecv(int, void*, size_t, int) { return fail(EBADF); }
EMU_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) { return fail(EBADF); }
EMU_EXPORT ssize_t rsend(int, const void*, size_t, int) { return fail(EBADF); }
EMU_EXPORT ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) { return fail(EBADF); }
EMU_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) { return fail(EBADF); }
EMU_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) { return fail(EBADF); }
EMU_EXPORT int rfcntl(int, int, ...) { return fail(EBADF); }
EMU_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) { return fail(EBADF); }
EMU_EXPORT int riounmap(int, void*, size_t) { return fail(EBADF); }
EMU_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) {
  errno = EBADF;
  return 0;
}
// Every descriptor is an ordinary one, so rpoll is poll (rping, ucmatose and others call it
// on their event channel's fd).
EMU_EXPORT int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return ::poll(fds, nfds, timeout); }

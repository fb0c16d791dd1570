// Asynchronous events (ibv_get_async_event, ibv_ack_async_event): what the emulator raises and
// when (docs/emulator.md, "Asynchronous events").
//
// - IBV_EVENT_PORT_ERR / IBV_EVENT_PORT_ACTIVE: a port's state changed since the context last
//   reported it (tbverbs-emu port-down / port-up, on either end of the cable).
// - IBV_EVENT_QP_FATAL: tbverbs-emu fault qp-fatal put the QP in ERR, as a local work-queue
//   catastrophic error does (an error no completion reports; ibv_get_async_event(3)). Its owner
//   flushes the QP's outstanding work requests (WR_FLUSH_ERR), as hardware does for a QP in ERR.
// - IBV_EVENT_CQ_ERR: a CQ overran (completions were lost); on hardware the CQ is then unusable.
// - IBV_EVENT_DEVICE_FATAL: tbverbs-emu device-remove took the device away; every QP of the
//   context goes to ERR (flushed), its ports read PORT_DOWN, and no port events follow.
//
// Other processes change the shared state (a CLI, the peer that overran a CQ); the owning
// process acts on it when it next looks: in ibv_get_async_event, and, while one of these faults is
// armed, in post_send, post_recv and poll_cq (their fault check is on its slow branch then), so a
// program that never reads async events still sees its work requests flushed.
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "local.hpp"

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace emu {

namespace {

EmuContext* context_of(ibv_context* c) { return reinterpret_cast<EmuContext*>(verbs_get_ctx(c)); }

ibv_async_event event_of(ibv_event_type type) {
  ibv_async_event e;
  std::memset(&e, 0, sizeof e);
  e.event_type = type;
  return e;
}

// Disarms the QP-fatal faults whose QPs have been acted on (or are gone), and the count with them.
void retire_qp_faults(Shared* s) {
  Guard g(s->lock);
  for (auto& ft : s->faults) {
    if (ft.kind != kFaultQpFatal) continue;
    const ShmQp& q = s->qps[ft.qpn & (kMaxQps - 1)];
    const bool same = q.in_use && q.qpn == ft.qpn;
    if (same && __atomic_load_n(&q.fatal, __ATOMIC_ACQUIRE) == 1) continue;  // its owner has not looked yet
    ft.kind = kFaultNone;
    __atomic_sub_fetch(&s->nfaults, 1u, __ATOMIC_RELEASE);
  }
}

// The next port event of `c`, if a port's state changed since it last reported. Caller holds
// c->events_mu.
bool take_port_event(EmuContext* c, ibv_async_event* event) {
  for (int p = 1; p <= c->ports; ++p) {
    const uint32_t bit = 1u << (p - 1);
    const bool active = port_active(*c->fab, c->fab->find_port(c->dev, static_cast<uint8_t>(p)));
    if (active == ((c->ports_seen_active & bit) != 0)) continue;
    c->ports_seen_active ^= bit;
    *event = event_of(active ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
    event->element.port_num = p;
    return true;
  }
  return false;
}

} // namespace

namespace {
// Drops `obj` from a context's list, with any event about it not yet read: handed out later it
// would point at a destroyed object. `about(e)` says whether event `e` names it.
template <class T, class About> void forget(EmuContext* c, std::vector<T*>& list, T* obj, About about) {
  std::lock_guard<std::mutex> g(c->events_mu);
  list.erase(std::remove(list.begin(), list.end(), obj), list.end());
  c->queued.erase(std::remove_if(c->queued.begin(), c->queued.end(), about), c->queued.end());
}
} // namespace

void register_qp(EmuContext* c, EmuQp* q) {
  std::lock_guard<std::mutex> g(c->events_mu);
  c->qps.push_back(q);
}
void unregister_qp(EmuContext* c, EmuQp* q) {
  forget(c, c->qps, q, [&](const ibv_async_event& e) {
    return e.event_type == IBV_EVENT_QP_FATAL && e.element.qp == &q->qp;
  });
}
void register_cq(EmuContext* c, EmuCq* q) {
  std::lock_guard<std::mutex> g(c->events_mu);
  c->cqs.push_back(q);
}
void unregister_cq(EmuContext* c, EmuCq* q) {
  if (!c) return;
  forget(c, c->cqs, q, [&](const ibv_async_event& e) {
    return e.event_type == IBV_EVENT_CQ_ERR && e.element.cq == &q->cq;
  });
}

void apply_async_faults(EmuContext* c) {
  if (!c) return;
  bool acted = false;
  {
    std::lock_guard<std::mutex> g(c->events_mu);
    const bool gone = device_removed(*c->fab, c->dev);
    if (gone && !c->device_fatal_reported) {
      c->device_fatal_reported = true;
      c->queued.push_back(event_of(IBV_EVENT_DEVICE_FATAL));
    }
    for (EmuQp* q : c->qps) {
      // Each QP is acted on once: fatal goes 1 (raised) or, on a removed device, anything to 2.
      uint32_t raised = 1;
      const bool act = gone ? __atomic_exchange_n(&q->s->fatal, 2u, __ATOMIC_ACQ_REL) != 2
                            : __atomic_compare_exchange_n(&q->s->fatal, &raised, 2u, false, __ATOMIC_ACQ_REL,
                                                          __ATOMIC_ACQUIRE);
      if (!act) continue;
      if (!gone) {  // a removed device reports DEVICE_FATAL only
        ibv_async_event e = event_of(IBV_EVENT_QP_FATAL);
        e.element.qp = &q->qp;
        c->queued.push_back(e);
      }
      acted = true;
      // Lock order: events_mu, then the QP's own (nothing takes events_mu under q->mu).
      std::lock_guard<std::mutex> gq(q->mu);
      qp_to_error(q);
    }
  }
  if (acted) retire_qp_faults(c->fab->shm);
}

bool take_async_event(EmuContext* c, ibv_async_event* event) {
  apply_async_faults(c);
  std::lock_guard<std::mutex> g(c->events_mu);
  for (EmuCq* q : c->cqs) {
    uint32_t overran = 1;  // cq_push sets 1 on the first lost completion; 2 = reported
    if (__atomic_compare_exchange_n(&q->s->overflow, &overran, 2u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      ibv_async_event e = event_of(IBV_EVENT_CQ_ERR);
      e.element.cq = &q->cq;
      c->queued.push_back(e);
    }
  }
  if (!c->queued.empty()) {
    *event = c->queued.front();
    c->queued.pop_front();
    return true;
  }
  if (c->device_fatal_reported) return false;  // a removed device's ports raise nothing more
  return take_port_event(c, event);
}

} // namespace emu

using namespace emu;

EMU_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  EmuContext* c = context ? context_of(context) : nullptr;
  if (!c || !event) {
    errno = EINVAL;
    return -1;
  }
  // A non-blocking async fd (the usual way to poll for events) answers EAGAIN at once when no
  // event is pending, as rdma-core's read() does; a blocking one waits for an event (looking
  // every 10 ms) until a signal ends the wait with EINTR.
  const bool nonblocking = (fcntl(c->v.context.async_fd, F_GETFL) & O_NONBLOCK) != 0;
  for (;;) {
    if (take_async_event(c, event)) return 0;
    if (nonblocking) {
      errno = EAGAIN;
      return -1;
    }
    pollfd p{c->v.context.async_fd, POLLIN, 0};
    if (::poll(&p, 1, 10) < 0) return -1;  // errno: EINTR
  }
}

// Events hold no resources here (rdma-core counts them so destroy can wait for the acks).
EMU_EXPORT void ibv_ack_async_event(ibv_async_event*) {}

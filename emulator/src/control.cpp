// C control API (include/tbverbs_emu/control.h): run-time fabric state and faults.
#include "tbverbs_emu/control.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <sstream>
#include <cstring>
#include <string>
#include <vector>

#include "emu.hpp"

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

using namespace emu;

namespace {

thread_local std::string t_error;

int fail(int err, const std::string& msg) {
  t_error = msg;
  return err;
}

// Resolves the fabric, reporting a bad file as EINVAL.
Fabric* fabric_of(const char* path, int* err) {
  try {
    return path ? &load_fabric(path) : &env_fabric();
  } catch (const std::exception& e) {
    *err = fail(EINVAL, e.what());
    return nullptr;
  }
}

int lookup_port(Fabric& f, const char* host, const char* device, int port, int* out) {
  int h = f.find_host(host ? host : "");
  if (h < 0) return fail(ENOENT, std::string("unknown host \"") + (host ? host : "") + "\"");
  int d = f.find_device(h, device ? device : "");
  if (d < 0) return fail(ENOENT, std::string("host ") + host + " has no device \"" + (device ? device : "") + "\"");
  *out = f.find_port(d, port);
  if (*out < 0) return fail(ENOENT, std::string(host) + ":" + device + " has no port " + std::to_string(port));
  return 0;
}

int host_index(Fabric& f, const char* host, int* out) {
  *out = -1;
  if (!host || !*host) return 0;
  *out = f.find_host(host);
  return *out < 0 ? fail(ENOENT, std::string("unknown host \"") + host + "\"") : 0;
}

void free_leaked_pds(Shared* s) {
  for (auto& p : s->pds)
    if (p.in_use && p.pid < 0) p.in_use = 0;
}

// Arms a fault of `kind` on `host` (-1: any) in a free slot: `fill` sets its other fields before
// it is published (kind, then the count the data path's fast check reads). Caller holds s->lock.
template <class Fill> int arm_fault(Shared* s, uint32_t kind, int32_t host, Fill fill) {
  ShmFault* ft = nullptr;
  for (auto& x : s->faults)
    if (x.kind == kFaultNone) {
      ft = &x;
      break;
    }
  if (!ft) return fail(ENOSPC, "too many faults armed (limit 32)");
  std::memset(ft, 0, sizeof *ft);
  ft->host = host;
  fill(*ft);
  __atomic_store_n(&ft->kind, kind, __ATOMIC_RELEASE);
  __atomic_add_fetch(&s->nfaults, 1u, __ATOMIC_RELEASE);
  return 0;
}

// The live QP numbered `qpn`, or null (ENOENT said). Caller holds s->lock.
ShmQp* live_qp(Shared* s, uint32_t qpn) {
  ShmQp& q = s->qps[qpn & (kMaxQps - 1)];
  if (q.in_use && q.qpn == qpn) return &q;
  fail(ENOENT, "no QP with number " + std::to_string(qpn));
  return nullptr;
}

}  // namespace

EMU_EXPORT const char* tbemu_last_error(void) { return t_error.c_str(); }

EMU_EXPORT int tbemu_reset(const char* fabric) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  Shared* s = f->shm;
  // In place rather than deleting the file, so processes that have it mapped
  // (this one included) keep seeing the same state.
  Guard g(s->lock);
  for (size_t i = 0; i < f->ports.size(); ++i) {
    s->ports[i].up = f->ports[i].initially_up;
    s->ports[i].has_ip = f->ports[i].initial_has_ip;
    s->ports[i].ip = f->ports[i].initial_ip;
    s->ports[i].prefix = f->ports[i].initial_prefix;
  }
  std::memset(s->faults, 0, sizeof s->faults);
  __atomic_store_n(&s->nfaults, 0u, __ATOMIC_RELEASE);  // read without the lock by the fault checks
  for (auto& q : s->qps) q.drop_tx = 0;
  for (uint32_t i = 0; i < kNumQuirks; ++i) __atomic_store_n(&s->quirks[i], f->quirks[i], __ATOMIC_RELAXED);
  for (auto& n : s->stale_transfers) __atomic_store_n(&n, 0u, __ATOMIC_RELAXED);
  free_leaked_pds(s);  // a reboot
  collect_dead(s);
  remove_dead_records(f->state_dir);
  // Channel FIFOs left behind by processes that died.
  if (DIR* d = opendir(f->state_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      int pid = 0;
      unsigned id = 0;
      if (std::sscanf(e->d_name, "chan-%d-%u", &pid, &id) == 2 && !pid_alive(pid))
        ::unlink((f->state_dir + "/" + e->d_name).c_str());
    }
    closedir(d);
  }
  return 0;
}

EMU_EXPORT int tbemu_set_ipv4(const char* fabric, const char* host, const char* device, int port, const char* cidr) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int p;
  if (int e = lookup_port(*f, host, device, port, &p)) return e;
  uint32_t ip, prefix;
  if (!cidr || !parse_cidr(cidr, &ip, &prefix))
    return fail(EINVAL, std::string("bad IPv4 address \"") + (cidr ? cidr : "") + "\" (expected a.b.c.d/prefix)");
  Guard g(f->shm->lock);
  ShmPort& sp = f->shm->ports[p];
  // Clear first so a concurrent GID read never sees a half-written address.
  __atomic_store_n(&sp.has_ip, 0u, __ATOMIC_RELEASE);
  sp.ip = ip;
  sp.prefix = prefix;
  __atomic_store_n(&sp.has_ip, 1u, __ATOMIC_RELEASE);
  return 0;
}

EMU_EXPORT int tbemu_clear_ipv4(const char* fabric, const char* host, const char* device, int port) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int p;
  if (int e = lookup_port(*f, host, device, port, &p)) return e;
  Guard g(f->shm->lock);
  __atomic_store_n(&f->shm->ports[p].has_ip, 0u, __ATOMIC_RELEASE);
  return 0;
}

EMU_EXPORT int tbemu_set_port_up(const char* fabric, const char* host, const char* device, int port, int up) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int p;
  if (int e = lookup_port(*f, host, device, port, &p)) return e;
  Guard g(f->shm->lock);
  __atomic_store_n(&f->shm->ports[p].up, up ? 1u : 0u, __ATOMIC_RELEASE);
  return 0;
}

EMU_EXPORT int tbemu_fault_fail_call(const char* fabric, const char* host, const char* verb, uint64_t nth, int errnum,
                                     uint32_t count) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int h;
  if (int e = host_index(*f, host, &h)) return e;
  if (!verb || std::strncmp(verb, "ibv_", 4) != 0 || std::strlen(verb) >= sizeof(ShmFault::verb))
    return fail(EINVAL, "verb must be a name such as ibv_create_qp");
  if (nth == 0 || errnum <= 0) return fail(EINVAL, "nth must be >= 1 and errno > 0");
  Guard g(f->shm->lock);
  return arm_fault(f->shm, kFaultFailCall, h, [&](ShmFault& ft) {
    std::strcpy(ft.verb, verb);
    ft.nth = nth;
    ft.count = count;
    ft.err = errnum;
  });
}

EMU_EXPORT int tbemu_fault_drop_qp(const char* fabric, uint32_t qpn) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  Guard g(f->shm->lock);
  ShmQp* q = live_qp(f->shm, qpn);
  if (!q) return ENOENT;
  __atomic_store_n(&q->drop_tx, 1u, __ATOMIC_RELEASE);
  return 0;
}

EMU_EXPORT int tbemu_fault_qp_fatal(const char* fabric, uint32_t qpn) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  Guard g(f->shm->lock);
  ShmQp* q = live_qp(f->shm, qpn);
  if (!q) return ENOENT;
  // ERR at once for the peer's sends (they meet a QP that receives nothing); the owner flushes
  // the QP's own work requests and reports the event (async_events.cpp).
  return arm_fault(f->shm, kFaultQpFatal, -1, [&](ShmFault& ft) {
    ft.qpn = qpn;
    __atomic_store_n(&q->state, static_cast<uint32_t>(IBV_QPS_ERR), __ATOMIC_RELEASE);
    __atomic_store_n(&q->fatal, 1u, __ATOMIC_RELEASE);
  });
  return 0;
}

EMU_EXPORT int tbemu_set_device_removed(const char* fabric, const char* host, const char* device, int removed) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  const int h = f->find_host(host ? host : "");
  const int d = f->find_device(h, device ? device : "");
  if (d < 0) return fail(ENOENT, std::string("unknown host or device \"") + (host ? host : "") + ":" +
                                     (device ? device : "") + "\"");
  Shared* s = f->shm;
  Guard g(s->lock);
  for (std::size_t p = 0; p < f->ports.size(); ++p)
    if (f->ports[p].device == d) __atomic_store_n(&s->ports[p].removed, removed ? 1u : 0u, __ATOMIC_RELEASE);
  // While removed, an armed fault keeps the data path's check on its slow branch, where the
  // device's contexts find out (async_events.cpp).
  ShmFault* armed = nullptr;
  for (auto& ft : s->faults)
    if (ft.kind == kFaultDeviceRemoved && ft.device == d) armed = &ft;
  if (removed && !armed) {
    if (int e = arm_fault(s, kFaultDeviceRemoved, h, [&](ShmFault& ft) { ft.device = d; })) return e;
  } else if (!removed && armed) {
    armed->kind = kFaultNone;
    __atomic_sub_fetch(&s->nfaults, 1u, __ATOMIC_RELEASE);
  }
  return 0;
}

EMU_EXPORT int tbemu_hold_qp_locks_and_stop(const char* fabric, uint32_t qpn) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  ShmQp* found = nullptr;
  {
    Guard g(f->shm->lock);
    found = live_qp(f->shm, qpn);
  }
  if (!found) return ENOENT;
  ShmQp& q = *found;
  const uint32_t cq = q.recv_cq;
  if (cq >= kMaxCqs) return fail(ENOENT, "the QP has no receive CQ");
  Guard qp_lock(q.lock);
  Guard cq_lock(f->shm->cqs[cq].lock);
  ::raise(SIGSTOP);
  return 0;
}

EMU_EXPORT int tbemu_fault_pid_reused(const char* fabric, uint32_t qpn) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  Guard g(f->shm->lock);
  ShmQp* found = live_qp(f->shm, qpn);
  if (!found) return ENOENT;
  ShmQp& q = *found;
  // The process now holding the owner's pid started at another time than the QP's owner did.
  __atomic_store_n(&q.pid_start, q.pid_start + 1, __ATOMIC_RELEASE);
  return 0;
}

namespace {
// Arms one fault of `kind` on `host` (the faults that need nothing but a host and a delay).
int arm_host_fault(const char* fabric, const char* host, uint32_t kind, uint32_t delay_us) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int h;
  if (int e = host_index(*f, host, &h)) return e;
  Guard g(f->shm->lock);
  return arm_fault(f->shm, kind, h, [&](ShmFault& ft) { ft.delay_us = delay_us; });
}
} // namespace

EMU_EXPORT int tbemu_fault_drop_next_qp(const char* fabric, const char* host) {
  return arm_host_fault(fabric, host, static_cast<uint32_t>(kFaultDropNext), 0);
}

EMU_EXPORT int tbemu_fault_delay(const char* fabric, const char* host, uint32_t usec) {
  return arm_host_fault(fabric, host, static_cast<uint32_t>(kFaultDelay), usec);
}

EMU_EXPORT int tbemu_fault_sticky_loss(const char* fabric, const char* host) {
  return arm_host_fault(fabric, host, static_cast<uint32_t>(kFaultStickyLoss), 0);
}

EMU_EXPORT int tbemu_kill_host(const char* fabric, const char* host, int sig, int* killed) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int h;
  if (int e = host_index(*f, host, &h)) return e;
  if (h < 0) return fail(EINVAL, "kill-host needs a host");
  std::vector<int32_t> pids;
  {
    Guard g(f->shm->lock);
    collect_dead(f->shm);
    for (const auto& q : f->shm->qps)
      if (q.in_use && f->devices[q.device].host == h &&
          std::find(pids.begin(), pids.end(), q.pid) == pids.end())
        pids.push_back(q.pid);
  }
  int n = 0;
  for (int32_t pid : pids)
    if (pid != getpid() && ::kill(pid, sig) == 0) ++n;
  if (killed) *killed = n;
  return 0;
}

EMU_EXPORT int tbemu_fault_clear(const char* fabric) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  Guard g(f->shm->lock);
  std::memset(f->shm->faults, 0, sizeof f->shm->faults);
  __atomic_store_n(&f->shm->nfaults, 0u, __ATOMIC_RELEASE);
  for (auto& q : f->shm->qps) __atomic_store_n(&q.drop_tx, 0u, __ATOMIC_RELEASE);
  for (auto& p : f->shm->ports) __atomic_store_n(&p.removed, 0u, __ATOMIC_RELEASE);  // removed devices return
  free_leaked_pds(f->shm);
  return 0;
}

EMU_EXPORT int tbemu_fault_leak_pds(const char* fabric, const char* host, const char* device, int n) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int h = f->find_host(host ? host : "");
  int d = f->find_device(h, device ? device : "");
  if (d < 0) return fail(ENOENT, std::string("unknown host or device \"") + (host ? host : "") + ":" +
                                     (device ? device : "") + "\"");
  if (n < 0) return fail(EINVAL, "the number of PDs must be >= 0");
  Shared* s = f->shm;
  Guard g(s->lock);
  collect_dead(s);
  uint32_t max = limits_of(f->devices[d].profile).max_pd;
  uint32_t used = count_pds(s, d);
  if (used + static_cast<uint32_t>(n) > max)
    return fail(ENOSPC, std::to_string(used) + " of the device's " + std::to_string(max) + " PDs are in use; cannot leak " +
                            std::to_string(n) + " more");
  for (int i = 0; i < n; ++i) {
    ShmPd* slot = nullptr;
    for (auto& p : s->pds)
      if (!p.in_use) {
        slot = &p;
        break;
      }
    if (!slot) return fail(ENOSPC, "PD table full");
    *slot = ShmPd{1, -1, static_cast<uint32_t>(d), s->next_pd++};
  }
  return 0;
}

EMU_EXPORT int tbemu_set_quirks(const char* fabric, const char* assignments) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  QuirkSet q;
  Guard g(f->shm->lock);
  std::memcpy(q, f->shm->quirks, sizeof q);
  try {
    set_quirks(q, assignments ? assignments : "");
  } catch (const std::exception& e) {
    return fail(EINVAL, e.what());
  }
  for (uint32_t i = 0; i < kNumQuirks; ++i) __atomic_store_n(&f->shm->quirks[i], q[i], __ATOMIC_RELAXED);
  return 0;
}

EMU_EXPORT const char* tbemu_quirks(const char* fabric) {
  static thread_local std::string out;
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return nullptr;
  QuirkSet q;
  for (uint32_t i = 0; i < kNumQuirks; ++i) q[i] = __atomic_load_n(&f->shm->quirks[i], __ATOMIC_RELAXED);
  out = format_quirks(q);
  return out.c_str();
}

EMU_EXPORT int tbemu_qp_count(const char* fabric, const char* host, const char* device) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return -err;
  int h = f->find_host(host ? host : "");
  int d = f->find_device(h, device ? device : "");
  if (d < 0) return -fail(ENOENT, "unknown host or device");
  Guard g(f->shm->lock);
  collect_dead(f->shm);
  int n = 0;
  for (const auto& q : f->shm->qps)
    if (q.in_use && q.device == static_cast<uint32_t>(d)) ++n;
  return n;
}

EMU_EXPORT const char* tbemu_gc(int dry_run, int* count) { return tbemu_gc_under(nullptr, dry_run, count); }

EMU_EXPORT const char* tbemu_gc_under(const char* under, int dry_run, int* count) {
  static thread_local std::string report;
  report.clear();
  const auto removed = collect_state_dirs(dry_run != 0, &report, under ? under : "");
  if (count) *count = static_cast<int>(removed.size());
  return report.c_str();
}

EMU_EXPORT int tbemu_route_ipv4(const char* fabric, const char* host, uint32_t ip, char* device, size_t len,
                                int* port, char* peer_host) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return err;
  int h = -1;
  if (host) {
    if (int e = host_index(*f, host, &h)) return e;
  } else {
    std::string msg;
    h = env_host(*f, &msg);
    if (h < 0) return fail(ENOENT, msg);
  }
  const uint32_t want = ntohl(ip);
  int owner = -1;
  {
    Guard g(f->shm->lock);
    for (size_t i = 0; i < f->ports.size() && owner < 0; ++i) {
      const ShmPort& sp = f->shm->ports[i];
      if (sp.has_ip && sp.ip == want) owner = static_cast<int>(i);
    }
  }
  if (owner < 0) return fail(ENOENT, "no port has the address " + format_ipv4(want));
  int local = f->ports[owner].host == h ? owner : f->ports[owner].peer;
  if (local < 0 || f->ports[local].host != h)
    return fail(ENETUNREACH, f->port_label(owner) + " holds " + format_ipv4(want) + ", and no cable of " +
                                 f->hosts[h].name + " reaches it");
  const std::string& dev = f->devices[f->ports[local].device].name;
  const std::string& ph = f->hosts[f->ports[owner].host].name;
  if (dev.size() >= len || ph.size() >= len) return fail(ENAMETOOLONG, "buffer too small");
  std::snprintf(device, len, "%s", dev.c_str());
  std::snprintf(peer_host, len, "%s", ph.c_str());
  *port = f->ports[local].port_num;
  return 0;
}

EMU_EXPORT const char* tbemu_host(const char* fabric) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return nullptr;
  std::string msg;
  int h = env_host(*f, &msg);
  if (h < 0) {
    t_error = msg;
    return nullptr;
  }
  return f->hosts[h].name.c_str();  // the fabric is cached for the process life
}

EMU_EXPORT const char* tbemu_state_dir(const char* fabric) {
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return nullptr;
  t_error = f->state_dir;  // keep the storage alive in this thread
  return t_error.c_str();
}

EMU_EXPORT const char* tbemu_describe(const char* fabric) {
  static thread_local std::string out;
  int err = 0;
  Fabric* f = fabric_of(fabric, &err);
  if (!f) return nullptr;
  std::ostringstream o;
  o << "fabric: " << (f->path.empty() ? "(built-in default)" : f->path) << "\n";
  o << "state:  " << f->state_dir << "\n";
  Shared* s = f->shm;
  Guard g(s->lock);
  collect_dead(s);
  remove_dead_records(f->state_dir);
  {
    QuirkSet q;
    std::memcpy(q, s->quirks, sizeof q);
    o << "quirks: " << format_quirks(q) << " (Thunderbolt devices only)\n";
  }
  for (size_t h = 0; h < f->hosts.size(); ++h) {
    o << "host " << f->hosts[h].name << "\n";
    for (int d : f->hosts[h].devices) {
      const DeviceDef& dd = f->devices[d];
      int nqp = 0, ncq = 0, nmr = 0;
      for (const auto& q : s->qps)
        if (q.in_use && q.device == static_cast<uint32_t>(d)) ++nqp;
      for (const auto& c : s->cqs)
        if (c.in_use && c.device == static_cast<uint32_t>(d)) ++ncq;
      for (const auto& m : s->mrs)
        if (m.key && m.device == static_cast<uint32_t>(d)) ++nmr;
      uint32_t nleaked = 0;
      for (const auto& p : s->pds)
        if (p.in_use && p.device == static_cast<uint32_t>(d) && p.pid < 0) ++nleaked;
      o << "  device " << dd.name << " profile=" << profile_name(dd.profile) << " qps=" << nqp
        << " pds=" << count_pds(s, d) << (nleaked ? " (" + std::to_string(nleaked) + " leaked)" : std::string())
        << " cqs=" << ncq << " mrs=" << nmr
        // Transfers that met memory unmapped after ibv_reg_mr (pages.cpp, docs/emulator.md).
        << " stale_mr_transfers=" << (d < static_cast<int>(kMaxPorts) ? __atomic_load_n(&s->stale_transfers[d], __ATOMIC_RELAXED) : 0)
        << "\n";
      for (int p : dd.ports) {
        const ShmPort& sp = s->ports[p];
        o << "    port " << f->ports[p].port_num << ": " << (sp.up ? "up" : "down") << ", "
          << (port_active(*f, p) ? "PORT_ACTIVE" : "PORT_DOWN") << ", ipv4 "
          << (sp.has_ip ? format_ipv4(sp.ip) + "/" + std::to_string(sp.prefix) : std::string("none")) << ", cable "
          << (f->ports[p].peer >= 0 ? f->port_label(f->ports[p].peer) : std::string("none"));
        const LinkModel& lk = f->ports[p].link;
        if (f->ports[p].peer >= 0 && lk.paced()) {  // docs/emulator.md, "Link pacing"
          char buf[96];
          if (lk.ns_per_byte > 0)
            std::snprintf(buf, sizeof buf, ", link %.6g GB/s, %.6g us", 1.0 / lk.ns_per_byte, double(lk.latency_ns) / 1000.0);
          else
            std::snprintf(buf, sizeof buf, ", link unpaced bandwidth, %.6g us", double(lk.latency_ns) / 1000.0);
          o << buf;
        }
        o << "\n";
      }
    }
  }
  for (const auto& q : s->qps)
    if (q.in_use)
      o << "qp 0x" << std::hex << q.qpn << std::dec << " pid=" << q.pid << " device=" << f->devices[q.device].name
        << "@" << f->hosts[f->devices[q.device].host].name << " type=" << (q.type == IBV_QPT_RC ? "RC" : "UC")
        << " state=" << q.state << " dest=0x" << std::hex << q.dest_qpn << std::dec
        << (q.drop_tx ? " DROPPING" : "") << "\n";
  for (const auto& ft : s->faults) {
    std::string host = ft.host >= 0 ? f->hosts[ft.host].name : std::string("*");
    if (ft.kind == kFaultFailCall)
      o << "fault fail " << ft.verb << " host=" << host << " nth=" << ft.nth << " errno=" << ft.err
        << " count=" << ft.count << " seen=" << ft.seen << " failed=" << ft.failed << "\n";
    else if (ft.kind == kFaultDropNext)
      o << "fault drop-next-qp host=" << host << "\n";
    else if (ft.kind == kFaultStickyLoss)
      o << "fault sticky-loss host=" << host << "\n";
    else if (ft.kind == kFaultDelay)
      o << "fault delay host=" << host << " usec=" << ft.delay_us << "\n";
  }
  out = o.str();
  return out.c_str();
}

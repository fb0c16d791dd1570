// The exported verbs control path: devices, contexts, PDs, MRs, CQs, channels, QPs.
//
// Every function here is exported with rdma-core's symbol version (see
// libibverbs.map) so unmodified verbs programs bind to it through LD_LIBRARY_PATH.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "local.hpp"

// verbs.h turns these names into macros or inline wrappers; we define the real symbols.
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

using namespace emu;

namespace {

std::mutex g_mu;  // control-path objects
// Never destroyed (device handles stay valid until exit, also during other static
// destructors), and reachable from a global so leak checkers do not flag them.
auto& g_devices = *new std::map<std::pair<Fabric*, int>, EmuDevice*>();
auto& g_cqs = *new std::map<std::pair<Fabric*, uint32_t>, EmuCq*>();  // for ibv_get_cq_event

EmuContext* ectx(ibv_context* c) { return reinterpret_cast<EmuContext*>(verbs_get_ctx(c)); }

void report(const std::string& msg) { std::fprintf(stderr, "tbverbs-emu: %s\n", msg.c_str()); }

Profile profile_of(const EmuContext* c) { return c->fab->devices[c->dev].profile; }
bool is_tb(const EmuContext* c) { return profile_of(c) == Profile::Thunderbolt; }
bool is_usb4(const EmuContext* c) { return profile_of(c) == Profile::Usb4Rdma; }
// usb4-rdma toward a Mac: Apple's compatible transport (DeviceDef::mac_compat).
bool mac_compat(const EmuContext* c) { return c->fab->devices[c->dev].mac_compat; }
const Limits& lim(const EmuContext* c) { return limits_of(profile_of(c)); }
uint32_t quirk_of(const EmuContext* c, Quirk q) { return quirk(*c->fab, profile_of(c), q); }

// Port number (1-based) of a context → global port index, or -1.
int gport(const EmuContext* c, uint8_t port_num) { return c->fab->find_port(c->dev, port_num); }

// Returns the errno if a "fail the Nth call" fault matches, else 0.
int faulted(const EmuContext* c, const char* verb) { return fault_check(*c->fab, verb, c ? c->host : -1); }

// The port's LID: Thunderbolt and InfiniBand ports have one (unique per port on the fabric);
// an InfiniBand port with "lid": 0 has no subnet manager. RoCE ports have none.
uint16_t port_lid(const Fabric& f, Profile p, int gp) {
  if (p == Profile::RdmaCoreIb) return f.ports[gp].lid >= 0 ? static_cast<uint16_t>(f.ports[gp].lid) : static_cast<uint16_t>(gp + 1);
  return p == Profile::Thunderbolt ? static_cast<uint16_t>(gp + 1) : 0;
}

// The port's active MTU (enum ibv_mtu).
uint32_t port_active_mtu(const Fabric& f, Profile p, int gp) {
  if (f.ports[gp].active_mtu != 0 && p != Profile::Thunderbolt) return f.ports[gp].active_mtu;
  switch (p) {
    case Profile::Thunderbolt: return IBV_MTU_4096;  // TN3205 / [R] mlx PR #4191 output
    // Our assumption: an InfiniBand port's usual 4096; RoCE ports on a 1500-byte Ethernet MTU
    // show active_mtu 1024 (rdma-core's RoCE MTU is the largest IB MTU below the netdev MTU).
    case Profile::RdmaCoreIb: return IBV_MTU_4096;
    case Profile::Usb4Rdma: return IBV_MTU_4096;  // hellas-ai/thunderbolt-ibverbs ibdev.c: active_mtu = IB_MTU_4096
    case Profile::RdmaCoreRoce:
    case Profile::RdmaCoreRc: break;
  }
  return IBV_MTU_1024;
}

void fill_port_attr(const EmuContext* c, int gp, ibv_port_attr* a) {
  const Fabric& f = *c->fab;
  bool tb = is_tb(c);
  const Profile prof = profile_of(c);
  std::memset(a, 0, sizeof *a);
  bool active = port_active(f, gp);
  const uint16_t lid = port_lid(f, prof, gp);
  // InfiniBand without a subnet manager: the link trains (phys LinkUp) but the port stays in
  // INIT with LID 0 (what `ibstat` shows as "Initializing" until opensm runs).
  const bool no_sm = prof == Profile::RdmaCoreIb && lid == 0;
  a->state = !active ? IBV_PORT_DOWN : no_sm ? IBV_PORT_INIT : IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = static_cast<ibv_mtu>(port_active_mtu(f, prof, gp));
  a->gid_tbl_len = static_cast<int>(gid_table_len(f, gp));
  a->port_cap_flags = 0;
  // usb4-rdma (ibdev.c tbv_query_port): 16 MiB toward a Mac, the native transport's maximum otherwise.
  a->max_msg_sz = static_cast<uint32_t>(max_msg_of(f, c->dev));
  a->pkey_tbl_len = 1;
  // [R] public fixtures: LIDs 1 and 2 on different ports. Ours: unique per port on the fabric.
  a->lid = lid;
  a->sm_lid = prof == Profile::RdmaCoreIb && !no_sm ? 1 : 0;
  a->max_vl_num = 1;
  a->active_width = 2;   // 4X
  a->active_speed = is_usb4(c) ? 8 : 32;  // usb4-rdma: IB_SPEED_FDR10 (ibdev.c); else EDR-class; informational
  a->phys_state = active ? 5 : 3;  // LinkUp / Disabled
  // TN3205 / [R] devinfo dumps: link layer 100 ("Thunderbolt" on a Mac; Debian's ibv_devinfo
  // prints "Unknown"). rdma-core-rc and rdma-core-roce are RoCE; rdma-core-ib is InfiniBand.
  a->link_layer = tb ? 100 : prof == Profile::RdmaCoreIb ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
}

int query_port_op(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t len) {
  EmuContext* c = ectx(ctx);
  if (!c || !attr) return EINVAL;
  if (int e = faulted(c, "ibv_query_port")) return e;
  int gp = gport(c, port);
  if (gp < 0) return EINVAL;
  ibv_port_attr full;
  fill_port_attr(c, gp, &full);
  std::memset(attr, 0, len);
  std::memcpy(attr, &full, std::min(len, sizeof full));
  return 0;
}

// Allocates a shared-memory slot under the fabric lock. Returns index or -1.
template <typename Slot, size_t N, typename Pred>
int find_free(Slot (&slots)[N], Pred used) {
  for (size_t i = 0; i < N; ++i)
    if (!used(slots[i])) return static_cast<int>(i);
  return -1;
}

}  // namespace

// ---------------------------------------------------------------- devices

EMU_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  if (num_devices) *num_devices = 0;
  Fabric* f;
  try {
    f = &env_fabric();
  } catch (const std::exception& e) {
    report(e.what());
    errno = EINVAL;
    return nullptr;
  }
  std::string err;
  int host = env_host(*f, &err);
  if (host < 0) {
    report(err);
    errno = ENODEV;
    return nullptr;
  }
  if (int e = fault_check(*f, "ibv_get_device_list", host)) {
    errno = e;
    return nullptr;
  }
  std::lock_guard<std::mutex> g(g_mu);
  const auto& devs = f->hosts[host].devices;
  auto** list = static_cast<ibv_device**>(std::calloc(devs.size() + 1, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < devs.size(); ++i) {
    auto key = std::make_pair(f, devs[i]);
    EmuDevice*& d = g_devices[key];
    if (!d) {
      d = new EmuDevice{};
      d->fab = f;
      d->index = devs[i];
      const DeviceDef& dd = f->devices[devs[i]];
      d->dev.node_type = IBV_NODE_CA;
      // Apple's driver reports transport "Thunderbolt (100)"; the RC profile looks like InfiniBand verbs.
      d->dev.transport_type =
          dd.profile == Profile::Thunderbolt ? static_cast<ibv_transport_type>(100) : IBV_TRANSPORT_IB;
      std::snprintf(d->dev.name, sizeof d->dev.name, "%s", dd.name.c_str());
      std::snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", devs[i]);
      std::snprintf(d->dev.dev_path, sizeof d->dev.dev_path, "/sys/class/infiniband_verbs/uverbs%d", devs[i]);
      // rdma-core-roce/-ib: a sysfs-like tree of GID types and netdevs (ensure_sysfs).
      const std::string sysfs = ensure_sysfs(*f, devs[i]);
      if (!sysfs.empty() && sysfs.size() < sizeof d->dev.ibdev_path)
        std::snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "%s", sysfs.c_str());
      else
        std::snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "/sys/class/infiniband/%s", dd.name.c_str());
    }
    list[i] = &d->dev;
  }
  if (num_devices) *num_devices = static_cast<int>(devs.size());
  return list;
}

EMU_EXPORT void ibv_free_device_list(ibv_device** list) { std::free(list); }  // devices themselves stay

EMU_EXPORT const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

EMU_EXPORT __be64 ibv_get_device_guid(ibv_device* device) {
  auto* d = reinterpret_cast<EmuDevice*>(device);
  return d ? d->fab->devices[d->index].guid : 0;
}

EMU_EXPORT int ibv_get_device_index(ibv_device* device) {
  auto* d = reinterpret_cast<EmuDevice*>(device);
  return d ? d->index : -1;
}

EMU_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  auto* d = reinterpret_cast<EmuDevice*>(device);
  if (!d) {
    errno = EINVAL;
    return nullptr;
  }
  int host = d->fab->devices[d->index].host;
  if (int e = fault_check(*d->fab, "ibv_open_device", host)) {
    errno = e;
    return nullptr;
  }
  if (device_removed(*d->fab, d->index)) {
    errno = ENODEV;  // tbverbs-emu device-remove: as a device unplugged under its ibv_device
    return nullptr;
  }
  auto* c = new (std::nothrow) EmuContext{};
  if (!c) {
    errno = ENOMEM;
    return nullptr;
  }
  c->fab = d->fab;
  c->dev = d->index;
  c->host = host;
  while (c->ports < 32 && c->fab->find_port(c->dev, static_cast<uint8_t>(c->ports + 1)) >= 0) ++c->ports;
  for (int p = 1; p <= c->ports; ++p)
    if (port_active(*c->fab, c->fab->find_port(c->dev, static_cast<uint8_t>(p)))) c->ports_seen_active |= 1u << (p - 1);
  verbs_context& v = c->v;
  v.sz = sizeof(verbs_context);
  v.query_port = query_port_op;
  v.create_qp_ex = emu_create_qp_ex;
  v.create_cq_ex = emu_create_cq_ex;
  v.query_device_ex = emu_query_device_ex;
  ibv_context& ctx = v.context;
  ctx.device = device;
  // There is no kernel command channel, but programs treat cmd_fd as an fd (pyverbs dups it
  // to import the context, which ibv_import_device then refuses): a quiet eventfd.
  ctx.cmd_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // Programs poll this fd for asynchronous events, so make it real. Blocking, as rdma-core's (the
  // uverbs fd): a program makes it non-blocking itself to poll it. The port events are found when
  // ibv_get_async_event looks (the port states live in the fabric's shared memory, changed by
  // other processes), so the fd is never signalled: a waiter polls it in short slices.
  ctx.async_fd = eventfd(0, EFD_CLOEXEC);
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  ctx.ops.post_send = emu_post_send;
  ctx.ops.post_recv = emu_post_recv;
  ctx.ops.poll_cq = emu_poll_cq;
  ctx.ops.req_notify_cq = emu_req_notify_cq;
  return &ctx;
}

EMU_EXPORT int ibv_close_device(ibv_context* context) {
  EmuContext* c = ectx(context);
  if (!c) return EINVAL;
  if (int e = faulted(c, "ibv_close_device")) return e;
  if (c->v.context.async_fd >= 0) ::close(c->v.context.async_fd);
  if (c->v.context.cmd_fd >= 0) ::close(c->v.context.cmd_fd);
  pthread_mutex_destroy(&c->v.context.mutex);
  delete c;
  return 0;
}

EMU_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* a) {
  EmuContext* c = ectx(context);
  if (!c || !a) return EINVAL;
  if (int e = faulted(c, "ibv_query_device")) return e;
  bool tb = is_tb(c);
  const DeviceDef& d = c->fab->devices[c->dev];
  const Limits& l = lim(c);
  std::memset(a, 0, sizeof *a);
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "tbverbs-emu 1.0 (%s)", profile_name(d.profile));
  a->node_guid = d.guid;
  a->sys_image_guid = d.guid;
  a->max_mr_size = l.max_mr_size;
  a->page_size_cap = 4096;
  a->vendor_id = tb ? 0x05ac : 0x02c9;  // Apple / Mellanox PCI vendor ids, informational
  a->vendor_part_id = 0xe111;
  if (d.profile == Profile::Usb4Rdma) {  // hellas-ai/thunderbolt-ibverbs ibdev.c, tbv_query_device
    a->vendor_id = 0x1d6b;
    a->vendor_part_id = 0x5442;
    a->max_sge_rd = static_cast<int>(l.max_sge);  // attr->max_sge_rd = TBV_IBDEV_MAX_SGE
  }
  a->hw_ver = 1;
  a->max_qp = static_cast<int>(l.max_qp);
  a->max_qp_wr = static_cast<int>(l.max_depth);
  a->device_cap_flags = tb ? 0 : d.profile == Profile::Usb4Rdma ? IBV_DEVICE_CHANGE_PHY_PORT : IBV_DEVICE_RC_RNR_NAK_GEN;
  if (d.profile == Profile::Usb4Rdma) a->page_size_cap = 4096 | (2u << 20) | (1u << 30);  // ibdev.c: SZ_4K | SZ_2M | SZ_1G
  a->max_sge = static_cast<int>(l.max_sge);
  a->max_cq = static_cast<int>(l.max_cq);
  a->max_cqe = static_cast<int>(l.max_cqe);
  a->max_mr = static_cast<int>(l.max_mr);
  a->max_pd = static_cast<int>(l.max_pd);
  a->max_srq = 0;
  a->max_qp_rd_atom = static_cast<int>(l.max_rd_atom);
  a->max_qp_init_rd_atom = static_cast<int>(l.max_rd_atom);
  a->max_res_rd_atom = static_cast<int>(l.max_rd_atom * l.max_qp);
  // 8-byte fetch-and-add and compare-and-swap run where RDMA READ does (the RC profiles); they are
  // atomic against one another fabric-wide, not against the target CPU's stores: IBV_ATOMIC_HCA.
  // Thunderbolt: the published driver reports max_qp_rd_atom 0 and no atomics ([R] devinfo dumps).
  a->atomic_cap = l.atomics ? IBV_ATOMIC_HCA : IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = d.profile == Profile::Usb4Rdma ? 15 : 16;
  a->phys_port_cnt = static_cast<uint8_t>(d.ports.size());
  return 0;
}

// verbs.h declares the exported symbol with the compat struct, whose layout is the
// start of ibv_port_attr; callers reaching it through ___ibv_query_port pass a full one.
EMU_EXPORT int ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* attr) {
  return query_port_op(context, port_num, reinterpret_cast<ibv_port_attr*>(attr),
                       offsetof(ibv_port_attr, port_cap_flags2));
}

EMU_EXPORT int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  EmuContext* c = ectx(context);
  if (!c || !gid) {
    errno = EINVAL;
    return -1;
  }
  if (int e = faulted(c, "ibv_query_gid")) {
    errno = e;
    return -1;
  }
  int gp = gport(c, port_num);
  if (gp < 0 || index < 0 || static_cast<uint32_t>(index) >= gid_table_len(*c->fab, gp)) {
    errno = EINVAL;
    return -1;
  }
  gid_at(*c->fab, gp, static_cast<uint32_t>(index), gid);  // empty entries read as zero
  return 0;
}

// rdma-core's private helper used by ibv_devinfo (IBVERBS_PRIVATE_34): the sysfs reading,
// 0 = "IB/RoCE v1", 1 = "RoCE v2" (rdma-core's enum ibv_gid_type_sysfs).
EMU_EXPORT int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type) {
  EmuContext* c = ectx(context);
  int gp = c ? gport(c, port_num) : -1;
  if (gp < 0 || !type || index >= gid_table_len(*c->fab, gp)) {
    errno = EINVAL;
    return -1;
  }
  *type = gid_type_at(*c->fab, gp, index) == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;
  return 0;
}

EMU_EXPORT int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                                 uint32_t flags, size_t entry_size) {
  EmuContext* c = ectx(context);
  if (!c || !entry || flags || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  int gp = port_num <= 255 ? gport(c, static_cast<uint8_t>(port_num)) : -1;
  if (gp < 0 || gid_index >= gid_table_len(*c->fab, gp)) return EINVAL;
  std::memset(entry, 0, sizeof *entry);
  if (!gid_at(*c->fab, gp, gid_index, &entry->gid)) return ENODATA;
  entry->gid_index = gid_index;
  entry->port_num = port_num;
  entry->gid_type = gid_type_at(*c->fab, gp, gid_index);
  // No kernel interface stands behind an emulated port: ndev_ifindex stays 0 (the netdev
  // name is in the sysfs-like tree, gid_attrs/ndevs, of rdma-core-roce devices).
  return 0;
}

EMU_EXPORT ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries,
                                        uint32_t flags, size_t entry_size) {
  EmuContext* c = ectx(context);
  if (!c || flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  size_t n = 0;
  const auto& ports = c->fab->devices[c->dev].ports;
  for (size_t p = 0; p < ports.size(); ++p)
    for (uint32_t i = 0; i < gid_table_len(*c->fab, ports[p]); ++i) {
      ibv_gid g;
      if (!gid_at(*c->fab, ports[p], i, &g)) continue;
      if (n == max_entries) return -EINVAL;
      ibv_gid_entry* e = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + n * entry_size);
      std::memset(e, 0, sizeof *e);
      e->gid = g;
      e->gid_index = i;
      e->port_num = static_cast<uint32_t>(p + 1);
      e->gid_type = gid_type_at(*c->fab, ports[p], i);
      ++n;
    }
  return static_cast<ssize_t>(n);
}

EMU_EXPORT int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  EmuContext* c = ectx(context);
  if (!c || !pkey || gport(c, port_num) < 0 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htobe16(0xffff);
  return 0;
}

EMU_EXPORT int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  EmuContext* c = ectx(context);
  if (!c || gport(c, port_num) < 0 || be16toh(pkey) != 0xffff) return -1;
  return 0;
}

// ---------------------------------------------------------------- PD / MR

EMU_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  EmuContext* c = ectx(context);
  if (!c) {
    errno = EINVAL;
    return nullptr;
  }
  if (int e = faulted(c, "ibv_alloc_pd")) {
    errno = e;
    return nullptr;
  }
  // Apple's driver: a device whose port is down cannot allocate a PD.
  if (is_tb(c) && !port_active(*c->fab, gport(c, 1))) {
    errno = ENETDOWN;
    return nullptr;
  }
  auto* p = new (std::nothrow) EmuPd{};
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  Shared* s = c->fab->shm;
  {
    Guard g(s->lock);
    // max_pd per device across processes, leaked PDs included (see limits_of).
    if (count_pds(s, c->dev) >= lim(c).max_pd) {
      collect_dead(s);
      if (count_pds(s, c->dev) >= lim(c).max_pd) {
        delete p;
        errno = ENOMEM;
        return nullptr;
      }
    }
    int slot = find_free(s->pds, [](const ShmPd& x) { return x.in_use != 0; });
    if (slot < 0) {
      delete p;
      errno = ENOMEM;
      return nullptr;
    }
    p->id = s->next_pd++;
    p->slot = static_cast<uint32_t>(slot);
    s->pds[slot] = ShmPd{1, getpid(), static_cast<uint32_t>(c->dev), p->id};
  }
  p->pd.context = context;
  p->pd.handle = p->id;
  return &p->pd;
}

EMU_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  if (!pd) return EINVAL;
  if (int e = faulted(ectx(pd->context), "ibv_dealloc_pd")) return e;
  auto* p = reinterpret_cast<EmuPd*>(pd);
  if (p->users.load() > 0) return EBUSY;  // MRs or QPs still use it
  Shared* s = ectx(pd->context)->fab->shm;
  {
    Guard g(s->lock);
    ShmPd& x = s->pds[p->slot];
    if (x.in_use && x.id == p->id && x.pid == getpid()) x.in_use = 0;
  }
  delete p;
  return 0;
}

namespace {
// Whether a registration (or re-registration) with `access` is refused, and its errno.
int access_refused(EmuContext* c, unsigned access) {
  // Remote write/atomic need local write, as in rdma-core.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  const unsigned remote = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  switch (quirk_of(c, Quirk::MrAccess)) {
    case kMrAccessLocalWriteOnly:  // TN3205's advice taken as a rule
      return (access & (remote | IBV_ACCESS_REMOTE_ATOMIC)) ? EINVAL : 0;
    case kMrAccessRemoteRequired:  // [R] llama.cpp: LOCAL_WRITE-only registrations rejected
      return (access & remote) ? 0 : EINVAL;
    default: return 0;
  }
}
}  // namespace

EMU_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (!pd) {
    errno = EINVAL;
    return nullptr;
  }
  EmuContext* c = ectx(pd->context);
  if (int e = faulted(c, "ibv_reg_mr")) {
    errno = e;
    return nullptr;
  }
  if (int e = access_refused(c, access)) {
    errno = e;
    return nullptr;
  }
  if (!addr && length) {
    errno = EINVAL;
    return nullptr;
  }
  // [R] Anemll/MCDMA: max_mr_size 16,384,000 on Thunderbolt (EINVAL: our assumption).
  // Alignment is not enforced (TN3205 asks for page-aligned buffers; the errno is unknown).
  if (length > lim(c).max_mr_size) {
    errno = EINVAL;
    return nullptr;
  }
  auto* m = new (std::nothrow) EmuMr{};
  if (!m) {
    errno = ENOMEM;
    return nullptr;
  }
  // What the kernel checks and pins (pages.cpp): an unmapped range, or a read-only one with a write
  // flag, is EFAULT (rdma-core's ib_umem_get; on Apple's profile our assumption, docs/emulator.md).
  if (int e = register_pages(*c->fab, addr, length, access, &m->pages)) {
    delete m;
    errno = e;
    return nullptr;
  }
  Shared* s = c->fab->shm;
  {
    Guard g(s->lock);
    // max_mr per device across the processes of the host ([R] mlx#3162: a clean NULL
    // at about the 100th; ENOMEM is our assumption).
    auto mrs_here = [&] {
      uint32_t n = 0;
      for (const auto& x : s->mrs)
        if (x.key && x.device == static_cast<uint32_t>(c->dev)) ++n;
      return n;
    };
    // A slot is free when nothing is registered in it and no copy still pins it.
    auto used = [](const ShmMr& x) { return x.key != 0 || __atomic_load_n(&x.pins, __ATOMIC_SEQ_CST) != 0; };
    int slot = find_free(s->mrs, used);
    if (slot < 0 || mrs_here() >= lim(c).max_mr) {
      collect_dead(s);
      slot = mrs_here() >= lim(c).max_mr ? -1 : find_free(s->mrs, used);
    }
    if (slot < 0) {
      release_pages(*c->fab, m->pages);
      delete m;
      errno = ENOMEM;
      return nullptr;
    }
    ShmMr& x = s->mrs[slot];
    x.pid = getpid();
    x.pd = reinterpret_cast<EmuPd*>(pd)->id;
    x.access = access;
    x.device = static_cast<uint32_t>(c->dev);
    x.addr = reinterpret_cast<uint64_t>(addr);
    x.iova = iova;
    x.length = length;
    x.pid_start = self_start();
    // Atomic: a transfer's page check reads them (pages.cpp), bracketed by loads of the key.
    __atomic_store_n(&x.record, m->pages.record, __ATOMIC_RELAXED);
    __atomic_store_n(&x.frames, m->pages.frames, __ATOMIC_RELAXED);
    __atomic_store_n(&x.stale, 0u, __ATOMIC_RELAXED);
    uint32_t gen = (s->next_gen++ & 0xfffff) | 1;
    __atomic_store_n(&x.key, (gen << 12) | static_cast<uint32_t>(slot), __ATOMIC_RELEASE);
    m->slot = static_cast<uint32_t>(slot);
    m->mr.lkey = m->mr.rkey = x.key;
  }
  reinterpret_cast<EmuPd*>(pd)->users.fetch_add(1);
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.handle = m->slot;
  return &m->mr;
}

EMU_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uint64_t>(addr), static_cast<unsigned>(access));
}

EMU_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

EMU_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  if (!mr) return EINVAL;
  EmuContext* c = ectx(mr->context);
  if (int e = faulted(c, "ibv_dereg_mr")) return e;
  auto* m = reinterpret_cast<EmuMr*>(mr);
  Shared* s = c->fab->shm;
  ShmMr& x = s->mrs[m->slot];
  uint32_t stale = 0;  // transfers that met its memory unmapped after ibv_reg_mr (pages.cpp)
  {
    Guard g(s->lock);
    if (x.key == mr->lkey) {
      stale = __atomic_load_n(&x.stale, __ATOMIC_RELAXED);
      __atomic_store_n(&x.key, 0u, __ATOMIC_SEQ_CST);
    }
  }
  // Copies that pinned the region before its key went finish first (see RegionPins): after this
  // returns nothing writes into the memory. Not for a pinner that died mid-copy (it writes
  // nothing more; its pin is never released, and the slot then stays out of use, see find_free
  // below), and bounded, so a stopped one cannot hang us either.
  const int64_t until = now_ns() + 2'000'000'000;
  for (int64_t next_check = 0; __atomic_load_n(&x.pins, __ATOMIC_SEQ_CST) != 0 && now_ns() < until;) {
    if (now_ns() >= next_check) {
      if (!pid_alive(__atomic_load_n(&x.pinner, __ATOMIC_RELAXED))) break;
      next_check = now_ns() + 1'000'000;
    }
    sched_yield();
  }
  // No transfer reaches the region any more: its pages are unpinned and its frame record goes.
  if (stale > 0)
    std::fprintf(stderr,
                 "tbverbs-emu: region lkey/rkey 0x%x deregistered: %u transfer(s) met its memory unmapped after "
                 "ibv_reg_mr\n",
                 mr->lkey, stale);
  release_pages(*c->fab, m->pages);
  reinterpret_cast<EmuPd*>(mr->pd)->users.fetch_sub(1);
  delete m;
  return 0;
}

// ---------------------------------------------------------------- completion channels and CQs

EMU_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  EmuContext* c = ectx(context);
  if (!c) {
    errno = EINVAL;
    return nullptr;
  }
  if (int e = faulted(c, "ibv_create_comp_channel")) {
    errno = e;
    return nullptr;
  }
  if (quirk_of(c, Quirk::CompletionChannels) == kChannelsOff) {
    errno = EOPNOTSUPP;  // quirk completion_channels=off
    return nullptr;
  }
  auto* ch = new (std::nothrow) EmuChannel{};
  if (!ch) {
    errno = ENOMEM;
    return nullptr;
  }
  Shared* s = c->fab->shm;
  {
    Guard g(s->lock);
    ch->id = s->next_channel++;
  }
  ch->fab = c->fab;
  ch->host = c->host;
  ch->path = channel_path(*c->fab, getpid(), ch->id);
  remove_dead_channels(*c->fab);
  ::unlink(ch->path.c_str());
  // A FIFO, so a sender in another process can wake us by name. Opened read-write
  // so the open never blocks and the fd never sees EOF.
  // Private like the state it lives in (issue 9): only this user's processes may wake us.
  if (mkfifo(ch->path.c_str(), 0600) != 0) {
    int e = errno;
    delete ch;
    errno = e;
    return nullptr;
  }
  int fd = ::open(ch->path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    ::unlink(ch->path.c_str());
    delete ch;
    errno = e;
    return nullptr;
  }
  ch->ch.context = context;
  ch->ch.fd = fd;
  ch->ch.refcnt = 0;
  return &ch->ch;
}

EMU_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (!channel) return EINVAL;
  auto* ch = reinterpret_cast<EmuChannel*>(channel);
  if (int e = fault_check(*ch->fab, "ibv_destroy_comp_channel", ch->host)) return e;
  if (channel->refcnt > 0) return EBUSY;
  ::close(channel->fd);
  ::unlink(ch->path.c_str());
  delete ch;
  return 0;
}

EMU_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                                 int comp_vector) {
  EmuContext* c = ectx(context);
  if (!c) {
    errno = EINVAL;
    return nullptr;
  }
  if (int e = faulted(c, "ibv_create_cq")) {
    errno = e;
    return nullptr;
  }
  if (cqe < 1 || cqe > static_cast<int>(lim(c).max_cqe) || comp_vector < 0 || comp_vector >= 1) {
    errno = EINVAL;
    return nullptr;
  }
  auto* q = new (std::nothrow) EmuCq{};
  if (!q) {
    errno = ENOMEM;
    return nullptr;
  }
  Shared* s = c->fab->shm;
  {
    Guard g(s->lock);
    // max_cq per device across processes ([R] devinfo dumps; ENOMEM is our assumption).
    auto cqs_here = [&] {
      uint32_t n = 0;
      for (const auto& x : s->cqs)
        if (x.in_use && x.device == static_cast<uint32_t>(c->dev)) ++n;
      return n;
    };
    int slot = find_free(s->cqs, [](const ShmCq& x) { return x.in_use != 0; });
    if (slot < 0 || cqs_here() >= lim(c).max_cq) {
      collect_dead(s);
      slot = cqs_here() >= lim(c).max_cq ? -1 : find_free(s->cqs, [](const ShmCq& x) { return x.in_use != 0; });
    }
    if (slot < 0) {
      delete q;
      errno = ENOMEM;
      return nullptr;
    }
    ShmCq& x = s->cqs[slot];
    Guard g2(x.lock);
    x.pid = getpid();
    x.device = static_cast<uint32_t>(c->dev);
    x.capacity = static_cast<uint32_t>(cqe);
    x.head = x.tail = 0;
    x.armed = 0;
    x.overflow = 0;
    x.events = 0;
    x.channel = channel ? reinterpret_cast<EmuChannel*>(channel)->id : 0;
    x.channel_pid = getpid();
    x.bell = own_bell(s);
    x.paced = 0;
    __atomic_store_n(&x.in_use, 1u, __ATOMIC_RELEASE);
    q->slot = static_cast<uint32_t>(slot);
    q->s = &x;
  }
  q->fab = c->fab;
  q->host = c->host;
  q->dev = c->dev;
  q->cq.context = context;
  q->cq.channel = channel;
  q->cq.cq_context = cq_context;
  q->cq.handle = q->slot;
  q->cq.cqe = cqe;
  pthread_mutex_init(&q->cq.mutex, nullptr);
  pthread_cond_init(&q->cq.cond, nullptr);
  if (channel) ++channel->refcnt;
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_cqs[{c->fab, q->slot}] = q;
  }
  register_cq(c, q);
  return &q->cq;
}

EMU_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  if (!cq) return EINVAL;
  auto* q = reinterpret_cast<EmuCq*>(cq);
  if (int e = faulted(ectx(cq->context), "ibv_destroy_cq")) return e;
  if (q->users.load() > 0) return EBUSY;  // QPs still use it
  unregister_cq(ectx(cq->context), q);
  {
    // A stopped sender holding the CQ does not keep it alive: the slot is freed all the same
    // (BoundedGuard: no verb waits without bound on another process).
    BoundedGuard g(q->s->lock);
    __atomic_store_n(&q->s->in_use, 0u, __ATOMIC_RELEASE);
  }
  if (cq->channel) --cq->channel->refcnt;
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_cqs.erase({q->fab, q->slot});
  }
  pthread_mutex_destroy(&cq->mutex);
  pthread_cond_destroy(&cq->cond);
  delete q;
  return 0;
}

EMU_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  if (!channel || !cq || !cq_context) {
    errno = EINVAL;
    return -1;
  }
  auto* ch = reinterpret_cast<EmuChannel*>(channel);
  if (int e = fault_check(*ch->fab, "ibv_get_cq_event", ch->host)) {
    errno = e;
    return -1;
  }
  bool user_nonblock = (fcntl(channel->fd, F_GETFL) & O_NONBLOCK) != 0;
  for (;;) {
    if (any_pending()) progress_all();  // deferred RC sends may complete our own CQs
    pollfd p{channel->fd, POLLIN, 0};
    int timeout = any_pending() ? 1 : (user_nonblock ? 0 : -1);
    int r = ::poll(&p, 1, timeout);
    // A signal ends the wait with EINTR, as rdma-core's one read() does (qperf ends its timed
    // tests with SIGALRM and no SA_RESTART: looping here hung it; issue 19 item 6).
    if (r < 0) return -1;
    if (r == 0) {
      if (user_nonblock && !any_pending()) {
        errno = EAGAIN;
        return -1;
      }
      continue;
    }
    uint32_t slot = 0;
    ssize_t n = ::read(channel->fd, &slot, sizeof slot);
    if (n < 0 && errno == EINTR) return -1;        // as above
    if (n < 0 && errno == EAGAIN) continue;        // another reader took the event first
    if (n != static_cast<ssize_t>(sizeof slot)) {
      errno = EIO;
      return -1;
    }
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_cqs.find({ch->fab, slot});
    if (it == g_cqs.end() || it->second->cq.channel != channel) continue;  // CQ destroyed since
    *cq = &it->second->cq;
    *cq_context = it->second->cq.cq_context;
    return 0;
  }
}

EMU_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (!cq) return;
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

EMU_EXPORT int ibv_resize_cq(ibv_cq*, int) { return EOPNOTSUPP; }

// ---------------------------------------------------------------- QPs

EMU_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* init) {
  if (!pd || !init) {
    errno = EINVAL;
    return nullptr;
  }
  EmuContext* c = ectx(pd->context);
  if (int e = faulted(c, "ibv_create_qp")) {
    errno = e;
    return nullptr;
  }
  const bool tb = is_tb(c);
  if (init->srq) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // Thunderbolt: UC only; usb4-rdma toward a Mac: UC only, RC and UC otherwise (ibdev.c
  // tbv_create_qp: -EOPNOTSUPP); the rdma-core profiles do not model UD.
  if ((tb || mac_compat(c)) ? init->qp_type != IBV_QPT_UC : (init->qp_type != IBV_QPT_UC && init->qp_type != IBV_QPT_RC)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (!init->send_cq || !init->recv_cq || init->send_cq->context != pd->context ||
      init->recv_cq->context != pd->context) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_cap cap = init->cap;
  const Limits& l = lim(c);
  if (cap.max_send_sge > l.max_sge || cap.max_recv_sge > l.max_sge) {
    errno = EINVAL;  // [R] devinfo dumps: max_sge 1 on Thunderbolt
    return nullptr;
  }
  if (tb) {
    // TN3205: depths are 4 KiB frames and "the system may adjust queue depths";
    // granted as tb_granted_depth() models it (read them back with ibv_query_qp).
    cap.max_send_wr = tb_granted_depth(cap.max_send_wr);
    cap.max_recv_wr = tb_granted_depth(cap.max_recv_wr);
    cap.max_inline_data = l.max_inline;
  } else {
    // usb4-rdma grants no inline data whatever is asked (ibdev.c: max_inline_data = 0).
    if (is_usb4(c)) cap.max_inline_data = 0;
    if (cap.max_send_wr > l.max_depth || cap.max_recv_wr > l.max_depth || cap.max_inline_data > l.max_inline) {
      errno = EINVAL;
      return nullptr;
    }
  }
  if (cap.max_send_sge == 0) cap.max_send_sge = 1;
  if (cap.max_recv_sge == 0) cap.max_recv_sge = 1;

  auto* q = new (std::nothrow) EmuQp{};
  if (!q) {
    errno = ENOMEM;
    return nullptr;
  }
  Shared* s = c->fab->shm;
  {
    Guard g(s->lock);
    collect_dead(s);  // a dead process's QPs no longer count (the kernel would free them)
    if (tb || mac_compat(c)) {
      // TN3205, [R] mlx#4209: 10 UC QPs per device (max_qp says 11); the 11th → EBUSY.
      // usb4-rdma toward a Mac: one QP. [R] hellas-perftest: every run with more than one QP
      // failed; one version of ibdev.c gives every Apple-compatible QP the QPN 0x900, so a second
      // cannot be inserted (EBUSY is our assumption of what the insert returns).
      uint32_t used = 0;
      for (const auto& x : s->qps)
        if (x.in_use && x.device == static_cast<uint32_t>(c->dev)) ++used;
      if (used >= (tb ? l.usable_qps : 1u)) {
        delete q;
        errno = EBUSY;
        return nullptr;
      }
    }
    int slot = find_free(s->qps, [](const ShmQp& x) { return x.in_use != 0; });
    if (slot < 0) {
      delete q;
      errno = ENOMEM;
      return nullptr;
    }
    ShmQp& x = s->qps[slot];
    Guard g2(x.lock);
    uint32_t gen = (s->next_gen++ & 0xffff) | 1;
    x.pid = getpid();
    x.pid_start = self_start();
    x.qpn = (gen << 8) | static_cast<uint32_t>(slot);
    x.type = init->qp_type;
    x.state = IBV_QPS_RESET;
    x.device = static_cast<uint32_t>(c->dev);
    x.port = static_cast<uint32_t>(gport(c, 1));
    x.pd = reinterpret_cast<EmuPd*>(pd)->id;
    x.dest_qpn = 0;
    x.peer_port = -1;
    x.access = 0;
    x.recv_cq = reinterpret_cast<EmuCq*>(init->recv_cq)->slot;
    x.min_rnr_timer = 0;
    x.sq_psn = x.rq_psn = 0;
    x.mtu_bytes = 1024;
    x.drop_tx = 0;
    x.wire = 0;
    x.max_recv_wr = cap.max_recv_wr;
    x.recv_frames = 0;
    x.head = x.tail = 0;
    x.tx_frames = 0;
    x.tx_wrs = 0;
    x.fatal = 0;
    discard_waiting(x);
    // "Drop the next QP created on host X" faults bind here.
    for (auto& ft : s->faults)
      if (ft.kind == kFaultDropNext && (ft.host < 0 || ft.host == c->host)) {
        x.drop_tx = 1;
        ft.kind = kFaultNone;
        // Atomic, as every other writer: the verbs' fault checks read the count without the lock
        // (TSan saw the plain decrement race with ibv_query_device's check in another thread).
        __atomic_sub_fetch(&s->nfaults, 1u, __ATOMIC_RELEASE);
        break;
      }
    __atomic_store_n(&x.in_use, 1u, __ATOMIC_RELEASE);
    q->slot = static_cast<uint32_t>(slot);
    q->s = &x;
  }
  q->ctx = c;
  q->scq = reinterpret_cast<EmuCq*>(init->send_cq);
  q->rcq = reinterpret_cast<EmuCq*>(init->recv_cq);
  q->scq->users.fetch_add(1);
  q->rcq->users.fetch_add(1);
  reinterpret_cast<EmuPd*>(pd)->users.fetch_add(1);
  q->cap = cap;
  q->sq_sig_all = init->sq_sig_all != 0;
  q->attr.qp_state = IBV_QPS_RESET;
  q->attr.cap = cap;
  q->qp.context = pd->context;
  q->qp.qp_context = init->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = init->send_cq;
  q->qp.recv_cq = init->recv_cq;
  q->qp.handle = q->slot;
  q->qp.qp_num = q->s->qpn;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = init->qp_type;
  pthread_mutex_init(&q->qp.mutex, nullptr);
  pthread_cond_init(&q->qp.cond, nullptr);
  init->cap = cap;  // report what was granted, as drivers do
  register_qp(c, q);
  return &q->qp;
}

EMU_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  if (!qp) return EINVAL;
  auto* q = reinterpret_cast<EmuQp*>(qp);
  if (int e = faulted(q->ctx, "ibv_destroy_qp")) return e;
  unregister_qp(q->ctx, q);  // before q->mu: the event code locks the registry, then q->mu
  forget_pending(q);
  {
    std::lock_guard<std::mutex> g0(q->mu);
    forget_waiting_sends(q, false);  // its sends waiting at the peer are dropped
    BoundedGuard g(q->s->lock);      // held by a stopped sender: the slot is freed all the same
    __atomic_store_n(&q->s->in_use, 0u, __ATOMIC_RELEASE);
    __atomic_store_n(&q->s->state, static_cast<uint32_t>(IBV_QPS_RESET), __ATOMIC_RELEASE);
    if (g.ok()) {
      q->s->head = q->s->tail = 0;
      discard_waiting(*q->s);  // sends waiting for it never complete (no credits)
    }
  }
  q->scq->users.fetch_sub(1);
  q->rcq->users.fetch_sub(1);
  reinterpret_cast<EmuPd*>(qp->pd)->users.fetch_sub(1);
  pthread_mutex_destroy(&qp->mutex);
  pthread_cond_destroy(&qp->cond);
  delete q;
  return 0;
}

namespace {

bool gid_is_zero(const ibv_gid& g) {
  for (uint8_t b : g.raw)
    if (b) return false;
  return true;
}
bool gid_is_v4mapped(const ibv_gid& g) {
  for (int i = 0; i < 10; ++i)
    if (g.raw[i]) return false;
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}

// RTR address checks. Returns 0 and sets *peer_port (and *wire, the RoCE version the QP
// sends and listens with), or the errno the field saw.
int resolve_rtr(EmuQp* q, const ibv_qp_attr* a, int* peer_port, uint32_t* wire) {
  const Fabric& f = *q->ctx->fab;
  const bool tb = is_tb(q->ctx);
  const Profile prof = profile_of(q->ctx);
  int myport = static_cast<int>(q->s->port);
  const ibv_ah_attr& ah = a->ah_attr;
  *wire = 0;
  if (prof == Profile::RdmaCoreIb) {
    // InfiniBand addresses by LID within a subnet (is_global 0) and adds a GRH between
    // subnets (docs/field-reports.md section 4b). Our assumption for the refusals: a port
    // without a LID (no subnet manager) or an address vector with DLID 0 cannot reach RTR
    // (EINVAL).
    if (port_lid(f, prof, myport) == 0 || ah.dlid == 0) return EINVAL;
    int other = f.ports[myport].peer;
    if (ah.is_global) {
      if (gid_is_zero(ah.grh.dgid) || ah.grh.sgid_index >= gid_table_len(f, myport)) return EINVAL;
      ibv_gid sgid;
      if (!gid_at(f, myport, ah.grh.sgid_index, &sgid)) return EINVAL;
      int p = port_of_gid(f, ah.grh.dgid);
      *peer_port = (p >= 0 && (p == other || p == myport)) ? p : -1;
    } else {
      *peer_port = other >= 0 && port_lid(f, prof, other) == ah.dlid ? other
                   : port_lid(f, prof, myport) == ah.dlid           ? myport
                                                                    : -1;
    }
    return 0;
  }
  if (!ah.is_global || gid_is_zero(ah.grh.dgid)) return EINVAL;  // uninitialised GID / no GRH
  if (ah.grh.sgid_index >= gid_table_len(f, myport)) return EINVAL;
  ibv_gid sgid;
  bool have = gid_at(f, myport, ah.grh.sgid_index, &sgid);
  if (tb) {
    // [R] public reports: RTR fails with ENODATA while the device's 11 protection
    // domains are taken and some were leaked by orphaned processes (our model of
    // that report: all max_pd in use, at least one leaked).
    {
      Guard g(f.shm->lock);
      bool leaked = false;
      if (count_pds(f.shm, q->ctx->dev, &leaked) >= lim(q->ctx).max_pd && leaked) return ENODATA;
    }
    if (!have || !gid_is_v4mapped(sgid)) {
      // [R] mlx PR #3389: the IPv4-mapped GID sits at another index (e.g. 2) and RTR
      // is routed from index 1 → EINVAL. No IPv4-mapped GID at all (a stale GID,
      // section 1 row 15) → ENODATA.
      ibv_gid v4;
      bool elsewhere = gid_at(f, myport, f.ports[myport].ipv4_gid_index, &v4) && gid_is_v4mapped(v4);
      return elsewhere ? EINVAL : ENODATA;
    }
    int other = f.ports[myport].peer;
    ibv_gid pg;
    if (!port_active(f, myport) || other < 0 || !gid_is_v4mapped(ah.grh.dgid) || !gid_at(f, other, f.ports[other].ipv4_gid_index, &pg) ||
        std::memcmp(&pg, &ah.grh.dgid, sizeof pg) != 0)
      return ETIMEDOUT;  // not reachable over this cable
    *peer_port = other;
    return 0;
  }
  if (!have) return EINVAL;
  // RoCE: RTR succeeds whatever the destination; an unreachable one shows up as
  // RETRY_EXC_ERR (RC) or silent loss (UC) when sending.
  int p = port_of_gid(f, ah.grh.dgid);
  *peer_port = (p >= 0 && (p == f.ports[myport].peer || p == myport)) ? p : -1;
  if (prof == Profile::RdmaCoreRoce) {
    // docs/field-reports.md section 4b and row 23 (Mooncake#113, NVIDIA/nccl#426): a RoCE v1
    // GID connects but carries nothing across a routed network; and (our model of the same
    // reports) two ends of different RoCE versions never hear each other (peer_ready).
    *wire = gid_type_at(f, myport, ah.grh.sgid_index) == IBV_GID_TYPE_ROCE_V2 ? 2 : 1;
    if (*wire == 1 && f.ports[myport].routed) *peer_port = -1;
  }
  return 0;
}

}  // namespace

namespace {
int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (!qp || !attr) return EINVAL;
  auto* q = reinterpret_cast<EmuQp*>(qp);
  if (int e = faulted(q->ctx, "ibv_modify_qp")) return e;
  // Lock order is g_pending_mu → q->mu: leave the pending list before locking the QP.
  if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) forget_pending(q);
  std::lock_guard<std::mutex> g0(q->mu);
  ShmQp* s = q->s;
  uint32_t cur = s->state;
  uint32_t next = (mask & IBV_QP_STATE) ? static_cast<uint32_t>(attr->qp_state) : cur;
  const bool rc = s->type == IBV_QPT_RC;
  auto need = [&](int bits) { return (mask & bits) == bits; };

  if (next == IBV_QPS_RESET) {
    q->pending.clear();
    q->npending = 0;
    forget_waiting_sends(q, false);
    BoundedGuard g(s->lock);  // held by a stopped sender: RESET all the same (its ring keeps what it held)
    __atomic_store_n(&s->state, static_cast<uint32_t>(IBV_QPS_RESET), __ATOMIC_RELEASE);
    if (g.ok()) {
      s->head = s->tail = 0;
      s->recv_frames = 0;
      discard_waiting(*s);
    }
    s->peer_port = -1;
    q->attr.qp_state = IBV_QPS_RESET;
    qp->state = IBV_QPS_RESET;
    cq_clean(*q->ctx->fab, q->scq->slot, qp->qp_num);
    if (q->rcq != q->scq) cq_clean(*q->ctx->fab, q->rcq->slot, qp->qp_num);
    return 0;
  }
  if (next == IBV_QPS_ERR) {
    qp_to_error(q);
    return 0;
  }
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    if (!need(IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS)) return EINVAL;
    int gp = gport(q->ctx, attr->port_num);
    if (gp < 0 || attr->pkey_index != 0) return EINVAL;
    s->port = static_cast<uint32_t>(gp);
    s->access = attr->qp_access_flags;
    q->attr.port_num = attr->port_num;
    q->attr.pkey_index = attr->pkey_index;
    q->attr.qp_access_flags = attr->qp_access_flags;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
    if (mask & IBV_QP_ACCESS_FLAGS) s->access = q->attr.qp_access_flags = attr->qp_access_flags;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    int req = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (rc) req |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (!need(req)) return EINVAL;
    if (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096) return EINVAL;
    {
      // docs/field-reports.md row 16 [I]: a path MTU above the port's active MTU is refused.
      // Enforced on the rdma-core-roce and -ib profiles (rdma-core-rc keeps its old leniency).
      const Profile prof = profile_of(q->ctx);
      if ((prof == Profile::RdmaCoreRoce || prof == Profile::RdmaCoreIb) &&
          static_cast<uint32_t>(attr->path_mtu) > port_active_mtu(*q->ctx->fab, prof, static_cast<int>(s->port)))
        return EINVAL;
    }
    int peer = -1;
    uint32_t wire = 0;
    if (int e = resolve_rtr(q, attr, &peer, &wire)) return e;
    s->dest_qpn = attr->dest_qp_num & 0xffffff;
    s->peer_port = peer;
    s->wire = wire;
    if (rc) s->min_rnr_timer = attr->min_rnr_timer;
    s->rq_psn = attr->rq_psn & 0xffffff;
    s->mtu_bytes = 128u << attr->path_mtu;  // IBV_MTU_256 = 1
    q->attr.ah_attr = attr->ah_attr;
    q->attr.path_mtu = attr->path_mtu;
    q->attr.dest_qp_num = attr->dest_qp_num;
    q->attr.rq_psn = attr->rq_psn;
    if (rc) {
      q->attr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
      q->attr.min_rnr_timer = attr->min_rnr_timer;
    }
    if (mask & IBV_QP_ACCESS_FLAGS) s->access = q->attr.qp_access_flags = attr->qp_access_flags;
  } else if ((cur == IBV_QPS_RTR || cur == IBV_QPS_RTS) && next == IBV_QPS_RTS) {
    if (cur == IBV_QPS_RTR) {
      int req = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (rc) req |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      if (!need(req)) return EINVAL;
    }
    if (mask & IBV_QP_SQ_PSN) {
      q->attr.sq_psn = attr->sq_psn;
      s->sq_psn = attr->sq_psn & 0xffffff;
    }
    if (mask & IBV_QP_TIMEOUT) q->attr.timeout = attr->timeout;
    if (mask & IBV_QP_RETRY_CNT) q->attr.retry_cnt = attr->retry_cnt & 7;
    if (mask & IBV_QP_RNR_RETRY) q->attr.rnr_retry = attr->rnr_retry & 7;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) {
      if (attr->max_rd_atomic > lim(q->ctx).max_rd_atom) return EINVAL;  // above max_qp_rd_atom, as drivers refuse
      q->attr.max_rd_atomic = attr->max_rd_atomic;
    }
    if (mask & IBV_QP_MIN_RNR_TIMER) s->min_rnr_timer = q->attr.min_rnr_timer = attr->min_rnr_timer;
  } else {
    return EINVAL;  // not a transition verbs allows
  }
  q->attr.qp_state = static_cast<ibv_qp_state>(next);
  qp->state = static_cast<ibv_qp_state>(next);
  __atomic_store_n(&s->state, next, __ATOMIC_RELEASE);  // publish after the fields above
  // empty_rq=wait: sends that arrived before RTR meet the receives posted in INIT.
  if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) rx_drain(q);
  return 0;
}

}  // namespace

EMU_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  const int rc = modify_qp(qp, attr, mask);
  if (__builtin_expect(g_trace_on, 0) && qp && attr && (mask & IBV_QP_STATE)) {
    static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
    const unsigned st = static_cast<unsigned>(attr->qp_state);
    char extra[96] = "";
    if (attr->qp_state == IBV_QPS_RTR && (mask & IBV_QP_AV))
      std::snprintf(extra, sizeof extra, " dest_qp=0x%06x sgid_index=%u", attr->dest_qp_num, attr->ah_attr.grh.sgid_index);
    EMU_TRACE_QP(reinterpret_cast<EmuQp*>(qp), "modify_qp", "state=%s%s%s%s", st < 7 ? names[st] : "?", extra,
                 rc ? " refused: " : "", rc ? std::strerror(rc) : "");
  }
  return rc;
}

EMU_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int /*mask*/, ibv_qp_init_attr* init) {
  if (!qp || !attr || !init) return EINVAL;
  auto* q = reinterpret_cast<EmuQp*>(qp);
  if (int e = faulted(q->ctx, "ibv_query_qp")) return e;
  std::lock_guard<std::mutex> g(q->mu);
  *attr = q->attr;
  attr->qp_state = static_cast<ibv_qp_state>(q->s->state);
  attr->cur_qp_state = attr->qp_state;
  attr->cap = q->cap;
  std::memset(init, 0, sizeof *init);
  init->qp_context = qp->qp_context;
  init->send_cq = qp->send_cq;
  init->recv_cq = qp->recv_cq;
  init->cap = q->cap;
  init->qp_type = qp->qp_type;
  init->sq_sig_all = q->sq_sig_all;
  return 0;
}

// As in rdma-core: the extended view exists for QPs created with send_ops_flags
// (ibv_create_qp_ex); others get NULL.
EMU_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  auto* q = reinterpret_cast<EmuQp*>(qp);
  if (!q || !q->batch) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return &q->qpx;
}

// Enhanced connection establishment and the data-in-order query: nothing to negotiate.
// rdma-core answers the same (EOPNOTSUPP, 0 = no ordering promised) for a provider without them.
EMU_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
EMU_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
EMU_EXPORT int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) { return 0; }

// ---------------------------------------------------------------- address handles, and unsupported objects

// Address handles are created and checked (a port of the device, a GID index inside its table,
// a GRH on RoCE, as RoCE providers require) and kept, for programs that build them; UD QPs, the
// only users of an AH, are not modelled, so nothing sends through one. Thunderbolt: UC only, no AH.
namespace {
struct EmuAh {
  ibv_ah ah;
  ibv_ah_attr attr;
};
}  // namespace

EMU_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) {
    errno = EINVAL;
    return nullptr;
  }
  EmuContext* c = ectx(pd->context);
  if (int e = faulted(c, "ibv_create_ah")) {
    errno = e;
    return nullptr;
  }
  const Profile prof = c->fab->devices[c->dev].profile;
  if (prof == Profile::Thunderbolt) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  const int gp = gport(c, attr->port_num);
  if (gp < 0 || (prof != Profile::RdmaCoreIb && !attr->is_global) ||
      (attr->is_global && attr->grh.sgid_index >= gid_table_len(*c->fab, gp))) {
    errno = EINVAL;
    return nullptr;
  }
  auto* a = new (std::nothrow) EmuAh{};
  if (!a) {
    errno = ENOMEM;
    return nullptr;
  }
  a->ah.context = pd->context;
  a->ah.pd = pd;
  a->attr = *attr;
  return &a->ah;
}
EMU_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd*, ibv_wc*, ibv_grh*, uint8_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  delete reinterpret_cast<EmuAh*>(ah);
  return 0;
}
// Sharing objects between processes goes through the kernel's command fd (cmd_fd), which
// an emulated context does not have; dma-buf registration needs a kernel exporter. Nothing
// can be imported, so the unimport calls have nothing to release.
EMU_EXPORT ibv_context* ibv_import_device(int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT ibv_pd* ibv_import_pd(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT void ibv_unimport_pd(ibv_pd*) {}
EMU_EXPORT ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT void ibv_unimport_mr(ibv_mr*) {}
EMU_EXPORT ibv_dm* ibv_import_dm(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT void ibv_unimport_dm(ibv_dm*) {}
EMU_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT ibv_srq* ibv_create_srq(ibv_pd*, ibv_srq_init_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int ibv_destroy_srq(ibv_srq*) { return EOPNOTSUPP; }
EMU_EXPORT int ibv_modify_srq(ibv_srq*, ibv_srq_attr*, int) { return EOPNOTSUPP; }
EMU_EXPORT int ibv_query_srq(ibv_srq*, ibv_srq_attr*) { return EOPNOTSUPP; }
EMU_EXPORT int ibv_attach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
EMU_EXPORT int ibv_detach_mcast(ibv_qp*, const ibv_gid*, uint16_t) { return EOPNOTSUPP; }
// Re-registration changes the access, the range (CHANGE_TRANSLATION, iova = addr) or the PD of
// a region in place. A new range or PD gives the region new keys (our assumption; the verbs let
// the keys change, ibv_rereg_mr(3)): work posted with the old ones, such as a receive posted
// into the old range, then fails as on hardware, where it no longer matches the region.
// Failures return IBV_REREG_MR_ERR_INPUT with errno set, as rdma-core's checks do.
EMU_EXPORT int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  constexpr int kKnown = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  const bool move = flags & IBV_REREG_MR_CHANGE_TRANSLATION, repd = flags & IBV_REREG_MR_CHANGE_PD;
  if (!mr || !flags || (flags & ~kKnown) || (repd && (!pd || pd->context != mr->context)) ||
      (move && (!addr || !length))) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  EmuContext* c = ectx(mr->context);
  if (int e = faulted(c, "ibv_rereg_mr")) {
    errno = e;
    return IBV_REREG_MR_ERR_INPUT;
  }
  auto* m = reinterpret_cast<EmuMr*>(mr);
  Shared* s = c->fab->shm;
  ShmMr& x = s->mrs[m->slot];
  const unsigned acc = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? static_cast<unsigned>(access) : x.access;
  if (int e = access_refused(c, acc)) {
    errno = e;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if (move && length > lim(c).max_mr_size) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  // A new range is checked and pinned as at ibv_reg_mr (pages.cpp). The kernel's EFAULT is a failed
  // command for rdma-core (IBV_REREG_MR_ERR_CMD, errno EFAULT); the region keeps its old range.
  PageReg moved;
  if (move) {
    if (int e = register_pages(*c->fab, addr, length, acc, &moved)) {
      errno = e;
      return e == EFAULT ? IBV_REREG_MR_ERR_CMD : IBV_REREG_MR_ERR_INPUT;
    }
  }
  PageReg old = m->pages;
  {
    Guard g(s->lock);
    if (x.key != mr->lkey) {
      release_pages(*c->fab, moved);
      errno = EINVAL;
      return IBV_REREG_MR_ERR_INPUT;
    }
    x.access = acc;
    if (repd) x.pd = reinterpret_cast<EmuPd*>(pd)->id;
    if (move) {
      x.addr = x.iova = reinterpret_cast<uint64_t>(addr);
      x.length = length;
      __atomic_store_n(&x.record, moved.record, __ATOMIC_RELAXED);  // read by page checks (pages.cpp)
      __atomic_store_n(&x.frames, moved.frames, __ATOMIC_RELAXED);
      __atomic_store_n(&x.stale, 0u, __ATOMIC_RELAXED);
      m->pages = moved;
    }
    if (move || repd) {
      uint32_t gen = (s->next_gen++ & 0xfffff) | 1;
      __atomic_store_n(&x.key, (gen << 12) | m->slot, __ATOMIC_RELEASE);
      mr->lkey = mr->rkey = x.key;
    }
  }
  if (repd) {
    reinterpret_cast<EmuPd*>(mr->pd)->users.fetch_sub(1);
    reinterpret_cast<EmuPd*>(pd)->users.fetch_add(1);
    mr->pd = pd;
  }
  if (move) {
    mr->addr = addr;
    mr->length = length;
    release_pages(*c->fab, old);  // the old range: no key reaches it any more
  }
  return 0;
}

EMU_EXPORT int ibv_fork_init(void) { return 0; }
EMU_EXPORT ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

// ---------------------------------------------------------------- strings and helpers

EMU_EXPORT const char* ibv_wc_status_str(ibv_wc_status status) {
  static const char* const s[] = {"success",
                                  "local length error",
                                  "local QP operation error",
                                  "local EE context operation error",
                                  "local protection error",
                                  "Work Request Flushed Error",
                                  "memory management operation error",
                                  "bad response error",
                                  "local access error",
                                  "remote invalid request error",
                                  "remote access error",
                                  "remote operation error",
                                  "transport retry counter exceeded",
                                  "RNR retry counter exceeded",
                                  "local RDD violation error",
                                  "remote invalid RD request",
                                  "aborted error",
                                  "invalid EE context number",
                                  "invalid EE context state",
                                  "fatal error",
                                  "response timeout error",
                                  "general error",
                                  "TM error",
                                  "TM software rendezvous"};
  unsigned i = static_cast<unsigned>(status);
  return i < sizeof s / sizeof s[0] ? s[i] : "unknown";
}

EMU_EXPORT const char* ibv_port_state_str(ibv_port_state state) {
  static const char* const s[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE",
                                  "PORT_ACTIVE_DEFER"};
  unsigned i = static_cast<unsigned>(state);
  return i < sizeof s / sizeof s[0] ? s[i] : "unknown";
}

EMU_EXPORT const char* ibv_node_type_str(ibv_node_type t) {
  switch (t) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

EMU_EXPORT const char* ibv_event_type_str(ibv_event_type e) {
  switch (e) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_COMM_EST: return "communication established";
    case IBV_EVENT_SQ_DRAINED: return "send queue drained";
    case IBV_EVENT_PATH_MIG: return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
    case IBV_EVENT_SM_CHANGE: return "SM change";
    case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
    case IBV_EVENT_GID_CHANGE: return "GID table change";
    case IBV_EVENT_WQ_FATAL: return "WQ fatal";
    default: return "unknown";
  }
}

EMU_EXPORT int ibv_rate_to_mult(ibv_rate rate) {
  switch (rate) {
    case IBV_RATE_2_5_GBPS: return 1;
    case IBV_RATE_5_GBPS: return 2;
    case IBV_RATE_10_GBPS: return 4;
    case IBV_RATE_20_GBPS: return 8;
    case IBV_RATE_30_GBPS: return 12;
    case IBV_RATE_40_GBPS: return 16;
    case IBV_RATE_60_GBPS: return 24;
    case IBV_RATE_80_GBPS: return 32;
    case IBV_RATE_120_GBPS: return 48;
    default: return -1;
  }
}

EMU_EXPORT ibv_rate mult_to_ibv_rate(int mult) {
  switch (mult) {
    case 1: return IBV_RATE_2_5_GBPS;
    case 2: return IBV_RATE_5_GBPS;
    case 4: return IBV_RATE_10_GBPS;
    case 8: return IBV_RATE_20_GBPS;
    case 12: return IBV_RATE_30_GBPS;
    case 16: return IBV_RATE_40_GBPS;
    case 24: return IBV_RATE_60_GBPS;
    case 32: return IBV_RATE_80_GBPS;
    case 48: return IBV_RATE_120_GBPS;
    default: return IBV_RATE_MAX;
  }
}

// ibv_get_sysfs_path and the rest of rdma-core's ABI: abi_rest.cpp.

// ibv_devinfo reads a device's board_id through this; answer for our devices.
EMU_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (!dir || !file || !buf || size == 0) return -1;
  if (std::strncmp(dir, "/sys/class/infiniband/", 22) == 0) {
    if (std::strcmp(file, "board_id") == 0) return std::snprintf(buf, size, "TBVERBS_EMU") > 0 ? 11 : -1;
    if (std::strcmp(file, "node_desc") == 0) return std::snprintf(buf, size, "tbverbs emulated device") > 0 ? 23 : -1;
    return -1;
  }
  std::string path = std::string(dir) + "/" + file;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = ::read(fd, buf, size);
  ::close(fd);
  if (n > 0 && buf[n - 1] == '\n') buf[--n] = '\0';
  if (n >= 0 && static_cast<size_t>(n) < size) buf[n] = '\0';
  return static_cast<int>(n);
}

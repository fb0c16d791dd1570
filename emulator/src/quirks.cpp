// The published limits of each profile and the quirks (contested behaviours) of
// Apple's driver, with their sources. docs/emulator.md mirrors both tables.
//
// Sources: "TN3205" is Apple's technical note on RDMA over Thunderbolt; "[R] ..."
// is a field report as cited in docs/field-reports.md section 4b; "our assumption"
// marks a value nobody has published, chosen to fit the reports.
#include <stdexcept>
#include <string>

#include "emu.hpp"

namespace emu {

const Limits& limits_of(Profile p) {
  static const Limits kThunderbolt{
      .max_qp = 11,            // [R] public `ibv_devinfo -v` dumps of macOS 26.x
      .usable_qps = 10,        // TN3205; [R] mlx#4209: the 11th create_qp → EBUSY
      .max_pd = 11,            // [R] devinfo dumps; ENOMEM for the 12th is our assumption
      .max_cq = 11,            // [R] devinfo dumps; ENOMEM for the 12th is our assumption
      .max_mr = 100,           // [R] devinfo dumps, mlx#3162 ("clean NULL"); ENOMEM is our assumption
      .max_sge = 1,            // [R] devinfo dumps
      .max_mr_size = 16384000, // [R] Anemll TEST_IBV.md, MCDMA notes (0xfa0000); EINVAL is our assumption
      .max_depth = 4095,       // TN3205: at most 4095, counted in 4 KiB frames
      .min_depth = 1023,       // [R] a request of 256 was granted 1023 (the rounding rule is our assumption)
      .max_msg = 16773120,     // TN3205: "message sizes of up to 16,773,120 bytes" (4095 frames)
      .max_cqe = 4096,         // TN3205's example CQ of 4095+1 entries (no published maximum)
      .max_inline = 0,         // JACCL and ds4 ask for 0; TN3205 does not document inline data
      .max_rd_atom = 0,        // [R] devinfo dumps (max_qp_rd_atom 0): no RDMA READ on a UC-only driver
      .atomics = false,
  };
  static const Limits kRdmaCoreRc{
      .max_qp = kMaxQps,
      .usable_qps = kMaxQps,
      .max_pd = kMaxPds,
      .max_cq = kMaxCqs,
      .max_mr = kMaxMrs,
      .max_sge = kMaxSge,
      .max_mr_size = 1ull << 40,
      .max_depth = 4096,
      .min_depth = 0,
      .max_msg = 1ull << 30,   // one process_vm_writev call
      .max_cqe = kCqRing - 1,
      .max_inline = 256,
      .max_rd_atom = 16,       // our assumption: what ConnectX ports commonly report
      .atomics = true,
  };
  // hellas-ai/thunderbolt-ibverbs kernel/ibdev.c (docs/emulator.md cites each line): the
  // TBV_IBDEV_* limits its query_device reports and create_qp enforces.
  static const Limits kUsb4Rdma{
      .max_qp = 256,           // ibdev.c: TBV_IBDEV_MAX_QP 256 (attr->max_qp)
      .usable_qps = 256,       // our assumption: the reported maximum (QPNs come from an IDA from 0x900)
      .max_pd = 256,           // ibdev.c: attr->max_pd = 256
      .max_cq = 256,           // ibdev.c: TBV_IBDEV_MAX_CQ 256
      .max_mr = 1024,          // ibdev.c: attr->max_mr = 1024
      .max_sge = 4,            // ibdev.c: TBV_IBDEV_MAX_SGE 4 (send and receive; post_recv takes one)
      .max_mr_size = UINT64_MAX, // ibdev.c: attr->max_mr_size = U64_MAX
      .max_depth = 1024,       // ibdev.c: TBV_IBDEV_MAX_QP_WR 1024; create_qp above it → EINVAL
      .min_depth = 0,
      .max_msg = kUsb4NativeMaxMsg, // port max_msg_sz on the native transport (proto/native_data.h)
      .max_cqe = 4096,         // ibdev.c: TBV_IBDEV_MAX_CQE 4096
      .max_inline = 0,         // ibdev.c: create_qp sets max_inline_data = 0; an inline post → EOPNOTSUPP
      .max_rd_atom = 128,      // ibdev.c: TBV_IBDEV_MAX_READ_CTX 128 (max_qp_rd_atom)
      .atomics = false,        // ibdev.c: atomic_cap = IB_ATOMIC_NONE
  };
  switch (p) {
    case Profile::Thunderbolt: return kThunderbolt;
    case Profile::Usb4Rdma: return kUsb4Rdma;
    case Profile::RdmaCoreRc:
    case Profile::RdmaCoreRoce:
    case Profile::RdmaCoreIb: break;
  }
  return kRdmaCoreRc;
}

// TN3205: "the system may adjust queue depths"; [R] a request of 256 was granted
// 1023. Our assumption fitted to that report: the driver rounds a request up to
// the next 2^k - 1 frames, at least 1023 and at most 4095.
uint32_t tb_granted_depth(uint32_t requested) {
  const Limits& l = limits_of(Profile::Thunderbolt);
  uint64_t d = 1;
  while (d - 1 < requested && d - 1 < l.max_depth) d <<= 1;
  uint64_t granted = d - 1;
  if (granted < l.min_depth) granted = l.min_depth;
  if (granted > l.max_depth) granted = l.max_depth;
  return static_cast<uint32_t>(granted);
}

// Value 0 of each quirk is its default.
const QuirkDef kQuirks[kNumQuirks] = {
    {"empty_rq",
     {{"wait", "TN3205 (credit-based flow control), [R] llama.cpp",
       "a send that meets an empty receive queue waits until the peer posts a receive; post_send never blocks"},
      {"drop", "IB spec UC semantics (no receive WQE: the message is dropped); our assumption for Apple",
       "the message is lost (the send completes successfully), the QP lives"},
      {"kill", "[R] ds4", "the message is lost and that direction never delivers again"}},
     3},
    {"macos",
     {{"26.3", "TN3205 (messages up to 16,773,120 bytes); [R] JACCL uses > 4 KiB on macOS >= 26.3",
       "messages of many 4 KiB frames are delivered, up to max_msg_sz"},
      {"26.2", "[R] ds4 (older macOS), JACCL",
       "a message of more than one 4 KiB frame is never delivered: the send completes, the receive stays posted"},
      {}},
     2},
    {"mr_access",
     {{"any", "[R] JACCL, ds4 (LOCAL_WRITE|REMOTE_READ|REMOTE_WRITE works)", "any access flags are accepted"},
      {"local_write_only", "TN3205 (\"only as IBV_ACCESS_LOCAL_WRITE\", taken as a rule)",
       "ibv_reg_mr with a remote access flag fails with EINVAL"},
      {"remote_required", "[R] llama.cpp (Aug 2026, hardware)",
       "ibv_reg_mr without REMOTE_READ or REMOTE_WRITE (e.g. LOCAL_WRITE only) fails with EINVAL"}},
     3},
    {"completion_channels",
     {{"off", "TN3205 (\"the caller must poll\"); no public consumer uses channels; our assumption",
       "ibv_create_comp_channel returns NULL with EOPNOTSUPP, ibv_req_notify_cq returns EOPNOTSUPP"},
      {"on", "our assumption", "completion channels work as on rdma-core"},
      {}},
     2},
    {"post_limit",
     {{"granted", "TN3205 (queue depths in 4 KiB frames; \"the system may adjust queue depths\")",
       "posts are accepted up to the depth create_qp granted, counted in 4 KiB frames"},
      {"63",
       "[R] hellas-ai/thunderbolt-ibverbs PR #41 (64 KiB messages: \"63/64\" in-flight sends, \"63/128\" initial "
       "receives); ENOMEM is our assumption",
       "at most 63 work requests outstanding per queue, whatever create_qp granted: the 64th post_send (sends not "
       "completed) or post_recv (receives not consumed) fails with ENOMEM"},
      {}},
     2},
};

namespace {
std::string choices(const QuirkDef& d) {
  std::string s;
  for (uint32_t i = 0; i < d.nvalues; ++i) s += (i ? ", " : "") + std::string(d.values[i].name);
  return s;
}
std::string names() {
  std::string s;
  for (uint32_t i = 0; i < kNumQuirks; ++i) s += (i ? ", " : "") + std::string(kQuirks[i].name);
  return s;
}
}  // namespace

void set_quirk(QuirkSet q, const std::string& name, const std::string& value) {
  for (uint32_t i = 0; i < kNumQuirks; ++i) {
    const QuirkDef& d = kQuirks[i];
    if (name != d.name) continue;
    for (uint32_t v = 0; v < d.nvalues; ++v)
      if (value == d.values[v].name) {
        q[i] = v;
        return;
      }
    throw std::runtime_error("quirk " + name + ": unknown value \"" + value + "\" (expected " + choices(d) + ")");
  }
  throw std::runtime_error("unknown quirk \"" + name + "\" (known: " + names() + ")");
}

void set_quirks(QuirkSet q, const std::string& assignments) {
  size_t pos = 0;
  while (pos <= assignments.size()) {
    size_t end = assignments.find(',', pos);
    if (end == std::string::npos) end = assignments.size();
    std::string item = assignments.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) throw std::runtime_error("quirk \"" + item + "\" is not NAME=VALUE");
    set_quirk(q, item.substr(0, eq), item.substr(eq + 1));
  }
}

std::string format_quirks(const QuirkSet q) {
  std::string s;
  for (uint32_t i = 0; i < kNumQuirks; ++i) {
    uint32_t v = q[i] < kQuirks[i].nvalues ? q[i] : 0;
    s += (i ? " " : "") + std::string(kQuirks[i].name) + "=" + kQuirks[i].values[v].name;
  }
  return s;
}

}  // namespace emu

// The diagnosis catalogue: lookup per platform and symbolic errno, one test per family of
// docs/field-reports.md section 1 rows (and the section 3 scenarios that map to an ErrorKind),
// rows that must not leak to another platform, and the table's own invariants (every row
// reachable, i.e. ordered specific to general; one id, one text).
#include <catch2/catch_test_macros.hpp>

#include <tbverbs/diagnosis.hpp>

#include <cerrno>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define TBVERBS_TEST_HAVE_VERBS_H 1
#endif

using tbverbs::Error;
using tbverbs::ErrorKind;
using tbverbs::Platform;
using tbverbs::Step;
namespace wc = tbverbs::wc;

namespace {

/// A verb failure as the verb reports it (the errno convention does not matter for lookup).
Error verb(Platform p, Step s, int errno_value) {
  Error e = Error::from_errno(s, errno_value);
  e.from(p);
  return e;
}

/// A condition the library detected itself.
Error cond(Platform p, Step s, ErrorKind k, std::string_view detail = {}) {
  Error e = Error::make(s, k, detail);
  e.from(p);
  return e;
}

/// A failed work completion.
Error completion(Platform p, int status) {
  Error e = Error::from_wc(status, 1);
  e.from(p);
  return e;
}

std::string_view id_of(const Error& e) {
  const tbverbs::Diagnosis* d = tbverbs::find_diagnosis(e);
  return d ? d->id : std::string_view("(none)");
}

std::string text_of(const Error& e) {
  const tbverbs::Diagnosis* d = tbverbs::find_diagnosis(e);
  return d ? std::string(d->cause) + "\n" + std::string(d->remedy) : std::string();
}

bool says(const Error& e, std::string_view words) { return text_of(e).find(words) != std::string::npos; }

constexpr Platform apple = Platform::apple;
constexpr Platform linux_rc = Platform::rdma_core;
constexpr Platform any = Platform::any;

} // namespace

// ---- the table itself --------------------------------------------------------------------

TEST_CASE("catalogue: every row is reachable, so rows run specific to general", "[diagnosis][catalogue]") {
  // The most general error a row accepts (its keys, wildcards kept as wildcards) must be
  // answered by that row, or by an earlier row with the same diagnosis (EOPNOTSUPP and ENOTSUP
  // are one value on Linux). Otherwise an earlier, more general row shadows it.
  const auto& rows = tbverbs::diagnosis_catalogue;
  for (std::size_t i = 0; i < std::size(rows); ++i) {
    const tbverbs::DiagnosisRule& r = rows[i];
    Error e;
    e.platform = r.platform;
    e.step = r.step;
    e.sys_errno = r.sys_errno;
    e.kind = r.kind;
    e.wc_status = r.wc_status;
    e.detail.assign(r.detail_contains);
    const tbverbs::Diagnosis* d = tbverbs::find_diagnosis(e);
    INFO("row " << i << " (" << r.diagnosis.id << ")");
    REQUIRE(d != nullptr);
    CHECK(d->id == r.diagnosis.id);
  }
}

TEST_CASE("catalogue: one id, one text; every row has an id, a cause and a remedy",
          "[diagnosis][catalogue]") {
  std::map<std::string_view, const tbverbs::Diagnosis*> by_id;
  std::map<std::string_view, std::string_view> id_by_cause;
  for (const auto& r : tbverbs::diagnosis_catalogue) {
    const tbverbs::Diagnosis& d = r.diagnosis;
    INFO(d.id);
    CHECK_FALSE(d.id.empty());
    CHECK(d.cause.size() > 20);
    CHECK(d.remedy.size() > 20);
    auto [it, fresh] = by_id.emplace(d.id, &d);
    if (!fresh) {
      CHECK(it->second->cause == d.cause);
      CHECK(it->second->remedy == d.remedy);
    }
    auto [cit, cfresh] = id_by_cause.emplace(d.cause, d.id);
    if (!cfresh) CHECK(cit->second == d.id);
  }
  CHECK(by_id.size() >= 60);
}

TEST_CASE("catalogue: wc:: names agree with rdma-core's enum ibv_wc_status", "[diagnosis]") {
#if defined(TBVERBS_TEST_HAVE_VERBS_H)
  STATIC_CHECK(wc::success == IBV_WC_SUCCESS);
  STATIC_CHECK(wc::loc_len_err == IBV_WC_LOC_LEN_ERR);
  STATIC_CHECK(wc::loc_qp_op_err == IBV_WC_LOC_QP_OP_ERR);
  STATIC_CHECK(wc::loc_prot_err == IBV_WC_LOC_PROT_ERR);
  STATIC_CHECK(wc::wr_flush_err == IBV_WC_WR_FLUSH_ERR);
  STATIC_CHECK(wc::loc_access_err == IBV_WC_LOC_ACCESS_ERR);
  STATIC_CHECK(wc::rem_access_err == IBV_WC_REM_ACCESS_ERR);
  STATIC_CHECK(wc::rem_op_err == IBV_WC_REM_OP_ERR);
  STATIC_CHECK(wc::retry_exc_err == IBV_WC_RETRY_EXC_ERR);
  STATIC_CHECK(wc::rnr_retry_exc_err == IBV_WC_RNR_RETRY_EXC_ERR);
  STATIC_CHECK(wc::fatal_err == IBV_WC_FATAL_ERR);
  STATIC_CHECK(wc::general_err == IBV_WC_GENERAL_ERR);
  // The names wc_status_name prints are the enumerators' own (no libibverbs link needed).
  CHECK(tbverbs::wc_status_name(IBV_WC_REM_ABORT_ERR) == "IBV_WC_REM_ABORT_ERR");
  CHECK(tbverbs::wc_status_name(IBV_WC_RESP_TIMEOUT_ERR) == "IBV_WC_RESP_TIMEOUT_ERR");
  CHECK(tbverbs::wc_status_name(IBV_WC_TM_RNDV_INCOMPLETE) == "IBV_WC_TM_RNDV_INCOMPLETE");
#else
  // docs/field-reports.md's list: SUCCESS 0, LOC_LEN_ERR 1, LOC_PROT_ERR 4, WR_FLUSH_ERR 5,
  // RETRY_EXC_ERR 12, RNR_RETRY_EXC_ERR 13, GENERAL_ERR 21.
  STATIC_CHECK(wc::loc_len_err == 1);
  STATIC_CHECK(wc::loc_prot_err == 4);
  STATIC_CHECK(wc::wr_flush_err == 5);
  STATIC_CHECK(wc::retry_exc_err == 12);
  STATIC_CHECK(wc::rnr_retry_exc_err == 13);
  STATIC_CHECK(wc::general_err == 21);
#endif
}

// ---- section 1, rows 1-2 and section 3 "no verbs device": no device, name not found ------

TEST_CASE("no device: distinct hints for RDMA disabled, not Thunderbolt 5, and Linux",
          "[diagnosis][device]") {
  SECTION("Apple, the list is empty: rdma_ctl or not TB5") {
    const Error e = cond(apple, Step::get_device_list, ErrorKind::no_device,
                         "the verbs library /usr/lib/librdma.dylib lists no RDMA device");
    CHECK(id_of(e) == "no-device-macos");
    CHECK(says(e, "rdma_ctl status"));
    CHECK(says(e, "rdma_ctl enable"));
    CHECK(says(e, "system_profiler SPThunderboltDataType | grep Speed"));
  }
  SECTION("Apple, rdma_ctl said disabled") {
    const Error e =
        cond(apple, Step::get_device_list, ErrorKind::no_device, std::string(tbverbs::fact::rdma_disabled));
    CHECK(id_of(e) == "no-device-rdma-disabled");
    CHECK(says(e, "RDMA disabled (rdma_ctl)"));
    CHECK(says(e, "Recovery"));
    CHECK(says(e, "`rdma_ctl enable`"));
  }
  SECTION("Apple, the ports are not Thunderbolt 5") {
    const Error e = cond(apple, Step::get_device_list, ErrorKind::no_device,
                         "system_profiler: " + std::string(tbverbs::fact::not_thunderbolt5) + " (40 Gb/s)");
    CHECK(id_of(e) == "no-device-not-thunderbolt5");
    CHECK(says(e, "Not Thunderbolt 5"));
    CHECK(says(e, "80 Gb/s"));
  }
  SECTION("Linux, no kernel RDMA: ibv_get_device_list fails with ENOSYS") {
    Error e = cond(linux_rc, Step::get_device_list, ErrorKind::no_device);
    e.sys_errno = ENOSYS;
    CHECK(id_of(e) == "no-device-no-kernel-rdma");
    CHECK(says(e, "modprobe ib_uverbs"));
    CHECK(says(e, "/dev/infiniband"));
    CHECK(says(e, "rdma link"));
    // Also when the list code reports it as a plain verb failure.
    CHECK(id_of(verb(linux_rc, Step::get_device_list, ENOSYS)) == "no-device-no-kernel-rdma");
  }
  SECTION("Linux, an empty list") {
    const Error e = cond(linux_rc, Step::get_device_list, ErrorKind::no_device);
    CHECK(id_of(e) == "no-device-linux");
    CHECK(says(e, "ibv_devices"));
  }
  SECTION("the facts are Apple hints only") {
    CHECK(id_of(cond(linux_rc, Step::get_device_list, ErrorKind::no_device,
                     std::string(tbverbs::fact::rdma_disabled))) == "no-device-linux");
    CHECK(id_of(cond(any, Step::get_device_list, ErrorKind::no_device)) == "no-device");
  }
}

TEST_CASE("device name not found: the error lists the devices, rdma_enN pairs with enN", "[diagnosis][device]") {
  Error e = cond(apple, Step::open_device, ErrorKind::device_not_found,
                 "rdma_en5 not found; 2 available: rdma_en2, rdma_en3");
  e.on("rdma_en5");
  CHECK(id_of(e) == "device-not-found-macos");
  // Issue 13: no literal "N available"; the error itself lists the devices.
  CHECK(says(e, "No device has the configured name (the error lists the devices that exist)"));
  CHECK_FALSE(says(e, "N available"));
  CHECK(says(e, "networksetup -listallhardwareports"));
  CHECK(e.message().find("2 available: rdma_en2, rdma_en3") != std::string::npos);
  CHECK(id_of(cond(linux_rc, Step::open_device, ErrorKind::device_not_found)) == "device-not-found");
  CHECK(id_of(verb(linux_rc, Step::open_device, EACCES)) == "open-device-permission");
}

TEST_CASE("library not found and symbol missing: macOS 26.2+ vs install rdma-core", "[diagnosis][loader]") {
  const Error mac = cond(apple, Step::load_library, ErrorKind::library_not_found);
  CHECK(id_of(mac) == "library-not-found-macos");
  CHECK(says(mac, "RDMA over Thunderbolt needs macOS 26.2+ (librdma.dylib)"));
  const Error lin = cond(linux_rc, Step::load_library, ErrorKind::library_not_found);
  CHECK(id_of(lin) == "library-not-found-linux");
  CHECK(says(lin, "install rdma-core"));
  CHECK(says(lin, "apt-get install libibverbs1 ibverbs-providers"));
  CHECK_FALSE(says(lin, "26.2"));
  CHECK_FALSE(says(mac, "apt-get"));
  const Error unknown = cond(any, Step::load_library, ErrorKind::library_not_found);
  CHECK(id_of(unknown) == "library-not-found");
  CHECK(says(unknown, "26.2+"));
  CHECK(says(unknown, "install rdma-core"));

  CHECK(id_of(cond(apple, Step::resolve_symbol, ErrorKind::symbol_missing, "ibv_reg_mr")) ==
        "symbol-missing-macos");
  CHECK(id_of(cond(linux_rc, Step::resolve_symbol, ErrorKind::symbol_missing, "ibv_reg_mr")) ==
        "symbol-missing-linux");
  CHECK(says(cond(linux_rc, Step::resolve_symbol, ErrorKind::symbol_missing), "IBVERBS_1.1"));
  CHECK(id_of(cond(any, Step::resolve_symbol, ErrorKind::symbol_missing)) == "symbol-missing");
}

// ---- row 3 and section 3 "inactive port" ---------------------------------------------------

TEST_CASE("alloc_pd on Apple is a port that is down; port_not_active per platform", "[diagnosis][port]") {
  for (int errno_value : {0, ENOMEM, EINVAL}) {
    const Error e = verb(apple, Step::alloc_pd, errno_value);
    INFO("errno " << errno_value);
    CHECK(id_of(e) == "alloc-pd-port-down");
    CHECK(says(e, "`ibv_devinfo -d rdma_enN | grep state`"));
    CHECK(says(e, "PORT_ACTIVE (4) on both ends"));
  }
  CHECK(id_of(verb(linux_rc, Step::alloc_pd, ENOMEM)) == "(none)"); // not Apple's port-down
  const Error mac = cond(apple, Step::query_port, ErrorKind::port_not_active);
  CHECK(id_of(mac) == "port-not-active-macos");
  CHECK(says(mac, "pmset -a sleep 0"));
  CHECK(id_of(cond(linux_rc, Step::query_port, ErrorKind::port_not_active)) == "port-not-active-linux");
  CHECK(id_of(cond(any, Step::alloc_pd, ErrorKind::port_not_active)) == "port-not-active");
}

// ---- rows 4-6: memory registration and CQs -------------------------------------------------

TEST_CASE("reg_mr ENOMEM on rdma-core is RLIMIT_MEMLOCK", "[diagnosis][mr]") {
  for (Step s : {Step::reg_mr, Step::create_cq}) {
    const Error e = verb(linux_rc, s, ENOMEM);
    CHECK(id_of(e) == "memlock-limit");
    CHECK(says(e, "RLIMIT_MEMLOCK"));
    CHECK(says(e, "`ulimit -l unlimited`"));
    CHECK(says(e, "/etc/security/limits.conf"));
    CHECK(says(e, "--ulimit memlock=-1 --cap-add=IPC_LOCK"));
  }
  CHECK(id_of(verb(linux_rc, Step::create_qp, ENOMEM)) == "create-qp-enomem-linux");
  CHECK(says(verb(linux_rc, Step::create_qp, ENOMEM), "ulimit -l unlimited"));
}

TEST_CASE("reg_mr on Apple is the ~100 MR ceiling or alignment, never memlock", "[diagnosis][mr]") {
  for (int errno_value : {0, ENOMEM, EFAULT}) {
    const Error e = verb(apple, Step::reg_mr, errno_value);
    INFO("errno " << errno_value);
    CHECK(id_of(e) == "reg-mr-macos");
    CHECK(says(e, "about 100 MRs per device"));
    CHECK(says(e, "page-aligned"));
    CHECK(says(e, "max_mr_size"));
  }
  CHECK(id_of(cond(apple, Step::reg_mr, ErrorKind::capacity)) == "reg-mr-macos");
  CHECK(id_of(verb(linux_rc, Step::reg_mr, EFAULT)) == "reg-mr-bad-address");
  CHECK(id_of(verb(linux_rc, Step::reg_mr, EINVAL)) == "reg-mr-einval");
}

TEST_CASE("reg_mr over max_mr_size: regions of at most max_mr_size, never one large slab", "[diagnosis][mr]") {
  // Section 4b: Thunderbolt reports max_mr_size 16,384,000 and refuses longer registrations.
  const std::string detail = "16777216 bytes exceeds max_mr_size (16384000)";
  for (Platform p : {apple, linux_rc, any}) {
    INFO("platform " << static_cast<int>(p));
    Error e = verb(p, Step::reg_mr, EINVAL);
    e.with_detail(detail);
    CHECK(id_of(e) == "reg-mr-exceeds-max-mr-size");
    CHECK(says(e, "16,384,000"));
    CHECK(says(e, "at most max_mr_size"));
    CHECK(says(e, "several MRs"));
    // The library's own check (before calling the verb) says the same.
    CHECK(id_of(cond(p, Step::reg_mr, ErrorKind::capacity, detail)) == "reg-mr-exceeds-max-mr-size");
  }
  CHECK(std::string(tbverbs::fact::exceeds_max_mr_size) == "exceeds max_mr_size");
  // A plain EINVAL on Apple names both causes: the size cap and the access set.
  const Error plain = verb(apple, Step::reg_mr, EINVAL);
  CHECK(id_of(plain) == "reg-mr-einval-macos");
  CHECK(says(plain, "16,384,000"));
  CHECK(says(plain, "other access set"));
  // That cap forbids registering "one large slab": no row may advise it any more.
  for (const auto& r : tbverbs::diagnosis_catalogue) {
    INFO(r.diagnosis.id);
    CHECK(std::string(r.diagnosis.remedy).find("slab") == std::string::npos);
    CHECK(std::string(r.diagnosis.cause).find("slab") == std::string::npos);
  }
}

TEST_CASE("reg_mr refused for its access flags: try the other access set", "[diagnosis][mr]") {
  // TN3205 advises LOCAL_WRITE only; llama.cpp saw LOCAL_WRITE-only refused on hardware.
  for (Platform p : {apple, linux_rc}) {
    Error e = verb(p, Step::reg_mr, EINVAL);
    e.with_detail("65536 bytes; access flags refused: LOCAL_WRITE");
    CHECK(id_of(e) == "reg-mr-access-refused");
    CHECK(says(e, "Try the other access set"));
    CHECK(says(e, "LOCAL_WRITE alone"));
    CHECK(says(e, "LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE"));
    CHECK(says(e, "TN3205"));
    CHECK(says(e, "llama.cpp"));
  }
  // The fact alone does not turn another errno into an access problem.
  Error nomem = verb(linux_rc, Step::reg_mr, ENOMEM);
  nomem.with_detail("access flags refused");
  CHECK(id_of(nomem) == "memlock-limit");
}

TEST_CASE("completion channels unsupported: poll instead, tbverbs falls back", "[diagnosis][cq]") {
  // TN3205: "all queue pair operations are non-blocking and the caller must poll".
  for (Platform p : {apple, linux_rc, any}) {
    for (Step s : {Step::create_comp_channel, Step::req_notify_cq}) {
      for (int errno_value : {EOPNOTSUPP, ENOTSUP}) {
        INFO("platform " << static_cast<int>(p) << " step " << tbverbs::step_name(s) << " errno " << errno_value);
        const Error e = s == Step::req_notify_cq ? Error::from_return(s, errno_value).from(p) : verb(p, s, errno_value);
        CHECK(id_of(e) == "completion-channel-unsupported");
        CHECK(says(e, "the caller must poll"));
        CHECK(says(e, "falls back automatically"));
        CHECK(says(e, "never past the deadline"));
      }
      // A library without the channel functions.
      CHECK(id_of(cond(p, s, ErrorKind::unsupported)) == "completion-channel-unsupported");
    }
  }
  CHECK(id_of(cond(any, Step::get_cq_event, ErrorKind::unsupported)) == "completion-channel-unsupported");
  // On Apple any refusal of a channel is this row (errno or not).
  CHECK(id_of(verb(apple, Step::create_comp_channel, 0)) == "completion-channel-unsupported");
  CHECK(id_of(verb(apple, Step::create_comp_channel, ENOMEM)) == "completion-channel-unsupported");
  // Not on rdma-core for an unrelated errno.
  CHECK(id_of(verb(linux_rc, Step::create_comp_channel, EMFILE)) == "(none)");
}

TEST_CASE("create_cq EINVAL is cqe > max_cqe", "[diagnosis][cq]") {
  for (Platform p : {linux_rc, any, apple}) {
    const Error e = verb(p, Step::create_cq, EINVAL);
    CHECK(id_of(e) == "create-cq-too-large");
    CHECK(says(e, "max_cqe"));
  }
  CHECK(id_of(verb(apple, Step::create_cq, 0)) == "create-cq-too-large"); // Apple: plain NULL
  CHECK(id_of(verb(linux_rc, Step::create_cq, EBUSY)) == "(none)");
}

// ---- rows 7-10: queue pairs --------------------------------------------------------------

TEST_CASE("create_qp EBUSY on Apple: the 10-QP cap or an orphaned holder; don't retry", "[diagnosis][qp]") {
  const Error e = verb(apple, Step::create_qp, EBUSY);
  CHECK(id_of(e) == "create-qp-ebusy-qp-cap");
  CHECK(says(e, "10 QPs per device"));
  CHECK(says(e, "Don't retry"));
  CHECK(says(e, "`ps -axo pid,ppid,command | awk '$2==1'`"));
  // The library's own QP count reaching the cap says the same.
  CHECK(id_of(cond(apple, Step::create_qp, ErrorKind::capacity)) == "create-qp-ebusy-qp-cap");
  // RTR EBUSY: an orphan (row 8).
  const Error rtr = Error::from_return(Step::modify_qp_rtr, EBUSY).from(apple);
  CHECK(id_of(rtr) == "rtr-ebusy-orphan");
  CHECK(says(rtr, "awk '$2==1'"));
  // Not an rdma-core diagnosis.
  CHECK(id_of(verb(linux_rc, Step::create_qp, EBUSY)) == "(none)");
}

TEST_CASE("create_qp EOPNOTSUPP or ENOTSUP on Apple: UC only (both spellings, every OS)", "[diagnosis][qp]") {
  // macOS: EOPNOTSUPP 102 and ENOTSUP 45 are two values; Linux: both are 95.
  for (int errno_value : {EOPNOTSUPP, ENOTSUP}) {
    INFO("errno " << errno_value);
    const Error e = verb(apple, Step::create_qp, errno_value);
    CHECK(id_of(e) == "qp-type-uc-only");
    CHECK(says(e, "IBV_QPT_UC"));
    CHECK(id_of(Error::from_return(Step::modify_qp_rtr, -errno_value).from(apple)) == "qp-type-uc-only");
    CHECK(id_of(verb(linux_rc, Step::create_qp, errno_value)) == "create-qp-unsupported");
  }
  // The Linux thunderbolt_ibverbs driver's kernel-internal -ENOTSUPP at RTR (hellas).
  CHECK(id_of(Error::from_return(Step::modify_qp_rtr, -tbverbs::detail::kernel_enotsupp).from(linux_rc)) ==
        "qp-type-uc-only");
  CHECK(id_of(cond(apple, Step::create_qp, ErrorKind::unsupported)) == "qp-type-uc-only");
  CHECK(id_of(cond(apple, Step::check_endpoint, ErrorKind::unsupported)) == "unsupported-thunderbolt");
}

TEST_CASE("ENOMEM at create_qp or post on Apple: depth counted in 4 KiB frames", "[diagnosis][qp]") {
  const Error posted = Error::from_return(Step::post_recv, -12).from(apple); // hellas#35
  CHECK(id_of(posted) == "depth-in-4k-frames");
  CHECK(says(posted, "4095"));
  CHECK(says(posted, "ibv_query_qp"));
  CHECK(id_of(Error::from_return(Step::post_send, ENOMEM).from(apple)) == "depth-in-4k-frames");
  CHECK(id_of(verb(apple, Step::create_qp, ENOMEM)) == "depth-in-4k-frames");
  // rdma-core: a full queue or a QP in ERR (row 24).
  const Error full = Error::from_return(Step::post_recv, ENOMEM).from(linux_rc);
  CHECK(id_of(full) == "post-enomem-queue-full");
  CHECK(says(full, "destroy and recreate"));
  CHECK(id_of(verb(any, Step::create_qp, EINVAL)) == "create-qp-einval");
  CHECK(id_of(verb(any, Step::post_send, EINVAL)) == "post-einval");
}

// ---- rows 11-16: RTR ---------------------------------------------------------------------

TEST_CASE("RTR EINVAL: no IPv4-mapped GID on Apple, GRH/MTU on rdma-core", "[diagnosis][rtr]") {
  const Error mac = Error::from_return(Step::modify_qp_rtr, EINVAL).from(apple);
  CHECK(id_of(mac) == "rtr-einval-no-ipv4-gid");
  CHECK(says(mac, "no IPv4-mapped GID"));
  CHECK(says(mac, "networksetup -setmanual"));
  // Issue 13: one /30 per cable, never a 169.254/16 address (docs/thunderbolt.md: macOS keeps one
  // route for all of 169.254/16, through one interface).
  CHECK(says(mac, "ifconfig enN inet 10.99.0.1 netmask 255.255.255.252"));
  CHECK_FALSE(says(mac, "169.254.10"));
  CHECK(says(mac, "bridge0"));    // row 13
  CHECK(says(mac, "sgid_index")); // row 12
  CHECK(says(mac, "`ibv_devinfo -d rdma_enN -v | grep ffff`"));

  const Error roce = Error::from_return(Step::modify_qp_rtr, EINVAL).from(linux_rc);
  CHECK(id_of(roce) == "rtr-einval-rdma-core");
  CHECK(says(roce, "is_global"));
  CHECK(says(roce, "sgid_index"));
  CHECK(says(roce, "path_mtu > active_mtu"));
  CHECK_FALSE(says(roce, "networksetup")); // the Apple row must not answer rdma-core

  CHECK(id_of(Error::from_return(Step::modify_qp_rtr, EINVAL)) == "rtr-einval");
  // Other transitions have their own rows.
  CHECK(id_of(Error::from_return(Step::modify_qp_init, EINVAL).from(apple)) == "init-einval");
  CHECK(id_of(Error::from_return(Step::modify_qp_rts, EINVAL).from(apple)) == "rts-einval");
}

TEST_CASE("RTR ETIMEDOUT: dgid unreachable on this cable; RoCEv1/link-local on Linux", "[diagnosis][rtr]") {
  const Error mac = Error::from_return(Step::modify_qp_rtr, ETIMEDOUT).from(apple);
  CHECK(id_of(mac) == "rtr-etimedout-unreachable-gid");
  CHECK(says(mac, "route get <peer-ip>"));
  CHECK(says(mac, "same cable"));
  const Error roce = Error::from_return(Step::modify_qp_rtr, ETIMEDOUT).from(linux_rc);
  CHECK(id_of(roce) == "rtr-etimedout-rdma-core");
  CHECK(says(roce, "RoCEv1 or link-local"));
  CHECK(says(roce, "gid_attrs/types"));
  CHECK(id_of(Error::from_return(Step::modify_qp_rtr, ETIMEDOUT)) == "rtr-etimedout");
}

TEST_CASE("RTR or RTS failing with the port no longer ACTIVE: the port went down, not the dgid", "[diagnosis][rtr]") {
  // issue 32 item 5: a port taken down during set-up gave "the dgid is unreachable on this cable".
  for (Platform p : {apple, linux_rc}) {
    Error e = Error::from_return(Step::modify_qp_rtr, ETIMEDOUT).from(p);
    e.with_detail(std::string(tbverbs::fact::port_left_active) + " (port 1 is PORT_DOWN now); local GID ...");
    CHECK(id_of(e) == "transition-port-down");
    CHECK(says(e, "left ACTIVE"));
    CHECK(e.is(ETIMEDOUT)); // the errno stays as the verb returned it
    Error rts = Error::from_return(Step::modify_qp_rts, EINVAL).from(p);
    rts.with_detail(std::string(tbverbs::fact::port_left_active) + " (port 1 is PORT_DOWN now)");
    CHECK(id_of(rts) == "transition-port-down");
  }
}

TEST_CASE("RTR ENODATA on Apple: after idle, or a stale or holey GID table", "[diagnosis][rtr]") {
  const Error mac = Error::from_return(Step::modify_qp_rtr, ENODATA).from(apple);
  CHECK(id_of(mac) == "rtr-enodata-stale-gid");
  CHECK(says(mac, "idle"));
  CHECK(says(mac, "holes"));
  CHECK(says(mac, "pmset -a sleep 0"));
  CHECK(id_of(Error::from_return(Step::modify_qp_rtr, ENODATA).from(linux_rc)) == "rtr-enodata");
}

TEST_CASE("RTR ENODATA on Apple: protection domains leaked by orphaned processes, beside the stale GID",
          "[diagnosis][rtr]") {
  // Section 4b: 11 PDs per device, freed only by a reboot.
  const Error mac = Error::from_return(Step::modify_qp_rtr, ENODATA).from(apple);
  CHECK(id_of(mac) == "rtr-enodata-stale-gid"); // one row, both causes
  CHECK(says(mac, "protection domains leaked by orphaned processes"));
  CHECK(says(mac, "11 per device"));
  CHECK(says(mac, "`ps -axo pid,ppid,command | awk '$2==1'`"));
  CHECK(says(mac, "reboot"));
  CHECK(says(mac, "GID table")); // the stale-GID cause is still there
  CHECK_FALSE(says(Error::from_return(Step::modify_qp_rtr, ENODATA).from(linux_rc), "orphaned"));
}

TEST_CASE("RTR EINVAL for a GID routed from the wrong index: use the selection's index", "[diagnosis][rtr]") {
  // mlx PR #3389: the IPv4-mapped GID at index 2, RTR from index 1.
  for (Platform p : {apple, linux_rc, any}) {
    Error e = Error::from_return(Step::modify_qp_rtr, EINVAL).from(p);
    e.with_detail(std::string(tbverbs::fact::gid_index_mismatch) + ": index 1 is fe80::1, ::ffff:10.0.0.1 is at 2");
    e.gid_index = 1;
    CHECK(id_of(e) == "rtr-einval-gid-wrong-index");
    CHECK(says(e, "#3389"));
    CHECK(says(e, "index 2"));
    CHECK(says(e, "QpRecipe"));
    CHECK(says(e, "by construction"));
  }
  // Without the fact the Apple row still names the cause among the others.
  const Error mac = Error::from_return(Step::modify_qp_rtr, EINVAL).from(apple);
  CHECK(id_of(mac) == "rtr-einval-no-ipv4-gid");
  CHECK(says(mac, "index 2 routed from index 1"));
  CHECK(says(mac, "mlx PR #3389"));
}

TEST_CASE("numbers copied from the other OS's logs do not match symbolic rows", "[diagnosis][errno]") {
  // ENODATA is 96 on macOS and 61 on Linux; ETIMEDOUT 60 and 110; EOPNOTSUPP 102 and 95.
  const int foreign_enodata = ENODATA == 61 ? 96 : 61;
  const int foreign_etimedout = ETIMEDOUT == 110 ? 60 : 110;
  const int foreign_eopnotsupp = EOPNOTSUPP == 95 ? 102 : 95;
  CHECK(id_of(Error::from_return(Step::modify_qp_rtr, foreign_enodata).from(apple)) !=
        "rtr-enodata-stale-gid");
  CHECK(id_of(Error::from_return(Step::modify_qp_rtr, foreign_etimedout).from(apple)) !=
        "rtr-etimedout-unreachable-gid");
  CHECK(id_of(verb(apple, Step::create_qp, foreign_eopnotsupp)) != "qp-type-uc-only");
  // The symbolic names always match, whatever their value here.
  CHECK(id_of(Error::from_return(Step::modify_qp_rtr, ENODATA).from(apple)) == "rtr-enodata-stale-gid");
}

// ---- rows 17-24: completions, posting, polling ---------------------------------------------

TEST_CASE("failed work completions", "[diagnosis][wc]") {
  SECTION("RNR_RETRY_EXC_ERR: rnr_retry 7 and pre-posted receives (row 18)") {
    const Error e = completion(linux_rc, wc::rnr_retry_exc_err);
    CHECK(id_of(e) == "wc-rnr-retry-exceeded");
    CHECK(says(e, "rnr_retry = 7"));
    CHECK(says(e, "pre-post receives"));
  }
  SECTION("RETRY_EXC_ERR: wrong GID type or a dead peer, recreate the QP (row 23)") {
    const Error e = completion(linux_rc, wc::retry_exc_err);
    CHECK(id_of(e) == "wc-retry-exceeded");
    CHECK(says(e, "wrong GID type"));
    CHECK(says(e, "recreate the QP"));
  }
  SECTION("WR_FLUSH_ERR: QP in ERR, destroy and recreate; expected in teardown (row 24)") {
    for (Platform p : {apple, linux_rc, any}) {
      const Error e = completion(p, wc::wr_flush_err);
      CHECK(id_of(e) == "wc-wr-flush");
      CHECK(says(e, "teardown"));
      CHECK(says(e, "destroy and recreate"));
    }
  }
  SECTION("LOC_LEN_ERR: Apple's equal-frames rule; a size mismatch elsewhere (row 19)") {
    const Error mac = completion(apple, wc::loc_len_err);
    CHECK(id_of(mac) == "wc-loc-len-frame-mismatch");
    CHECK(says(mac, "4 KiB frames"));
    CHECK(id_of(completion(linux_rc, wc::loc_len_err)) == "wc-loc-len");
  }
  SECTION("LOC_PROT_ERR: lkey and registration") {
    const Error e = completion(apple, wc::loc_prot_err);
    CHECK(id_of(e) == "wc-loc-prot-lkey");
    CHECK(says(e, "lkey"));
  }
  SECTION("other statuses") {
    CHECK(id_of(completion(linux_rc, wc::rem_access_err)) == "wc-rem-access");
    CHECK(id_of(completion(apple, wc::loc_qp_op_err)) == "wc-loc-qp-op");
    CHECK(id_of(completion(apple, wc::general_err)) == "wc-error");
  }
  SECTION("a status row never answers a verb failure with the same number") {
    Error e = Error::from_errno(Step::poll_cq, 0);
    e.wc_status = wc::retry_exc_err; // kind stays verb_failed
    CHECK(id_of(e) == "poll-cq-failed");
  }
  SECTION("a negative ibv_poll_cq return") { CHECK(id_of(Error::from_poll(-EIO)) == "poll-cq-failed"); }
}

// ---- section 3: timeout vs peer lost, warm-up, side channel ---------------------------------

TEST_CASE("timeout and peer_lost are different diagnoses", "[diagnosis][peer]") {
  const Error waited = cond(apple, Step::wait_cq, ErrorKind::timeout);
  CHECK(id_of(waited) == "wait-timeout-thunderbolt");
  CHECK(says(waited, "no error CQE"));    // row 21
  CHECK(says(waited, "receives posted")); // row 17
  CHECK(says(waited, "frame count"));     // row 19
  CHECK(id_of(cond(linux_rc, Step::wait_cq, ErrorKind::timeout)) == "wait-timeout");
  const Error t = cond(any, Step::side_channel, ErrorKind::timeout);
  const Error lost = cond(any, Step::side_channel, ErrorKind::peer_lost);
  CHECK(id_of(t) == "timeout");
  CHECK(id_of(lost) == "peer-lost");
  CHECK(says(t, "may still be alive"));
  CHECK(says(lost, "recv() returned 0")); // row 25
  CHECK(says(lost, "stale errno"));
  CHECK(id_of(cond(apple, Step::collective, ErrorKind::peer_lost)) == "peer-lost");
  CHECK(id_of(cond(apple, Step::link_warmup, ErrorKind::timeout)) == "link-warmup-failed");
}

TEST_CASE("side channel on macOS: one route for 169.254/16 (row 26)", "[diagnosis][peer]") {
  for (int errno_value : {ETIMEDOUT, EHOSTUNREACH}) {
    const Error e = verb(apple, Step::side_channel, errno_value);
    CHECK(id_of(e) == "side-channel-unreachable-macos");
    CHECK(says(e, "sudo route change 192.168.10.2 -interface en2"));
  }
  // Elsewhere (the side channel is usually not tagged with a provider): a generic route hint.
  for (Platform p : {linux_rc, any})
    for (int errno_value : {ETIMEDOUT, EHOSTUNREACH, ENETUNREACH}) {
      const Error e = verb(p, Step::side_channel, errno_value);
      CHECK(id_of(e) == "side-channel-unreachable");
      CHECK(says(e, "ip route get <peer-ip>"));
    }
  // The side channel's connect deadline: kind timeout, the socket's last errno.
  Error connect = verb(any, Step::side_channel, ECONNREFUSED);
  connect.kind = ErrorKind::timeout;
  CHECK(id_of(connect) == "side-channel-refused");
  // A peer that is gone stays peer_lost whatever errno its socket left.
  Error gone = verb(apple, Step::side_channel, ETIMEDOUT);
  gone.kind = ErrorKind::peer_lost;
  CHECK(id_of(gone) == "peer-lost");
}

// ---- GIDs --------------------------------------------------------------------------------

TEST_CASE("GID selection: no IPv4-mapped GID, stale, not found, bad operator index", "[diagnosis][gid]") {
  const Error none = cond(apple, Step::select_gid, ErrorKind::no_ipv4_gid);
  CHECK(id_of(none) == "no-ipv4-gid-macos");
  CHECK(says(none, "only fe80::"));
  CHECK(says(none, "networksetup -setmanual"));
  CHECK(id_of(cond(linux_rc, Step::select_gid, ErrorKind::no_ipv4_gid)) == "no-ipv4-gid-linux");
  CHECK(says(cond(linux_rc, Step::select_gid, ErrorKind::no_ipv4_gid), "ip addr add"));
  CHECK(id_of(cond(any, Step::select_gid, ErrorKind::no_ipv4_gid)) == "no-ipv4-gid");

  const Error stale = cond(apple, Step::revalidate_gid, ErrorKind::gid_stale);
  CHECK(id_of(stale) == "gid-stale-macos");
  CHECK(says(stale, "APIPA"));
  CHECK(id_of(cond(linux_rc, Step::revalidate_gid, ErrorKind::gid_stale)) == "gid-stale");
  CHECK(id_of(cond(linux_rc, Step::select_gid, ErrorKind::gid_not_found)) == "gid-not-found");
  const Error idx = cond(any, Step::configure, ErrorKind::gid_index_invalid);
  CHECK(id_of(idx) == "gid-index-invalid");
  CHECK(says(idx, "TBVERBS_GID_INDEX"));
}

TEST_CASE("issue 13: no remedy suggests a 169.254/16 address for a port", "[diagnosis][gid]") {
  // docs/thunderbolt.md: macOS keeps one route for 169.254/16, through one interface, so every
  // cable needs its own subnet. The catalogue may name 169.254/16 only to say why not.
  for (const auto& r : tbverbs::diagnosis_catalogue) {
    const std::string_view remedy = r.diagnosis.remedy;
    INFO(r.diagnosis.id << ": " << remedy);
    CHECK(remedy.find("169.254.") == std::string_view::npos);
  }
  for (Platform p : {apple, any}) {
    const Error none = cond(p, Step::select_gid, ErrorKind::no_ipv4_gid);
    CHECK(says(none, "10.99.0.1 netmask 255.255.255.252"));
  }
}

TEST_CASE("endpoints: bad frames and incompatible peers", "[diagnosis][endpoint]") {
  CHECK(id_of(cond(any, Step::parse_endpoint, ErrorKind::bad_frame)) == "bad-frame");
  CHECK(id_of(cond(any, Step::side_channel, ErrorKind::bad_frame)) == "bad-frame");
  // A foreign message during the warm-up is a bad frame, not a lost direction.
  CHECK(id_of(cond(apple, Step::link_warmup, ErrorKind::bad_frame)) == "bad-frame");
  CHECK(id_of(cond(apple, Step::link_warmup, ErrorKind::result_mismatch)) == "link-warmup-failed");
  CHECK(id_of(cond(any, Step::link_warmup, ErrorKind::invalid_argument)) == "(none)");
  CHECK(id_of(cond(apple, Step::check_endpoint, ErrorKind::incompatible_peer)) == "incompatible-peer");
}

TEST_CASE("profile limits: capacity and unsupported features", "[diagnosis]") {
  const Error depth =
      cond(any, Step::configure, ErrorKind::capacity, "queue depths are counted in 4 KiB frames");
  CHECK(id_of(depth) == "capacity-exceeded");
  CHECK(says(depth, "4095"));
  CHECK(id_of(cond(apple, Step::post_send, ErrorKind::unsupported)) == "unsupported-thunderbolt");
  CHECK(says(cond(apple, Step::post_send, ErrorKind::unsupported),
             "RDMA WRITE is accepted but never executes"));
  CHECK(id_of(cond(linux_rc, Step::post_send, ErrorKind::unsupported)) == "unsupported");
  const Error wrong = cond(any, Step::collective, ErrorKind::result_mismatch);
  CHECK(id_of(wrong) == "result-mismatch");
  CHECK(says(wrong, "wc.status")); // row 20: statuses that were never checked
}

TEST_CASE("errors without a catalogue row have no diagnosis", "[diagnosis]") {
  CHECK(tbverbs::find_diagnosis(verb(any, Step::query_gid, EIO)) == nullptr);
  CHECK(tbverbs::find_diagnosis(cond(any, Step::configure, ErrorKind::invalid_argument)) == nullptr);
  CHECK(tbverbs::find_diagnosis(Error{}) == nullptr);
}

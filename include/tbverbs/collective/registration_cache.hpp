/// @file collective/registration_cache.hpp
/// `collective::RegistrationCache`: the user memory a communicator has registered on its devices,
/// and the one rule it keeps: **a registration is used only for the memory it was made for**.
///
/// ibv_reg_mr pins the pages behind a range when it is called (ibv_reg_mr(3)). Memory freed and
/// mapped again is other memory at the same address (glibc hands a 64 MiB vector the same address
/// on every other allocation); data received into the old registration lands in the old pages
/// and the new buffer never sees it, on every Mac and every NIC. So an entry is found by address
/// only while something proves the memory is still the one registered:
/// - **owned** entries (Communicator::register_memory) live exactly as long as their handle: the
///   handle's end deregisters them (after the call that uses them, if one runs). Where the page
///   frames can be read (collective/page_identity.hpp) every use also spot-checks (64 pages spread
///   over the buffer) that the same pages are still there: memory freed under a live handle and
///   mapped again, the program's mistake, is then staged with a notice rather than sent from or
///   received into through the stale registration.
/// - **cached** entries (Memory::registered, any buffer a call is handed) are kept between calls
///   only where the page frames prove the memory unchanged at every use (all of its pages: 0.9 ms
///   per 64 MiB here); elsewhere (without the
///   privilege to read frames, or on macOS) a buffer is registered for the one call and
///   deregistered when it ends. A cached entry whose pages changed is deregistered and made anew.
///
/// A registration covers the buffer's whole pages (Apple's driver wants page-aligned regions:
/// TN3205) as a MemoryRegionSet (regions within max_mr_size, serving every message). The cache is
/// bounded by each device's MR budget (max_mr less what is registered already, e.g. about 100 per
/// Thunderbolt device: docs/field-reports.md section 4b): when a new cached buffer does not fit,
/// the least recently used cached entries not in use are deregistered first, and if it still does
/// not fit the buffer is staged (copied through the scratch slots) instead. A range that failed to
/// register (read-only memory, say) is staged without retrying during the call.
///
/// Thread-safe: the calls of a communicator, register_memory and a handle's end on other threads
/// serialise on one mutex; an entry in use by a running call is deregistered when that call ends.
#pragma once

#include "engine.hpp"
#include "../notice.hpp"
#include "page_identity.hpp"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// One registered range. Opaque to callers: RegistrationCache::find() and add_owned() hand out
/// pointers that stay valid until the matching unpin() or release_owned().
struct RegistrationEntry {
  std::uintptr_t begin = 0;                          ///< The first byte of the pages it covers.
  std::uintptr_t end = 0;                            ///< One past their last byte.
  std::vector<std::optional<MemoryRegionSet>> sets;  ///< Per port.
  PageIdentity pages;                                ///< What backed it when it was registered (a spot check when owned).
  unsigned owners = 0;        ///< MemoryRegistration handles (owned entries).
  unsigned pins = 0;          ///< Calls using it now.
  bool cached = false;        ///< Kept between calls (Memory::registered, pages provable).
  bool stale_noted = false;   ///< Its pages changed under a handle: said once.
  std::uint64_t last_use = 0; ///< When a call last used it (the cache's clock: least recently used goes first).
};

/// The registered user memory of one communicator (see the top of this file).
class RegistrationCache {
public:
  /// One registered range (RegistrationEntry).
  using Entry = RegistrationEntry;

  /// The cache of `net`'s devices; at most `max_entries` cached ranges are kept.
  explicit RegistrationCache(const Network& net, std::size_t max_entries = 64) : net_(&net), max_entries_(max_entries) {}
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;
  ~RegistrationCache() { close(); }

  /// Deregisters everything (the communicator is going: before its protection domains); later
  /// calls find nothing and register nothing.
  void close() noexcept {
    const std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
    net_ = nullptr;
  }

  /// Fills `out` with the registrations covering [data, data + bytes) on every device, and pins
  /// the entry for the call (unpin() it when the call ends): an owned entry whose pages are still
  /// the registered ones, or, when `may_register` (Memory::registered), a cached or new one.
  /// Returns nullptr, leaving `out`'s registrations empty (the engine stages the buffer), when
  /// none is usable; `why` then says why. Allocates only when it registers.
  Entry* find(const std::byte* data, std::size_t bytes, bool may_register, OpMemory::Buffer& out, std::string* why = nullptr) {
    clear(out);
    const std::lock_guard<std::mutex> lock(mu_);
    if (net_ == nullptr || bytes == 0) return nullptr;
    const auto [begin, end] = pages_of(data, bytes);
    if (Entry* e = usable(begin, end, data, bytes, may_register, why)) {
      ++e->pins;
      e->last_use = ++clock_;
      fill(*e, data, out);
      return e;
    }
    if (!may_register) {
      if (why != nullptr && why->empty()) *why = "not registered (Memory::automatic registers only Communicator::register_memory's)";
      return nullptr;
    }
    Entry* e = add(begin, end, why);
    if (e == nullptr) return nullptr;
    e->pins = 1;
    e->pages = identity(*e); // after the registration pinned them
    e->cached = e->pages.provable();
    if (!e->cached)
      detail::notice_once(Notice::registration_per_call,
                          Error::make(Step::reg_mr, ErrorKind::unsupported, "/proc/self/pagemap shows no page frames to this process"));
    fill(*e, data, out);
    return e;
  }

  /// Ends one call's use of `e` (from find()): an entry no longer owned or cached goes.
  void unpin(Entry* e) noexcept {
    if (e == nullptr) return;
    const std::lock_guard<std::mutex> lock(mu_);
    if (e->pins > 0) --e->pins;
    drop_if_unused(e);
  }

  /// Registers [data, data + bytes) on every device for a MemoryRegistration handle (an owned
  /// entry). Errors: `capacity` when the devices' MR budget has no room (cached entries not in
  /// use are deregistered first), the registration's otherwise.
  Result<Entry*> add_owned(const std::byte* data, std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (net_ == nullptr) return fail(Error::make(Step::reg_mr, ErrorKind::invalid_argument, "register_memory on a closed communicator"));
    const auto [begin, end] = pages_of(data, bytes);
    std::string why;
    Entry* e = add(begin, end, &why);
    if (e == nullptr)
      return fail(Error::make(Step::reg_mr, ErrorKind::capacity, "register_memory of " + std::to_string(bytes) + " bytes: " + why));
    e->owners = 1;
    e->pages = identity(*e);
    return e;
  }

  /// The handle of `e` went: deregistered now, or when the call using it ends.
  void release_owned(Entry* e) noexcept {
    const std::lock_guard<std::mutex> lock(mu_);
    if (net_ == nullptr) return; // closed: everything went already
    if (e->owners > 0) --e->owners;
    drop_if_unused(e);
  }

  /// Deregisters every cached entry overlapping [data, data + bytes) that no call uses (owned
  /// entries stay: their handles decide); returns how many went.
  std::size_t forget(const void* data, std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto b = reinterpret_cast<std::uintptr_t>(data), e = b + bytes;
    std::size_t n = 0;
    for (std::size_t k = entries_.size(); k-- > 0;)
      if (entries_[k]->begin < e && b < entries_[k]->end && entries_[k]->owners == 0 && entries_[k]->pins == 0) {
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(k));
        ++n;
      }
    return n;
  }

  /// Entries held (owned, cached, or in use by a call).
  std::size_t size() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }
  /// Registrations made since the cache was created (a steady state makes none).
  std::uint64_t registrations() const noexcept { return registrations_; }
  /// Memory regions the cache holds on device `port` (Network::ports order).
  std::size_t regions(std::size_t port) const {
    const std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (const auto& e : entries_)
      if (port < e->sets.size() && e->sets[port]) n += e->sets[port]->regions().size();
    return n;
  }

private:
  static std::pair<std::uintptr_t, std::uintptr_t> pages_of(const std::byte* data, std::size_t bytes) noexcept {
    const std::size_t page = AlignedBuffer::page_size();
    const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes + page - 1) / page * page;
    return {begin, end};
  }
  static void clear(OpMemory::Buffer& out) noexcept {
    for (std::size_t p = 0; p < OpMemory::max_ports; ++p) out.reg[p] = nullptr;
  }
  static void fill(const Entry& e, const std::byte* data, OpMemory::Buffer& out) noexcept {
    for (std::size_t p = 0; p < e.sets.size() && p < OpMemory::max_ports; ++p) {
      out.reg[p] = e.sets[p] ? &*e.sets[p] : nullptr;
      out.offset[p] = reinterpret_cast<std::uintptr_t>(data) - e.begin;
    }
  }

  // An entry covering [begin, end) that still registers the memory there now: owned ones (and
  // cached ones, when the caller may use them) whose pages are the registered ones where that
  // can be read. A cached entry whose pages changed goes; an owned one is left to its handle.
  Entry* usable(std::uintptr_t begin, std::uintptr_t end, const std::byte* data, std::size_t bytes, bool may_register,
                std::string* why) {
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      Entry* e = entries_[k].get();
      if (!(e->begin <= begin && end <= e->end) || (e->owners == 0 && !(may_register && e->cached))) continue;
      if (!e->pages.provable() || identity(*e) == e->pages) return e;
      if (e->owners > 0) { // freed and mapped again under a live handle: never used for the new memory
        if (!e->stale_noted) {
          e->stale_noted = true;
          detail::notice_once(Notice::stale_registration,
                              Error::make(Step::reg_mr, ErrorKind::invalid_argument,
                                          "the " + std::to_string(e->end - e->begin) + " bytes registered at " +
                                              hex(e->begin) + " were unmapped and mapped again while registered"));
        }
        if (why != nullptr) *why = "the registered pages at this address were replaced (memory freed under its MemoryRegistration)";
        continue;
      }
      if (e->pins == 0) { // cached, its memory gone: deregister it and look on
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(k));
        --k;
      }
    }
    (void)data;
    (void)bytes;
    return nullptr;
  }

  // The pages behind an entry now: every page of a cached one (what keeps it), a spot check of
  // an owned one (its handle keeps it; the check catches a buffer freed under it).
  static PageIdentity identity(const Entry& e) noexcept {
    const auto* at = reinterpret_cast<const void*>(e.begin);
    return e.owners > 0 ? PageIdentity::sample(at, e.end - e.begin, 64) : PageIdentity::of(at, e.end - e.begin);
  }

  void drop_if_unused(Entry* e) noexcept {
    if (e->owners > 0 || e->pins > 0 || e->cached) return;
    for (std::size_t k = 0; k < entries_.size(); ++k)
      if (entries_[k].get() == e) {
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(k));
        return;
      }
  }

  static std::string hex(std::uintptr_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
  }

  // Regions a port may still register: max_mr less what is registered on its device, less one
  // kept free for anything else the process registers.
  std::size_t room(std::size_t port) const noexcept {
    const Port& p = *net_->ports()[port];
    if (p.device.max_mr <= 0) return SIZE_MAX;
    const long used = static_cast<long>(p.context->info()->memory_regions.load());
    const long left = static_cast<long>(p.device.max_mr) - used - 1;
    return left > 0 ? static_cast<std::size_t>(left) : 0;
  }
  // Deregisters the least recently used cached entry no call uses; false when there is none.
  bool evict_one() {
    std::size_t victim = entries_.size();
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      const Entry& e = *entries_[k];
      if (e.owners == 0 && e.pins == 0 && (victim == entries_.size() || e.last_use < entries_[victim]->last_use)) victim = k;
    }
    if (victim == entries_.size()) return false;
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(victim));
    return true;
  }
  // Makes room for `bytes` on every port (evicting cached entries), or says why not.
  bool make_room(std::size_t bytes, std::string* why) {
    const auto ports = net_->ports();
    std::size_t cached = 0;
    for (const auto& e : entries_) cached += e->owners == 0 ? 1 : 0;
    while (cached >= max_entries_ && evict_one()) --cached;
    for (std::size_t p = 0; p < ports.size(); ++p) {
      auto plan = RegionPlan::make(bytes, ports[p]->device.max_mr_size, net_->layout().slot_bytes);
      if (!plan) {
        if (why != nullptr) *why = std::string(plan.error().detail.view());
        return false;
      }
      while (room(p) < plan->count)
        if (!evict_one()) {
          if (why != nullptr)
            *why = ports[p]->name + ": " + std::to_string(plan->count) + " memory regions needed, " +
                   std::to_string(room(p)) + " left of max_mr " + std::to_string(ports[p]->device.max_mr);
          return false;
        }
    }
    return true;
  }
  // Registers [begin, end) on every port as a new entry (not owned, not pinned), or says why not.
  Entry* add(std::uintptr_t begin, std::uintptr_t end, std::string* why) {
    if (!make_room(end - begin, why)) return nullptr;
    const auto ports = net_->ports();
    auto e = std::make_unique<Entry>();
    e->begin = begin;
    e->end = end;
    e->last_use = ++clock_;
    const std::span<std::byte> memory(reinterpret_cast<std::byte*>(begin), end - begin);
    for (std::size_t p = 0; p < ports.size(); ++p) {
      auto set = MemoryRegionSet::reg(*ports[p]->pd, memory, ports[p]->device.max_mr_size, net_->layout().slot_bytes);
      if (!set) {
        if (why != nullptr) *why = ports[p]->name + ": " + set.error().message();
        return nullptr;
      }
      if (explain_enabled())
        explain(ports[p]->name + ": MR " + explain_memory(*set, "user memory", ports[p]->device.max_mr_size));
      e->sets.emplace_back(std::move(*set));
    }
    ++registrations_;
    entries_.push_back(std::move(e));
    return entries_.back().get();
  }

  mutable std::mutex mu_;
  const Network* net_;
  std::size_t max_entries_;
  std::vector<std::unique_ptr<Entry>> entries_; // stable addresses: OpMemory and handles point into them
  std::uint64_t clock_ = 0, registrations_ = 0;
};

} // namespace collective
TBVERBS_NAMESPACE_END

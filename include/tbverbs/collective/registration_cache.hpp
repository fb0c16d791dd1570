/// @file collective/registration_cache.hpp
/// `collective::RegistrationCache`: user buffers registered once, on every device of a
/// communicator, and found again by address range, so a backend that calls a collective on the
/// same buffers thousands of times registers nothing in the steady state.
///
/// A registration covers the buffer's whole pages (Apple's driver wants page-aligned regions:
/// TN3205) as a MemoryRegionSet (regions within max_mr_size, serving every message). The cache is
/// bounded by each device's MR budget (max_mr less what is registered already, e.g. about 100 per
/// Thunderbolt device: docs/field-reports.md section 4b): when a new buffer does not fit, the
/// least recently used unpinned entries are deregistered first, and if it still does not fit the
/// buffer is staged (copied through the scratch slots) instead. Pinned entries (explicit
/// Communicator::register_memory) are never evicted. A range that failed to register (read-only
/// memory, say) is remembered and staged without retrying.
///
/// **The one hazard of any registration cache**: a registration pins the pages it covers. If the
/// caller frees a cached buffer and later gets new memory at the same address, the cache would
/// find the old registration for it, whose pages are no longer that memory. Call forget() for a
/// range before freeing it (Communicator::forget_memory), or use Memory::automatic or staged,
/// where only explicitly registered memory is cached (docs/collectives.md, "Memory").
#pragma once

#include "engine.hpp"

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// Registered user buffers of one communicator (see the top of this file). Not thread-safe.
class RegistrationCache {
public:
  /// The cache of `net`'s devices; at most `max_entries` ranges are kept.
  explicit RegistrationCache(const Network& net, std::size_t max_entries = 64) : net_(net), max_entries_(max_entries) {}

  /// Fills `out` with the registrations covering [data, data + bytes) on every device: an entry
  /// that covers the range, or (when `may_register`) a new registration of its pages that fits
  /// the budget. Returns false, leaving `out`'s registrations empty (the engine stages the
  /// buffer), when neither is possible; `why` then says why when it is not null. `pin` keeps a
  /// new or found entry from eviction until unpin() (a caller that looks up several buffers for one
  /// operation pins each until the operation ends: a later lookup may evict). Allocates only when it
  /// registers.
  bool find(const std::byte* data, std::size_t bytes, bool may_register, OpMemory::Buffer& out, bool pin = false,
            std::string* why = nullptr) {
    clear(out);
    if (bytes == 0) return false;
    const std::size_t page = page_size();
    const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes + page - 1) / page * page;
    for (auto& e : entries_) {
      if (e->begin <= begin && end <= e->end) {
        if (e->failed) {
          if (why != nullptr) *why = e->why;
          return false;
        }
        e->last_use = ++clock_;
        if (pin) ++e->pins;
        fill(*e, data, out);
        return true;
      }
    }
    if (!may_register) {
      if (why != nullptr) *why = "not registered (Memory::automatic registers only Communicator::register_memory's)";
      return false;
    }
    auto e = add(begin, end, pin);
    if (!e) {
      if (why != nullptr) *why = last_why_;
      return false;
    }
    fill(**e, data, out);
    return true;
  }

  /// Undoes one pin of the entry covering [data, data + bytes).
  void unpin(const std::byte* data, std::size_t bytes) noexcept {
    const std::size_t page = page_size();
    const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes + page - 1) / page * page;
    for (auto& e : entries_)
      if (e->begin <= begin && end <= e->end && e->pins > 0) {
        --e->pins;
        return;
      }
  }

  /// Deregisters every unpinned entry that overlaps [data, data + bytes) (before the caller frees
  /// that memory); returns how many entries went.
  std::size_t forget(const void* data, std::size_t bytes) {
    const auto b = reinterpret_cast<std::uintptr_t>(data), e = b + bytes;
    std::size_t n = 0;
    for (std::size_t k = entries_.size(); k-- > 0;)
      if (entries_[k]->begin < e && b < entries_[k]->end && entries_[k]->pins == 0) {
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(k));
        ++n;
      }
    return n;
  }

  /// Entries held (registered or remembered as failed).
  std::size_t size() const noexcept { return entries_.size(); }
  /// Registrations made since the cache was created (a steady state makes none).
  std::uint64_t registrations() const noexcept { return registrations_; }
  /// Memory regions the cache holds on device `port` (Network::ports order).
  std::size_t regions(std::size_t port) const noexcept {
    std::size_t n = 0;
    for (const auto& e : entries_)
      if (!e->failed && port < e->sets.size() && e->sets[port]) n += e->sets[port]->regions().size();
    return n;
  }

private:
  struct Entry {
    std::uintptr_t begin = 0, end = 0;
    std::vector<std::optional<MemoryRegionSet>> sets; // per port
    unsigned pins = 0;
    std::uint64_t last_use = 0;
    bool failed = false;
    std::string why;
  };

  static std::size_t page_size() noexcept { return AlignedBuffer::page_size(); }
  static void clear(OpMemory::Buffer& out) noexcept {
    for (std::size_t p = 0; p < OpMemory::max_ports; ++p) out.reg[p] = nullptr;
  }
  static void fill(const Entry& e, const std::byte* data, OpMemory::Buffer& out) noexcept {
    for (std::size_t p = 0; p < e.sets.size() && p < OpMemory::max_ports; ++p) {
      out.reg[p] = e.sets[p] ? &*e.sets[p] : nullptr;
      out.offset[p] = reinterpret_cast<std::uintptr_t>(data) - e.begin;
    }
  }
  // Regions a port may still register: max_mr less what is registered on its device, less one
  // kept free for anything else the process registers.
  std::size_t room(std::size_t port) const noexcept {
    const Port& p = *net_.ports()[port];
    if (p.device.max_mr <= 0) return SIZE_MAX;
    const long used = static_cast<long>(p.context->info()->memory_regions.load());
    const long left = static_cast<long>(p.device.max_mr) - used - 1;
    return left > 0 ? static_cast<std::size_t>(left) : 0;
  }
  // Evicts the least recently used unpinned entry; false when there is none.
  bool evict_one() {
    std::size_t victim = entries_.size();
    for (std::size_t k = 0; k < entries_.size(); ++k)
      if (entries_[k]->pins == 0 && (victim == entries_.size() || entries_[k]->last_use < entries_[victim]->last_use))
        victim = k;
    if (victim == entries_.size()) return false;
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(victim));
    return true;
  }
  std::optional<Entry*> add(std::uintptr_t begin, std::uintptr_t end, bool pin) {
    const auto ports = net_.ports();
    const std::size_t bytes = end - begin;
    while (entries_.size() >= max_entries_)
      if (!evict_one()) break;
    // Regions needed on each port; evict until they fit, or give up.
    for (std::size_t p = 0; p < ports.size(); ++p) {
      auto plan = RegionPlan::make(bytes, ports[p]->device.max_mr_size, net_.layout().slot_bytes);
      if (!plan) {
        last_why_ = std::string(plan.error().detail.view());
        return std::nullopt;
      }
      while (room(p) < plan->count)
        if (!evict_one()) {
          last_why_ = ports[p]->name + ": " + std::to_string(plan->count) + " memory regions needed, " +
                      std::to_string(room(p)) + " left of max_mr " + std::to_string(ports[p]->device.max_mr);
          return std::nullopt;
        }
    }
    auto e = std::make_unique<Entry>();
    e->begin = begin;
    e->end = end;
    e->last_use = ++clock_;
    e->pins = pin ? 1 : 0;
    const std::span<std::byte> memory(reinterpret_cast<std::byte*>(begin), bytes);
    for (std::size_t p = 0; p < ports.size(); ++p) {
      auto set = MemoryRegionSet::reg(*ports[p]->pd, memory, ports[p]->device.max_mr_size, net_.layout().slot_bytes);
      if (!set) { // remembered, so the next call stages without trying again
        auto bad = std::make_unique<Entry>();
        bad->begin = begin;
        bad->end = end;
        bad->failed = true;
        bad->why = ports[p]->name + ": " + set.error().message();
        last_why_ = bad->why;
        entries_.push_back(std::move(bad));
        return std::nullopt;
      }
      if (explain_enabled())
        explain(ports[p]->name + ": MR " + explain_memory(*set, "user memory (cached registration)", ports[p]->device.max_mr_size));
      e->sets.emplace_back(std::move(*set));
    }
    ++registrations_;
    entries_.push_back(std::move(e));
    return entries_.back().get();
  }

  const Network& net_;
  std::size_t max_entries_;
  std::vector<std::unique_ptr<Entry>> entries_; // stable addresses: OpMemory points into them
  std::uint64_t clock_ = 0, registrations_ = 0;
  std::string last_why_;
};

} // namespace collective
TBVERBS_NAMESPACE_END

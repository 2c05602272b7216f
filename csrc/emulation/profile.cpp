// The kernel profile's observer (scripts/kernel_profile): with FLS_EMULATION_PROFILE=FILE set, every launch
// appends one JSON line to FILE: the kernel, its grid, block and dynamic shared memory, and, in the checked
// build (observe::instrumented()), the memory requests its warps made, as a GPU's load/store units see them.
//
// A warp-level request is the k-th execution of one call site by the lanes of one warp between two of their
// switch points (barriers, warp operations: the access's epoch); a lane that executes the site fewer times is
// inactive for the later requests, as under SIMT divergence. Per request:
// - global memory: the distinct bytes its lanes ask for, and the distinct 32-byte sectors and 128-byte lines
//   it touches (what the L1 asks of L2 and DRAM with no reuse across requests);
// - shared memory: the wavefronts it needs, the most distinct 4-byte words any of the 32 banks must deliver
//   (lanes reading one word share it: a broadcast), against the fewest its distinct words need (one per 32):
//   their ratio is the request's n-way bank conflict (a 16-byte access by 32 lanes needs 4 wavefronts and is
//   conflict-free, as on a GPU).
// Per launch: those sums, the unique global bytes touched, and the same per call site (file:line).
// Local memory (the fiber's stack) is the host compiler's, not the GPU's (ptxas reports the GPU's spills), and
// is left out, as are the kernel arguments. gcc moves a 16-byte vector in 4- or 8-byte pieces: a thread's
// accesses of one size (4 or 8 bytes), back to back, contiguous and within one 16-byte block count as one
// access, as nvcc's vector instruction is. The price: a thread's scalar loads of 4 consecutive floats look
// vectorised too (2-byte elements, the fp16/bf16 fast paths', are never merged).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "observe.h"

namespace fls_emu {
namespace {

using observe::Access;
using observe::Space;

struct Totals {
  uint64_t requests = 0, requested = 0;
  uint64_t sectors = 0, lines = 0;             // global
  uint64_t wavefronts = 0, ideal_wavefronts = 0;  // shared
  double max_ways = 0;                            // shared: the worst request's
  void add(const Totals& o) {
    requests += o.requests;
    requested += o.requested;
    sectors += o.sectors;
    lines += o.lines;
    wavefronts += o.wavefronts;
    ideal_wavefronts += o.ideal_wavefronts;
    if (o.max_ways > max_ways) max_ways = o.max_ways;
  }
};

struct Request {
  Space space;
  bool write;
  const void* pc;
  std::vector<std::pair<uintptr_t, uint32_t>> parts;  // (address, bytes) of its lanes
};

struct RequestKey {
  uint32_t warp, epoch, k;
  const void* pc;
  bool operator<(const RequestKey& o) const {
    return std::tie(warp, epoch, pc, k) < std::tie(o.warp, o.epoch, o.pc, o.k);
  }
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

class Profile final : public observe::Observer {
 public:
  Profile() { observe::subscribe(this); }

  void launch_begin(const observe::LaunchInfo& info) override {
    const char* path = std::getenv("FLS_EMULATION_PROFILE");
    on_ = path != nullptr && *path != 0;
    if (!on_) return;
    path_ = path;
    kernel_ = *info.kernel;
    grid_ = info.grid;
    block_ = info.block;
    dynamic_ = info.dynamic_bytes;
    global_ = shared_ = Totals();
    sites_.clear();
    unique_.clear();
  }

  void block_begin(uint32_t, uint32_t threads) override {
    if (!on_) return;
    pending_.assign(threads, Access{});
    piece_.assign(threads, 0);
    has_pending_.assign(threads, false);
    seen_.clear();
    requests_.clear();
  }

  void access(const Access& a) override {
    if (!on_ || (a.space != Space::kGlobal && a.space != Space::kShared)) return;
    if (has_pending_[a.thread]) {
      Access& p = pending_[a.thread];
      // the next piece of one vector access that gcc split into 4- or 8-byte moves
      if (a.size >= 4 && a.size == piece_[a.thread] && a.addr == p.addr + p.size &&
          p.addr / 16 == (a.addr + a.size - 1) / 16 && p.kind == a.kind && p.space == a.space && p.epoch == a.epoch) {
        p.size += a.size;
        return;
      }
      record(p);
    }
    pending_[a.thread] = a;
    piece_[a.thread] = a.size;
    has_pending_[a.thread] = true;
  }

  void block_end() override {
    if (!on_) return;
    for (size_t t = 0; t < pending_.size(); ++t)
      if (has_pending_[t]) record(pending_[t]);
    uintptr_t lo, hi;
    observe::shared_arena(&lo, &hi);
    for (auto& [key, r] : requests_) {
      Totals t = measure(r, lo);
      (r.space == Space::kGlobal ? global_ : shared_).add(t);
      auto& site = sites_[{r.pc, r.write}];
      site.first = r.space;
      site.second.add(t);
    }
  }

  void launch_end(bool failed) override {
    if (!on_) return;
    on_ = false;
    uint64_t unique = 0;
    for (const auto& [sector, mask] : unique_) unique += __builtin_popcount(mask);
    std::string line = "{\"kernel\": " + json_string(kernel_) + ", \"grid\": [" + dims(grid_) + "], \"block\": [" +
                       dims(block_) + "], \"dynamic_smem\": " + std::to_string(dynamic_) +
                       ", \"failed\": " + (failed ? "true" : "false") +
                       ", \"observed\": " + (observe::instrumented() ? "true" : "false") +
                       ", \"global\": " + totals(global_) + ", \"shared\": " + totals(shared_) +
                       ", \"unique_bytes\": " + std::to_string(unique) + ", \"sites\": [";
    bool first = true;
    for (const auto& [key, s] : sites_) {
      line += std::string(first ? "" : ", ") + "{\"site\": " + json_string(observe::site(key.first)) +
              ", \"space\": \"" + observe::space_name(s.first) + "\", \"write\": " + (key.second ? "true" : "false") +
              ", \"totals\": " + totals(s.second) + "}";
      first = false;
    }
    line += "]}\n";
    if (FILE* f = std::fopen(path_.c_str(), "a")) {
      std::fputs(line.c_str(), f);
      std::fclose(f);
    }
  }

 private:
  void record(const Access& a) {
    // the k-th execution of this site by this thread since its last switch point
    auto& [epoch, count] = seen_[{a.thread, a.pc}];
    if (count == 0 || epoch != a.epoch) {
      epoch = a.epoch;
      count = 0;
    }
    const uint32_t k = count++;
    Request& r = requests_[RequestKey{a.warp, a.epoch, k, a.pc}];
    r.space = a.space;
    r.write = (a.kind & observe::kWrite) != 0;
    r.pc = a.pc;
    r.parts.emplace_back(a.addr, a.size);
    if (a.space == Space::kGlobal)
      for (uintptr_t b = a.addr; b < a.addr + a.size; ++b) unique_[b >> 5] |= 1u << (b & 31);
  }

  static Totals measure(const Request& r, uintptr_t shared_lo) {
    Totals t;
    t.requests = 1;
    std::vector<uintptr_t> units;
    // requested: the distinct bytes the lanes asked for (lanes reading one address ask for it once)
    std::vector<std::pair<uintptr_t, uint32_t>> parts = r.parts;
    std::sort(parts.begin(), parts.end());
    uintptr_t end = 0;
    for (const auto& [addr, size] : parts) {
      const uintptr_t from = std::max(addr, end);
      if (addr + size > from) t.requested += addr + size - from;
      end = std::max(end, addr + size);
    }
    if (r.space == Space::kGlobal) {
      for (int shift : {5, 7}) {
        units.clear();
        for (const auto& [addr, size] : r.parts)
          for (uintptr_t u = addr >> shift; u <= (addr + size - 1) >> shift; ++u) units.push_back(u);
        std::sort(units.begin(), units.end());
        const uint64_t n = std::unique(units.begin(), units.end()) - units.begin();
        (shift == 5 ? t.sectors : t.lines) = n;
      }
      return t;
    }
    for (const auto& [addr, size] : r.parts)
      for (uintptr_t w = (addr - shared_lo) >> 2; w <= (addr + size - 1 - shared_lo) >> 2; ++w) units.push_back(w);
    std::sort(units.begin(), units.end());
    units.erase(std::unique(units.begin(), units.end()), units.end());
    uint32_t per_bank[32] = {};
    uint32_t worst = 0;
    for (uintptr_t w : units) worst = std::max(worst, ++per_bank[w % 32]);
    t.wavefronts = worst;
    t.ideal_wavefronts = (units.size() + 31) / 32;
    t.max_ways = t.ideal_wavefronts ? double(worst) / double(t.ideal_wavefronts) : 0;
    return t;
  }

  static std::string dims(dim3 d) {
    return std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z);
  }

  static std::string totals(const Totals& t) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "{\"requests\": %llu, \"requested\": %llu, \"sectors\": %llu, \"lines\": %llu, \"wavefronts\": %llu, "
                  "\"ideal_wavefronts\": %llu, \"max_ways\": %.3g}",
                  (unsigned long long)t.requests, (unsigned long long)t.requested, (unsigned long long)t.sectors,
                  (unsigned long long)t.lines, (unsigned long long)t.wavefronts,
                  (unsigned long long)t.ideal_wavefronts, t.max_ways);
    return buf;
  }

  struct PairHash {
    size_t operator()(const std::pair<uint32_t, const void*>& p) const {
      return std::hash<const void*>()(p.second) * 31 + p.first;
    }
  };

  bool on_ = false;
  std::string path_, kernel_;
  dim3 grid_, block_;
  size_t dynamic_ = 0;
  Totals global_, shared_;
  std::map<std::pair<const void*, bool>, std::pair<Space, Totals>> sites_;  // (pc, write) -> totals
  std::unordered_map<uintptr_t, uint32_t> unique_;                         // global sector -> bytes touched
  std::vector<Access> pending_;
  std::vector<bool> has_pending_;
  std::vector<uint32_t> piece_;  // the size of the pieces the pending access was made of
  std::unordered_map<std::pair<uint32_t, const void*>, std::pair<uint32_t, uint32_t>, PairHash> seen_;
  std::map<RequestKey, Request> requests_;
};

Profile g_profile;

}  // namespace
}  // namespace fls_emu

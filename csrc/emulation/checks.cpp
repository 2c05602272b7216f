// compute-sanitizer's checks on the emulated device, as an observer of every access (observe.h): on in the
// checked build (the kernels instrumented), off in the others and with FLS_EMULATION_CHECKS=0. The first
// finding fails the launch (cudaErrorLaunchFailure; an out-of-bounds access cudaErrorIllegalAddress) with a
// message that names the check, the kernel, the block, both threads and both call sites.
//
// - racecheck (shared memory): within a barrier interval, a thread reading a byte another thread wrote (RAW),
//   writing a byte another thread wrote (WAW) or read (WAR) is a hazard unless the two accesses are ordered:
//   by a __syncthreads between them, or, for two lanes of one warp, by a __syncwarp both took part in.
//   Shuffles and votes order nothing (they exchange registers). The schedule does not matter: the check
//   compares who accessed a byte since the last ordering point, not what value was there.
// - global races within a launch: a block reading or writing a byte of global memory that another block of
//   the same launch wrote, or writing one another block read (atomics excepted).
// - initcheck (shared memory): a read of a byte that no thread of the block wrote since the block started
//   (a shadow bit per byte: the poison value is not what is checked).
// - bounds (shared memory): an access outside every array of the block, e.g. one element past a static array
//   (its bytes are exact, the arena's redzones belong to no array).
// synccheck (barriers and warp operations met from different call sites) is the scheduler's own.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "observe.h"

namespace fls_emu {
namespace {

using observe::Access;
using observe::Space;

constexpr uint16_t kNobody = 0xffff;

// Who accessed a byte: the thread, its call site and the block's ordering event at the time.
struct Rec {
  const void* pc = nullptr;
  uint32_t event = 0;
  uint16_t thread = kNobody;
};

struct SharedByte {
  uint32_t block_gen = 0;  // the entry is valid for the block that has this generation
  bool written = false;
  Rec write, read[2];  // the last write; up to two reads since it that are unordered among themselves
};

struct GlobalByte {
  uint32_t launch_gen = 0;  // the entry is valid for the launch that has this generation
  uint32_t write_block = 0, read_block = 0;  // block + 1; 0: none in this launch
  Rec write, read;
};

constexpr uintptr_t kPage = 4096;
struct GlobalPage {
  GlobalByte bytes[kPage];
};

const char* kind_name(uint8_t kind) { return kind & observe::kWrite ? "writes" : "reads"; }

class Checks final : public observe::Observer {
 public:
  Checks() {
    const char* env = std::getenv("FLS_EMULATION_CHECKS");
    enabled_ = !(env && std::string(env) == "0");
    if (enabled_) observe::subscribe(this);
  }

  bool enabled() const { return enabled_; }

  void launch_begin(const observe::LaunchInfo& info) override {
    on_ = observe::instrumented();
    ++launch_gen_;
    grid_ = info.grid;
    if (!on_) return;
    uintptr_t lo, hi;
    observe::shared_arena(&lo, &hi);
    arena_lo_ = lo;
    if (shared_.size() < hi - lo) shared_.resize(hi - lo);
    common_.resize(size_t(info.block.x) * info.block.y * info.block.z * 32);
  }

  void block_begin(uint32_t block, uint32_t) override {
    block_ = block;
    ++block_gen_;
    last_barrier_ = ++event_;
  }

  void sync(const observe::Sync& s) override {
    if (!on_) return;
    if (s.barrier) {
      last_barrier_ = ++event_;
      return;
    }
    if (s.warp_op != 0) return;  // a shuffle or vote: registers, not memory
    const uint32_t e = ++event_;
    for (int i = 0; i < 32; ++i)
      if (s.mask >> i & 1)
        for (int j = 0; j < 32; ++j)
          if (s.mask >> j & 1) common_[(s.warp * 32 + i) * 32 + j] = e;
  }

  // The pages go back to the pool: the next launch's generation makes their entries empty, without zeroing.
  void launch_end(bool) override {
    for (auto& [key, page] : pages_) pool_.push_back(std::move(page));
    pages_.clear();
    last_page_ = nullptr;
  }

  void access(const Access& a) override {
    if (!on_) return;
    if (a.space == Space::kShared) shared(a);
    else if (a.space == Space::kGlobal && !(a.kind & observe::kAtomic)) global(a);
  }

 private:
  // Whether `r` (an earlier access of this block) happens before thread `t`'s access now.
  bool ordered(const Rec& r, uint32_t t) const {
    if (r.thread == kNobody || r.thread == t || last_barrier_ > r.event) return true;
    return r.thread / 32 == t / 32 && common_[t * 32 + r.thread % 32] > r.event;
  }

  std::string shared_place(uintptr_t addr) const {
    const observe::SharedArray* s = observe::shared_array(addr);
    std::ostringstream o;
    o << "shared array '" << s->name << "' byte " << addr - s->begin;
    return o.str();
  }

  [[noreturn]] void report(cudaError_t code, const std::string& what) {
    observe::fail_launch(code, what + " (" + observe::where_block() + ")");
    std::abort();  // fail_launch does not return on a kernel's thread, where every access is seen
  }

  std::string who(uint32_t thread, const void* pc) const {
    return "thread " + observe::thread_coords(thread) + " at " + observe::site(pc);
  }

  void shared(const Access& a) {
    const observe::SharedArray* arr = observe::shared_array(a.addr);
    if (!arr || a.addr + a.size > arr->end) {
      const observe::SharedArray* past = nullptr;
      if (!arr) observe::shared_array(a.addr, &past);
      else past = arr;
      std::ostringstream o;
      o << "bounds: " << who(a.thread, a.pc) << " " << kind_name(a.kind) << " " << a.size << " bytes at ";
      if (past) o << "byte " << a.addr - past->begin << " of shared array '" << past->name << "' ("
                  << past->end - past->begin << " bytes): out of bounds";
      else o << "shared memory outside every array";
      report(cudaErrorIllegalAddress, o.str());
    }
    const auto t = static_cast<uint16_t>(a.thread);
    const Rec now{a.pc, event_, t};
    for (uint32_t k = 0; k < a.size; ++k) {
      SharedByte& b = shared_[a.addr + k - arena_lo_];
      if (b.block_gen != block_gen_) b = SharedByte{block_gen_};
      if (a.kind & observe::kAtomic) {
        b.written = true;
        continue;
      }
      if (a.kind & observe::kWrite) {
        if (!ordered(b.write, t)) hazard("write-after-write", b.write, a, k);
        for (const Rec& r : b.read)
          if (!ordered(r, t)) hazard("write-after-read", r, a, k);
        b.write = now;
        b.read[0] = b.read[1] = Rec{};
        b.written = true;
      } else {
        if (!b.written)
          report(cudaErrorLaunchFailure, "initcheck: " + who(a.thread, a.pc) + " reads " + shared_place(a.addr + k) +
                                             ", which no thread of the block wrote");
        if (!ordered(b.write, t)) hazard("read-after-write", b.write, a, k);
        Rec* slot = ordered(b.read[0], t) ? &b.read[0] : ordered(b.read[1], t) ? &b.read[1] : nullptr;
        if (slot) *slot = now;
      }
    }
  }

  [[noreturn]] void hazard(const char* kind, const Rec& before, const Access& a, uint32_t k) {
    report(cudaErrorLaunchFailure, std::string("racecheck: shared memory ") + kind + " hazard on " +
                                       shared_place(a.addr + k) + ": " + who(before.thread, before.pc) + ", then " +
                                       who(a.thread, a.pc) + ", with no barrier (or __syncwarp) between");
  }

  std::string block_coords(uint32_t b) const {
    std::ostringstream o;
    o << "[" << b % grid_.x << "," << (b / grid_.x) % grid_.y << "," << b / (grid_.x * grid_.y) << "]";
    return o.str();
  }

  GlobalPage& page(uintptr_t p) {
    if (p == last_key_ && last_page_) return *last_page_;
    auto& slot = pages_[p];
    if (!slot) {
      if (pool_.empty()) {
        slot = std::make_unique<GlobalPage>();
      } else {
        slot = std::move(pool_.back());
        pool_.pop_back();
      }
    }
    last_key_ = p;
    last_page_ = slot.get();
    return *slot;
  }

  void global(const Access& a) {
    const uint32_t me = block_ + 1;
    const auto t = static_cast<uint16_t>(a.thread);
    for (uint32_t k = 0; k < a.size; ++k) {
      const uintptr_t addr = a.addr + k;
      GlobalByte& g = page(addr / kPage).bytes[addr % kPage];
      if (g.launch_gen != launch_gen_) g = GlobalByte{launch_gen_};
      const bool write = a.kind & observe::kWrite;
      if (g.write_block && g.write_block != me)
        global_race(write ? "write-after-write" : "read-after-write", g.write_block, g.write, a, addr);
      if (write && g.read_block && g.read_block != me)
        global_race("write-after-read", g.read_block, g.read, a, addr);
      if (write) {
        g.write_block = me;
        g.write = Rec{a.pc, 0, t};
      } else if (!g.read_block) {
        g.read_block = me;
        g.read = Rec{a.pc, 0, t};
      }
    }
  }

  [[noreturn]] void global_race(const char* kind, uint32_t other, const Rec& before, const Access& a,
                                uintptr_t addr) {
    std::ostringstream o;
    o << "global race: " << kind << " between blocks of one launch on global address 0x" << std::hex << addr
      << std::dec << ": block " << block_coords(other - 1) << " " << who(before.thread, before.pc) << ", block "
      << block_coords(block_) << " " << who(a.thread, a.pc);
    report(cudaErrorLaunchFailure, o.str());
  }

  bool enabled_ = false, on_ = false;
  dim3 grid_;
  uint32_t block_ = 0, block_gen_ = 0, launch_gen_ = 0, event_ = 0, last_barrier_ = 0;
  uintptr_t arena_lo_ = 0;
  std::vector<SharedByte> shared_;
  std::vector<uint32_t> common_;  // [thread * 32 + lane]: the last __syncwarp event the two lanes took part in
  std::unordered_map<uintptr_t, std::unique_ptr<GlobalPage>> pages_;  // the launch's, by address / kPage
  std::vector<std::unique_ptr<GlobalPage>> pool_;
  uintptr_t last_key_ = 0;
  GlobalPage* last_page_ = nullptr;
};

Checks g_checks;

}  // namespace
}  // namespace fls_emu

// For the emulator's tests: whether the loaded library runs the checks.
extern "C" int fls_emu_checks_on() { return fls_emu::observe::instrumented() && fls_emu::g_checks.enabled(); }

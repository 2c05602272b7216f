// The observation layer (observe.h): the ThreadSanitizer instrumentation ABI answered without the TSan runtime,
// each access classified and handed to the observers. Compiled without instrumentation (it is the emulator).
#include "observe.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "cuda_emulation.h"

namespace fls_emu {
namespace observe {

Running running;

namespace {

// Constant-initialised (an observer may subscribe from another file's static initializer), and read on every
// access without a guard.
constexpr int kMaxObservers = 8;
Observer* g_list[kMaxObservers] = {};
int g_count = 0;
struct List {
  Observer** begin() const { return g_list; }
  Observer** end() const { return g_list + g_count; }
};
List observers() { return {}; }
bool g_instrumented = false;
const std::vector<SharedArray>* g_arrays = nullptr;
uintptr_t g_shared_lo = 0, g_shared_hi = 0;  // the launch's arena

bool is_coordinate(uintptr_t a) {
  auto in = [a](const void* v, size_t n) { return a - reinterpret_cast<uintptr_t>(v) < n; };
  return in(&thread_idx, sizeof thread_idx) || in(&block_idx, sizeof block_idx) ||
         in(&block_dim, sizeof block_dim) || in(&grid_dim, sizeof grid_dim);
}

Space classify(uintptr_t a) {
  if (a - running.stack_lo < running.stack_hi - running.stack_lo) return Space::kLocal;
  if (a - g_shared_lo < g_shared_hi - g_shared_lo) return Space::kShared;
  if (a - running.param_lo < running.param_hi - running.param_lo || is_coordinate(a)) return Space::kParam;
  return Space::kGlobal;
}

inline void seen(const void* addr, uint32_t size, uint8_t kind, const void* pc) {
  if (!running.on || g_count == 0) return;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const Access acc{running.launch, running.block, running.thread, running.thread / 32, running.epoch, pc, a, size,
                   kind, classify(a)};
  for (Observer* o : observers()) o->access(acc);
}

}  // namespace

const char* space_name(Space s) {
  switch (s) {
    case Space::kGlobal: return "global";
    case Space::kShared: return "shared";
    case Space::kLocal: return "local";
    case Space::kParam: return "param";
  }
  return "?";
}

void subscribe(Observer* o) {
  if (std::find(g_list, g_list + g_count, o) != g_list + g_count) return;
  if (g_count == kMaxObservers) throw std::length_error("fls_emu::observe: more than 8 observers");
  g_list[g_count++] = o;
}
void unsubscribe(Observer* o) { g_count = static_cast<int>(std::remove(g_list, g_list + g_count, o) - g_list); }
bool instrumented() { return g_instrumented; }

const SharedArray* shared_array(uintptr_t addr, const SharedArray** nearest) {
  if (nearest) *nearest = nullptr;
  if (!g_arrays) return nullptr;
  for (const SharedArray& s : *g_arrays) {
    if (addr >= s.begin && addr < s.end) return &s;
    if (nearest && s.end <= addr && (!*nearest || s.end > (*nearest)->end)) *nearest = &s;
  }
  return nullptr;
}

std::string site(const void* pc) {
  static std::mutex m;
  static std::unordered_map<const void*, std::string> cache;
  std::lock_guard<std::mutex> lock(m);
  auto it = cache.find(pc);
  if (it != cache.end()) return it->second;
  std::string out;
  Dl_info info{};
  if (dladdr(pc, &info) && info.dli_fname) {
    // The call's own line: the return address minus one lies in the call instruction.
    const auto offset = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase) - 1;
    char cmd[1024];
    std::snprintf(cmd, sizeof cmd, "addr2line -i -e '%s' 0x%zx 2>/dev/null", info.dli_fname, size_t(offset));
    if (FILE* p = popen(cmd, "r")) {
      char line[1024];
      while (std::fgets(line, sizeof line, p)) {
        std::string s(line);
        while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
        const auto disc = s.find(" (discriminator");
        if (disc != std::string::npos) s.erase(disc);
        // Paths as the compiler saw them ("../../csrc/cuda/x.cuh"): from csrc/ or tests/ on.
        for (const char* root : {"csrc/", "tests/"}) {
          const auto r = s.find(root);
          if (r != std::string::npos) {
            s.erase(0, r);
            break;
          }
        }
        // The launch wrapper that inlines every kernel is no part of the kernel's story.
        if (s.rfind("csrc/cuda/launch.cuh", 0) == 0) continue;
        out += out.empty() ? s : " in " + s;
      }
      pclose(p);
    }
  }
  if (out.empty() || out.rfind("??", 0) == 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "pc %p (no line table)", pc);
    out = buf;
  }
  return cache.emplace(pc, out).first->second;
}

void begin_launch(const LaunchInfo& info) {
  for (Observer* o : observers()) o->launch_begin(info);
}
void end_launch(bool failed) {
  running.on = false;
  g_arrays = nullptr;
  g_shared_lo = g_shared_hi = 0;
  for (Observer* o : observers()) o->launch_end(failed);
}
void begin_block(uint32_t block, uint32_t threads) {
  running.block = block;
  for (Observer* o : observers()) o->block_begin(block, threads);
}
void end_block() {
  for (Observer* o : observers()) o->block_end();
}
void set_shared(const std::vector<SharedArray>* arrays, uintptr_t lo, uintptr_t hi) {
  g_arrays = arrays;
  g_shared_lo = lo;
  g_shared_hi = hi;
}
void shared_arena(uintptr_t* lo, uintptr_t* hi) {
  *lo = g_shared_lo;
  *hi = g_shared_hi;
}
void synced(const Sync& s) {
  for (Observer* o : observers()) o->sync(s);
}

}  // namespace observe
}  // namespace fls_emu

// ---- the ThreadSanitizer instrumentation ABI (what gcc -fsanitize=thread calls), without its runtime
using fls_emu::observe::kAtomic;
using fls_emu::observe::kRead;
using fls_emu::observe::kWrite;
#define FLS_SEEN(addr, size, kind) fls_emu::observe::seen((addr), (size), (kind), __builtin_return_address(0))

extern "C" {

// Called by every instrumented object's constructor: the library is the checked build.
void __tsan_init() { fls_emu::observe::g_instrumented = true; }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}

#define FLS_TSAN_ACCESS(n)                                                      \
  void __tsan_read##n(void* a) { FLS_SEEN(a, n, kRead); }                       \
  void __tsan_write##n(void* a) { FLS_SEEN(a, n, kWrite); }                     \
  void __tsan_unaligned_read##n(void* a) { FLS_SEEN(a, n, kRead); }             \
  void __tsan_unaligned_write##n(void* a) { FLS_SEEN(a, n, kWrite); }           \
  void __tsan_volatile_read##n(void* a) { FLS_SEEN(a, n, kRead); }              \
  void __tsan_volatile_write##n(void* a) { FLS_SEEN(a, n, kWrite); }            \
  void __tsan_unaligned_volatile_read##n(void* a) { FLS_SEEN(a, n, kRead); }    \
  void __tsan_unaligned_volatile_write##n(void* a) { FLS_SEEN(a, n, kWrite); }
FLS_TSAN_ACCESS(1)
FLS_TSAN_ACCESS(2)
FLS_TSAN_ACCESS(4)
FLS_TSAN_ACCESS(8)
FLS_TSAN_ACCESS(16)
#undef FLS_TSAN_ACCESS
void __tsan_read_range(void* a, size_t n) { FLS_SEEN(a, static_cast<uint32_t>(n), kRead); }
void __tsan_write_range(void* a, size_t n) { FLS_SEEN(a, static_cast<uint32_t>(n), kWrite); }

// The __atomic builtins (atomicAdd and friends in cuda_emulation.h): done here, observed as atomic. The threads
// of a launch never run at once, so plain sequentially consistent builtins do.
#define FLS_TSAN_ATOMIC(bits, T)                                                                  \
  T __tsan_atomic##bits##_load(const volatile T* a, int) {                                       \
    FLS_SEEN(const_cast<T*>(a), sizeof(T), kRead | kAtomic);                                     \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                  \
  }                                                                                               \
  void __tsan_atomic##bits##_store(volatile T* a, T v, int) {                                    \
    FLS_SEEN(const_cast<T*>(a), sizeof(T), kWrite | kAtomic);                                    \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                     \
  }                                                                                               \
  T __tsan_atomic##bits##_exchange(volatile T* a, T v, int) {                                    \
    FLS_SEEN(const_cast<T*>(a), sizeof(T), kRead | kWrite | kAtomic);                            \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                               \
  T __tsan_atomic##bits##_fetch_add(volatile T* a, T v, int) {                                   \
    FLS_SEEN(const_cast<T*>(a), sizeof(T), kRead | kWrite | kAtomic);                            \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                               \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {        \
    FLS_SEEN(const_cast<T*>(a), sizeof(T), kRead | kWrite | kAtomic);                            \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
  }                                                                                               \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {          \
    FLS_SEEN(const_cast<T*>(a), sizeof(T), kRead | kWrite | kAtomic);                            \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
  }
FLS_TSAN_ATOMIC(8, uint8_t)
FLS_TSAN_ATOMIC(16, uint16_t)
FLS_TSAN_ATOMIC(32, uint32_t)
FLS_TSAN_ATOMIC(64, uint64_t)
#undef FLS_TSAN_ATOMIC
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) {}

}  // extern "C"

// The emulator's runtime: runs a kernel's grid block by block on the calling OS thread, each CUDA thread of
// the block on its own fiber (a stack each, reused across blocks and launches; switched by the few lines of
// x86-64 assembly below, which save what the System V ABI has a callee keep: glibc's swapcontext would add
// two system calls per switch, and a block switches at every barrier and warp operation).
//
// A block runs warp by warp. A thread runs until it parks (at __syncthreads or a warp operation) or exits; the
// threads never interleave otherwise. When the lanes of a warp are all parked, its warp operations whose
// lanes are all there complete (the values cross between lanes) and those lanes run on, until the whole
// warp waits at the barrier; then the next warp runs. When every warp waits, a barrier that every thread of
// the block reached opens. So a missing barrier shows as a stale, poisoned or overwritten read, never as a
// lucky interleaving. Anything else is a bug of the kernel and fails the launch with an error that names the
// kernel, the block and the threads: a barrier some thread never reaches (or exited instead), a shuffle
// whose mask leaves out the caller or names a lane that is missing or gone, lanes of one mask at different
// operations, and (synccheck) threads released by one barrier or lanes of one warp operation that wait at
// different call sites. Each thread's accesses are seen by observe.h's observers in the checked build; the
// scheduler tells them what runs (block, thread, its fiber stack, its count of switch points), the shared
// arrays (one arena per launch, each array between redzones) and the barriers and warp operations.
//
// FLS_EMULATION_SCHEDULE=random runs the warps between two barriers, the lanes of a warp and the blocks of
// the grid in a seeded random order instead of index order: a kernel whose result depends on that order has
// a race. Each launch draws its own order, from the seed (FLS_EMULATION_SEED, default 0), the kernel's name
// and how many times that kernel launched before, so the launches of one kernel do not replay one order.
// Launches are serialised (one at a time in the process), and counted per kernel (fls_emu_launch_counts).
//
// Memory no kernel wrote yet is poison: the shared memory of a block when it starts, and (through
// fls::cuda::emulation_poison_byte, csrc/poisoned_allocator.cpp) every tensor the op layer allocates on
// the emulated device. FLS_EMULATION_POISON=nan (the default) repeats the byte 0xff, a NaN in every float
// type; =finite repeats 0x7b, a huge finite number in every float type (1.3e36 in fp32 and bf16, 60768 in
// fp16), which fmaxf or a comparison does not absorb as they absorb a NaN.
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_emulation.h"
#include "observe.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace fls_emu {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;

namespace {

constexpr unsigned kMaxThreads = 1024;  // per block, sm_80 / sm_90
constexpr unsigned kMaxBlockZ = 64;
constexpr unsigned kMaxGridYZ = 65535;
constexpr unsigned kMaxGridX = 2147483647u;
// Shared memory per block, static and dynamic together, without cudaFuncSetAttribute's opt-in (none of ours
// opts in); over it the launch fails with cudaErrorInvalidValue, as CUDA's does.
constexpr size_t kMaxShared = 48 * 1024;
// The block's shared arrays lie in one arena, each between redzones that belong to no array, so that an access
// past an array's end is out of bounds exactly (observe.h's checks, AddressSanitizer's poison).
constexpr size_t kRedzone = 32;
constexpr size_t kMaxSharedArrays = 256;
constexpr size_t kArena = 2 * kMaxShared + (kMaxSharedArrays + 2) * (kRedzone + 16);
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStack = 512 * 1024;  // instrumented frames are larger
#else
constexpr size_t kStack = 256 * 1024;
#endif

enum class State { kRunnable, kBarrier, kWarpOp, kExited };

// fls_emu_switch(save, load): saves the callee-saved registers, the SSE and x87 control words and the stack
// pointer of the running fiber into *save, and resumes the fiber whose stack pointer is `load`.
extern "C" void fls_emu_switch(void** save, void* load);
asm(R"(
  .text
  .p2align 4
  .type fls_emu_switch, @function
fls_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size fls_emu_switch, .-fls_emu_switch
)");

struct Thread {
  void* sp = nullptr;  // the saved stack pointer while parked
  void* asan_fake_stack = nullptr;  // AddressSanitizer's bookkeeping of the fiber's stack while it is parked
  char* stack = nullptr;
  uint3 idx;
  State state = State::kRunnable;
  WarpOp op;
  unsigned mask;
  uint64_t bits, result;
  int arg, width;
  const char* file = nullptr;  // the call site of the barrier or warp operation it waits at
  int line = 0;
  uint32_t epoch = 0;  // switch points passed since the block started (observe.h)
};

// A failure of the launch: the status CUDA would return and what the emulator saw.
struct Failure {
  cudaError_t code;
  std::string detail;
};

struct Launch {
  std::string kernel;
  void (*body)(void*);
  void* ctx;
  size_t dynamic_bytes;
  std::vector<Thread> threads;
  void* scheduler_sp = nullptr;
  const void* scheduler_stack = nullptr;  // the scheduler's stack, for AddressSanitizer's fiber switches
  size_t scheduler_stack_size = 0;
  int current = -1;  // index of the running thread
  bool failed = false;
  Failure failure;
  uint64_t id = 0;  // the process's launch counter
  // Shared memory of the block that runs now: the arena, the arrays in it (the dynamic bytes first, then the
  // static arrays in the order the kernel declares them) and which array a declaration's site has.
  std::vector<unsigned char> arena;
  size_t arena_used = 0;
  std::vector<observe::SharedArray> arrays;
  std::unordered_map<const void*, size_t> static_shared;
  size_t static_bytes = 0;
  size_t dynamic_bytes_requested = 0;
};

std::mutex g_launch_mutex;
Launch* g_launch = nullptr;
thread_local cudaError_t g_last_error = cudaSuccess;
thread_local std::string g_last_detail;

std::string coords(uint3 v) {
  std::ostringstream s;
  s << "[" << v.x << "," << v.y << "," << v.z << "]";
  return s.str();
}

std::string where(const Launch& l, int t) {
  return "kernel " + l.kernel + ", block " + coords(block_idx) + ", thread " + coords(l.threads[t].idx);
}

// Called on the failing thread's fiber or by the scheduler: records the first failure of the launch.
void fail(Launch& l, cudaError_t code, const std::string& detail) {
  if (!l.failed) {
    l.failed = true;
    l.failure = {code, detail};
  }
}

// Leaves the running thread's fiber for the scheduler.
// AddressSanitizer follows the switches between stacks through these (its fiber protocol); no-ops otherwise.
void entered_fiber(Launch& l, Thread& t) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(t.asan_fake_stack, &l.scheduler_stack, &l.scheduler_stack_size);
#else
  (void)l, (void)t;
#endif
}
void leaving_fiber(Launch& l, Thread& t, bool exiting) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(exiting ? nullptr : &t.asan_fake_stack, l.scheduler_stack, l.scheduler_stack_size);
#else
  (void)l, (void)t, (void)exiting;
#endif
}

void park(State s) {
  Launch& l = *g_launch;
  Thread& t = l.threads[l.current];
  t.state = s;
  leaving_fiber(l, t, s == State::kExited);
  fls_emu_switch(&t.sp, l.scheduler_sp);
  entered_fiber(l, t);
  ++t.epoch;
  observe::running.epoch = t.epoch;
}

bool same_site(const Thread& a, const Thread& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}
std::string site_of(const Thread& t) { return std::string(t.file) + ":" + std::to_string(t.line); }

// Where a fiber starts (fls_emu_switch's `ret` lands here): runs the kernel for its thread, then parks as
// exited; the scheduler never resumes an exited fiber.
[[noreturn]] void thread_main() {
  Launch& l = *g_launch;
  entered_fiber(l, l.threads[l.current]);
  l.body(l.ctx);
  park(State::kExited);
  __builtin_unreachable();
}

// A fresh fiber on `stack` whose first switch enters thread_main: the frame fls_emu_switch pops (control
// words, six registers), then thread_main as the return address, with the stack aligned as after a call.
void* fresh_fiber(char* stack) {
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + kStack) & ~uintptr_t(15));
  uint64_t* sp = top - 1;  // the slot of thread_main's own (never used) return address
  *--sp = reinterpret_cast<uint64_t>(&thread_main);
  for (int r = 0; r < 6; ++r) *--sp = 0;
  uint32_t mxcsr;
  uint16_t fpcw;
  asm volatile("stmxcsr %0; fnstcw %1" : "=m"(mxcsr), "=m"(fpcw));
  *--sp = uint64_t(mxcsr) | uint64_t(fpcw) << 32;
  return sp;
}

std::string kernel_name(const char* pretty) {
  // "... [with auto Kernel = fls::cuda::{anonymous}::ln_fwd_kernel<float>; Args = {...}]" -> the kernel.
  std::string s(pretty);
  const auto a = s.find("Kernel = ");
  if (a == std::string::npos) return s;
  auto b = s.find("; Args", a);
  if (b == std::string::npos) b = s.find(']', a);
  return s.substr(a + 9, b - a - 9);
}

unsigned char env_poison_byte() {
  const char* s = std::getenv("FLS_EMULATION_POISON");
  if (s == nullptr || std::string(s).empty() || std::string(s) == "nan") return 0xff;
  if (std::string(s) == "finite") return 0x7b;
  throw std::runtime_error("FLS_EMULATION_POISON must be 'nan' or 'finite', got '" + std::string(s) + "'");
}

unsigned char poison_byte() {
  static const unsigned char poison = env_poison_byte();
  return poison;
}

// Launches per kernel name (under g_launch_mutex): for the tests that a run reached the emulated kernels, and
// the launch's own random order.
std::unordered_map<std::string, uint64_t>& launch_counts() {
  static std::unordered_map<std::string, uint64_t> counts;
  return counts;
}

size_t env_seed() {
  const char* s = std::getenv("FLS_EMULATION_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 0;
}

bool random_schedule() {
  const char* s = std::getenv("FLS_EMULATION_SCHEDULE");
  if (s == nullptr || std::string(s).empty() || std::string(s) == "ordered") return false;
  if (std::string(s) == "random") return true;
  throw std::runtime_error("FLS_EMULATION_SCHEDULE must be 'ordered' or 'random', got '" + std::string(s) + "'");
}

char* new_stack() {
  // A guard page below each stack: a kernel that overflows its fiber stack faults instead of corrupting.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  mprotect(p, page, PROT_NONE);
  return static_cast<char*>(p) + page;
}

std::vector<char*>& stack_pool() {
  static std::vector<char*> pool;  // used under g_launch_mutex only
  return pool;
}

// Completes the warp operations of the warp whose lane 0 is thread w0 that can complete; returns whether any
// did. Fails the launch on a misuse.
bool resolve_warp_ops(Launch& l, int w0) {
  const int n = static_cast<int>(l.threads.size());
  bool moved = false;
  {
    const int lanes = std::min(32, n - w0);
    // __activemask: the lanes of the warp that are there together.
    unsigned active = 0;
    for (int i = 0; i < lanes; ++i) {
      const Thread& t = l.threads[w0 + i];
      if (t.state == State::kWarpOp && t.op == WarpOp::kActiveMask) active |= 1u << i;
    }
    if (active) {
      for (int i = 0; i < lanes; ++i)
        if (active >> i & 1) {
          l.threads[w0 + i].result = active;
          l.threads[w0 + i].state = State::kRunnable;
        }
      return true;
    }
    for (int i = 0; i < lanes; ++i) {
      const Thread& t = l.threads[w0 + i];
      if (t.state != State::kWarpOp) continue;
      auto op = [&] { return where(l, w0 + i); };  // for the messages only (built on failure)
      if (!(t.mask >> i & 1)) {
        fail(l, cudaErrorIllegalInstruction,
             "a warp operation whose mask 0x" + (std::ostringstream() << std::hex << t.mask).str() +
                 " leaves out the calling lane " + std::to_string(i) + " (" + op() + ")");
        return false;
      }
      bool ready = true;
      for (int j = 0; j < 32 && ready; ++j) {
        if (!(t.mask >> j & 1)) continue;
        if (j >= lanes) {
          fail(l, cudaErrorIllegalInstruction,
               "a warp operation's mask names lane " + std::to_string(j) + ", which this block does not have (" +
                   op() + ")");
          return false;
        }
        const Thread& u = l.threads[w0 + j];
        if (u.state == State::kExited) {
          fail(l, cudaErrorIllegalInstruction,
               "a warp operation's mask names lane " + std::to_string(j) + ", which has exited (" + op() + ")");
          return false;
        }
        if (u.state != State::kWarpOp) ready = false;
        else if (u.op != t.op || u.mask != t.mask || u.width != t.width) {
          fail(l, cudaErrorIllegalInstruction,
               "lanes " + std::to_string(i) + " and " + std::to_string(j) +
                   " of one warp wait at different warp operations or masks (" + op() + ")");
          return false;
        } else if (!same_site(u, t)) {
          fail(l, cudaErrorIllegalInstruction,
               "synccheck: lanes " + std::to_string(i) + " and " + std::to_string(j) +
                   " of one warp meet at a warp operation from different call sites, " + site_of(t) + " and " +
                   site_of(u) + " (divergent warp operation; " + op() + ")");
          return false;
        }
      }
      if (!ready) continue;
      // Every lane of the mask is here: exchange.
      const unsigned mask = t.mask;
      const WarpOp kind = t.op;
      unsigned ballot = 0;
      for (int j = 0; j < 32; ++j)
        if ((mask >> j & 1) && l.threads[w0 + j].bits) ballot |= 1u << j;
      for (int j = 0; j < 32; ++j) {
        if (!(mask >> j & 1)) continue;
        Thread& u = l.threads[w0 + j];
        const int width = u.width;
        if (width <= 0 || width > 32 || (width & (width - 1))) {
          fail(l, cudaErrorIllegalInstruction, "a shuffle width of " + std::to_string(width) +
                                                   " (a power of 2 up to 32) (" + where(l, w0 + j) + ")");
          return false;
        }
        const int base = j & ~(width - 1);
        int src = j;
        switch (kind) {
          case WarpOp::kShflIdx: src = base + (u.arg & (width - 1)); break;
          case WarpOp::kShflXor: src = j ^ u.arg; if (src >= base + width || src < base) src = j; break;
          case WarpOp::kShflDown: src = (j - base) + u.arg < width ? j + u.arg : j; break;
          case WarpOp::kShflUp: src = (j - base) >= u.arg ? j - u.arg : j; break;
          default: break;
        }
        switch (kind) {
          case WarpOp::kSync: u.result = 0; break;
          case WarpOp::kBallot: u.result = ballot; break;
          case WarpOp::kAll: u.result = ballot == mask; break;
          case WarpOp::kAny: u.result = ballot != 0; break;
          default:
            if (src < 0 || src >= 32 || !(mask >> src & 1)) {
              fail(l, cudaErrorIllegalInstruction,
                   "a shuffle reads lane " + std::to_string(src) + ", which is not in its mask (" +
                       where(l, w0 + j) + ")");
              return false;
            }
            u.result = l.threads[w0 + src].bits;
        }
      }
      for (int j = 0; j < 32; ++j)
        if (mask >> j & 1) l.threads[w0 + j].state = State::kRunnable;
      observe::synced({false, static_cast<uint32_t>(w0 / 32), mask, static_cast<int>(kind)});
      moved = true;
    }
  }
  return moved;
}

// What a block is stuck on, for the error when nothing can move.
std::string stuck(Launch& l) {
  int barrier = -1, warp = -1, exited = -1;
  for (int t = 0; t < static_cast<int>(l.threads.size()); ++t) {
    const State s = l.threads[t].state;
    if (s == State::kBarrier && barrier < 0) barrier = t;
    if (s == State::kWarpOp && warp < 0) warp = t;
    if (s == State::kExited && exited < 0) exited = t;
  }
  if (barrier >= 0 && exited >= 0)
    return "thread " + coords(l.threads[exited].idx) + " exited while thread " + coords(l.threads[barrier].idx) +
           " waits at __syncthreads: a barrier not every thread of the block reaches (kernel " + l.kernel +
           ", block " + coords(block_idx) + ")";
  if (barrier >= 0 && warp >= 0)
    return "thread " + coords(l.threads[warp].idx) + " waits at a warp operation that can never complete while " +
           "thread " + coords(l.threads[barrier].idx) + " waits at __syncthreads (kernel " + l.kernel + ", block " +
           coords(block_idx) + ")";
  return "thread " + coords(l.threads[warp].idx) + " waits at a warp operation that can never complete (kernel " +
         l.kernel + ", block " + coords(block_idx) + ")";
}

// Runs one block to its end or to the launch's failure.
void run_block(Launch& l, std::mt19937_64* rng) {
  const int n = static_cast<int>(l.threads.size());
  const unsigned char poison = poison_byte();
  for (const observe::SharedArray& a : l.arrays)
    std::memset(reinterpret_cast<void*>(a.begin), poison, a.end - a.begin);
  for (int t = 0; t < n; ++t) {
    Thread& th = l.threads[t];
    th.state = State::kRunnable;
    th.sp = fresh_fiber(th.stack);
    th.epoch = 0;
  }
  // Warp by warp: a warp runs (its lanes in order, or shuffled) and completes its warp operations until all
  // its lanes wait at the barrier or have exited, before the next warp starts. So a warp runs as far ahead
  // of the others as a GPU may let it, and a read of shared memory that another warp overwrites before the
  // barrier meant to order them sees the new value.
  const int warps = (n + 31) / 32;
  std::vector<int> warp_order(warps), lanes(32);
  for (int w = 0; w < warps; ++w) warp_order[w] = w;
  for (int i = 0; i < 32; ++i) lanes[i] = i;
  while (!l.failed) {
    if (rng) std::shuffle(warp_order.begin(), warp_order.end(), *rng);
    for (int w : warp_order) {
      do {
        if (rng) std::shuffle(lanes.begin(), lanes.end(), *rng);
        for (int i : lanes) {
          const int t = w * 32 + i;
          if (t >= n || l.threads[t].state != State::kRunnable) continue;
          l.current = t;
          thread_idx = l.threads[t].idx;
          observe::running.thread = static_cast<uint32_t>(t);
          observe::running.epoch = l.threads[t].epoch;
          observe::running.stack_lo = reinterpret_cast<uintptr_t>(l.threads[t].stack);
          observe::running.stack_hi = observe::running.stack_lo + kStack;
          observe::running.on = true;
#if defined(__SANITIZE_ADDRESS__)
          void* fake_stack = nullptr;
          __sanitizer_start_switch_fiber(&fake_stack, l.threads[t].stack, kStack);
          fls_emu_switch(&l.scheduler_sp, l.threads[t].sp);
          __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
          fls_emu_switch(&l.scheduler_sp, l.threads[t].sp);
#endif
          observe::running.on = false;
          if (l.failed) return;  // a device assert or a misuse: the launch ends here
        }
      } while (resolve_warp_ops(l, w * 32));
      if (l.failed) return;
    }
    int at_barrier = 0, exited = 0;
    for (const Thread& th : l.threads) {
      at_barrier += th.state == State::kBarrier;
      exited += th.state == State::kExited;
    }
    if (exited == n) return;
    if (at_barrier == n) {
      // synccheck: one barrier, not two that happen to be waited at together (barriers in both branches of
      // an if). Every opening checked, so the threads also agree on the occurrence of the site.
      for (int t = 1; t < n; ++t)
        if (!same_site(l.threads[t], l.threads[0])) {
          fail(l, cudaErrorLaunchFailure,
               "synccheck: divergent __syncthreads: thread " + coords(l.threads[0].idx) + " waits at " +
                   site_of(l.threads[0]) + ", thread " + coords(l.threads[t].idx) + " at " + site_of(l.threads[t]) +
                   " (kernel " + l.kernel + ", block " + coords(block_idx) + ")");
          return;
        }
      for (Thread& th : l.threads) th.state = State::kRunnable;
      observe::synced({true, 0, 0, 0});
      continue;
    }
    fail(l, cudaErrorLaunchFailure, stuck(l));
  }
}

cudaError_t set_error(cudaError_t code, const std::string& detail) {
  g_last_error = code;
  g_last_detail = detail;
  return code;
}

}  // namespace

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, const char* file, int line) {
  Launch& l = *g_launch;
  Thread& t = l.threads[l.current];
  t.file = file;
  t.line = line;
  t.op = op;
  t.mask = mask;
  t.bits = bits;
  t.arg = arg;
  t.width = width;
  park(State::kWarpOp);
  return t.result;
}

void sync_block(const char* file, int line) {
  Thread& t = g_launch->threads[g_launch->current];
  t.file = file;
  t.line = line;
  park(State::kBarrier);
}

namespace {
// Places an array of `bytes` in the launch's arena after a redzone; its storage.
void* place_shared(Launch& l, size_t bytes, size_t align, const char* name) {
  const auto base = reinterpret_cast<uintptr_t>(l.arena.data());
  const uintptr_t begin = (base + l.arena_used + kRedzone + align - 1) / align * align;
  l.arena_used = begin + bytes - base;
  l.arrays.push_back({begin, begin + bytes, name});
  observe::set_shared(&l.arrays, base, base + kArena);
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(reinterpret_cast<void*>(begin), bytes);
#endif
  std::memset(reinterpret_cast<void*>(begin), 0xff, bytes);
  return reinterpret_cast<void*>(begin);
}
}  // namespace

void* static_shared(const void* site, size_t bytes, size_t align, const char* name) {
  Launch& l = *g_launch;
  auto it = l.static_shared.find(site);
  if (it == l.static_shared.end()) {
    l.static_bytes += bytes;
    if (l.static_bytes + l.dynamic_bytes_requested > kMaxShared || l.arrays.size() > kMaxSharedArrays) {
      fail(l, cudaErrorInvalidValue,
           "static shared memory of " + std::to_string(l.static_bytes) + " bytes (array '" + name + "') plus " +
               std::to_string(l.dynamic_bytes_requested) + " bytes of dynamic shared memory exceeds the " +
               std::to_string(kMaxShared) + " bytes a block may use (kernel " + l.kernel + ")");
      park(State::kExited);
    }
    it = l.static_shared.emplace(site, l.arrays.size()).first;
    place_shared(l, bytes, align, name);
  }
  return reinterpret_cast<void*>(l.arrays[it->second].begin);
}

void* dynamic_shared() { return reinterpret_cast<void*>(g_launch->arrays[0].begin); }

namespace observe {
void fail_launch(cudaError_t code, const std::string& message) {
  Launch& l = *g_launch;
  fail(l, code, message);
  if (running.on) park(State::kExited);
}
std::string where_block() { return "kernel " + g_launch->kernel + ", block " + coords(block_idx); }
std::string thread_coords(uint32_t thread) { return coords(g_launch->threads[thread].idx); }
}  // namespace observe

cudaError_t launch(const char* kernel, dim3 grid, dim3 block, size_t dynamic_smem, void (*body)(void*), void* ctx) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  const std::string name = kernel_name(kernel);
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || block.x > kMaxThreads || block.y > kMaxThreads ||
      block.z > kMaxBlockZ)
    return set_error(cudaErrorInvalidConfiguration,
                     "block " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" + std::to_string(block.z) +
                         " (at most " + std::to_string(kMaxThreads) + " threads, z <= 64) for " + name);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > kMaxGridX || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ)
    return set_error(cudaErrorInvalidConfiguration,
                     "grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z) +
                         " (x <= 2^31-1, y and z <= 65535, none 0) for " + name);
  if (dynamic_smem > kMaxShared)
    return set_error(cudaErrorInvalidValue, std::to_string(dynamic_smem) + " bytes of dynamic shared memory (at most " +
                                                std::to_string(kMaxShared) + " without opting in) for " + name);
  const bool shuffled = random_schedule();
  static uint64_t launches = 0;
  Launch l;
  l.id = ++launches;
  l.kernel = name;
  l.body = body;
  l.ctx = ctx;
  l.arena.assign(kArena, 0);
#if defined(__SANITIZE_ADDRESS__)
  __asan_poison_memory_region(l.arena.data(), kArena);
#endif
  l.dynamic_bytes_requested = dynamic_smem;
  place_shared(l, dynamic_smem, 16, "dynamic shared memory");
  l.threads.resize(threads);
  auto& pool = stack_pool();
  while (pool.size() < threads) pool.push_back(new_stack());
  for (uint64_t t = 0; t < threads; ++t) {
    l.threads[t].stack = pool[t];
    l.threads[t].idx = make_uint3(t % block.x, (t / block.x) % block.y, t / (uint64_t(block.x) * block.y));
  }
  block_dim = block;
  grid_dim = grid;
  g_launch = &l;
  observe::running.launch = l.id;
  {
    // The kernel's arguments: the launching thread's stack above this frame.
    static thread_local uintptr_t stack_top = 0;
    if (!stack_top) {
      pthread_attr_t attr;
      void* lo = nullptr;
      size_t size = 0;
      pthread_getattr_np(pthread_self(), &attr);
      pthread_attr_getstack(&attr, &lo, &size);
      pthread_attr_destroy(&attr);
      stack_top = reinterpret_cast<uintptr_t>(lo) + size;
    }
    observe::running.param_lo = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    observe::running.param_hi = stack_top;
  }
  observe::begin_launch({l.id, &l.kernel, grid, block, dynamic_smem});
  const uint64_t seed = env_seed(), id = std::hash<std::string>()(name), nth = launch_counts()[name]++;
  std::seed_seq seeds{uint32_t(seed), uint32_t(seed >> 32), uint32_t(id), uint32_t(id >> 32), uint32_t(nth),
                      uint32_t(nth >> 32)};
  std::mt19937_64 rng(seeds);
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  std::vector<uint64_t> order;
  if (shuffled) {
    order.resize(blocks);
    for (uint64_t b = 0; b < blocks; ++b) order[b] = b;
    std::shuffle(order.begin(), order.end(), rng);
  }
  for (uint64_t i = 0; i < blocks && !l.failed; ++i) {
    const uint64_t b = shuffled ? order[i] : i;
    block_idx = make_uint3(b % grid.x, (b / grid.x) % grid.y, b / (uint64_t(grid.x) * grid.y));
    observe::begin_block(static_cast<uint32_t>(b), static_cast<uint32_t>(threads));
    run_block(l, shuffled ? &rng : nullptr);
    observe::end_block();
  }
  observe::end_launch(l.failed);
  g_launch = nullptr;
#if defined(__SANITIZE_ADDRESS__)
  // A failed launch leaves fibers that never return: their frames' redzones stay poisoned on stacks the next
  // launch reuses. Clear them.
  if (l.failed)
    for (const Thread& t : l.threads) __asan_unpoison_memory_region(t.stack, kStack);
  __asan_unpoison_memory_region(l.arena.data(), kArena);
#endif
  if (l.failed) return set_error(l.failure.code, l.failure.detail);
  return cudaSuccess;
}

}  // namespace fls_emu

// ---- the runtime functions the launchers call
extern "C" {

void fls_emu_assert_fail(const char* assertion, const char* file, unsigned int line, const char* function) noexcept {
  using namespace fls_emu;
  Launch& l = *g_launch;
  // CUDA's own line for a failed device assert.
  std::fprintf(stderr, "%s:%u: %s: block: [%u,%u,%u], thread: [%u,%u,%u] Assertion `%s` failed.\n", file, line,
               function, block_idx.x, block_idx.y, block_idx.z, thread_idx.x, thread_idx.y, thread_idx.z, assertion);
  fail(l, cudaErrorAssert, std::string("device assert in kernel ") + l.kernel + ": " + assertion);
  park(State::kExited);
  __builtin_unreachable();
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = fls_emu::g_last_error;
  fls_emu::g_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return fls_emu::g_last_error; }

const char* cudaGetErrorString(cudaError_t e) {
  static thread_local std::string s;
  switch (e) {
    case cudaSuccess: s = "no error"; break;
    case cudaErrorInvalidValue: s = "invalid argument"; break;
    case cudaErrorInvalidConfiguration: s = "invalid configuration argument"; break;
    case cudaErrorAssert: s = "device-side assert triggered"; break;
    case cudaErrorIllegalAddress: s = "an illegal memory access was encountered"; break;
    case cudaErrorIllegalInstruction: s = "an illegal instruction was encountered"; break;
    case cudaErrorLaunchFailure: s = "unspecified launch failure"; break;
    default: s = "cudaError " + std::to_string(static_cast<int>(e)); break;
  }
  if (e != cudaSuccess && !fls_emu::g_last_detail.empty()) s += " [emulated: " + fls_emu::g_last_detail + "]";
  return s.c_str();
}

// For tests: leaves `error` pending, as another library's failed launch or an asynchronous fault would.
void fls_emu_set_pending_error(int error) { fls_emu::set_error(static_cast<cudaError_t>(error), "set by a test"); }

// For tests: "name\tcount\n" for every kernel launched so far in the process.
const char* fls_emu_launch_counts() {
  std::lock_guard<std::mutex> lock(fls_emu::g_launch_mutex);
  static std::string text;
  std::ostringstream s;
  for (const auto& [name, count] : fls_emu::launch_counts()) s << name << '\t' << count << '\n';
  text = s.str();
  return text.c_str();
}

// For tests: the byte the poison repeats (FLS_EMULATION_POISON).
int fls_emu_poison_byte() { return fls_emu::poison_byte(); }

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

}  // extern "C"

namespace fls {
namespace cuda {
// The marker the op layer looks for (csrc/kernels/cuda_launcher.h) before it switches the emulated device on.
bool emulated_device() { return true; }
// The poison the op layer fills its allocations with on the emulated device (csrc/poisoned_allocator.cpp).
unsigned char emulation_poison_byte() { return fls_emu::poison_byte(); }
}  // namespace cuda
}  // namespace fls

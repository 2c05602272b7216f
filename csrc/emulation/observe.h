// The emulated device's eyes: every load and store that a kernel's thread makes, with who made it and where,
// handed to the observers that subscribed (the sanitizer checks of checks.cpp; a kernel profile).
//
// How the accesses are seen: the checked build (Makefile: _cuda_emulated_checked.so) compiles the kernels'
// objects with gcc's ThreadSanitizer instrumentation (-fsanitize=thread
// --param=tsan-instrument-func-entry-exit=0 -g1) and links them WITHOUT the TSan runtime: the calls the
// compiler puts before every load and store (__tsan_read4(addr), __tsan_write16(addr), the __atomic builtins
// as __tsan_atomic32_load(...)) land in observe.cpp. The emulator's own code (scheduler.cpp, observe.cpp,
// checks.cpp) is compiled without it, so its bookkeeping is never observed; nor is anything a kernel's code
// does outside a kernel's thread (the launchers). `instrumented()` says whether the loaded library is the
// checked build (the instrumented objects call __tsan_init when loaded); the other builds observe nothing.
//
// A consumer subscribes an Observer (once, e.g. from a static initializer in the emulated library or from a
// test's C function) and receives, for every launch: launch_begin, for every block block_begin, the block's
// accesses and synchronisations in the order the emulator runs them, block_end, then launch_end. Accesses of
// one warp-level request: the lanes of one warp with the same `epoch` and `pc` (a lane's epoch counts the
// switch points it passed, so lanes that run the same code path between two switch points agree on it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fls_emu {
namespace observe {

enum class Space : uint8_t {
  kGlobal,  // anything not below: device memory (the tensors), read-only tables
  kShared,  // the block's shared memory: static arrays (FLS_SHARED) and the dynamic bytes (FLS_DYNAMIC_SHARED)
  kLocal,   // the running CUDA thread's own stack (its local memory)
  kParam,   // the emulator's own: the kernel's arguments (on the launching thread's stack) and the coordinates
};
const char* space_name(Space s);

enum Kind : uint8_t { kRead = 1, kWrite = 2, kAtomic = 4 };  // an atomic read-modify-write is kRead|kWrite|kAtomic

struct Access {
  uint64_t launch;   // the process's launch counter, from 1
  uint32_t block;    // linear block index: x + y * gridDim.x + z * gridDim.x * gridDim.y
  uint32_t thread;   // linear thread index in the block: x + y * blockDim.x + z * blockDim.x * blockDim.y
  uint32_t warp;     // thread / 32
  uint32_t epoch;    // barriers and warp operations this thread passed since its block started
  const void* pc;    // the return address of the instrumentation call: site(pc) is the access's file:line
  uintptr_t addr;
  uint32_t size;     // bytes
  uint8_t kind;      // Kind bits
  Space space;
};

// A shared array of the running block (the dynamic bytes are one too, named "dynamic shared memory").
struct SharedArray {
  uintptr_t begin, end;  // exactly the declared bytes; what lies between two arrays is nobody's
  const char* name;
};

struct LaunchInfo {
  uint64_t launch;
  const std::string* kernel;  // the kernel's name (its template instance)
  dim3 grid, block;
  size_t dynamic_bytes;
};

// A completed synchronisation: a barrier (every thread of the block) or a warp operation (the lanes of `mask`
// of warp `warp`; kind is WarpOp's value, 0 = __syncwarp). Shuffles and votes exchange registers, not memory.
struct Sync {
  bool barrier;
  uint32_t warp;
  unsigned mask;
  int warp_op;
};

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void launch_begin(const LaunchInfo&) {}
  virtual void block_begin(uint32_t /*block*/, uint32_t /*threads*/) {}
  virtual void access(const Access&) = 0;
  virtual void sync(const Sync&) {}
  virtual void block_end() {}
  virtual void launch_end(bool /*failed*/) {}
};

void subscribe(Observer* o);
void unsubscribe(Observer* o);
bool instrumented();  // the kernels of the loaded library are instrumented (the checked build)

// The running launch's shared-memory arena [lo, hi): the arrays and the redzones between them (an access there
// is Space::kShared; outside every array it is out of bounds).
void shared_arena(uintptr_t* lo, uintptr_t* hi);
// The running block's shared array that holds `addr`, or nullptr; `nearest` (if given) gets the array that
// ends last at or before addr (for an access that falls between arrays: the one it ran past).
const SharedArray* shared_array(uintptr_t addr, const SharedArray** nearest = nullptr);
// "file:line" of an instrumented access (its pc), inlined call sites after it ("reduce.cuh:40 in
// layer_norm.cu:61"); from the library's line tables (addr2line), cached.
std::string site(const void* pc);
// Fails the running launch with `code` and `message` (an observer's finding). On a kernel's thread it does not
// return: the thread ends there, as the launch does.
void fail_launch(cudaError_t code, const std::string& message);
// "kernel K, block [x,y,z]" and "thread [x,y,z]" of the running launch, for messages.
std::string where_block();
std::string thread_coords(uint32_t thread);

// ---- for the scheduler (scheduler.cpp) only: what runs now, and the events.
struct Running {
  bool on = false;          // a kernel's thread runs (only then are accesses observed)
  uintptr_t stack_lo = 0, stack_hi = 0;    // its fiber stack
  uintptr_t param_lo = 0, param_hi = 0;    // the launching thread's stack above the launch: the arguments
  uint64_t launch = 0;
  uint32_t block = 0, thread = 0, epoch = 0;
};
extern Running running;
void begin_launch(const LaunchInfo& info);
void end_launch(bool failed);
void begin_block(uint32_t block, uint32_t threads);
void end_block();
// The launch's arrays (the scheduler's list, which grows as the kernel declares them) in its arena [lo, hi).
void set_shared(const std::vector<SharedArray>* arrays, uintptr_t lo, uintptr_t hi);
void synced(const Sync& s);

}  // namespace observe
}  // namespace fls_emu

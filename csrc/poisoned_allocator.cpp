// Outputs a kernel leaves unwritten fail on the emulated CUDA device. While it is on, every CPU allocation
// (the op layer's outputs and scratch from at::empty and friends, and whatever else torch allocates then) is
// filled with the emulator's poison byte (csrc/emulation/scheduler.cpp: NaN, or a huge finite number with
// FLS_EMULATION_POISON=finite) before any kernel sees it, so an element no kernel wrote fails the comparison
// with the reference instead of passing on the zeros or stale values a fresh allocation happens to hold.
// Installed when the emulated device is first switched on, which only a CPU build into whose process the
// emulated library was loaded can do: a normal run, and every CUDA build, never pays for it.
#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "ops/device.h"

namespace fls {
namespace cuda {
// Defined only by the emulated library (csrc/emulation/scheduler.cpp), like emulated_device: the byte its
// poison repeats.
FLS_CUDA_LAUNCHER unsigned char emulation_poison_byte();
}  // namespace cuda

namespace {

// torch's CPU allocator, poisoning what it hands out while the emulated device is on.
class PoisonedAllocator final : public c10::Allocator {
 public:
  explicit PoisonedAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr p = base_->allocate(n);
    if (n != 0 && cuda_emulation_on()) std::memset(p.get(), cuda::emulation_poison_byte(), n);
    return p;
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

 private:
  c10::Allocator* base_;
};

}  // namespace

void poison_emulated_allocations() {
  // Once per process; the tensors it allocated keep using it after the device is switched off (then it only
  // passes allocations through).
  static PoisonedAllocator* allocator = [] {
    auto* a = new PoisonedAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/1);
    return a;
  }();
  (void)allocator;
}

}  // namespace fls

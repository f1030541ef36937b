// The PrivateUse1 hooks of the `ltc` device, with a pinned host allocator.
//
// PyTorch asks a PrivateUse1 backend for pinned host memory in a few places a Python backend
// cannot serve: its Python hooks (`torch._C._acc.PrivateUse1Hooks`) forward only isAvailable,
// hasPrimaryContext and isBuilt.  DistributedDataParallel with find_unused_parameters=True or
// static_graph=True stages its used-parameter map through `empty_like(..., pin_memory=true)`
// and asserts `is_pinned()` for any PrivateUse1 device.  These hooks answer what the Python ones
// do and add a host allocator whose blocks report as pinned (ltc devices compute on the host, or
// on CUDA, whose own pinned allocator PyTorch prefers when it is present).  PyTorch takes one
// hooks object per process, so `ltc_async/patches/native/__init__.py` installs these before the Python
// ones when this file has been built (`python -m ltc_async.native`, run by `make setup`).
#include <torch/extension.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <mutex>
#include <unordered_set>

namespace {
std::mutex mu;
std::unordered_set<const void*> live;

struct Block {
  c10::DataPtr inner;  // the CPU allocator's memory, freed with the block
};

void release(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  {
    std::lock_guard<std::mutex> g(mu);
    live.erase(b->inner.get());
  }
  delete b;
}

struct HostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    auto* b = new Block{c10::GetCPUAllocator()->allocate(n)};
    void* p = b->inner.get();
    {
      std::lock_guard<std::mutex> g(mu);
      live.insert(p);
    }
    return {p, b, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
HostAllocator allocator;

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> g(mu);
    return live.count(data) > 0;
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return &allocator; }
};
}  // namespace

void install() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "register these hooks (before any other)");
}

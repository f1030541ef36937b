// The PrivateUse1 hooks of the `ltc` device, with a pinned host allocator.
//
// PyTorch asks a PrivateUse1 backend for pinned host memory in a few places a Python backend
// cannot serve: its Python hooks (`torch._C._acc.PrivateUse1Hooks`) forward only isAvailable,
// hasPrimaryContext and isBuilt.  DistributedDataParallel with find_unused_parameters=True or
// static_graph=True stages its used-parameter map through `empty_like(..., pin_memory=true)`
// and asserts `is_pinned()` for any PrivateUse1 device.  These hooks answer what the Python ones
// do and add a host allocator whose blocks report as pinned (ltc devices compute on the host, or
// on CUDA, whose own pinned allocator PyTorch prefers when it is present), and generators:
// `torch.Generator(device="ltc:0")` (a pattern of sampling code: `torch.Generator(x.device)`)
// asks the hooks for one.  It is a CPU generator (the same Mersenne Twister and state format)
// that reports the ltc device; a random op given one draws its seed from it
// (`tensor/host.py`, `seed_from`), so seeding it reproduces the op's values.  PyTorch takes one
// hooks object per process, so `ltc_async/patches/native/__init__.py` installs these before the Python
// ones when this file has been built (`python -m ltc_async.native`, run by `make setup`).
//
// Where CUDA is present, the two halves of "pinned" come from different hooks: PyTorch allocates
// `pin_memory=true` host tensors with CUDA's pinned allocator (`GetCPUAllocatorMaybePinned`
// prefers CUDA whenever `hasCUDA()`), while `is_pinned()` asks the current accelerator's hooks --
// PrivateUse1's, ours, as soon as a PrivateUse1 backend is registered -- and answers false
// without asking them unless PrivateUse1 was initialized (`Context::lazyInitDevice`), which only
// the PrivateUse1 allocation branch does.  DDP's reducer asserts `is_pinned()` right after such
// an allocation ("local_used_map_tmp.is_pinned() INTERNAL ASSERT FAILED").  So `install`
// initializes PrivateUse1 and `isPinnedPtr` also answers for CUDA's pinned blocks.
//
// The device guard.  PyTorch's Python-backed PrivateUse1 guard (`torch._C._acc.DeviceGuard`)
// calls into Python for the device type on every guard operation -- getDevice, exchangeDevice,
// getStream, exchangeStream -- and the autograd engine makes several per backward node: ~900
// Python calls a step of a tiny BERT's training, 7-8% of the tracing thread's time (py-spy
// --native).  `Guard` gives PyTorch the same answers without Python: the type PrivateUse1,
// device index 0 (PyTorch's Python guard answers `Device(type(), 0)`), one default stream, no-op
// device switches and events, one device as the engine's device count.  PyTorch keeps the first
// guard registered for a device type, so `install` registers it before the Python one is
// offered (`patches/registration.py`, `_LtcDeviceGuard`, which stays the guard without a build).
// Never calling Python, it also cannot meet a Python error left pending inside the engine (what
// `_LtcDeviceGuard.type_` has to take care of).
#include <torch/extension.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <mutex>
#include <unordered_set>

#define LTC_STR2(x) #x
#define LTC_STR(x) LTC_STR2(x)

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

// A CPU generator on an ltc device: CPUGeneratorImpl's engine and state, the device and key of
// PrivateUse1 (protected members of GeneratorImpl, set once here).
struct LtcGenerator final : at::CPUGeneratorImpl {
  explicit LtcGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }

 private:
  LtcGenerator* clone_impl() const override {
    auto* g = new LtcGenerator(device_.index());
    g->set_state(*get_state());
    return g;
  }
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  bool isPinnedPtr(const void* data) const override {
    {
      std::lock_guard<std::mutex> g(mu);
      if (live.count(data) > 0) return true;
    }
    // CUDA's pinned blocks (what `pin_memory=true` allocates where CUDA is present); the Context
    // asks CUDA's hooks only once CUDA is initialized, which its pinned allocator needs anyway,
    // so a CPU tensor's `is_pinned()` never starts a CUDA context
    return at::globalContext().hasCUDA() &&
        at::globalContext().isPinnedPtr(data, c10::DeviceType::CUDA);
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return &allocator; }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<LtcGenerator>(index < 0 ? 0 : index);
  }
};

// What PyTorch's Python-backed guard (torch/csrc/acc/Module.cpp, `PythonDeviceGuard`) answers,
// with the type known here instead of asked of Python each time.
struct Guard final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  static c10::Device device() { return c10::Device(kType, 0); }
  static c10::Stream stream() { return c10::Stream(c10::Stream::DEFAULT, device()); }

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return device(); }
  c10::Device getDevice() const override { return device(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return stream(); }
  c10::Stream getNewStream(c10::Device, int) const override { return stream(); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return stream(); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};
}  // namespace

void install() {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  // first come, first kept: the Python guard offered later is not registered
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
    c10::impl::registerDeviceGuard(c10::DeviceType::PrivateUse1, new Guard());
  }
  // `is_pinned()` consults PrivateUse1's hooks only once PrivateUse1 is initialized (see above)
  at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "register these hooks (before any other)");
  m.attr("source_hash") = LTC_STR(LTC_SOURCE_HASH);   // `native/__init__.py` loads only a current build
}

#include "trainer/core/energy.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace topiary {

// NVML's C ABI, declared here so that building needs no NVML header: return codes are ints
// (0 = success), devices opaque pointers, energy unsigned long long millijoules.
struct EnergyMeter::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_bus_id)(const char*, void**) = nullptr;
  int (*energy)(void*, unsigned long long*) = nullptr;
  const char* (*error)(int) = nullptr;

  std::string Error(int code) const {
    return error != nullptr ? error(code) : absl::StrCat("NVML error ", code);
  }
};

absl::StatusOr<std::unique_ptr<EnergyMeter>> EnergyMeter::Open(const std::string& pci_bus_id) {
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->lib == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVML is not available (libnvidia-ml.so.1: ", dlerror(), ")"));
  }
  auto sym = [&](const char* name) { return dlsym(api->lib, name); };
  api->init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  api->shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  api->by_bus_id =
      reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  api->energy = reinterpret_cast<int (*)(void*, unsigned long long*)>(
      sym("nvmlDeviceGetTotalEnergyConsumption"));
  api->error = reinterpret_cast<const char* (*)(int)>(sym("nvmlErrorString"));
  if (api->init == nullptr || api->shutdown == nullptr || api->by_bus_id == nullptr ||
      api->energy == nullptr) {
    dlclose(api->lib);
    return absl::FailedPreconditionError("NVML lacks the energy counter's entry points");
  }
  if (int rc = api->init(); rc != 0) {
    const std::string why = api->Error(rc);
    dlclose(api->lib);
    return absl::FailedPreconditionError(absl::StrCat("NVML did not start: ", why));
  }
  std::unique_ptr<EnergyMeter> meter(new EnergyMeter());
  meter->api_ = std::move(api);
  if (int rc = meter->api_->by_bus_id(pci_bus_id.c_str(), &meter->device_); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVML does not know the GPU at ", pci_bus_id, ": ", meter->api_->Error(rc)));
  }
  if (auto j = meter->Joules(); !j.ok()) return j.status();  // no counter on this board
  return meter;
}

absl::StatusOr<std::unique_ptr<EnergyMeter>> EnergyMeter::ForDevice(const Device& device) {
  if (device.cuda() == nullptr) {
    return absl::FailedPreconditionError(
        "no energy figures on the CPU (the GPU board's counter only)");
  }
  auto meter = Open(device.pci_bus_id());
  if (!meter.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no energy figures: ", meter.status().message()));
  }
  return meter;
}

EnergyMeter::~EnergyMeter() {
  if (api_ != nullptr && api_->lib != nullptr) {
    api_->shutdown();
    dlclose(api_->lib);
  }
}

absl::StatusOr<double> EnergyMeter::Joules() const {
  unsigned long long mj = 0;
  if (int rc = api_->energy(device_, &mj); rc != 0) {
    return absl::FailedPreconditionError(absl::StrCat("NVML energy counter: ", api_->Error(rc)));
  }
  return static_cast<double>(mj) / 1000.0;
}

}  // namespace topiary

// The energy a GPU board consumed, from its cumulative energy counter through NVML (Volta and
// later). NVML is loaded at run time from the driver's libnvidia-ml.so.1, so nothing links
// against it and a machine without it (the CPU-only CI) still runs: Open then says why.
// The counter covers the whole board (idle power and other processes included) in millijoules
// and advances in steps of the driver's update period (tens of milliseconds): read it around
// work that lasts well beyond that.
#ifndef TOPIARY_TRAINER_CORE_ENERGY_H_
#define TOPIARY_TRAINER_CORE_ENERGY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/core/device.h"

namespace topiary {

class EnergyMeter {
 public:
  // The board with this PCI bus id (Device::pci_bus_id()). Errors: NVML absent, the board
  // unknown to it, or no energy counter (FailedPrecondition, with NVML's reason).
  static absl::StatusOr<std::unique_ptr<EnergyMeter>> Open(const std::string& pci_bus_id);
  // The board of `device`; on error, a message that says why there are no energy figures
  // (the CPU, or Open's reason), fit to show a user as it is.
  static absl::StatusOr<std::unique_ptr<EnergyMeter>> ForDevice(const Device& device);
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  // Joules consumed by the board since the driver loaded.
  absl::StatusOr<double> Joules() const;

  struct Api;  // the NVML entry points; defined by the implementation

 private:
  EnergyMeter() = default;
  std::unique_ptr<Api> api_;
  void* device_ = nullptr;  // nvmlDevice_t
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_CORE_ENERGY_H_

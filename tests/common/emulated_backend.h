// A test double of a device backend on a machine without one: its memory is host memory, but
// every pointer it hands out is tagged into the non-canonical half of the x86-64 address space,
// so the host cannot dereference it (a stray read or write by the wiring faults at once). Its
// ops untag their arguments and run the CPU backend's kernels, so a model on it must compute bit
// for bit what it computes on the CPU: the tests check that the model wiring, the decode state,
// the scratch and the prefix cache touch device memory only through the Device interface and
// the ops (docs/architecture.md, "Backends").
#pragma once
#include <memory>

#include "core/device.h"
#include "kernels/ops.h"

namespace k3::test {

// The emulated device (one per process) and a backend over it.
Device* emulated_device();
std::shared_ptr<const Ops> emulated_ops();

// The host address behind a pointer of the emulated device (null stays null).
template <typename T>
T* emulated_host(T* p);

}  // namespace k3::test

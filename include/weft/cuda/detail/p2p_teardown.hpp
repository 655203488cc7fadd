#pragma once
// How a rank of a p2p communicator between processes lets go of its memory (the order only:
// the steps themselves are the endpoint's, detail/p2p_endpoint.cuh). Host logic only.
//
// Each process maps its peers' workspaces (cudaIpcOpenMemHandle) and exports its own. CUDA
// leaves it undefined to free exported memory while another process still has it mapped
// (cudaIpcOpenMemHandle's documentation: free only after every importer has called
// cudaIpcCloseMemHandle), so a rank frees its workspace only after every rank has closed its
// imports:
//
//   rank r                                   every other rank q, at its own pace
//   sync with every rank on the device,      (the same)
//     wait for it: no kernel touches any
//     workspace any more
//   close the imports (q's workspaces)       close its imports (r's workspace among them)
//   barrier on the host communicator   <-->  barrier
//   free its own workspace                   free its own
//
// Where a step cannot be taken (the communicator has failed, the process is unwinding, a
// capture is under way) or a step fails (a sync or the barrier times out: a peer may still map
// or touch the memory), the memory stays allocated: a process that is failing ends soon anyway.
#include <utility>

namespace weft::cuda::detail {

/// Runs a p2p rank's teardown in the order above over `steps`, which offers
///   healthy()        whether the teardown can start (no failure, no unwinding, no capture)
///   sync_on_device() sync with every rank on the device and wait for it (throws on failure)
///   close_imports()  unmap the peers' workspaces
///   host_barrier()   the host communicator's barrier (throws on failure)
///   free_memory()    free this rank's workspace
///   leak_memory()    leave it allocated for good (noexcept)
/// Never throws: a step that throws leaves the memory allocated.
template <class Steps>
void p2p_tear_down(Steps&& steps) noexcept {
  try {
    if (!steps.healthy()) {
      steps.leak_memory();
      return;
    }
    steps.sync_on_device();
    steps.close_imports();
    steps.host_barrier();
    steps.free_memory();
  } catch (...) {
    steps.leak_memory();
  }
}

} // namespace weft::cuda::detail

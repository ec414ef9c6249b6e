#include "common/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace starling {

void restart_unless_openmp_wait_policy_set(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
    // Before any thread starts (main's first call), so no getenv can race this setenv.
    setenv("OMP_WAIT_POLICY", "passive", 1);  // NOLINT(concurrency-mt-unsafe)
    execv("/proc/self/exe", argv);
}

}  // namespace starling

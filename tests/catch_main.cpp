// Every suite's main: Catch2's, after the OpenMP wait policy that the training processes use.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "common/openmp_wait.h"

int main(int argc, char** argv) {
    starling::restart_unless_openmp_wait_policy_set(argv);
    return Catch::Session().run(argc, argv);
}

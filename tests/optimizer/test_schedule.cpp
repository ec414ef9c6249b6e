#include <catch2/catch.hpp>
#include <cmath>

#include "common/error.h"
#include "optimizer/schedule.h"

using starling::LrSchedule;

TEST_CASE("warmup rises linearly to the peak") {
    LrSchedule s{1.0f, 4, 14, 0.1f};
    CHECK(s.lr_at(0) == Approx(0.25));
    CHECK(s.lr_at(1) == Approx(0.50));
    CHECK(s.lr_at(3) == Approx(1.00));
}

TEST_CASE("cosine decays from the peak to the floor") {
    // After 4 warmup steps, 10 decay steps: progress p = (step - 4) / 10,
    // lr = 0.1 + 0.9 * (1 + cos(pi p)) / 2.
    LrSchedule s{1.0f, 4, 14, 0.1f};
    CHECK(s.lr_at(4) == Approx(1.0));
    CHECK(s.lr_at(9) == Approx(0.55));                              // p = 0.5: cos = 0
    CHECK(s.lr_at(6) == Approx(0.1 + 0.45 * (1 + 0.80901699437)));  // p = 0.2: cos(pi/5)
    CHECK(s.lr_at(14) == Approx(0.1));
    CHECK(s.lr_at(1000) == Approx(0.1));
}

TEST_CASE("no warmup starts at the peak") {
    LrSchedule s{2e-3f, 0, 100, 0.0f};
    CHECK(s.lr_at(0) == Approx(2e-3));
    CHECK(s.lr_at(50) == Approx(1e-3));
    CHECK(s.lr_at(100) == Approx(0.0));
}

TEST_CASE("invalid schedules are rejected with the field named") {
    CHECK_THROWS_WITH((LrSchedule{0.0f, 0, 10, 0.1f}.validate()), Catch::Contains("lr"));
    CHECK_THROWS_WITH((LrSchedule{1.0f, 10, 10, 0.1f}.validate()), Catch::Contains("warmup_steps"));
    CHECK_THROWS_WITH((LrSchedule{1.0f, 0, 10, 1.5f}.validate()),
                      Catch::Contains("min_lr_fraction"));
}

// trainer/schedule: openpi's warmup + cosine (optax.warmup_cosine_decay_schedule) against closed-form values.
#include <catch2/catch.hpp>

#include <cmath>

#include "trainer/schedule.h"

using vlatune::trainer::WarmupCosine;

namespace {
constexpr double kPi = 3.14159265358979323846;
}

TEST_CASE("Warmup rises linearly from peak/(W+1) to peak over W steps", "[schedule]") {
  const WarmupCosine s{/*warmup_steps=*/1000, /*peak_lr=*/2.5e-5, /*decay_steps=*/30000, /*decay_lr=*/2.5e-6};
  s.validate();
  const double init = 2.5e-5 / 1001;
  CHECK(s.lr(0) == Approx(init).epsilon(1e-12));
  CHECK(s.lr(500) == Approx(init + (2.5e-5 - init) * 0.5).epsilon(1e-12));
  CHECK(s.lr(999) == Approx(init + (2.5e-5 - init) * 999.0 / 1000.0).epsilon(1e-12));
  CHECK(s.lr(1000) == Approx(2.5e-5).epsilon(1e-12));  // step W: exactly peak, start of the cosine
  CHECK(s.lr(-5) == s.lr(0));
}

TEST_CASE("After warmup the rate follows a cosine from peak to decay_lr and then stays there", "[schedule]") {
  const WarmupCosine s{1000, 2.5e-5, 30000, 2.5e-6};
  // Mid-cosine: (step - W) / (D - W) = 0.5 -> cos = 0 -> halfway between peak and decay_lr.
  CHECK(s.lr(1000 + 14500) == Approx(2.5e-6 + (2.5e-5 - 2.5e-6) * 0.5).epsilon(1e-12));
  // A quarter in: 0.5 * (1 + cos(pi/4)).
  const double quarter = 2.5e-6 + (2.5e-5 - 2.5e-6) * 0.5 * (1 + std::cos(kPi / 4));
  CHECK(s.lr(1000 + 7250) == Approx(quarter).epsilon(1e-12));
  CHECK(s.lr(30000) == Approx(2.5e-6).epsilon(1e-12));
  CHECK(s.lr(100000) == Approx(2.5e-6).epsilon(1e-12));
}

TEST_CASE("The pi05_libero schedule is constant at 5e-5 after 10k warmup steps", "[schedule]") {
  const WarmupCosine s{10000, 5e-5, 1000000, 5e-5};
  CHECK(s.lr(0) == Approx(5e-5 / 10001).epsilon(1e-12));
  CHECK(s.lr(9999) == Approx(5e-5 / 10001 + (5e-5 - 5e-5 / 10001) * 0.9999).epsilon(1e-12));
  CHECK(s.lr(10000) == 5e-5);
  CHECK(s.lr(29999) == 5e-5);
}

TEST_CASE("Zero warmup starts the cosine at step 0", "[schedule]") {
  const WarmupCosine s{0, 1e-4, 100, 0.0};
  s.validate();
  CHECK(s.lr(0) == Approx(1e-4).epsilon(1e-12));
  CHECK(s.lr(50) == Approx(5e-5).epsilon(1e-12));
  CHECK(s.lr(100) == Approx(0.0).margin(1e-20));
}

TEST_CASE("An impossible schedule is refused naming the field", "[schedule]") {
  CHECK_THROWS_WITH((WarmupCosine{-1, 1e-4, 100, 0}.validate()), Catch::Contains("warmup_steps"));
  CHECK_THROWS_WITH((WarmupCosine{100, 1e-4, 100, 0}.validate()), Catch::Contains("decay_steps"));
  CHECK_THROWS_WITH((WarmupCosine{10, -1e-4, 100, 0}.validate()), Catch::Contains("peak_lr"));
}

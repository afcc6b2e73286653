// formats/numbers.h: the one median and the fixed-decimal text of the torch-free tier.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "formats/numbers.h"

using namespace vlatune::formats;

TEST_CASE("The median takes the middle value, or the mean of the two middle ones, of the finite values",
          "[formats][numbers]") {
  CHECK(median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(median({4.0, 1.0, 3.0, 2.0}) == 2.5);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK(median({nan, 5.0, inf, 1.0, -inf}) == 3.0);
  CHECK(std::isnan(median({})));
  CHECK(std::isnan(median({nan, inf})));
  const std::vector<double> kept = {9.0, 1.0, 5.0};
  CHECK(median(kept) == 5.0);
  CHECK(kept == std::vector<double>{9.0, 1.0, 5.0});
}

TEST_CASE("Fixed-decimal text has no negative zero and names non-finite values", "[formats][numbers]") {
  CHECK(fixed(1.25, 1) == "1.2");  // round half to even, as printf
  CHECK(fixed(-0.001, 2) == "0.00");
  CHECK(fixed(std::nan(""), 2) == "nan");
  CHECK(fixed(-std::numeric_limits<double>::infinity(), 2) == "-inf");
  CHECK(signed_pct(4.031) == "+4.03%");
  CHECK(signed_pct(-0.5, 1) == "-0.5%");
  CHECK(signed_pct(-0.001) == "+0.00%");
}

TEST_CASE("A prediction is placed above or below its measurement in words", "[formats][numbers]") {
  CHECK(prediction_versus_measured(878.625, 781.0) == "predicted 12.5% above measured");
  CHECK(prediction_versus_measured(756.789, 781.0) == "predicted 3.1% below measured");
  CHECK(prediction_versus_measured(781.2, 781.0) == "predicted = measured");
  CHECK(prediction_versus_measured(1.0, 0.0) == "-");
  CHECK(prediction_versus_measured(std::nan(""), 1.0) == "-");
}

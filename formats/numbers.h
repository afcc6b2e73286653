// Numbers as the whole torch-free tier computes and prints them: one median and one locale-independent,
// deterministic fixed-decimal text (golden outputs: the same input gives the same bytes on every machine).
#pragma once

#include <string>
#include <vector>

namespace vlatune::formats {

// Median of the finite values (the mean of the two middle ones for an even count); NaN when there are none.
// The input is copied, not reordered.
double median(std::vector<double> values);

// x with `digits` decimals ("-0.00" is written "0.00"); non-finite values as "nan", "inf", "-inf".
std::string fixed(double x, int digits);

// Signed percentage: "+4.03%", "-0.50%".
std::string signed_pct(double pct, int digits = 2);

// How far a prediction lies from its measurement, the sign spelled out: "predicted 12.5% above measured",
// "predicted 3.1% below measured", "predicted = measured" (to 0.1%); "-" without a finite nonzero measurement.
std::string prediction_versus_measured(double predicted, double measured);

}  // namespace vlatune::formats

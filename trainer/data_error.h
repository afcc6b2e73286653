// The error of every reader of a foreign dataset (LeRobot parquet, video, images, metadata).
#pragma once

#include <stdexcept>

namespace vlatune::trainer {

// A dataset file that is missing, truncated or malformed. The message names the file and what is wrong (and,
// where one is at fault, the episode, frame, column or JSON path); the CLI reports it as bad input (exit 4).
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace vlatune::trainer

// Flag validators shared by the verbs. CLI11's Range and PositiveNumber let NaN through (every comparison with NaN
// is false), and an unsigned option takes "-1" as 2^64 - 1, so numeric flags use these instead. CLI11 prefixes each
// message with the flag's name: "--alpha: 'nan' is not a finite number".
#pragma once

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli.h"
#include "formats/file_io.h"

namespace vlatune::cli {

namespace detail {

// The text as one whole number, or an error message.
inline std::string parse_finite(const std::string& text, double& v) {
  try {
    size_t used = 0;
    v = std::stod(text, &used);
    if (used != text.size()) return "'" + text + "' is not a number";
  } catch (const std::out_of_range&) {
    return "'" + text + "' is out of the range of a double";
  } catch (const std::exception&) {
    return "'" + text + "' is not a number";
  }
  if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
  return "";
}

inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace detail

// A finite number in [min, max]: refuses nan, inf and values outside, naming the value.
inline CLI::Validator finite_range(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double v = 0;
        std::string err = detail::parse_finite(text, v);
        if (!err.empty()) return err;
        if (v < min || v > max)
          return "'" + text + "' is outside [" + CLI::detail::to_string(min) + ", " + CLI::detail::to_string(max) + "]";
        return "";
      },
      "FINITE in [" + CLI::detail::to_string(min) + " - " + CLI::detail::to_string(max) + "]");
}

// A finite number > 0.
inline CLI::Validator finite_positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        std::string err = detail::parse_finite(text, v);
        if (!err.empty()) return err;
        if (!(v > 0)) return "'" + text + "' is not > 0";
        return "";
      },
      "FINITE > 0");
}

// An integer >= 0 written without a sign (for unsigned options such as --seed, which would take -1 as 2^64 - 1).
inline CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
          return "'" + text + "' is not an integer >= 0";
        return "";
      },
      "UINT");
}

// An existing regular file (or a symbolic link to one). A FIFO, a device such as /dev/zero, a socket or a directory
// where a file is read would hang the verb or grow its memory without bound.
inline CLI::Validator regular_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) return "File does not exist: " + path;
        if (!S_ISREG(st.st_mode)) return path + " is " + detail::file_kind(st.st_mode) + ", not a regular file";
        return "";
      },
      "FILE");
}

// A regular file or a directory (run directories, profile directories).
inline CLI::Validator file_or_directory() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) return "Path does not exist: " + path;
        if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
          return path + " is " + detail::file_kind(st.st_mode) + ", not a regular file or a directory";
        return "";
      },
      "PATH");
}

// Refuses `out` (the value of flag `out_flag`) when it is an existing directory or the same file as one of `inputs`
// (flag, path) pairs: the verb would overwrite an input before or while reading it. Empty inputs are skipped.
inline void require_distinct_output(const std::string& out_flag, const std::string& out,
                                    const std::vector<std::pair<std::string, std::string>>& inputs) {
  struct stat st {};
  if (::stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw BadInput(out_flag + " " + out + ": is a directory (name the file to write)");
  for (const auto& [flag, path] : inputs) {
    if (!path.empty() && formats::same_file(out, path))
      throw BadInput(out_flag + " " + out + ": is the same file as " + flag + " " + path +
                     " (writing it would destroy the input; choose another output)");
  }
}

}  // namespace vlatune::cli

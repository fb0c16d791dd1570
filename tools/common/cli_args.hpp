// CLI11 pieces the tools and examples share, so that every command line is checked the same way:
// a validator for sizes (the one size parser, size_arg.hpp), and the parse step's exit status (2
// for every usage error, as the tools document; CLI11's own codes differ by kind of error: 105 for
// a value out of range, 106 for a missing one, ...).
#pragma once

#include "size_arg.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace cli {

/// A CLI11 check for a size option ("64M", "4K", "123"): refused unless cli::parse_size takes it,
/// it is at most `max` and (unless `allow_zero`) above zero. The message names the syntax.
inline CLI::Validator size_validator(bool allow_zero = false, std::size_t max = kMaxSizeArg) {
  return CLI::Validator(
      [allow_zero, max](std::string& v) {
        const auto n = parse_size(v, max);
        if (!n) return std::string("not ") + kSizeSyntax + ", at most " + std::to_string(max) + " bytes";
        if (*n == 0 && !allow_zero) return std::string("must be above zero");
        return std::string();
      },
      "SIZE");
}

/// Parses the command line. Returns -1 to go on, else the status to exit with: 0 after --help, 2
/// after a usage error (CLI11 has printed which option and why).
inline int parse_args(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
}

}  // namespace cli

// `tbverbs-emu trace FILE`: a trace file as a per-QP timeline (trace_timeline.cpp).
#pragma once

#include <string>

namespace tbverbs_emu_cli {

/// Prints the emu-trace lines of `path` grouped by host, device and QP, each event with its time in
/// ms from the file's first event. Returns 0, or 1 (with a message on stderr) when the file cannot
/// be read, holds no trace line, or holds trace lines that do not parse.
int print_trace_timeline(const std::string& path);

} // namespace tbverbs_emu_cli

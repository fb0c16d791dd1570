/// @file chrono.hpp
/// std::chrono's clocks, durations and time points for the data-path headers. With libstdc++ it
/// includes <bits/chrono.h>, the part of <chrono> that defines them: since C++20 <chrono> also
/// pulls in <sstream> and the locale machinery for its formatting, which doubles the compile time
/// of the lean data-path header. Elsewhere, and when that file is absent,
/// it is <chrono> itself. Either way the names are std::chrono's own, so a translation unit that
/// also includes <chrono> sees one set of declarations.
#pragma once

#if defined(__GLIBCXX__) && __has_include(<bits/chrono.h>)
#include <bits/chrono.h>
#else
#include <chrono>
#endif

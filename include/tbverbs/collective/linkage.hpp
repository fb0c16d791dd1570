/// @file collective/linkage.hpp
/// How the collectives layer is compiled (docs/collectives.md, "Compile once").
///
/// **Header-only (the default).** `#include <tbverbs/collective.hpp>` and nothing else: every
/// translation unit that includes it gets the whole layer (the engine, the network, the side
/// channel) as inline code. Nothing to build or link; each such file costs seconds to compile.
///
/// **Compiled once.** Define `TBVERBS_COLLECTIVE_SEPARATE` in every translation unit of the
/// program (e.g. `target_compile_definitions(app PRIVATE TBVERBS_COLLECTIVE_SEPARATE)`): then
/// `<tbverbs/collective.hpp>` declares the Communicator and its options and defines only the typed
/// entry points, and compiles about as fast as a plain file. Exactly one translation unit also
/// defines `TBVERBS_COLLECTIVE_IMPLEMENTATION` before including it, and holds the definitions
/// (CMake: tbverbs_add_collective_library() makes that library). Mixing the two modes in one
/// program is an error the linker may not catch: set the definition for the whole program.
#pragma once

#include "../config.hpp"

#if defined(TBVERBS_COLLECTIVE_SEPARATE) && !defined(TBVERBS_COLLECTIVE_IMPLEMENTATION)
/// 1 where this translation unit holds the collectives layer's definitions: header-only, or the
/// one implementation file of a TBVERBS_COLLECTIVE_SEPARATE program.
#define TBVERBS_COLLECTIVE_DEFINITIONS 0
#else
/// 1 where this translation unit holds the collectives layer's definitions: header-only, or the
/// one implementation file of a TBVERBS_COLLECTIVE_SEPARATE program.
#define TBVERBS_COLLECTIVE_DEFINITIONS 1
#endif

#if defined(TBVERBS_COLLECTIVE_SEPARATE)
/// What precedes an out-of-line definition of the collectives layer: `inline` header-only, nothing
/// in the one implementation file of a TBVERBS_COLLECTIVE_SEPARATE program.
#define TBVERBS_COLLECTIVE_DEF
#else
/// What precedes an out-of-line definition of the collectives layer: `inline` header-only, nothing
/// in the one implementation file of a TBVERBS_COLLECTIVE_SEPARATE program.
#define TBVERBS_COLLECTIVE_DEF inline
#endif

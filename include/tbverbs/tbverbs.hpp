/// @file tbverbs.hpp
/// The umbrella header: the whole core library (the optional side channel and link headers are
/// included separately).
#pragma once

#include "async_event.hpp"
#include "completion_queue.hpp"
#include "config.hpp"
#include "context.hpp"
#include "data_path.hpp"
#include "device.hpp"
#include "diagnosis.hpp"
#include "endpoint.hpp"
#include "error.hpp"
#include "format.hpp"
#include "gid.hpp"
#include "loader.hpp"
#include "memory_region.hpp"
#include "memory_region_set.hpp"
#include "message_size.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"
#include "recipe.hpp"
#include "result.hpp"
#include "types.hpp"
#include "work_request.hpp"

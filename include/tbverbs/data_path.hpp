/// @file data_path.hpp
/// The lean header for code on the data path: connected queue pairs (post_send, post_recv, the
/// typed work requests and chains), completion queues (poll, wait) and Error/Result. It leaves
/// out the loader, the device list, GID tables, recipes, endpoints and the optional connection
/// layer, so translation units that only post and poll compile fast (at
/// most 0.3 s with g++ 12 -fsyntax-only). Objects are still made with the full headers
/// (tbverbs.hpp) in the translation unit that sets the connection up.
#pragma once

#include "completion_queue.hpp"
#include "config.hpp"
#include "error.hpp"
#include "queue_pair.hpp"
#include "result.hpp"
#include "work_request.hpp"

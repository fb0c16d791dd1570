#include <tbverbs/data_path.hpp>

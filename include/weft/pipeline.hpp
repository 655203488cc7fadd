#pragma once
// weft::pipeline: pipeline schedules as data (schedule.hpp), their generators
// (generators.hpp), validation (validate.hpp) and statistics (stats.hpp). Host C++20 only.
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stats.hpp>
#include <weft/pipeline/validate.hpp>

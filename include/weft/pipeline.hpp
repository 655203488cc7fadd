#pragma once
// weft::pipeline: pipeline schedules as data (schedule.hpp), their generators
// (generators.hpp), validation (validate.hpp), statistics (stats.hpp) and the executor that
// runs them over a communicator (executor.hpp). Host C++20 only.
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/layout.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stats.hpp>
#include <weft/pipeline/validate.hpp>

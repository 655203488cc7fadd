// The precompiled header of weft's host tests (WEFT_PRECOMPILE_HEADERS, on by default with clang):
// GoogleTest and the standard headers that weft includes, parsed once per flag set instead of once
// per test. No weft header belongs here, so that a macro a test defines before it includes a weft
// header still reaches that header. The standard headers here could hide a weft header that lacks
// one of them; the plain GCC build (scripts/test) compiles the tests as they are written.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <numeric>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

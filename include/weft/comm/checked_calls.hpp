#pragma once
// weft::checked_calls<Comm>: a communicator whose every collective is first compared across
// its ranks (operation, algorithm, count, element type, operator, root), as
// WEFT_CHECK_CALLS=1 does for the whole process, but chosen in code and for one communicator.
// A mismatch is a weft::error on every rank, before any of the call's data moves, naming
// which ranks disagree and how:
//
//   weft::local::run(4, [](weft::local::communicator& c) {
//     weft::checked_calls checked(std::move(c));
//     weft::all_reduce(checked, std::span(grad));   // "rank 2 differs from rank 0 in count: ..."
//   });
//
// The check costs one small gather and scatter through rank 0 per call: for debugging, or for
// the few calls whose arguments come from data. It owns the communicator it wraps and models
// the concepts that one does, taking the path it takes (detail/forwarding_communicator.hpp);
// split() gives a checked child.
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/forwarding_communicator.hpp>

#include <utility>

namespace weft {

template <communicator Comm>
class checked_calls : public detail::forwarding_communicator<checked_calls<Comm>, Comm> {
  using base = detail::forwarding_communicator<checked_calls<Comm>, Comm>;

public:
  explicit checked_calls(Comm comm) : base(std::move(comm)) {}

  /// What the dispatch asks before every collective (detail::check_calls_enabled).
  [[nodiscard]] static constexpr bool check_calls() noexcept { return true; }

  [[nodiscard]] checked_calls split(int color, int key) {
    return checked_calls(this->inner().split(color, key));
  }
};

} // namespace weft

#pragma once
// Waiting without burning the cores: a rank that must wait polls briefly, then yields, then
// sleeps on its doorbell (a futex on Linux) in short slices, so it notices an abort or its
// deadline promptly. Whoever changes state another rank may be waiting on rings that rank's
// doorbell after the change. All ordering is carried by the atomics; the futex only sleeps.
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace weft::detail {

/// A non-owning reference to a callable of the given signature: keeps the code that calls it
/// (waiting on a condition, consuming a message) out of templates, so it is compiled once
/// rather than once per callable. It refers to the callable, which must outlive it.
template <class Signature>
class callable_ref;

// What a callable_ref<R(Args...)> may refer to: a callable of that signature, other than a
// callable_ref (which is copied, not wrapped).
template <class F, class Ref, class R, class... Args>
inline constexpr bool callable_ref_from =
    !std::is_same_v<std::remove_cvref_t<F>, Ref> &&
    std::is_invocable_r_v<R, const std::remove_reference_t<F>&, Args...>;

template <class R, class... Args>
class callable_ref<R(Args...)> {
public:
  template <class F, std::enable_if_t<callable_ref_from<F, callable_ref, R, Args...>, int> = 0>
  callable_ref(F&& f) noexcept // NOLINT(google-explicit-constructor): a reference, like a span
      : ctx_(&f), fn_([](const void* c, Args... args) -> R {
          return static_cast<R>(
              (*static_cast<const std::remove_reference_t<F>*>(c))(std::forward<Args>(args)...));
        }) {}
  R operator()(Args... args) const { return fn_(ctx_, std::forward<Args>(args)...); }

private:
  const void* ctx_;
  R (*fn_)(const void*, Args...);
};

using predicate_ref = callable_ref<bool()>;

class doorbell {
public:
  static constexpr std::chrono::microseconds yield_for{50};

  void ring() noexcept {
    bell_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) != 0) {
#if defined(__linux__)
      // Every sleeper: a rank may have two threads waiting here (its own and the progress
      // thread of an async communicator), and waking only one could leave the other a slice.
      syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell_), FUTEX_WAKE_PRIVATE, INT_MAX,
              nullptr, nullptr, 0);
#endif
    }
  }

  /// Waits until ready() holds; returns false if `until` passed first or give_up() held
  /// (both are checked at least every slice). It first polls `spins` times: worth it when
  /// every waiter has a core of its own; where ranks outnumber cores, a spinning waiter only
  /// delays the rank it waits for, so the caller passes 0 and the wait yields at once.
  bool wait(predicate_ref ready, predicate_ref give_up, std::chrono::steady_clock::time_point until,
            int spins = 64) {
    for (int i = 0; i < spins; ++i) {
      if (ready()) return true;
      pause();
    }
    // Yielding hands the core to another rank that is ready, which is what an oversubscribed
    // machine needs; past a short while the peer is likely busy for longer, so sleep.
    const auto yield_until = std::chrono::steady_clock::now() + yield_for;
    for (int i = 0;; ++i) {
      if (ready()) return true;
      std::this_thread::yield();
      if (i % 16 == 15 && std::chrono::steady_clock::now() >= yield_until) break;
    }
    constexpr auto slice = std::chrono::milliseconds(20);
    for (;;) {
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = bell_.load(std::memory_order_seq_cst);
      if (ready()) {
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        return true;
      }
      if (give_up()) {
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        return ready(); // what the peer did before giving cause to give up is visible now
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) {
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        return ready();
      }
      const auto left =
          until - now < slice ? until - now : std::chrono::steady_clock::duration(slice);
      sleep(seen, left);
      sleeping_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

private:
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  void sleep(std::uint32_t seen, std::chrono::steady_clock::duration d) {
#if defined(__linux__)
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell_), FUTEX_WAIT_PRIVATE, seen, &ts,
            nullptr, 0);
#else
    (void)seen;
    std::this_thread::sleep_for(
        d < std::chrono::microseconds(200) ? d : std::chrono::microseconds(200));
#endif
  }

  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  alignas(64) std::atomic<std::uint32_t> bell_{0};
  std::atomic<std::uint32_t> sleeping_{0};
};

} // namespace weft::detail

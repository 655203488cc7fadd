// Loaded with LD_PRELOAD by the thread-start test: pthread_create fails with EAGAIN (as it does
// under a process's thread limit) once WEFT_FAIL_THREADS_AFTER threads have been made.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*),
                              void* arg) {
  using create_fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static std::atomic<int> made{0};
  const char* limit = std::getenv("WEFT_FAIL_THREADS_AFTER");
  if (limit != nullptr && made.fetch_add(1) >= std::atoi(limit)) return EAGAIN;
  void* next = dlsym(RTLD_NEXT, "pthread_create");
  create_fn real = nullptr;
  std::memcpy(&real, &next, sizeof real); // a data pointer to a function pointer, without a cast
  return real(thread, attr, start, arg);
}

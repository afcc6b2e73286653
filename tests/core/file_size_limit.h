// Injected write failures for the disk-full tests: while a FileSizeLimit lives, every write that would take a file
// past `bytes` fails with EFBIG, as a full disk fails with ENOSPC, through the same write() path (no mount, no
// privileges). The limit applies to the whole process; SIGXFSZ is ignored meanwhile so that the write returns the
// error instead of the signal killing the test.
#pragma once

#include <signal.h>
#include <sys/resource.h>

namespace vlatune::test {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  sighandler_t old_handler_;
};

}  // namespace vlatune::test

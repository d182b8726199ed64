// stop: the signal handlers (flag, one write, _exit on a second signal), the action and
// heartbeat ct_stop_poll runs on the watching thread.
#include "stop.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs.h"

static volatile sig_atomic_t sig_;
static char say_[512];
static size_t say_len_;
static void (*on_stop_)(int, void *);
static void *stop_ctx_;
static void (*beat_)(void *, const char *, long, long);
static void *beat_ctx_;
static double last_beat_;
static _Thread_local bool watcher_;  // the thread that installed the watch (ct_stop_poll acts there only)

// Async-signal-safe: one atomic exchange (two signals on two threads cannot both be
// "first"), write(2) and _exit only, errno kept for the code the signal interrupted.
static void on_signal(int sig) {
  int saved = errno;
  if (__atomic_exchange_n(&sig_, sig, __ATOMIC_SEQ_CST)) {  // a second signal: now
    static const char now[] = "ctune: stopped at once (second signal)\n";
    if (say_len_) (void)!write(2, now, sizeof now - 1);
    _exit(128 + sig);
  }
  if (say_len_) (void)!write(2, say_, say_len_);
  errno = saved;
}

void ct_stop_watch(void (*on_stop)(int sig, void *ctx), void *ctx, const char *say) {
  on_stop_ = on_stop;
  stop_ctx_ = ctx;
  say_len_ = 0;
  if (say) {
    size_t n = strlen(say);
    if (n > sizeof say_ - 2) n = sizeof say_ - 2;
    memcpy(say_, say, n);
    say_[n] = '\n';
    say_len_ = n + 1;
  }
  watcher_ = true;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;  // slow system calls resume (a stop waits for the next ct_stop_poll)
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);  // one handler at a time on a thread
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int ct_stop_signal(void) { return sig_; }

void ct_stop_heartbeat(void (*beat)(void *ctx, const char *what, long done, long total), void *ctx) {
  beat_ = beat;
  beat_ctx_ = ctx;
}

void ct_stop_poll(const char *what, long done, long total) {
  if (!watcher_) return;
  if (sig_ && on_stop_) {
    void (*f)(int, void *) = on_stop_;
    on_stop_ = NULL;  // (once)
    f(sig_, stop_ctx_);
  }
  if (!beat_) return;
  double now = ct_now();
  if (now - last_beat_ < 0.25) return;
  last_beat_ = now;
  beat_(beat_ctx_, what, done, total);
}

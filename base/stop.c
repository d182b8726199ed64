// stop: the signal handlers (flag, one write, _exit on a second signal), the action and
// heartbeat ct_poll runs on the watching thread.
#include "stop.h"

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
static _Thread_local bool watcher_;  // the thread that installed the watch (ct_poll acts there only)

static void on_signal(int sig) {
  if (sig_) {  // a second signal: now
    static const char now[] = "ctune: stopped at once (second signal)\n";
    if (say_len_) (void)!write(2, now, sizeof now - 1);
    _exit(128 + sig);
  }
  sig_ = sig;
  if (say_len_) (void)!write(2, say_, say_len_);
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
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int ct_stop_signal(void) { return sig_; }

void ct_stop_heartbeat(void (*beat)(void *ctx, const char *what, long done, long total), void *ctx) {
  beat_ = beat;
  beat_ctx_ = ctx;
}

void ct_poll(const char *what, long done, long total) {
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

// stop: what long loops poll. A program that wants SIGINT and SIGTERM to stop it within
// seconds installs ct_stop_watch with what a stop does (its action, which exits). The
// first signal prints the program's line at once (from the handler: "stopping: ...");
// the next ct_stop_poll on the thread that installed the watch runs the action; a second
// signal exits at once (128 + the signal). The loops that can run for minutes (a layer
// of a forward or backward pass, a decode step, a reward request) call ct_stop_poll between
// units of work; it also runs the program's heartbeat (its progress line within a long
// step) at most 4 times a second. Without a watch, ct_stop_poll does nothing.
#pragma once
#include <stdbool.h>

// Installs the handlers. on_stop(sig, ctx) must not return (it exits, 128 + sig). `say`
// (the handler's line for a first signal, NULL for none: other MPI ranks) is copied.
void ct_stop_watch(void (*on_stop)(int sig, void *ctx), void *ctx, const char *say);
// 0, or the signal that asked for a stop.
int ct_stop_signal(void);
// The heartbeat: beat(ctx, what, done, total), from ct_stop_poll, at most 4 times a second; NULL
// removes it.
void ct_stop_heartbeat(void (*beat)(void *ctx, const char *what, long done, long total), void *ctx);
// Runs the stop action once a stop was asked for, else the heartbeat when due. `what`
// ("forward, layer"; NULL: nothing to add), done of total (0: no total) say where the loop is.
void ct_stop_poll(const char *what, long done, long total);

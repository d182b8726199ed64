// watch: a trainer's signal watch (the train state's log and position say where it stopped).
#pragma once
#include "train.h"

// ct_train_watch_signals (before anything long: DPO's reference pass, the loop) makes SIGINT
// and SIGTERM stop the run within seconds: "stopping: ..." at once, then at the next
// ct_stop_poll (every layer of a pass, decode step, reward request; ct_train_after_step
// polls too) the step in flight is abandoned, nothing is saved, and the process exits
// 130 / 143 naming the checkpoint to resume from; a second signal exits at once. It also
// keeps the log alive within a long step (ct_log_beat).
void ct_train_watch_signals(ct_train *tr);

// args: an executable's key=VALUE arguments, read one key at a time, for the commands that
// take no config file (bin/sampler bench, ctune-bench, ctune-ckpt).
#pragma once

// The VALUE of the first argv[i] (1 <= i < argc) that reads "key=VALUE", or def.
const char *ct_args_str(int argc, char **argv, const char *key, const char *def);
// The same VALUE as a whole number (atol), or def.
long ct_args_long(int argc, char **argv, const char *key, long def);

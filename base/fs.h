// fs: files and paths — whole-file reads, path joins that are an error (never a cut-short
// path) when they do not fit, mkdir -p, recursive removal, fsync, atomic publication of
// a file, and the monotonic clock. The ground floor: needs only error.h.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CT_PATH_MAX 4096

// Reads a whole file (tokenizer files, templates, texts) into *out: malloc'd,
// NUL-terminated, *len bytes before the NUL. When missing is not NULL a file that does
// not exist is no error: *missing is set and *out is NULL. Returns 0, CT_EIO or
// CT_ENOMEM (ct_last_error names the path).
int ct_read_file(const char *path, char **out, size_t *len, bool *missing);

// out = dir + "/" + name; an error (not a silently cut path) when it does not fit.
int ct_path_join(char *out, size_t size, const char *dir, const char *name);
// Whether dir/name exists and is readable (false for a path too long to join).
bool ct_path_has_file(const char *dir, const char *name);
// mkdir -p
int ct_mkdirs(const char *path);
// Recursively removes a directory tree (or a file); a missing path is no error.
int ct_remove_tree(const char *path);
// fsync of a file, or of a directory (dir = true) after entries changed in it.
int ct_fsync_path(const char *path, bool dir);
// Atomically replaces dir/name with the file tmp_path (fsync, rename, fsync of dir).
int ct_publish_file(const char *tmp_path, const char *dir, const char *name);

// 0 when the filesystem holding dir has `bytes` free for this user (statvfs's f_bavail);
// else CT_EIO, "dir: No space left on device (N MB free, `what` needs M MB)", before
// anything is written. CT_DISK_FREE_MB (a test hook) stands in for the free space.
int ct_disk_room(const char *dir, double bytes, const char *what);

// A file's checksum: XXH64 chained over 4 MiB blocks (each block's seed is the hash so
// far), and its size in bytes.
int ct_file_checksum(const char *path, uint64_t *hash, long *size);

double ct_now(void);  // monotonic seconds

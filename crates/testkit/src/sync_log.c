/* A power-loss recorder for fault-matrix row P7, loaded into docket with
 * LD_PRELOAD by crates/testkit/src/power_loss.rs. Before each fsync(2) or
 * fdatasync(2) it appends "PATH<TAB>SIZE<TAB>INODE" to the file named by
 * DOCKET_SYNC_LOG: the size the file has as its sync starts, and its inode
 * (which tells a WAL that SQLite deleted and made again from the old one).
 * After a SIGKILL, a test cuts every SQLite -wal file back to the last size
 * synced of that very file,
 * which is what a power loss at that moment could leave on disk (LazyFS's
 * "lose unfsynced writes", for an append-only file).
 *
 * The size is written before the real sync: a kill during the sync counts
 * it as done. That can only keep bytes, never lose synced ones, so it never
 * makes a durable write look lost. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void note(int fd) {
    const char *log = getenv("DOCKET_SYNC_LOG");
    if (!log) return;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    int out = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (out < 0) return;
    /* One write(2) per line: O_APPEND keeps lines from threads whole. */
    char line[4200];
    int len = snprintf(line, sizeof line, "%s\t%lld\t%llu\n", path, (long long)st.st_size,
                       (unsigned long long)st.st_ino);
    if (len > 0 && len < (int)sizeof line) {
        ssize_t w = write(out, line, (size_t)len);
        (void)w;
    }
    close(out);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    note(fd);
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    note(fd);
    return real(fd);
}

/* Fault-matrix row D4 without a network mount: preloaded into docket, it
 * makes statfs(2) report an NFS filesystem (NFS_SUPER_MAGIC) for every path
 * under DOCKET_FAKE_NFS (a folder), and the real answer for the rest. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>

#define NFS_SUPER_MAGIC 0x6969

static int under_fake(const char *path) {
    const char *root = getenv("DOCKET_FAKE_NFS");
    size_t n;
    if (!root || !*root || !path) return 0;
    n = strlen(root);
    return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

int statfs(const char *path, struct statfs *buf) {
    static int (*real)(const char *, struct statfs *);
    int rc;
    if (!real) real = (int (*)(const char *, struct statfs *))dlsym(RTLD_NEXT, "statfs");
    rc = real(path, buf);
    if (rc == 0 && under_fake(path)) buf->f_type = NFS_SUPER_MAGIC;
    return rc;
}

int statfs64(const char *path, struct statfs64 *buf) {
    static int (*real)(const char *, struct statfs64 *);
    int rc;
    if (!real) real = (int (*)(const char *, struct statfs64 *))dlsym(RTLD_NEXT, "statfs64");
    rc = real(path, buf);
    if (rc == 0 && under_fake(path)) buf->f_type = NFS_SUPER_MAGIC;
    return rc;
}

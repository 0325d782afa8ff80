/* A power-loss model for chosen files, loaded with LD_PRELOAD (tests/support/powerloss.py builds it).
 *
 * Theory of operation: for every file it tracks, the shim keeps a *shadow* copy holding what
 * a disk would still have after the power went out: the bytes that were made durable. Writes
 * go through to the real file unchanged (so the process, and LMDB's read-only map of the
 * file, see them at once, as with a real page cache), and the shim remembers which ranges
 * are dirty. Only a durability point copies them into the shadow:
 *   - fsync / fdatasync of the file (every dirty range, and the file's size);
 *   - a write through a descriptor opened with O_DSYNC or O_SYNC (that write's range);
 *   - msync(MS_SYNC), sync, syncfs (every tracked file that has a shared writable map is
 *     copied whole, since writes through a map are not seen one by one).
 * A process killed at any moment leaves the shadow as the power-loss image; the test puts
 * it in place of the real file (tests/support/powerloss.py `cut_power`). The shadow survives the
 * process (it is a plain file), so a later process opened on the cut image goes on from it.
 *
 * Which files: NEREUS_POWERLOSS_SHADOWS names a directory for the shadows; a file opened for
 * writing whose base name matches a pattern of NEREUS_POWERLOSS_NAMES (colon-separated
 * fnmatch patterns, default data.mdb) is tracked, its shadow named after its absolute path.
 * A shadow made at the first open copies the file as it is then (what was there before this
 * process is taken as durable).
 *
 * Names: a rename of a tracked file changes what the process sees at once, but the disk
 * keeps the old name until the directory holding the new one is fsynced (or sync, syncfs):
 * only then is the shadow renamed too, replacing any shadow of the new name. So the shadow
 * directory always holds each file under its durable name, with its durable bytes; a rename
 * made durable before the bytes were (no fsync of the file first) leaves the new name with
 * whatever the shadow holds, an empty or partial file, as a real file system may.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FILES 256
#define MAX_FDS 65536
#define MAX_RENAMES 256

struct range {
    off_t off;
    off_t len;
};

struct tracked {
    char path[PATH_MAX];    /* its name as the process sees it */
    char durable[PATH_MAX]; /* its name on disk after a power loss (its shadow's name) */
    int read_fd;   /* the real file, for copying durable bytes out of it */
    int shadow_fd; /* the power-loss image */
    int mapped_writable;
    struct range *dirty;
    size_t n, cap;
};

static struct tracked files[MAX_FILES];
static int nfiles;
struct pending_rename {
    int file; /* index into files */
    char to[PATH_MAX];
};
static struct pending_rename renames[MAX_RENAMES];
static int nrenames;
static int fd_file[MAX_FDS]; /* 1 + index into files; 0: untracked */
static char fd_sync[MAX_FDS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_msync)(void *, size_t, int);
static void (*real_sync)(void);
static int (*real_syncfs)(int);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off_t);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned int);

static char shadow_dir[PATH_MAX];
static char names[1024] = "data.mdb";

static void init(void) {
    real_open = dlsym(RTLD_NEXT, "open");
    real_open64 = dlsym(RTLD_NEXT, "open64");
    real_openat = dlsym(RTLD_NEXT, "openat");
    real_close = dlsym(RTLD_NEXT, "close");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_pwritev = dlsym(RTLD_NEXT, "pwritev");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_msync = dlsym(RTLD_NEXT, "msync");
    real_sync = dlsym(RTLD_NEXT, "sync");
    real_syncfs = dlsym(RTLD_NEXT, "syncfs");
    real_mmap = dlsym(RTLD_NEXT, "mmap");
    real_mmap64 = dlsym(RTLD_NEXT, "mmap64");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    real_renameat2 = dlsym(RTLD_NEXT, "renameat2");
    const char *dir = getenv("NEREUS_POWERLOSS_SHADOWS");
    if (dir != NULL) snprintf(shadow_dir, sizeof shadow_dir, "%s", dir);
    const char *n = getenv("NEREUS_POWERLOSS_NAMES");
    if (n != NULL) snprintf(names, sizeof names, "%s", n);
}

static void ensure_init(void) { pthread_once(&once, init); }

static void die(const char *what) {
    /* A power-loss model that cannot keep its promise must not pass quietly. */
    fprintf(stderr, "powerloss shim: %s: %s\n", what, strerror(errno));
    abort();
}

static int wanted(const char *path) {
    if (shadow_dir[0] == '\0') return 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *p = names;
    while (*p) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char pattern[256];
        if (len >= sizeof pattern) die("a name pattern of 256 bytes or more");
        memcpy(pattern, p, len);
        pattern[len] = '\0';
        if (fnmatch(pattern, base, 0) == 0) return 1;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static void absolute(const char *path, char *out) {
    if (path[0] == '/') {
        snprintf(out, PATH_MAX, "%s", path);
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL) die("getcwd");
        snprintf(out, PATH_MAX, "%s/%s", cwd, path);
    }
}

/* `path` absolute, its directory resolved as realpath(3) would (the file may not exist):
 * the form a synced directory's /proc/self/fd link takes, and Path.resolve()'s. */
static void resolved(const char *path, char *out) {
    char abs[PATH_MAX], dir[PATH_MAX], real[PATH_MAX];
    absolute(path, abs);
    char *slash = strrchr(abs, '/');
    size_t dlen = (size_t)(slash - abs);
    memcpy(dir, abs, dlen);
    dir[dlen] = '\0';
    if (realpath(dlen ? dir : "/", real) == NULL) {
        snprintf(out, PATH_MAX, "%s", abs);
        return;
    }
    snprintf(out, PATH_MAX, "%s/%s", strcmp(real, "/") == 0 ? "" : real, slash + 1);
}

/* The shadow of the file whose durable name is `abs`. */
static void shadow_name(const char *abs, char *out, size_t size) {
    char mangled[PATH_MAX];
    size_t j = 0;
    for (const char *c = abs; *c && j + 1 < sizeof mangled; c++) mangled[j++] = *c == '/' ? '%' : *c;
    mangled[j] = '\0';
    snprintf(out, size, "%s/%s", shadow_dir, mangled);
}

static void copy_range(struct tracked *t, off_t off, off_t len) {
    char buf[65536];
    while (len > 0) {
        size_t want = len < (off_t)sizeof buf ? (size_t)len : sizeof buf;
        ssize_t got = pread(t->read_fd, buf, want, off);
        if (got < 0) die("pread of the real file");
        if (got == 0) return; /* past the end: nothing there to keep */
        if (real_pwrite(t->shadow_fd, buf, (size_t)got, off) != got) die("shadow write");
        off += got;
        len -= got;
    }
}

static off_t real_size(struct tracked *t) {
    struct stat st;
    if (fstat(t->read_fd, &st) != 0) die("fstat");
    return st.st_size;
}

/* Everything written to `t` so far is durable now. */
static void flush(struct tracked *t) {
    off_t size = real_size(t);
    if (ftruncate(t->shadow_fd, size) != 0) die("shadow truncate");
    if (t->mapped_writable) {
        copy_range(t, 0, size);
    } else {
        for (size_t i = 0; i < t->n; i++) copy_range(t, t->dirty[i].off, t->dirty[i].len);
    }
    t->n = 0;
}

static void note_dirty(struct tracked *t, off_t off, off_t len) {
    if (len <= 0) return;
    if (t->n > 0) {
        struct range *last = &t->dirty[t->n - 1];
        if (off <= last->off + last->len && off + len >= last->off) {
            off_t start = off < last->off ? off : last->off;
            off_t end = off + len > last->off + last->len ? off + len : last->off + last->len;
            last->off = start;
            last->len = end - start;
            return;
        }
    }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->dirty = realloc(t->dirty, t->cap * sizeof *t->dirty);
        if (t->dirty == NULL) die("realloc");
    }
    t->dirty[t->n].off = off;
    t->dirty[t->n].len = len;
    t->n++;
}

static struct tracked *of(int fd) {
    if (fd < 0 || fd >= MAX_FDS || fd_file[fd] == 0) return NULL;
    return &files[fd_file[fd] - 1];
}

static void track(int fd, const char *path, int flags) {
    if (fd < 0 || fd >= MAX_FDS) return;
    if ((flags & O_ACCMODE) == O_RDONLY || !wanted(path)) return;
    char abs[PATH_MAX];
    resolved(path, abs);
    pthread_mutex_lock(&mu);
    int index = -1;
    for (int i = 0; i < nfiles; i++)
        if (strcmp(files[i].path, abs) == 0) index = i;
    if (index < 0) {
        if (nfiles == MAX_FILES) die("too many tracked files");
        struct tracked *t = &files[nfiles];
        memset(t, 0, sizeof *t);
        snprintf(t->path, sizeof t->path, "%s", abs);
        snprintf(t->durable, sizeof t->durable, "%s", abs);
        char shadow[PATH_MAX + 64];
        shadow_name(abs, shadow, sizeof shadow);
        t->read_fd = real_open(abs, O_RDONLY | O_CLOEXEC);
        if (t->read_fd < 0) die("open of the real file for reading");
        int existed = access(shadow, F_OK) == 0;
        t->shadow_fd = real_open(shadow, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (t->shadow_fd < 0) die("open of the shadow");
        if (!existed) {
            off_t size = real_size(t);
            copy_range(t, 0, size);
        }
        index = nfiles++;
    }
    fd_file[fd] = index + 1;
    fd_sync[fd] = (flags & O_DSYNC) != 0; /* O_SYNC includes O_DSYNC's bit */
    pthread_mutex_unlock(&mu);
}

static void wrote(int fd, off_t off, ssize_t len) {
    if (len <= 0) return;
    pthread_mutex_lock(&mu);
    struct tracked *t = of(fd);
    if (t != NULL) {
        if (fd_sync[fd]) {
            copy_range(t, off, len);
        } else {
            note_dirty(t, off, len);
        }
    }
    pthread_mutex_unlock(&mu);
}

static off_t position(int fd) {
    struct tracked *t;
    pthread_mutex_lock(&mu);
    t = of(fd);
    pthread_mutex_unlock(&mu);
    return t == NULL ? -1 : lseek(fd, 0, SEEK_CUR);
}

static int mode_of(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    ensure_init();
    va_list ap;
    va_start(ap, flags);
    int mode = mode_of(flags, ap);
    va_end(ap);
    int fd = real_open(path, flags, mode);
    track(fd, path, flags);
    return fd;
}

int open64(const char *path, int flags, ...) {
    ensure_init();
    va_list ap;
    va_start(ap, flags);
    int mode = mode_of(flags, ap);
    va_end(ap);
    int fd = real_open64(path, flags, mode);
    track(fd, path, flags);
    return fd;
}

int openat(int dirfd, const char *path, int flags, ...) {
    ensure_init();
    va_list ap;
    va_start(ap, flags);
    int mode = mode_of(flags, ap);
    va_end(ap);
    int fd = real_openat(dirfd, path, flags, mode);
    if (dirfd == AT_FDCWD || path[0] == '/') track(fd, path, flags);
    return fd;
}

int openat64(int dirfd, const char *path, int flags, ...) {
    ensure_init();
    va_list ap;
    va_start(ap, flags);
    int mode = mode_of(flags, ap);
    va_end(ap);
    int fd = real_openat(dirfd, path, flags, mode);
    if (dirfd == AT_FDCWD || path[0] == '/') track(fd, path, flags);
    return fd;
}

int close(int fd) {
    ensure_init();
    pthread_mutex_lock(&mu);
    if (fd >= 0 && fd < MAX_FDS) fd_file[fd] = 0; /* its dirty ranges stay dirty */
    pthread_mutex_unlock(&mu);
    return real_close(fd);
}

ssize_t write(int fd, const void *buf, size_t n) {
    ensure_init();
    off_t off = position(fd);
    ssize_t r = real_write(fd, buf, n);
    if (off >= 0) wrote(fd, off, r);
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    ensure_init();
    ssize_t r = real_pwrite(fd, buf, n, off);
    wrote(fd, off, r);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    ensure_init();
    ssize_t r = real_pwrite64(fd, buf, n, off);
    wrote(fd, off, r);
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    ensure_init();
    off_t off = position(fd);
    ssize_t r = real_writev(fd, iov, count);
    if (off >= 0) wrote(fd, off, r);
    return r;
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t off) {
    ensure_init();
    ssize_t r = real_pwritev(fd, iov, count, off);
    wrote(fd, off, r);
    return r;
}

static int synced(int fd, int r) {
    if (r == 0) {
        pthread_mutex_lock(&mu);
        struct tracked *t = of(fd);
        if (t != NULL) flush(t);
        pthread_mutex_unlock(&mu);
    }
    return r;
}

static void synced_directory(int fd);
static void commit_renames(const char *dir);

int fsync(int fd) {
    ensure_init();
    int r = synced(fd, real_fsync(fd));
    if (r == 0) synced_directory(fd);
    return r;
}

int fdatasync(int fd) {
    ensure_init();
    int r = synced(fd, real_fdatasync(fd));
    if (r == 0) synced_directory(fd);
    return r;
}

static void flush_mapped(void) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nfiles; i++)
        if (files[i].mapped_writable) flush(&files[i]);
    pthread_mutex_unlock(&mu);
}

int msync(void *addr, size_t len, int flags) {
    ensure_init();
    int r = real_msync(addr, len, flags);
    if (r == 0 && (flags & MS_SYNC)) flush_mapped();
    return r;
}

void sync(void) {
    ensure_init();
    real_sync();
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nfiles; i++) flush(&files[i]);
    commit_renames(NULL);
    pthread_mutex_unlock(&mu);
}

int syncfs(int fd) {
    ensure_init();
    int r = real_syncfs(fd);
    if (r == 0) {
        pthread_mutex_lock(&mu);
        for (int i = 0; i < nfiles; i++) flush(&files[i]);
        commit_renames(NULL);
        pthread_mutex_unlock(&mu);
    }
    return r;
}

static void mapped(int fd, int prot, int flags) {
    if ((prot & PROT_WRITE) && (flags & MAP_SHARED)) {
        pthread_mutex_lock(&mu);
        struct tracked *t = of(fd);
        if (t != NULL) t->mapped_writable = 1;
        pthread_mutex_unlock(&mu);
    }
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    ensure_init();
    mapped(fd, prot, flags);
    return real_mmap(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    ensure_init();
    mapped(fd, prot, flags);
    return real_mmap64(addr, len, prot, flags, fd, off);
}

/* Renames ------------------------------------------------------------------------------- */

/* A tracked file now goes by `to` in the process; on disk, once `to`'s directory is synced. */
static void renamed(const char *from, const char *to) {
    char abs_from[PATH_MAX], abs_to[PATH_MAX];
    resolved(from, abs_from);
    resolved(to, abs_to);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nfiles; i++) {
        if (strcmp(files[i].path, abs_from) != 0) continue;
        if (nrenames == MAX_RENAMES) die("too many renames waiting for a directory sync");
        snprintf(files[i].path, sizeof files[i].path, "%s", abs_to);
        renames[nrenames].file = i;
        snprintf(renames[nrenames].to, sizeof renames[nrenames].to, "%s", abs_to);
        nrenames++;
    }
    pthread_mutex_unlock(&mu);
}

/* The waiting renames into directory `dir` (every one if NULL) are durable now: each
 * shadow takes its file's new name, in the order the renames were made. Holds `mu`. */
static void commit_renames(const char *dir) {
    int kept = 0;
    for (int r = 0; r < nrenames; r++) {
        struct pending_rename *p = &renames[r];
        const char *slash = strrchr(p->to, '/');
        size_t dlen = slash ? (size_t)(slash - p->to) : 0;
        int here = dir == NULL || (strlen(dir) == dlen && strncmp(dir, p->to, dlen) == 0);
        if (!here) {
            renames[kept++] = *p;
            continue;
        }
        struct tracked *t = &files[p->file];
        char old_shadow[PATH_MAX + 64], new_shadow[PATH_MAX + 64];
        shadow_name(t->durable, old_shadow, sizeof old_shadow);
        shadow_name(p->to, new_shadow, sizeof new_shadow);
        if (real_rename(old_shadow, new_shadow) != 0) die("rename of a shadow");
        snprintf(t->durable, sizeof t->durable, "%s", p->to);
    }
    nrenames = kept;
}

static void synced_directory(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) return;
    char link[64], dir[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, dir, sizeof dir - 1);
    if (n < 0) die("readlink of a synced directory");
    dir[n] = '\0';
    pthread_mutex_lock(&mu);
    commit_renames(dir);
    pthread_mutex_unlock(&mu);
}

int rename(const char *from, const char *to) {
    ensure_init();
    int r = real_rename(from, to);
    if (r == 0) renamed(from, to);
    return r;
}

int renameat(int fromfd, const char *from, int tofd, const char *to) {
    ensure_init();
    int r = real_renameat(fromfd, from, tofd, to);
    int plain = (fromfd == AT_FDCWD || from[0] == '/') && (tofd == AT_FDCWD || to[0] == '/');
    if (r == 0 && plain) renamed(from, to);
    return r;
}

int renameat2(int fromfd, const char *from, int tofd, const char *to, unsigned int flags) {
    ensure_init();
    int r = real_renameat2(fromfd, from, tofd, to, flags);
    int plain = (fromfd == AT_FDCWD || from[0] == '/') && (tofd == AT_FDCWD || to[0] == '/');
    if (r == 0 && plain) renamed(from, to);
    return r;
}

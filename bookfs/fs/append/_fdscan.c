/* bookfs.fs._fdscan: the commit rule's descriptor scan (closer.py), in C.
 *
 * writable(tid) lists /proc/<tid>/fd, and reads /proc/<tid>/fdinfo/<fd> for each
 * descriptor whose link shows it open for writing; it returns the (inode, mount ID) of
 * each writable one, as a list of pairs; an OSError
 * if the table cannot be read.  The GIL is released for the whole scan: the daemon's
 * event loop goes on meanwhile.  closer._writable_py is the same scan in Python (the
 * fallback where this did not build); tests hold the two equal.
 *
 * The files read take only task_lock, the table's spinlock and RCU (fs/proc/fd.c:
 * seq_show, proc_readfd_common), never the task's exec, cred or mmap lock:
 * docs/reliability.md, "The commit rule".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The value after "key:\t" in an fdinfo text, or NULL. */
static const char *field(const char *text, const char *key)
{
    const char *p = text;
    size_t n = strlen(key);
    while (p && *p) {
        if (strncmp(p, key, n) == 0 && p[n] == ':')
            return p + n + 1;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return NULL;
}

struct found {
    unsigned long long ino;
    long mnt;
};

/* The number of writable descriptors put in *out (malloc'd, grown as needed; the caller
 * frees it), or -errno. */
static long scan(long tid, struct found **out)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/fdinfo", tid);
    int info_dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (info_dfd < 0)
        return -errno;
    snprintf(path, sizeof path, "/proc/%ld/fd", tid);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        close(info_dfd);
        return -e;
    }
    DIR *dir = fdopendir(dfd);
    if (!dir) {
        int e = errno;
        close(dfd);
        close(info_dfd);
        return -e;
    }
    long count = 0, room = 0;
    struct dirent *d;
    char buf[4096];
    *out = NULL;
    while ((d = readdir(dir)) != NULL) {
        if (d->d_name[0] < '0' || d->d_name[0] > '9')
            continue;
        /* the link's mode has S_IWUSR exactly for a descriptor open for writing
         * (fs/proc/fd.c, tid_fd_update_inode): one cheap look before fdinfo */
        struct stat st;
        if (fstatat(dfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !(st.st_mode & S_IWUSR))
            continue;
        int fd = openat(info_dfd, d->d_name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* closed meanwhile by another thread of the task */
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
            continue; /* ENOENT: closed between open and read */
        buf[n] = '\0';
        const char *f_ino = field(buf, "ino"), *f_flags = field(buf, "flags");
        const char *f_mnt = field(buf, "mnt_id");
        if (!f_ino || !f_flags || !f_mnt)
            continue;
        long flags = strtol(f_flags, NULL, 8);
        if ((flags & O_ACCMODE) != O_WRONLY && (flags & O_ACCMODE) != O_RDWR)
            continue;
        if (count == room) {
            room = room ? 2 * room : 64;
            struct found *more = realloc(*out, room * sizeof **out);
            if (!more) {
                closedir(dir);
                close(info_dfd);
                return -ENOMEM;
            }
            *out = more;
        }
        (*out)[count].ino = strtoull(f_ino, NULL, 10);
        (*out)[count].mnt = strtol(f_mnt, NULL, 10);
        count++;
    }
    closedir(dir);
    close(info_dfd);
    return count;
}

static PyObject *writable(PyObject *self, PyObject *args)
{
    long tid, n;
    struct found *found = NULL;
    if (!PyArg_ParseTuple(args, "l", &tid))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    n = scan(tid, &found);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        free(found);
        errno = (int)-n;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *list = PyList_New(n);
    for (long i = 0; list && i < n; i++) {
        PyObject *pair = Py_BuildValue("(Kl)", found[i].ino, found[i].mnt);
        if (!pair) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, pair);
    }
    free(found);
    return list;
}

static PyMethodDef methods[] = {
    {"writable", writable, METH_VARARGS,
     "writable(tid) -> [(inode, mount ID)] of the writable descriptors in task tid's "
     "table"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fdscan",
    "The commit rule's descriptor scan in C (see closer.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__fdscan(void)
{
    return PyModule_Create(&module);
}

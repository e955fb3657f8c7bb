/* bookfs.fs._fdscan: the commit rule's descriptor scan (closer.py), in C.
 *
 * holds(tid, ino) reads /proc/<tid>/fdinfo/<fd> for every descriptor of task tid's
 * table and returns the mount ID of the first writable one whose inode number is ino,
 * or -1 if none is; an OSError if the table cannot be read.  The GIL is released for the
 * whole scan: the daemon's event loop goes on meanwhile.  closer._holds is the same scan
 * in Python (the fallback where this did not build); tests hold the two equal.
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

/* 0 and *mnt set if found, 1 if not found, -errno on error. */
static int scan(long tid, unsigned long long ino, long *mnt)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/fdinfo", tid);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    DIR *dir = fdopendir(dfd);
    if (!dir) {
        int e = errno;
        close(dfd);
        return -e;
    }
    int result = 1;
    struct dirent *d;
    char buf[4096];
    while ((d = readdir(dir)) != NULL) {
        if (d->d_name[0] < '0' || d->d_name[0] > '9')
            continue;
        int fd = openat(dfd, d->d_name, O_RDONLY | O_CLOEXEC);
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
        if (strtoull(f_ino, NULL, 10) != ino)
            continue;
        long flags = strtol(f_flags, NULL, 8);
        if ((flags & O_ACCMODE) != O_WRONLY && (flags & O_ACCMODE) != O_RDWR)
            continue;
        *mnt = strtol(f_mnt, NULL, 10);
        result = 0;
        break;
    }
    closedir(dir);
    return result;
}

static PyObject *holds(PyObject *self, PyObject *args)
{
    long tid;
    unsigned long long ino;
    long mnt = -1;
    int r;
    if (!PyArg_ParseTuple(args, "lK", &tid, &ino))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    r = scan(tid, ino, &mnt);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        errno = -r;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(r == 0 ? mnt : -1);
}

static PyMethodDef methods[] = {
    {"holds", holds, METH_VARARGS,
     "holds(tid, ino) -> the mount ID of a writable descriptor of inode ino in task "
     "tid's table, or -1"},
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

/* The frontend's socket calls in C: one call a message in or out instead of one a frame.

   The frontend receives each request as 3-5 frames and sends each reply as
   4-6, and pyzmq makes every frame a Python call, a Frame object and a
   flags check; on the 2-core box those calls were a large part of the
   Python the daemon spends around the bare loop's work (docs/performance.md).
   This module does the same libzmq calls from C, on the socket pyzmq made:

     load(libzmq_path, Again, ZMQError)  once, before anything else: -> libzmq's version
     recv(handle, big) -> (frames, fd)   the next message, without waiting
     send(handle, frames)                queue a message, without waiting
     waiting(handle) -> bool             a message is ready to receive

   `handle` is the socket's `underlying` address. It never links libzmq: the
   calls are looked up in the library pyzmq loaded (wire.py finds its path),
   since a socket must only ever be used through the library that made it,
   and pyzmq's wheels carry their own. Errors are raised as pyzmq's own
   exceptions, so callers see what pyzmq's calls raise. Every call runs on
   the frontend thread with the interpreter lock held: none of them waits. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <string.h>

typedef struct { unsigned char opaque[64]; } zmq_msg_t;  /* libzmq's stable ABI: 64 opaque bytes */

enum { ZMQ_DONTWAIT = 1, ZMQ_SNDMORE = 2, ZMQ_EVENTS = 15, ZMQ_POLLIN = 1, ZMQ_SRCFD = 2, MAX_FRAMES = 64 };

static struct {
    int (*msg_init)(zmq_msg_t *);
    int (*msg_recv)(zmq_msg_t *, void *, int);
    int (*msg_close)(zmq_msg_t *);
    void *(*msg_data)(zmq_msg_t *);
    size_t (*msg_size)(const zmq_msg_t *);
    int (*msg_more)(const zmq_msg_t *);
    int (*msg_get)(const zmq_msg_t *, int);
    int (*send)(void *, const void *, size_t, int);
    int (*getsockopt)(void *, int, void *, size_t *);
    int (*errno_)(void);
    void (*version)(int *, int *, int *);
} zmq;

static PyObject *Again, *ZMQError;

/* A received frame kept in libzmq's buffer: what a memoryview of a large frame looks into. */
typedef struct {
    PyObject_HEAD
    zmq_msg_t msg;
} Frame;

static void frame_dealloc(Frame *self) {
    zmq.msg_close(&self->msg);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Writable, as pyzmq's Frame.buffer is: the message is this frame's alone, and code below the
   frontend may work on a large input in place. */
static int frame_getbuffer(Frame *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, zmq.msg_data(&self->msg), (Py_ssize_t)zmq.msg_size(&self->msg),
                             0, flags);
}

static PyBufferProcs frame_buffer = {(getbufferproc)frame_getbuffer, NULL};

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infermux.transport._wire.Frame",
    .tp_basicsize = sizeof(Frame),
    .tp_dealloc = (destructor)frame_dealloc,
    .tp_as_buffer = &frame_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a received frame, held in libzmq's buffer",
};

/* Raise what pyzmq raises for the error libzmq reports now: zmq.Again for EAGAIN, else ZMQError(errno). */
static PyObject *zmq_error(void) {
    int err = zmq.errno_();
    PyObject *exc = PyObject_CallFunction(err == EAGAIN ? Again : ZMQError, "i", err);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* After a call failed: 1 to make it again, for a signal that interrupted it (its Python handler has
   run, as pyzmq runs it before retrying: the daemon's SIGHUP lands in the middle of these calls);
   0 for any other failure, and for a handler that raised (its exception is set). libzmq interrupted
   in a frame's call has not taken that frame, so the same call again goes on with the same message. */
static int interrupted(void) {
    return zmq.errno_() == EINTR && PyErr_CheckSignals() == 0;
}

static int loaded(void) {
    if (zmq.msg_recv)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "infermux.transport._wire: load() was not called");
    return 0;
}

static void *handle_of(PyObject *arg) {
    return PyLong_AsVoidPtr(arg);
}

static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *again, *error;
    if (!PyArg_ParseTuple(args, "sOO", &path, &again, &error))
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  /* only the library already loaded: never a second copy */
    if (!lib)
        return PyErr_Format(PyExc_OSError, "%s is not loaded in this process: %s", path, dlerror());
#define FIND(field, symbol)                                                            \
    if (!(*(void **)&zmq.field = dlsym(lib, symbol))) {                                \
        memset(&zmq, 0, sizeof zmq);                                                   \
        return PyErr_Format(PyExc_OSError, "%s has no %s", path, symbol);             \
    }
    FIND(msg_init, "zmq_msg_init");
    FIND(msg_close, "zmq_msg_close");
    FIND(msg_data, "zmq_msg_data");
    FIND(msg_size, "zmq_msg_size");
    FIND(msg_more, "zmq_msg_more");
    FIND(msg_get, "zmq_msg_get");
    FIND(send, "zmq_send");
    FIND(getsockopt, "zmq_getsockopt");
    FIND(errno_, "zmq_errno");
    FIND(version, "zmq_version");
    FIND(msg_recv, "zmq_msg_recv");  /* last: loaded() reads it as "every call was found" */
#undef FIND
    Py_XSETREF(Again, Py_NewRef(again));
    Py_XSETREF(ZMQError, Py_NewRef(error));
    int major, minor, patch;
    zmq.version(&major, &minor, &patch);
    return Py_BuildValue("(iii)", major, minor, patch);
}

/* One frame as Python sees it: bytes (copied) under `big` bytes, else a memoryview into libzmq's buffer. */
static PyObject *as_python(zmq_msg_t *msg, Py_ssize_t big) {
    Py_ssize_t size = (Py_ssize_t)zmq.msg_size(msg);
    if (size < big) {
        PyObject *copy = PyBytes_FromStringAndSize(zmq.msg_data(msg), size);
        zmq.msg_close(msg);
        return copy;
    }
    Frame *frame = PyObject_New(Frame, &FrameType);
    if (!frame) {
        zmq.msg_close(msg);
        return NULL;
    }
    memcpy(&frame->msg, msg, sizeof *msg);  /* the Frame owns the message from here */
    PyObject *view = PyMemoryView_FromObject((PyObject *)frame);
    Py_DECREF(frame);
    return view;
}

static PyObject *recv(PyObject *self, PyObject *args) {
    PyObject *handle;
    Py_ssize_t big;
    if (!PyArg_ParseTuple(args, "On", &handle, &big) || !loaded())
        return NULL;
    void *sock = handle_of(handle);
    if (!sock && PyErr_Occurred())
        return NULL;
    PyObject *frames = PyList_New(0);
    if (!frames)
        return NULL;
    int more = 1, fd = -1;
    while (more) {
        zmq_msg_t msg;
        zmq.msg_init(&msg);
        int rc;
        while ((rc = zmq.msg_recv(&msg, sock, ZMQ_DONTWAIT)) < 0 && interrupted())
            ;
        if (rc < 0) {
            zmq.msg_close(&msg);
            Py_DECREF(frames);
            return PyErr_Occurred() ? NULL : zmq_error();  /* only the first frame can be missing: a message arrives whole */
        }
        more = zmq.msg_more(&msg);
        if (!more)
            fd = zmq.msg_get(&msg, ZMQ_SRCFD);  /* -1 where libzmq keeps none (inproc) */
        PyObject *frame = as_python(&msg, big);
        if (!frame || PyList_Append(frames, frame) < 0) {
            Py_XDECREF(frame);
            Py_DECREF(frames);
            return NULL;  /* the rest of the message stays queued and arrives as the next one's start */
        }
        Py_DECREF(frame);
    }
    return Py_BuildValue("(Ni)", frames, fd);
}

static PyObject *send(PyObject *self, PyObject *args) {
    PyObject *handle, *list;
    if (!PyArg_ParseTuple(args, "OO!", &handle, &PyList_Type, &list) || !loaded())
        return NULL;
    void *sock = handle_of(handle);
    if (!sock && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(list);
    if (count == 0 || count > MAX_FRAMES)
        return PyErr_Format(PyExc_ValueError, "a message is 1 to %d frames, not %zd", MAX_FRAMES, count);
    Py_buffer views[MAX_FRAMES];
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    for (; held < count; held++)  /* every frame a buffer before any is sent: half a message would join the next */
        if (PyObject_GetBuffer(PyList_GET_ITEM(list, held), &views[held], PyBUF_SIMPLE) < 0)
            goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < count ? ZMQ_SNDMORE : 0);
        int rc;
        while ((rc = zmq.send(sock, views[i].buf, (size_t)views[i].len, flags)) < 0 && interrupted())
            ;
        if (rc < 0) {
            if (!PyErr_Occurred())
                zmq_error();  /* only the first frame can meet a full pipe or a gone peer: nothing was queued */
            goto done;
        }
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    return result;
}

static PyObject *waiting(PyObject *self, PyObject *handle) {
    if (!loaded())
        return NULL;
    void *sock = handle_of(handle);
    if (!sock && PyErr_Occurred())
        return NULL;
    int events = 0;
    size_t size = sizeof events;
    int rc;
    while ((rc = zmq.getsockopt(sock, ZMQ_EVENTS, &events, &size)) < 0 && interrupted())
        ;
    if (rc < 0)
        return PyErr_Occurred() ? NULL : zmq_error();
    return PyBool_FromLong(events & ZMQ_POLLIN);
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, "load(libzmq_path, Again, ZMQError) -> (major, minor, patch): find the calls in pyzmq's loaded libzmq."},
    {"recv", recv, METH_VARARGS, "recv(handle, big) -> (frames, fd): the next message, without waiting."},
    {"send", send, METH_VARARGS, "send(handle, frames): queue one message, without waiting, copying its frames."},
    {"waiting", waiting, METH_O, "waiting(handle) -> bool: whether a message is ready to receive."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", "The frontend's socket calls in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__wire(void) {
    if (PyType_Ready(&FrameType) < 0)
        return NULL;
    return PyModule_Create(&module);
}

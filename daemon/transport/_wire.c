/* The frontend's socket calls in C: one call a message in or out instead of one a frame.

   The frontend receives each request as 3-5 frames and sends each reply as
   4-6, and pyzmq makes every frame a Python call, a Frame object and a
   flags check; those calls were a large part of the
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

enum { ZMQ_DONTWAIT = 1, ZMQ_SNDMORE = 2, ZMQ_EVENTS = 15, ZMQ_POLLIN = 1, ZMQ_SRCFD = 2, MAX_FRAMES = 64,
       MAX_ENVELOPE = 8 };

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

/* Every frame of the next message as a list (as_python), and the descriptor it came on; NULL with
   zmq.Again set where none waits, or another error. */
static PyObject *receive(void *sock, Py_ssize_t big, int *fd) {
    PyObject *frames = PyList_New(0);
    if (!frames)
        return NULL;
    int more = 1;
    *fd = -1;
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
            *fd = zmq.msg_get(&msg, ZMQ_SRCFD);  /* -1 where libzmq keeps none (inproc) */
        PyObject *frame = as_python(&msg, big);
        if (!frame || PyList_Append(frames, frame) < 0) {
            Py_XDECREF(frame);
            Py_DECREF(frames);
            return NULL;  /* the rest of the message stays queued and arrives as the next one's start */
        }
        Py_DECREF(frame);
    }
    return frames;
}

static PyObject *recv(PyObject *self, PyObject *args) {
    PyObject *handle;
    Py_ssize_t big;
    if (!PyArg_ParseTuple(args, "On", &handle, &big) || !loaded())
        return NULL;
    void *sock = handle_of(handle);
    if (!sock && PyErr_Occurred())
        return NULL;
    int fd;
    PyObject *frames = receive(sock, big, &fd);
    return frames ? Py_BuildValue("(Ni)", frames, fd) : NULL;
}

static int send_errno;  /* libzmq's errno where send_parts last failed: raising its exception may change errno */

/* Queue `count` frames as one message, without waiting; -1 with the error set where it failed. */
static int send_parts(void *sock, PyObject **parts, Py_ssize_t count) {
    if (count == 0 || count > MAX_FRAMES) {
        PyErr_Format(PyExc_ValueError, "a message is 1 to %d frames, not %zd", MAX_FRAMES, count);
        return -1;
    }
    Py_buffer views[MAX_FRAMES];
    Py_ssize_t held = 0;
    int result = -1;
    for (; held < count; held++)  /* every frame a buffer before any is sent: half a message would join the next */
        if (PyObject_GetBuffer(parts[held], &views[held], PyBUF_SIMPLE) < 0)
            goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < count ? ZMQ_SNDMORE : 0);
        int rc;
        while ((rc = zmq.send(sock, views[i].buf, (size_t)views[i].len, flags)) < 0 && interrupted())
            ;
        if (rc < 0) {
            send_errno = zmq.errno_();
            if (!PyErr_Occurred())
                zmq_error();  /* only the first frame can meet a full pipe or a gone peer: nothing was queued */
            goto done;
        }
    }
    result = 0;
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    return result;
}

static PyObject *send(PyObject *self, PyObject *args) {
    PyObject *handle, *list;
    if (!PyArg_ParseTuple(args, "OO!", &handle, &PyList_Type, &list) || !loaded())
        return NULL;
    void *sock = handle_of(handle);
    if (!sock && PyErr_Occurred())
        return NULL;
    if (send_parts(sock, PySequence_Fast_ITEMS(list), PyList_GET_SIZE(list)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* 1 if a message is ready to receive, 0 if not, -1 with the error set. */
static int ready(void *sock) {
    int events = 0;
    size_t size = sizeof events;
    int rc;
    while ((rc = zmq.getsockopt(sock, ZMQ_EVENTS, &events, &size)) < 0 && interrupted())
        ;
    if (rc < 0) {
        if (!PyErr_Occurred())
            zmq_error();
        return -1;
    }
    return (events & ZMQ_POLLIN) != 0;
}

static PyObject *waiting(PyObject *self, PyObject *handle) {
    if (!loaded())
        return NULL;
    void *sock = handle_of(handle);
    if (!sock && PyErr_Occurred())
        return NULL;
    int is = ready(sock);
    return is < 0 ? NULL : PyBool_FromLong(is);
}

/* -- the express lane ----------------------------------------------------------------------------

   parsecache.py's header layouts, looked up here: the header's bytes with the plain id after its
   first `"id":` cut out are the key of the table the parse cache keeps for the lane. This is
   parsecache._split, byte for byte (tests/unit/test_express.py compares the two). */

static const char ID_KEY[] = "\"id\":";
enum { ID_KEY_LEN = 5, MAX_ID_DIGITS = 18, MAX_ID_CHARS = 128, MAX_HEADER = 1024 };

/* The length of the plain id at `p` (PLAIN_ID's match), 0 for none. */
static Py_ssize_t plain_id(const char *p, const char *end) {
    const char *q = p;
    if (q < end && *q == '"') {
        for (q++; q < end && q - p - 1 <= MAX_ID_CHARS; q++) {
            unsigned char c = (unsigned char)*q;
            if (c == '"')
                return q + 1 - p;
            if (c < 0x20 || c > 0x7e || c == '\\')
                return 0;
        }
        return 0;
    }
    if (q < end && *q == '-')
        q++;
    if (q < end && *q == '0')
        return q + 1 - p;
    if (q >= end || *q < '1' || *q > '9')
        return 0;
    const char *digits = q;
    while (q < end && q - digits < MAX_ID_DIGITS && *q >= '0' && *q <= '9')
        q++;
    return q - p;
}

/* Where `raw`'s plain id starts and how long it is: *at = -1 where it has none. */
static void find_id(const char *raw, Py_ssize_t size, Py_ssize_t *at, Py_ssize_t *len) {
    *at = -1;
    *len = 0;
    for (Py_ssize_t i = 0; i + ID_KEY_LEN <= size; i++) {
        if (raw[i] == '"' && memcmp(raw + i, ID_KEY, ID_KEY_LEN) == 0) {
            Py_ssize_t n = plain_id(raw + i + ID_KEY_LEN, raw + size);
            if (n) {
                *at = i + ID_KEY_LEN;
                *len = n;
            }
            return;
        }
    }
}

/* (shape, ident, id_at): parsecache._split's answer for `raw`. */
static PyObject *split_id(PyObject *self, PyObject *arg) {
    char *raw;
    Py_ssize_t size, at, len;
    if (PyBytes_AsStringAndSize(arg, &raw, &size) < 0)
        return NULL;
    find_id(raw, size, &at, &len);
    if (at < 0)
        return Py_BuildValue("(OOn)", arg, Py_None, (Py_ssize_t)-1);
    PyObject *shape = PyBytes_FromStringAndSize(NULL, size - len);
    if (!shape)
        return NULL;
    memcpy(PyBytes_AS_STRING(shape), raw, at);
    memcpy(PyBytes_AS_STRING(shape) + at, raw + at + len, size - at - len);
    return Py_BuildValue("(Ny#n)", shape, raw + at, len, at);
}

/* The index just past the envelope (server._delimiter). */
static Py_ssize_t delimiter(PyObject *frames) {
    Py_ssize_t count = PyList_GET_SIZE(frames);
    for (Py_ssize_t i = 1; i < count && i <= MAX_ENVELOPE; i++) {
        PyObject *f = PyList_GET_ITEM(frames, i);
        if (PyBytes_CheckExact(f) && PyBytes_GET_SIZE(f) == 0)
            return i + 1;
    }
    return 1;
}

/* The table's entry for message `frames` (a borrowed reference), with its id's bytes in *ident (a
   new reference, None for none); NULL without an error where the lane does not take the message.
   An entry is (id_at, max_header, sizes, layout): the id where the layout had it, a header of at
   most max_header bytes (the limits, less the tensors), one frame of each size after it. */
static PyObject *look_up(PyObject *table, PyObject *frames, Py_ssize_t split, PyObject **ident) {
    Py_ssize_t count = PyList_GET_SIZE(frames);
    if (split >= count)
        return NULL;
    PyObject *header = PyList_GET_ITEM(frames, split);
    if (!PyBytes_CheckExact(header) || PyBytes_GET_SIZE(header) > MAX_HEADER)
        return NULL;
    const char *raw = PyBytes_AS_STRING(header);
    Py_ssize_t size = PyBytes_GET_SIZE(header), at, len;
    find_id(raw, size, &at, &len);
    PyObject *key;
    if (at < 0) {
        key = Py_NewRef(header);
    } else {
        key = PyBytes_FromStringAndSize(NULL, size - len);
        if (!key)
            return NULL;
        memcpy(PyBytes_AS_STRING(key), raw, at);
        memcpy(PyBytes_AS_STRING(key) + at, raw + at + len, size - at - len);
    }
    PyObject *entry = PyDict_GetItemWithError(table, key);
    Py_DECREF(key);
    if (!entry || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4)
        return NULL;
    PyObject *sizes = PyTuple_GET_ITEM(entry, 2);
    if (PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0)) != at || size > PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 1))
            || !PyTuple_CheckExact(sizes) || PyTuple_GET_SIZE(sizes) != count - split - 1)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sizes); i++) {
        PyObject *frame = PyList_GET_ITEM(frames, split + 1 + i);
        Py_ssize_t length = PyBytes_CheckExact(frame) ? PyBytes_GET_SIZE(frame) : PyObject_Length(frame);
        if (length != PyLong_AsSsize_t(PyTuple_GET_ITEM(sizes, i)))
            return NULL;
    }
    if (PyErr_Occurred())
        return NULL;
    *ident = at < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(raw + at, len);
    return *ident ? entry : NULL;
}

/* Send the reply `body` ([header, outputs...]) to the envelope `frames[:split]`, as server._send
   does: 0 once queued (or for a peer gone: not an error), 1 where its pipe was full (then
   `dropped(identity)` was called), -1 with the error set. */
static int reply(void *sock, PyObject *frames, Py_ssize_t split, PyObject *body, PyObject *dropped) {
    Py_ssize_t length = PyList_GET_SIZE(body);
    if (split + length > MAX_FRAMES) {
        PyErr_Format(PyExc_ValueError, "a reply of %zd frames is more than the lane sends", split + length);
        return -1;
    }
    PyObject *parts[MAX_FRAMES];
    for (Py_ssize_t i = 0; i < split; i++)
        parts[i] = PyList_GET_ITEM(frames, i);
    for (Py_ssize_t i = 0; i < length; i++)
        parts[split + i] = PyList_GET_ITEM(body, i);
    if (send_parts(sock, parts, split + length) == 0)
        return 0;
    if (PyErr_ExceptionMatches(Again)) {
        PyErr_Clear();
        PyObject *done = PyObject_CallOneArg(dropped, parts[0]);
        Py_XDECREF(done);
        return done ? 1 : -1;
    }
    if (send_errno == EHOSTUNREACH && PyErr_ExceptionMatches(ZMQError)) {
        PyErr_Clear();  /* the client went away before its reply */
        return 0;
    }
    return -1;
}

/* serve(handle, big, table, callback, hear, dropped, outbox, budget, asked) -> (served, message)

   Serve messages from the socket while one waits, at most `budget`, while `outbox` is empty: each
   that `table` has an entry for goes to `callback(layout, ident, frames, split)`, which answers
   with the reply's [header, outputs...] (sent here), True (it answered), or None: it declines, and
   the message is returned as (frames, fd) for the general path, with the count served before it.
   `hear(fd)` is called for each message right after its read, as the general path does (a message
   it then takes hears again, which changes nothing). The first `asked` messages are received without
   asking whether one waits (the caller's poll just said so). A reply dropped for a full pipe ends
   the burst: that peer is stalled now, which only the general path handles. */
static PyObject *serve(PyObject *self, PyObject *args) {
    PyObject *handle, *table, *callback, *hear, *dropped, *outbox;
    Py_ssize_t big, budget, asked, served = 0;
    if (!PyArg_ParseTuple(args, "OnO!OOOOnn", &handle, &big, &PyDict_Type, &table, &callback, &hear, &dropped,
                          &outbox, &budget, &asked) || !loaded())
        return NULL;
    void *sock = handle_of(handle);
    if (!sock && PyErr_Occurred())
        return NULL;
    while (served < budget && PyObject_Length(outbox) == 0) {
        if (served >= asked) {
            int is = ready(sock);
            if (is <= 0)
                return is < 0 ? NULL : Py_BuildValue("(nO)", served, Py_None);
        }
        int fd;
        PyObject *frames = receive(sock, big, &fd);
        if (!frames) {
            if (!PyErr_ExceptionMatches(Again))
                return NULL;
            PyErr_Clear();  /* the poll's readiness can be stale */
            return Py_BuildValue("(nO)", served, Py_None);
        }
        /* Right after the read, before any reply: once it has its reply, the peer may send what makes
           libzmq drop the connection (a frame over the cap), and `fd` may then be another's. */
        PyObject *heard = fd >= 0 ? PyObject_CallFunction(hear, "i", fd) : Py_NewRef(Py_None);
        if (!heard) {
            Py_DECREF(frames);
            return NULL;
        }
        Py_DECREF(heard);
        Py_ssize_t split = delimiter(frames);
        PyObject *ident = NULL, *entry = look_up(table, frames, split, &ident);
        PyObject *answer = NULL;
        if (entry) {
            Py_INCREF(entry);  /* the callback may clear the table */
            PyObject *at = PyLong_FromSsize_t(split);
            answer = at ? PyObject_CallFunctionObjArgs(callback, PyTuple_GET_ITEM(entry, 3), ident, frames, at, NULL)
                        : NULL;
            Py_XDECREF(at);
            Py_DECREF(ident);
            Py_DECREF(entry);
            if (!answer) {
                Py_DECREF(frames);
                return NULL;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(frames);
            return NULL;
        }
        if (!answer || answer == Py_None) {
            Py_XDECREF(answer);
            return Py_BuildValue("(n(Ni))", served, frames, fd);
        }
        int sent = PyList_CheckExact(answer) ? reply(sock, frames, split, answer, dropped) : 0;
        Py_DECREF(answer);
        Py_DECREF(frames);
        if (sent < 0)
            return NULL;
        served++;
        if (sent == 1)
            break;
    }
    return Py_BuildValue("(nO)", served, Py_None);
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, "load(libzmq_path, Again, ZMQError) -> (major, minor, patch): find the calls in pyzmq's loaded libzmq."},
    {"recv", recv, METH_VARARGS, "recv(handle, big) -> (frames, fd): the next message, without waiting."},
    {"send", send, METH_VARARGS, "send(handle, frames): queue one message, without waiting, copying its frames."},
    {"waiting", waiting, METH_O, "waiting(handle) -> bool: whether a message is ready to receive."},
    {"serve", serve, METH_VARARGS, "serve(handle, big, table, callback, hear, dropped, outbox, budget, asked) -> "
     "(served, message): the express lane's burst."},
    {"split_id", split_id, METH_O, "split_id(header) -> (shape, ident, id_at): parsecache._split in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", "The frontend's socket calls in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__wire(void) {
    if (PyType_Ready(&FrameType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    /* The longest header the lane looks up: parsecache.MAX_CACHED_HEADER, which a test holds it to. */
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_HEADER", MAX_HEADER) < 0)
        Py_CLEAR(m);
    return m;
}

/* The bare loop with its receive, parse and reply compiled: what a compiled loop gains on the same work.

   Built by compiled.py as the extension module _cbare; run by
   `python baselines.py compiled-bare ENDPOINT ENGINE BUILD_DIR`.

   _cbare.serve(endpoint, infer) answers requests on a ROUTER forever, one
   at a time, as baselines.py's bare loop does: it receives with the
   interpreter lock released, parses the JSON header with Python's json
   (its C accelerator), wraps each tensor frame in a read-only numpy array
   without a copy, calls `infer(inputs)` (an onnxruntime context's call,
   which is Python) and writes the reply header and frames in C. What is
   left in Python per request is what a compiled fast path could not drop
   while onnxruntime is reached through its Python binding: the header's
   dict, the input arrays and the call.

   It checks what the bare loop's parse checks for a well-formed request
   (field types, each frame's size against its dtype and shape) and
   answers 400 otherwise; it is a measuring reference, not a server to
   expose. Like echo.c it links pyzmq's libzmq (zmq_abi.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

#include "zmq_abi.h"

enum { MAX_FRAMES = 18, HEADER_ROOM = 4096 };

typedef struct {
    PyObject *loads, *dumps, *frombuffer, *infer;
    void *sock;
} Loop;

typedef struct {
    zmq_msg_t frames[MAX_FRAMES];
    int count;
} Message;

/* Every frame of the next message, the lock released while waiting; frames past MAX_FRAMES are dropped. */
static int receive(Loop *loop, Message *m) {
    int more = 1, rc = 0;
    zmq_msg_t extra;
    m->count = 0;
    Py_BEGIN_ALLOW_THREADS
    while (more) {
        zmq_msg_t *part = m->count < MAX_FRAMES ? &m->frames[m->count] : &extra;
        zmq_msg_init(part);
        if (zmq_msg_recv(part, loop->sock, 0) < 0) {
            zmq_msg_close(part);
            rc = -1;
            break;
        }
        more = zmq_msg_more(part);
        if (m->count < MAX_FRAMES)
            m->count++;
        else
            zmq_msg_close(part);
    }
    Py_END_ALLOW_THREADS
    return rc;
}

static void release(Message *m) {
    for (int i = 0; i < m->count; i++)
        zmq_msg_close(&m->frames[i]);
    m->count = 0;
}

/* Append `text` to `out` as it is; -1 if it does not fit. */
static int put_raw(char *out, size_t room, size_t *at, const char *text) {
    int n = snprintf(out + *at, room - *at, "%s", text);
    if (n < 0 || (size_t)n >= room - *at)
        return -1;
    *at += (size_t)n;
    return 0;
}

/* Append `text` to `out` as a JSON string (through json.dumps where it needs escaping). */
static int put_string(Loop *loop, char *out, size_t room, size_t *at, PyObject *text) {
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
    if (!utf8)
        return -1;
    int plain = (size_t)len < room;
    for (Py_ssize_t i = 0; i < len && plain; i++)
        plain = (unsigned char)utf8[i] >= 0x20 && (unsigned char)utf8[i] < 0x80 && utf8[i] != '"' && utf8[i] != '\\';
    if (plain)
        return put_raw(out, room, at, "\"") || put_raw(out, room, at, utf8) || put_raw(out, room, at, "\"") ? -1 : 0;
    PyObject *quoted = PyObject_CallOneArg(loop->dumps, text);  /* ASCII, quoted and escaped */
    int rc = quoted ? put_raw(out, room, at, PyUnicode_AsUTF8(quoted)) : -1;
    Py_XDECREF(quoted);
    return rc;
}

/* Append the request's id: an int that fits 64 bits as digits, anything else as json.dumps gives it. */
static int put_id(Loop *loop, char *out, size_t room, size_t *at, PyObject *id) {
    if (!id || id == Py_None)
        return put_raw(out, room, at, "null");
    if (PyLong_CheckExact(id)) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(id, &overflow);
        if (!overflow) {
            char digits[24];
            snprintf(digits, sizeof digits, "%lld", value);
            return put_raw(out, room, at, digits);
        }
    }
    PyObject *text = PyObject_CallOneArg(loop->dumps, id);
    int rc = text ? put_raw(out, room, at, PyUnicode_AsUTF8(text)) : -1;
    Py_XDECREF(text);
    return rc;
}

/* The wire dtype of a buffer's struct format, or NULL. */
static const char *wire_dtype(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    switch (*f) {
    case 'f': return "float32";
    case 'd': return "float64";
    case 'e': return "float16";
    case 'b': return "int8";
    case 'B': return "uint8";
    case 'h': return "int16";
    case 'H': return "uint16";
    case 'i': return "int32";
    case 'I': return "uint32";
    case 'l': case 'q': return view->itemsize == 8 ? "int64" : "int32";
    case 'L': case 'Q': return view->itemsize == 8 ? "uint64" : "uint32";
    case '?': return "bool";
    default: return NULL;
    }
}

/* inputs[name] = a read-only array over the frame, shaped as the header says. */
static int add_input(Loop *loop, PyObject *inputs, PyObject *meta, zmq_msg_t *frame, const char **why) {
    PyObject *name = PyDict_Check(meta) ? PyDict_GetItemString(meta, "name") : NULL;
    PyObject *dtype = PyDict_Check(meta) ? PyDict_GetItemString(meta, "dtype") : NULL;
    PyObject *shape = PyDict_Check(meta) ? PyDict_GetItemString(meta, "shape") : NULL;
    if (!name || !PyUnicode_Check(name) || !dtype || !PyUnicode_Check(dtype) || !shape || !PyList_Check(shape)) {
        *why = "each input needs name, dtype and shape";
        return -1;
    }
    PyObject *view = PyMemoryView_FromMemory(zmq_msg_data(frame), (Py_ssize_t)zmq_msg_size(frame), PyBUF_READ);
    PyObject *flat = view ? PyObject_CallFunctionObjArgs(loop->frombuffer, view, dtype, NULL) : NULL;
    Py_XDECREF(view);
    if (!flat) {  /* an unknown dtype, or a frame that is not a whole number of items */
        PyErr_Clear();
        *why = "a tensor frame does not fit its dtype";
        return -1;
    }
    PyObject *array = PyObject_CallMethod(flat, "reshape", "O", shape);
    Py_DECREF(flat);
    if (!array) {  /* the frame's size does not match the shape */
        PyErr_Clear();
        *why = "a tensor frame does not match its shape";
        return -1;
    }
    int rc = PyDict_SetItem(inputs, name, array);
    Py_DECREF(array);
    return rc;
}

/* The reply header and output frames of one computed request, sent after the envelope. */
static int send_outputs(Loop *loop, Message *m, PyObject *id, PyObject *model, PyObject *outputs) {
    char header[HEADER_ROOM];
    size_t at = 0;
    Py_buffer views[MAX_FRAMES];
    int held = 0, rc = -1;
    at += (size_t)snprintf(header, sizeof header, "{\"id\":");
    if (put_id(loop, header, sizeof header, &at, id) < 0)
        goto done;
    at += (size_t)snprintf(header + at, sizeof header - at, ",\"status\":200,\"model\":");
    if (put_string(loop, header, sizeof header, &at, model) < 0)
        goto done;
    at += (size_t)snprintf(header + at, sizeof header - at, ",\"outputs\":[");
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(outputs, &pos, &key, &value)) {
        if (held == MAX_FRAMES || PyObject_GetBuffer(value, &views[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        held++;
        const char *dtype = wire_dtype(&views[held - 1]);
        if (!dtype || at + 64 >= sizeof header)
            goto done;
        at += (size_t)snprintf(header + at, sizeof header - at, "%s{\"name\":", held > 1 ? "," : "");
        if (put_string(loop, header, sizeof header, &at, key) < 0)
            goto done;
        at += (size_t)snprintf(header + at, sizeof header - at, ",\"dtype\":\"%s\",\"shape\":[", dtype);
        for (int d = 0; d < views[held - 1].ndim && at + 24 < sizeof header; d++)
            at += (size_t)snprintf(header + at, sizeof header - at, "%s%zd", d ? "," : "",
                                   views[held - 1].shape[d]);
        at += (size_t)snprintf(header + at, sizeof header - at, "]}");
    }
    if (at + 3 >= sizeof header)
        goto done;
    at += (size_t)snprintf(header + at, sizeof header - at, "]}");
    zmq_msg_send(&m->frames[0], loop->sock, ZMQ_SNDMORE);
    zmq_send(loop->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(loop->sock, header, at, held ? ZMQ_SNDMORE : 0);
    for (int i = 0; i < held; i++)
        zmq_send(loop->sock, views[i].buf, (size_t)views[i].len, i + 1 < held ? ZMQ_SNDMORE : 0);
    rc = 0;
done:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    return rc;
}

/* An error reply: status and message, the request's id when it had one. */
static void send_error(Loop *loop, Message *m, int status, PyObject *id, const char *why) {
    char header[HEADER_ROOM];
    size_t at = (size_t)snprintf(header, sizeof header, "{\"id\":");
    if (put_id(loop, header, sizeof header, &at, id) < 0) {
        PyErr_Clear();
        at = (size_t)snprintf(header, sizeof header, "{\"id\":null");
    }
    PyObject *text = PyUnicode_FromString(why);
    at += (size_t)snprintf(header + at, sizeof header - at, ",\"status\":%d,\"error\":", status);
    if (!text || put_string(loop, header, sizeof header, &at, text) < 0) {
        PyErr_Clear();
        at += (size_t)snprintf(header + at, sizeof header - at, "\"error\"");
    }
    Py_XDECREF(text);
    at += (size_t)snprintf(header + at, sizeof header - at, "}");
    zmq_msg_send(&m->frames[0], loop->sock, ZMQ_SNDMORE);
    zmq_send(loop->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(loop->sock, header, at < sizeof header ? at : sizeof header - 1, 0);
}

/* Parse, compute and answer one message [identity, delimiter, header, tensors...]. */
static void handle(Loop *loop, Message *m) {
    if (m->count < 3)
        return;  /* no header: nothing to answer */
    PyObject *raw = PyBytes_FromStringAndSize(zmq_msg_data(&m->frames[2]), (Py_ssize_t)zmq_msg_size(&m->frames[2]));
    PyObject *header = raw ? PyObject_CallOneArg(loop->loads, raw) : NULL;
    Py_XDECREF(raw);
    PyObject *inputs = NULL, *outputs = NULL, *id = NULL;
    const char *why = NULL;
    if (!header || !PyDict_Check(header)) {
        why = "the header is not a JSON object";
        goto fail;
    }
    id = PyDict_GetItemString(header, "id");
    PyObject *model = PyDict_GetItemString(header, "model");
    PyObject *metas = PyDict_GetItemString(header, "inputs");
    if (!model || !PyUnicode_Check(model) || !metas || !PyList_Check(metas)) {
        why = "header fields 'model' (a string) and 'inputs' (a list) are required";
        goto fail;
    }
    if (PyList_GET_SIZE(metas) != m->count - 3) {
        why = "the header lists a different number of inputs than tensor frames follow";
        goto fail;
    }
    inputs = PyDict_New();
    for (Py_ssize_t i = 0; inputs && i < PyList_GET_SIZE(metas); i++)
        if (add_input(loop, inputs, PyList_GET_ITEM(metas, i), &m->frames[3 + i], &why) < 0)
            goto fail;
    outputs = inputs ? PyObject_CallOneArg(loop->infer, inputs) : NULL;
    Py_CLEAR(inputs);  /* before the frames under the arrays are closed */
    if (!outputs || !PyDict_Check(outputs)) {
        why = "the backend failed";
        goto fail;
    }
    if (send_outputs(loop, m, id, model, outputs) < 0) {
        why = "an output cannot be sent";
        goto fail;
    }
    Py_DECREF(outputs);
    Py_DECREF(header);
    return;
fail:
    PyErr_Clear();
    Py_XDECREF(inputs);
    Py_XDECREF(outputs);
    send_error(loop, m, why && strstr(why, "backend") ? 500 : 400, id, why ? why : "bad request");
    Py_XDECREF(header);
}

static PyObject *serve(PyObject *self, PyObject *args) {
    const char *endpoint;
    Loop loop = {0};
    if (!PyArg_ParseTuple(args, "sO", &endpoint, &loop.infer))
        return NULL;
    PyObject *json = PyImport_ImportModule("json"), *numpy = PyImport_ImportModule("numpy");
    if (!json || !numpy)
        return NULL;
    loop.loads = PyObject_GetAttrString(json, "loads");
    loop.dumps = PyObject_GetAttrString(json, "dumps");
    loop.frombuffer = PyObject_GetAttrString(numpy, "frombuffer");
    if (!loop.loads || !loop.dumps || !loop.frombuffer)
        return NULL;
    loop.sock = zmq_socket(zmq_ctx_new(), ZMQ_ROUTER);
    if (zmq_bind(loop.sock, endpoint) != 0)
        return PyErr_Format(PyExc_OSError, "bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
    Message m;
    for (;;) {
        if (receive(&loop, &m) < 0) {
            if (PyErr_CheckSignals() < 0)  /* interrupted by a signal whose handler raised */
                break;
            continue;
        }
        handle(&loop, &m);
        release(&m);
    }
    zmq_close(loop.sock);
    return NULL;
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS, "serve(endpoint, infer): answer requests on a ROUTER forever."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cbare", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cbare(void) { return PyModule_Create(&module); }
